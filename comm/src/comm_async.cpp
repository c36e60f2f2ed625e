// Comm's calls that return before they are done (comm.h): point-to-point operations, submitted from any thread
// and moved on by whichever thread holds the transport, and ddlIallReduce, queued for the executor; and the
// executor thread, which runs the queue in call order and drives point-to-point operations while no collective
// does.
#include "comm.h"

#include <chrono>
#include <string>

#include "dtype.h"
#include "error.h"

namespace ddl {

void Comm::checkPeer(int peer) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    fail(ddlInvalidArgument, "peer " + std::to_string(peer) + " is not another rank of this communicator (rank " +
                                 std::to_string(rank_) + " of " + std::to_string(size_) + ")");
  }
}

std::shared_ptr<AsyncOp> Comm::submitP2P(bool is_recv, void* buf, size_t count, ddlDataType_t type, int peer,
                                         int tag, int* source) {
  checkType("datatype", type);
  if (!(is_recv && tag >= 0 && peer == DDL_ANY_SOURCE)) checkPeer(peer);
  if (count && !buf) fail(ddlInvalidArgument, std::string(is_recv ? "recvbuff" : "sendbuff") + " is NULL");
  if (count) refuseDevice(is_recv ? nullptr : buf, is_recv ? buf : nullptr);
  checkedBytes(count, typeSize(type));
  failIfBroken();
  auto op = std::make_unique<P2POp>();
  op->is_recv = is_recv;
  op->peer = peer;
  op->buf = buf;
  op->count = count;
  op->type = type;
  op->tag = tag;
  op->source = source;
  std::shared_ptr<AsyncOp> result = op->result;
  p2p_->submit(std::move(op));
  {
    // Under q_mu_: the executor's wait predicate reads p2p_->active() with it held, so no wakeup is lost.
    std::lock_guard<std::mutex> lk(q_mu_);
    startExecutorLocked();
  }
  q_cv_.notify_all();
  channel_->transport().wake();  // a thread blocked in an idle wait posts it now
  return result;
}

std::shared_ptr<AsyncOp> Comm::isend(const void* buf, size_t count, ddlDataType_t type, int peer) {
  return submitP2P(false, const_cast<void*>(buf), count, type, peer);  // a send only reads buf
}

std::shared_ptr<AsyncOp> Comm::irecv(void* buf, size_t count, ddlDataType_t type, int peer) {
  return submitP2P(true, buf, count, type, peer);
}

namespace {
void checkTag(int tag) {
  if (tag < 0 || tag > DDL_MAX_TAG) {
    fail(ddlInvalidArgument, "tag " + std::to_string(tag) + " is not between 0 and DDL_MAX_TAG");
  }
}
}  // namespace

std::shared_ptr<AsyncOp> Comm::isendTagged(const void* buf, size_t count, ddlDataType_t type, int peer, int tag) {
  checkTag(tag);
  return submitP2P(false, const_cast<void*>(buf), count, type, peer, tag);
}

std::shared_ptr<AsyncOp> Comm::irecvTagged(void* buf, size_t count, ddlDataType_t type, int peer, int tag,
                                           int* source) {
  checkTag(tag);
  return submitP2P(true, buf, count, type, peer, tag, source);
}

namespace {
void waitFor(const AsyncOp& op) {
  op.done.wait(false, std::memory_order_acquire);  // every operation ends within its timeout
  if (op.result != ddlSuccess) fail(op.result, op.error);
}
}  // namespace

void Comm::send(const void* buf, size_t count, ddlDataType_t type, int peer) { waitFor(*isend(buf, count, type, peer)); }

void Comm::recv(void* buf, size_t count, ddlDataType_t type, int peer) { waitFor(*irecv(buf, count, type, peer)); }

std::shared_ptr<AsyncOp> Comm::iallReduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                                          ddlRedOp_t op) {
  checkType("datatype", type);
  checkOp(op, type);
  checkBuffers(sendbuf, recvbuf, count);
  checkedBytes(count, typeSize(type));
  auto result = std::make_shared<AsyncOp>();
  enqueue([this, result, sendbuf, recvbuf, count, type, op] {
    try {
      allReduceAny(sendbuf, recvbuf, count, type, op);
    } catch (const Error& e) {
      result->result = e.code();
      result->error = e.what();
    } catch (const std::exception& e) {
      result->result = ddlInternalError;
      result->error = e.what();
    }
    result->finish(result->result, std::move(result->error));
  });
  return result;
}

void Comm::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(q_mu_);
    startExecutorLocked();
    ++in_flight_;
    ++queued_;
    queue_.push_back(std::move(task));
  }
  q_cv_.notify_all();
  channel_->transport().wake();  // the executor may be blocked driving point-to-point operations
}

void Comm::startExecutorLocked() {
  if (!executor_.joinable()) executor_ = std::thread([this] { executorLoop(); });
}

void Comm::executorLoop() {
  std::unique_lock<std::mutex> lk(q_mu_);
  for (;;) {
    q_cv_.wait(lk, [&] { return stop_ || !queue_.empty() || p2p_->active(); });
    if (!queue_.empty()) {
      auto task = std::move(queue_.front());
      queue_.pop_front();
      --queued_;
      lk.unlock();
      task();
      lk.lock();
      --in_flight_;
      q_cv_.notify_all();
    } else if (p2p_->active()) {
      lk.unlock();
      driveP2P();
      lk.lock();
    } else {
      return;  // stop_ and nothing left
    }
  }
}

namespace {
constexpr auto kP2PSlice = std::chrono::milliseconds(1);
}  // namespace

void Comm::driveP2P() {
  // Never in the way of a collective: not when one waits for the transport or is queued, and one that holds
  // the transport moves the point-to-point operations on between its own rounds meanwhile.
  auto busy = [&] { return op_waiters_.load() > 0 || queued_.load() > 0; };
  std::unique_lock<std::mutex> op(op_mu_, std::defer_lock);
  if (busy() || !op.try_lock()) {
    std::unique_lock<std::mutex> lk(q_mu_);
    q_cv_.wait_for(lk, std::chrono::milliseconds(1), [&] { return stop_ || !queue_.empty(); });
    return;
  }
  Transport& t = channel_->transport();
  const auto end = std::chrono::steady_clock::now() + kP2PSlice;
  // A slice at most, then back to the queue; at once when a collective wants the transport (lockOp and
  // iallReduce wake an idle wait).
  while (p2p_->active() && !busy() && std::chrono::steady_clock::now() < end) {
    bool any = t.progress();
    any = p2p_->poll() || any;
    if (any) {
      p2p_idle_ = 0;
    } else {
      channel_->idle(++p2p_idle_);  // a Session's wait policy
    }
  }
  noteBrokenLocked();
}

void Comm::drainAsync() {
  std::unique_lock<std::mutex> lk(q_mu_);
  // The executor runs no blocking collective: waiting here for what it runs would never end.
  DDL_ASSERT(!executor_.joinable() || std::this_thread::get_id() != executor_.get_id());
  q_cv_.wait(lk, [&] { return in_flight_ == 0; });
}

}  // namespace ddl
