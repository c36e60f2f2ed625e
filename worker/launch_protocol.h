// What the supervisor and ddl-rank-shim share about launching a rank.
//
// The report pipe: the process that is to become the rank (the supervisor's forked child, or the shim's)
// writes one Failure into a close-on-exec pipe when it cannot; a successful exec closes the pipe, so the
// supervisor reads either sizeof(Failure) bytes or end-of-file and knows the outcome before start() returns.
// The shim forwards its own child's report the same way, so start() behaves alike with and without it. A shim
// told kShimProtocolEnv=2 (in its own environment) reports a successful exec too, as one record
// {kStageStarted, the program's pid}, so the agent knows the pid of the program and not only the shim's. The
// agent and the shim ship together, but the agent execs whatever shim is installed: an older shim ignores the
// variable (no pid: the agent reports it as unknown), and a newer shim under an older agent, which does not
// set it, sends no record the older agent would misread as a failure. parseReport() reads what came.
//
// The exit record: the shim writes how the rank ended ("exit N" or "signal N") into a file before it exits
// itself, so an agent that re-adopted the rank after a restart (and so is not its parent) still learns it.
//
// The last steps before the program: whichever process is about to become the program (the supervisor's child
// without the shim, the shim's child with it) calls execProgram(), which switches to the rank's user, changes
// to its working directory and execs, in that order: the working directory is entered as the user, so a
// directory the user may not enter fails the start as it would from the user's shell.
//
// Threads: plain values and pure functions.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace ddl::worker::launch {

enum Stage : int {
  kStageSetup = 1,
  kStageChdir = 2,
  kStageExec = 3,
  kStageShim = 4,
  kStageUser = 5,  // setgroups, setgid or setuid failed; err is its errno
  // The calls succeeded, but the ids are not all the target's, or setuid(0) still works: not dropped.
  kStageUserKept = 6,
  // Not a failure: the shim's report that the program exec'd; Failure::err then holds the program's pid.
  kStageStarted = 7,
  // The rank could not enter its cgroup or be pinned to its CPUs (Confinement); err is the errno. Written by
  // the agent's child before exec, never by the shim.
  kStageConfine = 8,
};

// The shim's environment variable naming the report protocol the agent reads: "2" asks for kStageStarted.
inline constexpr const char* kShimProtocolEnv = "DDL_RANK_SHIM_PROTOCOL";
inline constexpr const char* kShimProtocolEnvEntry = "DDL_RANK_SHIM_PROTOCOL=2";  // as the agent sets it

struct Failure {
  int stage;  // 0: no failure
  int err;    // errno
};

// What the report pipe carried up to end-of-file (at most sizeof(Failure) bytes are read): nothing (the
// program exec'd; who it is is not told), a Failure with stage 1..6 or 8, or {kStageStarted, pid > 0}. Sets
// *failure ({0, 0} unless it failed) and *program_pid (0 unless told); false for anything else (a torn
// record, an unknown stage, a pid <= 0), leaving both as they were.
bool parseReport(const void* data, size_t size, Failure* failure, pid_t* program_pid);

// Who the program runs as: every group, the primary gid, the uid. Points into storage prepared before fork.
struct Identity {
  uid_t uid;
  gid_t gid;
  const gid_t* groups;
  size_t group_count;
};

// Switches the calling process to `identity`: setgroups, then setgid, then setuid, each checked, then checks
// that it took (real, effective and saved ids) and, unless the target is uid 0, that setuid(0) now fails.
// Returns {0, 0} on success, else the stage and errno. Raw system calls, not glibc's wrappers: in a process
// forked from a multi-threaded one the wrappers' all-threads broadcast (setxid) takes glibc-internal locks,
// and the child has exactly one thread, which is all a raw call changes. Async-signal-safe.
Failure switchUser(const Identity& identity);

// The program's last steps: switchUser (identity may be null: stay who we are), chdir (workdir may be null:
// stay), execFirst. Returns only on failure. Async-signal-safe.
Failure execProgram(const Identity* identity, const char* workdir, const char* const* candidates,
                    size_t count, const char* const* argv, const char* const* envp);

// The shim's --user argument, "UID:GID:G1,G2,..." (the group list may be empty), and back. Plain numbers: the
// shim resolves no names, so it sees exactly the identity the agent resolved.
std::string formatIdentity(uid_t uid, gid_t gid, const std::vector<gid_t>& groups);
bool parseIdentity(const std::string& text, uid_t* uid, gid_t* gid, std::vector<gid_t>* groups);

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
