// Fuzzes the agent's launch-protocol parsers (worker/launch_protocol.h): the shim's --user argument
// ("UID:GID:G1,G2,..."), the exit record file that a shim leaves ("exit N" / "signal N") and what the report
// pipe carried (a failure, or the program's pid). All come back to the agent from outside its own memory (a
// command line, a file in the data directory, a pipe from another process). Byte 0 picks the parser (odd:
// identity; 2 modulo 4: report; else exit record); the rest is the input.
//
// Checks: what parses formats back to text that parses to the same values; an exit record sets exactly one
// of its two results, in range; a report is either a failure of a known stage or a success with a pid >= 0,
// never both, and a refused one changes nothing.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "worker/launch_protocol.h"

using namespace ddl::worker::launch;

namespace {
void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "launch_protocol_fuzz: %s\n", what);
    std::abort();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] & 1) {
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;
    if (parseIdentity(text, &uid, &gid, &groups)) {
      uid_t uid2 = 1;
      gid_t gid2 = 1;
      std::vector<gid_t> groups2;
      check(parseIdentity(formatIdentity(uid, gid, groups), &uid2, &gid2, &groups2), "formatted identity refused");
      check(uid2 == uid && gid2 == gid && groups2 == groups, "identity round trip changed it");
    }
  } else if ((data[0] & 3) == 2) {
    Failure failure{-7, -7};
    pid_t program_pid = -7;
    if (parseReport(data + 1, size - 1, &failure, &program_pid)) {
      check(size - 1 == 0 || size - 1 == sizeof(Failure), "a report of another size accepted");
      check(program_pid >= 0, "negative program pid");
      check(failure.stage == 0 || (failure.stage >= kStageSetup && failure.stage <= kStageUserKept) ||
                failure.stage == kStageConfine,
            "unknown stage accepted");
      check(failure.stage == 0 || program_pid == 0, "both a failure and a program pid");
    } else {
      check(failure.stage == -7 && failure.err == -7 && program_pid == -7,
            "a refused report changed the results");
    }
  } else {
    std::optional<int> exit_code, signal;
    if (parseExitRecord(text, &exit_code, &signal)) {
      check(exit_code.has_value() != signal.has_value(), "not exactly one of exit code and signal");
      if (exit_code) check(*exit_code >= 0 && *exit_code <= 255, "exit code out of range");
      if (signal) check(*signal > 0 && *signal < 128, "signal out of range");
      std::optional<int> e2, s2;
      check(parseExitRecord(formatExitRecord(exit_code, signal), &e2, &s2), "formatted record refused");
      check(e2 == exit_code && s2 == signal, "exit record round trip changed it");
    }
  }
  return 0;
}
