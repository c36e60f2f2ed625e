// The plots' JSON (series_json.h): a job's per-rank series and the cluster's, as column arrays.
#include "http/series_json.h"

#include <cmath>

namespace ddl::coordinator::http {

namespace {

// Rounded so that the answer carries no noise digits: whole bytes per second, fractions to 1e-4.
double round(double v, double unit) { return std::round(v / unit) * unit; }

}  // namespace

nlohmann::json jobSeriesJson(const JobSeries& series) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& r : series.ranks) {
    nlohmann::json bytes = nlohmann::json::array(), busy = nlohmann::json::array();
    for (double v : r.bytes_per_s) bytes.push_back(round(v, 1));
    for (double v : r.busy_fraction) busy.push_back(round(v, 1e-4));
    ranks.push_back({{"rank", r.rank},
                     {"t_ms", r.t_ms},
                     {"bytes_per_s", std::move(bytes)},
                     {"busy_fraction", std::move(busy)},
                     {"collectives", r.collectives}});
  }
  return {{"job", series.job},           {"ended", series.ended},
          {"attempt", series.attempt},   {"slow_rank", series.slow_rank},
          {"slow_why", series.slow_why}, {"ranks", std::move(ranks)}};
}

nlohmann::json clusterSeriesJson(const ClusterSeries& series) {
  nlohmann::json t = nlohmann::json::array(), used = nlohmann::json::array(), total = nlohmann::json::array();
  nlohmann::json jobs = nlohmann::json::object();
  for (const auto& name : series.states) jobs[name] = nlohmann::json::array();
  for (const auto& p : series.points) {
    t.push_back(p.t_ms);
    used.push_back(p.gpus_used);
    total.push_back(p.gpus_total);
    for (size_t i = 0; i < series.states.size(); ++i) {
      jobs[series.states[i]].push_back(i < p.jobs.size() ? p.jobs[i] : 0);
    }
  }
  return {{"t_ms", std::move(t)},
          {"gpus_used", std::move(used)},
          {"gpus_total", std::move(total)},
          {"jobs", std::move(jobs)}};
}

}  // namespace ddl::coordinator::http
