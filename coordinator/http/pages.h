// What the dashboard shows, as pure functions of coordinator answers: the Prometheus text, the JSON of the API,
// the HTML pages and the ring picture (SVG). No I/O, so tests render them directly.
//
// Threads: pure functions; any thread.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"
#include "service/coordinator.h"

namespace ddl::coordinator::http {

// Prometheus text exposition format 0.0.4: ddl_ prefix, _total counters, labels only for state.
// `store_healthy`: Coordinator::health().ok, as ddl_coordinator_store_healthy (1 or 0).
std::string renderMetrics(const MetricsSnapshot& m, bool store_healthy);

// "/": the page; it fetches /api/v1/nodes and /api/v1/jobs itself every 2 s and redraws without a reload.
std::string renderIndexPage();

// "/jobs/ID": ranks by node and GPU with their last collective, the ring picture, the log tails.
// `ring` may be empty (a job never placed); `logs` maps rank -> the tail of its log. With `details_hidden` the
// reader is neither the job's owner nor an admin: the job comes without command, env and workdir, there are no
// logs, and the page says so instead of showing blanks.
std::string renderJobPage(const v1::Job& job, const v1::RingLayout* ring, const std::map<int, std::string>& logs,
                          int64_t now_ms, bool details_hidden = false);

// The ring layout as a picture: switches holding nodes holding GPUs (one circle per rank), and each dim's rings
// drawn as arcs whose style says whether the link stays in a node, crosses nodes, or crosses switches.
std::string renderRingSvg(const v1::RingLayout& ring);

std::string htmlEscape(const std::string& text);

}  // namespace ddl::coordinator::http
