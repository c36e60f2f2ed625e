// process_group_ddl.h: ProcessGroupDDL, torch.distributed's backend "ddl" over libddl's C API, and
// NamedProcessGroup, the torch ProcessGroup that names it "ddl" (torch >= 2.1). One source for the torches
// torch_compat.h names: with torch >= 2.0 ProcessGroupDDL is a c10d::Backend, which torch's ProcessGroup routes
// to for CPU and CUDA tensors; with torch 1.13 (Debian's python3-torch) it is the c10d::ProcessGroup itself.
//
// The class is cut by concern over python/src:
//   process_group_ddl.cpp  the group's life: rendezvous, the communicator, the worker and its queue, the path
//                          each call takes (submit), teardown; NamedProcessGroup.
//   collectives.cpp        each collective as a Call: its argument checks, its host body, its stream body.
//   staged.h, staged.cpp   the staged path: host bodies on the worker over contiguous (host) buffers.
//   stream_ordered.cpp     the stream-ordered path: stream bodies enqueued on the group's CUDA stream.
//   point_to_point.cpp     send, recv and monitored_barrier over libddl's tagged messages.
//   work.h, work.cpp       the three kinds of Work the calls return.
//   reduce_ops.h/.cpp      torch's dtypes and ReduceOps as libddl's; PREMUL_SUM.
//   arguments.h/.cpp       refusals at the call (ValueError) and the list checks collectives share.
//   torch_compat.h         every difference between the torches, as named features.
//   module.cpp             torch_ddl._C, the Python side.
//
// CPU tensors (and CUDA tensors where the stream-ordered path does not apply): asynchronous like
// ProcessGroupGloo. Every collective returns at once with a Work whose Future completes when the data is in
// place, and runs on the group's own worker thread, in call order, as one blocking libddl call. So DDP's
// gradient buckets travel while backward computes the next ones, and every rank issues the same calls in the
// same order, which libddl checks (a mismatch is an error, not a hang). TORCH_DDL_BLOCKING=1 runs each
// collective on the calling thread instead (for comparison and debugging). libddl's waits run in ddlWaitShare
// mode (poll briefly, then sleep) so that they leave the cores to the training step's threads; DDL_WAIT=spin
// (or auto) overrides.
//
// CUDA tensors, where TORCH_DDL_STREAM_ORDERED and all of a call's tensors are on one GPU: stream-ordered, as
// ProcessGroupNCCL (stream_ordered.cpp says how); the host never waits for the GPU. all_to_all, gather,
// scatter and send/recv of CUDA tensors go through host memory on the worker.
//
// Rendezvous: the communicator meets through the store torch built for the group (ddlCommInitRankWithStore),
// so no port is chosen; every group, new_group's included, is a libddl communicator of its own.
//
// Tensors: one tensor per list (one device per process, as NCCL). Reductions map torch's dtypes onto libddl's
// (reduce_ops.h); collectives that only move data move bytes, so they take every dtype. Non-contiguous
// tensors go through a contiguous copy. Sparse all_reduce is gloo's: gather every rank's indices and values,
// add, coalesce.
//
// Errors: a failed libddl call (dead peer, timeout, mismatch, abort) fails the Work with libddl's message,
// which names the peer rank and host (a timeout's starts "Timed out", as gloo's and NCCL's do); wait() raises
// it as a RuntimeError in Python. Every libddl wait is bounded by the group's timeout, so nothing hangs. The
// communicator is unusable after the first error. Bad arguments raise ValueError at the call (arguments.h).
//
// Point-to-point bypasses the queue: libddl takes tagged sends and receives from any thread and moves them on
// by itself (point_to_point.cpp).
//
// Threads: the public methods are called by torch from any thread; entries run on worker_ in order, and the
// Futures' callbacks (DDP's, comm hooks, then()) of CPU collectives run there too, as with ProcessGroupGloo:
// a callback must not wait for another collective of the same group.
#pragma once

#include "torch_compat.h"

#include <atomic>
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
#include "hot_buffers.h"
#include "work.h"

namespace torch_ddl {

// One collective as the group runs it: on the worker through host memory (host), or, where every tensor is
// on one CUDA device and libddl takes streams, enqueued on the group's stream (stream, the stream current).
struct Call {
  Call() = default;
  Call(std::vector<at::Tensor> in, std::vector<at::Tensor> out)
      : inputs(std::move(in)), outputs(std::move(out)) {}

  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> outputs;
  std::function<void()> host;
  std::function<void(ddlStream_t)> stream;  // empty: host only
};

struct StoreAdapter;

class ProcessGroupDDL : public GroupBase {
 public:
  ProcessGroupDDL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout);
  // Over a communicator made from another one (elastic.cpp), which met through adapter.
  ProcessGroupDDL(ddlComm_t comm, int rank, int size, std::shared_ptr<StoreAdapter> adapter,
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
  // gloo's protocol: every rank reports to rank 0, which names the first rank (or, waitAllRanks, every rank)
  // that did not report within opts.timeout, then releases them. Blocks the caller, as gloo's does.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  // Sequence numbers (torch's desync checks, c10d's logging): agreed at 0 when the group is made and counted
  // up by every collective, as gloo's.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }
#if TORCH_DDL_SPARSE_HOOK
  // torch >= 2.1 asks a backend for sparse all_reduce here (gloo's algorithm: see allreduce).
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override {
    return allreduce(tensors, opts);
  }
#endif
#if TORCH_DDL_BACKEND
  // torch 2.x: the coalesced forms (FSDP, _coalescing_manager) as one Work each.
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
#endif
#if TORCH_DDL_SHUTDOWN  // Backend::shutdown and abort (destroy_process_group, _abort_process_group)
  void shutdown() override { close(); }
  void abort() override;
#endif

  // The topology libddl uses for this group ("4", "2x2"), for users and tests.
  std::string topology() const;
  // How libddl runs this group's stream-ordered collectives: "kernel", "kernel+wire" (several nodes: the
  // allreduce's call waits for its node's kernel and the network), "host" (host-paced: each call waits for
  // its stream and returns once done) or "unset" (before the first).
  std::string streamScheme() const;
  bool blocking() const { return blocking_; }
  // True where CUDA tensors take the stream-ordered path (torch >= 2.10, libddl built with CUDA).
  static bool streamOrdered() { return TORCH_DDL_STREAM_ORDERED != 0; }
  // How many of the group's CUDA allreduce storages (DDP's buckets) are registered for zero-copy now
  // (hot_buffers.h), as of the last stream-ordered allreduce. Any thread.
  int registeredBuffers() const { return registered_buffers_.load(); }

  // elastic.cpp: elastic training (torch_ddl/elastic.py). Each waits for the group's queued calls, then runs
  // on the calling thread. True when a peer of the group is gone (its communicator broke with ddlRemoteError
  // or ddlTimeout): shrink() may go on without it.
  bool rankLost() const;
  // ddlCommShrink: a group of the ranks that go on (every survivor calls it); the old one is left to close.
  c10::intrusive_ptr<ProcessGroupDDL> shrink();
  // ddlCommGrow, a collective of the group: a group with the processes waiting in join() after this one's
  // ranks, or null when none waits.
  c10::intrusive_ptr<ProcessGroupDDL> grow(int max_new);
  // ddlCommJoinWithStore: this process's group once a group meeting through store grows to admit it.
  static c10::intrusive_ptr<ProcessGroupDDL> join(const c10::intrusive_ptr<c10d::Store>& store,
                                                  std::chrono::milliseconds timeout);
  // Made by shrink(): the old group's ranks it left out.
  std::vector<int> excluded() const;
  // Closes the group now (the queue drained, the communicator destroyed: it meets the peers unless broken),
  // as the last reference would: elastic.py closes a replaced group on every rank at the same point.
  void closeNow() { close(); }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct Entry {
    std::function<void()> run;                         // throws on failure
    std::function<void(std::exception_ptr)> finish;    // after run, with its failure or null
  };
  // process_group_ddl.cpp: the group's life and its queue.
  // Runs call as one Work: stream-ordered where call.stream is set and its tensors allow, else on the worker.
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType type, const char* title, Call call);
  // Queues entry (or runs it now: blocking mode, or here_ok with nothing queued or running).
  void enqueue(Entry entry, bool here_ok);
  void workerLoop();
  static void execute(Entry& entry);
  // Stops the worker and destroys the communicator (meets the peers); idempotent.
  void close();
  // The rest of construction, once comm_ is made: the worker.
  void start();
  static ddlConfig_t config(std::chrono::milliseconds timeout);
  // Waits (up to the group's timeout) until every queued call has run; throws when they do not.
  void quiesce();
  // Throws a std::runtime_error with libddl's message when r is not ddlSuccess.
  void check(ddlResult_t r, const char* what) const;

  // staged.cpp: call.host on the worker, after the streams that produce its CUDA tensors.
  c10::intrusive_ptr<c10d::Work> submitHost(c10d::OpType type, const char* title, Call call);

#if TORCH_DDL_STREAM_ORDERED
  // stream_ordered.cpp: call.stream enqueued on the group's stream.
  c10::intrusive_ptr<c10d::Work> submitStream(c10d::OpType type, const char* title, Call call, c10::Device device);
  c10::Stream streamFor(c10::Device device);
  std::mutex stream_mu_;
  std::optional<c10::Stream> stream_;  // the group's stream (one device per process)

  // A stream body's allreduce of buf on the node kernel: its storage counted, and at a round registered or
  // let go (hot_buffers.h), so that DDP's buckets become zero-copy. TORCH_DDL_REGISTER=0 (the same on every
  // rank): never.
  void noteHot(const at::Tensor& buf, ddlStream_t stream);
  static bool hotBuffersOn();
  HotBufferOps hotOps();  // the rounds' collectives on comm_
  // torch's storages as HotBuffers holds them: a c10::Storage holds the memory (the caching allocator cannot
  // free its segment), a weak_intrusive_ptr names it.
  struct StorageTraits {
    using Strong = c10::Storage;
    using Weak = c10::weak_intrusive_ptr<c10::StorageImpl>;
    static Weak weak(const Strong& s) { return s.getWeakStorageImpl(); }
    static Strong lock(const Weak& w) { return c10::Storage(w.lock()); }
    static const void* id(const Strong& s) { return s.unsafeGetStorageImpl(); }
    static void* data(const Strong& s) { return s.mutable_data(); }
    static size_t bytes(const Strong& s) { return s.nbytes(); }
    static bool othersHold(const Strong& s) { return s.use_count() > 1; }
  };
  const bool hot_on_ = hotBuffersOn();
  HotBuffers<StorageTraits> hot_;  // the stream bodies' (one at a time, in call order)
  const HotBufferOps hot_ops_ = hotOps();
  bool hot_kernel_ = false;  // the scheme is "kernel" (known once it is not "unset": it never changes)
  bool hot_refusal_told_ = false;
#endif
  std::atomic<int> registered_buffers_{0};  // hot_.registered(), for registeredBuffers()

  // collectives.cpp: the calls behind the public collectives, so that the coalesced forms can run several as
  // one Work.
  Call allgatherIntoTensor(const at::Tensor& output, const at::Tensor& input, const char* what);
  Call reduceScatterTensor(const at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& op,
                           const char* what);
  // Sparse all_reduce (SUM): gloo's algorithm over libddl's allgather.
  Call sparseAllreduce(const at::Tensor& tensor, const c10d::AllreduceOptions& opts);
  static Call combine(std::vector<Call> calls);

  // point_to_point.cpp.
  c10::intrusive_ptr<c10d::Work> p2p(std::vector<at::Tensor>& tensors, int peer, int tag, bool is_recv);
  // Sends or receives one int64 with a tag of torch_ddl's own (monitoredBarrier).
  std::shared_ptr<P2PState> controlMessage(int peer, int tag, bool is_recv);
  // Finishes the sends and receives that are done (wait_all: waits for all of them).
  void reapP2P(bool wait_all);

  ddlComm_t comm_ = nullptr;
  std::shared_ptr<CommRef> comm_ref_ = std::make_shared<CommRef>();
  bool blocking_ = false;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<StoreAdapter> adapter_;   // libddl's store of comm_ and the communicators made from it
  std::atomic<uint64_t> seq_{0};            // collectives called so far (getSequenceNumberForGroup)
  std::atomic<uint32_t> monitored_barriers_{0};  // monitoredBarrier calls so far: picks its pair of tags

  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;  // the queue ran dry (quiesce)
  std::deque<Entry> queue_;
  bool busy_ = false;  // the worker runs an entry
  bool stop_ = false;
  std::atomic<bool> closed_{false};
  std::thread worker_;
  std::thread::id worker_id_;  // set once, before any call can reach enqueue

  std::mutex p2p_mu_;
  std::list<std::shared_ptr<P2PState>> p2p_pending_;
};

#if TORCH_DDL_NAMED_GROUP
// The process group torch_ddl hands torch (torch >= 2.1, outside TORCH_DISTRIBUTED_DEBUG=DETAIL): torch's own
// ProcessGroup with the group's ProcessGroupDDL as its backend for CPU and CUDA tensors, as torch would build
// it, but named "ddl": torch's ProcessGroup names a plugin's group "custom" (DDP's logging data, pg.name(),
// its messages) and refuses it sequence numbers, which this one forwards to the backend. torch keeps a
// ProcessGroup that its creator returns as it is (the path PythonProcessGroups take).
class NamedProcessGroup : public c10d::ProcessGroup {
 public:
  NamedProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    c10::intrusive_ptr<ProcessGroupDDL> backend);
  const std::string getBackendName() const override { return "ddl"; }
  void setSequenceNumberForGroup() override { backend_->setSequenceNumberForGroup(); }
  uint64_t getSequenceNumberForGroup() override { return backend_->getSequenceNumberForGroup(); }

 private:
  c10::intrusive_ptr<ProcessGroupDDL> backend_;
};
#endif

}  // namespace torch_ddl
