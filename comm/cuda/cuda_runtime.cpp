// CUDA's DeviceRuntime (device_runtime.h): streams, events, pinned and device memory, the reduction kernels
// of reduce_kernels.cu, and CUDA IPC. Host code only.
//
// Streams are created blocking (not cudaStreamNonBlocking), so the first work queued also waits for what the
// application queued on the legacy default stream; data written on other streams must be complete when the
// collective is called, as for any host API.
//
// IPC: an exported handle carries the process id and the pointer next to cudaIpcMemHandle_t. Ranks that are
// threads of one process (where cudaIpcOpenMemHandle refuses a handle of its own process) use the pointer
// itself, with peer access enabled where the memory is on another device. Node keys guarantee that the
// members of a node share a PID namespace, so the process id says which case applies.
#include <cuda.h>  // the driver's enums only: its functions come through driverEntryPoint
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "device/device_runtime.h"
#include "device/node_kernel.h"
#include "device_reduce.h"
#include "error.h"

namespace ddl {
namespace {

std::string describe(cudaError_t e) {
  return std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")";
}

[[noreturn]] void cudaFail(cudaError_t e, const std::string& what) {
  cudaGetLastError();  // a non-sticky error must not resurface in the caller's next check
  fail(ddlCudaError, "CUDA: " + what + " failed: " + describe(e));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) cudaFail(e, what);
}

// A function of the driver the runtime loaded, by name (libddl does not link libcuda); null where missing.
void* driverEntryPoint(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
#if CUDART_VERSION >= 12050
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
#else
  if (cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found) != cudaSuccess ||
#endif
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    fn = nullptr;
  }
  return fn;
}

struct IpcRecord {
  uint32_t magic;
  int32_t pid;
  uint64_t ptr;
  cudaIpcMemHandle_t handle;
};
constexpr uint32_t kIpcMagic = 0x64646c31;  // "ddl1"

// Makes dev the calling thread's device for a scope (the stream-ordered calls act on a given device whatever
// the caller's current one is).
class OnDevice {
 public:
  explicit OnDevice(int dev) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    if (dev >= 0 && prev_ != dev) check(cudaSetDevice(dev), "cudaSetDevice");
  }
  ~OnDevice() {
    int now = -1;
    if (prev_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != prev_) cudaSetDevice(prev_);
    cudaGetLastError();
  }
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int prev_ = -1;
};

cudaStream_t asStream(void* s) { return static_cast<cudaStream_t>(s); }

cudaEvent_t asEvent(void* e) { return static_cast<cudaEvent_t>(e); }

class CudaRuntime final : public DeviceRuntime {
 public:
  ~CudaRuntime() override {
    drain();
    destroy();
  }

  const char* name() const override { return "CUDA"; }
  int deviceOf(const void* p) override { return cuda::deviceOf(p); }

  void bind(int dev) override {
    int now = -1;
    check(cudaGetDevice(&now), "cudaGetDevice");
    if (now != dev) check(cudaSetDevice(dev), "cudaSetDevice");
    if (dev_ == dev) return;
    destroy();
    dev_ = dev;  // so that destroy() frees what a failure below leaves half made
    try {
      for (auto& s : streams_) check(cudaStreamCreateWithFlags(&s, cudaStreamDefault), "cudaStreamCreate");
      for (auto& e : events_) check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    } catch (...) {
      destroy();
      throw;
    }
  }

  int current() noexcept override {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      cudaGetLastError();
      return -1;
    }
    return dev;
  }
  void setCurrent(int dev) noexcept override {
    int now = -1;
    if (dev >= 0 && cudaGetDevice(&now) == cudaSuccess && now != dev) cudaSetDevice(dev);
    cudaGetLastError();
  }

  void copy(int q, void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream(q)), "cudaMemcpyAsync");
  }
  void reduce(int q, void* dst, const void* a, const void* b, size_t count, ddlDataType_t type,
              ddlRedOp_t op) override {
    check(cuda::reduce(dst, a, b, count, type, op, stream(q)), "the reduction kernel's launch");
  }
  void finishAvg(int q, void* buf, size_t count, ddlDataType_t type, int divisor) override {
    check(cuda::finishAvg(buf, count, type, divisor, stream(q)), "the average kernel's launch");
  }
  void record(int q, int e) override { check(cudaEventRecord(event(e), stream(q)), "cudaEventRecord"); }
  void await(int q, int e) override {
    check(cudaStreamWaitEvent(stream(q), event(e), 0), "cudaStreamWaitEvent");
  }
  void sync(int e) override { check(cudaEventSynchronize(event(e)), "waiting for a device copy or kernel"); }
  void syncQueue(int q) override {
    check(cudaStreamSynchronize(stream(q)), "waiting for a device copy or kernel");
  }
  void drain() noexcept override {
    for (int q = 0; q < kQueues; ++q)
      if (streams_[q]) cudaStreamSynchronize(streams_[q]);
    cudaGetLastError();
  }

  void* allocHost(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable);
    if (e != cudaSuccess)
      cudaFail(e, "cudaHostAlloc of " + std::to_string(bytes) + " bytes of pinned memory");
    return p;
  }
  void freeHost(void* p) noexcept override {
    cudaFreeHost(p);
    cudaGetLastError();
  }
  void* allocDevice(size_t bytes) override {
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, std::max<size_t>(bytes, 1));
    if (e != cudaSuccess) cudaFail(e, "cudaMalloc of " + std::to_string(bytes) + " bytes");
    return p;
  }
  void freeDevice(void* p) noexcept override {
    cudaFree(p);
    cudaGetLastError();
  }

  std::string exportMemory(void* p) override {
    IpcRecord r{};
    r.magic = kIpcMagic;
    r.pid = static_cast<int32_t>(getpid());
    r.ptr = reinterpret_cast<uint64_t>(p);
    check(cudaIpcGetMemHandle(&r.handle, p), "cudaIpcGetMemHandle");
    return std::string(reinterpret_cast<const char*>(&r), sizeof r);
  }
  bool allocationOf(const void* p, void** base, size_t* bytes) override {
    // cuMemGetAddressRange, from the driver the runtime loaded.
    using Range = int (*)(unsigned long long*, size_t*, unsigned long long);
    static const Range range = reinterpret_cast<Range>(driverEntryPoint("cuMemGetAddressRange"));
    unsigned long long b = 0;
    size_t n = 0;
    if (!range || range(&b, &n, reinterpret_cast<unsigned long long>(p)) != 0) return false;
    *base = reinterpret_cast<void*>(b);
    *bytes = n;
    return true;
  }
  uint64_t allocationId(const void* p) override {
    // cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID), from the driver the runtime loaded.
    using Attribute = int (*)(void*, int, unsigned long long);
    static const Attribute attribute = reinterpret_cast<Attribute>(driverEntryPoint("cuPointerGetAttribute"));
    unsigned long long id = 0;
    if (!attribute ||
        attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, reinterpret_cast<unsigned long long>(p)) != 0) {
      return 0;
    }
    return id;
  }
  void* importMemory(const std::string& bytes) override {
    IpcRecord r{};
    if (bytes.size() != sizeof r) fail(ddlCudaError, "CUDA: an IPC handle of the wrong size");
    std::memcpy(&r, bytes.data(), sizeof r);
    if (r.magic != kIpcMagic) fail(ddlCudaError, "CUDA: not an IPC handle of this libddl");
    if (r.pid == static_cast<int32_t>(getpid())) {
      // Our own process: the pointer works as it is (unified addressing), given peer access to its device.
      void* p = reinterpret_cast<void*>(r.ptr);
      const int owner = cuda::deviceOf(p);
      if (owner >= 0 && owner != dev_) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(owner, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled)
          cudaFail(e, "cudaDeviceEnablePeerAccess");
        cudaGetLastError();
      }
      return p;
    }
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, r.handle, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
    opened_.insert(p);
    return p;
  }
  void closeMemory(void* p) noexcept override {
    if (opened_.erase(p)) cudaIpcCloseMemHandle(p);
    cudaGetLastError();
  }

  int streamDevice(void* stream) override {
    int dev = -1;
    if (!stream) {
      check(cudaGetDevice(&dev), "cudaGetDevice");
      return dev;
    }
    // CUDA refuses cudaStreamGetDevice on a stream being captured (seen on an H200, CUDA 13): -1 then.
    if (capturing(stream)) return -1;
    check(cudaStreamGetDevice(asStream(stream), &dev), "cudaStreamGetDevice (is the stream valid?)");
    return dev;
  }
  bool capturing(void* stream) override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(asStream(stream), &st), "cudaStreamIsCapturing");
    return st != cudaStreamCaptureStatusNone;
  }
  int relaxCapture() override {
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    check(cudaThreadExchangeStreamCaptureMode(&mode), "cudaThreadExchangeStreamCaptureMode");
    return static_cast<int>(mode);
  }
  void restoreCapture(int mode) noexcept override {
    auto m = static_cast<cudaStreamCaptureMode>(mode);
    cudaThreadExchangeStreamCaptureMode(&m);
    cudaGetLastError();
  }
  void* newStream(int dev) override {
    OnDevice on(dev);
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  }
  void deleteStream(void* stream) noexcept override {
    if (stream) cudaStreamDestroy(asStream(stream));
    cudaGetLastError();
  }
  void* newEvent(int dev) override {
    OnDevice on(dev);
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }
  void deleteEvent(void* event) noexcept override {
    if (event) cudaEventDestroy(asEvent(event));
    cudaGetLastError();
  }
  void recordOn(void* stream, void* event) override {
    check(cudaEventRecord(asEvent(event), asStream(stream)), "cudaEventRecord");
  }
  void waitOn(void* stream, void* event) override {
    check(cudaStreamWaitEvent(asStream(stream), asEvent(event), 0), "cudaStreamWaitEvent");
  }
  bool eventDone(void* event) override {
    const cudaError_t e = cudaEventQuery(asEvent(event));
    if (e == cudaErrorNotReady) {
      cudaGetLastError();
      return false;
    }
    check(e, "the stream's earlier work");
    return true;
  }
  void waitForStream(void* stream, int dev, const std::function<bool()>& aborted) override {
    // An event polled rather than cudaStreamSynchronize, so that an abort ends the wait.
    void* done = newEvent(dev);
    try {
      recordOn(stream, done);
      for (int i = 0; !eventDone(done); ++i) {
        if (aborted()) fail(ddlAborted, "communicator aborted by ddlCommAbort");
        if (i < 64) {
          std::this_thread::yield();  // briefly at full speed: the stream is often there already
        } else {
          std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
      }
    } catch (...) {
      deleteEvent(done);
      throw;
    }
    deleteEvent(done);
  }
  void* allocMapped(size_t bytes, void** device) override {
    void* p = nullptr;
    check(cudaHostAlloc(&p, std::max<size_t>(bytes, 1), cudaHostAllocPortable | cudaHostAllocMapped),
          "cudaHostAlloc (mapped)");
    std::memset(p, 0, bytes);
    const cudaError_t e = cudaHostGetDevicePointer(device, p, 0);
    if (e != cudaSuccess) {
      cudaFreeHost(p);
      cudaFail(e, "cudaHostGetDevicePointer");
    }
    return p;
  }
  void freeMapped(void* host) noexcept override { freeHost(host); }
  void zeroDevice(void* p, size_t bytes) override {
    // On a stream of its own and waiting for it alone: a device-wide synchronisation would also wait for
    // other ranks of this process (threads) whose kernels may wait on the GPU for this rank.
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
    check(e, "cudaMemsetAsync");
  }
  std::string deviceIdentity(int dev) override {
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
    return std::string(prop.uuid.bytes, sizeof prop.uuid.bytes);
  }
  bool sharedByMps(int dev) override {
    int on = 0;
    if (cudaDeviceGetAttribute(&on, cudaDevAttrMpsEnabled, dev) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return on != 0;
  }
  int nodeKernelCapacity(int dev) override {
    OnDevice on(dev);
    return cuda::nodeKernelResidentBlocks();
  }
  void launchNode(void* stream, int dev, const node::Args& args) override {
    OnDevice on(dev);
    check(cuda::launchNodeCollective(args, asStream(stream)), "the node kernel's launch");
  }

 private:
  cudaStream_t stream(int q) const {
    DDL_ASSERT(dev_ >= 0 && q >= 0 && q < kQueues);
    return streams_[q];
  }
  cudaEvent_t event(int e) const {
    DDL_ASSERT(dev_ >= 0 && e >= 0 && e < kEvents);
    return events_[e];
  }
  // Frees the streams and events, best effort (at process exit the runtime may be gone already).
  void destroy() noexcept {
    if (dev_ < 0) return;
    int prev = -1;
    const bool switched =
        cudaGetDevice(&prev) == cudaSuccess && prev != dev_ && cudaSetDevice(dev_) == cudaSuccess;
    for (auto& s : streams_) {
      if (s) cudaStreamDestroy(s);
      s = nullptr;
    }
    for (auto& e : events_) {
      if (e) cudaEventDestroy(e);
      e = nullptr;
    }
    if (switched) cudaSetDevice(prev);
    cudaGetLastError();
    dev_ = -1;
  }

  int dev_ = -1;
  // The queues: blocking streams (they also wait for the legacy stream's earlier work).
  cudaStream_t streams_[kQueues] = {};
  cudaEvent_t events_[kEvents] = {};
  std::set<void*> opened_;  // what cudaIpcOpenMemHandle opened, to close
};

}  // namespace

std::unique_ptr<DeviceRuntime> makeCudaRuntime() {
  if (cuda::deviceCount() == 0) return nullptr;
  return std::make_unique<CudaRuntime>();
}

}  // namespace ddl
