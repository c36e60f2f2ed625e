// The JSON of the dashboard's plots (/api/v1/jobs/ID/series, /api/v1/cluster/series): column arrays, one
// value per sample, so the answer stays small and the page's script draws it without reshaping. Sizes follow
// TelemetryHistory's bounds: at most 16384 points a job (240 a rank), 720 cluster points.
//
// Threads: pure functions; any thread.
#pragma once

#include <nlohmann/json.hpp>

#include "service/telemetry_history.h"

namespace ddl::coordinator::http {

// {"job", "ended", "attempt", "slow_rank", "slow_why",
//  "ranks": [{"rank", "t_ms": [...], "bytes_per_s": [...], "busy_fraction": [...], "collectives": [...]}]}
nlohmann::json jobSeriesJson(const JobSeries& series);

// {"t_ms": [...], "gpus_used": [...], "gpus_total": [...], "jobs": {"PENDING": [...], "RUNNING": [...], ...}}
// (every state's column as long as t_ms; keys sorted).
nlohmann::json clusterSeriesJson(const ClusterSeries& series);

}  // namespace ddl::coordinator::http
