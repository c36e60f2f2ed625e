// Supervisor: fork/exec of ranks and the reaper thread. The process model is described in supervisor.h; this
// file explains the mechanics.
//
// start() prepares everything the child needs (argv, the merged environment, the PATH candidates: the launch
// plan, launch_plan.h; the log and other open file descriptors, the run-as ids) before fork, because the
// agent is multi-threaded: between fork and exec the child may only make async-signal-safe calls, so no
// allocation, no locks, no logging. The child reports a failed user switch, chdir or exec by writing {stage,
// errno} into a close-on-exec pipe; a successful exec closes the pipe, so the parent reads either eight bytes
// or end-of-file and knows the outcome before start() returns. With the shim, the child execs the shim as the
// agent's user and the shim's own child does the switch, the chdir and the exec (launch::execProgram, the
// same code), forwarding its report.
//
// The reaper thread polls the pidfds of the running ranks plus an eventfd that the public methods write to
// when the set of things to wait for changes. Its poll timeout is the nearest stop deadline, the polling
// interval when some rank has no pidfd, and at most kMaxWaitMs, so it never spins and notices shutdown
// promptly. When a leader exits, it is still a zombie (waitid with WNOWAIT looks without reaping), so its
// pid, which is also the pgid, cannot have been reused when the group is sent SIGKILL; only then is the
// zombie reaped.
#include "supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <system_error>

#include "common/clock.h"
#include "common/fd.h"
#include "common/rank_env.h"
#include "common/resources.h"
#include "launch_plan.h"
#include "launch_protocol.h"

extern char** environ;

namespace ddl::worker {
namespace {

using Clock = std::chrono::steady_clock;

// Upper bound on one wait of the reaper: shutdown is signalled through the eventfd, this is only a backstop.
constexpr int kMaxWaitMs = 1000;

using launch::kStageChdir;
using launch::kStageExec;
using launch::kStageSetup;
using launch::kStageShim;
using launch::kStageUser;
using launch::kStageUserKept;
using ChildFailure = launch::Failure;

std::string errnoText(int err) { return std::system_category().message(err); }

int pidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));  // Always close-on-exec.
#else
  errno = ENOSYS;
  return -1;
#endif
}

// Everything the child reads; built before fork, only read after.
struct ChildPlan {
  const char* const* argv;
  const char* const* envp;
  const std::vector<const char*>* candidates;  // Paths to try, in order, like execvp does over PATH.
  // With via_shim the shim's child enters workdir and switches to identity; nullptr: stay.
  const char* workdir;
  const launch::Identity* identity;
  int stdin_fd;
  int log_fd;
  int report_fd;
  bool via_shim;  // argv runs ddl-rank-shim, which inherits report_fd to forward the program's own report.
  // With via_shim: the rank's environment in a memfd the shim inherits (--env-fd); the shim itself, root, runs
  // with kShimEnvironment only, so nothing of the job's (LD_PRELOAD, LD_LIBRARY_PATH...) reaches it.
  int env_fd;
  int cgroup_procs_fd;    // -1: stay in the agent's cgroup
  const cpu_set_t* cpus;  // nullptr: keep the agent's affinity
  size_t cpus_size;
  const unsigned long* numa_mask;  // nullptr: the default memory policy; else RankSpec::prefer_numa's nodes
  int numa_first;                  // the lowest of them (MPOL_PREFERRED takes one node)
  bool numa_many;                  // more than one: MPOL_PREFERRED_MANY
};

constexpr int kMaxNumaNodes = 1024;
constexpr int kMpolPreferred = 1, kMpolPreferredMany = 5;  // linux/mempolicy.h

// The shim's own environment: a fixed PATH, and the report protocol that this supervisor reads.
const char* const kShimEnvironment[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", launch::kShimProtocolEnvEntry,
                                        nullptr};

[[noreturn]] void childFail(int report_fd, int stage, int err) {
  ChildFailure failure{stage, err};
  ssize_t ignored = write(report_fd, &failure, sizeof failure);  // Under PIPE_BUF: atomic.
  (void)ignored;
  _exit(launch::exitCodeFor(stage, err));
}

// Runs in the forked child: async-signal-safe calls only.
[[noreturn]] void runChild(const ChildPlan& plan) {
  setsid();  // Cannot fail: a fresh child is never a process group leader.
  // Into the rank's cgroup ("0" is the writer itself) and onto its CPUs before anything of the rank runs, so
  // every process it ever starts is inside.
  if (plan.cgroup_procs_fd >= 0 && write(plan.cgroup_procs_fd, "0", 1) != 1) {
    childFail(plan.report_fd, launch::kStageConfine, errno);
  }
  if (plan.cpus != nullptr && sched_setaffinity(0, plan.cpus_size, plan.cpus) != 0) {
    childFail(plan.report_fd, launch::kStageConfine, errno);
  }
  if (plan.numa_mask != nullptr) {
    // A preference, not a bind: where the kernel cannot take it (several nodes before Linux 5.15, a node
    // offline) the default policy stands and the rank runs all the same.
    if (!plan.numa_many ||
        syscall(SYS_set_mempolicy, kMpolPreferredMany, plan.numa_mask, kMaxNumaNodes + 1) != 0) {
      unsigned long one[kMaxNumaNodes / (8 * sizeof(unsigned long))] = {};
      one[plan.numa_first / (8 * sizeof(unsigned long))] = 1UL
                                                           << (plan.numa_first % (8 * sizeof(unsigned long)));
      (void)syscall(SYS_set_mempolicy, kMpolPreferred, one, kMaxNumaNodes + 1);
    }
  }

  if (dup2(plan.stdin_fd, 0) < 0 || dup2(plan.log_fd, 1) < 0 || dup2(plan.log_fd, 2) < 0) {
    childFail(plan.report_fd, kStageSetup, errno);
  }
  // The agent may ignore SIGPIPE or block signals in the forking thread; both survive exec and would change
  // how a training program behaves, so it starts from the defaults as it would from a shell.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);  // EINVAL for reserved ones: fine.
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // The agent's own descriptors (gRPC sockets, other ranks' logs) must not leak into the rank. Kernels before
  // 5.11 lack the flag; descriptors opened with O_CLOEXEC, as the agent's should be, are closed anyway.
#ifdef SYS_close_range
  syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC);
#endif
  if (plan.via_shim) {
    if (fcntl(plan.report_fd, F_SETFD, 0) != 0 || fcntl(plan.env_fd, F_SETFD, 0) != 0) {
      childFail(plan.report_fd, kStageSetup, errno);
    }
    const int err =
        launch::execFirst(plan.candidates->data(), plan.candidates->size(), plan.argv, kShimEnvironment);
    childFail(plan.report_fd, kStageShim, err);
  }
  const launch::Failure failure = launch::execProgram(plan.identity, plan.workdir, plan.candidates->data(),
                                                      plan.candidates->size(), plan.argv, plan.envp);
  childFail(plan.report_fd, failure.stage, failure.err);
}

// argv or envp for exec: pointers into strings, then nullptr. The strings must outlive the result.
std::vector<const char*> nullTerminated(const std::vector<std::string>& strings) {
  std::vector<const char*> out;
  for (const auto& s : strings) out.push_back(s.c_str());
  out.push_back(nullptr);
  return out;
}

// The CPUs a rank is pinned to, as sched_setaffinity takes them. CPU_ALLOC: ids may exceed CPU_SETSIZE (1024)
// on big machines. Empty (get() is nullptr): keep the agent's affinity.
class CpuSet {
 public:
  // false (errno set) when the set cannot be allocated.
  bool assign(const std::vector<int>& cpus) {
    const int max_id = *std::max_element(cpus.begin(), cpus.end());
    set_.reset(CPU_ALLOC(max_id + 1));
    if (!set_) return false;
    size_ = CPU_ALLOC_SIZE(max_id + 1);
    CPU_ZERO_S(size_, set_.get());
    for (int c : cpus) CPU_SET_S(c, size_, set_.get());
    return true;
  }
  const cpu_set_t* get() const { return set_.get(); }
  size_t size() const { return size_; }

 private:
  std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> set_{nullptr, [](cpu_set_t* s) { CPU_FREE(s); }};
  size_t size_ = 0;
};

// The rank's environment for the shim (see ChildPlan::env_fd): a memfd holding env NUL-separated, rewound.
StatusOr<Fd> environmentFile(const std::vector<std::string>& env) {
  Fd env_fd(aboveStdio(static_cast<int>(syscall(SYS_memfd_create, "ddl-rank-env", MFD_CLOEXEC))));
  if (env_fd.get() < 0) {
    return Status::internal("cannot create the rank's environment file: " + errnoText(errno));
  }
  std::string block;
  for (const auto& e : env) block.append(e).push_back('\0');
  for (size_t done = 0; done < block.size();) {
    const ssize_t n = write(env_fd.get(), block.data() + done, block.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::internal("cannot write the rank's environment: " + errnoText(errno));
    done += static_cast<size_t>(n);
  }
  if (lseek(env_fd.get(), 0, SEEK_SET) != 0) return Status::internal("cannot rewind the rank's environment");
  return env_fd;
}

// Reads the child's launch report from the pipe until size bytes or end-of-file; returns how many came.
size_t readReport(int fd, char* report, size_t size) {
  size_t got = 0;
  while (got < size) {
    ssize_t n = read(fd, report + got, size - got);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  return got;
}

// Why the child could not start the rank, from its report. A PATH search that met a closed directory is
// reported as not found where the program is nowhere (failure.err becomes ENOENT, see below).
std::string explainFailure(ChildFailure& failure, const RankSpec& spec, const LaunchPlan& plan,
                           const std::string& shim_path) {
  const std::string& program = spec.argv[0];
  std::string why;
  if (failure.stage == kStageShim) {
    why = "cannot execute the rank shim " + shim_path + ": " + errnoText(failure.err);
  } else if (failure.stage == kStageUser && spec.run_as) {
    why = "cannot switch to " + describeAccount(*spec.run_as) + ": " + errnoText(failure.err);
  } else if (failure.stage == kStageUserKept && spec.run_as) {
    why = "cannot switch to " + describeAccount(*spec.run_as) +
          ": root privileges were not dropped (setuid(0) still succeeds afterwards); the rank does not run";
  } else if (failure.stage == launch::kStageConfine) {
    why = "cannot confine the rank to its CPUs " + formatCpuList(spec.cpus) +
          " and memory: " + errnoText(failure.err) + " (are those CPUs in the agent's cpuset?)";
  } else if (failure.stage == kStageChdir) {
    why = "cannot change to the working directory " + spec.workdir + ": " + errnoText(failure.err);
  } else if (failure.stage == kStageExec) {
    // A PATH search that met a directory the rank's user may not enter (root's PATH into /root) fails with
    // EACCES, as execvp does, even when the program is nowhere: the agent (which sees every directory) says
    // which it is.
    bool nowhere = false;
    if (failure.err == EACCES && program.find('/') == std::string::npos) {
      nowhere = std::none_of(plan.program_candidates.begin(), plan.program_candidates.end(),
                             [](const std::string& c) { return access(c.c_str(), F_OK) == 0; });
    }
    why = "cannot execute '" + program + "': " + errnoText(nowhere ? ENOENT : failure.err);
    if ((failure.err == ENOENT || nowhere) && program.find('/') == std::string::npos) {
      why += " (searched PATH=" + plan.search_path +
             (nowhere ? "; some of its directories are closed to the rank's user" : "") + ")";
    }
    if (nowhere) failure.err = ENOENT;
    if (failure.err == ENOEXEC) why += " (a script needs a #! line)";
  } else {
    why = "cannot redirect stdin, stdout and stderr: " + errnoText(failure.err);
  }
  return why;
}

// What launch holds from before fork until the child's report is in: the plan, the strings the child's
// pointers point into, and the descriptors the child inherits.
struct PreparedLaunch {
  LaunchPlan plan;
  bool via_shim = false;
  Fd log_fd, env_fd, stdin_fd, report_read, report_write;
  std::vector<std::string> exec_argv;        // the program's, or the shim's command line
  std::vector<std::string> exec_candidates;  // where exec_argv[0] is looked for
  std::vector<const char*> argv_ptrs, env_ptrs, candidates;
  std::optional<launch::Identity> identity;
  CpuSet cpus;
  std::vector<unsigned long> numa_mask;  // empty: no preference
  int numa_first = 0;
  bool numa_many = false;

  ChildPlan child(const RankSpec& spec) const {
    return ChildPlan{argv_ptrs.data(),
                     env_ptrs.data(),
                     &candidates,
                     spec.workdir.empty() ? nullptr : spec.workdir.c_str(),
                     identity ? &*identity : nullptr,
                     stdin_fd.get(),
                     log_fd.get(),
                     report_write.get(),
                     via_shim,
                     env_fd.get(),
                     spec.cgroup_procs_fd,
                     cpus.get(),
                     cpus.size(),
                     numa_mask.empty() ? nullptr : numa_mask.data(),
                     numa_first,
                     numa_many};
  }
};

// Everything the child needs, in the order its failures are explained: the log first (so that the failures
// after it are written there), the caller's refusal, the launch plan, the shim's record directory and
// environment file, stdin, the report pipe and the CPU set. On failure returns why; out->log_fd may be open.
Status prepareLaunch(const RankSpec& spec, const std::string* refusal, const Supervisor::Options& options,
                     const std::string& record_dir, const std::string& exit_record, PreparedLaunch* out) {
  if (Status opened = openRankLog(spec.log_path, spec.run_as, &out->log_fd); !opened) return opened;
  if (refusal != nullptr) return Status::failedPrecondition(*refusal);
  const std::string& shim_path = options.shim_path;
  std::vector<std::string> agent_env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) agent_env.emplace_back(*e);
  StatusOr<LaunchPlan> planned = planLaunch(spec, inheritedEnvironment(agent_env, options.env_allowed));
  if (!planned) return planned.status();
  out->plan = std::move(planned).value();

  // Through the shim: it is exec'd instead, with the rank's environment in a file (see ChildPlan::env_fd).
  out->via_shim = !shim_path.empty();
  if (out->via_shim) {
    std::error_code ec;
    std::filesystem::create_directories(record_dir, ec);
    if (ec) return Status::internal("cannot create " + record_dir + ": " + ec.message());
    std::filesystem::remove(exit_record, ec);  // a previous run of the same rank
    StatusOr<Fd> written = environmentFile(out->plan.env);
    if (!written) return written.status();
    out->env_fd = std::move(written).value();
  }

  out->stdin_fd.reset(aboveStdio(open("/dev/null", O_RDONLY | O_CLOEXEC)));
  if (out->stdin_fd.get() < 0) return Status::internal("cannot open /dev/null: " + errnoText(errno));
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return Status::internal("cannot create a pipe: " + errnoText(errno));
  out->report_read.reset(aboveStdio(pipe_fds[0]));
  out->report_write.reset(aboveStdio(pipe_fds[1]));
  if (out->report_read.get() < 0 || out->report_write.get() < 0) {
    return Status::internal("cannot create a pipe: " + errnoText(errno));
  }

  if (out->via_shim) {
    out->exec_argv = shimCommandLine(shim_path, spec, out->plan.program_candidates,
                                     {exit_record, out->env_fd.get(), out->report_write.get()});
    out->exec_candidates = {shim_path};
  } else {
    out->exec_argv = spec.argv;
    out->exec_candidates = out->plan.program_candidates;
  }
  out->argv_ptrs = nullTerminated(out->exec_argv);
  out->env_ptrs = nullTerminated(out->plan.env);
  for (const auto& c : out->exec_candidates) out->candidates.push_back(c.c_str());
  if (spec.run_as) {
    out->identity = launch::Identity{spec.run_as->uid, spec.run_as->gid, spec.run_as->groups.data(),
                                     spec.run_as->groups.size()};
  }
  if (!spec.cpus.empty() && !out->cpus.assign(spec.cpus)) {
    return Status::internal("cannot allocate a CPU set: " + errnoText(errno));
  }
  constexpr int kBits = 8 * sizeof(unsigned long);
  for (int node : spec.prefer_numa) {
    if (node < 0 || node >= kMaxNumaNodes) continue;
    if (out->numa_mask.empty()) {
      out->numa_mask.assign(kMaxNumaNodes / kBits, 0);
      out->numa_first = node;
    }
    out->numa_mask[node / kBits] |= 1UL << (node % kBits);
    out->numa_many = out->numa_many || node != out->numa_first;
    out->numa_first = std::min(out->numa_first, node);
  }
  return Status::ok();
}

std::string describeRank(const std::string& job_id, int attempt, int rank) {
  return "rank " + std::to_string(rank) + " of job " + job_id + " attempt " + std::to_string(attempt);
}

bool matches(const std::string& key_job, int key_attempt, const std::string& job_id, int attempt) {
  return key_job == job_id && (attempt == 0 || key_attempt <= attempt);
}

// For adopted ranks without a pidfd: the pid still leads its group and is not a zombie. A zombie means the
// rank has exited and its parent (after an agent restart, init or a subreaper) has not reaped it yet.
bool adoptedAlive(pid_t pid) {
  if (getpgid(pid) != pid) return false;
  std::string path = "/proc/" + std::to_string(pid) + "/stat";
  Fd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return errno != ENOENT;
  char buf[512];
  ssize_t n = read(fd.get(), buf, sizeof buf - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* paren = strrchr(buf, ')');  // The command name may itself contain ')' and spaces.
  if (paren == nullptr || paren[1] == '\0' || paren[2] == '\0') return true;
  char state = paren[2];
  return state != 'Z' && state != 'X';
}

// How a reaped leader ended (wait4's status) and what it used: the rusage of the leader and of every process
// it waited for (with the shim, the program), so its CPU time and the largest peak RSS among them.
void setExitFromWait(RankState& state, int status, const rusage& used) {
  if (WIFEXITED(status)) {
    state.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    state.signal = WTERMSIG(status);
  } else {
    state.exit_code = Supervisor::kExitCodeUnknown;
  }
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  state.cpu_s = seconds(used.ru_utime) + seconds(used.ru_stime);
  state.max_rss_bytes = static_cast<int64_t>(used.ru_maxrss) * 1024;  // Linux gives KiB
}

}  // namespace

Supervisor::Supervisor(ExitCallback on_exit) : Supervisor(std::move(on_exit), Options{}) {}

Supervisor::Supervisor(ExitCallback on_exit, Options options)
    : on_exit_(std::move(on_exit)), options_(options) {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) throw std::system_error(errno, std::system_category(), "rank supervisor: eventfd");
  reaper_ = std::thread([this] { reaperLoop(); });
}

Supervisor::~Supervisor() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake();
  reaper_.join();
  for (auto& [key, entry] : entries_) {
    if (entry.pidfd >= 0) close(entry.pidfd);
  }
  close(wake_fd_);
}

void Supervisor::wake() {
  uint64_t one = 1;
  ssize_t ignored =
      write(wake_fd_, &one, sizeof one);  // EAGAIN only when the counter is already huge: awake.
  (void)ignored;
}

RankState Supervisor::start(const RankSpec& spec, std::string* error) { return launch(spec, nullptr, error); }

RankState Supervisor::reject(const RankSpec& spec, const std::string& why, std::string* error) {
  return launch(spec, &why, error);
}

RankState Supervisor::launch(const RankSpec& spec, const std::string* refusal, std::string* error) {
  RankState state;
  state.job_id = spec.job_id;
  state.attempt = spec.attempt;
  state.rank = spec.rank;
  state.gpu = spec.gpu;
  const std::string who = describeRank(spec.job_id, spec.attempt, spec.rank);
  auto fail = [&](const std::string& why) {
    if (error != nullptr) *error = who + ": " + why;
    return state;
  };
  if (error != nullptr) error->clear();
  if (spec.job_id.empty()) return fail("empty job id");  // Not recorded: there is no job to report it to.
  if (!options_.state_dir.empty() && (spec.job_id.find('/') != std::string::npos || spec.job_id[0] == '.')) {
    return fail("job id '" + spec.job_id + "' cannot name a directory");  // Not recorded either.
  }

  const Key key{spec.job_id, spec.attempt, spec.rank};
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && (it->second.starting || it->second.state.running)) {
      return fail("already running as pid " + std::to_string(it->second.state.pid) + "; stop it first");
    }
    Entry reserved;
    reserved.state = state;
    reserved.starting = true;
    entries_[key] = std::move(reserved);
  }

  // From here on every failure is recorded and reported as an exit, so the coordinator hears about a rank
  // that never ran the same way as about one that failed at once, and nobody waits for it.
  PreparedLaunch prepared;
  auto failRecorded = [&](const std::string& why) {
    recordStartFailure(key, who, why, prepared.log_fd.get(), state);
    return fail(why);
  };

  if (Status ready = prepareLaunch(spec, refusal, options_, recordDir(key), exitRecordPath(key), &prepared);
      !ready) {
    return failRecorded(ready.message());
  }
  const bool via_shim = prepared.via_shim;
  const ChildPlan child = prepared.child(spec);
  state.started_ms = unixNowMs();
  pid_t pid = fork();
  if (pid == 0) runChild(child);
  int fork_errno = errno;
  prepared.report_write
      .reset();  // Now only the child holds the write end: end-of-file means it exec'd or died.
  if (pid < 0) return failRecorded("fork failed: " + errnoText(fork_errno));
  state.pid = pid;

  char report[sizeof(ChildFailure)];
  const size_t got = readReport(prepared.report_read.get(), report, sizeof report);
  ChildFailure failure{};
  pid_t program_pid = 0;
  if (!launch::parseReport(report, got, &failure, &program_pid)) {
    // Only our child and the shim write here, so this is a shim of another protocol or a broken one. Whatever
    // runs, the agent could not say what it is: it does not run.
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);  // in case it died before setsid()
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    state.exit_code = kExitCodeNotFound;
    const std::string from = via_shim ? "the rank shim " + options_.shim_path : "the rank's process";
    return failRecorded("unreadable launch report (" + std::to_string(got) + " bytes) from " + from +
                        "; the rank was killed");
  }

  if (failure.stage != 0) {
    const std::string why = explainFailure(failure, spec, prepared.plan, options_.shim_path);
    // The child exits right after writing the report, so this wait is short.
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status)) {
      state.exit_code = WEXITSTATUS(status);
      if (failure.stage == kStageExec && failure.err == ENOENT) state.exit_code = kExitCodeNotFound;  // 127
    } else if (WIFSIGNALED(status)) {
      state.signal = WTERMSIG(status);
    }
    return failRecorded(why);
  }

  // Any pidfd_open failure (ENOSYS on old kernels, EMFILE) leaves this rank to the polling path.
  int pidfd = options_.use_pidfd ? pidfdOpen(pid) : -1;
  state.running = true;
  state.program_pid = via_shim ? program_pid : pid;
  writeRunRecord(key, state);
  {
    std::lock_guard lock(mu_);
    Entry& entry = entries_[key];
    state.stop_requested = entry.state.stop_requested;
    entry.state = state;
    entry.starting = false;
    entry.pidfd = pidfd;
    if (entry.deferred_grace_ms >= 0) signalStopLocked(entry, entry.deferred_grace_ms);
    state = entry.state;
  }
  wake();
  return state;
}

void Supervisor::recordStartFailure(const Key& key, const std::string& who, const std::string& why,
                                    int log_fd, RankState& state) {
  if (!state.exit_code && !state.signal) state.exit_code = kExitCodeNotFound;
  state.running = false;
  state.exited_ms = unixNowMs();
  state.error = why;
  if (log_fd >= 0) {
    std::string line = "ddl-agent: " + who + ": " + why + "; exit code " +
                       std::to_string(state.exit_code.value_or(kExitCodeUnknown)) + "\n";
    ssize_t ignored = write(log_fd, line.data(), line.size());
    (void)ignored;
  }
  {
    std::lock_guard lock(mu_);
    Entry& entry = entries_[key];
    state.stop_requested = entry.state.stop_requested;
    entry.state = state;
    entry.starting = false;
    reports_.push_back(state);
  }
  wake();
}

void Supervisor::signalStopLocked(Entry& entry, int grace_ms) {
  auto deadline = Clock::now() + std::chrono::milliseconds(std::max(grace_ms, 0));
  if (entry.kill_at) {
    // Already stopping (the coordinator repeats its stop with every heartbeat that still reports the rank):
    // one SIGTERM per rank, so a program's checkpoint-on-TERM handler runs once; a shorter grace still counts.
    if (deadline < *entry.kill_at) entry.kill_at = deadline;
    return;
  }
  entry.state.stop_requested = true;
  kill(-entry.state.pid, SIGTERM);
  // A stopped (SIGSTOP) member would hold SIGTERM pending until the grace runs out; systemd does the same.
  kill(-entry.state.pid, SIGCONT);
  entry.kill_at = deadline;
}

void Supervisor::stop(const std::string& job_id, int attempt, int grace_ms, const std::vector<int>& ranks) {
  {
    std::lock_guard lock(mu_);
    for (auto& [key, entry] : entries_) {
      if (!matches(key.job_id, key.attempt, job_id, attempt)) continue;
      // Named ranks: of exactly that attempt.
      if (!ranks.empty() &&
          (key.attempt != attempt || std::find(ranks.begin(), ranks.end(), key.rank) == ranks.end()))
        continue;
      if (entry.starting) {
        entry.state.stop_requested = true;
        if (entry.deferred_grace_ms < 0 || grace_ms < entry.deferred_grace_ms) {
          entry.deferred_grace_ms = std::max(grace_ms, 0);
        }
      } else if (entry.state.running) {
        signalStopLocked(entry, grace_ms);
      }
    }
  }
  wake();
}

int Supervisor::signalJob(const std::string& job_id, int attempt, int sig) {
  if (sig < 1 || sig > 64) return 0;
  int sent = 0;
  std::lock_guard lock(mu_);
  for (auto& [key, entry] : entries_) {
    if (key.job_id != job_id || (attempt != 0 && key.attempt != attempt)) continue;
    if (entry.starting || !entry.state.running) continue;
    // Running: our child is not reaped yet and an adopted leader was checked to lead its group, so -pid is
    // still this rank's group (see finishLocked).
    if (kill(-entry.state.pid, sig) == 0) ++sent;
  }
  return sent;
}

void Supervisor::stopAll(int grace_ms) {
  std::vector<std::string> jobs;
  {
    std::lock_guard lock(mu_);
    for (const auto& [key, entry] : entries_) {
      if (jobs.empty() || jobs.back() != key.job_id) jobs.push_back(key.job_id);  // Map order groups jobs.
    }
  }
  for (const auto& job : jobs) stop(job, 0, grace_ms);
}

void Supervisor::release(const std::string& job_id, int attempt) {
  std::lock_guard lock(mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    const Entry& entry = it->second;
    if (matches(it->first.job_id, it->first.attempt, job_id, attempt) && !entry.starting &&
        !entry.state.running) {
      removeRecords(it->first);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<RankState> Supervisor::ranks() const {
  std::lock_guard lock(mu_);
  std::vector<RankState> out;
  for (const auto& [key, entry] : entries_) {
    if (!entry.starting) out.push_back(entry.state);
  }
  return out;
}

bool Supervisor::inRankSession(const std::string& job_id, int attempt, int rank, pid_t pid) const {
  pid_t session = -1;
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(Key{job_id, attempt, rank});
    if (it == entries_.end() || it->second.starting || !it->second.state.running) return false;
    session = it->second.state.pid;
  }
  return pid > 0 && session > 0 && getsid(pid) == session;
}

bool Supervisor::adopt(const RankState& given, std::string* error) {
  const std::string who = describeRank(given.job_id, given.attempt, given.rank);
  if (error != nullptr) error->clear();
  if (given.job_id.empty() || given.pid <= 0) {
    if (error != nullptr) *error = who + ": cannot adopt: invalid job id or pid " + std::to_string(given.pid);
    return false;
  }
  const pid_t pid = given.pid;
  // Open the pidfd before checking that pid leads its group: checked the other way round, the pid could be
  // reused in between and the pidfd would watch the newcomer.
  Fd pidfd(options_.use_pidfd ? pidfdOpen(pid) : -1);
  // With a pidfd a zombie leader may pass: its pidfd polls readable at once and the exit is reported then.
  const bool alive = pidfd.get() >= 0 ? getpgid(pid) == pid : adoptedAlive(pid);

  const Key key{given.job_id, given.attempt, given.rank};
  {
    std::lock_guard lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && (it->second.starting || it->second.state.running)) {
      if (it->second.state.pid == pid) return true;
      if (error != nullptr) {
        *error = who + ": cannot adopt pid " + std::to_string(pid) + ": already running as pid " +
                 std::to_string(it->second.state.pid);
      }
      return false;
    }
    Entry entry;
    entry.state = given;
    entry.state.running = alive;
    entry.state.stop_requested = false;
    entry.state.exit_code.reset();
    entry.state.signal.reset();
    entry.state.exited_ms = 0;
    entry.adopted = true;
    if (alive) {
      entry.pidfd = pidfd.release();  // Closed by finishLocked or the destructor.
    } else {
      // Whatever is left of its group dies, as when a leader exits under our watch (see supervisor.h).
      kill(-pid, SIGKILL);
      readExitRecord(key, entry.state);
      entry.state.exited_ms = unixNowMs();
      reports_.push_back(entry.state);
    }
    entries_[key] = std::move(entry);
  }
  wake();
  return true;
}

std::string Supervisor::recordDir(const Key& key) const {
  return options_.state_dir + "/" + key.job_id + "/attempt-" + std::to_string(key.attempt);
}

std::string Supervisor::runRecordPath(const Key& key) const {
  return recordDir(key) + "/rank-" + std::to_string(key.rank) + ".run";
}

std::string Supervisor::exitRecordPath(const Key& key) const {
  return recordDir(key) + "/rank-" + std::to_string(key.rank) + ".exit";
}

void Supervisor::writeRunRecord(const Key& key, const RankState& state) const {
  if (options_.state_dir.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(recordDir(key), ec);
  const std::string path = runRecordPath(key), tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "we");
  if (f == nullptr) return;  // The rank runs anyway; only its adoption after an agent restart is lost.
  // Fields are name-value pairs; a reader takes the first three in this order and the others by name.
  std::fprintf(f, "pid %d gpu %d started_ms %lld program_pid %d\n", static_cast<int>(state.pid), state.gpu,
               static_cast<long long>(state.started_ms), static_cast<int>(state.program_pid));
  const bool ok = std::fclose(f) == 0;
  if (ok) std::filesystem::rename(tmp, path, ec);
  if (!ok || ec) std::filesystem::remove(tmp, ec);
}

void Supervisor::readExitRecord(const Key& key, RankState& state) const {
  state.exit_code = kExitCodeUnknown;
  state.signal.reset();
  if (options_.state_dir.empty()) return;
  std::ifstream in(exitRecordPath(key));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::optional<int> code, sig;
  if (launch::parseExitRecord(text, &code, &sig)) {
    state.exit_code = code;
    state.signal = sig;
  }
}

void Supervisor::removeRecords(const Key& key) const {
  if (options_.state_dir.empty()) return;
  std::error_code ec;
  std::filesystem::remove(runRecordPath(key), ec);
  std::filesystem::remove(exitRecordPath(key), ec);
  // The attempt's and the job's directories go once empty (remove() leaves a non-empty one alone).
  const std::filesystem::path dir = recordDir(key);
  if (std::filesystem::remove(dir, ec)) std::filesystem::remove(dir.parent_path(), ec);
}

std::vector<std::string> Supervisor::recover() {
  std::vector<std::string> problems;
  if (options_.state_dir.empty()) return problems;
  std::error_code ec;
  // STATE_DIR/JOB/attempt-A/rank-R.run
  for (const auto& job : std::filesystem::directory_iterator(options_.state_dir, ec)) {
    if (!job.is_directory()) continue;
    std::error_code job_ec;
    for (const auto& attempt_dir : std::filesystem::directory_iterator(job.path(), job_ec)) {
      int attempt = 0;
      if (std::sscanf(attempt_dir.path().filename().c_str(), "attempt-%d", &attempt) != 1) continue;
      std::error_code attempt_ec;
      for (const auto& file : std::filesystem::directory_iterator(attempt_dir.path(), attempt_ec)) {
        int rank = -1;
        char tail[8] = {0};
        if (std::sscanf(file.path().filename().c_str(), "rank-%d.%7s", &rank, tail) != 2 ||
            std::string(tail) != "run") {
          continue;
        }
        RankState state;
        state.job_id = job.path().filename().string();
        state.attempt = attempt;
        state.rank = rank;
        std::ifstream in(file.path());
        long long started = 0;
        std::string k1, k2, k3;
        if (!(in >> k1 >> state.pid >> k2 >> state.gpu >> k3 >> started) || k1 != "pid" || k2 != "gpu") {
          problems.push_back(file.path().string() + ": unreadable; that rank is not adopted");
          continue;
        }
        state.started_ms = started;
        // Later fields by name; records written before program_pid existed end here (it stays 0, unknown).
        std::string name;
        long long value = 0;
        for (int field = 0; field < 16 && in >> name >> value; ++field) {
          if (name == "program_pid" && value > 0 && value <= INT32_MAX) {
            state.program_pid = static_cast<pid_t>(value);
          }
        }
        std::string error;
        if (!adopt(state, &error)) problems.push_back(error);
      }
    }
  }
  return problems;
}

bool Supervisor::leaderExitedLocked(Entry& entry, bool pidfd_ready) {
  if (entry.adopted) return entry.pidfd >= 0 ? pidfd_ready : !adoptedAlive(entry.state.pid);
  if (entry.pidfd >= 0 && !pidfd_ready) return false;
  siginfo_t info{};
  int rc;
  do {
    rc = waitid(P_PID, static_cast<id_t>(entry.state.pid), &info, WEXITED | WNOHANG | WNOWAIT);
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return true;  // ECHILD: reaped by someone else; finishLocked reports it as unknown.
  return info.si_pid == entry.state.pid;
}

void Supervisor::finishLocked(Entry& entry) {
  const pid_t pid = entry.state.pid;
  // For our children the leader is an unreaped zombie here, so -pid still names this rank's group.
  kill(-pid, SIGKILL);
  if (entry.adopted) {
    readExitRecord(Key{entry.state.job_id, entry.state.attempt, entry.state.rank}, entry.state);
  } else {
    int status = 0;
    rusage used{};
    pid_t rc;
    do {
      rc = wait4(pid, &status, WNOHANG, &used);
    } while (rc < 0 && errno == EINTR);
    if (rc == pid) {
      setExitFromWait(entry.state, status, used);
    } else {
      entry.state.exit_code = kExitCodeUnknown;
    }
  }
  entry.state.running = false;
  entry.state.exited_ms = unixNowMs();
  entry.kill_at.reset();
  if (entry.pidfd >= 0) {
    close(entry.pidfd);
    entry.pidfd = -1;
  }
  reports_.push_back(entry.state);
}

void Supervisor::reaperLoop() {
  std::vector<pollfd> fds;
  std::vector<Key> fd_keys;  // fd_keys[i] owns fds[i + 1]; fds[0] is the eventfd.
  std::vector<RankState> reports;
  std::unique_lock lock(mu_);
  while (!stopping_) {
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    fd_keys.clear();
    int timeout_ms = kMaxWaitMs;
    const auto now = Clock::now();
    for (const auto& [key, entry] : entries_) {
      if (entry.starting || !entry.state.running) continue;
      if (entry.pidfd >= 0) {
        fds.push_back(pollfd{entry.pidfd, POLLIN, 0});
        fd_keys.push_back(key);
      } else {
        timeout_ms = std::min(timeout_ms, options_.poll_interval_ms);
      }
      if (entry.kill_at) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(*entry.kill_at - now).count();
        timeout_ms = std::min<int64_t>(timeout_ms, std::max<int64_t>(left, 0));
      }
    }
    if (!reports_.empty()) timeout_ms = 0;

    lock.unlock();
    int ready = poll(fds.data(), fds.size(), timeout_ms);
    if (ready > 0 && (fds[0].revents & POLLIN)) {
      uint64_t count;
      ssize_t ignored = read(wake_fd_, &count, sizeof count);
      (void)ignored;
    }
    lock.lock();
    if (stopping_) break;

    // Exits. An entry may have been replaced or released while unlocked, so match it by its pidfd too.
    for (size_t i = 0; i < fd_keys.size(); ++i) {
      if (ready <= 0 || fds[i + 1].revents == 0) continue;
      auto it = entries_.find(fd_keys[i]);
      if (it == entries_.end() || !it->second.state.running || it->second.pidfd != fds[i + 1].fd) continue;
      if (leaderExitedLocked(it->second, true)) finishLocked(it->second);
    }
    for (auto& [key, entry] : entries_) {
      if (entry.starting || !entry.state.running || entry.pidfd >= 0) continue;
      if (leaderExitedLocked(entry, false)) finishLocked(entry);
    }

    // Stop deadlines: the leader outlived its grace.
    const auto after = Clock::now();
    for (auto& [key, entry] : entries_) {
      if (entry.state.running && entry.kill_at && *entry.kill_at <= after) {
        kill(-entry.state.pid, SIGKILL);
        entry.kill_at.reset();
      }
    }

    if (!reports_.empty()) {
      reports.swap(reports_);
      lock.unlock();
      for (const auto& report : reports) on_exit_(report);
      reports.clear();
      lock.lock();
    }
  }
}

}  // namespace ddl::worker
