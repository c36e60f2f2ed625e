// PointToPoint (p2p.h): point-to-point operations queued, posted with their tags (a sequence number per pair,
// or the user's tag), completed, and failed on a timeout, a dead peer, an abort or a mismatch.
#include "p2p.h"

#include "dtype.h"
#include "error.h"

namespace ddl {
namespace {
// How long a cancelled request may take to let go of its buffer before its operation finishes anyway.
constexpr int kCancelMs = 500;
// Polls between the checks that read the clock or ask the transport about peers.
constexpr int kCheckEvery = 64;
}  // namespace

PointToPoint::PointToPoint(Channel& ch) : ch_(ch), send_seq_(ch.size(), 0), recv_seq_(ch.size(), 0) {}

PointToPoint::~PointToPoint() {
  shutdown(ddlAborted, "the communicator was destroyed");
  for (auto& op : abandoned_) ch_.keepUntilTransportGoes(std::shared_ptr<P2POp>(std::move(op)));
}

void PointToPoint::submit(std::unique_ptr<P2POp> op) {
  std::lock_guard<std::mutex> lk(mu_);
  if (broken_code_ != ddlSuccess) {
    op->result->finish(broken_code_, brokenMessage(broken_why_));
    return;
  }
  incoming_.push_back(std::move(op));
  active_.store(true, std::memory_order_relaxed);
}

std::pair<ddlResult_t, std::string> PointToPoint::broken() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {broken_code_, broken_why_};
}

void PointToPoint::updateActive() {
  std::lock_guard<std::mutex> lk(mu_);
  active_.store(!incoming_.empty() || !posted_.empty(), std::memory_order_relaxed);
}

std::string PointToPoint::describe(const P2POp& op) const {
  return std::string(op.is_recv ? "receive of " : "send of ") + std::to_string(op.count) + " " +
         typeName(op.type) + (op.is_recv ? " from " : " to ") +
         (op.peer == DDL_ANY_SOURCE ? std::string("any rank") : ch_.peerName(op.peer)) +
         (op.tag >= 0 ? " with tag " + std::to_string(op.tag) : std::string());
}

void PointToPoint::post(P2POp& op) {
  const int peer = op.peer;
  const size_t bytes = op.count * typeSize(op.type);
  op.sig_bits = signature(CollKind::kSendRecv, op.type, ddlSum, op.count, 0, 0) << tag::kSigShift;
  op.deadline.emplace(ch_.timeoutMs());
  op.req.reset();
  op.req.posted_len = bytes;
  if (op.tag >= 0) {  // tagged: no sequence number; any source masks the sender out
    const uint64_t user = tag::userTagBits(static_cast<uint32_t>(op.tag));
    if (op.is_recv) {
      const bool any = peer == DDL_ANY_SOURCE;
      const uint64_t t = tag::kP2P | user | (any ? 0 : static_cast<uint64_t>(peer) << tag::kSrcShift);
      ch_.transport().recv(op.req, peer, t, any ? tag::kMatchMask & ~tag::kSrcMask : tag::kMatchMask, op.buf, bytes);
    } else {
      const uint64_t t = tag::kP2P | user | op.sig_bits | (static_cast<uint64_t>(ch_.rank()) << tag::kSrcShift);
      ch_.transport().send(op.req, peer, t, op.buf, bytes);
    }
    return;
  }
  if (op.is_recv) {
    op.seq = recv_seq_[peer]++;
    const uint64_t t = tag::kP2P | (static_cast<uint64_t>(op.seq & tag::kSeqValues) << tag::kSeqShift) |
                       (static_cast<uint64_t>(peer) << tag::kSrcShift);
    ch_.transport().recv(op.req, peer, t, tag::kMatchMask, op.buf, bytes);
  } else {
    op.seq = send_seq_[peer]++;
    const uint64_t t = tag::kP2P | (static_cast<uint64_t>(op.seq & tag::kSeqValues) << tag::kSeqShift) |
                       op.sig_bits | (static_cast<uint64_t>(ch_.rank()) << tag::kSrcShift);
    ch_.transport().send(op.req, peer, t, op.buf, bytes);
  }
}

void PointToPoint::markBrokenLocked(ddlResult_t code, const std::string& why) {
  if (broken_code_ != ddlSuccess) return;  // the first failure is the story
  broken_code_ = code;
  broken_why_ = why;
  failed_.store(true, std::memory_order_release);
}

void PointToPoint::failOp(P2POp& op, ddlResult_t code, const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    markBrokenLocked(code, why);
  }
  if (op.fail_code != ddlSuccess) return;
  op.fail_code = code;
  op.fail_why = why;
  if (!op.req.done.load(std::memory_order_acquire)) {
    ch_.transport().cancel(op.req);
    op.cancel_deadline.emplace(kCancelMs);
  }
}

bool PointToPoint::settle(P2POp& op) {
  Request& r = op.req;
  if (op.fail_code != ddlSuccess) {
    // Cancelled after a failure: over once the transport let go of the buffer, or the bound passed.
    if (!r.done.load(std::memory_order_acquire) && !op.cancel_deadline->expired()) return false;
    op.result->finish(op.fail_code, op.fail_why);
    return true;
  }
  if (r.done.load(std::memory_order_acquire)) {
    // The sender, from the matched tag (a receive from DDL_ANY_SOURCE learns it only now).
    const int sender = r.is_recv && (r.ok || r.truncated)
                           ? static_cast<int>((r.sender_tag & tag::kSrcMask) >> tag::kSrcShift)
                           : op.peer;
    if (!r.ok) {
      if (r.is_recv && r.truncated) {
        failOp(op, ddlInvalidArgument,
               "point-to-point mismatch: " + ch_.peerName(sender) + " sent more data than this rank's " +
                   describe(op) + " expects (a send and its receive must have the same count and type)");
      } else {
        std::string why = op.peer >= 0 ? ch_.transport().peerError(op.peer) : std::string();
        if (why.empty()) why = r.error;
        failOp(op, ddlRemoteError,
               describe(op) + " failed: " + why + " (the peer process may have died or lost its network)");
      }
    } else if (r.is_recv && ((r.sender_tag & tag::kSigMask) != op.sig_bits || r.length != r.posted_len)) {
      failOp(op, ddlInvalidArgument,
             "point-to-point mismatch: " + ch_.peerName(sender) + " sent another type or count than this rank's " +
                 describe(op) + " expects (a send and its receive must have the same count and type)");
    } else {
      if (op.source) *op.source = sender;
      op.result->finish();
      return true;
    }
    op.result->finish(op.fail_code, op.fail_why);
    return true;
  }
  if (ch_.aborted.load(std::memory_order_relaxed)) {
    failOp(op, ddlAborted, "communicator aborted by ddlCommAbort during " + describe(op));
    return false;
  }
  const std::string& remote = ch_.remoteError();
  if (!remote.empty()) {
    failOp(op, ddlRemoteError, remote + " (reported during " + describe(op) + " on this rank)");
    return false;
  }
  if (polls_ % kCheckEvery == 0) {
    // A receive from any rank has no one peer to watch: only its deadline bounds it.
    const std::string why = op.peer >= 0 ? ch_.transport().peerError(op.peer) : std::string();
    if (!why.empty()) {
      failOp(op, ddlRemoteError, ch_.peerName(op.peer) + " failed during " + describe(op) + ": " + why);
    } else if (op.deadline->expired()) {
      failOp(op, ddlTimeout,
             describe(op) + " timed out after " + std::to_string(ch_.timeoutMs()) +
                 " ms: the peer may be dead, stuck, or never make the matching " + (op.is_recv ? "send" : "receive") +
                 " (" + ch_.timeoutHint() + ")");
    }
  }
  return false;
}

bool PointToPoint::poll() {
  std::list<std::unique_ptr<P2POp>> fresh;
  {
    std::lock_guard<std::mutex> lk(mu_);
    fresh.splice(fresh.end(), incoming_);
  }
  bool any = !fresh.empty();
  for (auto& op : fresh) {
    if (failed()) {  // submitted before the failure was known; their sequence numbers would not agree
      auto [code, why] = broken();
      op->result->finish(code, brokenMessage(why));
      continue;
    }
    post(*op);
    posted_.push_back(std::move(op));
  }
  ++polls_;
  for (auto it = posted_.begin(); it != posted_.end();) {
    P2POp& op = **it;
    if (settle(op)) {
      if (!op.req.done.load(std::memory_order_acquire)) abandoned_.push_back(std::move(*it));
      it = posted_.erase(it);
      any = true;
      continue;
    }
    ++it;
  }
  // One failure breaks them all: the pairs' sequence numbers no longer agree.
  if (failed() && !posted_.empty()) {
    auto [code, first] = broken();
    for (auto& op : posted_) failOp(*op, code, "the communicator broke: " + first);
  }
  updateActive();
  return any;
}

void PointToPoint::shutdown(ddlResult_t code, const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    markBrokenLocked(code, why);
    for (auto& op : incoming_) op->result->finish(code, why + " before " + describe(*op) + " was posted");
    incoming_.clear();
  }
  for (auto& op : posted_) failOp(*op, code, why + " during " + describe(*op));
  Deadline d(kCancelMs);
  while (!posted_.empty() && !d.expired()) {
    if (!ch_.transport().progress()) ch_.transport().idleWait(0);
    for (auto it = posted_.begin(); it != posted_.end();) {
      if ((*it)->req.done.load(std::memory_order_acquire)) {
        (*it)->result->finish((*it)->fail_code, (*it)->fail_why);
        it = posted_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& op : posted_) {
    op->result->finish(op->fail_code, op->fail_why);
    abandoned_.push_back(std::move(op));
  }
  posted_.clear();
  updateActive();
}

}  // namespace ddl
