// ddl-sim: an alpha-beta scaling model of libddl's allreduce algorithms (ring, mdring, rhd).
//
//   ddl-sim calibrate --hierarchy DIR [--fit CLASS=FILE]... [--reduce-gbs X] -o FILE
//   ddl-sim check --calibration FILE --hierarchy DIR [--min SIZE] [--goal PCT] [--json FILE]
//   ddl-sim scale [--config 2017,h100 | --calibration FILE] [--gpus 256,1024,4096] ... [--json FILE]
//   ddl-sim predict (--config NAME | --calibration FILE) --ranks P --bytes SIZE [--algo A] [--dims AxB]
//
// The model is tools/ddl-sim/model.h; docs/scaling-model.md says how to read its figures and what it leaves
// out.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/version.h"
#include "tools/ddl-sim/calibration.h"
#include "tools/ddl-sim/configs.h"
#include "tools/ddl-sim/hierarchy.h"
#include "tools/ddl-sim/model.h"

namespace {

using namespace ddl::sim;
using ddl::Status;
using ddl::StatusOr;
using nlohmann::json;

constexpr int kExitOk = 0, kExitFail = 1, kExitUsage = 2;

const char* const kUsage =
    "usage: ddl-sim COMMAND [options]\n"
    "\n"
    "  calibrate  write a calibration file from bench/hierarchy.sh's results\n"
    "      --hierarchy DIR      bench/hierarchy.sh's --out directory: ucx_perftest gives each link class's\n"
    "                           alpha (8 B latency, median) and beta (4 MiB bandwidth): intra = shared "
    "memory,\n"
    "                           node = the host link; switch = node\n"
    "      --fit CLASS=FILE     instead, least-squares alpha and beta of CLASS (intra, node, switch) from a "
    "flat\n"
    "                           ring's ddl-bench --json FILE whose every step crosses CLASS (repeatable)\n"
    "      --fit-min SIZE       sizes the fit uses (default 64K)\n"
    "      --reduce-gbs X       reduction throughput, GB/s of output (default: measured here, fp32 sum)\n"
    "      --ranks-per-node N   (default 2)   --nics-per-node N (default 1: a host's ranks share its link)\n"
    "      -o, --output FILE    the calibration file to write (required)\n"
    "  check      predict bench/hierarchy.sh's measured 2x2 runs and print the error per size\n"
    "      --calibration FILE   --hierarchy DIR   --min SIZE (default 64K)   --goal PCT (default 15)\n"
    "      --json FILE          also write the table as JSON (-: to stdout, the text to stderr)\n"
    "  scale      allreduce time and scaling efficiency of ResNet-50/101 training on large clusters\n"
    "      --config LIST        built-in clusters, from 2017,h100 (default both)\n"
    "      --calibration FILE   a calibrated cluster instead (needs --compute-ms)\n"
    "      --gpus LIST          (default 256,1024,4096)   --network LIST (default resnet50,resnet101)\n"
    "      --algo LIST          (default ring,mdring,rhd)\n"
    "      --compute-ms MS      compute time per step (default: per config and network, "
    "docs/scaling-model.md)\n"
    "      --overlap F          fraction of the allreduce that overlaps the backward pass, for eff+ovl "
    "(default\n"
    "                           0.5; never more than the backward pass, taken as 2/3 of compute)\n"
    "      --json FILE          also write the results as JSON (-: to stdout, the text to stderr)\n"
    "  predict    one prediction with its phases\n"
    "      --config NAME | --calibration FILE   --ranks P   --bytes SIZE   --algo LIST   --dims AxBxC\n"
    "\n"
    "Options of ring pipelining (check, scale, predict): --segment SIZE (default as libddl's built-in "
    "table:\n"
    "mdring 64K, ring 256K), --window N (default 4). Sizes take K, M, G suffixes.\n"
    "Exit status: 0 done, 1 failed (or check: the goal not met), 2 bad usage or input.\n";

// ---- arguments
// -----------------------------------------------------------------------------------------------

struct Args {
  std::map<std::string, std::vector<std::string>> values;
  bool has(const std::string& k) const { return values.count(k) != 0; }
  std::string get(const std::string& k, const std::string& def = "") const {
    auto it = values.find(k);
    return it == values.end() ? def : it->second.back();
  }
};

StatusOr<Args> parseArgs(int argc, char** argv, int first, const std::set<std::string>& allowed) {
  Args a;
  for (int i = first; i < argc; ++i) {
    std::string opt = argv[i], val;
    if (opt == "-o") opt = "--output";
    if (opt.rfind("--", 0) != 0) return Status::invalidArgument("unexpected argument '" + opt + "'");
    opt = opt.substr(2);
    const size_t eq = opt.find('=');
    if (eq != std::string::npos) {
      val = opt.substr(eq + 1);
      opt = opt.substr(0, eq);
    }
    if (!allowed.count(opt)) return Status::invalidArgument("unknown option --" + opt + " for this command");
    if (eq == std::string::npos) {
      if (i + 1 >= argc) return Status::invalidArgument("--" + opt + " needs a value");
      val = argv[++i];
    }
    a.values[opt].push_back(val);
  }
  return a;
}

StatusOr<double> parseSize(const std::string& text, const std::string& what) {
  if (text.empty()) return Status::invalidArgument(what + ": empty size");
  double mult = 1;
  std::string t = text;
  switch (std::toupper(static_cast<unsigned char>(t.back()))) {
    case 'K':
      mult = 1024;
      t.pop_back();
      break;
    case 'M':
      mult = 1 << 20;
      t.pop_back();
      break;
    case 'G':
      mult = 1 << 30;
      t.pop_back();
      break;
    default:
      break;
  }
  try {
    size_t used = 0;
    const double v = std::stod(t, &used);
    if (used != t.size() || !(v >= 0) || !std::isfinite(v)) throw std::invalid_argument(t);
    return v * mult;
  } catch (const std::exception&) {
    return Status::invalidArgument(what + ": '" + text + "' is not a size (e.g. 64K, 100M)");
  }
}

StatusOr<double> parseNumber(const std::string& text, const std::string& what) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used != text.size() || !std::isfinite(v)) throw std::invalid_argument(text);
    return v;
  } catch (const std::exception&) {
    return Status::invalidArgument(what + ": '" + text + "' is not a number");
  }
}

std::vector<std::string> splitList(const std::string& s, char sep = ',') {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, sep))
    if (!item.empty()) out.push_back(item);
  return out;
}

StatusOr<std::vector<int>> parseIntList(const std::string& s, char sep, const std::string& what) {
  std::vector<int> out;
  for (const std::string& item : splitList(s, sep)) {
    StatusOr<double> v = parseNumber(item, what);
    if (!v.isOk()) return v.status();
    if (*v < 1 || *v > (1 << 24) || *v != std::floor(*v)) {
      return Status::invalidArgument(what + ": '" + item + "' is not a positive integer");
    }
    out.push_back(static_cast<int>(*v));
  }
  if (out.empty()) return Status::invalidArgument(what + ": empty list");
  return out;
}

std::string human(double bytes) {
  const char* units[] = {"", "K", "M", "G"};
  int u = 0;
  double v = bytes;
  while (u < 3 && v >= 1024 && std::fmod(v, 1024) == 0) v /= 1024, ++u;
  std::ostringstream s;
  s << v << units[u];
  return s.str();
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

int fail(const Status& s, int code = kExitUsage) {
  std::fprintf(stderr, "ddl-sim: %s\n", s.message().c_str());
  return code;
}

Status writeText(const std::string& path, const std::string& text) {
  if (path == "-") {
    std::cout << text;
    return Status::ok();
  }
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return Status::unavailable("cannot write " + path + ": " + std::strerror(errno));
  return Status::ok();
}

StatusOr<RingParams> ringParams(const Args& a, Algo algo) {
  RingParams r = libddlRingParams(algo);
  if (a.has("segment")) {
    StatusOr<double> s = parseSize(a.get("segment"), "--segment");
    if (!s.isOk()) return s.status();
    if (*s < 1) return Status::invalidArgument("--segment must be at least 1 byte");
    r.segment_bytes = *s;
  }
  if (a.has("window")) {
    StatusOr<double> w = parseNumber(a.get("window"), "--window");
    if (!w.isOk()) return w.status();
    if (*w < 1 || *w > 1024) return Status::invalidArgument("--window must be 1..1024");
    r.window = static_cast<int>(*w);
  }
  return r;
}

StatusOr<Calibration> loadCalibration(const std::string& path) {
  StatusOr<std::string> text = readTextFile(path);
  if (!text.isOk()) return text.status();
  return calibrationFromJson(*text, path);
}

// ---- calibrate
// -----------------------------------------------------------------------------------------------

// GB/s of output of an fp32 sum out = a + b over 256 KiB segments (ring.cpp's default), best of 5 passes. The
// loop is this tool's own, compiled like libddl's CPU reduction (plain C++ at -O2/-O3); the model only needs
// its order of magnitude against the link.
double measureReduceBps() {
  constexpr size_t kCount = 256 * 1024 / sizeof(float);
  constexpr int kRepeats = 400;
  std::vector<float> a(kCount, 1.0f), b(kCount, 2.0f), out(kCount);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kRepeats; ++r) {
      for (size_t i = 0; i < kCount; ++i) out[i] = a[i] + b[i];
      a[r % kCount] = out[(r * 7) % kCount];  // keep the compiler from hoisting the loop
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, kRepeats * kCount * sizeof(float) / s);
  }
  return best;
}

// calibrate --hierarchy: each link class's alpha and beta from bench/hierarchy.sh's ucx_perftest runs in dir
// (intra: shared memory; node and switch: the host link), marked in have[]; what was used goes to *sources.
Status linksFromHierarchy(const std::string& dir, Calibration* c, bool* have,
                          std::vector<std::string>* sources) {
  StatusOr<HierarchyRun> h = loadHierarchy(dir);
  if (!h.isOk()) return h.status();
  for (const std::string& w : h->warnings)
    std::fprintf(stderr, "ddl-sim: warning: %s (skipped)\n", w.c_str());
  auto pick = [&](const std::string& test, bool bw) {
    std::vector<double> v;
    for (const Perftest& p : h->perftest[test]) v.push_back(bw ? p.bw_Bps : p.p50_us * 1e-6);
    return median(v);
  };
  const double net_a = pick("net-lat", false), net_b = pick("net-bw", true);
  const double shm_a = pick("shm-lat", false), shm_b = pick("shm-bw", true);
  if (net_b > 0 && net_a > 0) {
    c->machine.links[1] = c->machine.links[2] = {net_a, net_b};
    c->from[1] = c->from[2] =
        "ucx_perftest tcp over the host link: tag_lat 8 B p50, tag_bw 4 MiB (median of " +
        std::to_string(h->perftest["net-bw"].size()) + " reps)";
    have[1] = have[2] = true;
  }
  if (shm_b > 0 && shm_a > 0) {
    c->machine.links[0] = {shm_a, shm_b};
    c->from[0] = "ucx_perftest sm inside a host: tag_lat 8 B p50, tag_bw 4 MiB best of runs (median of " +
                 std::to_string(h->perftest["shm-bw"].size()) + " reps)";
    have[0] = true;
  }
  sources->push_back("bench/hierarchy.sh results in " + dir + " (" + std::to_string(h->reps) + " reps)");
  return Status::ok();
}

// calibrate --fit CLASS=FILE (and --fit-min): each named class's alpha and beta fitted to a flat ring's
// ddl-bench times, marked in have[]; a fitted node class serves the switch class too unless that has its own.
Status linksFromFits(const Args& a, Calibration* c, bool* have) {
  double fit_min = 64 * 1024;
  if (a.has("fit-min")) {
    StatusOr<double> v = parseSize(a.get("fit-min"), "--fit-min");
    if (!v.isOk()) return v.status();
    fit_min = *v;
  }
  std::map<int, std::vector<std::pair<std::string, BenchRun>>> fits;  // class -> runs
  if (a.has("fit")) {
    for (const std::string& spec : a.values.at("fit")) {
      const size_t eq = spec.find('=');
      if (eq == std::string::npos)
        return Status::invalidArgument("--fit wants CLASS=FILE, not '" + spec + "'");
      const std::string cls = spec.substr(0, eq), path = spec.substr(eq + 1);
      int k = cls == "intra" ? 0 : cls == "node" ? 1 : cls == "switch" ? 2 : -1;
      if (k < 0)
        return Status::invalidArgument("--fit: unknown link class '" + cls + "' (intra, node, switch)");
      StatusOr<std::string> text = readTextFile(path);
      if (!text.isOk()) return text.status();
      StatusOr<BenchRun> run = parseBenchJson(*text, path);
      if (!run.isOk()) return run.status();
      if (run->algo != "ring") {
        return Status::invalidArgument(path + ": the fit models a flat ring, but this run's algo is '" +
                                       run->algo + "' (run ddl-bench -a ring)");
      }
      fits[k].push_back({path, std::move(*run)});
    }
  }
  for (auto& [k, runs] : fits) {
    std::vector<BenchRun> rs;
    for (auto& r : runs) rs.push_back(r.second);
    StatusOr<LinkFit> f = fitRing(rs, fit_min);
    if (!f.isOk())
      return Status::invalidArgument("--fit " + std::string(linkClassName(LinkClass(k))) + ": " +
                                     f.status().message());
    c->machine.links[k] = f->link;
    c->from[k] = "least-squares fit of a flat ring's times (" + std::to_string(f->points) +
                 " points >= " + human(fit_min) + " B, rms error " + fixed(f->rms_rel_error * 100, 1) +
                 "%) from " + runs.front().first +
                 (runs.size() > 1 ? " and " + std::to_string(runs.size() - 1) + " more" : "");
    have[k] = true;
    if (k == 1 && !fits.count(2)) {
      c->machine.links[2] = c->machine.links[1];
      c->from[2] = c->from[1];
      have[2] = true;
    }
  }
  return Status::ok();
}

int cmdCalibrate(int argc, char** argv) {
  StatusOr<Args> args =
      parseArgs(argc, argv, 2,
                {"hierarchy", "fit", "fit-min", "reduce-gbs", "ranks-per-node", "nics-per-node", "output"});
  if (!args.isOk()) return fail(args.status());
  const Args& a = *args;
  if (!a.has("output")) return fail(Status::invalidArgument("calibrate needs -o FILE"));
  if (!a.has("hierarchy") && !a.has("fit")) {
    return fail(Status::invalidArgument("calibrate needs --hierarchy DIR and/or --fit CLASS=FILE"));
  }
  Calibration c;
  Machine& m = c.machine;
  m.name = "calibrated";
  m.ranks_per_node = 2;
  m.nodes_per_switch = 2;
  m.nics_per_node = 1;
  for (auto [key, out] :
       {std::pair{"ranks-per-node", &m.ranks_per_node}, {"nics-per-node", &m.nics_per_node}}) {
    if (!a.has(key)) continue;
    StatusOr<double> v = parseNumber(a.get(key), std::string("--") + key);
    if (!v.isOk()) return fail(v.status());
    if (*v < 0 || *v > 1 << 20 || *v != std::floor(*v)) {
      return fail(Status::invalidArgument(std::string("--") + key + " must be a non-negative integer"));
    }
    *out = static_cast<int>(*v);
  }
  bool have[kLinkClasses] = {};
  std::vector<std::string> sources;

  if (a.has("hierarchy")) {
    if (Status s = linksFromHierarchy(a.get("hierarchy"), &c, have, &sources); !s.isOk()) return fail(s);
  }
  if (Status s = linksFromFits(a, &c, have); !s.isOk()) return fail(s);
  for (int k = 0; k < kLinkClasses; ++k) {
    if (!have[k]) {
      return fail(Status::invalidArgument(std::string("no figures for link class ") +
                                          linkClassName(LinkClass(k)) +
                                          " (no ucx_perftest results in --hierarchy, and no --fit for it)"));
    }
  }
  if (a.has("reduce-gbs")) {
    StatusOr<double> v = parseNumber(a.get("reduce-gbs"), "--reduce-gbs");
    if (!v.isOk()) return fail(v.status());
    if (*v < 0) return fail(Status::invalidArgument("--reduce-gbs must be >= 0"));
    m.reduce_Bps = *v * 1e9;
    sources.push_back("reduction: --reduce-gbs");
  } else {
    m.reduce_Bps = measureReduceBps();
    sources.push_back("reduction: fp32 sum over 256 KiB measured by ddl-sim on this machine");
  }
  for (size_t i = 0; i < sources.size(); ++i) c.source += (i ? "; " : "") + sources[i];
  if (Status s = validate(m); !s.isOk()) return fail(s);
  if (Status s = writeText(a.get("output"), calibrationToJson(c)); !s.isOk()) return fail(s, kExitFail);
  std::printf("ddl-sim: wrote %s\n", a.get("output").c_str());
  for (int k = 0; k < kLinkClasses; ++k) {
    std::printf("  %-6s alpha %8.2f us  beta %9.3f GB/s   (%s)\n", linkClassName(LinkClass(k)),
                m.links[k].alpha_s * 1e6, m.links[k].beta_Bps / 1e9, c.from[k].c_str());
  }
  std::printf("  reduction %.2f GB/s\n", m.reduce_Bps / 1e9);
  return kExitOk;
}

// ---- check
// ---------------------------------------------------------------------------------------------------

// check's table: per size, each system's measured time, the model's prediction and the error (auto predicted
// as libddl's built-in table picks: rhd up to 4 KiB, mdring above); its rows as JSON, and each system's worst
// error.
Status checkSizes(const Args& a, HierarchyRun& h, const Machine& m, const std::vector<std::string>& systems,
                  const std::set<double>& sizes, int ranks, const std::vector<int>& dims, std::string* table,
                  json* rows, std::map<std::string, double>* worst) {
  *table = "size";
  for (const std::string& s : systems) {
    if (h.bench[s].empty()) continue;
    *table += "  | " + s + ": measured  predicted   error";
  }
  *table += "\n";
  for (double n : sizes) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%4s", human(n).c_str());
    *table += buf;
    json row = {{"bytes", n}};
    for (const std::string& s : systems) {
      if (h.bench[s].empty()) continue;
      const std::map<double, double> t = medianTimes(h.bench[s]);
      const Algo algo = s == "ring"     ? Algo::kRing
                        : s == "rhd"    ? Algo::kRhd
                        : s == "mdring" ? Algo::kMdRing
                        : n <= 4096     ? Algo::kRhd
                                        : Algo::kMdRing;
      StatusOr<RingParams> rp = ringParams(a, algo);
      if (!rp.isOk()) return rp.status();
      StatusOr<Prediction> pr =
          predict(m, algo, ranks, n, *rp, algo == Algo::kMdRing ? dims : std::vector<int>{});
      if (!pr.isOk()) return pr.status();
      auto it = t.find(n);
      const std::string pad = std::string(s.size() > 4 ? s.size() - 4 : 0, ' ');
      if (it == t.end()) {
        std::snprintf(buf, sizeof buf, "  | %s%10s %10.1f %7s", pad.c_str(), "-", pr->seconds * 1e6, "-");
        *table += buf;
        continue;
      }
      const double err = (pr->seconds - it->second) / it->second;
      (*worst)[s] = std::max((*worst)[s], std::fabs(err));
      std::snprintf(buf, sizeof buf, "  | %s%10.1f %10.1f %+6.1f%%", pad.c_str(), it->second * 1e6,
                    pr->seconds * 1e6, err * 100);
      *table += buf;
      row[s] = {{"measured_us", it->second * 1e6}, {"predicted_us", pr->seconds * 1e6}, {"error", err}};
    }
    *table += "\n";
    rows->push_back(row);
  }
  return Status::ok();
}

// check's mdring rows per dimension, printed to text where there are any: libddl's telemetry samples a rank's
// latest call, so long calls are sampled more often; its shares (not its absolute times) are applied to the
// measured mean, as the hierarchy report does.
Status checkMdringDims(const Args& a, HierarchyRun& h, const Machine& m, int ranks,
                       const std::vector<int>& dims, double min, FILE* text, json* dims_rows) {
  if (h.mdring_dims_us.empty() || h.bench["mdring"].empty()) return Status::ok();
  const std::map<double, double> t = medianTimes(h.bench["mdring"]);
  std::string dt = "\nmdring per dimension (libddl's telemetry: each dim's share of the measured time), us\n";
  dt += "size  samples";
  for (size_t k = 0; k < dims.size(); ++k) {
    dt += "  | dim " + std::to_string(k) + " (" +
          linkClassName(LinkClass(std::min<int>(k, kLinkClasses - 1))) + "): measured  predicted   error";
  }
  dt += "\n";
  bool any = false;
  for (const auto& [n, samples] : h.mdring_dims_us) {
    auto it = t.find(n);
    if (n < min || it == t.end()) continue;
    std::vector<double> med(dims.size(), 0.0);
    double sum = 0;
    for (size_t k = 0; k < dims.size(); ++k) {
      std::vector<double> v;
      for (const auto& d : samples)
        if (k < d.size()) v.push_back(d[k]);
      med[k] = median(v);
      sum += med[k];
    }
    if (sum <= 0) continue;
    StatusOr<RingParams> rp = ringParams(a, Algo::kMdRing);
    if (!rp.isOk()) return rp.status();
    StatusOr<Prediction> pr = predict(m, Algo::kMdRing, ranks, n, *rp, dims);
    if (!pr.isOk()) return pr.status();
    char buf[96];
    std::snprintf(buf, sizeof buf, "%4s %8zu", human(n).c_str(), samples.size());
    dt += buf;
    json row = {{"bytes", n}, {"samples", samples.size()}};
    for (size_t k = 0; k < dims.size(); ++k) {
      const std::string prefix = "dim " + std::to_string(k) + " ";
      double predicted = 0;
      for (const Phase& ph : pr->phases)
        if (ph.what.rfind(prefix, 0) == 0) predicted += ph.seconds;
      const double measured = it->second * med[k] / sum;
      const double err = measured > 0 ? predicted / measured - 1 : 0;
      std::snprintf(buf, sizeof buf, "  | %*s%10.1f %10.1f %+6.1f%%", 15, "", measured * 1e6, predicted * 1e6,
                    err * 100);
      dt += buf;
      row["dim" + std::to_string(k)] = {
          {"measured_us", measured * 1e6}, {"predicted_us", predicted * 1e6}, {"error", err}};
    }
    dt += "\n";
    dims_rows->push_back(row);
    any = true;
  }
  if (any) std::fputs(dt.c_str(), text);
  return Status::ok();
}

int cmdCheck(int argc, char** argv) {
  StatusOr<Args> args =
      parseArgs(argc, argv, 2, {"calibration", "hierarchy", "min", "goal", "json", "segment", "window"});
  if (!args.isOk()) return fail(args.status());
  const Args& a = *args;
  // With --json - the JSON owns stdout: the table goes to stderr.
  FILE* text = a.has("json") && a.get("json") == "-" ? stderr : stdout;
  if (!a.has("calibration") || !a.has("hierarchy")) {
    return fail(Status::invalidArgument("check needs --calibration FILE and --hierarchy DIR"));
  }
  StatusOr<Calibration> cal = loadCalibration(a.get("calibration"));
  if (!cal.isOk()) return fail(cal.status());
  StatusOr<HierarchyRun> h = loadHierarchy(a.get("hierarchy"));
  if (!h.isOk()) return fail(h.status());
  for (const std::string& w : h->warnings)
    std::fprintf(stderr, "ddl-sim: warning: %s (skipped)\n", w.c_str());
  StatusOr<double> min = parseSize(a.get("min", "64K"), "--min");
  if (!min.isOk()) return fail(min.status());
  StatusOr<double> goal = parseNumber(a.get("goal", "15"), "--goal");
  if (!goal.isOk()) return fail(goal.status());

  // auto is predicted as what libddl's built-in table picks on a configured hierarchy: rhd up to 4 KiB,
  // mdring (64 KiB segments) above.
  const std::vector<std::string> systems = {"ring", "mdring", "rhd", "auto"};
  std::set<double> sizes;
  int ranks = 0;
  std::vector<int> dims;
  for (const std::string& s : systems) {
    for (const BenchRun& r : h->bench[s]) {
      ranks = r.ranks;
      // ddl-bench prints the topology in use; a run without one leaves mdring on its default grid.
      if (!r.topology.empty()) {
        StatusOr<std::vector<int>> d = parseIntList(r.topology, 'x', "topology");
        if (!d.isOk()) return fail(Status::invalidArgument(a.get("hierarchy") + ": " + d.status().message()));
        dims = *d;
      }
      for (const BenchPoint& p : r.points)
        if (p.bytes >= *min) sizes.insert(p.bytes);
    }
  }
  if (sizes.empty() || ranks == 0) {
    return fail(Status::notFound(a.get("hierarchy") +
                                 ": no ddl-bench results of ring, mdring, rhd or auto at " + human(*min) +
                                 " B or more"));
  }
  const Machine& m = cal->machine;
  json rows = json::array();
  std::map<std::string, double> worst;
  std::string table;
  if (Status s = checkSizes(a, *h, m, systems, sizes, ranks, dims, &table, &rows, &worst); !s.isOk())
    return fail(s);
  std::fprintf(text, "# ddl-sim check: %s (%d reps) against %s\n", a.get("hierarchy").c_str(), h->reps,
               a.get("calibration").c_str());
  std::fprintf(
      text,
      "# %d ranks, topology %s; times in us (measured: median of the reps' means); error = predicted / "
      "measured - 1\n",
      ranks,
      [&] {
        std::string t;
        for (size_t i = 0; i < dims.size(); ++i) t += (i ? "x" : "") + std::to_string(dims[i]);
        return t;
      }()
          .c_str());
  for (int k = 0; k < kLinkClasses; ++k) {
    std::fprintf(text, "#   %-6s alpha %8.2f us  beta %9.4f GB/s\n", linkClassName(LinkClass(k)),
                 m.links[k].alpha_s * 1e6, m.links[k].beta_Bps / 1e9);
  }
  std::fprintf(
      text,
      "#   reduction %.2f GB/s; auto predicted as libddl's built-in table picks: rhd <= 4K, mdring above\n",
      m.reduce_Bps / 1e9);
  std::fputs(table.c_str(), text);
  // mdring per dimension, from libddl's telemetry.
  json dims_rows = json::array();
  if (Status s = checkMdringDims(a, *h, m, ranks, dims, *min, text, &dims_rows); !s.isOk()) return fail(s);
  bool met = true;
  json summary = json::object();
  for (auto& [s, w] : worst) {
    std::fprintf(text, "%s: worst error %.1f%% from %s%s\n", s.c_str(), w * 100, human(*min).c_str(),
                 w * 100 <= *goal ? "" : " (above the goal)");
    summary[s] = w;
    if (w * 100 > *goal) met = false;
  }
  std::fprintf(text, "goal: every prediction within %.0f%% from %s: %s\n", *goal, human(*min).c_str(),
               met ? "met" : "NOT met");
  if (a.has("json")) {
    json j = {{"hierarchy", a.get("hierarchy")},
              {"calibration", a.get("calibration")},
              {"ranks", ranks},
              {"min_bytes", *min},
              {"goal_pct", *goal},
              {"goal_met", met},
              {"worst_error", summary},
              {"rows", rows},
              {"mdring_dims", dims_rows}};
    if (Status s = writeText(a.get("json"), j.dump(1) + "\n"); !s.isOk()) return fail(s, kExitFail);
  }
  return met ? kExitOk : kExitFail;
}

// ---- scale
// ---------------------------------------------------------------------------------------------------

// printf onto the end of *out.
template <class... A>
void appendf(std::string* out, const char* fmt, A... args) {
  const int n = std::snprintf(nullptr, 0, fmt, args...);
  if (n <= 0) return;
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>(n) + 1);
  std::snprintf(out->data() + at, static_cast<size_t>(n) + 1, fmt, args...);
  out->pop_back();  // snprintf's terminating NUL
}

// scale's clusters, by name: the built-in ones of --config, or --calibration's (which needs --compute-ms).
StatusOr<std::vector<std::pair<std::string, Config>>> scaleConfigs(const Args& a) {
  std::vector<std::pair<std::string, Config>> configs;
  if (a.has("calibration")) {
    if (a.has("config")) return Status::invalidArgument("give --config or --calibration, not both");
    if (!a.has("compute-ms")) return Status::invalidArgument("--calibration needs --compute-ms");
    StatusOr<Calibration> cal = loadCalibration(a.get("calibration"));
    if (!cal.isOk()) return cal.status();
    const std::string title = "calibration " + a.get("calibration") + ": " + cal->source;
    configs.push_back({a.get("calibration"), Config{cal->machine, title}});
  } else {
    for (const std::string& name : splitList(a.get("config", "2017,h100"))) {
      StatusOr<Config> c = builtinConfig(name);
      if (!c.isOk()) return c.status();
      configs.push_back({name, *c});
    }
    if (configs.empty()) return Status::invalidArgument("--config: empty list");
  }
  return configs;
}

// One case of scale's JSON: the cluster, GPUs, network and algorithm, the prediction with its phases, and the
// efficiencies without and with overlap.
json scaleRow(const std::string& config, int gpus, const Network& net, double bytes, Algo algo,
              const Prediction& pr, double compute, double e0, double overlap, double e1) {
  json phases = json::array();
  for (const Phase& ph : pr.phases) {
    phases.push_back({{"what", ph.what},
                      {"steps", ph.steps},
                      {"bytes_per_step", ph.bytes_per_step},
                      {"link", linkClassName(ph.link)},
                      {"flows", ph.flows},
                      {"seconds", ph.seconds}});
  }
  json row = {{"config", config},
              {"gpus", gpus},
              {"network", net.name},
              {"params", net.params},
              {"bytes", bytes},
              {"algo", algoName(algo)},
              {"dims", pr.dims},
              {"steps", pr.steps},
              {"allreduce_s", pr.seconds},
              {"compute_s", compute},
              {"efficiency", e0},
              {"overlap", overlap},
              {"efficiency_overlap", e1},
              {"phases", phases}};
  return row;
}

int cmdScale(int argc, char** argv) {
  StatusOr<Args> args = parseArgs(argc, argv, 2,
                                  {"config", "calibration", "gpus", "network", "algo", "compute-ms",
                                   "overlap", "json", "segment", "window"});
  if (!args.isOk()) return fail(args.status());
  const Args& a = *args;
  // With --json - the JSON owns stdout: the table goes to stderr.
  FILE* text = a.has("json") && a.get("json") == "-" ? stderr : stdout;
  StatusOr<std::vector<std::pair<std::string, Config>>> configs = scaleConfigs(a);
  if (!configs.isOk()) return fail(configs.status());
  StatusOr<std::vector<int>> gpus = parseIntList(a.get("gpus", "256,1024,4096"), ',', "--gpus");
  if (!gpus.isOk()) return fail(gpus.status());
  std::vector<Network> networks;
  for (const std::string& name : splitList(a.get("network", "resnet50,resnet101"))) {
    StatusOr<Network> n = builtinNetwork(name);
    if (!n.isOk()) return fail(n.status());
    networks.push_back(*n);
  }
  std::vector<Algo> algos;
  for (const std::string& name : splitList(a.get("algo", "ring,mdring,rhd"))) {
    StatusOr<Algo> al = parseAlgo(name);
    if (!al.isOk()) return fail(al.status());
    algos.push_back(*al);
  }
  if (networks.empty() || algos.empty())
    return fail(Status::invalidArgument("--network and --algo need names"));
  StatusOr<double> overlap = parseNumber(a.get("overlap", "0.5"), "--overlap");
  if (!overlap.isOk()) return fail(overlap.status());
  if (*overlap < 0 || *overlap > 1) return fail(Status::invalidArgument("--overlap must be within 0..1"));
  double compute_override = 0;
  if (a.has("compute-ms")) {
    StatusOr<double> v = parseNumber(a.get("compute-ms"), "--compute-ms");
    if (!v.isOk()) return fail(v.status());
    if (*v <= 0) return fail(Status::invalidArgument("--compute-ms must be > 0"));
    compute_override = *v * 1e-3;
  }

  // Everything is predicted before anything is printed: a case that cannot be laid out prints nothing.
  std::string table;
  json out = json::array();
  for (const auto& [cname, cfg] : *configs) {
    appendf(&table, "\n## %s\n", cfg.summary.c_str());
    appendf(&table, "%6s  %-10s %-9s %-8s %10s %8s %8s   %s\n", "GPUs", "network", "compute", "algo",
            "allreduce", "eff", "eff+ovl", "layout (mdring)");
    for (int p : *gpus) {
      for (const Network& net : networks) {
        double compute = compute_override;
        if (compute == 0) {
          StatusOr<double> c = defaultComputeSeconds(cname, net.name);
          if (!c.isOk()) return fail(c.status());
          compute = *c;
        }
        const double bytes = 4 * net.params;
        for (Algo algo : algos) {
          StatusOr<RingParams> rp = ringParams(a, algo);
          if (!rp.isOk()) return fail(rp.status());
          StatusOr<Prediction> pr = predict(cfg.machine, algo, p, bytes, *rp);
          if (!pr.isOk())
            return fail(Status::invalidArgument(cname + " at " + std::to_string(p) +
                                                " GPUs: " + pr.status().message()));
          const double e0 = scalingEfficiency(compute, pr->seconds, 0);
          const double e1 = scalingEfficiency(compute, pr->seconds, *overlap);
          std::string layout;
          for (size_t i = 0; i < pr->dims.size(); ++i) layout += (i ? "x" : "") + std::to_string(pr->dims[i]);
          appendf(&table, "%6d  %-10s %6.0f ms %-8s %7.2f ms %7.1f%% %7.1f%%   %s\n", p, net.name.c_str(),
                  compute * 1e3, algoName(algo), pr->seconds * 1e3, e0 * 100, e1 * 100, layout.c_str());
          out.push_back(scaleRow(cname, p, net, bytes, algo, *pr, compute, e0, *overlap, e1));
        }
      }
    }
  }
  for (const json& r : out) {
    if (r["config"] == "2017" && r["gpus"] == 256 && r["network"] == "resnet50" && r["algo"] == "mdring") {
      appendf(
          &table,
          "\n2017 at 256 GPUs, ResNet-50, mdring: %.1f%% (no overlap), %.1f%% (overlap %.2f); DDL's paper "
          "published 95%%\n",
          r["efficiency"].get<double>() * 100, r["efficiency_overlap"].get<double>() * 100, *overlap);
    }
  }
  appendf(&table,
          "\neff: compute / (compute + allreduce); eff+ovl: with %.2f of the allreduce hidden behind the "
          "backward pass (at most 2/3 of compute)\n",
          *overlap);
  std::fputs(table.c_str(), text);
  if (a.has("json")) {
    if (Status s = writeText(a.get("json"), out.dump(1) + "\n"); !s.isOk()) return fail(s, kExitFail);
  }
  return kExitOk;
}

// ---- predict
// -------------------------------------------------------------------------------------------------

int cmdPredict(int argc, char** argv) {
  StatusOr<Args> args = parseArgs(
      argc, argv, 2, {"config", "calibration", "ranks", "bytes", "algo", "dims", "segment", "window"});
  if (!args.isOk()) return fail(args.status());
  const Args& a = *args;
  Machine m;
  if (a.has("calibration") == a.has("config")) {
    return fail(Status::invalidArgument("predict needs --config NAME or --calibration FILE"));
  }
  if (a.has("calibration")) {
    StatusOr<Calibration> cal = loadCalibration(a.get("calibration"));
    if (!cal.isOk()) return fail(cal.status());
    m = cal->machine;
  } else {
    StatusOr<Config> c = builtinConfig(a.get("config"));
    if (!c.isOk()) return fail(c.status());
    m = c->machine;
  }
  if (!a.has("ranks") || !a.has("bytes"))
    return fail(Status::invalidArgument("predict needs --ranks and --bytes"));
  StatusOr<std::vector<int>> ranks = parseIntList(a.get("ranks"), ',', "--ranks");
  if (!ranks.isOk()) return fail(ranks.status());
  StatusOr<double> bytes = parseSize(a.get("bytes"), "--bytes");
  if (!bytes.isOk()) return fail(bytes.status());
  std::vector<int> dims;
  if (a.has("dims")) {
    StatusOr<std::vector<int>> d = parseIntList(a.get("dims"), 'x', "--dims");
    if (!d.isOk()) return fail(d.status());
    dims = *d;
  }
  // Every prediction is made before any is printed: bad input (dims that do not fit) prints nothing.
  struct Row {
    std::string algo;
    int ranks;
    Prediction pr;
  };
  std::vector<Row> rows;
  for (const std::string& name : splitList(a.get("algo", "ring,mdring,rhd"))) {
    StatusOr<Algo> algo = parseAlgo(name);
    if (!algo.isOk()) return fail(algo.status());
    StatusOr<RingParams> rp = ringParams(a, *algo);
    if (!rp.isOk()) return fail(rp.status());
    for (int p : *ranks) {
      StatusOr<Prediction> pr =
          predict(m, *algo, p, *bytes, *rp, *algo == Algo::kMdRing ? dims : std::vector<int>{});
      if (!pr.isOk()) return fail(pr.status());
      rows.push_back({name, p, *pr});
    }
  }
  for (const Row& row : rows) {
    const Prediction& pr = row.pr;
    std::printf("%s, %d ranks, %s B: %.1f us, %d steps, busiest rank sends %.0f B\n", row.algo.c_str(),
                row.ranks, human(*bytes).c_str(), pr.seconds * 1e6, pr.steps, pr.bytes_sent_max);
    for (const Phase& ph : pr.phases) {
      std::printf("  %-34s %4d steps x %12.0f B over %-6s (%d flow%s/port) %10.1f us\n", ph.what.c_str(),
                  ph.steps, ph.bytes_per_step, linkClassName(ph.link), ph.flows, ph.flows == 1 ? "" : "s",
                  ph.seconds * 1e6);
    }
  }
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "--help")) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? kExitUsage : kExitOk;
  }
  for (int i = 2; i < argc; ++i) {  // help anywhere in a command's arguments
    if (!std::strcmp(argv[i], "-h") || !std::strcmp(argv[i], "--help")) {
      std::fputs(kUsage, stdout);
      return kExitOk;
    }
  }
  const std::string cmd = argv[1];
  if (cmd == "--version") {
    std::printf("ddl-sim %s\n", ddl::kVersion);
    return kExitOk;
  }
  if (cmd == "calibrate") return cmdCalibrate(argc, argv);
  if (cmd == "check") return cmdCheck(argc, argv);
  if (cmd == "scale") return cmdScale(argc, argv);
  if (cmd == "predict") return cmdPredict(argc, argv);
  std::fprintf(stderr, "ddl-sim: unknown command '%s'\n%s", cmd.c_str(), kUsage);
  return kExitUsage;
}
