// Element-wise reductions (sum, prod, min, max, avg) over the ten ddl types, on a CUDA device.
//
// A reduction reads two buffers and writes one, with one arithmetic op per element: it is bound by memory
// bandwidth on every GPU, so the kernel is shaped for bandwidth and nothing else:
//  - 16-byte loads and stores (ld/st.global.v4) wherever a, b and dst have the same address modulo 16 (true
//    for cudaMalloc'd buffers and equal offsets into them). The elements before the first 16-byte boundary
//    (the head) and after the last one (the tail), fewer than 16 bytes each, are done one by one by the first
//    threads of the grid. Buffers that disagree modulo 16 take element-wide loads in the same kernel shape;
//  - a grid-stride loop over a grid no larger than what the device keeps resident at once (blocks of 256
//    threads, as many per multiprocessor as the occupancy calculator allows), each thread with kUnroll
//    independent 16-byte load pairs in flight, so that enough bytes are in flight to cover DRAM latency and
//    there is no tail wave of blocks;
//  - no __restrict__: dst may be a or b (in place). Every element is loaded and stored by one thread, loads
//    before the store, so aliasing exactly is safe; partial overlap is refused by the launcher.
// The ops are those of comm/src/reduce.cpp, written the same way so that the results agree bit for bit:
// integer sum/prod in an unsigned type (wrap-around, never undefined), min/max as `a < b ? a : b`, float16
// and bfloat16 widened to float (exact), reduced in float, rounded back to nearest-even with
// cuda_fp16/cuda_bf16's _rn conversions. nvcc's defaults keep float arithmetic IEEE (no flush to zero, IEEE
// division); there is no multiply-add for -fmad to contract. NaN results are NaN on both, but not always the
// same NaN (see device_reduce.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "device_reduce.h"
#include "dtype.h"
#include "reduce_ops.cuh"

namespace ddl::cuda {
namespace {

using namespace ops;

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 2048 / kThreads;
constexpr int kUnroll = 4;

// The work of one launch: elements [0, head) and [head + nvec * kN, count) one by one, vectors in between.
struct Shape {
  size_t head;
  size_t nvec;
  size_t count;
};

// The one-by-one elements, at most 2 * (kN - 1) of them: global thread t takes the t-th.
__device__ __forceinline__ bool edgeElement(const Shape& s, int kN, size_t* i) {
  const size_t t = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  const size_t tail_begin = s.head + s.nvec * kN;
  if (t < s.head) {
    *i = t;
    return true;
  }
  if (t - s.head < s.count - tail_begin) {
    *i = tail_begin + (t - s.head);
    return true;
  }
  return false;
}

template <typename F, int kN>
__global__ void __launch_bounds__(kThreads)
    binaryKernel(typename F::S* dst, const typename F::S* a, const typename F::S* b, Shape s, F f) {
  using S = typename F::S;
  if (size_t i; edgeElement(s, kN, &i)) dst[i] = f(a[i], b[i]);
  S* vd = dst + s.head;
  const S* va = a + s.head;
  const S* vb = b + s.head;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t j = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  // Rounds in which all kUnroll vectors of this thread exist: every load first, then every store.
  for (; j + (kUnroll - 1) * stride < s.nvec; j += kUnroll * stride) {
    Vec<S, kN> x[kUnroll], y[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      x[u] = load<S, kN>(va + (j + u * stride) * kN);
      y[u] = load<S, kN>(vb + (j + u * stride) * kN);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) store<S, kN>(vd + (j + u * stride) * kN, combine(f, x[u], y[u]));
  }
  for (; j < s.nvec; j += stride) {
    store<S, kN>(vd + j * kN, combine(f, load<S, kN>(va + j * kN), load<S, kN>(vb + j * kN)));
  }
}

template <typename F, int kN>
__global__ void __launch_bounds__(kThreads) unaryKernel(typename F::S* buf, Shape s, F f) {
  using S = typename F::S;
  if (size_t i; edgeElement(s, kN, &i)) buf[i] = f(buf[i]);
  S* v = buf + s.head;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t j = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; j < s.nvec; j += stride) {
    Vec<S, kN> x = load<S, kN>(v + j * kN);
#pragma unroll
    for (int k = 0; k < kN; ++k) x.e[k] = f(x.e[k]);
    store<S, kN>(v + j * kN, x);
  }
}

// ---- launching ----

// Blocks of kKernel that the current device keeps resident at once: multiprocessors x blocks per SM by the
// occupancy calculator (the kernels use 25-62 registers, so fewer than the 8 blocks of 256 threads that fit
// by thread count alone). A grid of exactly that size has no tail wave. Asked once per kernel and device.
template <auto kKernel>
size_t residentBlocks() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 1;
  if (dev < kMaxDevices) {
    if (const int n = cache[dev].load(std::memory_order_relaxed); n > 0) return n;
  }
  int sms = 0, per_sm = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) sms = 1;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, 0) != cudaSuccess ||
      per_sm <= 0) {
    per_sm = 1;
  }
  cudaGetLastError();  // a failed query above must not look like a failed launch
  const int n = sms * std::min(per_sm, kBlocksPerSm);
  if (dev < kMaxDevices) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

// Enough blocks for one vector per thread, at most what is resident at once; at least one block, which the
// head and tail elements need (up to 2 x 15 threads).
template <auto kKernel>
unsigned gridFor(size_t nvec) {
  const size_t want = (nvec + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<size_t>(1, std::min(want, residentBlocks<kKernel>())));
}

uintptr_t addr(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The vector shape when every pointer has the same offset modulo 16; false otherwise.
template <typename S>
bool vectorShape(const void* dst, const void* a, const void* b, size_t count, Shape* s) {
  const uintptr_t m = addr(dst) % kVecBytes;
  if (addr(a) % kVecBytes != m || addr(b) % kVecBytes != m) return false;
  constexpr size_t kN = kVecBytes / sizeof(S);
  size_t head = ((kVecBytes - m) % kVecBytes) / sizeof(S);
  if (head > count) head = count;
  *s = Shape{head, (count - head) / kN, count};
  return true;
}

template <typename F>
cudaError_t launchBinary(void* dst, const void* a, const void* b, size_t count, cudaStream_t stream) {
  using S = typename F::S;
  constexpr int kN = static_cast<int>(kVecBytes / sizeof(S));
  auto* d = static_cast<S*>(dst);
  const auto* x = static_cast<const S*>(a);
  const auto* y = static_cast<const S*>(b);
  if (Shape s; vectorShape<S>(dst, a, b, count, &s)) {
    binaryKernel<F, kN><<<gridFor<binaryKernel<F, kN>>(s.nvec), kThreads, 0, stream>>>(d, x, y, s, F{});
  } else {
    const Shape e{0, count, count};
    binaryKernel<F, 1><<<gridFor<binaryKernel<F, 1>>(count), kThreads, 0, stream>>>(d, x, y, e, F{});
  }
  return cudaGetLastError();
}

template <typename F>
cudaError_t launchUnary(void* buf, size_t count, F f, cudaStream_t stream) {
  using S = typename F::S;
  constexpr int kN = static_cast<int>(kVecBytes / sizeof(S));
  Shape s;
  vectorShape<S>(buf, buf, buf, count, &s);  // one pointer: always agrees with itself
  unaryKernel<F, kN>
      <<<gridFor<unaryKernel<F, kN>>(s.nvec), kThreads, 0, stream>>>(static_cast<S*>(buf), s, f);
  return cudaGetLastError();
}

template <template <typename> class Fn>
cudaError_t dispatchOp16(void* dst, const void* a, const void* b, size_t n, ddlRedOp_t op, cudaStream_t st) {
  switch (op) {
    case ddlSum:
    case ddlAvg:
      return launchBinary<Fn<SumOp>>(dst, a, b, n, st);
    case ddlProd:
      return launchBinary<Fn<ProdOp>>(dst, a, b, n, st);
    case ddlMin:
      return launchBinary<Fn<MinOp>>(dst, a, b, n, st);
    case ddlMax:
      return launchBinary<Fn<MaxOp>>(dst, a, b, n, st);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t dispatchOp(void* dst, const void* a, const void* b, size_t n, ddlRedOp_t op, cudaStream_t st) {
  switch (op) {
    case ddlSum:
    case ddlAvg:
      return launchBinary<NativeFn<T, SumOp>>(dst, a, b, n, st);
    case ddlProd:
      return launchBinary<NativeFn<T, ProdOp>>(dst, a, b, n, st);
    case ddlMin:
      return launchBinary<NativeFn<T, MinOp>>(dst, a, b, n, st);
    case ddlMax:
      return launchBinary<NativeFn<T, MaxOp>>(dst, a, b, n, st);
    case ddlBand:
    case ddlBor:
    case ddlBxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ddlBand) return launchBinary<NativeFn<T, BandOp>>(dst, a, b, n, st);
        if (op == ddlBor) return launchBinary<NativeFn<T, BorOp>>(dst, a, b, n, st);
        return launchBinary<NativeFn<T, BxorOp>>(dst, a, b, n, st);
      }
      return cudaErrorInvalidValue;
    default:
      return cudaErrorInvalidValue;
  }
}

bool partialOverlap(const void* x, const void* y, size_t bytes) {
  const uintptr_t px = addr(x), py = addr(y);
  return px != py && px < py + bytes && py < px + bytes;
}

}  // namespace

cudaError_t reduce(void* dst, const void* a, const void* b, size_t count, ddlDataType_t type, ddlRedOp_t op,
                   cudaStream_t stream) {
  if (!opTakesType(op, type)) return cudaErrorInvalidValue;
  const size_t es = typeSize(type);
  if (count == 0) return cudaSuccess;
  if (!dst || !a || !b) return cudaErrorInvalidValue;
  if (addr(dst) % es || addr(a) % es || addr(b) % es) return cudaErrorMisalignedAddress;
  if (count > SIZE_MAX / es) return cudaErrorInvalidValue;
  const size_t bytes = count * es;
  if (partialOverlap(dst, a, bytes) || partialOverlap(dst, b, bytes)) return cudaErrorInvalidValue;
  switch (type) {
    case ddlInt8:
      return dispatchOp<int8_t>(dst, a, b, count, op, stream);
    case ddlUint8:
      return dispatchOp<uint8_t>(dst, a, b, count, op, stream);
    case ddlInt32:
      return dispatchOp<int32_t>(dst, a, b, count, op, stream);
    case ddlUint32:
      return dispatchOp<uint32_t>(dst, a, b, count, op, stream);
    case ddlInt64:
      return dispatchOp<int64_t>(dst, a, b, count, op, stream);
    case ddlUint64:
      return dispatchOp<uint64_t>(dst, a, b, count, op, stream);
    case ddlFloat16:
      return dispatchOp16<HalfFn>(dst, a, b, count, op, stream);
    case ddlBfloat16:
      return dispatchOp16<Bfloat16Fn>(dst, a, b, count, op, stream);
    case ddlFloat32:
      return dispatchOp<float>(dst, a, b, count, op, stream);
    case ddlFloat64:
      return dispatchOp<double>(dst, a, b, count, op, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t finishAvg(void* buf, size_t count, ddlDataType_t type, int nranks, cudaStream_t stream) {
  if (!validType(type) || nranks <= 0) return cudaErrorInvalidValue;
  const size_t es = typeSize(type);
  if (count == 0 || nranks == 1) return cudaSuccess;
  if (!buf) return cudaErrorInvalidValue;
  if (addr(buf) % es) return cudaErrorMisalignedAddress;
  switch (type) {
    case ddlInt8:
      return launchUnary(buf, count, DivideFn<int8_t>{nranks}, stream);
    case ddlUint8:
      return launchUnary(buf, count, DivideFn<uint8_t>{nranks}, stream);
    case ddlInt32:
      return launchUnary(buf, count, DivideFn<int32_t>{nranks}, stream);
    case ddlUint32:
      return launchUnary(buf, count, DivideFn<uint32_t>{nranks}, stream);
    case ddlInt64:
      return launchUnary(buf, count, DivideFn<int64_t>{nranks}, stream);
    case ddlUint64:
      return launchUnary(buf, count, DivideFn<uint64_t>{nranks}, stream);
    case ddlFloat16:
      return launchUnary(buf, count, HalfDivideFn{nranks}, stream);
    case ddlBfloat16:
      return launchUnary(buf, count, Bfloat16DivideFn{nranks}, stream);
    case ddlFloat32:
      return launchUnary(buf, count, DivideFn<float>{nranks}, stream);
    case ddlFloat64:
      return launchUnary(buf, count, DivideFn<double>{nranks}, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ddl::cuda
