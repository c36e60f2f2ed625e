// What the dashboard shows, as pure functions of coordinator answers: the Prometheus text, the JSON of the API,
// the HTML pages and the ring picture (SVG). No I/O, so tests render them directly.
//
// Threads: pure functions; any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"
#include "service/coordinator.h"

namespace ddl::coordinator::http {

// Prometheus text exposition format 0.0.4: ddl_ prefix, _total counters, labels only for state, and the job id for
// the ddl_job_* families (placed jobs only, at most MetricsSnapshot::kMaxJobFigures = 500 of them).
// `store_healthy`: Coordinator::health().ok, as ddl_coordinator_store_healthy (1 or 0).
std::string renderMetrics(const MetricsSnapshot& m, bool store_healthy);

// "/": the page; every 3 s it fetches /api/v1/nodes, the live jobs, one page (50) of the job history with the
// filters of its own query (state, user, name, page_token) and /api/v1/cluster/series, and redraws in place:
// the GPUs-in-use and jobs-by-state charts (inline SVG drawn by its own script), nodes, live jobs, history.
std::string renderIndexPage();

// "/jobs/ID": ranks by node and GPU with their last collective, charts of each rank's collective throughput and
// time in collectives over time (fetched from /api/v1/jobs/ID/series every 3 s, the slow rank drawn in red and
// named), the rank processes (Job.ranks: node, GPU, pids, exit, start and end, last figures), the ring picture,
// the log tails (scrolled to their end). While the job is live the page re-reads itself every 5 s and swaps its
// parts in place; a log the reader scrolled up in stays where it is, one at its end follows.
// `ring` may be empty (a job never placed); `logs` maps rank -> the tail of its log. With `details_hidden` the
// reader is neither the job's owner nor an admin: the job comes without command, env and workdir, there are no
// logs, and the page says so instead of showing blanks.
std::string renderJobPage(const v1::Job& job, const v1::RingLayout* ring, const std::map<int, std::string>& logs,
                          int64_t now_ms, bool details_hidden = false);

// The ring layout as a picture: switches holding nodes holding GPUs (one circle per rank), and each dim's rings
// drawn as arcs whose style says whether the link stays in a node, crosses nodes, or crosses switches.
std::string renderRingSvg(const v1::RingLayout& ring);

std::string htmlEscape(const std::string& text);

// A duration as people read it: "0.35s", "45s", "1m 01s", "2h 05m", "3d 04h".
std::string humanDuration(int64_t ms);

}  // namespace ddl::coordinator::http
