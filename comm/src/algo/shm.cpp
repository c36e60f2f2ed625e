// Collectives among the ranks of one node, over their shared-memory segment (shm_node.h), as Open MPI's and
// NCCL's intra-node paths do: no message passing, each byte crosses memory as few times as possible.
//
// Member i of n owns block i of the message (blockBegin(count, n, i)). The message moves in rounds; round g
// carries piece g of every block (at most round_bytes / n bytes each), so a member's block stays contiguous
// (what a hierarchical allreduce hands to the next dimension) while the rounds pipeline:
//
//   allreduce      copy in    every other member's piece of its input into its slot      (one copy)
//                  reduce     its own piece: its input and every other slot's, read in place, into its slot
//                  copy out   every member's finished piece into its output
//   reducescatter  copy in, then reduce straight into its output
//   allgather      copy in its own piece only, then copy out the others'
//
// Stages of consecutive rounds overlap: at step t a member copies round t in, reduces round t-1 and copies round
// t-2 out, so a member that is a little late rarely makes the others wait. Slots hold `buffers` rounds; a round's
// buffer is reused only when every member has consumed it. Each piece is reduced by one member only, so every
// member ends with bit-identical results.
#include <algorithm>
#include <cstring>

#include "algo/algo.h"
#include "reduce.h"
#include "shm_node.h"

namespace ddl {
namespace {

struct Plan {
  int n;
  size_t count, es;
  size_t piece;   // elements per block per round
  size_t stride;  // bytes between the blocks' pieces in a round buffer
  uint32_t rounds;

  // own_only: a member puts only its own block's piece in its buffers (allgather), which may then fill them.
  Plan(const ShmNode& node, size_t count_, size_t es_, bool own_only = false)
      : n(node.size()), count(count_), es(es_) {
    piece = std::max<size_t>(1, node.roundBytes() / (own_only ? 1 : n) / es);
    stride = own_only ? 0 : piece * es;
    const size_t largest = blockCount(count, n, 0);
    rounds = static_cast<uint32_t>((largest + piece - 1) / piece);
  }
  // Piece g of block b: elements [*off, *off + return value) of the message.
  size_t at(int b, uint32_t g, size_t* off) const {
    const size_t bc = blockCount(count, n, b), start = static_cast<size_t>(g) * piece;
    *off = blockBegin(count, n, b) + start;
    return start < bc ? std::min(piece, bc - start) : 0;
  }
  char* inSlot(const ShmNode& node, int member, uint32_t g, int b) const {
    return node.roundSlot(member, g) + static_cast<size_t>(b) * stride;
  }
};

// A message cut into whole rounds of one member's slot (one-shot allreduce, broadcast): round t carries
// elements [off(t), off(t) + len(t)).
struct WholeRounds {
  size_t count, per_round;
  uint32_t rounds;
  WholeRounds(const ShmNode& node, size_t count_, size_t es)
      : count(count_),
        per_round(std::max<size_t>(1, node.roundBytes() / es)),
        rounds(static_cast<uint32_t>((count_ + per_round - 1) / per_round)) {}
  size_t off(uint32_t t) const { return static_cast<size_t>(t) * per_round; }
  size_t len(uint32_t t) const { return std::min(per_round, count - off(t)); }
};

// Waits until every member has consumed round g's buffer's previous use (round g - buffers).
void waitBufferFree(Session& s, ShmNode& node, uint32_t g) {
  node.waitAll(s, ShmNode::kConsumed, g - node.buffers() + 1);
}

// dst = own piece (op) every other member's piece, in member order from this one (each piece has one reducer).
void reducePiece(const ShmNode& node, const Plan& p, const DataSpec& d, uint32_t g, char* dst, const char* own,
                 size_t len) {
  const int me = node.me();
  bool first = true;
  for (int k = 1; k < p.n; ++k) {
    const int m = (me + k) % p.n;
    reduce(dst, first ? own : dst, p.inSlot(node, m, g, me), len, d.type, d.op);
    first = false;
  }
  if (first && dst != own) std::memcpy(dst, own, len * p.es);
}

// Every piece but the member's own, which it reduces straight from its input.
void copyInOthers(ShmNode& node, const Plan& p, uint32_t g, uint32_t piece, const char* src) {
  for (int b = 0; b < p.n; ++b) {
    if (b == node.me()) continue;
    size_t off;
    const size_t len = p.at(b, piece, &off);
    if (len) std::memcpy(p.inSlot(node, node.me(), g, b), src + off * p.es, len * p.es);
  }
}

// Stage 1 of round g (piece t of every block): once the buffer is free, the others' pieces into this
// member's slot.
void copyInRound(Session& s, ShmNode& node, const Plan& p, uint32_t g, uint32_t t, const char* in) {
  waitBufferFree(s, node, g);
  copyInOthers(node, p, g, t, in);
  node.publish(ShmNode::kCopied, g + 1);
}

// Stage 2: once every member has copied round g in, reduces this member's piece t into its slot (out null:
// allreduce, for the others to copy out) or into out, which holds its block from element out_first on.
void reduceRound(Session& s, ShmNode& node, const Plan& p, const DataSpec& d, uint32_t g, uint32_t t,
                 const char* in, char* out, size_t out_first, int avg_divisor) {
  node.waitAll(s, ShmNode::kCopied, g + 1);
  const int me = node.me();
  size_t off;
  const size_t len = p.at(me, t, &off);
  if (len) {
    char* to = out ? out + (off - out_first) * p.es : p.inSlot(node, me, g, me);
    reducePiece(node, p, d, g, to, in + off * p.es, len);
    if (avg_divisor > 0) finishAvg(to, len, d.type, avg_divisor);
  }
  node.publish(ShmNode::kReduced, g + 1);
}

void copyOutAll(ShmNode& node, const Plan& p, uint32_t g, uint32_t piece, char* dst, bool skip_own) {
  for (int b = 0; b < p.n; ++b) {
    if (skip_own && b == node.me()) continue;
    size_t off;
    const size_t len = p.at(b, piece, &off);
    if (len) std::memcpy(dst + off * p.es, p.inSlot(node, b, g, b), len * p.es);
  }
}

}  // namespace

namespace {

// Small messages: one synchronisation instead of two. Every member copies its whole input (a round's worth at a
// time) into its slot and reduces the whole round itself, reading every slot in member order, so every member
// computes the same sums in the same order (bit-identical results) with no copy-out. It reads n times the
// message instead of once, which is cheap while that stays in cache, and needs every member to run only once
// per round: what counts when ranks share cores.
void shmAllReduceOneShot(Session& s, ShmNode& node, const DataSpec& d, const char* in, char* out, size_t count,
                         int avg_divisor) {
  const size_t es = d.elem;
  const WholeRounds r(node, count, es);
  const uint32_t K = r.rounds, g0 = node.round();
  const int n = node.size(), me = node.me();
  node.begin(s.fingerprint());
  for (uint32_t t = 0; t < K; ++t) {
    const uint32_t g = g0 + t;
    const size_t off = r.off(t), len = r.len(t);
    waitBufferFree(s, node, g);
    std::memcpy(node.roundSlot(me, g), in + off * es, len * es);
    node.publish(ShmNode::kCopied, g + 1);
    node.waitAll(s, ShmNode::kCopied, g + 1);
    char* to = out + off * es;
    reduce(to, node.roundSlot(0, g), node.roundSlot(1, g), len, d.type, d.op);
    for (int m = 2; m < n; ++m) reduce(to, to, node.roundSlot(m, g), len, d.type, d.op);
    if (avg_divisor > 0) finishAvg(to, len, d.type, avg_divisor);
    node.publish(ShmNode::kReduced, g + 1);
    node.publish(ShmNode::kConsumed, g + 1);
  }
  node.setRound(g0 + K);
}

}  // namespace

size_t shmOneShotBytes(int members) {
  // Measured with ddl-bench on 2 cores, 3 runs each (algbw GB/s, two stages against one shot): 3 and 4 ranks
  // 16 KiB 1.2 against 1.4-1.6, 64 KiB 2.6 against 2.2; 2 ranks 16 KiB 6.2 against 5.4.
  return members <= 2 ? 0 : size_t{16} << 10;
}

void shmAllReduce(Session& s, ShmNode& node, const DataSpec& d, const void* src, void* dst, size_t count,
                  int avg_divisor) {
  const char* in = static_cast<const char*>(src);
  if (count * d.elem <= shmOneShotBytes(node.size())) {
    return shmAllReduceOneShot(s, node, d, in, static_cast<char*>(dst), count, avg_divisor);
  }
  char* out = static_cast<char*>(dst);
  const Plan p(node, count, d.elem);
  const uint32_t g0 = node.round(), K = p.rounds;
  node.begin(s.fingerprint());
  for (uint32_t t = 0; t < K + 2; ++t) {
    if (t < K) copyInRound(s, node, p, g0 + t, t, in);
    if (t >= 1 && t - 1 < K) reduceRound(s, node, p, d, g0 + t - 1, t - 1, in, nullptr, 0, avg_divisor);
    if (t >= 2) {
      const uint32_t g = g0 + t - 2;
      node.waitAll(s, ShmNode::kReduced, g + 1);
      copyOutAll(node, p, g, t - 2, out, false);
      node.publish(ShmNode::kConsumed, g + 1);
    }
  }
  node.setRound(g0 + K);
}

void shmReduceScatter(Session& s, ShmNode& node, const DataSpec& d, const void* src, void* mine, size_t count,
                      int avg_divisor) {
  const char* in = static_cast<const char*>(src);
  char* out = static_cast<char*>(mine);
  const Plan p(node, count, d.elem);
  const uint32_t g0 = node.round(), K = p.rounds;
  const int me = node.me();
  const size_t my_begin = blockBegin(count, p.n, me);
  node.begin(s.fingerprint());
  for (uint32_t t = 0; t < K + 1; ++t) {
    if (t < K) copyInRound(s, node, p, g0 + t, t, in);
    if (t >= 1) {
      reduceRound(s, node, p, d, g0 + t - 1, t - 1, in, out, my_begin, avg_divisor);
      node.publish(ShmNode::kConsumed, g0 + t);  // nothing more to read of that round (shm_node.h)
    }
  }
  node.setRound(g0 + K);
}

void shmAllGather(Session& s, ShmNode& node, const DataSpec& d, void* buf, size_t count) {
  char* data = static_cast<char*>(buf);
  const Plan p(node, count, d.elem, true);
  const uint32_t g0 = node.round(), K = p.rounds;
  const int me = node.me();
  node.begin(s.fingerprint());
  for (uint32_t t = 0; t < K + 1; ++t) {
    if (t < K) {
      const uint32_t g = g0 + t;
      waitBufferFree(s, node, g);
      size_t off;
      const size_t len = p.at(me, t, &off);
      if (len) std::memcpy(p.inSlot(node, me, g, me), data + off * p.es, len * p.es);
      node.publish(ShmNode::kCopied, g + 1);
      node.publish(ShmNode::kReduced, g + 1);
    }
    if (t >= 1) {
      const uint32_t g = g0 + t - 1;
      node.waitAll(s, ShmNode::kCopied, g + 1);
      copyOutAll(node, p, g, t - 1, data, true);
      node.publish(ShmNode::kConsumed, g + 1);
    }
  }
  node.setRound(g0 + K);
}

void shmBroadcast(Session& s, ShmNode& node, const DataSpec& d, const void* src, void* dst, size_t count,
                  int root_member) {
  const size_t es = d.elem;
  const WholeRounds r(node, count, es);
  const uint32_t K = r.rounds, g0 = node.round();
  const bool root = node.me() == root_member;
  node.begin(s.fingerprint());
  // The root copies each round into its slot; the others copy it out. Every member moves every counter, so
  // they stay equal (shm_node.h); only the root's copy is waited for.
  for (uint32_t t = 0; t < K + 1; ++t) {
    if (t < K) {
      const uint32_t g = g0 + t;
      if (root) {
        waitBufferFree(s, node, g);
        std::memcpy(node.roundSlot(node.me(), g), static_cast<const char*>(src) + r.off(t) * es, r.len(t) * es);
      }
      node.publish(ShmNode::kCopied, g + 1);
      node.publish(ShmNode::kReduced, g + 1);
      if (root) node.publish(ShmNode::kConsumed, g + 1);
    }
    if (t >= 1 && !root) {
      const uint32_t g = g0 + t - 1;
      node.waitAll(s, ShmNode::kCopied, g + 1);
      std::memcpy(static_cast<char*>(dst) + r.off(t - 1) * es, node.roundSlot(root_member, g), r.len(t - 1) * es);
      node.publish(ShmNode::kConsumed, g + 1);
    }
  }
  node.setRound(g0 + K);
}

}  // namespace ddl
