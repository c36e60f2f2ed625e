// Data types and reduction ops: sizes, names, parsing.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "ddl/ddl.h"

namespace ddl {

bool validType(ddlDataType_t t);
bool validOp(ddlRedOp_t op);
size_t typeSize(ddlDataType_t t);  // bytes per element; requires validType
bool isIntegerType(ddlDataType_t t);  // int8 .. uint64
bool isBitwiseOp(ddlRedOp_t op);      // band, bor, bxor
// Both valid, and the op defined on the type: bitwise ops take integer types only.
bool opTakesType(ddlRedOp_t op, ddlDataType_t t);
const char* typeName(ddlDataType_t t);  // "float32", ...; "invalid" when out of range
const char* opName(ddlRedOp_t op);      // "sum", ...; "invalid" when out of range
// Accepts the names above and the nccl-tests short names (int8, uint8, int32, uint32, int64, uint64, half,
// bfloat16, float, double, float16, bf16, fp16, fp32, fp64).
std::optional<ddlDataType_t> parseType(std::string_view name);
std::optional<ddlRedOp_t> parseOp(std::string_view name);
// The bytes of count elements of elem bytes, factor times over (a buffer of every rank's block); throws
// ddlInvalidArgument when they do not fit in a size_t.
size_t checkedBytes(size_t count, size_t elem, size_t factor = 1);

}  // namespace ddl
