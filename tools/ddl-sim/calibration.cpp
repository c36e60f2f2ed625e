#include "tools/ddl-sim/calibration.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

namespace ddl::sim {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "ddl-sim-calibration";
constexpr int kVersion = 1;
const char* const kClassKeys[kLinkClasses] = {"intra", "node", "switch"};

Status bad(const std::string& origin, const std::string& what) {
  return Status::invalidArgument(origin + ": " + what);
}

// A finite number at obj[key]; `required` false: absent leaves *out alone.
Status number(const json& obj, const char* key, const std::string& where, bool required, double* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return required ? bad(where, std::string("missing \"") + key + "\"") : Status::ok();
  if (!it->is_number() || !std::isfinite(it->get<double>())) {
    return bad(where, std::string("\"") + key + "\" must be a finite number");
  }
  *out = it->get<double>();
  return Status::ok();
}

Status integer(const json& obj, const char* key, const std::string& where, bool required, int min, int* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return required ? bad(where, std::string("missing \"") + key + "\"") : Status::ok();
  if (!it->is_number_integer() || it->get<long long>() < min || it->get<long long>() > (1 << 30)) {
    return bad(where, std::string("\"") + key + "\" must be an integer >= " + std::to_string(min));
  }
  *out = static_cast<int>(it->get<long long>());
  return Status::ok();
}

}  // namespace

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

std::string calibrationToJson(const Calibration& c) {
  const Machine& m = c.machine;
  json links = json::object();
  for (int k = 0; k < kLinkClasses; ++k) {
    json l = {{"alpha_s", m.links[k].alpha_s}, {"beta_Bps", m.links[k].beta_Bps}};
    if (!c.from[k].empty()) l["from"] = c.from[k];
    links[kClassKeys[k]] = l;
  }
  json j = {{"format", kFormat},
            {"version", kVersion},
            {"name", m.name},
            {"source", c.source},
            {"ranks_per_node", m.ranks_per_node},
            {"nodes_per_switch", m.nodes_per_switch},
            {"nics_per_node", m.nics_per_node},
            {"reduce_GBps", m.reduce_Bps / 1e9},
            {"links", links}};
  return j.dump(1) + "\n";
}

StatusOr<Calibration> calibrationFromJson(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad(origin, "not valid JSON");
  if (!j.is_object()) return bad(origin, "not a JSON object");
  if (j.value("format", std::string()) != kFormat) {
    return bad(origin, std::string("not a ddl-sim calibration (\"format\" is not \"") + kFormat +
                           "\"; write one with ddl-sim calibrate)");
  }
  if (!j.contains("version") || !j["version"].is_number_integer() ||
      j["version"].get<long long>() != kVersion) {
    return bad(origin, "unsupported calibration \"version\" (this ddl-sim reads version 1)");
  }
  Calibration c;
  Machine& m = c.machine;
  m.name = j.value("name", std::string("calibrated"));
  if (j.contains("source") && j["source"].is_string()) c.source = j["source"].get<std::string>();
  if (Status s = integer(j, "ranks_per_node", origin, true, 1, &m.ranks_per_node); !s.isOk()) return s;
  m.nodes_per_switch = 1 << 30;
  if (Status s = integer(j, "nodes_per_switch", origin, false, 1, &m.nodes_per_switch); !s.isOk()) return s;
  if (Status s = integer(j, "nics_per_node", origin, false, 0, &m.nics_per_node); !s.isOk()) return s;
  double reduce_gbs = 0;
  if (Status s = number(j, "reduce_GBps", origin, true, &reduce_gbs); !s.isOk()) return s;
  if (reduce_gbs < 0) return bad(origin, "\"reduce_GBps\" must be >= 0 (0: reduction is free)");
  m.reduce_Bps = reduce_gbs * 1e9;
  auto links = j.find("links");
  if (links == j.end() || !links->is_object()) return bad(origin, "missing \"links\" object");
  for (const auto& item : links->items()) {  // a misspelt class would otherwise fall back to "node" unseen
    bool known = false;
    for (const char* k : kClassKeys) known = known || item.key() == k;
    if (!known)
      return bad(origin, "unknown link class \"" + item.key() + "\" in \"links\" (intra, node, switch)");
  }
  for (int k = 0; k < kLinkClasses; ++k) {
    auto l = links->find(kClassKeys[k]);
    if (l == links->end()) {
      if (k == static_cast<int>(LinkClass::kSwitch)) {
        m.links[k] = m.links[static_cast<int>(LinkClass::kNode)];
        c.from[k] = c.from[static_cast<int>(LinkClass::kNode)];
        continue;
      }
      return bad(origin, std::string("missing link class \"") + kClassKeys[k] + "\" in \"links\"");
    }
    const std::string where = origin + ": links." + kClassKeys[k];
    if (!l->is_object()) return bad(where, "must be an object with alpha_s and beta_Bps");
    if (Status s = number(*l, "alpha_s", where, true, &m.links[k].alpha_s); !s.isOk()) return s;
    if (Status s = number(*l, "beta_Bps", where, true, &m.links[k].beta_Bps); !s.isOk()) return s;
    if (m.links[k].alpha_s < 0) return bad(where, "alpha_s must be >= 0");
    if (m.links[k].beta_Bps <= 0) return bad(where, "beta_Bps must be > 0");
    if (l->contains("from") && (*l)["from"].is_string()) c.from[k] = (*l)["from"].get<std::string>();
  }
  if (Status s = validate(m); !s.isOk()) return bad(origin, s.message());
  return c;
}

StatusOr<Perftest> parsePerftest(const std::string& text, const std::string& origin) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Final:", 0) != 0) continue;
    std::istringstream f(line);
    std::string word;
    std::vector<double> v;
    f >> word;  // "Final:"
    while (f >> word) {
      try {
        size_t used = 0;
        v.push_back(std::stod(word, &used));
        if (used != word.size()) return bad(origin, "unreadable number '" + word + "' in its Final: line");
      } catch (const std::exception&) {
        return bad(origin, "unreadable number '" + word + "' in its Final: line");
      }
    }
    // iterations, latency p50, average, overall, bandwidth average, overall (MB/s), message rate x2
    if (v.size() < 6)
      return bad(origin, "its Final: line has " + std::to_string(v.size()) + " figures, not 8");
    Perftest p{v[1], v[3], v[5] * (1 << 20)};
    if (!(p.p50_us >= 0) || !(p.bw_Bps >= 0)) return bad(origin, "negative figures in its Final: line");
    return p;
  }
  return bad(origin, "no ucx_perftest \"Final:\" line (did the run fail?)");
}

StatusOr<BenchRun> parseBenchJson(const std::string& text, const std::string& origin) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad(origin, "not valid JSON");
  if (!j.is_object()) return bad(origin, "not a ddl-bench --json object");
  BenchRun run;
  if (Status s = integer(j, "ranks", origin, true, 1, &run.ranks); !s.isOk()) return s;
  run.topology = j.contains("topology") && j["topology"].is_string() ? j["topology"].get<std::string>() : "";
  run.algo = j.contains("algo") && j["algo"].is_string() ? j["algo"].get<std::string>() : "";
  auto rows = j.find("results");
  if (rows == j.end() || !rows->is_array()) return bad(origin, "missing \"results\" array");
  for (size_t i = 0; i < rows->size(); ++i) {
    const json& r = (*rows)[i];
    const std::string where = origin + ": results[" + std::to_string(i) + "]";
    if (!r.is_object()) return bad(where, "not an object");
    double bytes = 0, us = 0, wrong = 0;
    if (Status s = number(r, "bytes", where, true, &bytes); !s.isOk()) return s;
    if (Status s = number(r, "time_us", where, true, &us); !s.isOk()) return s;
    if (Status s = number(r, "wrong", where, false, &wrong); !s.isOk()) return s;
    if (bytes < 0 || us <= 0) return bad(where, "bytes must be >= 0 and time_us > 0");
    if (wrong != 0) continue;  // a wrong result is not a time
    run.points.push_back({bytes, us * 1e-6});
  }
  return run;
}

StatusOr<LinkFit> fitRing(const std::vector<BenchRun>& runs, double min_bytes) {
  // Rows x = (2(p-1), 2(p-1)/p·n) / T, target 1: minimises the sum of squared relative errors.
  double a11 = 0, a12 = 0, a22 = 0, b1 = 0, b2 = 0;
  int n = 0;
  for (const BenchRun& r : runs) {
    if (r.ranks < 2) return Status::invalidArgument("a ring fit needs runs of 2 ranks or more");
    for (const BenchPoint& pt : r.points) {
      if (pt.bytes < min_bytes || pt.bytes <= 0) continue;
      const double x1 = 2.0 * (r.ranks - 1) / pt.seconds;
      const double x2 = 2.0 * (r.ranks - 1) / r.ranks * pt.bytes / pt.seconds;
      a11 += x1 * x1, a12 += x1 * x2, a22 += x2 * x2, b1 += x1, b2 += x2;
      ++n;
    }
  }
  if (n < 2) {
    return Status::invalidArgument("a ring fit needs at least 2 sizes >= " + std::to_string(min_bytes) +
                                   " bytes, got " + std::to_string(n));
  }
  const double det = a11 * a22 - a12 * a12;
  double alpha = 0, inv_beta = 0;
  if (std::fabs(det) > 1e-12 * a11 * a22) {
    alpha = (b1 * a22 - b2 * a12) / det;
    inv_beta = (a11 * b2 - a12 * b1) / det;
  }
  if (!(alpha >= 0)) {  // the sizes do not pin the latency down: bandwidth alone
    alpha = 0;
    inv_beta = b2 / a22;
  }
  if (!(inv_beta > 0)) {
    return Status::invalidArgument(
        "the ring fit gives no positive bandwidth: the times do not grow with size");
  }
  LinkFit fit;
  fit.link = {alpha, 1 / inv_beta};
  fit.points = n;
  double sq = 0;
  for (const BenchRun& r : runs) {
    for (const BenchPoint& pt : r.points) {
      if (pt.bytes < min_bytes || pt.bytes <= 0) continue;
      const double model = 2.0 * (r.ranks - 1) * alpha + 2.0 * (r.ranks - 1) / r.ranks * pt.bytes * inv_beta;
      sq += (model / pt.seconds - 1) * (model / pt.seconds - 1);
    }
  }
  fit.rms_rel_error = std::sqrt(sq / n);
  return fit;
}

}  // namespace ddl::sim
