// ddl-rank-shim: the leader of every rank's process group, between ddl-agent and the rank's program.
//
// Why it exists: a rank must outlive an agent restart (an upgrade, a crash), and the agent that re-adopts it
// is not its parent, so the kernel would never tell it how the rank ended. The shim is the rank's parent for
// the rank's whole life: it waits for the program and writes how it ended into an exit record, which any
// later agent reads. It then ends the same way (the same exit code, or the same signal), so the agent that
// did start it sees no difference.
//
//   ddl-rank-shim [--user UID:GID:GROUPS] [--workdir DIR] [--env-fd FD] EXIT_RECORD REPORT_FD N
//                 CANDIDATE_1 .. CANDIDATE_N -- ARGV...
//
// The supervisor execs it in the rank's new session with the rank's log already in place and a fixed, minimal
// environment of its own: the rank's environment (the job's --env included) comes on FD, NUL-separated, and
// is used only as the program's. A root process started with the job's variables would run the job's code
// before anything else (LD_PRELOAD, LD_AUDIT and LD_LIBRARY_PATH are honoured for a plain program);
// CANDIDATE_i are the paths to try for ARGV[0] (the supervisor's PATH search) and REPORT_FD the supervisor's
// report pipe (launch_protocol.h), on which the shim forwards whether the program could be executed and, when
// its environment has DDL_RANK_SHIM_PROTOCOL=2 (launch::kShimProtocolEnv), the program's pid once it was. The
// program's child switches to --user (numeric ids, GROUPS comma-separated, possibly empty) and enters
// --workdir, in that order, right before its exec (launch::execProgram, as the supervisor does without a
// shim). Not meant to be run by hand.
//
// Who it runs as: the shim stays the agent's user (root) for the rank's whole life, and only the program's
// process switches to the job's user. The other way round (the supervisor's child switching before it execs
// the shim) would hand the exit record to the job's user: a process may signal, ptrace and rewrite the
// memory of any process of its own uid, so the program could make its shim write any exit it likes, or kill
// it so none is written; and the shim could only write the record into a directory that user may write to,
// where the user could also forge or delete the records of other ranks. As root, the shim is beyond the
// program's reach, and so is what it reports. It runs no code of the job's: its environment is not the job's,
// and it reads only its argv and the environment file, which it passes on without interpreting.
//
// Signals: the shim blocks every signal it can, so a signal sent to the rank's group (SIGTERM from a stop, a
// user's SIGUSR1 to the launcher) reaches the program and not the shim; the program starts with none blocked.
// SIGKILL to the group ends both, and then no record is written: the reader reports the exit as unknown.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "launch_protocol.h"

extern char** environ;

namespace {

using ddl::worker::launch::Failure;

bool writeAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Written next to the record and renamed over it, so a reader sees all of it or nothing.
void writeRecord(const char* path, const std::string& text) {
  const std::string tmp = std::string(path) + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "ddl-rank-shim: cannot write the exit record %s: %s\n", tmp.c_str(), std::strerror(errno));
    return;
  }
  bool ok = writeAll(fd, text.data(), text.size());
  close(fd);
  if (!ok || rename(tmp.c_str(), path) != 0) {
    std::fprintf(stderr, "ddl-rank-shim: cannot write the exit record %s: %s\n", path, std::strerror(errno));
    unlink(tmp.c_str());
  }
}

[[noreturn]] void usage() {
  std::fprintf(
      stderr,
      "usage: ddl-rank-shim [--user UID:GID:GROUPS] [--workdir DIR] [--env-fd FD] EXIT_RECORD REPORT_FD N CANDIDATE... "
      "-- ARGV...\n"
      "ddl-agent starts every rank through it; it is not meant to be run by hand.\n");
  std::exit(2);
}

// The command line: [--user UID:GID:GROUPS] [--workdir DIR] [--env-fd FD] EXIT_RECORD REPORT_FD N
// CANDIDATE... -- ARGV...
struct ShimArgs {
  ShimArgs() = default;
  ShimArgs(const ShimArgs&) = delete;  // identity points into groups
  ShimArgs& operator=(const ShimArgs&) = delete;

  std::optional<ddl::worker::launch::Identity> identity;  // points into groups
  std::vector<gid_t> groups;
  const char* workdir = nullptr;
  int env_fd = -1;
  const char* record = nullptr;
  long report_fd = -1;
  long n = 0;  // how many candidates
  char** candidates = nullptr;
  char** program = nullptr;
};

// Parses argv into *args (in place: identity points into args->groups); usage() on anything else.
void parseArgs(int argc, char** argv, ShimArgs* args) {
  int i = 1;
  while (i + 1 < argc && (std::strcmp(argv[i], "--user") == 0 || std::strcmp(argv[i], "--workdir") == 0 ||
                          std::strcmp(argv[i], "--env-fd") == 0)) {
    if (argv[i][2] == 'e') {
      char* end = nullptr;
      const long fd = std::strtol(argv[i + 1], &end, 10);
      if (*end != '\0' || fd < 0 || fd > INT32_MAX) usage();
      args->env_fd = static_cast<int>(fd);
    } else if (argv[i][2] == 'u') {
      uid_t uid = 0;
      gid_t gid = 0;
      if (!ddl::worker::launch::parseIdentity(argv[i + 1], &uid, &gid, &args->groups)) usage();
      args->identity = ddl::worker::launch::Identity{uid, gid, args->groups.data(), args->groups.size()};
    } else {
      args->workdir = argv[i + 1];
    }
    i += 2;
  }
  // EXIT_RECORD REPORT_FD N CANDIDATE... -- ARGV...: at least six.
  if (argc - i < 6) usage();
  args->record = argv[i];
  char* end = nullptr;
  args->report_fd = std::strtol(argv[i + 1], &end, 10);
  if (*end != '\0' || args->report_fd < 0) usage();
  const long n = std::strtol(argv[i + 2], &end, 10);
  if (*end != '\0' || n < 1 || n > argc - i - 5) usage();
  args->n = n;
  args->candidates = argv + i + 3;
  if (std::strcmp(argv[i + 3 + n], "--") != 0 || argv[i + 4 + n] == nullptr) usage();
  args->program = argv + i + 4 + n;
}

// The program's environment: from --env-fd (NUL-separated; the shim itself was started with a fixed one, so
// nothing of the job's, such as LD_PRELOAD, ran in this root process), else the shim's own. *block and *ptrs
// hold what the result points into.
char** programEnvironment(int env_fd, std::string* block, std::vector<char*>* ptrs) {
  if (env_fd < 0) return environ;
  std::string& env_block = *block;
  std::vector<char*>& env_ptrs = *ptrs;
  char buf[65536];
  for (int reads = 0; reads < 4096; ++reads) {  // at most 256 MiB
    const ssize_t r = read(env_fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    env_block.append(buf, static_cast<size_t>(r));
  }
  close(env_fd);
  for (size_t at = 0; at < env_block.size();) {
    env_ptrs.push_back(&env_block[at]);
    const size_t nul = env_block.find('\0', at);
    if (nul == std::string::npos) break;  // the writer ends every entry with NUL; a torn one is dropped below
    at = nul + 1;
  }
  if (!env_block.empty() && env_block.back() != '\0') env_ptrs.pop_back();
  env_ptrs.push_back(nullptr);
  return env_ptrs.data();
}

// Waits for the program, writes how it ended into the exit record and ends the same way.
int endLikeProgram(pid_t child, const char* record) {
  int status = 0;
  while (waitpid(child, &status, 0) < 0) {
    if (errno != EINTR) {
      writeRecord(record, ddl::worker::launch::formatExitRecord(255, std::nullopt));
      return 255;
    }
  }
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    writeRecord(record, ddl::worker::launch::formatExitRecord(std::nullopt, sig));
    // End by the same signal, without a second core dump, so our own parent sees what the program saw.
    rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    signal(sig, SIG_DFL);
    sigset_t just;
    sigemptyset(&just);
    sigaddset(&just, sig);
    sigprocmask(SIG_UNBLOCK, &just, nullptr);
    raise(sig);
    _exit(128 + sig);  // a signal that does not kill by default (SIGCHLD, ...): only an exit code is left
  }
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 255;
  writeRecord(record, ddl::worker::launch::formatExitRecord(code, std::nullopt));
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  ShimArgs args;
  parseArgs(argc, argv, &args);
  const long report_fd = args.report_fd;
  std::string env_block;
  std::vector<char*> env_ptrs;
  char** program_env = programEnvironment(args.env_fd, &env_block, &env_ptrs);

  // Whether the agent reads {kStageStarted, pid} (launch_protocol.h); an older one takes it for a failure.
  const char* protocol = std::getenv(ddl::worker::launch::kShimProtocolEnv);
  const bool report_pid = protocol != nullptr && std::atoi(protocol) >= 2;

  // The report pipe must not reach the program: the supervisor waits for its end-of-file.
  fcntl(static_cast<int>(report_fd), F_SETFD, FD_CLOEXEC);
  sigset_t all, none;
  sigfillset(&all);
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &all, nullptr);

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    Failure failure{ddl::worker::launch::kStageSetup, errno};
    writeAll(static_cast<int>(report_fd), &failure, sizeof failure);
    return ddl::worker::launch::exitCodeFor(failure.stage, failure.err);
  }
  const pid_t child = fork();
  if (child == 0) {
    sigprocmask(SIG_SETMASK, &none, nullptr);
    const Failure failure = ddl::worker::launch::execProgram(
        args.identity ? &*args.identity : nullptr, args.workdir, args.candidates, static_cast<size_t>(args.n),
        args.program, program_env);
    writeAll(pipe_fds[1], &failure, sizeof failure);
    _exit(ddl::worker::launch::exitCodeFor(failure.stage, failure.err));
  }
  const int fork_errno = errno;
  close(pipe_fds[1]);
  if (child < 0) {
    Failure failure{ddl::worker::launch::kStageSetup, fork_errno};
    writeAll(static_cast<int>(report_fd), &failure, sizeof failure);
    return ddl::worker::launch::exitCodeFor(failure.stage, failure.err);
  }
  Failure failure{};
  size_t got = 0;
  while (got < sizeof failure) {
    ssize_t r = read(pipe_fds[0], reinterpret_cast<char*>(&failure) + got, sizeof failure - got);
    if (r > 0) {
      got += static_cast<size_t>(r);
    } else if (r == 0 || errno != EINTR) {
      break;
    }
  }
  close(pipe_fds[0]);
  if (got == sizeof failure) {
    writeAll(static_cast<int>(report_fd), &failure, sizeof failure);
  } else if (got == 0 && report_pid) {
    const Failure started{ddl::worker::launch::kStageStarted, static_cast<int>(child)};
    writeAll(static_cast<int>(report_fd), &started, sizeof started);
  }
  close(static_cast<int>(report_fd));  // end-of-file: the supervisor's start() returns
  return endLikeProgram(child, args.record);
}
