// Small- and medium-message allreduce for any rank count: recursive doubling and recursive halving-doubling.
//
// Let q be the largest power of two <= p and e = p - q. First the 2e lowest ranks pair up: each even one sends
// its vector to the odd one above it and sits out, so q ranks remain (Rabenseifner's fold). Then:
//  - tiny messages (<= kDoublingMaxBytes): recursive doubling. log2(q) rounds; in round k every rank swaps its
//    whole vector with the rank 2^k away and reduces. Fewest rounds, the latency optimum.
//  - larger ones: recursive halving (a reduce-scatter: each round swaps half of the current range with the
//    partner and keeps reducing the other half) then recursive doubling of the result (an allgather). 2·log2(q)
//    rounds, each rank moves 2(q-1)/q of the message: fewer latencies than the ring's 2(p-1).
// Finally each odd rank of the fold sends the result back to its even partner. 2 extra rounds when p is not a
// power of two. All ops are commutative, so every rank ends with bit-identical results.
#include <cstring>
#include <vector>

#include "algo/algo.h"
#include "reduce.h"

namespace ddl {
namespace {
constexpr size_t kDoublingMaxBytes = 4096;
}

void rhdAllReduce(Session& s, const DataSpec& d, const void* srcv, void* dstv, size_t count) {
  const int p = s.size(), me = s.rank();
  const size_t es = d.elem, bytes = count * es;
  const char* src = static_cast<const char*>(srcv);
  char* dst = static_cast<char*>(dstv);
  if (p == 1 || count == 0) {
    if (src != dst) std::memcpy(dst, src, bytes);
    return;
  }
  // This rank's running partial result: the input until the first reduction writes dst, so out of place costs
  // no extra copy.
  const char* cur = src;

  int q = 1, rounds = 0;
  while (q * 2 <= p) {
    q *= 2;
    ++rounds;
  }
  const int extra = p - q;
  // Unit numbers: 0 fold, 1..2*rounds the exchange rounds, 2*rounds+1 unfold.
  const uint32_t base = s.phase();
  char* tmp = s.channel().scratch(0, bytes);

  // Fold: ranks below 2*extra pair up; the odd one carries on as virtual rank me/2.
  int v;
  if (me < 2 * extra) {
    if (me % 2 == 0) {
      s.wait(s.send(me + 1, base, src, bytes));
      v = -1;
    } else {
      s.wait(s.recv(me - 1, base, tmp, bytes));
      reduce(dst, src, tmp, count, d.type, d.op);
      cur = dst;
      v = me / 2;
    }
  } else {
    v = me - extra;
  }
  auto real = [extra](int vr) { return vr < extra ? 2 * vr + 1 : vr + extra; };

  if (v >= 0) {
    if (bytes <= kDoublingMaxBytes) {
      for (int k = 0, mask = 1; mask < q; ++k, mask <<= 1) {
        const int partner = real(v ^ mask);
        Request* r = s.recv(partner, base + 1 + k, tmp, bytes);
        Request* w = s.send(partner, base + 1 + k, cur, bytes);
        s.wait(r);
        s.wait(w);
        reduce(dst, cur, tmp, count, d.type, d.op);
        cur = dst;
      }
      if (d.op == ddlAvg) finishAvg(dst, count, d.type, p);
    } else {
      struct Range {
        size_t lo, hi;
      };
      std::vector<Range> levels;
      size_t lo = 0, hi = count;
      int k = 0;
      for (int mask = q / 2; mask >= 1; mask >>= 1, ++k) {
        const int partner = real(v ^ mask);
        const size_t mid = lo + (hi - lo) / 2;
        const bool lower = (v & mask) == 0;
        const size_t keep_lo = lower ? lo : mid, keep_hi = lower ? mid : hi;
        const size_t give_lo = lower ? mid : lo, give_hi = lower ? hi : mid;
        Request* r = s.recv(partner, base + 1 + k, tmp, (keep_hi - keep_lo) * es);
        Request* w = s.send(partner, base + 1 + k, cur + give_lo * es, (give_hi - give_lo) * es);
        s.wait(r);
        s.wait(w);
        reduce(dst + keep_lo * es, cur + keep_lo * es, tmp, keep_hi - keep_lo, d.type, d.op);
        cur = dst;  // from here on, the kept range of dst holds the partial
        levels.push_back({lo, hi});
        lo = keep_lo;
        hi = keep_hi;
      }
      if (d.op == ddlAvg) finishAvg(dst + lo * es, hi - lo, d.type, p);
      for (int mask = 1; mask < q; mask <<= 1, ++k) {
        const int partner = real(v ^ mask);
        const Range up = levels.back();
        levels.pop_back();
        // The partner holds the other part of `up`.
        const size_t other_lo = (lo == up.lo) ? hi : up.lo;
        const size_t other_hi = (lo == up.lo) ? up.hi : lo;
        Request* r = s.recv(partner, base + 1 + k, dst + other_lo * es, (other_hi - other_lo) * es);
        Request* w = s.send(partner, base + 1 + k, dst + lo * es, (hi - lo) * es);
        s.wait(r);
        s.wait(w);
        lo = up.lo;
        hi = up.hi;
      }
    }
  }

  // Unfold: the odd rank of each folded pair returns the result.
  const uint32_t last = base + 2 * rounds + 1;
  if (me < 2 * extra) {
    if (me % 2 == 1) {
      s.wait(s.send(me - 1, last, dst, bytes));
    } else {
      s.wait(s.recv(me + 1, last, dst, bytes));
    }
  }
}

}  // namespace ddl
