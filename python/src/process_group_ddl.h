// ProcessGroupDDL: torch.distributed's backend "ddl" (torch 1.13's c10d::ProcessGroup) over libddl's C API.
//
// Asynchronous like ProcessGroupMPI and ProcessGroupNCCL: every collective returns at once with a Work whose
// Future completes when the data is in place, and runs on the group's own worker thread, in call order, as
// one blocking libddl call. So DDP's gradient buckets travel while backward computes the next ones, and every
// rank issues the same calls in the same order, which libddl checks (a mismatch is an error, not a hang).
// TORCH_DDL_BLOCKING=1 runs each collective on the calling thread instead (for comparison and debugging).
// libddl's waits run in ddlWaitShare mode (poll briefly, then sleep) so that they leave the cores to the
// training step's threads; DDL_WAIT=spin (or auto) overrides.
//
// Rendezvous: the communicator meets through the store torch built for the group (ddlCommInitRankWithStore),
// so no port is chosen; every group, new_group's included, is a libddl communicator of its own.
//
// Tensors: one tensor per list (one device per process, as NCCL). Reductions map torch's dtypes onto libddl's
// (bool: SUM is MAX and PRODUCT is MIN, as NCCL does; complex: SUM and AVG on the real view); collectives that
// only move data move bytes, so they take every dtype. Non-contiguous tensors go through a contiguous copy.
// CUDA tensors: all_reduce hands the device pointers to libddl's device path (libddl built with CUDA); the
// other collectives stage through host memory on the worker, after waiting for the producing stream.
//
// Errors: a failed libddl call (dead peer, timeout, mismatch, abort) fails the Work with libddl's message,
// which names the peer rank and host; wait() raises it as a RuntimeError in Python. Every libddl wait is
// bounded by the group's timeout, so nothing hangs. The communicator is unusable after the first error.
//
// Threads: the public methods are called by torch from any thread; entries run on worker_ in order, and the
// Futures' callbacks (DDP's, comm hooks, then()) run there too, as with ProcessGroupGloo: a callback must not
// wait for another collective of the same group. Point-to-point (send/recv, tag 0 only: ddl matches them in
// call order per pair) bypasses the queue: libddl takes them from any thread and moves them on by itself.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddl/ddl.h"

namespace torch_ddl {

// The Work of one collective: completed by the worker; its Future holds the output tensors.
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

 private:
  std::shared_ptr<P2PState> state_;
};

class ProcessGroupDDL : public c10d::ProcessGroup {
 public:
  ProcessGroupDDL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout);
  ~ProcessGroupDDL() override;

  const std::string getBackendName() const override { return "ddl"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  // The topology libddl uses for this group ("4", "2x2"), for users and tests.
  std::string topology() const;
  bool blocking() const { return blocking_; }

 private:
  struct Entry {
    c10::intrusive_ptr<CollectiveWork> work;
    std::function<void()> run;  // throws on failure
  };
  // Queues run (or runs it now in blocking mode) and returns its Work, whose Future completes with outputs.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* title, std::vector<at::Tensor> inputs,
                                         std::vector<at::Tensor> outputs, std::function<void()> run);
  void workerLoop();
  void execute(Entry& entry);
  // Throws a std::runtime_error with libddl's message when r is not ddlSuccess.
  void check(ddlResult_t r, const char* what) const;
  c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor>& tensors, int peer, bool is_recv);
  void reapP2P(bool wait_all);

  ddlComm_t comm_ = nullptr;
  bool blocking_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  bool stop_ = false;
  std::thread worker_;

  std::mutex p2p_mu_;
  std::list<std::shared_ptr<P2PState>> p2p_pending_;
};

c10::intrusive_ptr<c10d::ProcessGroup> createProcessGroupDDL(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                             int size, std::chrono::milliseconds timeout);

}  // namespace torch_ddl
