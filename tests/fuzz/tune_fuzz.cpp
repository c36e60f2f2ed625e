// Fuzzes DDL_TUNE_FILE's parser (comm/src/algo/tune.h) with the file's text. A table that parses must survive
// a round trip: its rules written with formatRule and parsed again give the same rules and digest, and
// lookups answer without crashing. Bad text must fail with ddl::Error (ddlInvalidArgument), nothing else.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "algo/tune.h"
#include "error.h"

namespace {
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "tune_fuzz: %s\n", what);
    std::abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > ddl::kMaxTuneFileBytes) return 0;  // load() refuses larger files before parsing
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::shared_ptr<const ddl::TuneTable> table;
  try {
    table = ddl::TuneTable::parse(text, "fuzz.tune");
  } catch (const ddl::Error& e) {
    check(e.code() == ddlInvalidArgument, "an error other than ddlInvalidArgument");
    check(std::string(e.what()).rfind("fuzz.tune", 0) == 0, "an error that does not name the file");
    return 0;
  }
  check(table->rules().size() <= ddl::kMaxTuneRules, "more rules than the limit");
  std::string again = "ddl-tune 1\n";
  for (const auto& r : table->rules()) {
    check(r.segment_bytes == 0 || (r.segment_bytes >= ddl::kMinTuneSegmentBytes &&
                                   r.segment_bytes <= ddl::kMaxTuneSegmentBytes),
          "a segment out of range");
    check(r.max_bytes > 0, "MAX_BYTES 0 accepted");
    again += ddl::TuneTable::formatRule(r) + "\n";
  }
  auto reparsed = ddl::TuneTable::parse(again, "again");  // must not throw: the rules were valid
  check(reparsed->digest() == table->digest(), "the round trip changed the digest");
  check(reparsed->rules().size() == table->rules().size(), "the round trip changed the rule count");
  for (size_t i = 0; i < table->rules().size(); ++i) {
    const auto &a = table->rules()[i], &b = reparsed->rules()[i];
    check(a.nranks == b.nranks && a.topology == b.topology && a.max_bytes == b.max_bytes && a.algo == b.algo &&
              a.segment_bytes == b.segment_bytes,
          "the round trip changed a rule");
  }
  const size_t bytes = size > 0 ? size_t{data[0]} << (data[size - 1] % 40) : 0;
  (void)table->find(static_cast<int>(size % 9), size % 2 ? "2x2" : "4", bytes);
  return 0;
}
