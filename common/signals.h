// Signal names and numbers, from one table of <signal.h>'s macros, so the numbers are right on every Linux
// architecture (x86-64, aarch64 and ppc64le share them; others need not). Not sigabbrev_np(), which is
// glibc 2.32+ only, nor strsignal(), whose text ("Terminated") is localised prose rather than a name.
// Threads: any.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ddl {

// "SIGTERM" for SIGTERM; nullptr for a number without a name here (real-time signals, out of range).
const char* signalAbbrev(int signal);
// "SIGTERM"; "signal 77" for a number without a name.
std::string signalName(int signal);
// SIGTERM for "SIGTERM", "TERM", "sigterm" or "15"; nullopt for anything else (an unknown name, a number out
// of 1..64, trailing text).
std::optional<int> signalNumber(std::string_view text);

}  // namespace ddl
