// Algorithm and segment-size selection for allreduce. DDL_ALGO / ddlConfig_t.algorithm force a choice;
// otherwise small messages take the latency algorithm (rhd), large ones the multi-dimensional ring when the
// topology has more than one non-trivial dimension, else the flat ring. Thresholds come from ddl-bench
// measurements on shared memory and TCP (see docs/architecture.md).
#include "algo/algo.h"

namespace ddl {
namespace {
constexpr size_t kRhdMaxBytes = 64 * 1024;
constexpr size_t kDefaultSegmentBytes = 256 * 1024;
}  // namespace

Algo selectAllReduce(Algo forced, const Topology& topo, int nranks, size_t bytes) {
  if (forced != Algo::kAuto) return forced;
  if (bytes <= kRhdMaxBytes) return Algo::kRhd;
  // mdring whenever the ranks form a grid (given, or factorised: see mdringGrid); a prime count keeps the ring.
  return mdringGrid(topo).nontrivialDims() >= 2 ? Algo::kMdRing : Algo::kRing;
}

Topology mdringGrid(const Topology& configured) {
  if (configured.nontrivialDims() >= 2) return configured;
  Topology grid;
  int p = configured.size();
  for (int f = 2; f * f <= p; ++f) {
    while (p % f == 0) {
      grid.dims.push_back(f);
      p /= f;
    }
  }
  if (p > 1 || grid.dims.empty()) grid.dims.push_back(p);
  return grid;
}

size_t selectSegmentBytes(size_t forced_bytes, size_t bytes) {
  if (forced_bytes > 0) return forced_bytes;
  return kDefaultSegmentBytes;
}

}  // namespace ddl
