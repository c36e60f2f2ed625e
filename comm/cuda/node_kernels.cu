// The node kernel on a CUDA device: comm/src/device/node_kernel.h's algorithm with one CTA per block of it.
//
// The executor gives the algorithm what only the GPU has:
//  - the CTA's threads stride over every range 16 bytes at a time (ld/st.global.v4) where the pointers allow,
//    element by element otherwise; loads of the slots use .cg (cached in L2 only): a peer's slot is rewritten
//    every other round, and L1 is not coherent with the writes of other GPUs or processes;
//  - release and acquire at system scope for the flags (a fence.acq_rel.sys, then a relaxed store; an
//    ld.acquire.sys), after and before a CTA barrier, so that the whole CTA's writes are ordered before a
//    flag goes up and its reads after the flags are seen;
//  - the global timer (%globaltimer, nanoseconds) for the waits' timeout, and __nanosleep between polls of
//    the abort word.
// One kernel per (element function) is instantiated: the reducing kinds per type and op, the copying kinds
// (allgather, broadcast) once, on bytes.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "device/node_kernel.h"
#include "device_reduce.h"
#include "dtype.h"
#include "reduce_ops.cuh"

namespace ddl::cuda {
namespace {

using namespace ops;

template <typename S>
__device__ __forceinline__ S loadCg(const S* p) {
  if constexpr (sizeof(S) == 16) {
    return __ldcg(p);
  } else {
    return *reinterpret_cast<const volatile S*>(p);
  }
}

__device__ __forceinline__ bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}

// F: the element function (ops::NativeFn, HalfFn, Bfloat16Fn) over the stored type F::S; D: its division
// (ddlAvg's last step).
template <class F, class D>
struct GpuExec {
  using S = typename F::S;
  static constexpr int kN = static_cast<int>(kVecBytes / sizeof(S));

  __device__ int tid() const { return threadIdx.x; }
  __device__ int nthreads() const { return blockDim.x; }
  __device__ void sync() const { __syncthreads(); }
  __device__ bool any(bool v) const { return __syncthreads_or(v) != 0; }
  __device__ void pause() const { __nanosleep(100); }
  __device__ void signal(uint64_t* p, uint64_t v) const {
    asm volatile("fence.acq_rel.sys;\n\tst.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  }
  __device__ uint64_t poll(const uint64_t* p) const {
    uint64_t v;
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
  }
  __device__ uint64_t nowNs() const {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
  }
  __device__ void store(uint64_t* p, uint64_t v) const {
    asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  }
  // The claim is the rank's own (its region, its GPU): device scope.
  __device__ bool claim(uint32_t* word) const {
    const bool won = atomicCAS(reinterpret_cast<unsigned int*>(word), 0u, 1u) == 0u;
    __threadfence();
    return won;
  }
  __device__ void unclaim(uint32_t* word) const {
    __threadfence();
    atomicExch(reinterpret_cast<unsigned int*>(word), 0u);
  }
  __device__ bool claimDetail(uint64_t* word, uint64_t v) const {
    return atomicCAS(reinterpret_cast<unsigned long long*>(word), 0ull, static_cast<unsigned long long>(v)) ==
           0ull;
  }
  __device__ void setError(uint32_t* word, uint32_t code) const {
    auto* w = reinterpret_cast<unsigned int*>(word);
    if (atomicCAS(w, 0u, code) != 0u && code == node::kMismatch) atomicCAS(w, node::kPeerFailed, code);
    __threadfence_system();
  }
  // The failed word is the rank's own, read and written by its blocks on this GPU: device scope.
  __device__ void markFailed(uint32_t* word) const {
    asm volatile("st.relaxed.gpu.global.u32 [%0], 1;\n\tfence.sc.gpu;" ::"l"(word) : "memory");
  }
  __device__ bool failedAfterFences(uint32_t* word) const {
    uint32_t v;
    asm volatile("fence.sc.gpu;\n\tld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(word) : "memory");
    return v != 0;
  }

  // n elements of elem bytes.
  // Where dst and src agree modulo 16, the bytes before the first 16-byte boundary and after the last go one
  // by one and the rest in vectors; otherwise all go one by one.
  __device__ void copy(char* dst, const char* src, size_t n) const {
    const size_t bytes = n * elem;
    const uintptr_t mis = reinterpret_cast<uintptr_t>(dst) & 15;
    if (mis != (reinterpret_cast<uintptr_t>(src) & 15)) {
      for (size_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = loadCg(src + i);
      return;
    }
    size_t head = (16 - mis) & 15;
    if (head > bytes) head = bytes;
    const size_t nv = (bytes - head) / 16, tail = head + nv * 16;
    if (threadIdx.x < head) dst[threadIdx.x] = loadCg(src + threadIdx.x);
    for (size_t i = tail + threadIdx.x; i < bytes; i += blockDim.x) dst[i] = loadCg(src + i);
    auto* d = reinterpret_cast<uint4*>(dst + head);
    const auto* s = reinterpret_cast<const uint4*>(src + head);
    for (size_t i = threadIdx.x; i < nv; i += blockDim.x) __stcg(d + i, loadCg(s + i));
  }

  // The i-th 16-byte vector of every source folded in member order, divided by divisor where it is > 0.
  __device__ Wire<S, kN> foldVector(const char* const* srcs, int nsrc, size_t i, const F& f, const D& div,
                                    int divisor) const {
    Wire<S, kN> acc, x;
    acc.w = __ldcg(reinterpret_cast<const uint4*>(srcs[0]) + i);
    for (int r = 1; r < nsrc; ++r) {
      x.w = __ldcg(reinterpret_cast<const uint4*>(srcs[r]) + i);
      acc.v = combine(f, acc.v, x.v);
    }
    if (divisor > 0) {
#pragma unroll
      for (int k = 0; k < kN; ++k) acc.v.e[k] = div(acc.v.e[k]);
    }
    return acc;
  }

  // dst[i] (and dst2[i] where dst2 is set) = srcs[0][i] op srcs[1][i] op ..., folded in member order, then
  // divided by divisor where it is > 0.
  __device__ void reduce(char* dst, char* dst2, const char* const* srcs, int nsrc, size_t n,
                         int divisor) const {
    bool vec = aligned16(dst) && (!dst2 || aligned16(dst2)) && n % kN == 0;
    for (int r = 0; r < nsrc; ++r) vec = vec && aligned16(srcs[r]);
    const F f{};
    const D div{divisor};
    if (vec) {
      for (size_t i = threadIdx.x; i < n / kN; i += blockDim.x) {
        const Wire<S, kN> acc = foldVector(srcs, nsrc, i, f, div, divisor);
        __stcg(reinterpret_cast<uint4*>(dst) + i, acc.w);
        if (dst2) __stcg(reinterpret_cast<uint4*>(dst2) + i, acc.w);
      }
    } else {
      for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        S acc = loadCg(reinterpret_cast<const S*>(srcs[0]) + i);
        for (int r = 1; r < nsrc; ++r) acc = f(acc, loadCg(reinterpret_cast<const S*>(srcs[r]) + i));
        if (divisor > 0) acc = div(acc);
        reinterpret_cast<S*>(dst)[i] = acc;
        if (dst2) reinterpret_cast<S*>(dst2)[i] = acc;
      }
    }
  }

  // The zero-copy allreduce's: every dsts[d][i] = srcs[0][i] op srcs[1][i] op ..., divided by divisor where
  // it is > 0; a destination may be a source (each element is read before it is written). Several 16-byte
  // vectors per thread in flight (kUnroll), the sources' loads of them before the folds.
  __device__ void reduceMany(char* const* dsts, int ndst, const char* const* srcs, int nsrc, size_t n,
                             int divisor) const {
    constexpr int kUnroll = 4;
    bool vec = n % kN == 0;
    for (int d = 0; d < ndst; ++d) vec = vec && aligned16(dsts[d]);
    for (int r = 0; r < nsrc; ++r) vec = vec && aligned16(srcs[r]);
    const F f{};
    const D div{divisor};
    if (!vec) {
      for (size_t i = threadIdx.x; i < n; i += blockDim.x) {
        S acc = loadCg(reinterpret_cast<const S*>(srcs[0]) + i);
        for (int r = 1; r < nsrc; ++r) acc = f(acc, loadCg(reinterpret_cast<const S*>(srcs[r]) + i));
        if (divisor > 0) acc = div(acc);
        for (int d = 0; d < ndst; ++d) reinterpret_cast<S*>(dsts[d])[i] = acc;
      }
      return;
    }
    const size_t nv = n / kN, step = blockDim.x;
    size_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * step < nv; i += kUnroll * step) {
      Wire<S, kN> acc[kUnroll], x[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k)
        acc[k].w = __ldcg(reinterpret_cast<const uint4*>(srcs[0]) + i + k * step);
      for (int r = 1; r < nsrc; ++r) {
#pragma unroll
        for (int k = 0; k < kUnroll; ++k)
          x[k].w = __ldcg(reinterpret_cast<const uint4*>(srcs[r]) + i + k * step);
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) acc[k].v = combine(f, acc[k].v, x[k].v);
      }
      if (divisor > 0) {
#pragma unroll
        for (int k = 0; k < kUnroll; ++k)
#pragma unroll
          for (int j = 0; j < kN; ++j) acc[k].v.e[j] = div(acc[k].v.e[j]);
      }
      for (int d = 0; d < ndst; ++d) {
#pragma unroll
        for (int k = 0; k < kUnroll; ++k) __stcg(reinterpret_cast<uint4*>(dsts[d]) + i + k * step, acc[k].w);
      }
    }
    for (; i < nv; i += step) {
      const Wire<S, kN> acc = foldVector(srcs, nsrc, i, f, div, divisor);
      for (int d = 0; d < ndst; ++d) __stcg(reinterpret_cast<uint4*>(dsts[d]) + i, acc.w);
    }
  }

  size_t elem;
};

template <class F, class D>
// Two CTAs per multiprocessor at least (64 registers a thread): ranks sharing a GPU need all their CTAs
// resident at once (nodeKernelResidentBlocks).
__global__ void __launch_bounds__(node::kThreads, 2) nodeKernel(node::Args a) {
  GpuExec<F, D> x{a.elem};
  node::runBlock(a, static_cast<int>(blockIdx.x), x);
}

template <class F, class D>
cudaError_t launch(const node::Args& a, cudaStream_t stream) {
  nodeKernel<F, D><<<a.blocks, node::kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <template <typename> class Fn, class D>
cudaError_t dispatchOp16(const node::Args& a, cudaStream_t st) {
  switch (a.op) {
    case ddlSum:
    case ddlAvg:
      return launch<Fn<SumOp>, D>(a, st);
    case ddlProd:
      return launch<Fn<ProdOp>, D>(a, st);
    case ddlMin:
      return launch<Fn<MinOp>, D>(a, st);
    case ddlMax:
      return launch<Fn<MaxOp>, D>(a, st);
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T>
cudaError_t dispatchOp(const node::Args& a, cudaStream_t st) {
  using D = DivideFn<T>;
  switch (a.op) {
    case ddlSum:
    case ddlAvg:
      return launch<NativeFn<T, SumOp>, D>(a, st);
    case ddlProd:
      return launch<NativeFn<T, ProdOp>, D>(a, st);
    case ddlMin:
      return launch<NativeFn<T, MinOp>, D>(a, st);
    case ddlMax:
      return launch<NativeFn<T, MaxOp>, D>(a, st);
    case ddlBand:
    case ddlBor:
    case ddlBxor:
      if constexpr (std::is_integral_v<T>) {
        if (a.op == ddlBand) return launch<NativeFn<T, BandOp>, D>(a, st);
        if (a.op == ddlBor) return launch<NativeFn<T, BorOp>, D>(a, st);
        return launch<NativeFn<T, BxorOp>, D>(a, st);
      }
      return cudaErrorInvalidValue;
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

namespace {

template <class F, class D>
int perSm() {
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, nodeKernel<F, D>, node::kThreads, 0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace

int nodeKernelResidentBlocks() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  // The instantiations differ in registers: the least resident one decides (wide types, the 16-bit types'
  // conversions, the copying kinds' byte kernel).
  const int counts[] = {
      perSm<NativeFn<float, SumOp>, DivideFn<float>>(),
      perSm<NativeFn<double, ProdOp>, DivideFn<double>>(),
      perSm<NativeFn<int64_t, ProdOp>, DivideFn<int64_t>>(),
      perSm<NativeFn<uint64_t, BxorOp>, DivideFn<uint64_t>>(),
      perSm<HalfFn<SumOp>, HalfDivideFn>(),
      perSm<Bfloat16Fn<MaxOp>, Bfloat16DivideFn>(),
      perSm<NativeFn<int8_t, SumOp>, DivideFn<int8_t>>(),
      perSm<NativeFn<uint8_t, SumOp>, DivideFn<uint8_t>>(),
  };
  int per_sm = counts[0];
  for (int n : counts) per_sm = n < per_sm ? n : per_sm;
  return sms * per_sm;
}

cudaError_t launchNodeCollective(const node::Args& a, cudaStream_t stream) {
  if (a.nranks < 1 || a.nranks > node::kMaxRanks || a.blocks < 1 || a.blocks > node::kMaxBlocks ||
      a.elem != typeSize(a.type))
    return cudaErrorInvalidValue;
  if (a.kind == node::Kind::kAllGather || a.kind == node::Kind::kBroadcast || a.kind == node::Kind::kPoison) {
    // Nothing is reduced: one kernel for every type, moving bytes (elem stays the type's size).
    return launch<NativeFn<uint8_t, SumOp>, DivideFn<uint8_t>>(a, stream);
  }
  if (!opTakesType(a.op, a.type)) return cudaErrorInvalidValue;
  switch (a.type) {
    case ddlInt8:
      return dispatchOp<int8_t>(a, stream);
    case ddlUint8:
      return dispatchOp<uint8_t>(a, stream);
    case ddlInt32:
      return dispatchOp<int32_t>(a, stream);
    case ddlUint32:
      return dispatchOp<uint32_t>(a, stream);
    case ddlInt64:
      return dispatchOp<int64_t>(a, stream);
    case ddlUint64:
      return dispatchOp<uint64_t>(a, stream);
    case ddlFloat16:
      return dispatchOp16<HalfFn, HalfDivideFn>(a, stream);
    case ddlBfloat16:
      return dispatchOp16<Bfloat16Fn, Bfloat16DivideFn>(a, stream);
    case ddlFloat32:
      return dispatchOp<float>(a, stream);
    case ddlFloat64:
      return dispatchOp<double>(a, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace ddl::cuda
