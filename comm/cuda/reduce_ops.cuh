// The element operations of libddl's CUDA kernels, shared by the reduction kernels (reduce_kernels.cu) and
// the node kernel (node_kernels.cu): the ops of comm/src/reduce.cpp written the same way, so that the results
// agree bit for bit (see reduce_kernels.cu), and the 16-byte vectors they move data in.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ddl::cuda::ops {

constexpr size_t kVecBytes = 16;

// ---- ops: the same definitions as reduce.cpp ----

template <typename T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

struct SumOp {
  template <typename T>
  __device__ __forceinline__ static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
    } else {
      return a + b;
    }
  }
};

struct ProdOp {
  template <typename T>
  __device__ __forceinline__ static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    } else {
      return a * b;
    }
  }
};

struct MinOp {
  template <typename T>
  __device__ __forceinline__ static T apply(T a, T b) {
    return a < b ? a : b;
  }
};

struct MaxOp {
  template <typename T>
  __device__ __forceinline__ static T apply(T a, T b) {
    return a > b ? a : b;
  }
};

// Bitwise ops: integer types only (dispatchOp instantiates them for nothing else).
struct BandOp {
  template <typename T>
  __device__ __forceinline__ static T apply(T a, T b) {
    return static_cast<T>(a & b);
  }
};

struct BorOp {
  template <typename T>
  __device__ __forceinline__ static T apply(T a, T b) {
    return static_cast<T>(a | b);
  }
};

struct BxorOp {
  template <typename T>
  __device__ __forceinline__ static T apply(T a, T b) {
    return static_cast<T>(a ^ b);
  }
};

// ---- element functions over the stored type S ----

template <typename T, typename Op>
struct NativeFn {
  using S = T;
  __device__ __forceinline__ T operator()(T a, T b) const { return Op::apply(a, b); }
};

template <typename Op>
struct HalfFn {
  using S = uint16_t;
  __device__ __forceinline__ uint16_t operator()(uint16_t a, uint16_t b) const {
    const float r = Op::apply(__half2float(__ushort_as_half(a)), __half2float(__ushort_as_half(b)));
    return __half_as_ushort(__float2half_rn(r));
  }
};

template <typename Op>
struct Bfloat16Fn {
  using S = uint16_t;
  __device__ __forceinline__ uint16_t operator()(uint16_t a, uint16_t b) const {
    const float r =
        Op::apply(__bfloat162float(__ushort_as_bfloat16(a)), __bfloat162float(__ushort_as_bfloat16(b)));
    return __bfloat16_as_ushort(__float2bfloat16_rn(r));
  }
};

// finishAvg: x / nranks. Integers up to 32 bits divide in int or unsigned (a truncating division, as the
// CPU's exact division through double), 64-bit ones in their own type.
template <typename T>
struct DivideFn {
  using S = T;
  int n;
  __device__ __forceinline__ T operator()(T x) const {
    if constexpr (std::is_floating_point_v<T>) {
      return x / static_cast<T>(n);
    } else if constexpr (sizeof(T) <= 4 && std::is_signed_v<T>) {
      return static_cast<T>(static_cast<int>(x) / n);
    } else if constexpr (sizeof(T) <= 4) {
      return static_cast<T>(static_cast<unsigned>(x) / static_cast<unsigned>(n));
    } else {
      return x / static_cast<T>(n);
    }
  }
};

struct HalfDivideFn {
  using S = uint16_t;
  int n;
  __device__ __forceinline__ uint16_t operator()(uint16_t x) const {
    return __half_as_ushort(__float2half_rn(__half2float(__ushort_as_half(x)) / static_cast<float>(n)));
  }
};

struct Bfloat16DivideFn {
  using S = uint16_t;
  int n;
  __device__ __forceinline__ uint16_t operator()(uint16_t x) const {
    return __bfloat16_as_ushort(
        __float2bfloat16_rn(__bfloat162float(__ushort_as_bfloat16(x)) / static_cast<float>(n)));
  }
};

// ---- vectors: kN elements of S moved as one access ----

// Aligned to its size, so that a 16-byte Vec is loaded and stored with one ld/st.global.v4.
template <typename S, int kN>
struct alignas(sizeof(S) * kN) Vec {
  S e[kN];
};

// 16-byte vectors go through uint4. Stores use __stcg, which is one st.global.cg.v4 by construction (inline
// PTX in the CUDA headers; .cg, "cache in L2", is what every global store does anyway): a plain uint4 store
// came out of nvcc 13 as four scalar stores for some of the unrolled vectors.
template <typename S, int kN>
union Wire {
  uint4 w;
  Vec<S, kN> v;
};

template <typename S, int kN>
__device__ __forceinline__ Vec<S, kN> load(const S* p) {
  if constexpr (sizeof(Vec<S, kN>) == kVecBytes) {
    Wire<S, kN> u;
    u.w = *reinterpret_cast<const uint4*>(p);
    return u.v;
  } else {
    return *reinterpret_cast<const Vec<S, kN>*>(p);
  }
}

template <typename S, int kN>
__device__ __forceinline__ void store(S* p, const Vec<S, kN>& v) {
  if constexpr (sizeof(Vec<S, kN>) == kVecBytes) {
    Wire<S, kN> u;
    u.v = v;
    __stcg(reinterpret_cast<uint4*>(p), u.w);
  } else {
    *reinterpret_cast<Vec<S, kN>*>(p) = v;
  }
}

template <typename F, typename S, int kN>
__device__ __forceinline__ Vec<S, kN> combine(const F& f, const Vec<S, kN>& x, const Vec<S, kN>& y) {
  Vec<S, kN> r;
#pragma unroll
  for (int k = 0; k < kN; ++k) r.e[k] = f(x.e[k], y.e[k]);
  return r;
}

}  // namespace ddl::cuda::ops
