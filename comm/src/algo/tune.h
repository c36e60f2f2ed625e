// Tuning tables: which allreduce algorithm and pipeline segment size to use for a message size, rank count and
// topology. `ddl-bench --tune FILE` measures every candidate on the machine at hand and writes one; libddl reads
// it from DDL_TUNE_FILE. Without one, a built-in table made from measurements (docs/benchmarks.md) applies.
// DDL called this its exploration mode; here it is a file that can be read, diffed and shipped with a cluster.
//
// Text format, one rule per line; blank lines and text after '#' are ignored:
//   ddl-tune 1                                       the first rule-free line: the format's version
//   allreduce RANKS TOPOLOGY MAX_BYTES ALGO SEGMENT
// RANKS is a rank count or '*'; TOPOLOGY a DDL_TOPOLOGY string as ddlCommGetTopology prints it ("2x2", "4" for
// flat), 'flat' (any topology with at most one dim above 1: no known hierarchy) or '*'; MAX_BYTES a byte count (K, M, G suffixes: powers of 2) or 'inf'; ALGO ring, mdring or rhd;
// SEGMENT the pipeline segment in bytes (same suffixes; 1K to 1G), or 0 for the built-in default. A TOPOLOGY
// other than flat or * must have positive dims whose product is RANKS (when RANKS is a number), and MAX_BYTES
// must be above 0. For a message the first
// rule in file order whose RANKS and TOPOLOGY match and whose MAX_BYTES is at least the message's size decides.
//
// Every rank of a communicator must decide alike, so the table's digest is part of the shape that ranks compare
// when they join (a rank with another file is refused, naming both). DDL_ALGO and DDL_SEGMENT_BYTES (or their
// ddlConfig_t fields) still win over any table.
//
// Threads: a table is immutable once parsed and shared by the communicators that use it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "algo/algo.h"

namespace ddl {

// Bounds on a table: DDL_TUNE_FILE is read up to kMaxTuneFileBytes (a regular file only), and every rule is
// checked (TuneTable::parse names the file and line of the first bad one).
constexpr size_t kMaxTuneFileBytes = 1 << 20;
constexpr size_t kMaxTuneLineBytes = 4096;
constexpr size_t kMaxTuneRules = 10000;
constexpr size_t kMinTuneSegmentBytes = 1 << 10;  // a shorter segment only multiplies messages
constexpr size_t kMaxTuneSegmentBytes = size_t{1} << 30;

struct TuneRule {
  int nranks = 0;        // 0: any
  std::string topology;  // "": any
  size_t max_bytes = 0;  // SIZE_MAX: no limit
  Algo algo = Algo::kRing;
  size_t segment_bytes = 0;  // 0: the default
};

class TuneTable {
 public:
  // Throws ddlInvalidArgument naming origin, the line and what is wrong with it.
  static std::shared_ptr<const TuneTable> parse(const std::string& text, const std::string& origin);
  static std::shared_ptr<const TuneTable> load(const std::string& path);
  // The table used when DDL_TUNE_FILE is unset.
  static const TuneTable& builtin();

  // The deciding rule, or nullptr when none matches.
  const TuneRule* find(int nranks, const std::string& topology, size_t bytes) const;
  const std::vector<TuneRule>& rules() const { return rules_; }
  // A short hash of the rules (not of comments or spacing): equal tables have equal digests.
  const std::string& digest() const { return digest_; }

  // One rule as a line of the format (without a newline); "inf" for SIZE_MAX.
  static std::string formatRule(const TuneRule& rule);

 private:
  std::vector<TuneRule> rules_;
  std::string digest_;
};

}  // namespace ddl
