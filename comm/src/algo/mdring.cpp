// Multi-dimensional ring allreduce: IBM DDL's "multi-ring" (BlueConnect), over a topology d0 x d1 x ... .
//
// Ranks are points of a grid whose dim 0 varies fastest (typically the GPUs of one node), dim 1 next (nodes
// under one switch), and so on. The allreduce runs a reduce-scatter along dim 0 among the d0 ranks that share
// every other coordinate; each rank then holds 1/d0 of the message, fully reduced over its dim-0 ring. It runs
// the next reduce-scatter along dim 1 on that shard only, and so on; after the last dimension each rank holds
// 1/p of the result, reduced over all p ranks. Allgathers along the dims in reverse order rebuild the message.
//
// Bytes on the wire per rank stay 2(p-1)/p of the message, as in a flat ring, but the sequential steps drop
// from 2(p-1) to 2·Σ(di-1) (2x2: 4 instead of 6; 4x8x2: 22 instead of 126), and the big first phase stays on
// the fastest links (within a node) while the slow links carry only a 1/d0 shard. Each phase is ring.cpp's
// pipelined ring.
#include <chrono>
#include <cstring>

#include "algo/algo.h"
#include "error.h"
#include "transport/shm_node.h"

namespace ddl {

Group groupAlong(const Topology& topo, int rank, int k) {
  Group g;
  const int stride = topo.stride(k), c = topo.coord(rank, k);
  const int origin = rank - c * stride;
  for (int i = 0; i < topo.dims[k]; ++i) g.ranks.push_back(origin + i * stride);
  g.me = c;
  return g;
}

int dimAboveNode(const Topology& grid) {
  for (size_t k = 1; k < grid.dims.size(); ++k)
    if (grid.dims[k] > 1) return static_cast<int>(k);
  DDL_ASSERT(false && "a dim above the node");
  return 0;
}

namespace {

// Dims first_dim and up of the allreduce on elements [lo, lo + n) of the message, whose element `base` is at
// in and out: the whole message from dim 0 (lo = base = 0), or a rank's block once dim 0 has been reduced
// elsewhere. Dim 0 goes over shared memory where node is given.
void mdringDims(Session& s, const DataSpec& d, const Topology& topo, const char* in, char* out, size_t lo,
                size_t n, size_t base, int first_dim, ShmNode* node) {
  const int p = s.size();
  const size_t es = d.elem;
  int last_dim = -1;
  for (size_t k = 0; k < topo.dims.size(); ++k)
    if (topo.dims[k] > 1) last_dim = static_cast<int>(k);

  struct Level {
    Group g;
    size_t lo, n;
  };
  std::vector<Level> levels;
  std::vector<int> level_dim;  // the topology dim of each level, for Session::dim_seconds
  s.dim_seconds.assign(topo.dims.size(), 0.0);
  using Clock = std::chrono::steady_clock;
  auto since = [](Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  for (size_t k = static_cast<size_t>(first_dim); k < topo.dims.size(); ++k) {
    const int dk = topo.dims[k];
    if (dk == 1) continue;
    Group g = groupAlong(topo, s.rank(), static_cast<int>(k));
    const int avg = (d.op == ddlAvg && static_cast<int>(k) == last_dim) ? p : 0;
    const auto t0 = Clock::now();
    const bool shm = node != nullptr && k == 0;
    // Over shared memory member i keeps block i; around a ring, member i keeps block i+1.
    const int b = shm ? g.me : ringOwnedBlock(g, 0);
    if (shm) {
      shmReduceScatter(s, *node, d, in + (lo - base) * es, out + (lo - base + blockBegin(n, dk, b)) * es, n,
                       avg);
    } else {
      ringSteps(s, g, d, in + (lo - base) * es, out + (lo - base) * es, n, 0, dk - 1, 0, avg);
    }
    s.dim_seconds[k] += since(t0);
    levels.push_back({g, lo, n});
    level_dim.push_back(static_cast<int>(k));
    lo += blockBegin(n, dk, b);
    n = blockCount(n, dk, b);
    in = out;  // later dims work on the partial sums already in dst
  }
  for (size_t i = levels.size(); i-- > 0;) {
    const Level& level = levels[i];
    const int dk = level.g.size();
    const auto t0 = Clock::now();
    char* at = out + (level.lo - base) * es;
    if (node != nullptr && level_dim[i] == 0) {
      shmAllGather(s, *node, d, at, level.n);
    } else {
      ringSteps(s, level.g, d, at, at, level.n, dk - 1, 2 * dk - 2, 0, 0);
    }
    s.dim_seconds[level_dim[i]] += since(t0);
  }
}

}  // namespace

void mdringAllReduce(Session& s, const DataSpec& d, const Topology& topo, const void* src, void* dst,
                     size_t count, ShmNode* node) {
  if (s.size() == 1 || count == 0) {
    if (src != dst) std::memcpy(dst, src, count * d.elem);
    return;
  }
  mdringDims(s, d, topo, static_cast<const char*>(src), static_cast<char*>(dst), 0, count, 0, 0, node);
}

void mdringAboveDim0(Session& s, const DataSpec& d, const Topology& topo, void* block, size_t lo, size_t n) {
  char* b = static_cast<char*>(block);
  mdringDims(s, d, topo, b, b, lo, n, lo, 1, nullptr);
}

}  // namespace ddl
