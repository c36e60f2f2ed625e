// Fuzzes the agent's launch-protocol parsers (worker/launch_protocol.h): the shim's --user argument
// ("UID:GID:G1,G2,...") and the exit record file that a shim leaves ("exit N" / "signal N"). Both come back to
// the agent from outside its own memory (a command line, a file in the data directory). Byte 0 picks the
// parser; the rest is the text.
//
// Checks: what parses formats back to text that parses to the same values; an exit record sets exactly one
// of its two results, in range.
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
