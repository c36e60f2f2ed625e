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
// Threads: an instance belongs to one rank of one communicator and is used by one thread at a time. Every
// call that can fail throws ddl::Error with ddlCudaError and names the call.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "ddl/ddl.h"

namespace ddl {

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
  virtual void* importMemory(const std::string& handle) = 0;
  virtual void closeMemory(void* p) noexcept = 0;
};

// CUDA's runtime, in builds with the CUDA Toolkit (null in others). Creates nothing on a device until used.
std::unique_ptr<DeviceRuntime> makeCudaRuntime();

}  // namespace ddl
