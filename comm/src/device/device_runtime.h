// DeviceRuntime: what libddl's device paths (device_path.h) need of a GPU runtime, behind an interface so
// that the paths build, and are tested, without CUDA.
//
// The implementation is CUDA's (comm/cuda/cuda_runtime.cpp, builds with the CUDA Toolkit). Tests also use a
// host-memory emulation (tests/unit/fake_device.h) whose queues run only when something waits for them, so a
// missing wait shows up as wrong data rather than passing by luck.
//
// Work goes to numbered in-order queues (CUDA streams); completion is tracked by numbered events. Both live
// on the device given to bind() and are made again when it changes. Copies take any two pointers (host
// pageable, pinned or device, cudaMemcpyDefault); reductions need device or pinned memory.
//
// Threads: an instance belongs to one rank of one communicator. The queue calls (bind .. importMemory) are
// made by one thread at a time; the stream-ordered calls (streamDevice .. launchNode) touch no queue and may
// be made by the thread that calls the communicator while the communicator's own thread uses the queues.
// Every call that can fail throws ddl::Error with ddlCudaError and names the call.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ddl/ddl.h"

namespace ddl {

namespace node {
struct Args;
}

class DeviceRuntime {
 public:
  static constexpr int kQueues = 2;
  static constexpr int kEvents = 8;

  virtual ~DeviceRuntime() = default;

  // For messages: "CUDA", "emulated".
  virtual const char* name() const = 0;
  // The device holding p, or -1 for host memory (pageable, pinned or managed), null, or any pointer where
  // there is no usable device. Never fails.
  virtual int deviceOf(const void* p) = 0;
  // Makes dev the calling thread's device and the queues' and events'.
  virtual void bind(int dev) = 0;
  // The calling thread's current device (-1 when none can be asked), and setting it back: what the device
  // path restores before it returns to the application (DevicePath::KeepDevice). Never fail.
  virtual int current() noexcept = 0;
  virtual void setCurrent(int dev) noexcept = 0;

  // Enqueue on queue (0 .. kQueues-1).
  virtual void copy(int queue, void* dst, const void* src, size_t bytes) = 0;
  // dst[i] = a[i] op b[i]; dst may be a or b exactly (device_reduce.h).
  virtual void reduce(int queue, void* dst, const void* a, const void* b, size_t count, ddlDataType_t type,
                      ddlRedOp_t op) = 0;
  // buf[i] /= divisor: ddlAvg's last step.
  virtual void finishAvg(int queue, void* buf, size_t count, ddlDataType_t type, int divisor) = 0;
  // event (0 .. kEvents-1) completes when the work queued so far on queue has.
  virtual void record(int queue, int event) = 0;
  // Work queued on queue from now on waits for event, without the host waiting.
  virtual void await(int queue, int event) = 0;
  // The host waits.
  virtual void sync(int event) = 0;
  virtual void syncQueue(int queue) = 0;
  // After a failure: waits for every queue, swallowing errors, so that nothing still writes to memory the
  // caller is about to reuse or free.
  virtual void drain() noexcept = 0;

  // Pinned host memory (device copies run at full speed, kernels may read it); device memory on the bound
  // device.
  virtual void* allocHost(size_t bytes) = 0;
  virtual void freeHost(void* p) noexcept = 0;
  virtual void* allocDevice(size_t bytes) = 0;
  virtual void freeDevice(void* p) noexcept = 0;

  // Device memory shared with the other ranks of the node (CUDA IPC): exportMemory's bytes, given to
  // importMemory in another process (or thread) of this node, map the same memory there.
  virtual std::string exportMemory(void* device_ptr) = 0;
  // The device allocation holding p: its base and size (false where p is in none, or the runtime cannot
  // say). exportMemory takes the base.
  virtual bool allocationOf(const void* p, void** base, size_t* bytes) = 0;
  // An id of the device allocation holding p that no other allocation of this process ever has (CUDA:
  // CU_POINTER_ATTRIBUTE_BUFFER_ID), so that memory freed and allocated again at the same address is told
  // apart; 0 where p is in none, or the runtime cannot say. Never fails.
  virtual uint64_t allocationId(const void* p) = 0;
  virtual void* importMemory(const std::string& handle) = 0;
  virtual void closeMemory(void* p) noexcept = 0;

  // ---- Stream-ordered work (device/stream_path.h) ----
  // A stream is the application's (a cudaStream_t; null: the legacy default stream) or one of newStream's.
  // The device a stream works on (the null stream: the calling thread's current device); -1 while the stream
  // is being captured into a CUDA graph (CUDA does not say it then).
  virtual int streamDevice(void* stream) = 0;
  // Whether work queued on stream now is being captured into a CUDA graph.
  virtual bool capturing(void* stream) = 0;
  // Puts the calling thread in the relaxed capture mode and returns its mode before, for restoreCapture.
  // A stream-ordered collective enqueued during a capture asks questions the capture has no part in (which
  // device a pointer or a stream is on); in the global and thread-local modes CUDA may count such calls as
  // unsafe and invalidate the caller's capture.
  virtual int relaxCapture() { return 0; }
  virtual void restoreCapture(int mode) noexcept { (void)mode; }
  // relaxCapture for a scope.
  class RelaxedCapture {
   public:
    explicit RelaxedCapture(DeviceRuntime& rt) : rt_(rt), mode_(rt.relaxCapture()) {}
    ~RelaxedCapture() { rt_.restoreCapture(mode_); }
    RelaxedCapture(const RelaxedCapture&) = delete;
    RelaxedCapture& operator=(const RelaxedCapture&) = delete;

   private:
    DeviceRuntime& rt_;
    int mode_;
  };
  // A stream of libddl's own on dev, which does not wait for the legacy default stream.
  virtual void* newStream(int dev) = 0;
  virtual void deleteStream(void* stream) noexcept = 0;
  virtual void* newEvent(int dev) = 0;
  virtual void deleteEvent(void* event) noexcept = 0;
  // event completes when the work queued on stream so far has.
  virtual void recordOn(void* stream, void* event) = 0;
  // Work queued on stream from now on waits for event, without the host waiting.
  virtual void waitOn(void* stream, void* event) = 0;
  // Whether event has completed (the host does not wait).
  virtual bool eventDone(void* event) = 0;
  // Returns once the work queued on stream (on dev) so far is done; throws ddlAborted once aborted() says
  // so (it is asked while waiting).
  virtual void waitForStream(void* stream, int dev, const std::function<bool()>& aborted) = 0;
  // Pinned host memory that kernels read and write (the abort and error words of the node kernel): the
  // host's pointer, *device the kernels' view of it. Zeroed.
  virtual void* allocMapped(size_t bytes, void** device) = 0;
  virtual void freeMapped(void* host) noexcept = 0;
  // Sets bytes of device memory on the bound device, and waits.
  virtual void zeroDevice(void* p, size_t bytes) = 0;
  // The physical device dev is: two ranks get the same string exactly when they share one GPU (CUDA: its
  // UUID). And whether the MPS daemon serves the contexts made on it (then the kernels of several processes
  // run at once on it; without MPS they take turns).
  virtual std::string deviceIdentity(int dev) = 0;
  virtual bool sharedByMps(int dev) = 0;
  // The process the contexts belong to (ranks that are threads of one process share a context, whose kernels
  // run at once without MPS).
  virtual int processId() { return static_cast<int>(::getpid()); }
  // How many of the node kernel's CTAs dev keeps resident at once (multiprocessors x CTAs per
  // multiprocessor): ranks sharing a GPU need all their CTAs resident together, since they wait for each
  // other.
  virtual int nodeKernelCapacity(int dev) = 0;
  // Enqueues the node kernel (device/node_kernel.h) on stream.
  virtual void launchNode(void* stream, int dev, const node::Args& args) = 0;
};

// CUDA's runtime, in builds with the CUDA Toolkit (null in others). Creates nothing on a device until used.
std::unique_ptr<DeviceRuntime> makeCudaRuntime();

}  // namespace ddl
