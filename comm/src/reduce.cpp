// Element-wise reductions (sum, prod, min, max, avg) over the ten ddl types, on the CPU.
//
// This is the hot loop of every CPU collective: each ring step reduces a received segment into the local one,
// so it must run at memory bandwidth. It is portable C++ written for GCC/Clang's auto-vectoriser, which turns
// it into SSE/AVX on x86-64 and VSX on POWER; there are no intrinsics to port. The shape that makes that
// work:
//  - one plain indexed loop per (type, op), with the op an inlined functor;
//  - __restrict on every pointer, which is only true when the buffers do not overlap. dst may be a or b
//    itself (in place), so reduceLoop picks one of four loop variants (out of place, dst == a, dst == b, all
//    three equal); in each, no memory is reached through two different pointers. Partial overlap is a bug
//    of the caller and is asserted;
//  - min/max as `a < b ? a : b`, which is exactly what x86's minps/maxps compute (POWER uses a compare and a
//    select), so the float loops vectorise without -ffast-math. With a NaN operand they return the second
//    operand: NaN propagation through min/max is not guaranteed;
//  - signed integer sum/prod are computed in the unsigned type and converted back: they wrap around (two's
//    complement) instead of being undefined behaviour.
// float16 and bfloat16 are widened to float, reduced in float and rounded back to nearest-even. The
// conversions are bit manipulation with masks instead of branches, so that they vectorise too, and they run
// on two elements packed in a 32-bit word so that the vector lanes stay 32 bits wide throughout (see
// reduce16). They are compute-bound: a few dozen vector instructions per element pair.
#include "reduce.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <type_traits>

#include "dtype.h"
#include "error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace ddl {
namespace {

// ---- float16 / bfloat16 conversions (branch-free, so that loops over them vectorise) ----

// c ? x : y without a branch. The conversions compute every case and choose with masks rather than `?:`:
// GCC would turn `?:` into branches and sink the float arithmetic of one case into its branch, where it may
// not be speculated again (-ftrapping-math), and the loop would not vectorise.
inline uint32_t pick(bool c, uint32_t x, uint32_t y) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (x & m) | (y & ~m);
}

// The conversions work on 16-bit patterns held in uint32_t, never in uint16_t: given 16-bit operands, GCC's
// vectoriser demotes the masks and selects to 16-bit lanes and spends most of the loop packing and unpacking
// between the widths (SSE2 has no cheap 32->16 pack). Only the loads and stores see 16-bit data.

// h: a binary16 pattern in the low 16 bits.
inline float halfBitsToFloat(uint32_t h) {
  // Move exponent and mantissa into place and rebias the exponent from 15 to 127. That is right for normal
  // numbers; inf/NaN need the exponent pushed on to 255, and subnormals (exponent 0) are renormalised by
  // giving them an implicit 1 at 2^-14 and subtracting 2^-14 in float arithmetic, which is exact.
  uint32_t o = (h & 0x7fffu) << 13;
  const uint32_t exp = o & 0x0f800000u;
  o += (127u - 15u) << 23;
  o += pick(exp == 0x0f800000u, (128u - 16u) << 23, 0u);
  const float sub = std::bit_cast<float>(o + (1u << 23)) - std::bit_cast<float>(113u << 23);
  const uint32_t r = pick(exp == 0, std::bit_cast<uint32_t>(sub), o);
  return std::bit_cast<float>(r | ((h & 0x8000u) << 16));
}

// Returns a binary16 pattern (< 0x10000).
inline uint32_t floatToHalfBits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;  // |f|
  // Normal result: rebias the exponent and round the 13 dropped mantissa bits to nearest-even by adding
  // 0xfff plus the lowest kept bit; a carry out of the mantissa correctly bumps the exponent (up to inf).
  const uint32_t normal = (a + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal or zero result (|f| < 2^-14): adding 0.5 makes the FPU shift the mantissa so that its last kept
  // bit is 2^-24, rounding to nearest-even (the default rounding mode); the low bits of the sum are then the
  // half's bits. Flush-to-zero/denormals-are-zero modes do not change the result: a float denormal rounds to
  // 0 here anyway, and no float operation in these conversions produces one.
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;  // 0.5f
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(a) + std::bit_cast<float>(kDenormMagic)) - kDenormMagic;
  // NaN keeps its sign and the top of its payload, so half -> float -> half gives back every NaN pattern; if
  // the payload was all in the dropped bits, it becomes the quiet NaN rather than turning into inf.
  const uint32_t payload = (a >> 13) & 0x3ffu;
  const uint32_t nan = 0x7c00u | payload | pick(payload == 0, 0x200u, 0u);
  uint32_t r = pick(a < (113u << 23), sub, normal);  // 113 << 23 is 2^-14, the smallest normal half
  r = pick(a >= (143u << 23), 0x7c00u, r);  // 143 << 23 is 2^16: inf (65520 <= |f| < 2^16 rounds there)
  r = pick(a > 0x7f800000u, nan, r);
  return r | sign;
}

inline float bfloat16BitsToFloat(uint32_t b) { return std::bit_cast<float>(b << 16); }

inline uint32_t floatToBfloat16Bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  // Round to nearest-even on the 16 dropped bits. The largest finite floats round up to inf, as they should;
  // only NaN could carry into the sign, and it takes the other branch.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;  // quiet it; the payload's top bits and the sign stay
  return pick((u & 0x7fffffffu) > 0x7f800000u, nan, rounded);
}

struct HalfCodec {
  static float toFloat(uint32_t x) { return halfBitsToFloat(x); }
  static uint32_t fromFloat(float x) { return floatToHalfBits(x); }
};

struct Bfloat16Codec {
  static float toFloat(uint32_t x) { return bfloat16BitsToFloat(x); }
  static uint32_t fromFloat(float x) { return floatToBfloat16Bits(x); }
};

// ---- ops ----

// Integer sum/prod run in an unsigned type at least as wide as unsigned int (so that narrow types are not
// promoted to a signed int, where a product could overflow), then convert back: modular, never UB.
template <typename T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <typename T>
struct SumOp {
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b));
    } else {
      return a + b;
    }
  }
};

template <typename T>
struct ProdOp {
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b));
    } else {
      return a * b;
    }
  }
};

template <typename T>
struct MinOp {
  static T apply(T a, T b) { return a < b ? a : b; }
};

template <typename T>
struct MaxOp {
  static T apply(T a, T b) { return a > b ? a : b; }
};

// Bitwise ops: integer types only (opTakesType; the communicator refuses the others before any reduction).
template <typename T>
struct BandOp {
  static T apply(T a, T b) { return static_cast<T>(a & b); }
};

template <typename T>
struct BorOp {
  static T apply(T a, T b) { return static_cast<T>(a | b); }
};

template <typename T>
struct BxorOp {
  static T apply(T a, T b) { return static_cast<T>(a ^ b); }
};

// ---- native types: the four aliasing variants ----

template <typename T, typename Op>
void loopOutOfPlace(T* __restrict dst, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], b[i]);
}

template <typename T, typename Op>
void loopIntoA(T* __restrict dst, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], b[i]);
}

template <typename T, typename Op>
void loopIntoB(T* __restrict dst, const T* __restrict a, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(a[i], dst[i]);
}

template <typename T, typename Op>
void loopSelf(T* __restrict dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Op::apply(dst[i], dst[i]);
}

template <typename T, typename Op>
void reduceLoop(void* dstv, const void* av, const void* bv, size_t n) {
  T* dst = static_cast<T*>(dstv);
  const T* a = static_cast<const T*>(av);
  const T* b = static_cast<const T*>(bv);
  if (dst == a && dst == b) {
    loopSelf<T, Op>(dst, n);
  } else if (dst == a) {
    loopIntoA<T, Op>(dst, b, n);
  } else if (dst == b) {
    loopIntoB<T, Op>(dst, a, n);
  } else {
    // a == b with dst elsewhere is fine here: restrict only forbids aliasing of memory that is written.
    loopOutOfPlace<T, Op>(dst, a, b, n);
  }
}

// ---- float16 / bfloat16: pairs of elements in 32-bit words ----
//
// A block of the buffers is copied into uint32_t arrays on the stack (memcpy: the only way to look at 16-bit
// data as words without breaking aliasing rules), each word holding two elements, which the loop takes apart
// with a mask and a shift, converts, reduces and puts together again. So every lane of the vector loop is 32
// bits wide from load to store. Which half of a word is the first element depends on the byte order, but the
// same position in a, b and dst is always the same element, so the result does not. An odd last element is
// done on its own. Copying in before writing out also makes the loop indifferent to dst == a or dst == b.

constexpr size_t kBlockWords = 128;  // 256 elements; 1.5 KiB of stack

template <typename Codec, typename Op>
inline uint32_t pairOp(uint32_t x, uint32_t y) {
  const float lo = Op::apply(Codec::toFloat(x & 0xffffu), Codec::toFloat(y & 0xffffu));
  const float hi = Op::apply(Codec::toFloat(x >> 16), Codec::toFloat(y >> 16));
  return Codec::fromFloat(lo) | (Codec::fromFloat(hi) << 16);
}

template <typename Codec, typename Op>
void reduceWords(uint32_t* __restrict x, const uint32_t* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = pairOp<Codec, Op>(x[i], y[i]);
}

template <typename Codec, typename Op>
void reduce16(void* dstv, const void* av, const void* bv, size_t n) {
  auto* dst = static_cast<unsigned char*>(dstv);
  const auto* a = static_cast<const unsigned char*>(av);
  const auto* b = static_cast<const unsigned char*>(bv);
  alignas(64) uint32_t wa[kBlockWords];
  alignas(64) uint32_t wb[kBlockWords];
  const size_t words = n / 2;
  for (size_t off = 0; off < words; off += kBlockWords) {
    const size_t m = std::min(kBlockWords, words - off);
    std::memcpy(wa, a + off * 4, m * 4);
    std::memcpy(wb, b + off * 4, m * 4);
    reduceWords<Codec, Op>(wa, wb, m);
    std::memcpy(dst + off * 4, wa, m * 4);
  }
  if (n % 2 != 0) {
    uint16_t x, y;
    std::memcpy(&x, a + (n - 1) * 2, 2);
    std::memcpy(&y, b + (n - 1) * 2, 2);
    const auto r = static_cast<uint16_t>(Codec::fromFloat(Op::apply(Codec::toFloat(x), Codec::toFloat(y))));
    std::memcpy(dst + (n - 1) * 2, &r, 2);
  }
}

// ---- x86-64 with AVX2 and F16C: 8 elements per instruction (chosen at run time) ----
//
// The portable code above stays the reference and the path on every other CPU (POWER included). Here the
// conversions are single instructions (vcvtph2ps / vcvtps2ph with round-to-nearest-even for float16; shifts,
// an integer add and a blend for bfloat16, the same formula as floatToBfloat16Bits), and the ops are the
// vector forms of the scalar ones with the same NaN and signed-zero behaviour (minps returns the second operand
// unless the first is smaller, exactly like `a < b ? a : b`). Tails shorter than 8 go to the portable code.
#if defined(__x86_64__) && defined(__GNUC__)
#define DDL_X86_VECTOR16 1

struct VecSum {
  __attribute__((target("avx2"))) static __m256 apply(__m256 a, __m256 b) { return _mm256_add_ps(a, b); }
};
struct VecProd {
  __attribute__((target("avx2"))) static __m256 apply(__m256 a, __m256 b) { return _mm256_mul_ps(a, b); }
};
struct VecMin {
  __attribute__((target("avx2"))) static __m256 apply(__m256 a, __m256 b) { return _mm256_min_ps(a, b); }
};
struct VecMax {
  __attribute__((target("avx2"))) static __m256 apply(__m256 a, __m256 b) { return _mm256_max_ps(a, b); }
};

struct HalfVec {
  __attribute__((target("avx2,f16c"))) static __m256 load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  __attribute__((target("avx2,f16c"))) static void store(uint16_t* p, __m256 f) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
  }
};

struct Bfloat16Vec {
  __attribute__((target("avx2"))) static __m256 load(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  __attribute__((target("avx2"))) static void store(uint16_t* p, __m256 f) {
    const __m256i u = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                              _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
  }
};

// Loads of a chunk come before its store, so dst may alias a or b exactly.
template <typename Vec, typename Op, typename Codec, typename ScalarOp>
__attribute__((target("avx2,f16c"))) void reduce16x86(void* dstv, const void* av, const void* bv, size_t n) {
  auto* dst = static_cast<uint16_t*>(dstv);
  const auto* a = static_cast<const uint16_t*>(av);
  const auto* b = static_cast<const uint16_t*>(bv);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) Vec::store(dst + i, Op::apply(Vec::load(a + i), Vec::load(b + i)));
  if (i < n) reduce16<Codec, ScalarOp>(dst + i, a + i, b + i, n - i);
}

bool haveX86Vector16() {
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return have;
}

template <typename Vec, typename Codec>
bool reduceCodecX86(void* dst, const void* a, const void* b, size_t n, ddlRedOp_t op) {
  if (!haveX86Vector16()) return false;
  switch (op) {
    case ddlSum:
    case ddlAvg: reduce16x86<Vec, VecSum, Codec, SumOp<float>>(dst, a, b, n); return true;
    case ddlProd: reduce16x86<Vec, VecProd, Codec, ProdOp<float>>(dst, a, b, n); return true;
    case ddlMin: reduce16x86<Vec, VecMin, Codec, MinOp<float>>(dst, a, b, n); return true;
    case ddlMax: reduce16x86<Vec, VecMax, Codec, MaxOp<float>>(dst, a, b, n); return true;
    default: return false;
  }
}
#endif

// ---- dispatch ----

template <typename T>
void reduceNative(void* dst, const void* a, const void* b, size_t n, ddlRedOp_t op) {
  switch (op) {
    case ddlSum:
    case ddlAvg:
      return reduceLoop<T, SumOp<T>>(dst, a, b, n);
    case ddlProd:
      return reduceLoop<T, ProdOp<T>>(dst, a, b, n);
    case ddlMin:
      return reduceLoop<T, MinOp<T>>(dst, a, b, n);
    case ddlMax:
      return reduceLoop<T, MaxOp<T>>(dst, a, b, n);
    case ddlBand:
    case ddlBor:
    case ddlBxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ddlBand) return reduceLoop<T, BandOp<T>>(dst, a, b, n);
        if (op == ddlBor) return reduceLoop<T, BorOp<T>>(dst, a, b, n);
        return reduceLoop<T, BxorOp<T>>(dst, a, b, n);
      }
      DDL_ASSERT(std::is_integral_v<T> && "bitwise op on a floating-point type");
      return;
    default:
      DDL_ASSERT(validOp(op));
  }
}

template <typename Codec>
void reduceCodec(void* dst, const void* a, const void* b, size_t n, ddlRedOp_t op) {
  switch (op) {
    case ddlSum:
    case ddlAvg:
      return reduce16<Codec, SumOp<float>>(dst, a, b, n);
    case ddlProd:
      return reduce16<Codec, ProdOp<float>>(dst, a, b, n);
    case ddlMin:
      return reduce16<Codec, MinOp<float>>(dst, a, b, n);
    case ddlMax:
      return reduce16<Codec, MaxOp<float>>(dst, a, b, n);
    default:
      DDL_ASSERT(validOp(op) && !isBitwiseOp(op));
  }
}

template <typename T>
void divideNative(void* bufv, size_t n, int nranks) {
  T* __restrict buf = static_cast<T*>(bufv);
  if constexpr (std::is_floating_point_v<T>) {
    const T d = static_cast<T>(nranks);
    for (size_t i = 0; i < n; ++i) buf[i] = buf[i] / d;
  } else if constexpr (sizeof(T) <= 4) {
    // Through double, which vectorises where integer division does not, and is exact: |x| < 2^32 < 2^53, so
    // the rounding error of x / n is below |x / n| * 2^-53 < 1 / n, while a quotient that is not an integer
    // lies at least 1 / n from the nearest integer. Truncating the double therefore truncates x / n.
    const double d = static_cast<double>(nranks);
    for (size_t i = 0; i < n; ++i) buf[i] = static_cast<T>(static_cast<double>(buf[i]) / d);
  } else {
    // nranks > 0, so the divisor converts exactly and the quotient fits T. Truncates toward zero, like `/`.
    const T d = static_cast<T>(nranks);
    for (size_t i = 0; i < n; ++i) buf[i] = buf[i] / d;
  }
}

template <typename Codec>
void divideWords(uint32_t* __restrict x, size_t n, float d) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t lo = Codec::fromFloat(Codec::toFloat(x[i] & 0xffffu) / d);
    const uint32_t hi = Codec::fromFloat(Codec::toFloat(x[i] >> 16) / d);
    x[i] = lo | (hi << 16);
  }
}

template <typename Codec>
void divide16(void* bufv, size_t n, int nranks) {
  auto* buf = static_cast<unsigned char*>(bufv);
  const float d = static_cast<float>(nranks);
  alignas(64) uint32_t w[kBlockWords];
  const size_t words = n / 2;
  for (size_t off = 0; off < words; off += kBlockWords) {
    const size_t m = std::min(kBlockWords, words - off);
    std::memcpy(w, buf + off * 4, m * 4);
    divideWords<Codec>(w, m, d);
    std::memcpy(buf + off * 4, w, m * 4);
  }
  if (n % 2 != 0) {
    uint16_t x;
    std::memcpy(&x, buf + (n - 1) * 2, 2);
    x = static_cast<uint16_t>(Codec::fromFloat(Codec::toFloat(x) / d));
    std::memcpy(buf + (n - 1) * 2, &x, 2);
  }
}

bool partialOverlap(const void* x, const void* y, size_t bytes) {
  const uintptr_t px = reinterpret_cast<uintptr_t>(x);
  const uintptr_t py = reinterpret_cast<uintptr_t>(y);
  return px != py && px < py + bytes && py < px + bytes;
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t count, ddlDataType_t type, ddlRedOp_t op) {
  if (count == 0) return;
  DDL_ASSERT(opTakesType(op, type));
  const size_t bytes = count * typeSize(type);
  DDL_ASSERT(!partialOverlap(dst, a, bytes) && !partialOverlap(dst, b, bytes));
  switch (type) {
    case ddlInt8:
      return reduceNative<int8_t>(dst, a, b, count, op);
    case ddlUint8:
      return reduceNative<uint8_t>(dst, a, b, count, op);
    case ddlInt32:
      return reduceNative<int32_t>(dst, a, b, count, op);
    case ddlUint32:
      return reduceNative<uint32_t>(dst, a, b, count, op);
    case ddlInt64:
      return reduceNative<int64_t>(dst, a, b, count, op);
    case ddlUint64:
      return reduceNative<uint64_t>(dst, a, b, count, op);
    case ddlFloat16:
#ifdef DDL_X86_VECTOR16
      if (reduceCodecX86<HalfVec, HalfCodec>(dst, a, b, count, op)) return;
#endif
      return reduceCodec<HalfCodec>(dst, a, b, count, op);
    case ddlBfloat16:
#ifdef DDL_X86_VECTOR16
      if (reduceCodecX86<Bfloat16Vec, Bfloat16Codec>(dst, a, b, count, op)) return;
#endif
      return reduceCodec<Bfloat16Codec>(dst, a, b, count, op);
    case ddlFloat32:
      return reduceNative<float>(dst, a, b, count, op);
    case ddlFloat64:
      return reduceNative<double>(dst, a, b, count, op);
    default:
      DDL_ASSERT(validType(type));
  }
}

void finishAvg(void* buf, size_t count, ddlDataType_t type, int nranks) {
  DDL_ASSERT(nranks > 0);
  if (count == 0 || nranks == 1) return;
  switch (type) {
    case ddlInt8:
      return divideNative<int8_t>(buf, count, nranks);
    case ddlUint8:
      return divideNative<uint8_t>(buf, count, nranks);
    case ddlInt32:
      return divideNative<int32_t>(buf, count, nranks);
    case ddlUint32:
      return divideNative<uint32_t>(buf, count, nranks);
    case ddlInt64:
      return divideNative<int64_t>(buf, count, nranks);
    case ddlUint64:
      return divideNative<uint64_t>(buf, count, nranks);
    case ddlFloat16:
      return divide16<HalfCodec>(buf, count, nranks);
    case ddlBfloat16:
      return divide16<Bfloat16Codec>(buf, count, nranks);
    case ddlFloat32:
      return divideNative<float>(buf, count, nranks);
    case ddlFloat64:
      return divideNative<double>(buf, count, nranks);
    default:
      DDL_ASSERT(validType(type));
  }
}

float halfToFloat(uint16_t h) { return halfBitsToFloat(h); }
uint16_t floatToHalf(float f) { return static_cast<uint16_t>(floatToHalfBits(f)); }
float bfloat16ToFloat(uint16_t b) { return bfloat16BitsToFloat(b); }
uint16_t floatToBfloat16(float f) { return static_cast<uint16_t>(floatToBfloat16Bits(f)); }

}  // namespace ddl
