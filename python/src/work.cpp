// work.cpp: torch_ddl's three kinds of Work (work.h): how each completes, fails and is waited for.
#include "work.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <stdexcept>
#include <thread>
#include <utility>

#include "arguments.h"
#include "staged.h"

namespace torch_ddl {

CollectiveWork::CollectiveWork(int rank, c10d::OpType type, const char* profiling_title,
                               std::vector<at::Tensor> outputs, const c10::optional<std::vector<at::Tensor>>& inputs)
    : c10d::Work(rank, type, profiling_title, inputs),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

void CollectiveWork::complete(std::exception_ptr error) {
  // The Future first, as ProcessGroupGloo does: once wait() returns, get_future().value() must be there.
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
  finish(error);
}

bool P2PState::settle(bool wait) {
  std::unique_lock<std::mutex> lk(mu, std::defer_lock);
  if (wait) {
    lk.lock();
  } else if (!lk.try_lock()) {
    return false;
  }
  if (!request) return true;
  int done = 0;
  ddlResult_t r = wait ? ddlWait(request) : ddlTest(request, &done);
  if (!wait && r == ddlInProgress) return false;
  request = nullptr;  // freed by ddlWait/ddlTest
  result = r;
  if (r != ddlSuccess) {
    error = ddlGetLastError(nullptr);
  } else if (copy_back) {
    try {  // settle runs in destructors and in other operations' calls: its failure stays with its Work
      tensor.copy_(staged);
      syncDevice(tensor);
    } catch (const std::exception& e) {
      result = ddlInternalError;
      error = std::string("copying the received data into the tensor failed: ") + e.what();
    }
  }
  staged = at::Tensor();
  return true;
}

P2PWork::P2PWork(int rank, c10d::OpType type, std::shared_ptr<P2PState> state)
    : c10d::Work(rank, type), state_(std::move(state)) {}

bool P2PWork::isCompleted() { return state_->settle(false); }

bool P2PWork::isSuccess() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->request == nullptr && state_->result == ddlSuccess;
}

std::exception_ptr P2PWork::exception() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  if (state_->request != nullptr || state_->result == ddlSuccess) return nullptr;
  return std::make_exception_ptr(std::runtime_error("ddl: " + state_->error));
}

int P2PWork::sourceRank() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  if (!state_->is_recv) refuse("source rank: only a receive has one");
  if (state_->request != nullptr || state_->result != ddlSuccess) refuse("source rank: the receive has not finished");
  return state_->source;
}

bool P2PWork::wait(std::chrono::milliseconds timeout) {
  if (timeout == kNoTimeout) {
    state_->settle(true);
  } else {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!state_->settle(false)) {
      if (std::chrono::steady_clock::now() >= end) {
        throw std::runtime_error("ddl: " + c10d::opTypeToString(retrieveOpType()) + " did not finish within " +
                                 std::to_string(timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  if (auto e = exception()) std::rethrow_exception(e);
  return true;
}

std::string CommRef::asyncError() {
  std::lock_guard<std::mutex> lk(mu);
  if (!comm) return "";
  ddlResult_t r = ddlSuccess;
  if (ddlCommGetAsyncError(comm, &r) != ddlSuccess || r == ddlSuccess) return "";
  return ddlGetLastError(comm);
}

#if TORCH_DDL_STREAM_ORDERED

StreamWork::StreamWork(int rank, c10d::OpType type, const char* profiling_title, std::vector<at::Tensor> outputs,
                       std::vector<at::Tensor> inputs, c10::Device device, std::shared_ptr<CommRef> comm,
                       bool blocking)
    : c10d::Work(rank, type, profiling_title, c10::optional<std::vector<at::Tensor>>(inputs)),
      outputs_(std::move(outputs)),
      inputs_(std::move(inputs)),
      device_(device),
      comm_(std::move(comm)),
      blocking_(blocking),
      future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       std::vector<c10::Device>{device})) {}

void StreamWork::launched(const c10::Stream& stream) {
  c10::Event done(device_.type());
  done.record(stream);
  {
    std::lock_guard<std::mutex> lk(mu_);
    done_.emplace(std::move(done));
    settled_ = true;
  }
  cv_.notify_all();
  // Then the Future, whose callbacks run now (those attached while the entry was queued) and may wait() on
  // this Work. Its own events are recorded on the current streams: the group's, set by the caller.
  future_->markCompleted(c10::IValue(outputs_));
  finish();  // the profiler's range ends at the enqueue, as ProcessGroupNCCL's does without timing
}

void StreamWork::failed(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    error_ = error;
    settled_ = true;
  }
  cv_.notify_all();
  future_->setError(error);
  finish(error);
}

void StreamWork::awaitLaunch(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lk(mu_);
  auto settled = [&] { return settled_; };
  if (timeout == kNoTimeout) {
    cv_.wait(lk, settled);
  } else if (!cv_.wait_for(lk, timeout, settled)) {
    throw std::runtime_error("ddl: " + c10d::opTypeToString(retrieveOpType()) + " was not enqueued within " +
                             std::to_string(timeout.count()) + " ms (collectives queued before it still run)");
  }
  if (error_) std::rethrow_exception(error_);
}

bool StreamWork::isCompleted() {
  std::lock_guard<std::mutex> lk(mu_);
  return settled_ && (error_ || done_->query());
}

bool StreamWork::isSuccess() const {
  std::lock_guard<std::mutex> lk(mu_);
  return settled_ && !error_ && done_->query() && comm_->asyncError().empty();
}

std::exception_ptr StreamWork::exception() const {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (error_) return error_;
  }
  const std::string broken = comm_->asyncError();
  return broken.empty() ? nullptr : std::make_exception_ptr(std::runtime_error("ddl: " + broken));
}

void StreamWork::synchronize() {
  awaitLaunch(kNoTimeout);
  const auto* impl = c10::impl::getDeviceGuardImpl(device_.type());
  std::lock_guard<std::mutex> lk(mu_);
  done_->block(impl->getStream(device_));
  if (blocking_) waitEvent(*done_);
}

bool StreamWork::wait(std::chrono::milliseconds timeout) {
  awaitLaunch(timeout);
  synchronize();
  // The Future is completed right after the launch (on the thread that launched it): once wait() returns,
  // get_future().value() must be there. Future::wait() blocks the host only for that moment.
  future_->wait();
  // A failure the GPU met by now (a peer gone, a timeout): raised here; later ones by the next call.
  if (auto e = exception()) std::rethrow_exception(e);
  return true;
}

#endif  // TORCH_DDL_STREAM_ORDERED

}  // namespace torch_ddl
