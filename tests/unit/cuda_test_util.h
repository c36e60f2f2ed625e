// Test helper for the CUDA tests: why no GPU can be used here (empty when one can), and a skip with it.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "error.h"

namespace ddl::test_util {

// Inside rank threads: throw, so that the failure is reported with the rank.
inline void cudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(ddlCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) { cudaOk(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* p = nullptr;
};

inline std::string noDeviceReason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: cudaGetDeviceCount says ") + cudaGetErrorString(e) + " (" +
           cudaGetErrorName(e) + ")";
  }
  return n > 0 ? "" : "no CUDA device: cudaGetDeviceCount found 0";
}

}  // namespace ddl::test_util

#define SKIP_WITHOUT_GPU()                                                   \
  do {                                                                       \
    if (const std::string why = ::ddl::test_util::noDeviceReason(); !why.empty()) \
      GTEST_SKIP() << why << "; this test needs a GPU";                      \
  } while (0)
