// Reductions on CUDA device memory, and the few device queries libddl needs. Built only with the CUDA Toolkit
// (DDL_HAVE_CUDA); see comm/cuda/CMakeLists.txt.
//
// The kernels compute exactly what the CPU reductions of comm/src/reduce.h compute, element for element and
// bit for bit: same ops (ddlAvg reduces like ddlSum, the division comes once, in finishAvg), integer sum/prod
// wrapping around, min/max as `a < b ? a : b` / `a > b ? a : b`, bitwise and/or/xor on integers, float16 and
// bfloat16 widened to float, reduced in float and rounded back to nearest-even. One difference: a NaN result
// is a NaN on both, but the GPU's float arithmetic returns its canonical NaN (and cuda_fp16's rounding the
// canonical half NaN), so the payload bits of a NaN may differ from the CPU's.
//
// The IPC path of one node (device_path.h) calls them through CUDA's DeviceRuntime (cuda_runtime.cpp);
// ddl-cuda-bench and the tests call them directly.
//
// Threads: any thread; each call acts on the calling thread's current device (cudaSetDevice).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "ddl/ddl.h"

namespace ddl::cuda {

// The number of CUDA devices this process can use: 0 where there is no device, no driver, or a driver too old
// for the runtime. Asked once, then cached (the device list of a process does not change).
int deviceCount();

// The device that holds ptr, or -1 when ptr is not device memory: host memory (pageable or pinned), managed
// memory (the host reaches it directly), NULL, or any pointer when deviceCount() == 0. Never fails.
// Note: on a machine with a GPU the CUDA runtime may create its primary context on the current device the
// first time this asks about a pointer (cudaPointerGetAttributes initialises the runtime).
int deviceOf(const void* ptr);
inline bool isDevicePointer(const void* ptr) { return deviceOf(ptr) >= 0; }

// Enqueues dst[i] = a[i] (op) b[i], i < count, on stream. dst may alias a or b exactly, never partially.
// The pointers must be device memory of the current device or pinned host memory (cudaHostAlloc: with unified
// addressing, which every GPU that CUDA 13 supports has, the kernel reads it by the same pointer, over PCIe;
// the fold of what crossed the wire reads it so), each aligned to the element size; any alignment beyond that
// is fine (16-byte vector loads where all three agree modulo 16, element loads otherwise). Returns the
// launch's error: cudaErrorInvalidValue for a bad type or op (a bitwise op takes integer types only) or a
// partial overlap, cudaErrorMisalignedAddress for a pointer not aligned to its element size; cudaSuccess with
// count == 0.
cudaError_t reduce(void* dst, const void* a, const void* b, size_t count, ddlDataType_t type, ddlRedOp_t op,
                   cudaStream_t stream);

// Enqueues buf[i] /= nranks (integers: truncating division) on stream: the last step of ddlAvg.
cudaError_t finishAvg(void* buf, size_t count, ddlDataType_t type, int nranks, cudaStream_t stream);

}  // namespace ddl::cuda

namespace ddl::node {
struct Args;
}

namespace ddl::cuda {
// Enqueues the node kernel (comm/src/device/node_kernel.h, node_kernels.cu) on stream, on the current device.
// cudaErrorInvalidValue for a bad type, op or rank count.
cudaError_t launchNodeCollective(const node::Args& args, cudaStream_t stream);
// The node kernel's CTAs the current device keeps resident at once (the float32 sum instantiation's
// occupancy; the others use about as many registers); 0 where it cannot be asked.
int nodeKernelResidentBlocks();
}  // namespace ddl::cuda
