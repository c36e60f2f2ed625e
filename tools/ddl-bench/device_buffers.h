// ddl-bench --device: a rank's send and receive buffers in CUDA device memory, on device DDL_LOCAL_RANK (else
// 0) modulo the GPUs the process sees. Built with CUDA only (DDL_BENCH_CUDA); elsewhere --device is refused
// when the flags are parsed and this is an empty shell. Every call returns "" or what went wrong.
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
  std::string where;  // "GPU 1 of 4: NVIDIA H100 80GB HBM3"

#ifdef DDL_BENCH_CUDA
  ~DeviceBuffers() {
    if (send) cudaFree(send);
    if (recv) cudaFree(recv);
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
    return "";
  }
  std::string copy(void* dst, const void* src, size_t bytes) {
    cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
    return e == cudaSuccess ? "" : what("cudaMemcpy", e);
  }

 private:
  static std::string what(const char* call, cudaError_t e) {
    return std::string(call) + " failed: " + cudaGetErrorString(e);
  }
#else
  std::string open(size_t) { return "this ddl-bench was built without the CUDA Toolkit"; }
  std::string copy(void*, const void*, size_t) { return "this ddl-bench was built without the CUDA Toolkit"; }
#endif
};

}  // namespace ddlbench
