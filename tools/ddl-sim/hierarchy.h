// What bench/hierarchy.sh leaves in its --out directory, read for `ddl-sim calibrate` and `ddl-sim check`:
// OUT/raw/rep*/perftest-*.txt (ucx_perftest over the link and in shared memory) and OUT/raw/rep*/ALGO.BAND.json
// (ddl-bench --json per algorithm). Reads files; called from ddl-sim's main thread only.
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
  std::vector<std::string> warnings;  // unreadable files, said and skipped
};

StatusOr<HierarchyRun> loadHierarchy(const std::string& out_dir);

// Reads a whole file (at most 64 MiB); a Status naming it when it cannot.
StatusOr<std::string> readTextFile(const std::string& path);

// The median time per size of an algorithm's runs: {bytes: seconds}.
std::map<double, double> medianTimes(const std::vector<BenchRun>& runs);

}  // namespace ddl::sim
