// Gather to and scatter from a root rank (ddlGather, ddlScatter): linear, one message per rank.
//
// Every byte must cross the root's link anyway, so the root simply posts one receive (send) per rank at once
// and lets the transport overlap them: p-1 messages, no extra copies, the message size times (p-1)/p through
// the root's link, which is the bound. Trees would save the root's latency of p-1 postings at the cost of
// copies through intermediate ranks; at the rank counts of one job the linear form wins.
#include <cstring>

#include "algo/algo.h"

namespace ddl {

void gather(Session& s, const DataSpec& d, const void* src, void* dst, size_t sendcount, int root) {
  const int p = s.size(), me = s.rank();
  const size_t bytes = sendcount * d.elem;
  const uint32_t unit = s.phase();
  if (me != root) {
    s.wait(s.send(root, unit, src, bytes));
    return;
  }
  char* out = static_cast<char*>(dst);
  char* mine = out + static_cast<size_t>(root) * bytes;
  if (src != mine) std::memmove(mine, src, bytes);
  for (int r = 0; r < p; ++r) {
    if (r != root) s.recv(r, unit, out + static_cast<size_t>(r) * bytes, bytes);
  }
  s.waitAll();
}

void scatter(Session& s, const DataSpec& d, const void* src, void* dst, size_t recvcount, int root) {
  const int p = s.size(), me = s.rank();
  const size_t bytes = recvcount * d.elem;
  const uint32_t unit = s.phase();
  if (me != root) {
    s.wait(s.recv(root, unit, dst, bytes));
    return;
  }
  const char* in = static_cast<const char*>(src);
  const char* mine = in + static_cast<size_t>(root) * bytes;
  if (dst != mine) std::memmove(dst, mine, bytes);
  for (int r = 0; r < p; ++r) {
    if (r != root) s.send(r, unit, in + static_cast<size_t>(r) * bytes, bytes);
  }
  s.waitAll();
}

}  // namespace ddl
