// Channel and Session: how collective algorithms talk, wait and fail.
//
// A Channel is a communicator's transport plus the state every wait consults: the abort flag, errors that
// peers reported, the collective sequence number, the scratch buffer. A Session is one collective call: it
// stamps every message with a tag that names the collective (sequence number), a signature of its arguments
// (kind, type, op, count, root), the sender, and a unit (the step and segment within the algorithm), and it
// waits for requests under a deadline.
//
// No hangs: every wait ends in completion, the deadline (ddlTimeout), ddlCommAbort (ddlAborted), a dead or
// aborting peer (ddlRemoteError), or a message whose signature or length differs from what this rank expects
// (ddlInvalidArgument: the ranks called different collectives). When a rank fails a collective it sends a
// short control message to the peers it is connected to and its ring neighbours, and each rank that fails on
// such a report passes it on, so the others stop within a few hops instead of waiting for their deadline.
//
// Tag layout (64 bits): [63] control | [62] p2p | [61:47] sequence | [46:39] signature | [38:24] sender |
// [23:0] unit. Receives match the control and p2p bits, sequence, sender and unit; the signature is checked
// after the message arrives. Collectives carry p2p = 0 and the communicator's collective sequence number;
// point-to-point messages (p2p.h) p2p = 1 and a sequence number of their own per pair of ranks (tagged ones the
// user's tag, kUserTag below, instead), so the two never match each other's receives whatever order they are
// called in.
//
// What these need of the floors around them comes through small interfaces: a Session is the WaitContext of
// the waits on the node's shared memory (transport/wait_context.h), and the communicator's point-to-point
// operations, which Sessions move on between their rounds, are a P2PProgress (below; PointToPoint, p2p.h).
//
// Threads: a Channel and its Sessions are used by one thread at a time (the communicator serialises its
// callers); `aborted` may be set from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ddl/ddl.h"
#include "deadline.h"
#include "transport/transport.h"
#include "transport/wait_context.h"

namespace ddl {

namespace tag {
constexpr uint64_t kControl = 1ULL << 63;
constexpr uint64_t kP2P = 1ULL << 62;
constexpr int kSeqShift = 47, kSigShift = 39, kSrcShift = 24;
constexpr uint64_t kSeqValues = 0x7FFF;  // sequence numbers wrap at 2^15
constexpr uint64_t kSeqMask = kSeqValues << kSeqShift;
constexpr uint64_t kSigMask = 0xFFULL << kSigShift;
constexpr uint64_t kSrcMask = 0x7FFFULL << kSrcShift;
constexpr uint64_t kUnitMask = 0xFFFFFFULL;
constexpr int kMaxRanks = 1 << 15;
// A unit is [23:18] the phase of the algorithm, [17:0] the message within the phase. Phases are numbered the
// same on every rank whatever its share of the data, so tags agree even where some ranks move nothing.
constexpr int kPhaseShift = 18;
constexpr uint32_t kMaxPhases = 1U << 6;
constexpr uint32_t kMaxUnits = 1U << kPhaseShift;  // per phase
// What a receive matches on: everything but the signature.
constexpr uint64_t kMatchMask = kControl | kP2P | kSeqMask | kSrcMask | kUnitMask;
// A tagged point-to-point message (p2p.h): this unit bit set, the user's 32-bit tag in the unit's other 23 bits
// and the low 9 bits of the sequence field.
constexpr uint64_t kUserTag = 1ULL << 23;
inline uint64_t userTagBits(uint32_t user_tag) {
  return kUserTag | (user_tag & 0x7FFFFFULL) | (static_cast<uint64_t>(user_tag >> 23) << kSeqShift);
}
}  // namespace tag

enum class CollKind : uint8_t {
  kAllReduce = 1,
  kBroadcast,
  kAllGather,
  kReduceScatter,
  kBarrier,
  kReduce,
  kGather,
  kScatter,
  kAllToAll,
  kAllToAllv,
  kSendRecv,  // point-to-point (p2p.h), for signatures and messages
};
const char* collName(CollKind k);
// Whether the collective has a root (broadcast, reduce, gather, scatter) or a reduction op, for messages.
bool collHasRoot(CollKind k);
bool collHasOp(CollKind k);

// 8 bits that differ, with probability 255/256, between calls that differ in any argument; part of every tag.
uint64_t signature(CollKind kind, ddlDataType_t type, ddlRedOp_t op, size_t count, int root, int variant);

// What a Session moves on between its own rounds besides its collective: the communicator's point-to-point
// operations. PointToPoint (p2p.h, a floor up) is the one implementation; the communicator sets Channel::p2p.
class P2PProgress {
 public:
  // Operations are waiting to be posted or to finish. Any thread; one relaxed load.
  bool active() const { return active_.load(std::memory_order_relaxed); }
  // Posts what was submitted, completes what finished, fails what is late, aborted or talks to a failed
  // peer. Returns true when any operation made progress. Only the thread that holds the transport.
  virtual bool poll() = 0;

 protected:
  ~P2PProgress() = default;
  std::atomic<bool> active_{false};
};

class Channel {
 public:
  Channel(std::unique_ptr<Transport> transport, int timeout_ms, ddlWaitMode_t wait = ddlWaitAuto);
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  Transport& transport() { return *transport_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int timeoutMs() const { return timeout_ms_; }
  // What a timeout message tells the user to change: where the timeout came from (see Options).
  const std::string& timeoutHint() const { return timeout_hint_; }
  void setTimeoutHint(std::string hint) { timeout_hint_ = std::move(hint); }
  // "rank 3 (host-b)"
  std::string peerName(int rank) const;

  uint16_t nextSeq() { return static_cast<uint16_t>(seq_++ & tag::kSeqValues); }

  // More ranks on this host than CPUs this process may run on: waits then yield the CPU at once instead of
  // spinning, so that the ranks with work get it.
  bool oversubscribed() const { return oversubscribed_; }
  // What a wait does after `idle` rounds of progress in a row found nothing: spin on, yield or sleep, as the
  // wait mode and oversubscription say (ddlWaitMode_t). Every wait of the channel goes through it.
  void idle(int idle_rounds);

  // Set by ddlCommAbort from any thread.
  std::atomic<bool> aborted{false};

  // Checks the control receive: when a peer has reported a failure, returns its message (sticky). Inline:
  // every round of a wait asks.
  const std::string& remoteError() {
    return control_recv_.done.load(std::memory_order_acquire) ? readControl() : remote_error_;
  }

  // Best effort, bounded, once: tells the live peers this rank is connected to, and its ring neighbours, that
  // this rank failed, with why; or passes on, unchanged, the report of a peer that made it fail. Each rank
  // passing it on, the report reaches every rank.
  void notifyPeers(const std::string& why);

  // Scratch buffer number slot (0: algorithm staging, 1: whole-message workspace) of at least bytes,
  // reused between collectives.
  char* scratch(int slot, size_t bytes);

  // Requests for Sessions, reused from one collective to the next so that a message costs no allocation.
  // A Session takes requests from requestMark() on and gives them back (releaseRequests(mark)) once all are
  // done; those a failed Session could not finish in time stay taken, alive, until the Channel goes.
  Request* newRequest();
  size_t requestMark() const { return req_used_; }
  Request& request(size_t i) { return req_pool_[i]; }
  void releaseRequests(size_t mark) { req_used_ = mark; }
  // One Session at a time per Channel (the communicator serialises collectives): the pool depends on it.
  bool session_active = false;

  // Point-to-point operations waiting beside the collectives, which Sessions drive between their own rounds.
  // Set by the communicator.
  P2PProgress* p2p = nullptr;
  // Keeps p alive until the transport is gone: for requests the transport may still complete after their
  // owner gave up on them.
  void keepUntilTransportGoes(std::shared_ptr<void> p) { kept_.push_back(std::move(p)); }

 private:
  void postControlRecv();
  const std::string& readControl();

  std::unique_ptr<Transport> transport_;
  int rank_, size_, timeout_ms_;
  bool oversubscribed_ = false;
  ddlWaitMode_t wait_;
  std::string timeout_hint_ = "set DDL_TIMEOUT_MS to wait longer";
  uint16_t seq_ = 0;
  Request control_recv_;
  char control_buf_[1024];
  std::string remote_error_;
  bool notified_ = false;
  std::deque<std::unique_ptr<Request>> control_sends_;
  std::string control_msg_;
  std::deque<Request> req_pool_;  // a deque: requests never move while the transport holds them
  size_t req_used_ = 0;
  std::vector<char> scratch_[2];
  std::vector<std::shared_ptr<void>> kept_;  // destroyed after the transport (see ~Channel)
};

// The WaitContext of waits outside the transport (the node's shared memory).
class Session final : public WaitContext {
 public:
  // Starts a collective: takes the next sequence number. The timeout counts from the collective's first wait
  // that finds nothing to do (no clock read for collectives that never wait).
  // variant: anything else that must agree across ranks (the algorithm). timeout_ms < 0: the channel's.
  Session(Channel& ch, CollKind kind, ddlDataType_t type, ddlRedOp_t op, size_t count, int root, int variant = 0,
          int timeout_ms = -1);
  // Cancels what is still posted (after an error), so no transfer touches user memory after return.
  ~Session();

  Channel& channel() { return ch_; }
  int rank() const { return ch_.rank(); }
  // Seconds spent per topology dim, filled by algorithms that work dim by dim (mdring), for telemetry.
  std::vector<double> dim_seconds;
  int size() const { return ch_.size(); }

  // Starts the next phase of the algorithm: returns the first of its tag::kMaxUnits unit numbers. Every rank
  // must start the same phases in the same order, whether or not it has data to move in them.
  uint32_t phase();

  Request* send(int peer, uint32_t unit, const void* buf, size_t bytes);
  Request* recv(int peer, uint32_t unit, void* buf, size_t bytes);

  // True when r finished; throws when it failed or the message does not match this collective.
  bool test(Request* r);
  void wait(Request* r);
  void waitAll();

  // One round of progress plus the checks (abort, deadline, peer reports). Spins, then yields when idle.
  void progress();
  // For waits outside the transport (shared memory): one round of transport progress and the checks, without
  // idling; the deadline starts at the first call. waiting_for names the awaited rank in a timeout's message.
  void poll(int waiting_for) override;
  std::string peerName(int rank) const override { return ch_.peerName(rank); }
  // 64 bits that differ between collectives with different arguments or sequence numbers (the tag's
  // signature is only 8 bits of it).
  uint64_t fingerprint() const { return fingerprint_; }
  // "allreduce #12 (float32 sum, count 1024)", for messages.
  std::string describe() const override;

 private:
  void progress(Request* waiting_for);
  void check(Request* r);
  void probeMismatch(int peer);
  [[noreturn]] void failRequest(Request* r);
  void checkDeadline(int waiting_for);

  Channel& ch_;
  Transport& t_;
  CollKind kind_;
  ddlDataType_t type_;
  ddlRedOp_t op_;
  size_t count_;
  int root_;
  uint64_t seq_bits_, sig_bits_, src_bits_;
  uint64_t fingerprint_;
  uint32_t next_phase_ = 0;
  int timeout_ms_;
  std::optional<Deadline> deadline_;  // started by the first idle check
  size_t first_req_;                  // this collective's requests: ch_.request(first_req_ ..)
  int idle_ = 0;
  uint32_t rounds_ = 0;  // progress rounds, for checks that must run even while the transport is busy
};

}  // namespace ddl
