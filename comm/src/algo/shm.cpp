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
#include "transport/shm_node.h"

namespace ddl {
namespace {

struct Plan {
  int n;
  size_t count, es;
  size_t piece;   // elements per block per round
  size_t stride;  // bytes between the blocks' pieces in a round buffer
  uint32_t rounds;

  // own_only: a member puts only its own block's piece in its buffers (allgather), which may then fill them.
  Plan(const ShmNode& node, const NodeMemory& mem, size_t count_, size_t es_, bool own_only = false)
      : n(node.size()), count(count_), es(es_) {
    piece = std::max<size_t>(1, mem.roundBytes() / (own_only ? 1 : n) / es);
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
  char* inSlot(const NodeMemory& mem, int member, uint32_t g, int b) const {
    return mem.roundSlot(member, g) + static_cast<size_t>(b) * stride;
  }
};

// A message cut into whole rounds of one member's slot (one-shot allreduce, broadcast): round t carries
// elements [off(t), off(t) + len(t)).
struct WholeRounds {
  size_t count, per_round;
  uint32_t rounds;
  WholeRounds(const NodeMemory& mem, size_t count_, size_t es)
      : count(count_),
        per_round(std::max<size_t>(1, mem.roundBytes() / es)),
        rounds(static_cast<uint32_t>((count_ + per_round - 1) / per_round)) {}
  size_t off(uint32_t t) const { return static_cast<size_t>(t) * per_round; }
  size_t len(uint32_t t) const { return std::min(per_round, count - off(t)); }
};

// The node's segment, moved and reduced by the CPU: what host buffers use.
class SegmentMemory final : public NodeMemory {
 public:
  explicit SegmentMemory(const ShmNode& node) : node_(node) {}
  size_t roundBytes() const override { return node_.roundBytes(); }
  char* roundSlot(int member, uint32_t g) const override { return node_.roundSlot(member, g); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void reduce(void* dst, const void* a, const void* b, size_t count, ddlDataType_t type,
              ddlRedOp_t op) override {
    ddl::reduce(dst, a, b, count, type, op);
  }
  void finishAvg(void* buf, size_t count, ddlDataType_t type, int divisor) override {
    ddl::finishAvg(buf, count, type, divisor);
  }
  void fence() override {}  // the CPU's stores are done; publish() orders them before the counter

 private:
  const ShmNode& node_;
};

// Publishes counter c = value once what this member wrote for it is complete (NodeMemory::fence).
void publish(ShmNode& node, NodeMemory& mem, ShmNode::Counter c, uint32_t value) {
  mem.fence();
  node.publish(c, value);
}

// Waits until every member has consumed round g's buffer's previous use (round g - buffers).
void waitBufferFree(Session& s, ShmNode& node, uint32_t g) {
  node.waitAll(s, ShmNode::kConsumed, g - node.buffers() + 1);
}

// dst = own piece (op) every other member's piece, in member order from this one (each piece has one reducer).
void reducePiece(const ShmNode& node, NodeMemory& mem, const Plan& p, const DataSpec& d, uint32_t g,
                 char* dst, const char* own, size_t len) {
  const int me = node.me();
  bool first = true;
  for (int k = 1; k < p.n; ++k) {
    const int m = (me + k) % p.n;
    mem.reduce(dst, first ? own : dst, p.inSlot(mem, m, g, me), len, d.type, d.op);
    first = false;
  }
  if (first && dst != own) mem.copy(dst, own, len * p.es);
}

// Every piece but the member's own, which it reduces straight from its input.
void copyInOthers(ShmNode& node, NodeMemory& mem, const Plan& p, uint32_t g, uint32_t piece,
                  const char* src) {
  for (int b = 0; b < p.n; ++b) {
    if (b == node.me()) continue;
    size_t off;
    const size_t len = p.at(b, piece, &off);
    if (len) mem.copy(p.inSlot(mem, node.me(), g, b), src + off * p.es, len * p.es);
  }
}

// Stage 1 of round g (piece t of every block): once the buffer is free, the others' pieces into this
// member's slot.
void copyInRound(Session& s, ShmNode& node, NodeMemory& mem, const Plan& p, uint32_t g, uint32_t t,
                 const char* in) {
  waitBufferFree(s, node, g);
  copyInOthers(node, mem, p, g, t, in);
  publish(node, mem, ShmNode::kCopied, g + 1);
}

// Stage 2: once every member has copied round g in, reduces this member's piece t into its slot (out null:
// allreduce, for the others to copy out) or into out, which holds its block from element out_first on.
void reduceRound(Session& s, ShmNode& node, NodeMemory& mem, const Plan& p, const DataSpec& d, uint32_t g,
                 uint32_t t, const char* in, char* out, size_t out_first, int avg_divisor) {
  node.waitAll(s, ShmNode::kCopied, g + 1);
  const int me = node.me();
  size_t off;
  const size_t len = p.at(me, t, &off);
  if (len) {
    char* to = out ? out + (off - out_first) * p.es : p.inSlot(mem, me, g, me);
    reducePiece(node, mem, p, d, g, to, in + off * p.es, len);
    if (avg_divisor > 0) mem.finishAvg(to, len, d.type, avg_divisor);
  }
  publish(node, mem, ShmNode::kReduced, g + 1);
}

void copyOutAll(ShmNode& node, NodeMemory& mem, const Plan& p, uint32_t g, uint32_t piece, char* dst,
                bool skip_own) {
  for (int b = 0; b < p.n; ++b) {
    if (skip_own && b == node.me()) continue;
    size_t off;
    const size_t len = p.at(b, piece, &off);
    if (len) mem.copy(dst + off * p.es, p.inSlot(mem, b, g, b), len * p.es);
  }
}

// Small messages: one synchronisation instead of two. Every member copies its whole input (a round's worth at a
// time) into its slot and reduces the whole round itself, reading every slot in member order, so every member
// computes the same sums in the same order (bit-identical results) with no copy-out. It reads n times the
// message instead of once, which is cheap while that stays in cache, and needs every member to run only once
// per round: what counts when ranks share cores.
void shmAllReduceOneShot(Session& s, ShmNode& node, NodeMemory& mem, const DataSpec& d, const char* in,
                         char* out, size_t count, int avg_divisor) {
  const size_t es = d.elem;
  const WholeRounds r(mem, count, es);
  const uint32_t K = r.rounds, g0 = node.round();
  const int n = node.size(), me = node.me();
  node.begin(s.fingerprint());
  for (uint32_t t = 0; t < K; ++t) {
    const uint32_t g = g0 + t;
    const size_t off = r.off(t), len = r.len(t);
    waitBufferFree(s, node, g);
    mem.copy(mem.roundSlot(me, g), in + off * es, len * es);
    publish(node, mem, ShmNode::kCopied, g + 1);
    node.waitAll(s, ShmNode::kCopied, g + 1);
    char* to = out + off * es;
    mem.reduce(to, mem.roundSlot(0, g), mem.roundSlot(1, g), len, d.type, d.op);
    for (int m = 2; m < n; ++m) mem.reduce(to, to, mem.roundSlot(m, g), len, d.type, d.op);
    if (avg_divisor > 0) mem.finishAvg(to, len, d.type, avg_divisor);
    publish(node, mem, ShmNode::kReduced, g + 1);
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
                  int avg_divisor, NodeMemory* memory) {
  SegmentMemory segment(node);
  NodeMemory& mem = memory ? *memory : segment;
  const char* in = static_cast<const char*>(src);
  if (count * d.elem <= shmOneShotBytes(node.size())) {
    return shmAllReduceOneShot(s, node, mem, d, in, static_cast<char*>(dst), count, avg_divisor);
  }
  char* out = static_cast<char*>(dst);
  const Plan p(node, mem, count, d.elem);
  const uint32_t g0 = node.round(), K = p.rounds;
  node.begin(s.fingerprint());
  for (uint32_t t = 0; t < K + 2; ++t) {
    if (t < K) copyInRound(s, node, mem, p, g0 + t, t, in);
    if (t >= 1 && t - 1 < K) reduceRound(s, node, mem, p, d, g0 + t - 1, t - 1, in, nullptr, 0, avg_divisor);
    if (t >= 2) {
      const uint32_t g = g0 + t - 2;
      node.waitAll(s, ShmNode::kReduced, g + 1);
      copyOutAll(node, mem, p, g, t - 2, out, false);
      publish(node, mem, ShmNode::kConsumed, g + 1);
    }
  }
  node.setRound(g0 + K);
}

void shmReduceScatter(Session& s, ShmNode& node, const DataSpec& d, const void* src, void* mine, size_t count,
                      int avg_divisor, NodeMemory* memory) {
  SegmentMemory segment(node);
  NodeMemory& mem = memory ? *memory : segment;
  const char* in = static_cast<const char*>(src);
  char* out = static_cast<char*>(mine);
  const Plan p(node, mem, count, d.elem);
  const uint32_t g0 = node.round(), K = p.rounds;
  const int me = node.me();
  const size_t my_begin = blockBegin(count, p.n, me);
  node.begin(s.fingerprint());
  for (uint32_t t = 0; t < K + 1; ++t) {
    if (t < K) copyInRound(s, node, mem, p, g0 + t, t, in);
    if (t >= 1) {
      reduceRound(s, node, mem, p, d, g0 + t - 1, t - 1, in, out, my_begin, avg_divisor);
      node.publish(ShmNode::kConsumed, g0 + t);  // nothing more to read of that round (shm_node.h)
    }
  }
  node.setRound(g0 + K);
}

void shmAllGather(Session& s, ShmNode& node, const DataSpec& d, void* buf, size_t count, NodeMemory* memory) {
  SegmentMemory segment(node);
  NodeMemory& mem = memory ? *memory : segment;
  char* data = static_cast<char*>(buf);
  const Plan p(node, mem, count, d.elem, true);
  const uint32_t g0 = node.round(), K = p.rounds;
  const int me = node.me();
  node.begin(s.fingerprint());
  for (uint32_t t = 0; t < K + 1; ++t) {
    if (t < K) {
      const uint32_t g = g0 + t;
      waitBufferFree(s, node, g);
      size_t off;
      const size_t len = p.at(me, t, &off);
      if (len) mem.copy(p.inSlot(mem, me, g, me), data + off * p.es, len * p.es);
      publish(node, mem, ShmNode::kCopied, g + 1);
      node.publish(ShmNode::kReduced, g + 1);
    }
    if (t >= 1) {
      const uint32_t g = g0 + t - 1;
      node.waitAll(s, ShmNode::kCopied, g + 1);
      copyOutAll(node, mem, p, g, t - 1, data, true);
      publish(node, mem, ShmNode::kConsumed, g + 1);
    }
  }
  node.setRound(g0 + K);
}

void shmBroadcast(Session& s, ShmNode& node, const DataSpec& d, const void* src, void* dst, size_t count,
                  int root_member, NodeMemory* memory) {
  SegmentMemory segment(node);
  NodeMemory& mem = memory ? *memory : segment;
  const size_t es = d.elem;
  const WholeRounds r(mem, count, es);
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
        mem.copy(mem.roundSlot(node.me(), g), static_cast<const char*>(src) + r.off(t) * es, r.len(t) * es);
      }
      publish(node, mem, ShmNode::kCopied, g + 1);
      node.publish(ShmNode::kReduced, g + 1);
      if (root) node.publish(ShmNode::kConsumed, g + 1);
    }
    if (t >= 1 && !root) {
      const uint32_t g = g0 + t - 1;
      node.waitAll(s, ShmNode::kCopied, g + 1);
      mem.copy(static_cast<char*>(dst) + r.off(t - 1) * es, mem.roundSlot(root_member, g), r.len(t - 1) * es);
      publish(node, mem, ShmNode::kConsumed, g + 1);
    }
  }
  node.setRound(g0 + K);
}

}  // namespace ddl
