// ddl-sim's calibration: the Machine the model runs on, from measured figures, and its file.
//
// Pure functions over text (the caller reads the files): parsing ucx_perftest's output and ddl-bench's
// --json, fitting a link class's alpha and beta to a flat ring's measured times by least squares, and the
// calibration file itself (JSON, written and read back). Every malformed input is a Status naming the file
// and what is wrong with it, never an exception or a crash.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "tools/ddl-sim/model.h"

namespace ddl::sim {

// The calibration file: a Machine plus where its figures came from.
//   {"format": "ddl-sim-calibration", "version": 1, "source": "...",
//    "ranks_per_node": 2, "nodes_per_switch": 2, "nics_per_node": 1, "reduce_GBps": 3.1,
//    "links": {"intra":  {"alpha_s": 7.1e-6, "beta_Bps": 1.1e10, "from": "ucx_perftest shm"},
//              "node":   {...}, "switch": {...}}}
// "switch" may be left out: it is then the same as "node" (a one-switch cluster).
struct Calibration {
  Machine machine;
  std::string source;
  std::string from[kLinkClasses];  // per link class: where alpha and beta came from
};

std::string calibrationToJson(const Calibration& c);
StatusOr<Calibration> calibrationFromJson(const std::string& text, const std::string& origin);

// ucx_perftest's "Final:" line: median and mean latency (us; one way for tag_lat), overall bandwidth
// (bytes/s; ucx_perftest's MB/s are 2^20 bytes).
struct Perftest {
  double p50_us = 0, mean_us = 0, bw_Bps = 0;
};
StatusOr<Perftest> parsePerftest(const std::string& text, const std::string& origin);

// One ddl-bench (or mpi-allreduce-bench) --json file: its rank count and algorithm, and the out-of-place time
// of each size whose result was right.
struct BenchPoint {
  double bytes = 0, seconds = 0;
};
struct BenchRun {
  int ranks = 0;
  std::string topology, algo;
  std::vector<BenchPoint> points;
};
StatusOr<BenchRun> parseBenchJson(const std::string& text, const std::string& origin);

// alpha and beta of a flat ring's slowest link from its measured times: least squares on
// T = 2(p-1)·alpha + 2(p-1)/p·n / beta, weighted by 1/T (relative errors, so the small sizes count), over the
// points of every run with bytes >= min_bytes. beta then includes the reduction's cost.
struct LinkFit {
  Link link;
  int points = 0;
  double rms_rel_error = 0;  // of the fitted model against the points
};
StatusOr<LinkFit> fitRing(const std::vector<BenchRun>& runs, double min_bytes);

// The median of values (0 for none).
double median(std::vector<double> values);

}  // namespace ddl::sim
