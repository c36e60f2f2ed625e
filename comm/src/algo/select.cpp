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
  if (nranks <= 2 || bytes <= kRhdMaxBytes) return bytes <= kRhdMaxBytes ? Algo::kRhd : Algo::kRing;
  return topo.nontrivialDims() >= 2 ? Algo::kMdRing : Algo::kRing;
}

size_t selectSegmentBytes(size_t forced_bytes, size_t bytes) {
  if (forced_bytes > 0) return forced_bytes;
  return kDefaultSegmentBytes;
}

}  // namespace ddl
