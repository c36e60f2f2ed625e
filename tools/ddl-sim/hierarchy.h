// What bench/hierarchy.sh leaves in its --out directory, read for `ddl-sim calibrate` and `ddl-sim check`:
// OUT/raw/rep*/perftest-*.txt (ucx_perftest over the link and in shared memory) and
// OUT/raw/rep*/ALGO.BAND.json (ddl-bench --json per algorithm). Reads files; called from ddl-sim's main
// thread only.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "tools/ddl-sim/calibration.h"

namespace ddl::sim {

struct HierarchyRun {
  std::string dir;
  int reps = 0;
  // ucx_perftest per test name ("net-lat", "net-bw", "shm-lat", "shm-bw"), one per rep where it gave a result
  // (shm-bw: the best of the rep's runs, as bench/hierarchy_report.py takes it).
  std::map<std::string, std::vector<Perftest>> perftest;
  // ddl-bench runs per algorithm ("ring", "mdring", "rhd", "auto"), every band of every rep.
  std::map<std::string, std::vector<BenchRun>> bench;
  // mdring's time per dimension (us), from libddl's telemetry (raw/rep*/mdring.*.telemetry): per message
  // size, every sampled call's dims.
  std::map<double, std::vector<std::vector<double>>> mdring_dims_us;
  std::vector<std::string> warnings;  // unreadable files, said and skipped
};

// One line of libddl's telemetry ("ddl1 key=value ..."): an mdring call's size and time per dimension, or
// false for anything else (another algorithm, no dims, a rank's first call, which includes connecting).
bool parseMdringTelemetry(const std::string& line, double* bytes, std::vector<double>* dims_us);

StatusOr<HierarchyRun> loadHierarchy(const std::string& out_dir);

// Reads a whole file (at most 64 MiB); a Status naming it when it cannot.
StatusOr<std::string> readTextFile(const std::string& path);

// The median time per size of an algorithm's runs: {bytes: seconds}.
std::map<double, double> medianTimes(const std::vector<BenchRun>& runs);

}  // namespace ddl::sim
