// Test helper: an emulated GPU runtime (DeviceRuntime) on host memory, so that the device path's logic runs
// and is checked on machines without a GPU.
//
// - "Device memory" comes from FakeDevices::alloc (tests) or allocDevice (the path): host memory registered
//   as belonging to a device, filled with 0xA5 so that a read of what was never written shows.
// - Queues are deferred: work queued runs only when something waits for it (sync, syncQueue, drain, or a
//   queue awaiting an event), in queue order. A path that reads a result without waiting, or reuses a buffer
//   a queued copy still reads, therefore gets wrong data every time instead of passing by luck.
// - Reductions refuse pageable host memory, as a GPU kernel would fault on it: their pointers must be device
//   memory or allocHost's pinned memory.
// - IPC handles are pointers (the ranks are threads of this process); importMemory checks that the handle
//   names a live device allocation.
// - failAt(n) makes the n-th queued operation (counted from then, per runtime) throw ddlCudaError; Faults
// make
//   a rank refuse to export its memory or to allocate device memory.
// - The current device is per thread, as CUDA's: bind() sets it, tests read it (threadDevice()).
// - Streams (FakeStream: the application's, and libddl's own) are deferred too, and thread-safe: whichever
//   thread waits for a stream (a host that synchronises it, an event a host polls or another stream awaits)
//   runs its work, one operation at a time, in order; a thread that needs work another thread is running
//   waits for it. An operation may block (the node kernel waiting for its peers), as on a GPU. eventDone is
//   the exception: it runs nothing of the application's streams, it polls, so a path that polls an event
//   nobody drives would wait forever; the tests drive their streams. It does run libddl's own (newStream's),
//   which nothing else would drive where the application's streams do not wait for them (a GPU runs them on
//   its own). waitForStream (the host-paced scheme's wait) runs the stream.
// - Capture, as CUDA's stream capture: between beginCapture(stream) and endCapture() the work queued on
//   stream, and on every stream that waits for an event recorded on a captured stream (libddl's own, forked
//   from it), goes into a graph instead of running; replay(graph, stream) queues the graph's work on a
//   stream, as often as wanted. While capturing, streamDevice will not say the stream's device (as CUDA),
//   and queries made on a thread not in the relaxed capture mode are counted (strict_capture_queries).
// - The node kernel (device/node_kernel.h) runs on the host: the same algorithm, its blocks one after the
//   other on the thread that drives the stream, flags and counters as atomics. Devices have an identity
//   (shared by ranks on one emulated device) and MPS can be switched on (Faults::mps).
// Counters say what the path did: reductions queued, memory imported, pinned and device bytes live.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "device/device_runtime.h"
#include "device/node_kernel.h"
#include "error.h"
#include "reduce.h"

namespace ddl::test_util {

// The registry of emulated device and pinned allocations, shared by every FakeRuntime of the process.
class FakeDevices {
 public:
  static FakeDevices& get() {
    static FakeDevices d;
    return d;
  }
  // Every allocation is followed by kGuardBytes of a pattern that free() checks: a write past the end (a
  // kernel's copy that ignores a block's end) aborts the test there.
  static constexpr size_t kGuardBytes = 64;
  static constexpr unsigned char kGuard = 0x5A;
  void* alloc(size_t bytes, int dev, bool pinned = false) {
    char* p = new char[(bytes ? bytes : 1) + kGuardBytes];
    std::memset(p, 0xA5, bytes);
    std::memset(p + (bytes ? bytes : 1), kGuard, kGuardBytes);
    std::lock_guard<std::mutex> lk(mu_);
    blocks_[p] = Block{bytes ? bytes : 1, pinned ? -1 : dev, pinned, ++ids_};
    return p;
  }
  void free(void* p) {
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = blocks_.find(static_cast<char*>(p));
      if (it == blocks_.end()) fail(ddlInternalError, "fake device: free of an unknown pointer");
      bytes = it->second.bytes;
      blocks_.erase(it);
    }
    const char* guard = static_cast<const char*>(p) + bytes;
    for (size_t i = 0; i < kGuardBytes; ++i) {
      if (static_cast<unsigned char>(guard[i]) != kGuard) {
        std::fprintf(stderr, "fake device: a write past the end of a %zu-byte allocation\n", bytes);
        std::abort();
      }
    }
    delete[] static_cast<char*>(p);
  }
  // The device holding p, -1 for pinned or unknown (pageable) memory.
  int deviceOf(const void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    const Block* b = find(p);
    return b ? b->dev : -1;
  }
  bool known(const void* p) {  // device or pinned
    std::lock_guard<std::mutex> lk(mu_);
    return find(p) != nullptr;
  }
  // The device allocation holding p.
  bool rangeOf(const void* p, void** base, size_t* bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    char* c = static_cast<char*>(const_cast<void*>(p));
    auto it = blocks_.upper_bound(c);
    if (it == blocks_.begin()) return false;
    --it;
    if (c >= it->first + it->second.bytes || it->second.pinned) return false;
    *base = it->first;
    *bytes = it->second.bytes;
    return true;
  }
  // The allocation holding p's id (CUDA's buffer id), 0 for none or pinned memory.
  uint64_t idOf(const void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    const Block* b = find(p);
    return b && !b->pinned ? b->id : 0;
  }
  // As if the allocation at base p were freed and another made at the same address (what cudaFree then
  // cudaMalloc may do): a new id, the same memory.
  void renew(const void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = blocks_.find(static_cast<char*>(const_cast<void*>(p)));
    if (it == blocks_.end()) fail(ddlInternalError, "fake device: renew of an unknown pointer");
    it->second.id = ++ids_;
  }
  bool isBase(const void* p) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = blocks_.find(static_cast<char*>(const_cast<void*>(p)));
    return it != blocks_.end() && !it->second.pinned;
  }
  size_t liveBlocks() {
    std::lock_guard<std::mutex> lk(mu_);
    return blocks_.size();
  }

 private:
  struct Block {
    size_t bytes;
    int dev;
    bool pinned;
    uint64_t id;
  };
  // With mu_ held: the block containing p, if any.
  const Block* find(const void* p) const {
    char* c = static_cast<char*>(const_cast<void*>(p));
    auto it = blocks_.upper_bound(c);
    if (it == blocks_.begin()) return nullptr;
    --it;
    return c < it->first + it->second.bytes ? &it->second : nullptr;
  }
  std::mutex mu_;
  std::map<char*, Block> blocks_;
  uint64_t ids_ = 0;
};

// A test's device buffer.
struct FakeBuffer {
  FakeBuffer(size_t bytes, int dev = 0) : p(FakeDevices::get().alloc(bytes, dev)), bytes(bytes) {}
  ~FakeBuffer() { FakeDevices::get().free(p); }
  FakeBuffer(const FakeBuffer&) = delete;
  FakeBuffer& operator=(const FakeBuffer&) = delete;
  void* p;
  size_t bytes;
};

// What every FakeRuntime of a test did, summed.
struct FakeCounters {
  std::atomic<int> reductions{0};
  std::atomic<int> pinned_reductions{0};  // of them, reading pinned host memory (what crossed the wire)
  std::atomic<int> imports{0};
  std::atomic<int> closes{0};
  std::atomic<int> exports{0};
  std::atomic<int> node_kernels{0};  // launches of the node kernel
  std::atomic<int> host_calls{0};    // the host-paced scheme's waits for a stream
  std::atomic<int> kernel_copies{0};  // the node kernel's copies (HostNodeExec::copy)
  std::atomic<int> zero_copy{0};      // the node kernel's zero-copy reductions (HostNodeExec::reduceMany)
  std::atomic<int> blocks{0};         // the node kernel's last launch's blocks (CTAs)
  // Queries (deviceOf, streamDevice) made while a stream is being captured and the calling thread is not in
  // the relaxed capture mode: CUDA may count them as unsafe and invalidate the capture.
  std::atomic<int> strict_capture_queries{0};
};

struct Faults {
  bool refuse_ipc = false;    // exportMemory fails
  bool refuse_alloc = false;  // allocDevice fails
  bool refuse_foreign_ipc = false;  // exportMemory fails for memory allocDevice did not make (as cuMem's)
  bool mps = false;           // sharedByMps says the MPS daemon serves the device
  int pid = 0;                // processId() (0: the real one): ranks as if in processes of their own
  int capacity = 1 << 20;     // nodeKernelCapacity: the node kernel's CTAs resident at once
};

// A stream: work runs when a thread waits for it (see above).
class FakeStream {
 public:
  void push(std::function<void()> op) {
    std::lock_guard<std::mutex> lk(mu_);
    ops_.push_back(std::move(op));
    ++pushed_;
  }
  uint64_t mark() {
    std::lock_guard<std::mutex> lk(mu_);
    return pushed_;
  }
  bool reached(uint64_t index) {
    std::lock_guard<std::mutex> lk(mu_);
    return ran_ >= index;
  }
  // Runs (or waits for another thread to run) the work up to index.
  void runTo(uint64_t index) {
    std::unique_lock<std::mutex> lk(mu_);
    while (ran_ < index) {
      if (running_) {
        cv_.wait(lk);
        continue;
      }
      running_ = true;
      auto op = std::move(ops_.front());
      ops_.pop_front();
      lk.unlock();
      try {
        op();
      } catch (...) {
        lk.lock();
        ++ran_;
        running_ = false;
        cv_.notify_all();
        throw;
      }
      lk.lock();
      ++ran_;
      running_ = false;
      cv_.notify_all();
    }
  }
  void sync() { runTo(mark()); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> ops_;
  uint64_t pushed_ = 0, ran_ = 0;
  bool running_ = false;
};

struct FakeEvent {
  std::mutex mu;
  FakeStream* stream = nullptr;  // null: never recorded (complete)
  uint64_t index = 0;
  bool captured = false;  // recorded on a stream being captured: a dependency inside the graph
  std::pair<FakeStream*, uint64_t> get() {
    std::lock_guard<std::mutex> lk(mu);
    return {stream, index};
  }
};

// The node kernel's executor on the host (node_kernel.h): one thread per block, flags as atomics.
struct HostNodeExec {
  int tid() const { return 0; }
  int nthreads() const { return 1; }
  void sync() const {}
  bool any(bool v) const { return v; }
  void pause() const { std::this_thread::yield(); }
  void signal(uint64_t* p, uint64_t v) const {
    std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_release);
  }
  uint64_t poll(const uint64_t* p) const {
    return std::atomic_ref<uint64_t>(*const_cast<uint64_t*>(p)).load(std::memory_order_acquire);
  }
  uint64_t nowNs() const {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  void store(uint64_t* p, uint64_t v) const {
    std::atomic_ref<uint64_t>(*p).store(v, std::memory_order_relaxed);
  }
  bool claim(uint32_t* word) const {
    uint32_t zero = 0;
    return std::atomic_ref<uint32_t>(*word).compare_exchange_strong(zero, 1, std::memory_order_acq_rel);
  }
  void unclaim(uint32_t* word) const { std::atomic_ref<uint32_t>(*word).store(0, std::memory_order_release); }
  bool claimDetail(uint64_t* word, uint64_t v) const {
    uint64_t zero = 0;
    return std::atomic_ref<uint64_t>(*word).compare_exchange_strong(zero, v);
  }
  void setError(uint32_t* word, uint32_t code) const {
    uint32_t zero = 0;
    if (std::atomic_ref<uint32_t>(*word).compare_exchange_strong(zero, code) || code != node::kMismatch)
      return;
    uint32_t peer = node::kPeerFailed;
    std::atomic_ref<uint32_t>(*word).compare_exchange_strong(peer, code);
  }
  void markFailed(uint32_t* word) const {
    std::atomic_ref<uint32_t>(*word).store(1, std::memory_order_seq_cst);
  }
  bool failedAfterFences(uint32_t* word) const {
    return std::atomic_ref<uint32_t>(*word).load(std::memory_order_seq_cst) != 0;
  }
  void copy(char* dst, const char* src, size_t n) const {
    if (n) std::memmove(dst, src, n * elem);
    if (n && copies) ++*copies;
  }
  // Into a buffer of its own first: a destination may be a source (in place).
  void reduceMany(char* const* dsts, int ndst, const char* const* srcs, int nsrc, size_t n,
                  int divisor) const {
    if (!n) return;
    std::vector<char> acc(n * elem);
    reduce(acc.data(), nullptr, srcs, nsrc, n, divisor);
    for (int d = 0; d < ndst; ++d) std::memcpy(dsts[d], acc.data(), n * elem);
    if (reduce_many) ++*reduce_many;
  }
  void reduce(char* dst, char* dst2, const char* const* srcs, int nsrc, size_t n, int divisor) const {
    if (!n) return;
    std::memcpy(dst, srcs[0], n * elem);
    for (int r = 1; r < nsrc; ++r) ddl::reduce(dst, dst, srcs[r], n, type, op);
    if (divisor > 0) ddl::finishAvg(dst, n, type, divisor);
    if (dst2) std::memcpy(dst2, dst, n * elem);
  }
  size_t elem;
  ddlDataType_t type;
  ddlRedOp_t op;
  std::atomic<int>* copies = nullptr;       // counts copy() (the staged kinds' copy-in among them)
  std::atomic<int>* reduce_many = nullptr;  // counts reduceMany() (the zero-copy allreduce)
};

class FakeRuntime final : public DeviceRuntime {
 public:
  explicit FakeRuntime(std::shared_ptr<FakeCounters> counters, Faults faults = {})
      : counters_(std::move(counters)), faults_(faults) {}

  // The calling thread's current device, as bind() and setCurrent() leave it.
  static int& threadDevice() {
    static thread_local int dev = -1;
    return dev;
  }
  ~FakeRuntime() override { drain(); }

  // This rank's reductions that read pinned host memory (FakeCounters::pinned_reductions counts every
  // rank's).
  int pinnedReductions() const { return pinned_reductions_; }
  // Operations queued so far (what failAt counts: queue work and node kernel launches).
  int queuedOps() const { return ops_; }
  // The n-th operation queued from now on throws (n >= 1); 0: none.
  void failAt(int n) { fail_at_ = n; }

  const char* name() const override { return "emulated"; }
  int deviceOf(const void* p) override {
    noteQuery();
    return p ? FakeDevices::get().deviceOf(p) : -1;
  }
  void bind(int dev) override {
    if (dev < 0) fail(ddlInternalError, "fake device: bind to a negative device");
    dev_ = dev;
    threadDevice() = dev;
  }
  int current() noexcept override { return threadDevice(); }
  void setCurrent(int dev) noexcept override { threadDevice() = dev; }

  void copy(int q, void* dst, const void* src, size_t bytes) override {
    push(q, [=] { std::memmove(dst, src, bytes); });
  }
  void reduce(int q, void* dst, const void* a, const void* b, size_t count, ddlDataType_t type,
              ddlRedOp_t op) override {
    auto& reg = FakeDevices::get();
    if (!reg.known(dst) || !reg.known(a) || !reg.known(b)) {
      fail(ddlInternalError, "fake device: a reduction on pageable host memory (a GPU kernel would fault)");
    }
    ++counters_->reductions;
    if (reg.deviceOf(a) < 0 || reg.deviceOf(b) < 0) {
      ++counters_->pinned_reductions;
      ++pinned_reductions_;
    }
    push(q, [=] { ddl::reduce(dst, a, b, count, type, op); });
  }
  void finishAvg(int q, void* buf, size_t count, ddlDataType_t type, int divisor) override {
    if (!FakeDevices::get().known(buf)) fail(ddlInternalError, "fake device: finishAvg on pageable memory");
    push(q, [=] { ddl::finishAvg(buf, count, type, divisor); });
  }
  void record(int q, int e) override {
    checkQueue(q);
    events_.at(e) = Mark{q, queues_[q].pushed};
  }
  void await(int q, int e) override {
    const Mark m = events_.at(e);
    push(q, [this, m] { runTo(m.queue, m.index); });
  }
  void sync(int e) override {
    const Mark m = events_.at(e);
    runTo(m.queue, m.index);
  }
  void syncQueue(int q) override {
    checkQueue(q);
    runTo(q, queues_[q].pushed);
  }
  void drain() noexcept override {
    for (int q = 0; q < kQueues; ++q) {
      try {
        runTo(q, queues_[q].pushed);
      } catch (...) {
      }
    }
  }

  void* allocHost(size_t bytes) override { return FakeDevices::get().alloc(bytes, -1, true); }
  void freeHost(void* p) noexcept override { FakeDevices::get().free(p); }
  void* allocDevice(size_t bytes) override {
    if (faults_.refuse_alloc) fail(ddlCudaError, "fake device: out of memory (injected)");
    void* p = FakeDevices::get().alloc(bytes, dev_);
    made_.insert(p);
    return p;
  }
  void freeDevice(void* p) noexcept override {
    made_.erase(p);
    FakeDevices::get().free(p);
  }

  std::string exportMemory(void* p) override {
    if (faults_.refuse_ipc) fail(ddlCudaError, "fake device: this rank refuses IPC");
    if (faults_.refuse_foreign_ipc && !made_.count(p)) {
      fail(ddlCudaError, "fake device: this memory cannot be shared over IPC (injected, as cuMemCreate's)");
    }
    ++counters_->exports;
    return "fake" + std::string(reinterpret_cast<const char*>(&p), sizeof p);
  }
  bool allocationOf(const void* p, void** base, size_t* bytes) override {
    return FakeDevices::get().rangeOf(p, base, bytes);
  }
  uint64_t allocationId(const void* p) override {
    noteQuery();
    return FakeDevices::get().idOf(p);
  }
  void* importMemory(const std::string& h) override {
    void* p = nullptr;
    if (h.size() != 4 + sizeof p || h.compare(0, 4, "fake") != 0)
      fail(ddlCudaError, "fake device: bad handle");
    std::memcpy(&p, h.data() + 4, sizeof p);
    if (!FakeDevices::get().isBase(p))
      fail(ddlCudaError, "fake device: the handle names no device allocation");
    ++counters_->imports;
    return p;
  }
  void closeMemory(void*) noexcept override { ++counters_->closes; }

  // ---- streams ----
  // The application's streams (tests make them) are on device 0.
  int streamDevice(void* stream) override {
    noteQuery();
    if (stream && stream == capturing_) return -1;  // as CUDA, which will not say while capturing
    return stream ? 0 : threadDevice();
  }
  bool capturing(void* stream) override { return stream && stream == capturing_; }
  // The calling thread's capture mode as CUDA numbers them (2: relaxed).
  int relaxCapture() override { return std::exchange(captureMode(), 2); }
  void restoreCapture(int mode) noexcept override { captureMode() = mode; }
  void* newStream(int) override {
    auto* s = new FakeStream;
    own_streams_.insert(s);
    return s;
  }
  void deleteStream(void* s) noexcept override {
    own_streams_.erase(static_cast<FakeStream*>(s));
    delete static_cast<FakeStream*>(s);
  }
  void* newEvent(int) override { return new FakeEvent; }
  void deleteEvent(void* e) noexcept override { delete static_cast<FakeEvent*>(e); }
  void recordOn(void* stream, void* event) override {
    FakeStream* s = streamOf(stream);
    auto* e = static_cast<FakeEvent*>(event);
    std::lock_guard<std::mutex> lk(e->mu);
    e->captured = captured(s);
    e->stream = e->captured ? nullptr : s;
    e->index = s->mark();
  }
  void waitOn(void* stream, void* event) override {
    auto* e = static_cast<FakeEvent*>(event);
    bool in_graph = false;
    {
      std::lock_guard<std::mutex> lk(e->mu);
      in_graph = e->captured;
    }
    if (in_graph) {  // the stream joins the capture (a fork), or already is in it (a join)
      if (graph_) in_capture_.push_back(streamOf(stream));
      return;
    }
    const auto [s, index] = e->get();
    if (s) queueOn(stream, [s = s, index = index] { s->runTo(index); });
  }
  bool eventDone(void* event) override {
    const auto [s, index] = static_cast<FakeEvent*>(event)->get();
    if (s && own_streams_.count(s)) {
      try {
        s->runTo(index);
      } catch (...) {
      }
    }
    return !s || s->reached(index);
  }
  // The host-paced scheme's wait: runs the stream's work so far (a real GPU runs it on its own).
  void waitForStream(void* stream, int, const std::function<bool()>& aborted) override {
    ++counters_->host_calls;
    if (aborted()) fail(ddlAborted, "communicator aborted by ddlCommAbort");
    streamOf(stream)->sync();
  }
  void* allocMapped(size_t bytes, void** device) override {
    void* p = FakeDevices::get().alloc(bytes, -1, true);
    std::memset(p, 0, bytes);
    *device = p;
    return p;
  }
  void freeMapped(void* p) noexcept override { FakeDevices::get().free(p); }
  void zeroDevice(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  std::string deviceIdentity(int dev) override { return "emulated GPU " + std::to_string(dev); }
  bool sharedByMps(int) override { return faults_.mps; }
  int processId() override { return faults_.pid ? faults_.pid : DeviceRuntime::processId(); }
  int nodeKernelCapacity(int) override { return faults_.capacity; }
  void launchNode(void* stream, int, const node::Args& args) override {
    ++counters_->node_kernels;
    counters_->blocks = args.blocks;
    ++ops_;
    if (fail_at_ > 0 && --fail_at_ == 0) fail(ddlCudaError, "fake device: injected failure");
    queueOn(stream, [args, c = counters_] {
      HostNodeExec x{args.elem, args.type, args.op, &c->kernel_copies, &c->zero_copy};
      for (int b = 0; b < args.blocks; ++b) node::runBlock(args, b, x);
    });
  }

  // Capture (see above). A graph's work, in the order it was queued.
  using FakeGraph = std::vector<std::function<void()>>;
  void beginCapture(void* stream) {
    capturing_ = stream;
    graph_ = std::make_unique<FakeGraph>();
    in_capture_.assign(1, streamOf(stream));
  }
  FakeGraph endCapture() {
    FakeGraph g = graph_ ? std::move(*graph_) : FakeGraph{};
    graph_.reset();
    in_capture_.clear();
    capturing_ = nullptr;
    return g;
  }
  static void replay(const FakeGraph& g, FakeStream* stream) {
    for (const auto& op : g) stream->push(op);
  }
  // The calling thread's capture mode (0: CUDA's default, global; 2: relaxed).
  static int threadCaptureMode() { return captureMode(); }

 private:
  struct Mark {
    int queue = 0;
    uint64_t index = 0;  // complete once the queue ran this many operations
  };
  struct Queue {
    std::deque<std::function<void()>> ops;
    uint64_t pushed = 0, ran = 0;
  };
  void checkQueue(int q) const {
    if (q < 0 || q >= kQueues) fail(ddlInternalError, "fake device: no queue " + std::to_string(q));
  }
  void push(int q, std::function<void()> op) {
    checkQueue(q);
    if (dev_ < 0) fail(ddlInternalError, "fake device: work queued before bind()");
    ++ops_;
    if (fail_at_ > 0 && --fail_at_ == 0) fail(ddlCudaError, "fake device: injected failure");
    queues_[q].ops.push_back(std::move(op));
    ++queues_[q].pushed;
  }
  void runTo(int q, uint64_t index) {
    Queue& Q = queues_[q];
    while (Q.ran < index) {
      auto op = std::move(Q.ops.front());
      Q.ops.pop_front();
      ++Q.ran;
      op();
    }
  }

  static int& captureMode() {
    thread_local int mode = 0;  // global, CUDA's default
    return mode;
  }
  void noteQuery() {
    if (capturing_ && captureMode() != 2) ++counters_->strict_capture_queries;
  }

  FakeStream* streamOf(void* stream) { return stream ? static_cast<FakeStream*>(stream) : &default_stream_; }
  bool captured(FakeStream* s) const {
    return graph_ && std::find(in_capture_.begin(), in_capture_.end(), s) != in_capture_.end();
  }
  // Work for stream: into the graph while it is captured.
  void queueOn(void* stream, std::function<void()> op) {
    FakeStream* s = streamOf(stream);
    if (captured(s)) {
      graph_->push_back(std::move(op));
    } else {
      s->push(std::move(op));
    }
  }

  std::shared_ptr<FakeCounters> counters_;
  const Faults faults_;
  FakeStream default_stream_;
  void* capturing_ = nullptr;            // the application's stream being captured
  std::unique_ptr<FakeGraph> graph_;     // while capturing: what the capture holds
  std::vector<FakeStream*> in_capture_;  // the streams whose work goes into it
  std::set<FakeStream*> own_streams_;    // newStream's (the rank's thread only)
  std::set<void*> made_;                 // allocDevice's (the rank's thread only)
  int dev_ = -1;
  int fail_at_ = 0;
  int pinned_reductions_ = 0;
  int ops_ = 0;
  Queue queues_[kQueues];
  std::array<Mark, kEvents> events_{};
};

}  // namespace ddl::test_util
