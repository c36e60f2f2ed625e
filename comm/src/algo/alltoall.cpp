// All-to-all with a count per pair (ddlAllToAllv; ddlAllToAll is the uniform case): every rank sends block j of
// its input to rank j and receives rank j's block for it.
//
// All receives are posted first, then the sends in the order me+1, me+2, ... so that at any moment the ranks
// send to different peers instead of all to the same one (the pairwise-exchange order of MPICH's
// alltoall). Each rank moves (p-1)/p of its data once, the lower bound; latency is one message round, since
// every message is in flight at once. A pair whose counts disagree (rank i sends n to j, j expects m from i)
// fails as a mismatch on the receiver. Input that overlaps the output (in place) is first copied aside.
#include <algorithm>
#include <cstring>

#include "algo/algo.h"

namespace ddl {

void allToAllv(Session& s, const DataSpec& d, const void* srcv, const size_t* sendcounts, const size_t* sdispls,
               void* dstv, const size_t* recvcounts, const size_t* rdispls) {
  const int p = s.size(), me = s.rank();
  const size_t es = d.elem;
  const char* src = static_cast<const char*>(srcv);
  char* dst = static_cast<char*>(dstv);
  size_t send_end = 0, recv_end = 0;  // extents in elements
  for (int r = 0; r < p; ++r) {
    send_end = std::max(send_end, sdispls[r] + sendcounts[r]);
    recv_end = std::max(recv_end, rdispls[r] + recvcounts[r]);
  }
  if (send_end > 0 && recv_end > 0 && src < dst + recv_end * es && dst < src + send_end * es) {
    char* copy = s.channel().scratch(1, send_end * es);
    std::memcpy(copy, src, send_end * es);
    src = copy;
  }
  const uint32_t unit = s.phase();
  for (int k = 1; k < p; ++k) {
    const int peer = (me - k + p) % p;
    s.recv(peer, unit, dst + rdispls[peer] * es, recvcounts[peer] * es);
  }
  std::memmove(dst + rdispls[me] * es, src + sdispls[me] * es, sendcounts[me] * es);
  for (int k = 1; k < p; ++k) {
    const int peer = (me + k) % p;
    s.send(peer, unit, src + sdispls[peer] * es, sendcounts[peer] * es);
  }
  s.waitAll();
}

}  // namespace ddl
