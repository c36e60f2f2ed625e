// Sizes, names and parsing of ddl's data types and reduction ops.
//
// The canonical names (int8 ... float64, sum ... avg) are what libddl prints in messages and dumps; parsing
// also takes the short names nccl-tests and its users type (half, fp16, bf16, float, double, int, ...), so a
// benchmark command line written for NCCL works unchanged. Names are matched exactly (lower case).
#include "dtype.h"

#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "error.h"

namespace ddl {
namespace {

constexpr std::array<const char*, ddlNumTypes> kTypeNames = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16", "float32", "float64",
};
constexpr std::array<size_t, ddlNumTypes> kTypeSizes = {1, 1, 4, 4, 8, 8, 2, 2, 4, 8};
constexpr std::array<const char*, ddlNumOps> kOpNames = {"sum", "prod", "min", "max", "avg", "band", "bor", "bxor"};

// Extra spellings accepted by parseType on top of kTypeNames.
constexpr std::pair<std::string_view, ddlDataType_t> kTypeAliases[] = {
    {"char", ddlInt8},      {"int", ddlInt32},     {"uint", ddlUint32},   {"half", ddlFloat16},
    {"fp16", ddlFloat16},   {"bf16", ddlBfloat16}, {"float", ddlFloat32}, {"fp32", ddlFloat32},
    {"double", ddlFloat64}, {"fp64", ddlFloat64},
};

}  // namespace

bool validType(ddlDataType_t t) { return static_cast<int>(t) >= 0 && static_cast<int>(t) < ddlNumTypes; }

bool validOp(ddlRedOp_t op) { return static_cast<int>(op) >= 0 && static_cast<int>(op) < ddlNumOps; }

bool isIntegerType(ddlDataType_t t) { return validType(t) && t <= ddlUint64; }

bool isBitwiseOp(ddlRedOp_t op) { return op == ddlBand || op == ddlBor || op == ddlBxor; }

bool opTakesType(ddlRedOp_t op, ddlDataType_t t) {
  return validOp(op) && validType(t) && (!isBitwiseOp(op) || isIntegerType(t));
}

size_t typeSize(ddlDataType_t t) {
  DDL_ASSERT(validType(t));
  return kTypeSizes[t];
}

const char* typeName(ddlDataType_t t) { return validType(t) ? kTypeNames[t] : "invalid"; }

const char* opName(ddlRedOp_t op) { return validOp(op) ? kOpNames[op] : "invalid"; }

std::optional<ddlDataType_t> parseType(std::string_view name) {
  for (int t = 0; t < ddlNumTypes; ++t) {
    if (name == kTypeNames[t]) return static_cast<ddlDataType_t>(t);
  }
  for (const auto& [alias, t] : kTypeAliases) {
    if (name == alias) return t;
  }
  return std::nullopt;
}

std::optional<ddlRedOp_t> parseOp(std::string_view name) {
  for (int op = 0; op < ddlNumOps; ++op) {
    if (name == kOpNames[op]) return static_cast<ddlRedOp_t>(op);
  }
  return std::nullopt;
}

size_t checkedBytes(size_t count, size_t elem, size_t factor) {
  if (count > SIZE_MAX / elem / factor) fail(ddlInvalidArgument, "count " + std::to_string(count) + " is too large");
  return count * elem * factor;
}

}  // namespace ddl
