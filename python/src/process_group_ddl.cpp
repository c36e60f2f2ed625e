#include "process_group_ddl.h"

#include <Python.h>
#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#if TORCH_DDL_STREAM_ORDERED
#include <c10/core/DeviceGuard.h>
#include <c10/core/StreamGuard.h>
#endif

#include <sys/prctl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace torch_ddl {
namespace {

[[noreturn]] void refuse(const std::string& what) { throw std::invalid_argument("ddl: " + what); }

// libddl built with CUDA takes device buffers in ddlAllReduce (python/CMakeLists.txt defines this then; the
// packages pin torch_ddl to the libddl built with it). Elsewhere CUDA tensors go through host memory.
#ifdef DDL_LIBDDL_CUDA
constexpr bool kLibddlTakesDeviceBuffers = true;
#else
constexpr bool kLibddlTakesDeviceBuffers = false;
#endif

const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1) {
    refuse(std::string(what) + " takes one tensor per process (one device per process), got " +
           std::to_string(tensors.size()));
  }
  if (!tensors[0].defined()) refuse(std::string(what) + ": the tensor is undefined");
  return tensors[0];
}

// ---- dtypes and ops for reductions ----

// The libddl type that reduces t's elements and how many of them make one of t's (complex: 2).
std::pair<ddlDataType_t, int> reduceTypeOf(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kByte: return {ddlUint8, 1};
    case at::kBool: return {ddlUint8, 1};
    case at::kChar: return {ddlInt8, 1};
    case at::kInt: return {ddlInt32, 1};
    case at::kLong: return {ddlInt64, 1};
    case at::kHalf: return {ddlFloat16, 1};
    case at::kBFloat16: return {ddlBfloat16, 1};
    case at::kFloat: return {ddlFloat32, 1};
    case at::kDouble: return {ddlFloat64, 1};
    case at::kComplexHalf: return {ddlFloat16, 2};
    case at::kComplexFloat: return {ddlFloat32, 2};
    case at::kComplexDouble: return {ddlFloat64, 2};
    default:
      refuse(std::string("cannot reduce tensors of dtype ") + c10::toString(t.scalar_type()) +
             " (reductions take bool, uint8, int8, int32, int64, float16, bfloat16, float32, float64 and complex; "
             "broadcast, gathers, scatters, all_to_all and send/recv take every dtype)");
  }
}

ddlRedOp_t reduceOpOf(const c10d::ReduceOp& op, const at::Tensor& t) {
  const bool is_bool = t.scalar_type() == at::kBool;
  const bool is_complex = t.is_complex();
  const bool is_integral = at::isIntegralType(t.scalar_type(), /*includeBool=*/true);
  auto name = [&] { return std::string(c10::toString(t.scalar_type())); };
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return is_bool ? ddlMax : ddlSum;  // a logical or, as NCCL does
    case c10d::ReduceOp::AVG:
      if (is_bool) refuse("ReduceOp.AVG is not defined on bool tensors");
      return ddlAvg;
    case c10d::ReduceOp::PRODUCT:
      if (is_complex) refuse("ReduceOp.PRODUCT on complex tensors is not supported (SUM and AVG are)");
      return is_bool ? ddlMin : ddlProd;  // a logical and
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::MAX:
      if (is_complex) refuse("complex tensors have no order: ReduceOp.MIN and MAX do not apply");
      return op.op_ == c10d::ReduceOp::MIN ? ddlMin : ddlMax;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      if (!is_integral) refuse("bitwise reductions take integer and bool tensors, not " + name());
      return op.op_ == c10d::ReduceOp::BAND ? ddlBand : op.op_ == c10d::ReduceOp::BOR ? ddlBor : ddlBxor;
    case c10d::ReduceOp::PREMUL_SUM:
      if (!at::isFloatingType(t.scalar_type()) && !is_complex) {
        refuse("ReduceOp.PREMUL_SUM takes floating-point and complex tensors, not " + name());
      }
      return ddlSum;  // of the inputs times the factor (PreMul)
    default:
      refuse("ReduceOp " + std::to_string(static_cast<int>(op.op_)) +
             " is not supported (use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR or PREMUL_SUM)");
  }
}

// The factor tensor of a PREMUL_SUM: torch 2.x keeps one tensor, torch 1.13 a list (one per device).
template <class S>
auto factorTensor(const S& s, int) -> decltype(s.tensor_factor) {
  return s.tensor_factor;
}
template <class S>
at::Tensor factorTensor(const S& s, long) {
  return s.tensor_factors.empty() ? at::Tensor() : s.tensor_factors[0];
}

// ReduceOp.PREMUL_SUM (torch.distributed._make_nccl_premul_sum; FSDP's gradient divide factor): every rank's
// input times the factor (a number or a one-element tensor), then summed. The inputs are scaled into new
// buffers: the caller's tensors change only where the result goes.
struct PreMul {
  bool active = false;
  double scalar = 1.0;
  at::Tensor tensor;

  // input times the factor, as a new contiguous tensor on input's device (made on the current stream).
  at::Tensor scaled(const at::Tensor& input) const {
    if (tensor.defined()) return input.mul(tensor.to(input.device(), input.scalar_type())).contiguous();
    return input.mul(scalar).contiguous();
  }
  // input itself when there is no factor, else scaled(input); dense (contiguous) either way.
  at::Tensor apply(const at::Tensor& input) const {
    return active ? scaled(input) : input.is_contiguous() ? input : input.contiguous();
  }
  std::vector<at::Tensor> apply(const std::vector<at::Tensor>& inputs) const {
    if (!active) return inputs;
    std::vector<at::Tensor> out;
    for (const auto& t : inputs) out.push_back(scaled(t));
    return out;
  }
};

PreMul preMulOf(const c10d::ReduceOp& op) {
  PreMul p;
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return p;
  // torch makes PREMUL_SUM only with this supplement (_make_nccl_premul_sum).
  const auto* s = static_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (!s) refuse("ReduceOp.PREMUL_SUM without its factor: make it with torch.distributed._make_nccl_premul_sum");
  p.active = true;
  p.tensor = factorTensor(*s, 0);
  if (p.tensor.defined() && p.tensor.numel() != 1) {
    refuse("ReduceOp.PREMUL_SUM: the factor tensor must have one element, it has " +
           std::to_string(p.tensor.numel()));
  }
  p.scalar = s->double_factor;
  return p;
}

// ---- buffers ----

// Blocks until the work queued so far on t's device's current stream has finished (no-op for CPU tensors).
void syncDevice(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return;
  c10::impl::getDeviceGuardImpl(t.device().type())->getStream(t.device()).synchronize();
}

// Blocks until ev's stream has reached it (torch 1.13's Event has query() but no synchronize()).
void waitEvent(const c10::Event& ev) {
  while (!ev.query()) std::this_thread::sleep_for(std::chrono::microseconds(10));
}

// A contiguous buffer for t that libddl may read and write: t itself when it already is one (and, for CUDA
// tensors, when libddl takes device memory for this call), else a contiguous copy (host memory for CUDA
// tensors), which unstage() copies back.
struct Staged {
  at::Tensor user;
  at::Tensor buf;
  bool copy_back = false;
};

Staged stage(const at::Tensor& t, bool device_ok, bool read_input) {
  Staged s{t, t, false};
  const bool on_device = !t.device().is_cpu();
  if (on_device && !device_ok) {
    s.buf = read_input ? t.to(at::kCPU).contiguous() : at::empty(t.sizes(), t.options().device(at::kCPU));
  } else if (!t.is_contiguous()) {
    s.buf = read_input ? t.contiguous() : at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
  }
  s.copy_back = !s.buf.is_same(t);
  return s;
}

void unstage(Staged& s) {
  if (!s.copy_back) return;
  s.user.copy_(s.buf);
  syncDevice(s.user);  // the data is on the device when the Work completes
}

// A contiguous host copy of tensors laid end to end (for list collectives), and its byte offsets.
at::Tensor flatBytes(const std::vector<at::Tensor>& tensors, std::vector<size_t>* offsets) {
  size_t total = 0;
  for (const auto& t : tensors) {
    offsets->push_back(total);
    total += t.nbytes();
  }
  at::Tensor flat = at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte));
  for (size_t i = 0; i < tensors.size(); ++i) {
    at::Tensor src = tensors[i].to(at::kCPU).contiguous();
    std::memcpy(static_cast<char*>(flat.data_ptr()) + (*offsets)[i], src.data_ptr(), src.nbytes());
  }
  return flat;
}

// Copies the bytes at flat + offset into t (any layout, any device).
void copyOut(at::Tensor& t, const at::Tensor& flat, size_t offset) {
  if (t.nbytes() == 0) return;
  at::Tensor bytes = flat.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(t.nbytes()));
  at::Tensor view = at::from_blob(bytes.data_ptr(), t.sizes(), t.options().device(at::kCPU));  // contiguous
  t.copy_(view);
  syncDevice(t);
}

// The one list of group-size tensors a list collective takes (all_gather's outputs, reduce_scatter's inputs).
std::vector<at::Tensor> groupList(const std::vector<std::vector<at::Tensor>>& lists, int size, const char* what,
                                  const char* which) {
  if (lists.size() != 1 || lists[0].size() != static_cast<size_t>(size)) {
    refuse(std::string(what) + " needs one " + which + " list of " + std::to_string(size) +
           " tensors (the group's size)");
  }
  return lists[0];
}

// The same for a rooted collective (gather's outputs, scatter's inputs): on the root only; empty elsewhere.
std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists, int size, int rank, int root,
                                 const char* what, const char* which) {
  if (rank == root) return groupList(lists, size, what, which);
  if (!lists.empty()) {
    refuse(std::string(what) + " takes " + which + " tensors on the root only (rank " + std::to_string(root) + ")");
  }
  return {};
}

void checkSameBytes(const std::vector<at::Tensor>& tensors, size_t bytes, const char* what) {
  for (const auto& t : tensors) {
    if (t.nbytes() != bytes) {
      refuse(std::string(what) + ": every tensor of the list must have the input's size (" + std::to_string(bytes) +
             " bytes), one has " + std::to_string(t.nbytes()));
    }
  }
}

std::vector<c10::Event> readyEvents(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Event> events;
  for (const auto& t : tensors) {
    if (!t.defined() || t.device().is_cpu()) continue;
    const auto* impl = c10::impl::getDeviceGuardImpl(t.device().type());
    events.emplace_back(t.device().type());
    events.back().record(impl->getStream(t.device()));
  }
  return events;
}

}  // namespace

// ---- Work ----

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

// ---- the process group ----

namespace {

// ddlStore_t over torch's store: keys go under "ddl/" in the group's (prefix) store.
struct StoreAdapter {
  c10::intrusive_ptr<c10d::Store> store;
  std::string last_error;

  static StoreAdapter* of(void* ctx) { return static_cast<StoreAdapter*>(ctx); }
  static std::string key(const char* k) { return std::string("ddl/") + k; }

  template <class F>
  int guarded(F&& f) {
    try {
      f();
      return 0;
    } catch (const std::exception& e) {
      last_error = e.what();
      return 1;
    }
  }

  ddlStore_t api() {
    ddlStore_t s{};
    s.ctx = this;
    s.set = [](void* ctx, const char* k, const void* value, size_t len) {
      return of(ctx)->guarded([&] {
        const auto* p = static_cast<const uint8_t*>(value);
        of(ctx)->store->set(key(k), std::vector<uint8_t>(p, p + len));
      });
    };
    s.get = [](void* ctx, const char* k, int timeout_ms, void (*deliver)(void*, const void*, size_t), void* sink) {
      return of(ctx)->guarded([&] {
        of(ctx)->store->wait({key(k)}, std::chrono::milliseconds(timeout_ms));
        const std::vector<uint8_t> v = of(ctx)->store->get(key(k));
        deliver(sink, v.data(), v.size());
      });
    };
    s.add = [](void* ctx, const char* k, long long delta, long long* result) {
      return of(ctx)->guarded([&] { *result = of(ctx)->store->add(key(k), delta); });
    };
    s.lastError = [](void* ctx) -> const char* { return of(ctx)->last_error.c_str(); };
    return s;
  }
};

// Lets go of the GIL for its lifetime when the calling thread holds it. The last reference to a process group
// usually goes from Python, GIL held, while the worker may be completing a Future whose callbacks (a DDP comm
// hook, a then()) need the GIL: joining the worker with the GIL held would deadlock.
class GilReleased {
 public:
  GilReleased() {
    if (Py_IsInitialized() && PyGILState_Check()) state_ = PyEval_SaveThread();
  }
  ~GilReleased() {
    if (state_) PyEval_RestoreThread(state_);
  }
  GilReleased(const GilReleased&) = delete;
  GilReleased& operator=(const GilReleased&) = delete;

 private:
  PyThreadState* state_ = nullptr;
};

// Set on a worker thread whose group was closed from one of its entries' callbacks (close() detached it).
thread_local bool t_worker_detached = false;

bool envFlag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::string(v) != "0";
}

}  // namespace

ProcessGroupDDL::ProcessGroupDDL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout)
    : GroupBase(rank, size), blocking_(envFlag("TORCH_DDL_BLOCKING")), timeout_(timeout) {
  StoreAdapter adapter{store, {}};
  ddlStore_t api = adapter.api();
  ddlConfig_t config = DDL_CONFIG_INITIALIZER;
  const auto ms = timeout.count();
  config.timeoutMs = ms > 0 && ms < INT32_MAX ? static_cast<int>(ms) : INT32_MAX;
  // The worker's waits must leave the core to the training step's own threads (the backward pass runs beside
  // them): poll briefly, then sleep. DDL_WAIT set by the user decides instead.
  const char* wait = std::getenv("DDL_WAIT");
  config.waitMode = wait && *wait ? ddlWaitAuto : ddlWaitShare;
  if (ddlCommInitRankWithStore(&comm_, size, rank, &api, &config) != ddlSuccess) {
    throw std::runtime_error(std::string("ddl: cannot create the communicator of rank ") + std::to_string(rank) +
                             " of " + std::to_string(size) + ": " + ddlGetLastError(nullptr));
  }
  comm_ref_->comm = comm_;
  if (!blocking_) {
    worker_ = std::thread([this] {
      // Sleeps in libddl's waits end within microseconds of their time, not the default 50 us later.
      prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
      workerLoop();
    });
    worker_id_ = worker_.get_id();
  }
  init();
}

ProcessGroupDDL::~ProcessGroupDDL() { close(); }

void ProcessGroupDDL::close() {
  GilReleased no_gil;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_.exchange(true)) return;
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) {
    if (worker_.get_id() == std::this_thread::get_id()) {
      // Closed in a Future callback on the worker itself (the last reference went, or shutdown()): it cannot
      // join itself. What is still queued fails now (the communicator goes below), and the worker returns
      // without touching this object again once the callback is done (t_worker_detached).
      std::deque<Entry> left;
      {
        std::lock_guard<std::mutex> lk(mu_);
        left.swap(queue_);
      }
      for (auto& e : left) {
        e.finish(std::make_exception_ptr(std::runtime_error("ddl: the process group was shut down")));
      }
      t_worker_detached = true;
      worker_.detach();
    } else {
      worker_.join();  // what is queued runs first; each call is bounded by the timeout
    }
  }
  // Works that outlive the group no longer ask the communicator.
  {
    std::lock_guard<std::mutex> lk(comm_ref_->mu);
    comm_ref_->comm = nullptr;
  }
  // Destroy first: it meets the peers, so sends and receives still pending can complete, and fails what is left
  // at once (a receive whose send never comes would otherwise hold this for the whole timeout). The requests
  // stay valid after it.
  ddlCommDestroy(comm_);
  reapP2P(true);
  comm_ = nullptr;  // topology(), send and recv refuse from now on
}

#if TORCH_DDL_AT_LEAST(2, 7)
void ProcessGroupDDL::abort() {
  // Any thread: every blocked and later libddl call of this group (and kernels on the GPU) ends with ddlAborted.
  std::lock_guard<std::mutex> lk(comm_ref_->mu);
  if (comm_ref_->comm) ddlCommAbort(comm_ref_->comm);
}
#endif

std::string ProcessGroupDDL::topology() const {
  if (closed_.load()) refuse("the process group was shut down");
  char buf[256] = {};
  ddlCommGetTopology(comm_, buf, sizeof(buf));
  return buf;
}

std::string ProcessGroupDDL::streamScheme() const {
  if (closed_.load()) refuse("the process group was shut down");
  char buf[64] = {};
  check(ddlCommGetStreamScheme(comm_, buf, sizeof(buf)), "ddlCommGetStreamScheme");
  return buf;
}

void ProcessGroupDDL::check(ddlResult_t r, const char* what) const {
  // This thread's last error: the communicator's may already be another thread's (a send failing meanwhile).
  if (r == ddlSuccess) return;
  // "Timed out" first, as gloo's and NCCL's timeouts say (scripts and torch's tests look for it).
  const std::string message =
      std::string("ddl: ") + (r == ddlTimeout ? "Timed out in " + std::string(what) + ": " : "") +
      ddlGetLastError(nullptr);
  // An argument libddl refused without breaking the communicator (a stream-ordered call captured before the
  // group's first call, say) is the caller's ValueError; a mismatch between ranks breaks it: RuntimeError.
  if (r == ddlInvalidArgument && comm_ref_->asyncError().empty()) throw std::invalid_argument(message);
  throw std::runtime_error(message);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::submit(c10d::OpType type, const char* title, Call call) {
  if (closed_.load()) refuse("the process group was shut down");
  seq_++;
#if TORCH_DDL_STREAM_ORDERED
  // Stream-ordered where every tensor is on one CUDA device.
  if (call.stream) {
    std::optional<c10::Device> device;
    bool one_gpu = true;
    for (const auto* list : {&call.inputs, &call.outputs}) {
      for (const auto& t : *list) {
        if (!t.defined()) continue;
        if (!t.is_cuda() || (device && t.device() != *device)) one_gpu = false;
        device = t.device();
      }
    }
    if (one_gpu && device) return submitStream(type, title, std::move(call), *device);
  }
#endif
  return submitHost(type, title, std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::submitHost(c10d::OpType type, const char* title, Call call) {
  auto work = c10::make_intrusive<CollectiveWork>(rank_, type, title, call.outputs,
                                                  c10::optional<std::vector<at::Tensor>>(call.inputs));
  Entry entry{std::move(call.host), [work](std::exception_ptr e) { work->complete(e); }};
  // CUDA producers: the worker first waits for what is queued on the tensors' streams now (CPU tensors: none).
  std::vector<at::Tensor> touched = call.inputs;  // outputs too: the caller's stream may still read them
  touched.insert(touched.end(), call.outputs.begin(), call.outputs.end());
  if (auto ready = readyEvents(touched); !ready.empty()) {
    auto events = std::make_shared<std::vector<c10::Event>>(std::move(ready));
    entry.run = [events, body = std::move(entry.run)] {
      for (const auto& ev : *events) waitEvent(ev);
      body();
    };
  }
  enqueue(std::move(entry), /*here_ok=*/false);
  return work;
}

#if TORCH_DDL_STREAM_ORDERED
c10::Stream ProcessGroupDDL::streamFor(c10::Device device) {
  std::lock_guard<std::mutex> lk(stream_mu_);
  if (stream_ && stream_->device() != device) {
    refuse("this group runs on " + stream_->device().str() + " and got tensors on " + device.str() +
           " (one device per process, as NCCL)");
  }
  if (!stream_) stream_ = c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device);
  return *stream_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::submitStream(c10d::OpType type, const char* title, Call call,
                                                             c10::Device device) {
  const c10::Stream own = streamFor(device);
  const auto* impl = c10::impl::getDeviceGuardImpl(device.type());
  // The group's stream starts where the caller's current stream is now.
  const c10::Stream caller = impl->getStream(device);
  auto ready = std::make_shared<c10::Event>(device.type());
  ready->record(caller);
  auto work = c10::make_intrusive<StreamWork>(rank_, type, title, call.outputs, call.inputs, device, comm_ref_,
                                              blocking_);
  std::vector<at::Tensor> tensors = call.inputs;
  tensors.insert(tensors.end(), call.outputs.begin(), call.outputs.end());
  Entry entry;
  entry.run = [this, own, caller, ready, tensors, body = std::move(call.stream), work] {
    // An earlier failure on the GPU breaks the communicator: say so here, naming the peer.
    if (std::string broken = comm_ref_->asyncError(); !broken.empty()) throw std::runtime_error("ddl: " + broken);
    c10::StreamGuard on_own(own);  // the copies the body makes run on the group's stream too
    ready->block(own);
    // The caching allocator must not hand the tensors' memory to others before the group's stream is done
    // with them (recorded first: a body that fails part-way may have enqueued work already).
    const auto* impl = c10::impl::getDeviceGuardImpl(own.device_type());
    for (const auto& t : tensors) {
      if (t.defined() && t.has_storage()) impl->recordDataPtrOnStream(t.storage().data_ptr(), own);
    }
    try {
      body(own.native_handle());
    } catch (...) {
      // The caller's stream joins the group's again, so that a CUDA graph capture it was in can still end.
      c10::Event joined(own.device_type());
      joined.record(own);
      joined.block(caller);
      throw;
    }
    work->launched(own);
  };
  entry.finish = [work](std::exception_ptr e) {
    if (e) work->failed(e);
  };
  // Host-paced (libddl's scheme where its node kernel cannot serve: several nodes, a GPU shared without MPS),
  // a call waits for its stream and runs the whole collective before it returns; across nodes
  // ("kernel+wire") an allreduce waits for its node's reduce-scatter and the network. The worker makes such
  // calls, so that the caller (under DDP, the autograd thread) goes on queueing GPU work meanwhile.
  // submit() refused a closed group.
  const std::string scheme = streamScheme();
  enqueue(std::move(entry), /*here_ok=*/scheme == "kernel" || scheme == "unset");
  if (blocking_) {
    try {
      work->synchronize();  // the host waits for the result; a failure is raised by wait()
    } catch (const std::exception&) {
    }
  }
  return work;
}
#endif

void ProcessGroupDDL::enqueue(Entry entry, bool here_ok) {
  std::unique_lock<std::mutex> lk(mu_);
  if (stop_) {
    // Shut down meanwhile (another thread): the communicator is going or gone.
    lk.unlock();
    entry.finish(std::make_exception_ptr(std::runtime_error("ddl: the process group was shut down")));
    return;
  }
  if (blocking_) {
    execute(entry);  // under the lock: close() cannot destroy the communicator meanwhile
    return;
  }
  // On the worker itself, from a Future callback of the entry it runs (whose libddl call has returned): what
  // is queued would wait for this callback, so a stream-ordered entry runs here when nothing is queued.
  const bool on_worker = std::this_thread::get_id() == worker_id_;
  if (here_ok && queue_.empty() && (!busy_ || on_worker)) {
    // Nothing ahead of it: run on this thread (the lock keeps the worker from starting another meanwhile), so
    // that a stream-ordered call is on its stream when the call returns.
    execute(entry);
    return;
  }
  queue_.push_back(std::move(entry));
  lk.unlock();
  cv_.notify_one();
}

void ProcessGroupDDL::execute(Entry& entry) {
  std::exception_ptr error;
  try {
    entry.run();
  } catch (...) {
    error = std::current_exception();
  }
  entry.finish(error);
}

void ProcessGroupDDL::workerLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and nothing left
    Entry entry = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    execute(entry);
    entry = Entry{};  // drop the tensors before taking the lock again
    if (t_worker_detached) return;  // the group was closed from this entry's callback: it may be gone
    lk.lock();
    busy_ = false;
  }
}

// ---- collectives ----
//
// Each builds a Call: its host body (on the worker, through host memory where libddl takes no device memory
// for it) and, where libddl has a stream-ordered form, its stream body (run with the group's stream current,
// so that the contiguous copies and slices it makes are ordered on that stream too).

namespace {

// A contiguous tensor with t's data (t itself when it is one); made on the current stream.
at::Tensor dense(const at::Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

// The bytes of flat (uint8) from offset on, as a tensor shaped like `like` (for copying into it).
at::Tensor bytesAs(const at::Tensor& flat, size_t offset, const at::Tensor& like) {
  at::Tensor bytes = flat.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(like.nbytes()));
  return bytes.view(like.scalar_type()).view(like.sizes());
}

// tensors laid end to end as bytes, in one new tensor on their device (the current stream's copies).
at::Tensor catBytes(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> flat;
  for (const auto& t : tensors) flat.push_back(dense(t).view({-1}).view(at::kByte));
  return at::cat(flat);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  at::Tensor t = single(tensors, "all_reduce");
  if (t.is_sparse()) return submit(c10d::OpType::ALLREDUCE, "ddl:all_reduce_sparse", sparseAllreduce(t, opts));
  const auto [type, factor] = reduceTypeOf(t);
  const ddlRedOp_t op = reduceOpOf(opts.reduceOp, t);
  const PreMul pre = preMulOf(opts.reduceOp);
  Call call{{t}, {t}};
  call.host = [this, t, type = type, factor = factor, op, pre] {
    Staged s = stage(t, /*device_ok=*/kLibddlTakesDeviceBuffers, /*read_input=*/true);
    if (pre.active) {
      s.buf = pre.scaled(s.buf);
      s.copy_back = true;
      syncDevice(s.buf);  // libddl's blocking device path reads it now
    }
    check(ddlAllReduce(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.numel() * factor, type, op, comm_), "all_reduce");
    unstage(s);
  };
  call.stream = [this, t, type = type, factor = factor, op, pre](ddlStream_t stream) mutable {
    at::Tensor buf = pre.apply(t);
    check(ddlAllReduceOnStream(buf.data_ptr(), buf.data_ptr(), buf.numel() * factor, type, op, comm_, stream),
          "all_reduce");
    if (!buf.is_same(t)) t.copy_(buf);
  };
  return submit(c10d::OpType::ALLREDUCE, "ddl:all_reduce", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                    const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) refuse("allreduce_coalesced needs at least one tensor");
  for (const auto& t : tensors) {
    if (t.scalar_type() != tensors[0].scalar_type() || t.device() != tensors[0].device()) {
      refuse("allreduce_coalesced takes tensors of one dtype and device");
    }
  }
  const auto [type, factor] = reduceTypeOf(tensors[0]);
  const ddlRedOp_t op = reduceOpOf(opts.reduceOp, tensors[0]);
  const PreMul pre = preMulOf(opts.reduceOp);
  std::vector<at::Tensor> ts = tensors;
  const size_t elem = ts[0].element_size();
  Call call{ts, ts};
  call.host = [this, ts, type = type, factor = factor, op, elem, pre]() mutable {
    std::vector<size_t> offsets;
    at::Tensor flat = flatBytes(pre.apply(ts), &offsets);
    check(ddlAllReduce(flat.data_ptr(), flat.data_ptr(), flat.nbytes() / elem * factor, type, op, comm_),
          "all_reduce_coalesced");
    for (size_t i = 0; i < ts.size(); ++i) copyOut(ts[i], flat, offsets[i]);
  };
  call.stream = [this, ts, type = type, factor = factor, op, elem, pre](ddlStream_t stream) mutable {
    at::Tensor flat = catBytes(pre.apply(ts));
    check(ddlAllReduceOnStream(flat.data_ptr(), flat.data_ptr(), flat.nbytes() / elem * factor, type, op, comm_,
                               stream),
          "all_reduce_coalesced");
    size_t offset = 0;
    for (auto& t : ts) {
      t.copy_(bytesAs(flat, offset, t));
      offset += t.nbytes();
    }
  };
  return submit(c10d::OpType::ALLREDUCE_COALESCED, "ddl:all_reduce_coalesced", std::move(call));
}

// Sparse all_reduce, as gloo does it: the ranks gather each other's shape and number of entries, then every
// rank's indices and values (padded to the largest count, so that one allgather moves each), add the sparse
// tensors up and coalesce the sum into the caller's tensor. Moves p * max(nnz) entries to every rank; SUM only.
Call ProcessGroupDDL::sparseAllreduce(const at::Tensor& tensor, const c10d::AllreduceOptions& opts) {
  if (opts.reduceOp != c10d::ReduceOp::SUM) refuse("sparse all_reduce takes ReduceOp.SUM only");
  at::Tensor t = tensor;
  Call call{{t}, {t}};
  call.host = [this, t]() mutable {
    const char* what = "all_reduce (sparse)";
    at::Tensor input = t.to(at::kCPU).coalesce();
    const int64_t ndim = input.dim(), sparse_dim = input.sparse_dim(), nnz = input._nnz();
    // Shapes: every rank must hold a tensor of the same sizes (checked on every rank alike: all raise).
    std::vector<int64_t> meta{ndim, sparse_dim, nnz}, all_meta(3 * size_);
    check(ddlAllGather(meta.data(), all_meta.data(), 3, ddlInt64, comm_), what);
    int64_t max_nnz = 0;
    for (int r = 0; r < size_; ++r) {
      if (all_meta[3 * r] != ndim || all_meta[3 * r + 1] != sparse_dim) {
        throw std::runtime_error("ddl: sparse all_reduce: rank " + std::to_string(r) + " has a tensor of " +
                                 std::to_string(all_meta[3 * r]) + " dimensions (" +
                                 std::to_string(all_meta[3 * r + 1]) + " sparse), rank " + std::to_string(rank_) +
                                 " one of " + std::to_string(ndim) + " (" + std::to_string(sparse_dim) + " sparse)");
      }
      max_nnz = std::max(max_nnz, all_meta[3 * r + 2]);
    }
    std::vector<int64_t> sizes = input.sizes().vec(), all_sizes(ndim * size_);
    check(ddlAllGather(sizes.data(), all_sizes.data(), ndim, ddlInt64, comm_), what);
    for (int r = 0; r < size_; ++r) {
      if (!std::equal(sizes.begin(), sizes.end(), all_sizes.begin() + r * ndim)) {
        throw std::runtime_error("ddl: sparse all_reduce: rank " + std::to_string(r) +
                                 "'s tensor has other sizes than rank " + std::to_string(rank_) + "'s");
      }
    }
    // Indices and values, each rank's padded to max_nnz entries.
    const auto long_options = at::TensorOptions().dtype(at::kLong);
    at::Tensor indices = at::zeros({sparse_dim, max_nnz}, long_options);
    indices.narrow(1, 0, nnz).copy_(input._indices());
    std::vector<int64_t> value_shape = input._values().sizes().vec();
    value_shape[0] = max_nnz;
    at::Tensor values = at::zeros(value_shape, input._values().options());
    values.narrow(0, 0, nnz).copy_(input._values());
    std::vector<int64_t> all_value_shape = value_shape;
    all_value_shape.insert(all_value_shape.begin(), size_);
    at::Tensor all_indices = at::empty({size_, sparse_dim, max_nnz}, long_options);
    at::Tensor all_values = at::empty(all_value_shape, values.options());
    check(ddlAllGather(indices.data_ptr(), all_indices.data_ptr(), indices.numel(), ddlInt64, comm_), what);
    check(ddlAllGather(values.data_ptr(), all_values.data_ptr(), values.nbytes(), ddlUint8, comm_), what);
    at::Tensor sum;
    for (int r = 0; r < size_; ++r) {
      const int64_t n = all_meta[3 * r + 2];
      at::Tensor part = at::sparse_coo_tensor(all_indices[r].narrow(1, 0, n), all_values[r].narrow(0, 0, n),
                                              sizes, input.options());
      sum = r == 0 ? part : sum + part;
    }
    t.copy_(sum.coalesce());  // copy_ of a sparse tensor takes the sum's indices and values
  };
  return call;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  at::Tensor t = single(tensors, "broadcast");
  const int root = static_cast<int>(opts.rootRank);
  Call call{{t}, {t}};
  call.host = [this, t, root] {
    Staged s = stage(t, /*device_ok=*/false, /*read_input=*/rank_ == root);
    check(ddlBroadcast(s.buf.data_ptr(), s.buf.data_ptr(), s.buf.nbytes(), ddlUint8, root, comm_), "broadcast");
    unstage(s);
  };
  call.stream = [this, t, root](ddlStream_t stream) mutable {
    at::Tensor buf = dense(t);
    check(ddlBroadcastOnStream(buf.data_ptr(), buf.data_ptr(), buf.nbytes(), ddlUint8, root, comm_, stream),
          "broadcast");
    if (!buf.is_same(t)) t.copy_(buf);
  };
  return submit(c10d::OpType::BROADCAST, "ddl:broadcast", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  at::Tensor t = single(tensors, "reduce");
  const auto [type, factor] = reduceTypeOf(t);
  const ddlRedOp_t op = reduceOpOf(opts.reduceOp, t);
  const PreMul pre = preMulOf(opts.reduceOp);
  const int root = static_cast<int>(opts.rootRank);
  Call call{{t}, {t}};
  call.host = [this, t, type = type, factor = factor, op, root, pre] {
    Staged s = stage(t, /*device_ok=*/false, /*read_input=*/true);
    if (pre.active) {
      s.buf = pre.scaled(s.buf);
      s.copy_back = true;
    }
    check(ddlReduce(s.buf.data_ptr(), rank_ == root ? s.buf.data_ptr() : nullptr, s.buf.numel() * factor, type, op,
                    root, comm_),
          "reduce");
    if (rank_ == root) unstage(s);
  };
  call.stream = [this, t, type = type, factor = factor, op, root, pre](ddlStream_t stream) mutable {
    at::Tensor buf = pre.apply(t);
    check(ddlReduceOnStream(buf.data_ptr(), rank_ == root ? buf.data_ptr() : nullptr, buf.numel() * factor, type,
                            op, root, comm_, stream),
          "reduce");
    if (rank_ == root && !buf.is_same(t)) t.copy_(buf);
  };
  return submit(c10d::OpType::REDUCE, "ddl:reduce", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::AllgatherOptions& opts) {
  at::Tensor in = single(inputs, "all_gather");
  std::vector<at::Tensor> outs = groupList(outputs, size_, "all_gather", "output");
  checkSameBytes(outs, in.nbytes(), "all_gather");
  Call call{{in}, outs};
  call.host = [this, in, outs]() mutable {
    at::Tensor src = in.to(at::kCPU).contiguous();
    at::Tensor flat = at::empty({static_cast<int64_t>(src.nbytes() * size_)}, at::TensorOptions().dtype(at::kByte));
    check(ddlAllGather(src.data_ptr(), flat.data_ptr(), src.nbytes(), ddlUint8, comm_), "all_gather");
    for (int r = 0; r < size_; ++r) copyOut(outs[r], flat, r * src.nbytes());
  };
  call.stream = [this, in, outs](ddlStream_t stream) mutable {
    at::Tensor src = dense(in);
    at::Tensor flat = at::empty({static_cast<int64_t>(src.nbytes() * size_)}, src.options().dtype(at::kByte));
    check(ddlAllGatherOnStream(src.data_ptr(), flat.data_ptr(), src.nbytes(), ddlUint8, comm_, stream), "all_gather");
    for (int r = 0; r < size_; ++r) outs[r].copy_(bytesAs(flat, r * src.nbytes(), outs[r]));
  };
  return submit(c10d::OpType::ALLGATHER, "ddl:all_gather", std::move(call));
}

Call ProcessGroupDDL::allgatherIntoTensor(const at::Tensor& output, const at::Tensor& input, const char* what) {
  if (output.nbytes() != input.nbytes() * size_) {
    refuse(std::string(what) + ": the output must hold the group's size (" + std::to_string(size_) +
           ") times the input's " + std::to_string(input.nbytes()) + " bytes, it has " +
           std::to_string(output.nbytes()));
  }
  if (output.scalar_type() != input.scalar_type()) refuse(std::string(what) + ": input and output dtypes differ");
  at::Tensor in = input, out = output;
  Call call{{in}, {out}};
  call.host = [this, in, out, what] {
    at::Tensor src = in.to(at::kCPU).contiguous();
    Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
    check(ddlAllGather(src.data_ptr(), s.buf.data_ptr(), src.nbytes(), ddlUint8, comm_), what);
    unstage(s);
  };
  call.stream = [this, in, out, what](ddlStream_t stream) mutable {
    at::Tensor src = dense(in);
    at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    check(ddlAllGatherOnStream(src.data_ptr(), dst.data_ptr(), src.nbytes(), ddlUint8, comm_, stream), what);
    if (!dst.is_same(out)) out.copy_(dst);
  };
  return call;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::AllgatherOptions& opts) {
  return submit(c10d::OpType::_ALLGATHER_BASE, "ddl:_all_gather_base",
                allgatherIntoTensor(output, input, "_allgather_base"));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const c10d::GatherOptions& opts) {
  at::Tensor in = single(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> outs = rootList(outputs, size_, rank_, root, "gather", "output");
  checkSameBytes(outs, in.nbytes(), "gather");
  Call call{{in}, outs};
  call.host = [this, in, outs, root]() mutable {
    at::Tensor src = in.to(at::kCPU).contiguous();
    at::Tensor flat;
    if (rank_ == root) flat = at::empty({static_cast<int64_t>(src.nbytes() * size_)}, at::TensorOptions().dtype(at::kByte));
    check(ddlGather(src.data_ptr(), rank_ == root ? flat.data_ptr() : nullptr, src.nbytes(), ddlUint8, root, comm_),
          "gather");
    for (int r = 0; r < static_cast<int>(outs.size()); ++r) copyOut(outs[r], flat, r * src.nbytes());
  };
  return submit(c10d::OpType::GATHER, "ddl:gather", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::scatter(std::vector<at::Tensor>& outputs,
                                                        std::vector<std::vector<at::Tensor>>& inputs,
                                                        const c10d::ScatterOptions& opts) {
  at::Tensor out = single(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> ins = rootList(inputs, size_, rank_, root, "scatter", "input");
  checkSameBytes(ins, out.nbytes(), "scatter");
  Call call{ins, {out}};
  call.host = [this, ins, out, root] {
    std::vector<size_t> offsets;
    at::Tensor flat = rank_ == root ? flatBytes(ins, &offsets) : at::Tensor();
    Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
    check(ddlScatter(rank_ == root ? flat.data_ptr() : nullptr, s.buf.data_ptr(), s.buf.nbytes(), ddlUint8, root,
                     comm_),
          "scatter");
    unstage(s);
  };
  return submit(c10d::OpType::SCATTER, "ddl:scatter", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                               std::vector<std::vector<at::Tensor>>& inputs,
                                                               const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  std::vector<at::Tensor> ins = groupList(inputs, size_, "reduce_scatter", "input");
  checkSameBytes(ins, out.nbytes(), "reduce_scatter");
  for (const auto& t : ins) {
    if (t.scalar_type() != out.scalar_type()) refuse("reduce_scatter: input and output dtypes differ");
  }
  const auto [type, factor] = reduceTypeOf(out);
  const ddlRedOp_t op = reduceOpOf(opts.reduceOp, out);
  const PreMul pre = preMulOf(opts.reduceOp);
  Call call{ins, {out}};
  call.host = [this, ins, out, type = type, factor = factor, op, pre] {
    std::vector<size_t> offsets;
    at::Tensor flat = flatBytes(pre.apply(ins), &offsets);
    Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
    check(ddlReduceScatter(flat.data_ptr(), s.buf.data_ptr(), s.buf.numel() * factor, type, op, comm_),
          "reduce_scatter");
    unstage(s);
  };
  call.stream = [this, ins, out, type = type, factor = factor, op, pre](ddlStream_t stream) mutable {
    at::Tensor flat = catBytes(pre.apply(ins));
    at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    check(ddlReduceScatterOnStream(flat.data_ptr(), dst.data_ptr(), dst.numel() * factor, type, op, comm_, stream),
          "reduce_scatter");
    if (!dst.is_same(out)) out.copy_(dst);
  };
  return submit(c10d::OpType::REDUCE_SCATTER, "ddl:reduce_scatter", std::move(call));
}

Call ProcessGroupDDL::reduceScatterTensor(const at::Tensor& output, const at::Tensor& input,
                                          const c10d::ReduceOp& reduce_op, const char* what) {
  if (input.nbytes() != output.nbytes() * size_) {
    refuse(std::string(what) + ": the input must hold the group's size (" + std::to_string(size_) +
           ") times the output's " + std::to_string(output.nbytes()) + " bytes, it has " +
           std::to_string(input.nbytes()));
  }
  if (output.scalar_type() != input.scalar_type()) refuse(std::string(what) + ": input and output dtypes differ");
  const auto [type, factor] = reduceTypeOf(output);
  const ddlRedOp_t op = reduceOpOf(reduce_op, output);
  const PreMul pre = preMulOf(reduce_op);
  at::Tensor in = input, out = output;
  Call call{{in}, {out}};
  call.host = [this, in, out, type = type, factor = factor, op, what, pre] {
    at::Tensor src = pre.apply(in.to(at::kCPU));
    Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
    check(ddlReduceScatter(src.data_ptr(), s.buf.data_ptr(), s.buf.numel() * factor, type, op, comm_), what);
    unstage(s);
  };
  call.stream = [this, in, out, type = type, factor = factor, op, what, pre](ddlStream_t stream) mutable {
    at::Tensor src = pre.apply(in);
    at::Tensor dst = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
    check(ddlReduceScatterOnStream(src.data_ptr(), dst.data_ptr(), dst.numel() * factor, type, op, comm_, stream),
          what);
    if (!dst.is_same(out)) out.copy_(dst);
  };
  return call;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                     const c10d::ReduceScatterOptions& opts) {
  return submit(c10d::OpType::_REDUCE_SCATTER_BASE, "ddl:_reduce_scatter_base",
                reduceScatterTensor(output, input, opts.reduceOp, "_reduce_scatter_base"));
}

Call ProcessGroupDDL::combine(std::vector<Call> calls) {
  Call all;
  bool stream = true;
  std::vector<std::function<void()>> hosts;
  std::vector<std::function<void(ddlStream_t)>> streams;
  for (auto& c : calls) {
    all.inputs.insert(all.inputs.end(), c.inputs.begin(), c.inputs.end());
    all.outputs.insert(all.outputs.end(), c.outputs.begin(), c.outputs.end());
    hosts.push_back(std::move(c.host));
    stream = stream && c.stream;
    streams.push_back(std::move(c.stream));
  }
  all.host = [hosts] {
    for (const auto& h : hosts) h();
  };
  if (stream) {
    all.stream = [streams](ddlStream_t s) {
      for (const auto& f : streams) f(s);
    };
  }
  return all;
}

#if TORCH_DDL_BACKEND
c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                    std::vector<at::Tensor>& inputs,
                                                                    const c10d::AllgatherOptions& opts) {
  // torch's order: outputs[r][i] receives rank r's inputs[i].
  if (outputs.size() != static_cast<size_t>(size_)) {
    refuse("all_gather_coalesced needs one output list per rank (" + std::to_string(size_) + "), got " +
           std::to_string(outputs.size()));
  }
  for (size_t r = 0; r < outputs.size(); ++r) {
    if (outputs[r].size() != inputs.size()) {
      refuse("all_gather_coalesced: the output list of rank " + std::to_string(r) + " has " +
             std::to_string(outputs[r].size()) + " tensors, one per input (" + std::to_string(inputs.size()) +
             ") is needed");
    }
  }
  // Each input's gather into a flat buffer, then copied into every rank's list: as allgather, per input.
  std::vector<Call> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<at::Tensor> outs;
    for (const auto& list : outputs) outs.push_back(list[i]);
    checkSameBytes(outs, inputs[i].nbytes(), "all_gather_coalesced");
    at::Tensor in = inputs[i];
    const auto options = in.options().dtype(at::kByte);
    at::Tensor flat = at::empty({static_cast<int64_t>(in.nbytes() * size_)}, options);
    Call c = allgatherIntoTensor(flat, in.view({-1}).view(at::kByte), "allgather_coalesced");
    auto copy_out = [outs, flat, n = in.nbytes()]() mutable {
      for (size_t r = 0; r < outs.size(); ++r) outs[r].copy_(bytesAs(flat, r * n, outs[r]));
    };
    c.host = [body = std::move(c.host), copy_out, outs]() mutable {
      body();
      copy_out();
      for (const auto& t : outs) syncDevice(t);
    };
    c.stream = [body = std::move(c.stream), copy_out](ddlStream_t s) mutable {
      body(s);
      copy_out();
    };
    c.outputs.insert(c.outputs.end(), outs.begin(), outs.end());
    calls.push_back(std::move(c));
  }
  return submit(c10d::OpType::ALLGATHER_COALESCED, "ddl:allgather_coalesced", combine(std::move(calls)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                std::vector<at::Tensor>& inputs,
                                                                                const c10d::AllgatherOptions& opts) {
  if (outputs.size() != inputs.size()) refuse("allgather_into_tensor_coalesced needs one output per input");
  std::vector<Call> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    calls.push_back(allgatherIntoTensor(outputs[i], inputs[i], "allgather_into_tensor_coalesced"));
  }
  return submit(c10d::OpType::COALESCED, "ddl:allgather_into_tensor_coalesced", combine(std::move(calls)));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  if (outputs.size() != inputs.size()) refuse("reduce_scatter_tensor_coalesced needs one output per input");
  std::vector<Call> calls;
  for (size_t i = 0; i < inputs.size(); ++i) {
    calls.push_back(reduceScatterTensor(outputs[i], inputs[i], opts.reduceOp, "reduce_scatter_tensor_coalesced"));
  }
  return submit(c10d::OpType::COALESCED, "ddl:reduce_scatter_tensor_coalesced", combine(std::move(calls)));
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_split_sizes,
                                                              std::vector<int64_t>& input_split_sizes,
                                                              const c10d::AllToAllOptions& opts) {
  // Splits count rows (dim 0); no splits: equal parts.
  auto counts = [&](const at::Tensor& t, const std::vector<int64_t>& splits, const char* which) {
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    const size_t row_bytes = rows > 0 ? t.nbytes() / rows : 0;
    std::vector<size_t> bytes(size_), displs(size_);
    if (splits.empty()) {
      if (rows % size_ != 0) {
        refuse(std::string("all_to_all_single: the ") + which + "'s first dimension (" + std::to_string(rows) +
               ") does not split evenly over " + std::to_string(size_) + " ranks: pass split sizes");
      }
      std::fill(bytes.begin(), bytes.end(), rows / size_ * row_bytes);
    } else {
      if (splits.size() != static_cast<size_t>(size_) ||
          std::accumulate(splits.begin(), splits.end(), int64_t{0}) != rows) {
        refuse(std::string("all_to_all_single: the ") + which + " split sizes must be " + std::to_string(size_) +
               " numbers adding up to the first dimension (" + std::to_string(rows) + ")");
      }
      for (int r = 0; r < size_; ++r) bytes[r] = static_cast<size_t>(splits[r]) * row_bytes;
    }
    for (int r = 1; r < size_; ++r) displs[r] = displs[r - 1] + bytes[r - 1];
    return std::make_pair(bytes, displs);
  };
  if (output.scalar_type() != input.scalar_type()) refuse("all_to_all_single: input and output dtypes differ");
  auto [sc, sd] = counts(input, input_split_sizes, "input");
  auto [rc, rd] = counts(output, output_split_sizes, "output");
  at::Tensor in = input, out = output;
  Call call{{in}, {out}};
  call.host = [this, in, out, sc = sc, sd = sd, rc = rc, rd = rd] {
                   at::Tensor src = in.to(at::kCPU).contiguous();
                   Staged s = stage(out, /*device_ok=*/false, /*read_input=*/false);
                   check(ddlAllToAllv(src.data_ptr(), sc.data(), sd.data(), s.buf.data_ptr(), rc.data(), rd.data(),
                                      ddlUint8, comm_),
                         "all_to_all_single");
                   unstage(s);
  };
  return submit(c10d::OpType::ALLTOALL_BASE, "ddl:all_to_all", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  if (outputs.size() != static_cast<size_t>(size_) || inputs.size() != static_cast<size_t>(size_)) {
    refuse("all_to_all needs " + std::to_string(size_) + " input and " + std::to_string(size_) +
           " output tensors (the group's size)");
  }
  std::vector<at::Tensor> ins = inputs, outs = outputs;
  Call call{ins, outs};
  call.host = [this, ins, outs]() mutable {
    std::vector<size_t> sd, rd, sc, rc;
    at::Tensor src = flatBytes(ins, &sd);
    size_t total = 0;
    for (const auto& t : outs) {
      rd.push_back(total);
      rc.push_back(t.nbytes());
      total += t.nbytes();
    }
    for (const auto& t : ins) sc.push_back(t.nbytes());
    at::Tensor dst = at::empty({static_cast<int64_t>(total)}, at::TensorOptions().dtype(at::kByte));
    check(ddlAllToAllv(src.data_ptr(), sc.data(), sd.data(), dst.data_ptr(), rc.data(), rd.data(), ddlUint8, comm_),
          "all_to_all");
    for (int r = 0; r < size_; ++r) copyOut(outs[r], dst, rd[r]);
  };
  return submit(c10d::OpType::ALLTOALL, "ddl:all_to_all", std::move(call));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::barrier(const c10d::BarrierOptions& opts) {
  Call call;
  call.host = [this] { check(ddlBarrier(comm_), "barrier"); };
  return submit(c10d::OpType::BARRIER, "ddl:barrier", std::move(call));
}

// ---- point-to-point ----

namespace {
// monitoredBarrier's messages: two tags per call, from the top of libddl's tag range down, kept from users.
constexpr int kMonitoredBarrierTags = 1 << 20;
constexpr int kFirstReservedTag = DDL_MAX_TAG - kMonitoredBarrierTags + 1;
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::p2p(std::vector<at::Tensor>& tensors, int peer, int tag,
                                                    bool is_recv) {
  const at::Tensor& t = single(tensors, is_recv ? "recv" : "send");
  if (closed_.load()) refuse("the process group was shut down");
  if (!(is_recv && peer == DDL_ANY_SOURCE) && (peer < 0 || peer >= size_ || peer == rank_)) {
    refuse(std::string(is_recv ? "recv: src " : "send: dst ") + std::to_string(peer) +
           " is not another rank of this group of " + std::to_string(size_));
  }
  if (tag < 0 || tag >= kFirstReservedTag) {
    refuse(std::string(is_recv ? "recv" : "send") + ": tag " + std::to_string(tag) + " is not between 0 and " +
           std::to_string(kFirstReservedTag - 1) + " (the tags above are torch_ddl's own)");
  }
  reapP2P(false);
  auto state = std::make_shared<P2PState>();
  state->tensor = t;
  state->is_recv = is_recv;
  syncDevice(t);
  Staged s = stage(t, /*device_ok=*/false, /*read_input=*/!is_recv);
  state->staged = s.buf;
  state->copy_back = is_recv && s.copy_back;
  ddlResult_t r = is_recv ? ddlIrecvTagged(s.buf.data_ptr(), s.buf.nbytes(), ddlUint8, peer, tag, comm_,
                                           &state->source, &state->request)
                          : ddlIsendTagged(s.buf.data_ptr(), s.buf.nbytes(), ddlUint8, peer, tag, comm_,
                                           &state->request);
  check(r, is_recv ? "recv" : "send");
  {
    std::lock_guard<std::mutex> lk(p2p_mu_);
    p2p_pending_.push_back(state);
  }
  return c10::make_intrusive<P2PWork>(rank_, is_recv ? c10d::OpType::RECV : c10d::OpType::SEND, std::move(state));
}

std::shared_ptr<P2PState> ProcessGroupDDL::controlMessage(int peer, int tag, bool is_recv) {
  auto state = std::make_shared<P2PState>();
  state->is_recv = is_recv;
  state->tensor = at::full({1}, static_cast<int64_t>(rank_), at::TensorOptions().dtype(at::kLong));
  state->staged = state->tensor;
  void* buf = state->tensor.data_ptr();
  check(is_recv ? ddlIrecvTagged(buf, 1, ddlInt64, peer, tag, comm_, &state->source, &state->request)
                : ddlIsendTagged(buf, 1, ddlInt64, peer, tag, comm_, &state->request),
        "monitored_barrier");
  std::lock_guard<std::mutex> lk(p2p_mu_);
  p2p_pending_.push_back(state);
  return state;
}

void ProcessGroupDDL::reapP2P(bool wait_all) {
  std::lock_guard<std::mutex> lk(p2p_mu_);
  for (auto it = p2p_pending_.begin(); it != p2p_pending_.end();) {
    if ((*it)->settle(wait_all)) {
      it = p2p_pending_.erase(it);
    } else {
      ++it;
    }
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::send(std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return p2p(tensors, dst_rank, tag, /*is_recv=*/false);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::recv(std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  return p2p(tensors, src_rank, tag, /*is_recv=*/true);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDDL::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return p2p(tensors, DDL_ANY_SOURCE, tag, /*is_recv=*/true);
}

// ---- monitored_barrier ----
//
// gloo's protocol and messages (torch's tests match them): every other rank sends rank 0 a message and waits
// for its answer; rank 0 waits for each rank's message within what is left of the timeout (or, waitAllRanks,
// the whole timeout for each, to name every rank that did not come), then answers them all. Only rank 0
// enforces the timeout, so that it is rank 0 that names the missing rank; the others wait up to the group's
// timeout (libddl's bound on every receive). A rank that fails leaves its receives posted: libddl fails them
// at the group's timeout or teardown, and the next call uses other tags.

namespace {
std::string joinRanks(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}
}  // namespace

void ProcessGroupDDL::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  if (closed_.load()) refuse("the process group was shut down");
  const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  const uint32_t call = monitored_barriers_++;
  const int to_root = kFirstReservedTag + static_cast<int>((2 * call) % kMonitoredBarrierTags);
  const int from_root = to_root + 1;
  if (rank_ != 0) {
    try {
      auto sent = controlMessage(0, to_root, /*is_recv=*/false);
      auto answer = controlMessage(0, from_root, /*is_recv=*/true);
      for (auto* st : {&sent, &answer}) {
        (*st)->settle(/*wait=*/true);
        if ((*st)->result != ddlSuccess) throw std::runtime_error((*st)->error);
      }
    } catch (const std::exception& e) {
      throw std::runtime_error("Rank " + std::to_string(rank_) +
                               " successfully reached monitoredBarrier, but received errors while waiting for "
                               "send/recv from rank 0. Please check rank 0 logs for faulty rank.\n Original "
                               "exception: \n" + std::string(e.what()));
    }
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  // Waits for each message in rank order; returns the ranks that answered.
  auto waitLoop = [&](const std::vector<std::pair<int, std::shared_ptr<P2PState>>>& messages) {
    std::vector<int> answered;
    for (const auto& [peer, state] : messages) {
      const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                              start);
      const auto left = waitAllRanks ? timeout : timeout - spent;
      if (!waitAllRanks && left.count() <= 0) {  // gloo's rule: no time left is a timeout of rank 0
        throw std::runtime_error(
            "Rank 0 timed out in monitoredBarrier after " + std::to_string(timeout.count()) + " ms.\n" +
            (answered.empty() ? std::string("No ranks successfully processed in monitoredBarrier.")
                              : "Successfully processed ranks: " + joinRanks(answered)));
      }
      const auto end = std::chrono::steady_clock::now() + left;
      bool done = state->settle(false);
      while (!done && std::chrono::steady_clock::now() < end) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        done = state->settle(false);
      }
      if (done && state->result == ddlSuccess) {
        answered.push_back(peer);
        continue;
      }
      const std::string error = "[Rank 0]: Rank " + std::to_string(peer) + " failed to pass monitoredBarrier in " +
                                std::to_string(timeout.count()) + " ms";
      if (!waitAllRanks) {
        throw std::runtime_error(error + "\n Original exception: \n" +
                                 (done ? state->error : "ddl: no message within the timeout"));
      }
    }
    if (waitAllRanks && answered.size() != messages.size()) {
      std::vector<int> failed;
      for (const auto& m : messages) {
        if (std::find(answered.begin(), answered.end(), m.first) == answered.end()) failed.push_back(m.first);
      }
      throw std::runtime_error("[Rank 0]: Ranks " + joinRanks(failed) + " failed to pass monitoredBarrier in " +
                               std::to_string(timeout.count()) + " ms");
    }
  };
  std::vector<std::pair<int, std::shared_ptr<P2PState>>> arrivals, answers;
  for (int r = 1; r < size_; ++r) arrivals.emplace_back(r, controlMessage(r, to_root, /*is_recv=*/true));
  waitLoop(arrivals);
  // Everyone came: release them all, so that either every rank passes or none does.
  for (int r = 1; r < size_; ++r) answers.emplace_back(r, controlMessage(r, from_root, /*is_recv=*/false));
  waitLoop(answers);
}

#if TORCH_DDL_NAMED_GROUP
NamedProcessGroup::NamedProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                     c10::intrusive_ptr<ProcessGroupDDL> backend)
    : c10d::ProcessGroup(store, rank, size), backend_(std::move(backend)) {
  for (auto device : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
    setBackend(device, BackendType::CUSTOM, backend_);
  }
  setDefaultBackend(BackendType::CUSTOM);
}
#endif

}  // namespace torch_ddl
