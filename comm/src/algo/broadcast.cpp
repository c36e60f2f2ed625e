// Broadcast from a root rank.
//
// Small messages (<= kTreeMaxBytes) go down a binomial tree: ceil(log2 p) rounds, the latency optimum.
// Larger ones go down a pipelined chain root -> root+1 -> ... : the message is cut into segments and each rank
// forwards segment j as soon as it arrives, with up to kWindow segments in flight, so the time approaches
// size/bandwidth + (p-2) segment times instead of (p-1) message times.
#include <algorithm>
#include <cstring>
#include <deque>

#include "algo/algo.h"
#include "error.h"

namespace ddl {
namespace {
constexpr size_t kTreeMaxBytes = 64 * 1024;
constexpr int kWindow = 4;
}  // namespace

void broadcast(Session& s, const DataSpec& d, const void* src, void* dst, size_t count, int root) {
  const int p = s.size(), me = s.rank();
  const size_t bytes = count * d.elem;
  char* out = static_cast<char*>(dst);
  if (me == root && src != dst) std::memcpy(out, src, bytes);
  if (p == 1 || count == 0) return;
  const int v = (me - root + p) % p;  // position relative to the root
  auto real = [&](int vr) { return (vr + root) % p; };

  if (bytes <= kTreeMaxBytes) {
    const uint32_t unit = s.phase();
    int mask = 1;
    while (mask < p) {
      if (v & mask) {
        s.wait(s.recv(real(v - mask), unit, out, bytes));
        break;
      }
      mask <<= 1;
    }
    std::deque<Request*> sends;
    for (mask >>= 1; mask > 0; mask >>= 1) {
      if (v + mask < p) sends.push_back(s.send(real(v + mask), unit, out, bytes));
    }
    for (Request* r : sends) s.wait(r);
    return;
  }

  // Segments of whole elements, widened where needed so that they fit the phase's unit numbers.
  const size_t min_seg = (bytes / tag::kMaxUnits + 1 + d.elem - 1) / d.elem * d.elem;
  const size_t seg = std::max({d.elem, d.segment_bytes / d.elem * d.elem, min_seg});
  const uint64_t nseg = (bytes + seg - 1) / seg;
  const uint32_t base = s.phase();
  const bool has_prev = v > 0, has_next = v + 1 < p;
  const int prev = real(v - 1), next = real(v + 1);
  auto seg_len = [&](uint64_t j) { return std::min(seg, bytes - j * seg); };

  Request* recvs[kWindow] = {};
  std::deque<Request*> sends;
  uint64_t recv_posted = 0, arrived = 0;
  while (arrived < nseg) {
    if (has_prev) {
      while (recv_posted < nseg && recv_posted < arrived + kWindow) {
        recvs[recv_posted % kWindow] =
            s.recv(prev, base + static_cast<uint32_t>(recv_posted), out + recv_posted * seg, seg_len(recv_posted));
        ++recv_posted;
      }
      Request* r = recvs[arrived % kWindow];
      if (!s.test(r)) {
        while (!sends.empty() && s.test(sends.front())) sends.pop_front();
        s.progress();
        continue;
      }
    }
    if (has_next) {
      while (sends.size() >= kWindow) {
        s.wait(sends.front());
        sends.pop_front();
      }
      sends.push_back(s.send(next, base + static_cast<uint32_t>(arrived), out + arrived * seg, seg_len(arrived)));
    }
    ++arrived;
  }
  for (Request* r : sends) s.wait(r);
}

}  // namespace ddl
