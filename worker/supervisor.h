// Supervisor: launches the rank processes of jobs on this node and reports how each one ends.
//
// It is the process-management core of ddl-agent, kept free of gRPC so that it is tested with real
// processes in seconds; the agent's RPC layer turns coordinator messages into start() / stop() / release()
// and forwards on_exit reports.
//
// Process model (Linux only):
//  - Each rank runs in its own session and process group (setsid), so pgid == sid == pid of the rank's
//    leader process, and signals for the rank go to the whole group: a launcher, its workers and their
//    data loaders.
//  - No orphans: when a rank's leader exits, for any reason (clean exit, crash, stop), whatever is left of
//    its process group gets SIGKILL at once. Training launchers routinely leave stray data-loader or worker
//    processes behind that hold GPU memory and ports and would break the job's next attempt; a rank's
//    processes therefore live and die together. A process that leaves the group (setsid, setpgid) escapes
//    this; ranks must not.
//  - stop() sends SIGTERM to the group and, if the leader is still alive after the grace period, SIGKILL to
//    the group. The grace is for the leader: once it exits, the rest of the group dies by the rule above.
//  - Exits are reported once each, through on_exit, and kept in ranks() until release() forgets them, so
//    the agent can re-send them until the coordinator acknowledges.
//  - The child's stdout and stderr are appended to RankSpec::log_path, unchanged; stdin is /dev/null. The
//    only line the supervisor itself writes there explains why a rank could not be started. The log is mode
//    0600 and belongs to the rank's user (RankSpec::run_as, else the agent's user); the directories above it
//    stay the agent's.
//  - Run as (RankSpec::run_as): the rank's program runs as that account: its supplementary groups, primary
//    gid and uid are set (setgroups, setgid, setuid, each checked, then a check that setuid(0) fails, so the
//    privileges really are gone) right before exec, and then the working directory is entered, as the user.
//    HOME, USER and LOGNAME are the account's whatever the job's env says (a program must be able to trust
//    them to say who it runs as); SHELL is the account's unless the job's env sets it (a preference, not an
//    identity: service accounts often have nologin). The switch needs root (CAP_SETUID, CAP_SETGID): run
//    as another user, start() fails with EPERM. A failed switch is a start failure with exit code 127 and the
//    reason "cannot switch to user bob (uid 1001): ...". Without run_as the rank runs as the agent's user.
//  - With the shim, the shim stays the agent's user and only the program it forks switches: the shim writes
//    the exit record into the agent's state directory and reports to the agent, so it must be beyond the
//    reach of the job's user (who may signal, ptrace and rewrite the memory of any process of their uid, and
//    who cannot be given write access to the state directory without being able to forge other ranks'
//    records). The uid, gid and groups go to the shim in its argv (they are not secret). Without the shim the
//    supervisor's child switches itself. Both use launch::execProgram (launch_protocol.h).
//  - A rank that cannot be started is recorded and reported like any other exit, so the coordinator learns
//    of it the same way, with the shell's codes: 126 when the program exists but cannot be executed, 127
//    for everything else (not found, no working directory, and failures before fork such as an empty argv
//    or a log that cannot be opened, which also leave pid -1). start() learns of exec failures through a
//    close-on-exec pipe, so it returns the explanation as well. Only two errors record nothing: an empty
//    job id, and a rank that is already running (which is left alone). The explanation is also kept in
//    RankState::error. reject() records a rank that the caller decided not to start (its user does not
//    exist here, ...) the same way.
//  - Exits are waited for with a pidfd per process (pidfd_open, Linux >= 5.3) polled together with an
//    eventfd for wake-ups; no SIGCHLD handler, so the library does not take over a process-wide signal. On
//    kernels without pidfd_open it falls back to checking every Options::poll_interval_ms.
//  - The supervisor reaps only its own ranks, by pid. The host process must not ignore SIGCHLD nor reap
//    with waitpid(-1): a rank whose status was taken by someone else is reported with kExitCodeUnknown.
//  - Ranks of a previous agent process are re-adopted with adopt() (or recover()) after a restart. They are
//    not our children, so the kernel does not tell us how they end. With Options::shim_path set, every rank
//    runs under ddl-rank-shim (worker/rank_shim.cpp), which stays the rank's parent and writes how it ended
//    into an exit record under Options::state_dir; an adopted rank's exit is read from there. Without a
//    record (no shim, or the shim itself was killed) it is reported with exit_code kExitCodeUnknown (255) and
//    no signal, never as a success.
//  - With Options::state_dir set, each started rank leaves a run record (STATE_DIR/JOB/attempt-A/rank-R.run:
//    pid, gpu, start time, program pid) that recover() reads after a restart; release() deletes a rank's
//    records.
//  - RankState::program_pid is the program's own pid: the leader's without the shim; with it, the shim's
//    child's, which the shim sends on the report pipe once the program exec'd (launch_protocol.h).
//  - The destructor does not kill running ranks (an agent restart re-adopts them); it only stops the
//    thread. Pending stop() escalations and undelivered reports are dropped, and ranks left running stay
//    un-reaped children of this process until it exits.
//
// Threads: every public method may be called from any thread, concurrently. One internal thread, the
// reaper, waits for exits and stop deadlines and calls on_exit; on_exit runs on it with no internal lock
// held, so it may call back into the Supervisor (ranks(), release(), start(), stop()), but must not destroy
// it. start() blocks the calling thread for fork plus exec (milliseconds).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/rank_env.h"
#include "run_as.h"

namespace ddl::worker {

struct RankSpec {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  int gpu = -1;  // -1: no GPU (a virtual rank). Recorded only: the caller puts CUDA_VISIBLE_DEVICES in env.
  // argv[0] is looked up in PATH if it has no '/' (the PATH of env if it sets one, else the agent's); a file
  // without a #! line is not handed to /bin/sh as execvp would, it fails with 126.
  std::vector<std::string> argv;
  // Added to the agent's environment, overriding it; applied in order, so a later entry for a name wins. The
  // agent's environment is how an operator sets what every rank of the node needs (UCX_NET_DEVICES,
  // DDL_TUNE_FILE: /etc/default/ddl-agent), so it is passed on whole.
  std::vector<std::pair<std::string, std::string>> env;
  std::string workdir;  // "": the agent's working directory.
  // stdout and stderr go here: created with its parent directories, appended; mode 0600, owned by run_as
  // (the agent's user without it). "": discarded.
  std::string log_path;
  // The account the program runs as (see the process model above). Unset: the agent's own user.
  std::optional<Account> run_as;
  // The CPUs the rank is pinned to (sched_setaffinity, before exec); empty: the agent's own affinity.
  std::vector<int> cpus;
  // The NUMA nodes its memory comes from first (set_mempolicy MPOL_PREFERRED, or MPOL_PREFERRED_MANY for
  // several, before exec: inherited by all it runs; other nodes when these are full); empty: the kernel's
  // default. A node id at most 1023.
  std::vector<int> prefer_numa;
  // An open cgroup.procs of the rank's cgroup (Confinement::prepare), which the child writes itself into
  // before exec; -1: none. Owned by the caller.
  int cgroup_procs_fd = -1;
};

struct RankState {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
  int gpu = -1;
  pid_t pid = -1;  // Also the rank's process group and session id.
  // The job's program itself: pid without the shim (the leader is the program), the shim's child with it;
  // 0 when not known (a shim older than this field, a run record that predates it, no process started).
  // Informational: once the program has exited the number may name another process; signal the rank's
  // group instead.
  pid_t program_pid = 0;
  bool running = false;
  // stop() was called before it exited: the exit was asked for, not a failure.
  bool stop_requested = false;
  // Set when it exited by itself (or kExitCodeUnknown); unset when signal is set.
  std::optional<int> exit_code;
  std::optional<int> signal;  // The signal that killed the leader process.
  int64_t started_ms = 0;     // Unix milliseconds; 0 if no process was ever started.
  int64_t exited_ms = 0;      // Unix milliseconds; 0 while running.
  // Once reaped by this supervisor (not for an adopted rank: 0): the CPU time (user + system) and peak
  // resident memory of the leader and every process it waited for (with the shim: the program).
  double cpu_s = 0;
  int64_t max_rss_bytes = 0;
  // Why it could not be started ("cannot execute 'train.py': No such file or directory"); "" for a rank that
  // was started, whatever became of it.
  std::string error;
};

class Supervisor {
 public:
  static constexpr int kExitCodeNotExecutable = 126;
  static constexpr int kExitCodeNotFound = 127;
  // An adopted rank, or one reaped by someone else: it ended, but how is not known.
  static constexpr int kExitCodeUnknown = 255;

  struct Options {
    // false: check every poll_interval_ms instead of waiting on pidfds, as on kernels without pidfd_open.
    // Tests use it to cover that path.
    bool use_pidfd = true;
    int poll_interval_ms = 200;
    // ddl-rank-shim's path: every rank is started through it, so that its exit status survives an agent
    // restart. "": ranks are exec'd directly (an adopted rank's exit is then unknown).
    std::string shim_path;
    // Where run and exit records live ("": none are written, recover() finds nothing). Job ids must then be
    // usable as a directory name.
    std::string state_dir;
    // What of this process's environment ranks inherit (common/rank_env.h inheritedEnvironment): never the
    // agent's credentials.
    std::vector<std::string> env_allowed = kAgentEnvAllowed;
  };

  using ExitCallback = std::function<void(const RankState&)>;

  // on_exit is called once per exit, from the reaper thread, with no internal lock held. It must not throw.
  explicit Supervisor(ExitCallback on_exit);
  Supervisor(ExitCallback on_exit, Options options);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Forks and execs the rank (see the process model above). On success returns its state (running, pid)
  // and clears *error. On failure sets *error and returns the recorded exited state (126 or 127, reported
  // through on_exit too; pid -1 if no process was forked), except for an empty job id or a rank already
  // running, where nothing is recorded and pid is -1. An exited rank with the same job, attempt and rank is
  // replaced. error may be null.
  RankState start(const RankSpec& spec, std::string* error);

  // Records the rank as one that could not be started, for `why` (a sentence, kept in RankState::error),
  // without trying: as start() records its own failures, exit code 127, `why` in the log, reported through
  // on_exit. For what the caller found before start(), such as a user this node does not have. Refuses and
  // records nothing in the same cases as start() (empty job id, already running). error may be null.
  RankState reject(const RankSpec& spec, const std::string& why, std::string* error);

  // SIGTERM to the process group of each running rank of the job with attempt <= `attempt` (0: every
  // attempt), then SIGKILL to the group after grace_ms if the leader is still alive. Returns at once; the
  // escalation runs on the reaper thread. Calling it again for a rank being stopped re-sends SIGTERM and
  // keeps the earlier deadline. With `ranks`, only those ranks of exactly `attempt` (an elastic job going
  // on without them).
  void stop(const std::string& job_id, int attempt, int grace_ms, const std::vector<int>& ranks = {});
  void stopAll(int grace_ms);

  // Sends `sig` (1..64) to the process group of each running rank of the job with exactly this attempt
  // (0: every attempt), a rank being stopped included, and returns how many groups it was sent to: 0 for a
  // job or attempt with no running rank here, or a signal outside 1..64. Nothing else changes: the rank is
  // not marked as stopped, and it goes on or ends as its program decides (the shim blocks every signal, so
  // only the program and its children act on it; SIGKILL and SIGSTOP reach the shim too, see rank_shim.cpp).
  int signalJob(const std::string& job_id, int attempt, int sig);

  // Forgets the exited ranks of the job with attempt <= `attempt` (0: every attempt), once the coordinator
  // has acknowledged them. Running ranks are kept.
  void release(const std::string& job_id, int attempt);

  // Every rank held, running or exited and not yet released, ordered by job, attempt and rank.
  std::vector<RankState> ranks() const;

  // Whether process `pid` belongs to the rank, running: it is in the rank's session (whose id is the rank's
  // pid; see the process model). A process that left the session does not count.
  bool inRankSession(const std::string& job_id, int attempt, int rank, pid_t pid) const;

  // Watches a rank started by a previous agent process (state as reported by ranks() back then: job, attempt,
  // rank, gpu, pid, started_ms). The pid must still lead its own process group, which guards against a reused
  // pid; if it does not, or is gone, the rank is recorded as exited with kExitCodeUnknown, what is left of
  // its group is killed, and the exit is reported through on_exit. Adopting a rank already held with the same
  // pid does nothing; with another pid while running, or an invalid state, sets *error and changes nothing.
  // Returns whether the rank is now held.
  bool adopt(const RankState& state, std::string* error);

  // Adopts every rank whose run record is in Options::state_dir: those a previous agent process started and
  // did not release. Returns one line per record that could not be adopted (unreadable, or clashing).
  std::vector<std::string> recover();

 private:
  struct Key {
    std::string job_id;
    int attempt;
    int rank;
    auto operator<=>(const Key&) const = default;
  };
  struct Entry {
    RankState state;
    bool starting = false;  // start() is between reserving the key and exec; hidden from ranks().
    bool adopted = false;   // Not our child: no exit status, watched by pidfd or liveness checks.
    int pidfd = -1;         // -1: checked every poll interval.
    // SIGKILL the group then, if the leader still lives.
    std::optional<std::chrono::steady_clock::time_point> kill_at;
    int deferred_grace_ms = -1;  // stop() arrived while starting: applied once the pid is known.
  };

  // start() and reject(): with `refusal`, records the failure once the log is open instead of forking.
  RankState launch(const RankSpec& spec, const std::string* refusal, std::string* error);
  // Records a rank that could not be started (state as far as launch got): exit code 127 unless already set,
  // `why` in RankState::error and as a line in the log (log_fd, where >= 0), then reports it.
  void recordStartFailure(const Key& key, const std::string& who, const std::string& why, int log_fd,
                          RankState& state);
  void reaperLoop();
  // Whether the running entry's leader has exited; pidfd_ready: its pidfd polled readable.
  bool leaderExitedLocked(Entry& entry, bool pidfd_ready);
  // Kills what is left of the group, collects the status and queues the report.
  void finishLocked(Entry& entry);
  void signalStopLocked(Entry& entry, int grace_ms);
  std::string recordDir(const Key& key) const;
  std::string runRecordPath(const Key& key) const;
  std::string exitRecordPath(const Key& key) const;
  void writeRunRecord(const Key& key, const RankState& state) const;
  // The rank's exit as its shim recorded it, else kExitCodeUnknown.
  void readExitRecord(const Key& key, RankState& state) const;
  void removeRecords(const Key& key) const;
  void wake();

  const ExitCallback on_exit_;
  const Options options_;
  int wake_fd_ = -1;  // eventfd: start/stop/adopt/destructor wake the reaper to recompute what it waits for.

  mutable std::mutex mu_;
  std::map<Key, Entry> entries_;    // Guarded by mu_.
  std::vector<RankState> reports_;  // Exits to deliver from the reaper thread; guarded by mu_.
  bool stopping_ = false;           // Guarded by mu_.

  std::thread reaper_;  // Last: started once everything above is initialized.
};

}  // namespace ddl::worker
