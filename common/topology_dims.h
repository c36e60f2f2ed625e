// The topology text of a multi-dimensional ring, "4x8x2": the one grammar of ddlctl's and ddlrun's
// --topology, a job's topology in the coordinator, and libddl's DDL_TOPOLOGY (libddl compiles this file into
// its own objects; its map exports only the C API). Threads: pure functions.
//
// Grammar: positive decimal integers joined by 'x' or 'X', at most kMaxTopologyDims of them, each at most
// kMaxTopologyDim, and their product at most kMaxTopologyRanks. Whether the product matches a rank count is
// the caller's to say, in its own words ("-np is 8", "the job has 16 GPUs").
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace ddl {

inline constexpr int kMaxTopologyDims = 16;
inline constexpr int kMaxTopologyDim = 1 << 20;
inline constexpr long long kMaxTopologyRanks = 1LL << 31;

// "" and *dims set; or why `text` is not a topology, a phrase without the text itself ("'0' is not a positive
// integer", "more than 16 dimensions"), for the caller to put after what it was reading.
std::string parseTopologyDims(std::string_view text, std::vector<int>* dims);
// The dims' product (at most kMaxTopologyRanks for parsed dims).
long long topologyRanks(const std::vector<int>& dims);
// "4x8x2".
std::string formatTopologyDims(const std::vector<int>& dims);

}  // namespace ddl
