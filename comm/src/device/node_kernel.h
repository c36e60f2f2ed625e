// The node kernel: one collective of the ranks of one node on their GPUs, with no host in the data path.
//
// Written once for two executors: the CUDA kernel (comm/cuda/node_kernels.cu, one CTA per block of the
// algorithm, its threads striding over the elements) and the host emulation the tests run on every machine
// (tests/unit/fake_device.h, the blocks one after the other on the rank's thread). The executor X gives the
// thread shape, the memory-model operations and the copies and reductions over element ranges; everything
// else (the layout, the chunking, the barriers, the order of reduction, the failure protocol) is here.
// Its memory operations: signal (a release of the thread's and, after sync, the block's writes, then a
// store), poll (an acquiring load), store (a plain store others may read at once), claim and unclaim (a
// word taken with an acquiring compare-and-swap from 0 to 1, given back with a releasing store of 0),
// claimDetail (a compare-and-swap from 0), setError (the same on the error word, where kMismatch also
// replaces kPeerFailed: the message names the calls), markFailed (a store, then a sequentially consistent
// fence) and failedAfterFences (a sequentially consistent fence, then a load).
//
// Memory. Each member of the node owns one region of device memory, exported once through CUDA IPC and
// mapped by every other member (device/stream_path.h sets this up):
//
//   [ flags ][ counters ][ calls ][ claims ] ... [ in slot 0 | in slot 1 | out slot 0 | out slot 1 ]
//
// flags[b][p] is written by member p's block b only (its epoch, see below), read by the region's owner.
// The counters (epochs and rounds of each block) are the owner's own. calls[b][e mod 2][p] is what member
// p's block b says of its call at its meeting of epoch e ({the call's signature (signatureOf), e, its send
// and recv buffers' references}), written before the flag; claims[b] marks block b of one of the owner's
// kernels running (see runBlock). Data moves through the slots: a member copies its input into its own in
// slot, the members meet, and each reads the others' slots directly (over NVLink or PCIe peer to peer, or the
// same HBM where ranks share a GPU).
//
// Barriers. Block b of every member meets block b of every other member, and no other. A communicator's
// kernels all run the same number of blocks (Args::blocks, at most kMaxBlocks: chosen once, at the setup,
// from the GPUs' resident CTAs and the ranks sharing each, and the same on every member). Each block owns a
// fixed share of the message (share b of blocks) and a fixed sub-slot of every slot (the b-th blocks-th of
// it), and moves its share through its sub-slot in chunks of its own: a block
// only ever reads what the same block of its peers wrote, in the same sub-slot, whatever the kind of
// collective or the length of its chunks. To meet, a block raises its epoch e (one more than at its last
// barrier) and writes it into every member's flags[b][me] with a system-scope release (after a CTA barrier,
// so that the whole block's writes are ordered before it), then waits until its own flags[b][p] >= e for
// every p with a system-scope acquire. Epochs only rise, and are kept in device memory between launches, so a
// kernel captured in a CUDA graph and replayed reads the epoch it needs from memory, not from its arguments.
//
// Slots alternate by round (a block's chunk count, also kept in memory): round r uses slot r mod 2. Block b
// of a member writes its sub-slot of slot k again at round r + 2 only after the first barrier of its round
// r + 1, which block b of every member reaches only after finishing its round r (a member's kernels run in
// order on one stream), so nothing still reads what is overwritten. No barrier is needed at the end of a
// collective.
//
// Order. Every reduction folds the members in member order (((x0 op x1) op x2) ...) on every member, so all
// members get the same bits, and the same bits as libddl's host path for the same fold.
//
// Failures. A wait is bounded by the timeout (the GPU's global timer) and polls the communicator's abort
// word and the rank's error word in pinned host memory. A block that fails writes kPoison into every member's
// flags of every block, and the failure code into the rank's error word (pinned host memory the host reads):
// the blocks of every member then fail at their next wait instead of running into the timeout. After a
// failure epochs disagree, so the communicator is broken for good (the host sees the error word).
//
// Misuse is a failure too, never silent corruption:
//  - calls that differ (another kind, count, type, op or root, or one rank a call ahead): at every meeting a
//    block compares each member's signature with its own; a difference fails with kMismatch, and the first
//    block to see one writes both signatures and the member into the rank's detail words for the message;
//  - two kernels of one rank running at once (a CUDA graph replayed on one stream while a call on another,
//    unordered, runs too): they would share the rank's counters and slots. Block b claims claims[b] before it
//    reads its counters and lets go after it writes them; a block that finds it claimed fails with
//    kConcurrent.
// kPoison (the kind) is the host's way to fail the node after this rank's own kernels: it writes kPoison into
// this rank's flags in every member's region, ordered on the rank's stream after its earlier kernels, which
// could otherwise raise a flag again over a poison written from elsewhere.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddl/ddl.h"

#if defined(__CUDACC__)
#define DDL_NODE_FN __device__ inline
#define DDL_NODE_HOST_FN __host__ __device__ inline  // also the host's (the launch's precomputations)
#define DDL_NODE_COLD \
  __device__ __noinline__  // out of line: the failure paths, and what needs registers of its own
#else
#define DDL_NODE_FN inline
#define DDL_NODE_HOST_FN inline
#define DDL_NODE_COLD inline
#endif

namespace ddl::node {

constexpr int kMaxRanks = 16;  // members of a node the kernel serves; more take the host-paced path
constexpr int kMaxBlocks = 64;  // blocks (CTAs) of a launch at most (Args::blocks)
constexpr int kMinBlocks = 8;   // fewer resident for each rank sharing a GPU: the node kernel does not serve
constexpr int kThreads = 512;  // threads of a CTA
constexpr uint64_t kPoison = ~uint64_t{0};
constexpr size_t kUnitBytes = 16;  // shares are cut in 16-byte units, so vectors stay aligned
// Registered buffers (ddlCommRegister): a table of kMaxRegistrations rows of kMaxRanks pointers in the rank's
// device memory, row k holding every member's buffer of the k-th registration as this rank maps it. A
// buffer's reference in a call: (k + 1) << kRefOffsetBits | its offset in the registration; 0: unregistered.
constexpr int kMaxRegistrations = 4096;
constexpr int kRefOffsetBits = 40;

enum class Kind : int {
  kAllReduceOneShot = 0,  // every member reduces the whole chunk from every slot: one barrier, n reads
  kAllReduceTwoShot = 1,  // each reduces its slice, pushes it to its out slot, all gather: two barriers
  kReduceScatter = 2,
  kAllGather = 3,
  kBroadcast = 4,
  kReduce = 5,
  kPoison = 6,  // no data: this rank's flags in every member's region become kPoison
};

// What the error word holds after a failure.
enum ErrorCode : uint32_t {
  kNoError = 0,
  kTimedOut = 1,
  kAborted = 2,
  kPeerFailed = 3,
  kMismatch = 4,    // a member's call differs from this rank's (the detail words say how)
  kConcurrent = 5,  // two kernels of this rank ran at once
};

// A call's signature: what every member's call must agree on. Bit 63 set (never 0, never kPoison);
// kind 4 bits at 54, root 5 at 49, op 4 at 45, type 5 at 40, count (elements) the low 40 bits.
// signatureOf packs them and Signature::of unpacks them (for the host's message): the layout is here only.
constexpr uint64_t kSignatureCountMask = (uint64_t{1} << 40) - 1;
constexpr int kSignatureKindShift = 54, kSignatureRootShift = 49, kSignatureOpShift = 45,
              kSignatureTypeShift = 40;
DDL_NODE_FN uint64_t signatureOf(Kind kind, size_t count, ddlDataType_t type, ddlRedOp_t op, int root) {
  return uint64_t{1} << 63 | static_cast<uint64_t>(kind) << kSignatureKindShift |
         static_cast<uint64_t>(root & 31) << kSignatureRootShift |
         static_cast<uint64_t>(op & 15) << kSignatureOpShift |
         static_cast<uint64_t>(type & 31) << kSignatureTypeShift |
         (static_cast<uint64_t>(count) & kSignatureCountMask);
}
struct Signature {
  Kind kind;
  int root;
  ddlRedOp_t op;
  ddlDataType_t type;
  uint64_t count;  // its low 40 bits
  static Signature of(uint64_t sig) {
    return {static_cast<Kind>(sig >> kSignatureKindShift & 15),
            static_cast<int>(sig >> kSignatureRootShift & 31),
            static_cast<ddlRedOp_t>(sig >> kSignatureOpShift & 15),
            static_cast<ddlDataType_t>(sig >> kSignatureTypeShift & 31), sig & kSignatureCountMask};
  }
};

// A member's region.
struct Layout {
  static constexpr size_t kFlagsBytes = size_t{kMaxBlocks} * kMaxRanks * sizeof(uint64_t);
  static constexpr size_t kCountersOffset = kFlagsBytes;  // epochs[kMaxBlocks], then rounds[kMaxBlocks]
  static constexpr size_t kCallWords = 4;                 // signature, epoch, send and recv references
  static constexpr size_t kCallsOffset = 16 * 1024;       // calls[kMaxBlocks][2][kMaxRanks][kCallWords]
  static constexpr size_t kClaimsOffset =
      kCallsOffset + size_t{kMaxBlocks} * 2 * kMaxRanks * kCallWords * sizeof(uint64_t);
  static constexpr size_t kFailedOffset = kClaimsOffset + kMaxBlocks * sizeof(uint32_t);  // one word
  static constexpr size_t kDataOffset = 128 * 1024;
  static_assert(kCountersOffset + 2 * kMaxBlocks * sizeof(uint64_t) <= kCallsOffset);
  static_assert(kFailedOffset + sizeof(uint32_t) <= kDataOffset);
  static constexpr size_t bytes(size_t slot_bytes) { return kDataOffset + 4 * slot_bytes; }
};

// The detail of a kMismatch, in pinned host memory beside the error word: written once, by the first block
// that sees one.
struct MismatchDetail {
  uint64_t member_plus_one;  // 0: not written (yet)
  uint64_t theirs;
  uint64_t mine;
};

struct Args {
  Kind kind;
  int nranks;  // members, at most kMaxRanks
  int rank;    // this member
  int blocks;  // blocks (CTAs) of every kernel of the communicator, at most kMaxBlocks
  int root;    // broadcast and reduce: the root member
  ddlDataType_t type;
  ddlRedOp_t op;
  int avg_divisor;  // > 0: the reduced values are divided by it (ddlAvg)
  size_t elem;      // bytes per element
  const void* send;
  void* recv;
  // Elements: the message (allreduce, broadcast, reduce), each rank's block (reduce-scatter: recvcount,
  // allgather: sendcount).
  size_t count;
  // Reduce-scatter and allgather: 0, or the elements of the whole message, where the blocks (member s's at
  // s * count) cut it unevenly: the blocks end at total, the last ones shorter or empty. The stream-ordered
  // allreduce across nodes cuts the message into the node's blocks this way (Comm::allReduceAcrossOnStream).
  size_t total;
  char* regions[kMaxRanks];        // every member's region as this member sees it
  size_t slot_bytes;               // a multiple of kUnitBytes * kMaxBlocks
  size_t sub_slot_bytes;           // a block's part of a slot: subSlotBytesOf(slot_bytes, blocks)
  size_t block_units;              // the 16-byte units of a block's share of count: blockUnitsOf
  const volatile uint32_t* abort;  // nonzero: stop (pinned host memory)
  uint32_t* error;                 // the first failure's ErrorCode (pinned host memory)
  MismatchDetail* detail;          // a kMismatch's detail (pinned host memory)
  uint64_t timeout_ns;             // a wait longer than this fails
  uint64_t signature;              // signatureOf this call (StreamPath::launch)
  // Allreduce: the registration table (null: none yet) and this rank's send and recv buffers' references in
  // it (0: unregistered). Every member says its references at the call's first meeting; where all members'
  // are set, the call reads and writes the members' buffers in place (zero-copy), else it takes the slots.
  char* const* regs;
  uint64_t send_ref;
  uint64_t recv_ref;
};

DDL_NODE_FN uint64_t* flagOf(char* region, int block, int from) {
  return reinterpret_cast<uint64_t*>(region) + static_cast<size_t>(block) * kMaxRanks + from;
}
DDL_NODE_FN uint64_t* countersOf(char* region) {
  return reinterpret_cast<uint64_t*>(region + Layout::kCountersOffset);
}
// What member from's block says of its call at its meeting of epoch e, in region: {signature, e, send and
// recv references}.
DDL_NODE_FN uint64_t* callOf(char* region, int block, uint64_t e, int from) {
  return reinterpret_cast<uint64_t*>(region + Layout::kCallsOffset) +
         ((static_cast<size_t>(block) * 2 + (e & 1)) * kMaxRanks + from) * Layout::kCallWords;
}
// ref where this rank's entry of its row is filled, else 0: a row reserved for a buffer of a captured graph
// is empty until ddlCommRegisterGraphBuffers fills it (this rank's entry last), and a call whose buffer's
// row is empty is staged.
DDL_NODE_FN uint64_t liveRef(const Args& a, uint64_t ref) {
  if (!ref || !a.regs) return 0;
  return a.regs[((ref >> kRefOffsetBits) - 1) * kMaxRanks + a.rank] ? ref : 0;
}
// The buffer a reference names, as this rank maps it (member's row of the table).
DDL_NODE_FN char* bufferOf(const Args& a, int member, uint64_t ref) {
  const uint64_t row = (ref >> kRefOffsetBits) - 1;
  return a.regs[row * kMaxRanks + member] + (ref & ((uint64_t{1} << kRefOffsetBits) - 1));
}
DDL_NODE_FN uint32_t* claimOf(char* region, int block) {
  return reinterpret_cast<uint32_t*>(region + Layout::kClaimsOffset) + block;
}
// Nonzero once a block of the owner has failed: its later blocks and kernels raise no flag again.
DDL_NODE_FN uint32_t* failedOf(char* region) {
  return reinterpret_cast<uint32_t*>(region + Layout::kFailedOffset);
}
// Block b's sub-slot of a member's in and out slots of a round.
// (Computed on the host, once: a 64-bit division by a run-time count costs the kernel registers it has not.)
inline size_t subSlotBytesOf(size_t slot_bytes, int blocks) {
  return slot_bytes / blocks / kUnitBytes * kUnitBytes;
}
DDL_NODE_FN size_t subSlotBytes(const Args& a) { return a.sub_slot_bytes; }
DDL_NODE_FN char* inSlot(const Args& a, int member, uint64_t round, int b) {
  return a.regions[member] + Layout::kDataOffset + (round & 1) * a.slot_bytes + b * subSlotBytes(a);
}
DDL_NODE_FN char* outSlot(const Args& a, int member, uint64_t round, int b) {
  return a.regions[member] + Layout::kDataOffset + (2 + (round & 1)) * a.slot_bytes + b * subSlotBytes(a);
}

// Elements per 16-byte unit.
DDL_NODE_HOST_FN size_t unitElems(size_t elem) { return elem >= kUnitBytes ? 1 : kUnitBytes / elem; }

// Share i of g of n elements, cut in whole units of u elements (the last shares may be empty).
DDL_NODE_FN void share(size_t n, int g, int i, size_t u, size_t* lo, size_t* hi) {
  const size_t units = (n + u - 1) / u;
  const size_t per = (units + g - 1) / g;
  const size_t a = per * u * static_cast<size_t>(i), b = a + per * u;
  *lo = a < n ? a : n;
  *hi = b < n ? b : n;
}

// Block b's share [*lo, *hi) of the count elements: share b of blocks (block_units, computed on the host
// once, as sub_slot_bytes is).
inline size_t blockUnitsOf(size_t count, size_t elem, int blocks) {
  const size_t u = unitElems(elem);
  return ((count + u - 1) / u + blocks - 1) / blocks;
}
DDL_NODE_FN void blockShare(const Args& a, int b, size_t* lo, size_t* hi) {
  const size_t per = a.block_units * unitElems(a.elem), at = per * static_cast<size_t>(b);
  *lo = at < a.count ? at : a.count;
  *hi = at + per < a.count ? at + per : a.count;
}

// The elements of a block's chunk: what fits its sub-slot (reduce-scatter: one chunk per member), in whole
// units. StreamPath keeps sub-slots large enough for a unit of any type from every member.
DDL_NODE_FN size_t chunkElems(const Args& a) {
  const size_t per =
      a.kind == Kind::kReduceScatter ? subSlotBytes(a) / static_cast<size_t>(a.nranks) : subSlotBytes(a);
  const size_t u = unitElems(a.elem);
  return per / a.elem / u * u;
}

// The elements of member s's block, from element c0 of it on, up to m, that lie inside the message (total).
DDL_NODE_FN size_t blockPart(const Args& a, int s, size_t c0, size_t m) {
  if (a.total == 0) return m;
  const size_t at = static_cast<size_t>(s) * a.count + c0;
  if (at >= a.total) return 0;
  return a.total - at < m ? a.total - at : m;
}

// The rank is failed for good: its failed word, then its error word, then kPoison in every flag it raises.
// A block of the rank that raised a flag concurrently reads the failed word after it (failedAfterFences,
// meet): either it sees the word and poisons its flags again, or its flag went up before this poison.
template <class X>
DDL_NODE_COLD void failAll(const Args& a, uint32_t code, X& x) {
  x.markFailed(failedOf(a.regions[a.rank]));
  x.setError(a.error, code);
  for (int p = 0; p < a.nranks; ++p)
    for (int b = 0; b < a.blocks; ++b) x.signal(flagOf(a.regions[p], b, a.rank), kPoison);
}

// Once member p's flag of block b reads v >= e (it met this block at e, or failed: kPoison): whether its
// call is this rank's. kMismatch where p said another call at e (also before a failure, which may be the
// mismatch it saw), noting the first for the host's message; kPeerFailed where p failed otherwise.
template <class X>
DDL_NODE_COLD uint32_t checkCall(const Args& a, int b, uint64_t e, int p, uint64_t v, X& x) {
  const uint64_t* call = callOf(a.regions[a.rank], b, e, p);
  // The epoch on both sides of the signature: a failed member's words may be from an earlier meeting.
  const uint64_t before = x.poll(call + 1), theirs = x.poll(call);
  if (before == e && x.poll(call + 1) == e && theirs != a.signature) {
    if (x.claimDetail(&a.detail->member_plus_one, static_cast<uint64_t>(p) + 1)) {
      a.detail->theirs = theirs;
      a.detail->mine = a.signature;
    }
    return kMismatch;
  }
  return v == kPoison ? kPeerFailed : kNoError;
}

template <class X>
DDL_NODE_COLD uint32_t failedMeanwhile(const Args& a, X& x) {
  return x.failedAfterFences(failedOf(a.regions[a.rank])) ? kPeerFailed : kNoError;
}

// Block b's meeting with block b of every member at epoch e. False (the block must stop) on a failure.
// A member's epoch may be e + 1 when this block reads it (it met everyone at e, and went on), never more, so
// its call of epoch e is still in calls[b][e mod 2].
template <class X>
DDL_NODE_FN bool meet(const Args& a, int b, uint64_t e, X& x) {
  for (int p = x.tid(); p < a.nranks; p += x.nthreads()) {
    uint64_t* call = callOf(a.regions[p], b, e, a.rank);
    x.store(call, a.signature);
    x.store(call + 1, e);
    x.store(call + 2, liveRef(a, a.send_ref));
    x.store(call + 3, liveRef(a, a.recv_ref));
  }
  x.sync();  // the block's writes before any of its flags goes up
  for (int p = x.tid(); p < a.nranks; p += x.nthreads()) x.signal(flagOf(a.regions[p], b, a.rank), e);
  uint32_t code = kNoError;
  for (int p = x.tid(); p < a.nranks && code == kNoError; p += x.nthreads()) {
    const uint64_t* f = flagOf(a.regions[a.rank], b, p);
    const uint64_t start = x.nowNs();
    for (uint32_t spins = 0;; ++spins) {
      const uint64_t v = x.poll(f);
      if (v >= e) {  // met, or the member failed (kPoison)
        code = checkCall(a, b, e, p, v, x);
        break;
      }
      if ((spins & 1023) == 1023) {
        if (*a.abort) {
          code = kAborted;
          break;
        }
        if (*static_cast<const volatile uint32_t*>(a.error) !=
            kNoError) {  // another block of this rank failed
          code = kPeerFailed;
          break;
        }
        if (x.nowNs() - start > a.timeout_ns) {
          code = kTimedOut;
          break;
        }
        x.pause();
      }
    }
  }
  // A block of this rank that failed meanwhile may have poisoned the flags before this block raised its own.
  x.sync();  // every thread's flags up before thread 0's fence
  if (code == kNoError && x.tid() == 0) code = failedMeanwhile(a, x);
  if (code != kNoError) failAll(a, code, x);
  return !x.any(code != kNoError);
}

// Thread 0's checks before block b starts: kPeerFailed where the rank has failed (it raises no flag again:
// a peer would take it for a meeting), kConcurrent where another kernel of this rank holds block b's counters
// and slots (claims[b]); else claims[b] is this block's.
template <class X>
DDL_NODE_COLD uint32_t startCode(const Args& a, int b, X& x) {
  if (x.failedAfterFences(failedOf(a.regions[a.rank]))) return kPeerFailed;
  return x.claim(claimOf(a.regions[a.rank], b)) ? kNoError : kConcurrent;
}
// False (the block must stop, having failed the rank) where startCode says so.
template <class X>
DDL_NODE_FN bool startBlock(const Args& a, int b, X& x) {
  const uint32_t code = x.tid() == 0 ? startCode(a, b, x) : kNoError;
  if (!x.any(code != kNoError)) return true;
  if (x.tid() == 0) failAll(a, code, x);
  return false;
}

// After a meeting at epoch e: how many members said both their buffers are registered.
template <class X>
DDL_NODE_FN int registeredMembers(const Args& a, int b, uint64_t e, X& x) {
  int k = 0;
  for (int p = 0; p < a.nranks; ++p) {
    const uint64_t* call = callOf(a.regions[a.rank], b, e, p);
    k += x.poll(call + 2) != 0 && x.poll(call + 3) != 0;
  }
  return k;
}

// The staged allreduce's meeting after its copy-in. At the share's first chunk, where some member's buffers
// are registered but not every member's (so the call is staged), the members meet once more: the registered
// ones met once before copying in (runBlock), to learn whether all were registered.
template <class X>
DDL_NODE_FN bool stagedMeet(const Args& a, int b, uint64_t* epoch, bool first_chunk, bool met_before, X& x) {
  if (!meet(a, b, ++*epoch, x)) return false;
  // Not only where this rank has registrations: the members' words decide, so that they never disagree.
  if (!first_chunk || met_before || registeredMembers(a, b, *epoch, x) == 0) return true;
  return meet(a, b, ++*epoch, x);
}

// An allreduce whose every member's buffers are registered, its members having met at epoch e: block b's
// share [first, last) of the message, read and written in place. One-shot (where no member is in place):
// each member reduces every member's input into its own output. Two-shot: member s reduces slice s of the
// share from every member's input and writes the result into every member's output; in place too, since
// slice s of any member is read and written by member s only. The caller meets the members once more after.
template <class X>
DDL_NODE_COLD void zeroCopy(const Args& a, int b, uint64_t e, size_t first, size_t last, X& x) {
  const int n = a.nranks;
  const size_t es = a.elem, u = unitElems(es);
  const char* srcs[kMaxRanks];
  char* dsts[kMaxRanks];
  bool in_place = false;
  for (int p = 0; p < n; ++p) {
    const uint64_t* call = callOf(a.regions[a.rank], b, e, p);
    const uint64_t send_ref = x.poll(call + 2), recv_ref = x.poll(call + 3);
    srcs[p] = bufferOf(a, p, send_ref);
    dsts[p] = bufferOf(a, p, recv_ref);
    in_place = in_place || send_ref == recv_ref;
  }
  size_t lo = 0, hi = last - first;
  if (a.kind == Kind::kAllReduceTwoShot || in_place) share(last - first, n, a.rank, u, &lo, &hi);
  const size_t at = (first + lo) * es;
  for (int p = 0; p < n; ++p) {
    srcs[p] += at;
    dsts[p] += at;
  }
  if (a.kind == Kind::kAllReduceTwoShot || in_place) {
    x.reduceMany(dsts, n, srcs, n, hi - lo, a.avg_divisor);
  } else {
    x.reduceMany(dsts + a.rank, 1, srcs, n, hi - lo, a.avg_divisor);
  }
}

// One block's part of the collective a describes.
template <class X>
DDL_NODE_FN void runBlock(const Args& a, int b, X& x) {
  if (a.kind == Kind::kPoison) {  // the rank failed on the host: its later kernels raise no flag either
    if (x.tid() == 0) x.markFailed(failedOf(a.regions[a.rank]));
    x.sync();
    for (int p = x.tid(); p < a.nranks; p += x.nthreads()) x.signal(flagOf(a.regions[p], b, a.rank), kPoison);
    return;
  }
  if (!startBlock(a, b, x)) return;
  uint32_t* claim = claimOf(a.regions[a.rank], b);
  uint64_t* counters = countersOf(a.regions[a.rank]);
  uint64_t epoch = counters[b];
  uint64_t round = counters[kMaxBlocks + b];
  const size_t es = a.elem, u = unitElems(es), chunk = chunkElems(a);
  const int n = a.nranks, me = a.rank;
  const char* send = static_cast<const char*>(a.send);
  char* recv = static_cast<char*>(a.recv);
  const char* srcs[kMaxRanks];
  // This block's share of the message (of each member's block, for reduce-scatter and allgather).
  size_t first, last;
  blockShare(a, b, &first, &last);
  bool ok = chunk > 0;
  // An allreduce whose buffers are registered here meets first, without copying in: where every member's
  // are, the call is zero-copy; else it goes on staged (stagedMeet).
  const bool registered = liveRef(a, a.send_ref) && liveRef(a, a.recv_ref) && first < last &&
                          (a.kind == Kind::kAllReduceOneShot || a.kind == Kind::kAllReduceTwoShot);
  if (registered && (ok = meet(a, b, ++epoch, x)) && registeredMembers(a, b, epoch, x) == n) {
    zeroCopy(a, b, epoch, first, last, x);
    ok = meet(a, b, ++epoch, x);
    first = last;  // done
  }
  for (size_t c0 = first; ok && c0 < last; c0 += chunk, ++round) {
    const size_t m = last - c0 < chunk ? last - c0 : chunk;
    char* const mine = inSlot(a, me, round, b);
    switch (a.kind) {
      case Kind::kAllReduceOneShot:
      case Kind::kReduce: {
        x.copy(mine, send + c0 * es, m);
        if (!(ok = stagedMeet(a, b, &epoch, c0 == first, registered, x))) break;
        if (a.kind == Kind::kReduce && me != a.root) break;
        for (int p = 0; p < n; ++p) srcs[p] = inSlot(a, p, round, b);
        x.reduce(recv + c0 * es, nullptr, srcs, n, m, a.avg_divisor);
        break;
      }
      case Kind::kAllReduceTwoShot: {
        // Slice s of the chunk is member s's to reduce.
        x.copy(mine, send + c0 * es, m);
        if (!(ok = stagedMeet(a, b, &epoch, c0 == first, registered, x))) break;
        size_t lo, hi;
        share(m, n, me, u, &lo, &hi);
        for (int p = 0; p < n; ++p) srcs[p] = inSlot(a, p, round, b) + lo * es;
        x.reduce(outSlot(a, me, round, b) + lo * es, recv + (c0 + lo) * es, srcs, n, hi - lo, a.avg_divisor);
        if (!(ok = meet(a, b, ++epoch, x))) break;
        for (int s = 0; s < n; ++s) {
          if (s == me) continue;
          share(m, n, s, u, &lo, &hi);
          x.copy(recv + (c0 + lo) * es, outSlot(a, s, round, b) + lo * es, hi - lo);
        }
        break;
      }
      case Kind::kReduceScatter: {
        // The sub-slot holds this chunk of every member's block, block s at s * chunk.
        for (int s = 0; s < n; ++s)
          x.copy(mine + s * chunk * es, send + (s * a.count + c0) * es, blockPart(a, s, c0, m));
        if (!(ok = meet(a, b, ++epoch, x))) break;
        for (int p = 0; p < n; ++p) srcs[p] = inSlot(a, p, round, b) + me * chunk * es;
        x.reduce(recv + c0 * es, nullptr, srcs, n, blockPart(a, me, c0, m), a.avg_divisor);
        break;
      }
      case Kind::kAllGather: {
        x.copy(mine, send + c0 * es, blockPart(a, me, c0, m));
        if (!(ok = meet(a, b, ++epoch, x))) break;
        for (int s = 0; s < n; ++s) {
          char* dst = recv + (s * a.count + c0) * es;
          if (s != me) {
            x.copy(dst, inSlot(a, s, round, b), blockPart(a, s, c0, m));
          } else if (dst != send + c0 * es) {
            x.copy(dst, send + c0 * es, blockPart(a, s, c0, m));
          }
        }
        break;
      }
      case Kind::kBroadcast: {
        if (me == a.root) x.copy(mine, send + c0 * es, m);
        if (!(ok = meet(a, b, ++epoch, x))) break;
        if (me != a.root) {
          x.copy(recv + c0 * es, inSlot(a, a.root, round, b), m);
        } else if (recv != send) {
          x.copy(recv + c0 * es, send + c0 * es, m);
        }
        break;
      }
      case Kind::kPoison:  // handled above
        break;
    }
  }
  x.sync();  // every thread has read the counters before they move on
  if (x.tid() == 0) {
    if (ok) {
      counters[b] = epoch;
      counters[kMaxBlocks + b] = round;
    }
    x.unclaim(claim);  // after the counters: the next kernel to claim block b reads them
  }
}

}  // namespace ddl::node
