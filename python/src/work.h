// work.h: torch_ddl's three kinds of c10d::Work, what a call returns to torch:
//   CollectiveWork  a collective on the staged path: completed by the group's worker (or, under
//                   TORCH_DDL_BLOCKING=1, the caller) once the data is in place; its Future holds the outputs.
//   StreamWork      a stream-ordered collective (TORCH_DDL_STREAM_ORDERED): launched once enqueued on the
//                   group's CUDA stream, done once that stream passes its event; wait() makes the caller's
//                   stream wait, not the host.
//   P2PWork         a send or receive: libddl's request, finished by whichever thread asks first.
// and what they share with the group: CommRef (the communicator's async error, for Works that outlive their
// group) and P2PState (a pending send or receive, which the group also holds until it is finished).
#pragma once

#include "torch_compat.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddl/ddl.h"

namespace torch_ddl {

// The communicator as the Works see it: a Work may outlive its group, so it asks for the communicator's
// async error through this, which the group empties (under mu) before destroying the communicator.
struct CommRef {
  std::mutex mu;
  ddlComm_t comm = nullptr;
  // Any thread: libddl's message when the communicator is broken (a dead peer, a timeout, an abort), else "".
  std::string asyncError();
};

// The Work of one collective on the worker: completed by it; its Future holds the output tensors.
class CollectiveWork : public c10d::Work {
 public:
  CollectiveWork(int rank, c10d::OpType type, const char* profiling_title, std::vector<at::Tensor> outputs,
                 const c10::optional<std::vector<at::Tensor>>& inputs);
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  // On the worker: marks the Work done (or failed) and completes the Future, which runs its callbacks.
  void complete(std::exception_ptr error);

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

#if TORCH_DDL_STREAM_ORDERED
// The Work of a stream-ordered collective: enqueued on the group's stream (launched), done once that stream
// passes its event. See stream_ordered.cpp.
class StreamWork : public c10d::Work {
 public:
  StreamWork(int rank, c10d::OpType type, const char* profiling_title, std::vector<at::Tensor> outputs,
             std::vector<at::Tensor> inputs, c10::Device device, std::shared_ptr<CommRef> comm, bool blocking);
  // On the thread that enqueued it, the group's stream current: records the done event, completes the Future.
  void launched(const c10::Stream& stream);
  // The enqueue failed: the Work fails with error.
  void failed(std::exception_ptr error);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  // The caller's current stream waits for the collective (the host does not, unless TORCH_DDL_BLOCKING=1).
  void synchronize() override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  // Waits on the host until launched or failed (at once when run on the caller's thread); rethrows a failure.
  void awaitLaunch(std::chrono::milliseconds timeout) const;

  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> inputs_;  // kept until the Work goes (the GPU may still read them)
  c10::Device device_;
  std::shared_ptr<CommRef> comm_;
  bool blocking_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool settled_ = false;  // launched or failed
  std::exception_ptr error_;
  std::optional<c10::Event> done_;
};
#endif

// One pending send or receive, shared by its Work and the process group (which waits for what is still
// pending when it goes, so that no buffer is freed under libddl).
struct P2PState {
  std::mutex mu;
  ddlRequest_t request = nullptr;  // null once finished
  ddlResult_t result = ddlSuccess;
  std::string error;
  at::Tensor tensor;   // the user's tensor
  at::Tensor staged;   // the contiguous (host) buffer libddl reads or writes, when not the tensor itself
  bool copy_back = false;  // a receive into staged: copied into tensor once done
  bool is_recv = false;
  int source = -1;     // a receive: the sender's rank, written by libddl before the request is done
  // Finishes the request when done (wait: blocking); true once finished.
  bool settle(bool wait);
};

class P2PWork : public c10d::Work {
 public:
  P2PWork(int rank, c10d::OpType type, std::shared_ptr<P2PState> state);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  std::vector<at::Tensor> result() override { return {state_->tensor}; }
  // A finished receive: the rank its message came from (recv from any source asks).
  int sourceRank() const override;

 private:
  std::shared_ptr<P2PState> state_;
};

}  // namespace torch_ddl
