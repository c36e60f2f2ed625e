// Job arrays as sbatch --array writes them: "0-15", "1,3,5", "0-15:4", each with an optional "%N" (run at most
// N at once). One parser for ddlctl (which checks before sending) and the coordinator (which decides).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace ddl {

inline constexpr size_t kMaxArrayJobs = 10000;
inline constexpr int kMaxArrayIndex = 1000000;
inline constexpr size_t kMaxArraySpecBytes = 4096;

struct ArraySpec {
  std::vector<int> indices;  // ascending, no duplicates
  int max_running = 0;       // 0: no limit
};

// "" and *out filled, or why `text` is not an array (a sentence without the text itself, which the caller
// quotes its own way). The work is bounded by the text's length and kMaxArrayJobs indices, duplicates counted.
std::string parseArraySpec(std::string_view text, ArraySpec* out);

// The forms, for messages.
inline constexpr const char* kArrayForms = "forms: 0-15, 1,3,5, 0-15:4, each with %N to run at most N at once";

}  // namespace ddl
