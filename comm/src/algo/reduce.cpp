// Reduce to a root rank (ddlReduce): only the root receives the result.
//
// Small messages (up to kTreeMaxBytes, or fewer elements than ranks) go up a binomial tree rooted at the
// root: in round k every rank whose position relative to the root has bit k set sends its partial result to
// the rank 2^k below it and is done; the others receive and reduce. ceil(log2 p) rounds, the latency optimum,
// but the root receives the whole message log2 p times.
//
// Larger ones run the ring's reduce-scatter (ring.cpp, p-1 pipelined steps: every rank ends owning one fully
// reduced block) and then every rank sends its block to the root: each rank moves (p-1)/p of the message
// twice at most and the root receives it once, Rabenseifner's reduce. ddlAvg divides each block once, at the
// end of the reduce-scatter.
#include <cstring>

#include "algo/algo.h"
#include "reduce.h"

namespace ddl {
namespace {
constexpr size_t kTreeMaxBytes = 64 * 1024;
}

void reduceTo(Session& s, const DataSpec& d, const void* srcv, void* dstv, size_t count, int root) {
  const int p = s.size(), me = s.rank();
  const size_t es = d.elem, bytes = count * es;
  const char* src = static_cast<const char*>(srcv);
  char* dst = static_cast<char*>(dstv);  // the root's only
  if (p == 1) {
    if (src != dst) std::memcpy(dst, src, bytes);
    return;
  }

  if (bytes <= kTreeMaxBytes || count < static_cast<size_t>(p)) {
    const uint32_t unit = s.phase();
    const int v = (me - root + p) % p;  // position relative to the root
    auto real = [&](int vr) { return (vr + root) % p; };
    char* tmp = s.channel().scratch(0, bytes);
    char* acc = me == root ? dst : s.channel().scratch(1, bytes);
    const char* cur = src;  // this rank's partial result: the input until the first reduction
    for (int mask = 1; mask < p; mask <<= 1) {
      if (v & mask) {
        s.wait(s.send(real(v - mask), unit, cur, bytes));
        return;
      }
      if (v + mask < p) {
        s.wait(s.recv(real(v + mask), unit, tmp, bytes));
        reduce(acc, cur, tmp, count, d.type, d.op);
        cur = acc;
      }
    }
    // Only the root gets here, having received at least once (p > 1): the result is in dst.
    if (d.op == ddlAvg) finishAvg(dst, count, d.type, p);
    return;
  }

  // The root reduce-scatters straight into its output; the others into a workspace.
  char* work = me == root ? dst : s.channel().scratch(1, bytes);
  Group g = flatGroup(p, me);
  ringSteps(s, g, d, src, work, count, 0, p - 1, -1, d.op == ddlAvg ? p : 0);  // rank r owns block r
  const uint32_t unit = s.phase();
  if (me != root) {
    s.wait(s.send(root, unit, work + blockBegin(count, p, me) * es, blockCount(count, p, me) * es));
    return;
  }
  for (int r = 0; r < p; ++r) {
    if (r != root) s.recv(r, unit, dst + blockBegin(count, p, r) * es, blockCount(count, p, r) * es);
  }
  s.waitAll();
}

}  // namespace ddl
