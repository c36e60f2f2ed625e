// What the supervisor and ddl-rank-shim share about launching a rank.
//
// The report pipe: the process that is to become the rank (the supervisor's forked child, or the shim's) writes
// one Failure into a close-on-exec pipe when it cannot; a successful exec closes the pipe, so the supervisor
// reads either sizeof(Failure) bytes or end-of-file and knows the outcome before start() returns. The shim
// forwards its own child's report the same way, so start() behaves alike with and without it.
//
// The exit record: the shim writes how the rank ended ("exit N" or "signal N") into a file before it exits
// itself, so an agent that re-adopted the rank after a restart (and so is not its parent) still learns it.
//
// Threads: plain values and pure functions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace ddl::worker::launch {

enum Stage : int { kStageSetup = 1, kStageChdir = 2, kStageExec = 3, kStageShim = 4 };

struct Failure {
  int stage;
  int err;  // errno
};

// execvp's search over `candidates` (the program's path, or PATH's directories joined with it), without its
// fallback of running a file with no #! line through /bin/sh: keeps looking past entries that do not have the
// program, remembers that one existed but was not executable. Returns only on failure, with the errno to
// report. Async-signal-safe: it runs between fork and exec.
int execFirst(const char* const* candidates, size_t count, const char* const* argv, const char* const* envp);

// The shell's convention: 127 when there is nothing to run, 126 when it exists but cannot be executed.
int exitCodeFor(int stage, int err);

// "exit 3\n" / "signal 9\n".
std::string formatExitRecord(std::optional<int> exit_code, std::optional<int> signal);
// Sets exactly one of *exit_code and *signal; false for anything else (a torn or foreign file).
bool parseExitRecord(const std::string& text, std::optional<int>* exit_code, std::optional<int>* signal);

}  // namespace ddl::worker::launch
