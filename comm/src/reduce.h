// Element-wise reductions for every ddl type and op, on the CPU.
//
// Portable C++ written so that GCC/Clang vectorise it on x86-64 (SSE/AVX) and POWER (VSX) alike: plain loops
// over __restrict pointers, no intrinsics. float16 and bfloat16 are widened to float, reduced, and rounded back
// to nearest-even, element by element.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ddl/ddl.h"

namespace ddl {

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b exactly (in place), never partially.
// ddlAvg reduces like ddlSum; the division happens once, in finishAvg. Requires opTakesType(op, type): bitwise
// ops on integer types only.
void reduce(void* dst, const void* a, const void* b, size_t count, ddlDataType_t type, ddlRedOp_t op);

// In place: buf[i] /= nranks (integer types: truncating division), for the final step of ddlAvg.
void finishAvg(void* buf, size_t count, ddlDataType_t type, int nranks);

// IEEE binary16 and bfloat16 conversions (round to nearest even; NaN stays NaN; overflow gives inf).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

}  // namespace ddl
