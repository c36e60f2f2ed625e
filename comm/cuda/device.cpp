// Device queries (device_reduce.h). Host code only.
#include <cuda_runtime_api.h>

#include "device_reduce.h"

namespace ddl::cuda {

int deviceCount() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      // No driver, no device, or a driver older than the runtime: CPU only. Clear the error so that the
      // caller's next cudaGetLastError does not report it.
      cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return count;
}

int deviceOf(const void* ptr) {
  if (!ptr || deviceCount() == 0) return -1;
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice ? attr.device : -1;
}

}  // namespace ddl::cuda
