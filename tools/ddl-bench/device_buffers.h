// ddl-bench --device: a rank's send and receive buffers in CUDA device memory, on device DDL_LOCAL_RANK (else
// 0) modulo the GPUs the process sees, and the stream the stream-ordered collectives are enqueued on (with it
// a CUDA graph of one collective, for --graph). Built with CUDA only (DDL_BENCH_CUDA); elsewhere --device is
// refused when the flags are parsed and this is an empty shell. Every call returns "" or what went wrong.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <string>

#ifdef DDL_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ddlbench {

struct DeviceBuffers {
  void* send = nullptr;
  void* recv = nullptr;
  void* stream = nullptr;  // a cudaStream_t
  std::string where;       // "GPU 1 of 4: NVIDIA H100 80GB HBM3"

#ifdef DDL_BENCH_CUDA
  ~DeviceBuffers() {
    dropGraph();
    if (send) cudaFree(send);
    if (recv) cudaFree(recv);
    if (stream) cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
  std::string open(size_t bytes) {
    int n = 0;
    if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
      return std::string("no usable CUDA device (cudaGetDeviceCount: ") + cudaGetErrorString(e) +
             "; is the NVIDIA driver loaded? nvidia-smi tells)";
    }
    if (n == 0) return "no CUDA device (cudaGetDeviceCount found 0)";
    const char* local = std::getenv("DDL_LOCAL_RANK");
    const int dev = (local && *local ? std::atoi(local) : 0) % n;
    if (cudaError_t e = cudaSetDevice(dev); e != cudaSuccess) return what("cudaSetDevice", e);
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, dev) == cudaSuccess)
      where = "GPU " + std::to_string(dev) + " of " + std::to_string(n) + ": " + prop.name;
    if (cudaError_t e = cudaMalloc(&send, bytes); e != cudaSuccess) return what("cudaMalloc", e);
    if (cudaError_t e = cudaMalloc(&recv, bytes); e != cudaSuccess) return what("cudaMalloc", e);
    cudaStream_t s = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
      return what("cudaStreamCreate", e);
    stream = s;
    return "";
  }
  std::string sync() {
    cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    return e == cudaSuccess ? "" : what("cudaStreamSynchronize", e);
  }
  // Captures what enqueue(&why) puts on the stream into a graph (replacing the last one); enqueue returns
  // false and says why when it fails.
  template <class F>
  std::string capture(F&& enqueue) {
    dropGraph();
    auto s = static_cast<cudaStream_t>(stream);
    if (cudaError_t e = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal); e != cudaSuccess)
      return what("cudaStreamBeginCapture", e);
    std::string why;
    const bool enqueued = enqueue(&why);
    cudaGraph_t g = nullptr;
    cudaError_t e = cudaStreamEndCapture(s, &g);
    if (!enqueued) {
      if (g) cudaGraphDestroy(g);
      return "the collective could not be captured: " + why;
    }
    if (e != cudaSuccess) return what("cudaStreamEndCapture", e);
    graph_ = g;
    if (e = cudaGraphInstantiate(&exec_, g, 0); e != cudaSuccess) return what("cudaGraphInstantiate", e);
    return "";
  }
  std::string replay() {
    cudaError_t e = cudaGraphLaunch(exec_, static_cast<cudaStream_t>(stream));
    return e == cudaSuccess ? "" : what("cudaGraphLaunch", e);
  }
  // On the collectives' stream, then waited for: a plain cudaMemcpy runs on the legacy stream, which a
  // non-blocking stream does not wait for, and from pageable memory it may return before the data is on the
  // device, so a collective enqueued next could read the buffer's old contents.
  std::string copy(void* dst, const void* src, size_t bytes) {
    auto s = static_cast<cudaStream_t>(stream);
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
    if (e == cudaSuccess) e = cudaStreamSynchronize(s);
    return e == cudaSuccess ? "" : what("cudaMemcpyAsync", e);
  }

 private:
  static std::string what(const char* call, cudaError_t e) {
    return std::string(call) + " failed: " + cudaGetErrorString(e);
  }
  void dropGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
#else
  static constexpr const char* kNoCuda = "this ddl-bench was built without the CUDA Toolkit";
  std::string open(size_t) { return kNoCuda; }
  std::string copy(void*, const void*, size_t) { return kNoCuda; }
  std::string sync() { return kNoCuda; }
  template <class F>
  std::string capture(F&&) {
    return kNoCuda;
  }
  std::string replay() { return kNoCuda; }
#endif
};

}  // namespace ddlbench
