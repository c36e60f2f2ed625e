// Ring allreduce: reduce-scatter then allgather around a ring of g members, pipelined by segment.
//
// The message is cut into g blocks. In the 2(g-1) steps each member sends one block to its right neighbour
// and receives one from its left: during the first g-1 steps (reduce-scatter) each received partial sum is
// combined with the member's own input, and after them member i owns the complete block i+1; during the last
// g-1 steps (allgather) the complete blocks travel once more around the ring. Every member moves
// 2(g-1)/g of the message, which is optimal for bandwidth; the cost is 2(g-1) latencies, which is why small
// messages go to rhd.cpp instead.
//
// Blocks are further cut into segments (DDL_SEGMENT_BYTES). A step does not wait for the previous step as a
// whole: segment j of step t+1 is sent as soon as segment j of step t has been received and reduced, with up
// to kWindow receives and kWindow sends in flight, so the wire, the reduction and the neighbours' work
// overlap (Gloo's "two segments in flight", generalised). Receives of the reduce-scatter steps land in a small
// staging window; allgather receives land directly in the output.
//
// The same steps serve mdring (one ring per topology dimension, on a shrinking shard), allgather
// (the last g-1 steps only) and reduce-scatter (the first g-1 only).
#include <algorithm>
#include <cstring>
#include <deque>

#include "algo/algo.h"
#include "error.h"
#include "reduce.h"

namespace ddl {

Group flatGroup(int nranks, int rank) {
  Group g;
  g.ranks.resize(nranks);
  for (int i = 0; i < nranks; ++i) g.ranks[i] = i;
  g.me = rank;
  return g;
}

size_t blockBegin(size_t count, int g, int i) {
  size_t q = count / g, r = count % g;
  return i * q + std::min<size_t>(i, r);
}

size_t blockCount(size_t count, int g, int i) { return count / g + (static_cast<size_t>(i) < count % g ? 1 : 0); }

namespace {
constexpr int kWindow = 4;
}

void ringSteps(Session& s, const Group& g, const DataSpec& d, const char* src, char* dst, size_t count,
               int t_begin, int t_end, int shift, int avg_divisor) {
  const int G = g.size();
  if (G == 1 || t_begin >= t_end) return;
  const uint32_t base = s.phase();  // even with nothing to move: see Session::phase
  if (count == 0) return;
  const size_t es = d.elem;
  const size_t steps = static_cast<size_t>(t_end - t_begin);
  const size_t largest = blockCount(count, G, 0);  // block 0 is the largest
  // Elements per segment: as configured, but large enough that the phase fits its unit numbers.
  const size_t min_seg = (largest + tag::kMaxUnits / steps - 1) / (tag::kMaxUnits / steps);
  const size_t seg = std::max({size_t{1}, d.segment_bytes / es, min_seg});
  const size_t nseg = (largest + seg - 1) / seg;
  const uint64_t total = steps * nseg;
  const int right = g.ranks[(g.me + 1) % G];
  const int left = g.ranks[(g.me + G - 1) % G];
  const int rs_end = G - 1;  // steps before this one reduce
  auto mod = [G](long x) { return static_cast<int>(((x % G) + G) % G); };
  char* staging = t_begin < rs_end ? s.channel().scratch(0, kWindow * seg * es) : nullptr;

  // Segment j of block b: [*off, *off + *n) elements; *n == 0 when the block is shorter.
  auto segment = [&](int b, uint64_t j, size_t* off, size_t* n) {
    size_t bc = blockCount(count, G, b);
    size_t start = j * seg;
    *off = blockBegin(count, G, b) + start;
    *n = start < bc ? std::min(seg, bc - start) : 0;
  };

  Request* recvs[kWindow] = {};
  std::deque<Request*> sends;
  uint64_t recv_posted = 0, processed = 0, send_posted = 0;

  while (processed < total || send_posted < total) {
    // Receives: up to kWindow ahead of what has been processed (the staging slots).
    while (recv_posted < total && recv_posted < processed + kWindow) {
      const int t = t_begin + static_cast<int>(recv_posted / nseg);
      size_t off, n;
      segment(mod(g.me - t - 1 + shift), recv_posted % nseg, &off, &n);
      Request*& slot = recvs[recv_posted % kWindow];
      slot = nullptr;
      if (n > 0) {
        char* into = t < rs_end ? staging + (recv_posted % kWindow) * seg * es : dst + off * es;
        slot = s.recv(left, base + static_cast<uint32_t>(recv_posted), into, n * es);
      }
      ++recv_posted;
    }
    // Sends: a unit of step t+1 is ready once the same segment of step t has been processed.
    while (send_posted < total && sends.size() < kWindow &&
           (send_posted < nseg || send_posted - nseg < processed)) {
      const int t = t_begin + static_cast<int>(send_posted / nseg);
      size_t off, n;
      segment(mod(g.me - t + shift), send_posted % nseg, &off, &n);
      if (n > 0) {
        const char* from = (t == 0) ? src : dst;
        sends.push_back(s.send(right, base + static_cast<uint32_t>(send_posted), from + off * es, n * es));
      }
      ++send_posted;
    }
    while (!sends.empty() && s.test(sends.front())) sends.pop_front();
    if (processed == total) {  // only sends left, held back by the window
      s.progress();
      continue;
    }

    Request* r = recvs[processed % kWindow];
    if (r && !s.test(r)) {
      s.progress();
      continue;
    }
    const int t = t_begin + static_cast<int>(processed / nseg);
    if (r && t < rs_end) {
      size_t off, n;
      segment(mod(g.me - t - 1 + shift), processed % nseg, &off, &n);
      const char* in = staging + (processed % kWindow) * seg * es;
      reduce(dst + off * es, src + off * es, in, n, d.type, d.op);
      if (t == rs_end - 1 && avg_divisor > 0) finishAvg(dst + off * es, n, d.type, avg_divisor);
    }
    ++processed;
  }
  while (!sends.empty()) {
    s.wait(sends.front());
    sends.pop_front();
  }
}

void ringAllReduce(Session& s, const DataSpec& d, const void* src, void* dst, size_t count) {
  const int p = s.size();
  if (p == 1) {
    if (src != dst) std::memcpy(dst, src, count * d.elem);
    return;
  }
  // Out of place needs no copy: step 0 sends from src, and every block of dst is written exactly once by a
  // reduction or by the allgather.
  Group g = flatGroup(p, s.rank());
  ringSteps(s, g, d, static_cast<const char*>(src), static_cast<char*>(dst), count, 0, 2 * p - 2, 0,
            d.op == ddlAvg ? p : 0);
}

void ringAllGather(Session& s, const DataSpec& d, const void* src, void* dst, size_t sendcount) {
  const int p = s.size();
  char* out = static_cast<char*>(dst);
  char* mine = out + static_cast<size_t>(s.rank()) * sendcount * d.elem;
  if (src != mine) std::memmove(mine, src, sendcount * d.elem);
  if (p == 1) return;
  Group g = flatGroup(p, s.rank());
  // shift -1: member i owns block i, so the allgather steps alone distribute every rank's block.
  ringSteps(s, g, d, out, out, sendcount * p, p - 1, 2 * p - 2, -1, 0);
}

void ringReduceScatter(Session& s, const DataSpec& d, const void* src, void* dst, size_t recvcount) {
  const int p = s.size();
  const size_t total = recvcount * p;
  const char* in = static_cast<const char*>(src);
  if (p == 1) {
    if (src != dst) std::memmove(dst, src, recvcount * d.elem);
    return;
  }
  // The partial sums go to a workspace so the input stays untouched; rank r ends with block r.
  char* work = s.channel().scratch(1, total * d.elem);
  Group g = flatGroup(p, s.rank());
  ringSteps(s, g, d, in, work, total, 0, p - 1, -1, d.op == ddlAvg ? p : 0);
  std::memcpy(dst, work + blockBegin(total, p, s.rank()) * d.elem, recvcount * d.elem);
}

}  // namespace ddl
