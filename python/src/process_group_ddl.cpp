// process_group_ddl.cpp: ProcessGroupDDL's life (process_group_ddl.h): rendezvous through torch's store, the
// communicator, the worker thread and its queue (the one order every rank issues its calls in), the path each
// call takes (submit), teardown; and NamedProcessGroup. The collectives themselves are in collectives.cpp and
// point_to_point.cpp, the two paths in staged.cpp and stream_ordered.cpp.
#include "process_group_ddl.h"

#include <Python.h>
#include <sys/prctl.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <utility>

#include "arguments.h"
#include "store_adapter.h"

namespace torch_ddl {
namespace {

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

ddlConfig_t ProcessGroupDDL::config(std::chrono::milliseconds timeout) {
  ddlConfig_t config = DDL_CONFIG_INITIALIZER;
  const auto ms = timeout.count();
  config.timeoutMs = ms > 0 && ms < INT32_MAX ? static_cast<int>(ms) : INT32_MAX;
  // The worker's waits must leave the core to the training step's own threads (the backward pass runs beside
  // them): poll briefly, then sleep. DDL_WAIT set by the user decides instead.
  const char* wait = std::getenv("DDL_WAIT");
  config.waitMode = wait && *wait ? ddlWaitAuto : ddlWaitShare;
  return config;
}

ProcessGroupDDL::ProcessGroupDDL(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout)
    : GroupBase(rank, size),
      blocking_(envFlag("TORCH_DDL_BLOCKING")),
      timeout_(timeout),
      adapter_(std::make_shared<StoreAdapter>(StoreAdapter{store, {}})) {
  ddlStore_t api = adapter_->api();
  const ddlConfig_t cfg = config(timeout);
  if (ddlCommInitRankWithStore(&comm_, size, rank, &api, &cfg) != ddlSuccess) {
    throw std::runtime_error(std::string("ddl: cannot create the communicator of rank ") + std::to_string(rank) +
                             " of " + std::to_string(size) + ": " + ddlGetLastError(nullptr));
  }
  start();
}

ProcessGroupDDL::ProcessGroupDDL(ddlComm_t comm, int rank, int size, std::shared_ptr<StoreAdapter> adapter,
                                 std::chrono::milliseconds timeout)
    : GroupBase(rank, size),
      comm_(comm),
      blocking_(envFlag("TORCH_DDL_BLOCKING")),
      timeout_(timeout),
      adapter_(std::move(adapter)) {
  start();
}

void ProcessGroupDDL::start() {
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

#if TORCH_DDL_SHUTDOWN
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
    if (queue_.empty()) idle_cv_.notify_all();
  }
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
