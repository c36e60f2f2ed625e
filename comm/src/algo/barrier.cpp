// Barrier: the dissemination algorithm. In round k every rank signals rank (r + 2^k) mod p and waits for the
// signal of rank (r - 2^k) mod p; after ceil(log2 p) rounds every rank has heard, directly or not, from every
// other. Works for any p; messages carry no data.
#include "algo/algo.h"

namespace ddl {

void barrier(Session& s) {
  const int p = s.size(), me = s.rank();
  if (p == 1) return;
  int rounds = 0;
  while ((1 << rounds) < p) ++rounds;
  const uint32_t base = s.phase();
  for (int k = 0; k < rounds; ++k) {
    const int dist = 1 << k;
    Request* r = s.recv((me - dist % p + p) % p, base + k, nullptr, 0);
    Request* w = s.send((me + dist) % p, base + k, nullptr, 0);
    s.wait(r);
    s.wait(w);
  }
}

}  // namespace ddl
