// Tests of the CPU reductions (reduce.h) and of the type/op tables (dtype.h).
//
// Every (type, op) pair is checked element by element against a scalar reference written from the definition
// of the op (integers through __int128, float16/bfloat16 through independent conversions built on frexp and
// nearbyint rather than bit tricks), at odd lengths, out of place, in place on either input, with all three
// buffers equal and at a misaligned start. The float16 and bfloat16 conversions are checked exhaustively on
// every 16-bit pattern, on every rounding midpoint and its neighbours, and on a sweep of float bit patterns.
#include "reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dtype.h"

namespace ddl {
namespace {

// ---- reference conversions: arithmetic on doubles, no bit tricks shared with reduce.cpp ----

double refHalfToDouble(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  double v;
  if (e == 0) {
    v = std::ldexp(m, -24);
  } else if (e == 31) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(1024 + m, e - 25);
  }
  return (h & 0x8000) ? -v : v;
}

double refBfloat16ToDouble(uint16_t b) {
  const int e = (b >> 7) & 0xff;
  const int m = b & 0x7f;
  double v;
  if (e == 0) {
    v = std::ldexp(m, -133);
  } else if (e == 255) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else {
    v = std::ldexp(128 + m, e - 134);
  }
  return (b & 0x8000) ? -v : v;
}

// Nearest value with `mantBits` stored mantissa bits, smallest normal exponent minExp, ties to even; returns
// the bits of the result (exponent field << mantBits plus mantissa), overflow gives the inf pattern `inf`.
// Works because consecutive encodings are consecutive values: bits = ((E - minExp) << mantBits) + n, where n
// counts quanta of 2^(E - mantBits) in [2^mantBits, 2^(mantBits+1)) for normals and in [0, 2^mantBits) for
// subnormals, and a carry to 2^(mantBits+1) lands exactly on the next binade's encoding.
uint16_t refRound(double x, int mantBits, int minExp, uint16_t inf, uint16_t nan) {
  if (std::isnan(x)) return nan;
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double ax = std::fabs(x);
  if (ax == 0) return sign;
  if (std::isinf(ax)) return sign | inf;
  int e;
  std::frexp(ax, &e);  // ax = f * 2^e, f in [0.5, 1): floor(log2(ax)) = e - 1
  const int exp = std::max(e - 1, minExp);
  const double n = std::nearbyint(ax / std::ldexp(1.0, exp - mantBits));  // default mode: ties to even
  const double bits = std::ldexp(exp - minExp, mantBits) + n;
  return sign | (bits >= inf ? inf : static_cast<uint16_t>(bits));
}

uint16_t refDoubleToHalf(double x) { return refRound(x, 10, -14, 0x7c00, 0x7e00); }
uint16_t refDoubleToBfloat16(double x) { return refRound(x, 7, -126, 0x7f80, 0x7fc0); }

bool isHalfNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool isBfloat16Nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

uint32_t bitsOf(float f) { return std::bit_cast<uint32_t>(f); }
float floatOf(uint32_t u) { return std::bit_cast<float>(u); }

// ---- dtype.h ----

TEST(DtypeTest, SizesAndNames) {
  const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
  const char* names[] = {"int8",   "uint8",   "int32",    "uint32",  "int64",
                         "uint64", "float16", "bfloat16", "float32", "float64"};
  for (int t = 0; t < ddlNumTypes; ++t) {
    const auto type = static_cast<ddlDataType_t>(t);
    EXPECT_TRUE(validType(type));
    EXPECT_EQ(typeSize(type), sizes[t]) << names[t];
    EXPECT_STREQ(typeName(type), names[t]);
    EXPECT_EQ(parseType(names[t]), type) << names[t];
  }
  EXPECT_FALSE(validType(ddlNumTypes));
  EXPECT_FALSE(validType(static_cast<ddlDataType_t>(-1)));
  EXPECT_STREQ(typeName(ddlNumTypes), "invalid");
  EXPECT_STREQ(typeName(static_cast<ddlDataType_t>(-1)), "invalid");

  const char* ops[] = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};
  for (int o = 0; o < ddlNumOps; ++o) {
    const auto op = static_cast<ddlRedOp_t>(o);
    EXPECT_TRUE(validOp(op));
    EXPECT_STREQ(opName(op), ops[o]);
    EXPECT_EQ(parseOp(ops[o]), op);
  }
  EXPECT_FALSE(validOp(ddlNumOps));
  EXPECT_FALSE(validOp(static_cast<ddlRedOp_t>(-1)));
  EXPECT_STREQ(opName(ddlNumOps), "invalid");
}

TEST(DtypeTest, ParsesNcclTestsNames) {
  EXPECT_EQ(parseType("half"), ddlFloat16);
  EXPECT_EQ(parseType("fp16"), ddlFloat16);
  EXPECT_EQ(parseType("bf16"), ddlBfloat16);
  EXPECT_EQ(parseType("float"), ddlFloat32);
  EXPECT_EQ(parseType("fp32"), ddlFloat32);
  EXPECT_EQ(parseType("double"), ddlFloat64);
  EXPECT_EQ(parseType("fp64"), ddlFloat64);
  EXPECT_EQ(parseType("int"), ddlInt32);
  EXPECT_EQ(parseType("uint"), ddlUint32);
  EXPECT_EQ(parseType("char"), ddlInt8);
  for (const char* bad : {"", "Float32", "float8", "int16", "float32 ", "fp"}) {
    EXPECT_EQ(parseType(bad), std::nullopt) << "'" << bad << "'";
  }
  for (const char* bad : {"", "Sum", "mean", "average", "sum "}) {
    EXPECT_EQ(parseOp(bad), std::nullopt) << "'" << bad << "'";
  }
}

// ---- float16 conversions ----

TEST(HalfTest, EveryPatternWidensExactlyAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<uint16_t>(h);
    const float f = halfToFloat(bits);
    const double ref = refHalfToDouble(bits);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << h;
      ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
    } else {
      ASSERT_EQ(bitsOf(f), bitsOf(static_cast<float>(ref))) << std::hex << h;  // also tells -0 from 0
    }
    // NaNs included: the payload's bits map onto the top of the float's payload and back.
    ASSERT_EQ(floatToHalf(f), bits) << std::hex << h;
  }
}

TEST(HalfTest, RoundsToNearestEvenAtEveryMidpoint) {
  // For each pair of neighbouring finite halves (and the largest half and the overflow threshold), the
  // midpoint and the floats just either side of it. A half has 11 significant bits, so midpoints are floats.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double lo = refHalfToDouble(static_cast<uint16_t>(h));
    const double hi = h + 1 < 0x7c00 ? refHalfToDouble(static_cast<uint16_t>(h + 1)) : 65536.0;
    const float mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2);
    for (const float x :
         {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) {
      ASSERT_EQ(floatToHalf(x), refDoubleToHalf(x)) << x;
      ASSERT_EQ(floatToHalf(-x), refDoubleToHalf(-x)) << -x;
    }
  }
}

TEST(HalfTest, FloatSweepMatchesReference) {
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 997) {
    const float x = floatOf(static_cast<uint32_t>(u));
    const uint16_t got = floatToHalf(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(isHalfNan(got)) << std::hex << u << " -> " << got;
      ASSERT_EQ(got & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u;
    } else {
      ASSERT_EQ(got, refDoubleToHalf(x)) << std::hex << u;
    }
  }
}

TEST(HalfTest, ChosenRoundingCases) {
  const float sub = std::ldexp(1.0f, -24);  // smallest subnormal half
  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie, 1 is even: down
  EXPECT_EQ(floatToHalf(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie, 1+2^-10 is odd: up
  EXPECT_EQ(floatToHalf(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(floatToHalf(2047.0f / 1024), 0x3c00 + 0x3ff);
  EXPECT_EQ(floatToHalf(4095.0f / 2048), 0x4000);  // rounds up into the next binade
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);        // largest finite
  EXPECT_EQ(floatToHalf(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00);  // tie between 65504 and 2^16: even is 2^16, which is inf
  EXPECT_EQ(floatToHalf(-65520.0f), 0xfc00);
  EXPECT_EQ(floatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(floatToHalf(1023.5f * sub), 0x0400);          // tie, rounds up to even 1024 = smallest normal
  EXPECT_EQ(floatToHalf(1022.5f * sub), 0x03fe);          // tie, rounds down to even
  EXPECT_EQ(floatToHalf(sub), 0x0001);
  EXPECT_EQ(floatToHalf(-sub), 0x8001);
  EXPECT_EQ(floatToHalf(0.5f * sub), 0x0000);  // tie between 0 and the smallest subnormal: 0 is even
  EXPECT_EQ(floatToHalf(-0.5f * sub), 0x8000);
  EXPECT_EQ(floatToHalf(std::nextafter(0.5f * sub, 1.0f)), 0x0001);
  EXPECT_EQ(floatToHalf(0.25f * sub), 0x0000);
  EXPECT_EQ(floatToHalf(1.5f * sub), 0x0002);  // tie, up to even
  EXPECT_EQ(floatToHalf(2.5f * sub), 0x0002);  // tie, down to even
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(floatToHalf(0.0f), 0x0000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
  EXPECT_TRUE(isHalfNan(floatToHalf(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(isHalfNan(floatToHalf(floatOf(0x7f800001))));  // payload only in dropped bits: NaN, not inf
  EXPECT_EQ(floatToHalf(floatOf(0xff800001)) & 0x8000, 0x8000);
  EXPECT_EQ(halfToFloat(0x0001), sub);
  EXPECT_EQ(halfToFloat(0x03ff), 1023 * sub);
  EXPECT_EQ(halfToFloat(0x3555), 0x1.554p-2f);  // 0.333252
  EXPECT_EQ(halfToFloat(0xc000), -2.0f);
  EXPECT_EQ(halfToFloat(0x7c00), std::numeric_limits<float>::infinity());
}

// ---- bfloat16 conversions ----

TEST(Bfloat16Test, EveryPatternWidensExactlyAndRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const float f = bfloat16ToFloat(bits);
    const double ref = refBfloat16ToDouble(bits);
    const uint16_t back = floatToBfloat16(f);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << b;
      ASSERT_TRUE(isBfloat16Nan(back)) << std::hex << b << " -> " << back;
      ASSERT_EQ(back & 0x8000u, b & 0x8000u);
      ASSERT_EQ(back & 0x40, 0x40) << "quiet";
    } else {
      ASSERT_EQ(bitsOf(f), bitsOf(static_cast<float>(ref))) << std::hex << b;
      ASSERT_EQ(back, bits) << std::hex << b;
    }
  }
}

TEST(Bfloat16Test, RoundsToNearestEvenAtEveryMidpoint) {
  for (uint32_t b = 0; b < 0x7f80; ++b) {
    const double lo = refBfloat16ToDouble(static_cast<uint16_t>(b));
    const double hi =
        b + 1 < 0x7f80 ? refBfloat16ToDouble(static_cast<uint16_t>(b + 1)) : std::ldexp(1.0, 128);
    const double midExact = (lo + hi) / 2;
    const float mid = static_cast<float>(midExact);  // 9 significant bits: a float, except past FLT_MAX
    ASSERT_TRUE(static_cast<double>(mid) == midExact || b + 1 == 0x7f80);
    for (const float x :
         {static_cast<float>(lo), mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
      if (std::isinf(x)) continue;
      ASSERT_EQ(floatToBfloat16(x), refDoubleToBfloat16(x)) << x;
      ASSERT_EQ(floatToBfloat16(-x), refDoubleToBfloat16(-x)) << -x;
    }
  }
}

TEST(Bfloat16Test, FloatSweepMatchesReference) {
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 997) {
    const float x = floatOf(static_cast<uint32_t>(u));
    const uint16_t got = floatToBfloat16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(isBfloat16Nan(got)) << std::hex << u << " -> " << got;
      ASSERT_EQ(got & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u;
    } else {
      ASSERT_EQ(got, refDoubleToBfloat16(x)) << std::hex << u;
    }
  }
}

TEST(Bfloat16Test, ChosenRoundingCases) {
  EXPECT_EQ(floatToBfloat16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBfloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie, down to even
  EXPECT_EQ(floatToBfloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie, up to even
  EXPECT_EQ(floatToBfloat16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  EXPECT_EQ(floatToBfloat16(floatOf(0x7f7f7fff)), 0x7f7f);  // just below the last midpoint: largest finite
  EXPECT_EQ(floatToBfloat16(floatOf(0x7f7f8000)), 0x7f80);  // the midpoint: even is inf
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::max()), 0x7f80);  // inf, not NaN
  EXPECT_EQ(floatToBfloat16(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(floatToBfloat16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(floatToBfloat16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(floatToBfloat16(floatOf(0x00008000)), 0x0000);  // subnormal tie, down to even
  EXPECT_EQ(floatToBfloat16(floatOf(0x00018000)), 0x0002);  // subnormal tie, up to even
  EXPECT_EQ(floatToBfloat16(floatOf(0x007fffff)), 0x0080);  // largest subnormal float: smallest normal bf16
  EXPECT_EQ(floatToBfloat16(-0.0f), 0x8000);
  EXPECT_EQ(floatToBfloat16(floatOf(0x7f800001)), 0x7fc0);  // signalling, payload dropped: quiet NaN
  EXPECT_EQ(floatToBfloat16(floatOf(0x7fffffff)), 0x7fff);  // would carry into the sign if rounded
  EXPECT_EQ(floatToBfloat16(floatOf(0xffc00001)), 0xffc0);
  EXPECT_EQ(floatToBfloat16(floatOf(0xff810000)), 0xffc1);  // signalling with payload: quieted, payload kept
  EXPECT_EQ(bfloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(bfloat16ToFloat(0xc040), -3.0f);
  EXPECT_EQ(bfloat16ToFloat(0x0001), std::ldexp(1.0f, -133));
}

// ---- reductions against a scalar reference ----

template <typename T>
T refIntOp(T a, T b, ddlRedOp_t op) {
  // Exact in 128 bits; the conversion back to T is modular (C++20), which is the wraparound we want.
  using W = std::conditional_t<std::is_signed_v<T>, __int128, unsigned __int128>;
  switch (op) {
    case ddlSum:
    case ddlAvg:
      return static_cast<T>(static_cast<W>(a) + static_cast<W>(b));
    case ddlProd:
      return static_cast<T>(static_cast<W>(a) * static_cast<W>(b));
    case ddlMin:
      return a < b ? a : b;
    case ddlBand:
      return static_cast<T>(a & b);
    case ddlBor:
      return static_cast<T>(a | b);
    case ddlBxor:
      return static_cast<T>(a ^ b);
    default:
      return a > b ? a : b;
  }
}

// Float ops as documented in reduce.cpp: min/max return the second operand unless the comparison holds.
template <typename F>
F refFloatOp(F a, F b, ddlRedOp_t op) {
  switch (op) {
    case ddlSum:
    case ddlAvg:
      return a + b;
    case ddlProd:
      return a * b;
    case ddlMin:
      return a < b ? a : b;
    default:
      return a > b ? a : b;
  }
}

template <typename T>
struct IntTraits {
  using Elem = T;
  static T ref(T a, T b, ddlRedOp_t op) { return refIntOp(a, b, op); }
  static bool same(T x, T y) { return x == y; }
  static T random(std::mt19937_64& rng) {
    // Full range, with a bias to small values so that min/max/prod see ties and signs mixed.
    const uint64_t r = rng();
    return (r & 3) == 0 ? static_cast<T>(static_cast<int64_t>(r >> 60) - 8) : static_cast<T>(r >> 2);
  }
};

template <typename F>
struct FloatTraits {
  using Elem = F;
  static F ref(F a, F b, ddlRedOp_t op) { return refFloatOp(a, b, op); }
  static bool same(F x, F y) {
    return (std::isnan(x) && std::isnan(y)) || std::memcmp(&x, &y, sizeof(F)) == 0;
  }
  static F random(std::mt19937_64& rng) {
    const uint64_t r = rng();
    if (r % 16 == 0) {
      const F specials[] = {0,
                            -F(0),
                            1,
                            -1,
                            std::numeric_limits<F>::infinity(),
                            -std::numeric_limits<F>::infinity(),
                            std::numeric_limits<F>::quiet_NaN(),
                            std::numeric_limits<F>::denorm_min(),
                            std::numeric_limits<F>::max(),
                            std::numeric_limits<F>::lowest()};
      return specials[(r >> 8) % 10];
    }
    const double unit = static_cast<double>(r >> 11) / static_cast<double>(uint64_t{1} << 53) * 2 - 1;
    return static_cast<F>(std::ldexp(unit, static_cast<int>((r >> 4) % 41) - 20));
  }
};

// float16/bfloat16: widen, reduce in float, round to nearest even (the documented contract), with the
// reference conversions.
template <double (*toDouble)(uint16_t), uint16_t (*fromDouble)(double), bool (*isNan)(uint16_t)>
struct SixteenTraits {
  using Elem = uint16_t;
  static uint16_t ref(uint16_t a, uint16_t b, ddlRedOp_t op) {
    return fromDouble(refFloatOp(static_cast<float>(toDouble(a)), static_cast<float>(toDouble(b)), op));
  }
  static bool same(uint16_t x, uint16_t y) { return (isNan(x) && isNan(y)) || x == y; }
  static uint16_t random(std::mt19937_64& rng) { return static_cast<uint16_t>(rng()); }  // every pattern
};

using HalfTraits = SixteenTraits<refHalfToDouble, refDoubleToHalf, isHalfNan>;
using Bfloat16Traits = SixteenTraits<refBfloat16ToDouble, refDoubleToBfloat16, isBfloat16Nan>;

enum class Mode { kOutOfPlace, kIntoA, kIntoB, kAllSame, kMisaligned };
const char* modeName(Mode m) {
  const char* names[] = {"out-of-place", "dst==a", "dst==b", "dst==a==b", "misaligned"};
  return names[static_cast<int>(m)];
}

// Runs reduce once in the given aliasing mode and checks every element and the element past the end.
template <typename Traits>
void checkReduce(ddlDataType_t type, ddlRedOp_t op, size_t n, Mode mode, uint64_t seed) {
  using T = typename Traits::Elem;
  SCOPED_TRACE(std::string(typeName(type)) + " " + opName(op) + " n=" + std::to_string(n) + " " +
               modeName(mode));
  std::mt19937_64 rng(seed);
  // One spare element at each end: the front one shifts the start for kMisaligned, the back one is a canary.
  std::vector<T> a(n + 2), b(n + 2);
  for (auto& x : a) x = Traits::random(rng);
  for (auto& x : b) x = Traits::random(rng);
  const size_t off = mode == Mode::kMisaligned ? 1 : 0;
  std::vector<T> expected(n);
  for (size_t i = 0; i < n; ++i) {
    const T& x = a[off + i];
    expected[i] = Traits::ref(x, mode == Mode::kAllSame ? x : b[off + i], op);
  }
  const std::vector<T> a0 = a, b0 = b;
  std::vector<T> out(n + 2, T{});
  T* dst = out.data() + off;
  const T* pa = a.data() + off;
  const T* pb = b.data() + off;
  switch (mode) {  // off is 0 in these modes, so pa is a.data()
    case Mode::kIntoA:
      dst = a.data();
      break;
    case Mode::kIntoB:
      dst = b.data();
      break;
    case Mode::kAllSame:
      dst = a.data();
      pb = a.data();
      break;
    default:
      break;
  }
  const T canary = dst[n];
  reduce(dst, pa, pb, n, type, op);
  size_t bad = 0;
  for (size_t i = 0; i < n && bad < 5; ++i) {
    if (!Traits::same(dst[i], expected[i])) {
      ++bad;
      ADD_FAILURE() << "element " << i << ": a=" << +a0[off + i] << " b=" << +b0[off + i] << " got "
                    << +dst[i] << " want " << +expected[i];
    }
  }
  EXPECT_EQ(std::memcmp(&dst[n], &canary, sizeof(T)), 0) << "wrote past count";
  if (mode == Mode::kOutOfPlace || mode == Mode::kMisaligned) {
    EXPECT_EQ(std::memcmp(a.data(), a0.data(), a.size() * sizeof(T)), 0) << "input a changed";
    EXPECT_EQ(std::memcmp(b.data(), b0.data(), b.size() * sizeof(T)), 0) << "input b changed";
  }
  if (mode == Mode::kIntoA) {
    EXPECT_EQ(std::memcmp(b.data(), b0.data(), b.size() * sizeof(T)), 0) << "input b changed";
  }
  if (mode == Mode::kIntoB) {
    EXPECT_EQ(std::memcmp(a.data(), a0.data(), a.size() * sizeof(T)), 0) << "input a changed";
  }
}

template <typename Traits>
void checkAllModes(ddlDataType_t type, ddlRedOp_t op, const std::vector<size_t>& sizes) {
  uint64_t seed = 1 + type * 100 + op * 10;
  for (size_t n : sizes) {
    for (Mode mode : {Mode::kOutOfPlace, Mode::kIntoA, Mode::kIntoB, Mode::kAllSame, Mode::kMisaligned}) {
      checkReduce<Traits>(type, op, n, mode, ++seed);
    }
  }
}

class ReduceTest : public ::testing::TestWithParam<std::tuple<ddlDataType_t, ddlRedOp_t>> {};

TEST_P(ReduceTest, MatchesScalarReference) {
  const auto [type, op] = GetParam();
  std::vector<size_t> sizes = {0, 1, 2, 3, 7, 15, 16, 17, 33, 255, 256, 257, 1000};
  if (type == ddlFloat32 || type == ddlFloat16 || type == ddlInt8 || type == ddlBfloat16) {
    sizes.push_back(1000003);
  }
  switch (type) {
    case ddlInt8:
      return checkAllModes<IntTraits<int8_t>>(type, op, sizes);
    case ddlUint8:
      return checkAllModes<IntTraits<uint8_t>>(type, op, sizes);
    case ddlInt32:
      return checkAllModes<IntTraits<int32_t>>(type, op, sizes);
    case ddlUint32:
      return checkAllModes<IntTraits<uint32_t>>(type, op, sizes);
    case ddlInt64:
      return checkAllModes<IntTraits<int64_t>>(type, op, sizes);
    case ddlUint64:
      return checkAllModes<IntTraits<uint64_t>>(type, op, sizes);
    case ddlFloat16:
      return checkAllModes<HalfTraits>(type, op, sizes);
    case ddlBfloat16:
      return checkAllModes<Bfloat16Traits>(type, op, sizes);
    case ddlFloat32:
      return checkAllModes<FloatTraits<float>>(type, op, sizes);
    case ddlFloat64:
      return checkAllModes<FloatTraits<double>>(type, op, sizes);
    default:
      FAIL() << "unknown type " << type;
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ReduceTest,
                         ::testing::Combine(::testing::Values(ddlInt8, ddlUint8, ddlInt32, ddlUint32,
                                                              ddlInt64, ddlUint64, ddlFloat16, ddlBfloat16,
                                                              ddlFloat32, ddlFloat64),
                                            ::testing::Values(ddlSum, ddlProd, ddlMin, ddlMax, ddlAvg)),
                         [](const auto& info) {
                           return std::string(typeName(std::get<0>(info.param))) + "_" +
                                  opName(std::get<1>(info.param));
                         });
INSTANTIATE_TEST_SUITE_P(BitwiseOnIntegers, ReduceTest,
                         ::testing::Combine(::testing::Values(ddlInt8, ddlUint8, ddlInt32, ddlUint32, ddlInt64,
                                                              ddlUint64),
                                            ::testing::Values(ddlBand, ddlBor, ddlBxor)),
                         [](const auto& info) {
                           return std::string(typeName(std::get<0>(info.param))) + "_" +
                                  opName(std::get<1>(info.param));
                         });

TEST(DtypeTest, BitwiseOpsTakeIntegerTypesOnly) {
  for (int t = 0; t < ddlNumTypes; ++t) {
    const auto type = static_cast<ddlDataType_t>(t);
    for (ddlRedOp_t op : {ddlBand, ddlBor, ddlBxor}) EXPECT_EQ(opTakesType(op, type), t <= ddlUint64) << t;
    for (ddlRedOp_t op : {ddlSum, ddlProd, ddlMin, ddlMax, ddlAvg}) EXPECT_TRUE(opTakesType(op, type)) << t;
  }
  EXPECT_FALSE(opTakesType(ddlNumOps, ddlInt32));
  EXPECT_FALSE(opTakesType(ddlSum, ddlNumTypes));
}

// ---- explicit wraparound ----

template <typename T>
T reduceOne(T a, T b, ddlDataType_t type, ddlRedOp_t op) {
  T out{};
  reduce(&out, &a, &b, 1, type, op);
  return out;
}

TEST(ReduceWrapTest, SignedAndUnsignedIntegersWrapAround) {
  constexpr auto i32max = std::numeric_limits<int32_t>::max();
  constexpr auto i32min = std::numeric_limits<int32_t>::min();
  constexpr auto i64max = std::numeric_limits<int64_t>::max();
  constexpr auto i64min = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(reduceOne<int8_t>(127, 1, ddlInt8, ddlSum), -128);
  EXPECT_EQ(reduceOne<int8_t>(-128, -1, ddlInt8, ddlSum), 127);
  EXPECT_EQ(reduceOne<int8_t>(-128, -1, ddlInt8, ddlProd), -128);
  EXPECT_EQ(reduceOne<int8_t>(100, 3, ddlInt8, ddlProd), 44);  // 300 - 256
  EXPECT_EQ(reduceOne<uint8_t>(255, 1, ddlUint8, ddlSum), 0);
  EXPECT_EQ(reduceOne<uint8_t>(200, 2, ddlUint8, ddlProd), 144);  // 400 - 256
  EXPECT_EQ(reduceOne<uint8_t>(255, 255, ddlUint8, ddlAvg), 254);
  EXPECT_EQ(reduceOne<int32_t>(i32max, 1, ddlInt32, ddlSum), i32min);
  EXPECT_EQ(reduceOne<int32_t>(i32min, -1, ddlInt32, ddlProd), i32min);
  EXPECT_EQ(reduceOne<int32_t>(65536, 65536, ddlInt32, ddlProd), 0);
  EXPECT_EQ(reduceOne<int32_t>(i32max, i32max, ddlInt32, ddlAvg), -2);
  EXPECT_EQ(reduceOne<uint32_t>(0xffffffffu, 0xffffffffu, ddlUint32, ddlProd), 1u);
  EXPECT_EQ(reduceOne<uint32_t>(0xffffffffu, 2u, ddlUint32, ddlSum), 1u);
  EXPECT_EQ(reduceOne<int64_t>(i64max, 1, ddlInt64, ddlSum), i64min);
  EXPECT_EQ(reduceOne<int64_t>(i64max, 2, ddlInt64, ddlProd), -2);
  EXPECT_EQ(reduceOne<int64_t>(i64min, -1, ddlInt64, ddlProd), i64min);
  EXPECT_EQ(reduceOne<uint64_t>(~uint64_t{0}, ~uint64_t{0}, ddlUint64, ddlProd), 1u);
  EXPECT_EQ(reduceOne<uint64_t>(~uint64_t{0}, 5, ddlUint64, ddlSum), 4u);
  EXPECT_EQ(reduceOne<int8_t>(-128, 127, ddlInt8, ddlMin), -128);
  EXPECT_EQ(reduceOne<uint64_t>(~uint64_t{0}, 1, ddlUint64, ddlMax), ~uint64_t{0});
  EXPECT_EQ(reduceOne<int64_t>(i64min, i64max, ddlInt64, ddlMax), i64max);
}

// ---- finishAvg ----

template <typename T>
std::vector<T> divided(std::vector<T> v, ddlDataType_t type, int nranks) {
  finishAvg(v.data(), v.size(), type, nranks);
  return v;
}

TEST(FinishAvgTest, IntegersTruncateTowardZero) {
  constexpr auto i32max = std::numeric_limits<int32_t>::max();
  constexpr auto i32min = std::numeric_limits<int32_t>::min();
  constexpr auto i64min = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(divided<int32_t>({-7, -6, -5, -1, 0, 1, 5, 6, 7, i32min, i32max}, ddlInt32, 2),
            (std::vector<int32_t>{-3, -3, -2, 0, 0, 0, 2, 3, 3, -1073741824, 1073741823}));
  EXPECT_EQ(divided<int32_t>({-7, -6, -5, -2, 2, 5, 6, 7}, ddlInt32, 3),
            (std::vector<int32_t>{-2, -2, -1, 0, 0, 1, 2, 2}));
  EXPECT_EQ(divided<int8_t>({-128, -127, -3, 127}, ddlInt8, 3), (std::vector<int8_t>{-42, -42, -1, 42}));
  // nranks does not fit in int8: still divides, not by a truncated divisor.
  EXPECT_EQ(divided<int8_t>({-128, 127, -1}, ddlInt8, 200), (std::vector<int8_t>{0, 0, 0}));
  EXPECT_EQ(divided<int8_t>({-128, 127}, ddlInt8, 100), (std::vector<int8_t>{-1, 1}));
  EXPECT_EQ(divided<uint8_t>({255, 199, 200}, ddlUint8, 200), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(divided<uint8_t>({255, 7}, ddlUint8, 300), (std::vector<uint8_t>{0, 0}));
  EXPECT_EQ(divided<uint32_t>({0xffffffffu, 5u}, ddlUint32, 2), (std::vector<uint32_t>{0x7fffffffu, 2u}));
  EXPECT_EQ(divided<int64_t>({i64min, -9, 9}, ddlInt64, 3),
            (std::vector<int64_t>{-3074457345618258602, -3, 3}));
  EXPECT_EQ(divided<uint64_t>({~uint64_t{0}, 10}, ddlUint64, 3),
            (std::vector<uint64_t>{0x5555555555555555u, 3}));
  EXPECT_EQ(divided<int32_t>({-7, 7}, ddlInt32, 1), (std::vector<int32_t>{-7, 7}));
}

template <typename T>
void checkIntAvgSweep(ddlDataType_t type) {
  std::mt19937_64 rng(type + 7);
  for (int nranks : {2, 3, 5, 7, 8, 255, 1000}) {
    std::vector<T> v(1001);
    for (auto& x : v) x = IntTraits<T>::random(rng);
    const std::vector<T> out = divided(v, type, nranks);
    for (size_t i = 0; i < v.size(); ++i) {
      // Truncation toward zero written out: divide magnitudes, then restore the sign.
      const __int128 x = v[i];
      const __int128 q = (x < 0 ? -x : x) / nranks;
      ASSERT_EQ(out[i], static_cast<T>(x < 0 ? -q : q)) << typeName(type) << " " << +v[i] << " / " << nranks;
    }
  }
}

TEST(FinishAvgTest, IntegerSweepMatchesReference) {
  checkIntAvgSweep<int8_t>(ddlInt8);
  checkIntAvgSweep<uint8_t>(ddlUint8);
  checkIntAvgSweep<int32_t>(ddlInt32);
  checkIntAvgSweep<uint32_t>(ddlUint32);
  checkIntAvgSweep<int64_t>(ddlInt64);
  checkIntAvgSweep<uint64_t>(ddlUint64);
}

TEST(FinishAvgTest, Floats) {
  EXPECT_EQ(divided<double>({1.0, 7.0, -1.0, 0.0, 3e300}, ddlFloat64, 4),
            (std::vector<double>{0.25, 1.75, -0.25, 0.0, 7.5e299}));
  EXPECT_EQ(divided<double>({1.0}, ddlFloat64, 3)[0], 0x1.5555555555555p-2);
  EXPECT_EQ(divided<float>({1.0f, -6.0f}, ddlFloat32, 3), (std::vector<float>{0x1.555556p-2f, -2.0f}));
  // float32 against division in double rounded once to float (double rounding is harmless at 53 vs 24 bits).
  std::mt19937_64 rng(11);
  std::vector<float> v(4097);
  for (auto& x : v) x = FloatTraits<float>::random(rng);
  for (int nranks : {3, 6, 7, 1000}) {
    const std::vector<float> out = divided(v, ddlFloat32, nranks);
    for (size_t i = 0; i < v.size(); ++i) {
      ASSERT_TRUE(FloatTraits<float>::same(out[i], static_cast<float>(static_cast<double>(v[i]) / nranks)))
          << v[i] << " / " << nranks << " = " << out[i];
    }
  }
}

// float16/bfloat16 divide in float and round once more; with 24 >= 2 * 11 + 2 bits that equals rounding the
// exact quotient, which the reference computes in double.
TEST(FinishAvgTest, SixteenBitFloatsEveryPattern) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t i = 0; i < 0x10000; ++i) all[i] = static_cast<uint16_t>(i);
  for (int nranks : {2, 3, 7, 10}) {
    const std::vector<uint16_t> half = divided(all, ddlFloat16, nranks);
    const std::vector<uint16_t> bf = divided(all, ddlBfloat16, nranks);
    for (uint32_t i = 0; i < 0x10000; ++i) {
      ASSERT_TRUE(HalfTraits::same(half[i], refDoubleToHalf(refHalfToDouble(all[i]) / nranks)))
          << std::hex << i << " / " << std::dec << nranks << " -> " << std::hex << half[i];
      ASSERT_TRUE(Bfloat16Traits::same(bf[i], refDoubleToBfloat16(refBfloat16ToDouble(all[i]) / nranks)))
          << std::hex << i << " / " << std::dec << nranks << " -> " << std::hex << bf[i];
    }
  }
}

}  // namespace
}  // namespace ddl
