// Channel and Session (session.h): tags and signatures, waits under a deadline, the failure reports ranks send
// each other, and the request pool a collective draws from.
#include "session.h"

#include <sched.h>

#include <cstring>

#include "dtype.h"
#include "error.h"

namespace ddl {

const char* collName(CollKind k) {
  switch (k) {
    case CollKind::kAllReduce: return "allreduce";
    case CollKind::kBroadcast: return "broadcast";
    case CollKind::kAllGather: return "allgather";
    case CollKind::kReduceScatter: return "reducescatter";
    case CollKind::kBarrier: return "barrier";
    case CollKind::kReduce: return "reduce";
    case CollKind::kGather: return "gather";
    case CollKind::kScatter: return "scatter";
    case CollKind::kAllToAll: return "alltoall";
    case CollKind::kAllToAllv: return "alltoallv";
    case CollKind::kSendRecv: return "send/recv";
  }
  return "collective";
}

bool collHasRoot(CollKind k) {
  return k == CollKind::kBroadcast || k == CollKind::kReduce || k == CollKind::kGather || k == CollKind::kScatter;
}

bool collHasOp(CollKind k) {
  return k == CollKind::kAllReduce || k == CollKind::kReduceScatter || k == CollKind::kReduce;
}

namespace {
// How long cleanup paths (cancelling, telling peers) may progress before giving up.
constexpr int64_t kCleanupMs = 500;
// Idle progress rounds of a wait before it yields the CPU (when every local rank has a CPU of its own), and
// before it starts sleeping 50 us at a time (a long wait, e.g. for a slow peer: stop burning a core).
constexpr int kSpinRounds = 20000;
constexpr int kSleepRounds = 200000;
constexpr int kSleepRoundsOversubscribed = 4096;
// Rounds of progress between a collective's checks (peers, deadline) even while the transport is busy: point-
// to-point traffic beside it keeps the transport busy without moving the collective on.
constexpr uint32_t kCheckRounds = 4096;
// ddlWaitShare: a few tens of microseconds of polling (a peer's next segment usually comes sooner), then
// blocking in the transport until something arrives (UCX's event fd; at most kShareBlockUs, so that deadlines
// and aborts are still seen), so that the caller's other threads (a training step's backward pass) keep the
// core and the wait still ends within a wakeup's time of the data.
constexpr int kShareSpinRounds = 256;
constexpr int kShareBlockUs = 1000;
constexpr int kSleepUs = 50;
}  // namespace

Channel::Channel(std::unique_ptr<Transport> transport, int timeout_ms, ddlWaitMode_t wait)
    : transport_(std::move(transport)),
      rank_(transport_->rank()),
      size_(transport_->size()),
      timeout_ms_(timeout_ms),
      wait_(wait) {
  int local = 0;
  const std::string me = transport_->hostOf(rank_);
  for (int r = 0; r < size_; ++r) local += transport_->hostOf(r) == me;
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int ncpu = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  oversubscribed_ = local > ncpu;
  postControlRecv();
}

Channel::~Channel() {
  std::vector<Request*> pending;
  if (!control_recv_.done) {
    transport_->cancel(control_recv_);
    pending.push_back(&control_recv_);
  }
  for (auto& r : control_sends_) pending.push_back(r.get());
  for (size_t i = 0; i < req_used_; ++i) pending.push_back(&req_pool_[i]);  // those failed Sessions left
  Deadline d(kCleanupMs);
  auto all_done = [&] {
    for (Request* r : pending)
      if (!r->done) return false;
    return true;
  };
  while (!all_done() && !d.expired()) {
    if (!transport_->progress()) transport_->idleWait(0);
  }
  // The transport goes first, while the requests it may still complete are alive.
  transport_.reset();
}

void Channel::idle(int idle_rounds) {
  if (oversubscribed_ && wait_ != ddlWaitSpin) {
    // Ranks take turns on the cores: give the core up at once. (Blocking waits would need a wakeup per
    // message, measured 7x slower than yielding with 4 ranks on 2 cores.)
    transport_->idleWait(idle_rounds > kSleepRoundsOversubscribed ? kSleepUs : 0);
  } else if (wait_ == ddlWaitShare) {
    if (idle_rounds > kShareSpinRounds) transport_->idleWait(kShareBlockUs);
  } else if (idle_rounds > kSpinRounds) {
    transport_->idleWait(idle_rounds > kSleepRounds ? kSleepUs : 0);
  }
}

void Channel::postControlRecv() {
  control_recv_.reset();
  transport_->recv(control_recv_, -1, tag::kControl, tag::kControl, control_buf_, sizeof(control_buf_));
}

std::string Channel::peerName(int rank) const {
  return "rank " + std::to_string(rank) + " (" + transport_->hostOf(rank) + ")";
}

const std::string& Channel::readControl() {
  if (control_recv_.ok && remote_error_.empty()) {
    remote_error_.assign(control_buf_, std::min(control_recv_.length, sizeof(control_buf_)));
    // Once broken, the channel stays broken: no need to keep listening.
    return remote_error_;
  }
  if (remote_error_.empty()) postControlRecv();
  return remote_error_;
}

void Channel::notifyPeers(const std::string& why) {
  if (notified_) return;
  notified_ = true;
  // A rank failing because a peer reported a failure passes that report on unchanged: the origin stays at
  // the front of the message however many ranks it crosses.
  control_msg_ = remote_error_.empty() ? peerName(rank_) + " failed: " + why : remote_error_;
  if (control_msg_.size() > sizeof(control_buf_)) control_msg_.resize(sizeof(control_buf_));
  uint64_t t = tag::kControl | (static_cast<uint64_t>(rank_) << tag::kSrcShift);
  // Only the peers this rank is connected to, its two ring neighbours and its hypercube partners (rank ^ 2^k):
  // telling all p would connect to all p (the transport connects lazily). Each rank that learns of the failure
  // fails and tells its own, once, so the report floods the graph of connections: every rank hears of it
  // within about log2(p) hops of ranks that are in a collective (a rank in user code passes it on at its next
  // one; the many paths of the hypercube go around it), and a rank waiting for a dead peer notices on its own
  // (its endpoint's error).
  const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
  auto partner = [this](int p) {
    const int d = p ^ rank_;
    return d != 0 && (d & (d - 1)) == 0;  // differs from this rank in one bit
  };
  for (int p = 0; p < size_; ++p) {
    if (p == rank_ || !transport_->peerError(p).empty()) continue;
    if (p != next && p != prev && !partner(p) && !transport_->connected(p)) continue;
    control_sends_.push_back(std::make_unique<Request>());
    transport_->send(*control_sends_.back(), p, t, control_msg_.data(), control_msg_.size());
  }
  Deadline d(kCleanupMs);
  auto all_done = [&] {
    for (auto& r : control_sends_)
      if (!r->done) return false;
    return true;
  };
  while (!all_done() && !d.expired()) {
    if (!transport_->progress()) transport_->idleWait(0);
  }
}

Request* Channel::newRequest() {
  if (req_used_ == req_pool_.size()) req_pool_.emplace_back();
  Request* r = &req_pool_[req_used_++];
  r->reset();
  return r;
}

char* Channel::scratch(int slot, size_t bytes) {
  DDL_ASSERT(slot == 0 || slot == 1);
  std::vector<char>& v = scratch_[slot];
  if (v.size() < bytes) {
    v.clear();
    v.shrink_to_fit();
    v.resize(bytes);
  }
  return v.data();
}

namespace {
// A 64-bit finaliser (MurmurHash3's fmix64): every input bit moves about half of the output bits.
uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

uint64_t fingerprint64(CollKind kind, ddlDataType_t type, ddlRedOp_t op, size_t count, int root, int variant) {
  const uint64_t args = static_cast<uint64_t>(kind) | static_cast<uint64_t>(type & 0xFF) << 8 |
                        static_cast<uint64_t>(op & 0xFF) << 16 | static_cast<uint64_t>(variant & 0xFF) << 24 |
                        static_cast<uint64_t>(static_cast<uint32_t>(root)) << 32;
  return fmix64(fmix64(args) ^ count);
}

}  // namespace

// Runs per collective: a few multiplies, not a byte-wise hash.
uint64_t signature(CollKind kind, ddlDataType_t type, ddlRedOp_t op, size_t count, int root, int variant) {
  return fingerprint64(kind, type, op, count, root, variant) & 0xFF;
}

Session::Session(Channel& ch, CollKind kind, ddlDataType_t type, ddlRedOp_t op, size_t count, int root,
                 int variant, int timeout_ms)
    : ch_(ch),
      t_(ch.transport()),
      kind_(kind),
      type_(type),
      op_(op),
      count_(count),
      root_(root),
      seq_bits_(static_cast<uint64_t>(ch.nextSeq()) << tag::kSeqShift),
      sig_bits_(signature(kind, type, op, count, root, variant) << tag::kSigShift),
      src_bits_(static_cast<uint64_t>(ch.rank()) << tag::kSrcShift),
      fingerprint_(fmix64(fingerprint64(kind, type, op, count, root, variant) ^ seq_bits_)),
      timeout_ms_(timeout_ms < 0 ? ch.timeoutMs() : timeout_ms),
      first_req_(ch.requestMark()) {
  DDL_ASSERT(!ch.session_active);
  ch.session_active = true;
}

Session::~Session() {
  ch_.session_active = false;
  const size_t end = ch_.requestMark();
  bool pending = false;
  for (size_t i = first_req_; i < end; ++i) {
    Request& r = ch_.request(i);
    if (!r.done) {
      t_.cancel(r);
      pending = true;
    }
  }
  if (pending) {
    Deadline d(kCleanupMs);
    for (size_t i = first_req_; i < end; ++i) {
      while (!ch_.request(i).done && !d.expired()) {
        if (!t_.progress()) t_.idleWait(0);
      }
      // One that is still posted stays taken: the transport may yet complete it.
      if (!ch_.request(i).done) return;
    }
  }
  ch_.releaseRequests(first_req_);
}

std::string Session::describe() const {
  std::string s = std::string(collName(kind_)) + " #" + std::to_string(seq_bits_ >> tag::kSeqShift);
  if (kind_ == CollKind::kBarrier) return s;
  s += " (" + std::string(typeName(type_));
  if (collHasOp(kind_)) s += " " + std::string(opName(op_));
  if (collHasRoot(kind_)) s += " root " + std::to_string(root_);
  s += ", count " + std::to_string(count_) + ")";
  return s;
}

uint32_t Session::phase() {
  DDL_ASSERT(next_phase_ < tag::kMaxPhases);
  return next_phase_++ << tag::kPhaseShift;
}

Request* Session::send(int peer, uint32_t unit, const void* buf, size_t bytes) {
  DDL_ASSERT(peer != rank() && peer >= 0 && peer < size() && unit <= tag::kUnitMask);
  Request* r = ch_.newRequest();
  r->posted_len = bytes;
  t_.send(*r, peer, seq_bits_ | sig_bits_ | src_bits_ | unit, buf, bytes);
  return r;
}

Request* Session::recv(int peer, uint32_t unit, void* buf, size_t bytes) {
  DDL_ASSERT(peer != rank() && peer >= 0 && peer < size() && unit <= tag::kUnitMask);
  Request* r = ch_.newRequest();
  r->posted_len = bytes;
  uint64_t t = seq_bits_ | (static_cast<uint64_t>(peer) << tag::kSrcShift) | unit;
  t_.recv(*r, peer, t, tag::kMatchMask, buf, bytes);
  return r;
}

void Session::failRequest(Request* r) {
  std::string peer = ch_.peerName(r->peer);
  if (r->is_recv && r->truncated) {
    fail(ddlInvalidArgument, "collective mismatch: " + peer + " sent more data than this rank expects in " +
                                 describe() + "; every rank must make the same calls in the same order with the same count, type, op and root");
  }
  std::string why = t_.peerError(r->peer);
  if (why.empty()) why = r->error;
  fail(ddlRemoteError, std::string(r->is_recv ? "receive from " : "send to ") + peer + " failed in " + describe() +
                           ": " + why + " (the peer process may have died or lost its network)");
}

void Session::probeMismatch(int peer) {
  // A message of this collective (same sequence number) from peer that matches none of our receives and
  // carries another signature means peer is running a different collective or arguments: the units we wait
  // for will never come.
  uint64_t t = seq_bits_ | (static_cast<uint64_t>(peer) << tag::kSrcShift);
  uint64_t found = 0;
  if (t_.probe(t, tag::kControl | tag::kP2P | tag::kSeqMask | tag::kSrcMask, &found) &&
      (found & tag::kSigMask) != sig_bits_) {
    fail(ddlInvalidArgument, "collective mismatch: " + ch_.peerName(peer) +
                                 " called a different collective, count, type, op, root or algorithm than this "
                                 "rank's " + describe() + "; every rank must make the same calls in the same order");
  }
}

void Session::check(Request* r) {
  if (!r->ok) failRequest(r);
  if (r->is_recv && ((r->sender_tag & tag::kSigMask) != sig_bits_ || r->length != r->posted_len)) {
    fail(ddlInvalidArgument, "collective mismatch: " + ch_.peerName(r->peer) +
                                 " called a different collective, count, type, op or root than this rank's " +
                                 describe() + "; every rank must make the same calls in the same order");
  }
}

bool Session::test(Request* r) {
  if (!r->done) return false;
  check(r);
  return true;
}

void Session::progress() { progress(nullptr); }

void Session::progress(Request* waiting_for) {
  bool any = t_.progress();
  // Point-to-point operations of this communicator move on while the collective runs (see p2p.h). Their
  // traffic must not postpone this collective's own checks: those also run every kCheckRounds rounds.
  if (ch_.p2p != nullptr && ch_.p2p->active()) ch_.p2p->poll();
  const bool checks_due = (++rounds_ & (kCheckRounds - 1)) == 0;
  if (ch_.aborted.load(std::memory_order_relaxed)) {
    fail(ddlAborted, "communicator aborted by ddlCommAbort during " + describe());
  }
  const std::string& remote = ch_.remoteError();
  if (!remote.empty()) fail(ddlRemoteError, remote + " (reported during " + describe() + " on this rank)");
  if (any && !checks_due) {
    idle_ = 0;
    return;
  }
  if (!any) ++idle_;
  if (checks_due || (idle_ & 63) == 0) {
    // Idle for a while: look for failed peers and the deadline, then let other processes run.
    Request* late = waiting_for;
    for (size_t i = first_req_; !late && i < ch_.requestMark(); ++i) {
      if (!ch_.request(i).done) late = &ch_.request(i);
    }
    if (late && late->peer >= 0) {
      probeMismatch(late->peer);
      std::string why = t_.peerError(late->peer);
      if (!why.empty()) {
        fail(ddlRemoteError, ch_.peerName(late->peer) + " failed during " + describe() + ": " + why);
      }
    }
    checkDeadline(late ? late->peer : -1);
  }
  if (any) {
    idle_ = 0;
    return;
  }
  ch_.idle(idle_);
}

void Session::checkDeadline(int waiting_for) {
  if (!deadline_) deadline_.emplace(timeout_ms_);
  if (deadline_->expired()) {
    std::string who = waiting_for >= 0 ? " waiting for " + ch_.peerName(waiting_for) : "";
    fail(ddlTimeout, describe() + " timed out after " + std::to_string(timeout_ms_) + " ms" + who +
                         ": a peer may be dead, stuck, or calling a different collective (" + ch_.timeoutHint() + ")");
  }
}

void Session::poll(int waiting_for) {
  t_.progress();
  if (ch_.p2p != nullptr && ch_.p2p->active()) ch_.p2p->poll();
  if (ch_.aborted.load(std::memory_order_relaxed)) {
    fail(ddlAborted, "communicator aborted by ddlCommAbort during " + describe());
  }
  const std::string& remote = ch_.remoteError();
  if (!remote.empty()) fail(ddlRemoteError, remote + " (reported during " + describe() + " on this rank)");
  // A peer that runs a transport collective instead of this one sends messages this rank never takes.
  if (waiting_for >= 0) probeMismatch(waiting_for);
  checkDeadline(waiting_for);
}

void Session::wait(Request* r) {
  while (!test(r)) progress(r);
  idle_ = 0;
}

void Session::waitAll() {
  for (size_t i = first_req_; i < ch_.requestMark(); ++i) wait(&ch_.request(i));
}

}  // namespace ddl
