// Test inputs and expected results for every type and op (bitwise ops: integer types only): rank r's element i is a small integer (or half) chosen
// so that every reduction over up to 8 ranks is exact in every type, and the expected result is computed in
// double. Shared by the CPU algorithm tests and the CUDA allreduce tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "ddl/ddl.h"
#include "dtype.h"
#include "reduce.h"

namespace ddl::test_util {

// Input value of rank r, element i: small integers (and halves for float types, which stay exact) chosen per
// op so that every reduction over up to 8 ranks is exact in every type.
inline double inputValue(ddlDataType_t t, ddlRedOp_t op, int r, size_t i) {
  const bool is_signed = t == ddlInt8 || t == ddlInt32 || t == ddlInt64;
  const bool is_float = t == ddlFloat16 || t == ddlBfloat16 || t == ddlFloat32 || t == ddlFloat64;
  switch (op) {
    case ddlProd: return ((i + r) % 5 == 0) ? 2.0 : (is_signed && (i + r) % 7 == 3 ? -1.0 : 1.0);
    case ddlMin:
    case ddlMax: {
      double v = static_cast<double>((i * 7 + r * 13) % 23);
      if (is_signed || is_float) v -= 11;
      if (is_float && (i + r) % 3 == 0) v += 0.5;
      return v;
    }
    default: {
      double v = static_cast<double>((i + 3 * r) % 4);
      if (is_signed || is_float) v -= 1;
      if (is_float && (i % 2)) v += 0.5;
      return v;
    }
  }
}

// Stores v (exactly representable) as type t at p.
inline void storeValue(ddlDataType_t t, void* p, double v) {
  switch (t) {
    case ddlInt8: *static_cast<int8_t*>(p) = static_cast<int8_t>(v); break;
    case ddlUint8: *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v); break;
    case ddlInt32: *static_cast<int32_t*>(p) = static_cast<int32_t>(v); break;
    case ddlUint32: *static_cast<uint32_t*>(p) = static_cast<uint32_t>(v); break;
    case ddlInt64: *static_cast<int64_t*>(p) = static_cast<int64_t>(v); break;
    case ddlUint64: *static_cast<uint64_t*>(p) = static_cast<uint64_t>(v); break;
    case ddlFloat16: *static_cast<uint16_t*>(p) = floatToHalf(static_cast<float>(v)); break;
    case ddlBfloat16: *static_cast<uint16_t*>(p) = floatToBfloat16(static_cast<float>(v)); break;
    case ddlFloat32: *static_cast<float*>(p) = static_cast<float>(v); break;
    case ddlFloat64: *static_cast<double*>(p) = v; break;
    default: FAIL();
  }
}

// The expected result of element i, stored as type t at p.
inline void expectedValue(ddlDataType_t t, ddlRedOp_t op, int nranks, size_t i, void* p) {
  double acc = inputValue(t, op, 0, i);
  for (int r = 1; r < nranks; ++r) {
    double v = inputValue(t, op, r, i);
    const auto a = static_cast<long long>(acc), b = static_cast<long long>(v);
    switch (op) {
      case ddlProd: acc *= v; break;
      case ddlMin: acc = std::min(acc, v); break;
      case ddlMax: acc = std::max(acc, v); break;
      case ddlBand: acc = static_cast<double>(a & b); break;  // integer types only: two's complement
      case ddlBor: acc = static_cast<double>(a | b); break;
      case ddlBxor: acc = static_cast<double>(a ^ b); break;
      default: acc += v; break;
    }
  }
  if (op != ddlAvg) return storeValue(t, p, acc);
  switch (t) {
    case ddlFloat64: storeValue(t, p, acc / nranks); break;
    case ddlFloat32: *static_cast<float*>(p) = static_cast<float>(acc) / static_cast<float>(nranks); break;
    case ddlFloat16: *static_cast<uint16_t*>(p) = floatToHalf(static_cast<float>(acc) / nranks); break;
    case ddlBfloat16: *static_cast<uint16_t*>(p) = floatToBfloat16(static_cast<float>(acc) / nranks); break;
    default: storeValue(t, p, std::trunc(acc / nranks)); break;  // integers: C++ truncating division
  }
}

inline std::vector<char> makeInput(ddlDataType_t t, ddlRedOp_t op, int r, size_t count) {
  const size_t es = typeSize(t);
  std::vector<char> buf(count * es);
  for (size_t i = 0; i < count; ++i) storeValue(t, buf.data() + i * es, inputValue(t, op, r, i));
  return buf;
}

inline std::vector<char> makeExpected(ddlDataType_t t, ddlRedOp_t op, int nranks, size_t count) {
  const size_t es = typeSize(t);
  std::vector<char> buf(count * es);
  for (size_t i = 0; i < count; ++i) expectedValue(t, op, nranks, i, buf.data() + i * es);
  return buf;
}

}  // namespace ddl::test_util
