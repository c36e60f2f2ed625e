// ddlrun's launcher: the rank environment, the launch of the ranks (across machines: of each host's ddlrun,
// which remote_hosts.h plans and keeps alive), and the loop that supervises them. The command line is
// options.cpp's.
//
// The supervisor is one loop around one poll() on the main thread: the read ends of every rank's stdout and
// stderr pipes, a self-pipe that the SIGCHLD/SIGINT/SIGTERM/SIGHUP handlers write the signal number into, and
// on a host's part (--host-part) its stdin from the launcher, whose end or silence stops its ranks. Output is
// written only as whole lines (LineTagger), so a single writer suffices to keep ranks' lines apart, and no
// thread ever blocks on one rank while another's pipe fills up. Child exits are collected with
// waitpid(pid, WNOHANG) after a SIGCHLD byte arrives, so ddlrun waits only for its own ranks. Across machines
// a second thread writes the keepalives (Keepalives), to its own copies of the hosts' stdin pipes: the loop
// may be held up writing output for as long as ddlrun's reader likes, and the hosts must not take that for
// silence.
//
// Stopping is a small state machine with deadlines, which is what keeps ddlrun from hanging:
//   running --(rank fails / ddlrun signalled / launch fails)--> stopping: stop signal sent to every group
//   stopping --(grace period passes)--> killed: SIGKILL sent to every group still there
//   killed --(kAfterKillMs passes)--> give up: close the pipes, report ranks that did not die, return.
// A stop ends early once every rank is reaped and every pipe is at EOF. Signals go to each rank's process
// group (each rank is a group leader), so a shell script rank takes its children with it. Groups are
// signalled while their rank is unreaped or their pipes are open: the open pipe is the evidence that a group
// member lives on. Output still in the pipes is drained to the end (within those deadlines), and a failing
// rank's pending output is printed before ddlrun's message about it.
#include "launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <unordered_map>
#include <utility>

#include "common/host_port.h"
#include "common/rank_env.h"
#include "common/signals.h"
#include "free_port.h"
#include "remote_hosts.h"

#ifdef __linux__
#include <sys/prctl.h>
#endif

extern char** environ;

namespace ddl::launcher {

namespace {

using Clock = std::chrono::steady_clock;

// After every rank has exited, how long processes they left behind may keep their output pipes open before
// ddlrun stops them too.
constexpr int kDrainMs = 1000;
// After SIGKILL, how long to wait for ranks to be reaped and pipes to close before giving up on them.
constexpr int kAfterKillMs = 2000;
// "rank 3" or "ranks 0, 2, 5" (the first few of a long list, then how many in all).
std::string rankList(const std::vector<int>& ranks) {
  constexpr size_t kShown = 8;
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size() && i < kShown; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(ranks[i]);
  }
  if (ranks.size() > kShown) text += ", ... (" + std::to_string(ranks.size()) + " in all)";
  return text;
}

int msUntil(Clock::time_point when, Clock::time_point now) {
  if (when <= now) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(when - now).count() + 1;
  return static_cast<int>(std::min<long long>(ms, 60 * 1000));
}

// The write end of the self-pipe; only the signal handler and Launcher's setUp/tearDown touch it.
int g_signal_pipe_write = -1;

void onSignal(int sig) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  // Non-blocking: if the pipe is full, a wakeup is already pending and the loop reaps every rank anyway.
  ssize_t ignored = write(g_signal_pipe_write, &byte, 1);
  (void)ignored;
  errno = saved_errno;
}

constexpr int kHandledSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE};
constexpr size_t kNumHandledSignals = sizeof(kHandledSignals) / sizeof(kHandledSignals[0]);

// One rank's stdout or stderr as ddlrun sees it.
struct Stream {
  Stream(int target_fd, LineTagger line_tagger) : target(target_fd), tagger(std::move(line_tagger)) {}
  int fd = -1;  // read end of the pipe; -1 once at EOF
  int target;   // ddlrun's fd the lines go to: 1 or 2
  LineTagger tagger;
};

// One process ddlrun supervises: a rank, or (across machines) one host's ddlrun reached over --rsh.
struct Rank {
  Rank(int global_rank, bool tag, std::string what)
      : label(std::move(what)),
        out(STDOUT_FILENO, LineTagger("[" + std::to_string(global_rank) + "] ", tag)),
        err(STDERR_FILENO, LineTagger("[" + std::to_string(global_rank) + "] ", tag)) {}
  bool pipesOpen() const { return out.fd >= 0 || err.fd >= 0; }
  // Its process group may still hold processes: signalling it is meaningful.
  bool groupMayLive() const { return running || pipesOpen(); }

  std::string label;  // "rank 3", or "host b (ranks 4-7)"
  pid_t pid = -1;
  bool running = false;  // forked and not yet reaped
  int stdin_fd = -1;     // a host's: the write end of its stdin (the secret, then open while the run lasts)
  Stream out;
  Stream err;
};

// One run of one job; see the file comment for its states. Main thread only.
class Launcher {
 public:
  explicit Launcher(const Options& options) : options_(options) {}
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  int run() {
    if (setUp()) {
      launchAll();
      if (across()) keepalives_.start(hostStdins());
      superviseLoop();
    } else {
      status_ = kLaunchFailureStatus;
    }
    tearDown();
    return status_;
  }

 private:
  bool setUp();
  void tearDown();
  void launchAll();
  bool launchRank(int r);
  // in_fd: what becomes its stdin; -1 keeps ddlrun's.
  [[noreturn]] void execRank(int in_fd, int out_fd, int err_fd, char** argv, char** envp,
                             const sigset_t& mask);
  void superviseLoop();
  bool takeSignals();
  void onSignalReceived(int sig);
  void reapRanks();
  void onRankExit(int r, int wait_status);
  void beginStop(int sig);
  void sendKill(const std::string& reason);
  void giveUp();
  void pollOnce(int timeout_ms);
  bool readStream(Stream& stream);
  void drainRank(Rank& rank);
  void closeStream(Stream& stream);
  void emit(int fd, std::string_view text);
  std::vector<int> ranksWhere(bool (*predicate)(const Rank&)) const;
  std::string listOf(const std::vector<int>& indices) const;
  bool across() const { return !options_.hosts.empty(); }
  void onLauncherGone(const std::string& how = "closed");
  void readLauncher(int timeout_ms);
  // Across machines: the write ends of the hosts' stdin, for the keepalives.
  std::vector<int> hostStdins() const;

  const Options& options_;
  std::vector<Rank> ranks_;
  std::string root_;
  int master_port_ = 0;
  int status_ = 0;  // ddlrun's exit status; set by whatever starts a stop
  bool stopping_ = false;
  int stop_signal_ = SIGTERM;  // what beginStop sent
  bool killed_ = false;
  Clock::time_point kill_at_;
  Clock::time_point give_up_at_;
  std::optional<Clock::time_point> drain_deadline_;
  bool reap_pending_ = true;
  // Indexed by fd: ddlrun's stdout/stderr failed (EPIPE and the like); what would go there is dropped.
  bool output_broken_[3] = {false, false, false};

  int signal_pipe_[2] = {-1, -1};
  int null_fd_ = -1;
  pid_t ddlrun_pid_ = -1;
  bool rank0_reads_stdin_ = false;
  struct sigaction saved_actions_[kNumHandledSignals];
  bool actions_installed_ = false;
  rlimit saved_nofile_{};
  bool nofile_raised_ = false;
  std::vector<std::string> base_env_;
  std::string secret_;  // DDL_JOB_SECRET of this run
  // Across machines: the hosts' parts, ddlrun's path there, and the directory their ranks start in.
  RemoteRun remote_;
  // A host's part: its stdin comes from the launcher; at EOF, or after kLauncherSilenceMs of silence, the
  // launcher is gone and the ranks stop.
  bool watch_stdin_ = false;
  Clock::time_point heard_from_launcher_;
  bool heard_keepalive_ = false;  // silence is watched only once the launcher has sent a keepalive
  // Across machines: the keepalives to the hosts, from a thread of their own.
  Keepalives keepalives_;
};

// Across machines the launcher gives each host's ddlrun this much beyond the grace period to stop its ranks
// (it closed their stdin) before it kills the connection.
constexpr int kHostStopExtraMs = 3000;

// One line from fd (the launcher's secret on a host part's stdin), at most 256 bytes, within timeout_ms.
bool readLine(int fd, int timeout_ms, std::string* line) {
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  line->clear();
  while (line->size() < 256) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, msUntil(deadline, Clock::now())) <= 0) return false;
    char c = 0;
    const ssize_t n = read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    if (c == '\n') return true;
    *line += c;
  }
  return false;
}

bool Launcher::setUp() {
  // A rank's pipe must not land on fd 0-2 (dup2 onto itself would keep FD_CLOEXEC): fill any that is closed.
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
  }
  if (options_.host_part) {
    // Everything comes from the launcher: the root and MASTER_PORT as arguments, the secret on stdin.
    root_ = options_.root;
    master_port_ = options_.master_port;
    if (!readLine(STDIN_FILENO, 30000, &secret_) || secret_.empty()) {
      emit(STDERR_FILENO, "ddlrun: --host-part: no job secret on stdin from the launcher within 30 s\n");
      return false;
    }
    watch_stdin_ = true;
    heard_from_launcher_ = Clock::now();
    // Output to the launcher goes through ssh: bounded writes (see emit), never a hang on a dead channel.
    for (int fd : {STDOUT_FILENO, STDERR_FILENO}) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  } else if (across()) {
    remote_ = planRemoteRun(options_);
    root_ = remote_.root;
    master_port_ = remote_.master_port;
  } else if (options_.root.empty()) {
    std::string error;
    int port = tools::findFreePort(INADDR_LOOPBACK, &error);  // rank 0 binds it moments later
    if (port < 0) {
      emit(STDERR_FILENO, "ddlrun: cannot find a free TCP port on 127.0.0.1 for DDL_ROOT: " + error +
                              "; pass one with --root HOST:PORT\n");
      return false;
    }
    root_ = "127.0.0.1:" + std::to_string(port);
  } else {
    root_ = options_.root;
  }
  // torch.distributed's store (MASTER_PORT) gets a port of its own: a program may run both stores at once.
  const StatusOr<HostPort> root = parseHostPort(root_);  // checked by parseArgs, or made above
  const int root_port = root ? root->port : 0;
  for (int attempt = 0;
       !across() && !options_.host_part && attempt < 8 && (master_port_ <= 0 || master_port_ == root_port);
       ++attempt) {
    std::string error;
    master_port_ = tools::findFreePort(INADDR_ANY, &error);
    if (master_port_ < 0) {
      emit(STDERR_FILENO, "ddlrun: cannot find a free TCP port for MASTER_PORT: " + error +
                              "; set one with -x MASTER_PORT=PORT\n");
      return false;
    }
  }

  // One secret per run: the ranks' rendezvous store then answers no other process.
  if (!options_.host_part) secret_ = newJobSecret();
  if (secret_.empty()) {
    emit(STDERR_FILENO, "ddlrun: cannot read random bytes for the job's secret (DDL_JOB_SECRET)\n");
    return false;
  }

  // Two pipe read ends per rank stay open in ddlrun; 1024 ranks need more than the common soft limit of 1024.
  rlim_t needed = 2 * static_cast<rlim_t>(options_.np) + 32;
  if (getrlimit(RLIMIT_NOFILE, &saved_nofile_) == 0 && saved_nofile_.rlim_cur != RLIM_INFINITY &&
      saved_nofile_.rlim_cur < needed) {
    rlimit raised = saved_nofile_;
    raised.rlim_cur =
        saved_nofile_.rlim_max == RLIM_INFINITY ? needed : std::min(needed, saved_nofile_.rlim_max);
    nofile_raised_ = setrlimit(RLIMIT_NOFILE, &raised) == 0;
  }

  if (pipe2(signal_pipe_, O_CLOEXEC | O_NONBLOCK) != 0) {
    emit(STDERR_FILENO, std::string("ddlrun: cannot create a pipe: ") + std::strerror(errno) + "\n");
    return false;
  }
  null_fd_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd_ < 0) {
    emit(STDERR_FILENO, std::string("ddlrun: cannot open /dev/null: ") + std::strerror(errno) + "\n");
    return false;
  }
  rank0_reads_stdin_ = !isatty(STDIN_FILENO) && !options_.host_part && !across();
  ddlrun_pid_ = getpid();

  g_signal_pipe_write = signal_pipe_[1];
  for (size_t i = 0; i < kNumHandledSignals; ++i) {
    struct sigaction action {};
    sigemptyset(&action.sa_mask);
    if (kHandledSignals[i] == SIGPIPE) {
      action.sa_handler = SIG_IGN;  // a closed stdout is reported by write() as EPIPE
    } else {
      action.sa_handler = onSignal;
      action.sa_flags = SA_RESTART | (kHandledSignals[i] == SIGCHLD ? SA_NOCLDSTOP : 0);
    }
    sigaction(kHandledSignals[i], &action, &saved_actions_[i]);
  }
  actions_installed_ = true;

  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) base_env_.emplace_back(*entry);
  return true;
}

void Launcher::tearDown() {
  keepalives_.stop();
  for (Rank& rank : ranks_) {
    closeStream(rank.out);
    closeStream(rank.err);
    if (rank.stdin_fd >= 0) close(rank.stdin_fd);
    rank.stdin_fd = -1;
  }
  if (actions_installed_) {
    for (size_t i = 0; i < kNumHandledSignals; ++i) {
      sigaction(kHandledSignals[i], &saved_actions_[i], nullptr);
    }
  }
  g_signal_pipe_write = -1;
  for (int& fd : signal_pipe_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  if (null_fd_ >= 0) close(null_fd_);
  if (nofile_raised_) setrlimit(RLIMIT_NOFILE, &saved_nofile_);
}

void Launcher::launchAll() {
  const int count = across() ? static_cast<int>(remote_.parts.size()) : options_.np;
  ranks_.reserve(count);
  for (int r = 0; r < count; ++r) {
    if (across()) {
      // Each host's ddlrun tags its own ranks' lines; this one passes them on as they come.
      const HostPart& part = remote_.parts[r];
      const std::string span = part.ranks == 1 ? "rank " + std::to_string(part.first_rank)
                                               : "ranks " + std::to_string(part.first_rank) + "-" +
                                                     std::to_string(part.first_rank + part.ranks - 1);
      ranks_.emplace_back(r, false, "host " + part.host + " (" + span + ")");
    } else {
      const int global = options_.rank_offset + r;
      ranks_.emplace_back(global, options_.tag_output, "rank " + std::to_string(global));
    }
    if (!launchRank(r)) {
      status_ = kLaunchFailureStatus;
      beginStop(SIGTERM);
      return;
    }
    // A Ctrl-C during a long launch stops it here rather than after the last fork.
    reap_pending_ |= takeSignals();
    if (stopping_) return;
  }
}

bool Launcher::launchRank(int r) {
  Rank& rank = ranks_[r];
  int out_pipe[2] = {-1, -1};
  int err_pipe[2] = {-1, -1};
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
    int error = errno;
    for (int fd : {out_pipe[0], out_pipe[1]}) {
      if (fd >= 0) close(fd);
    }
    emit(STDERR_FILENO, "ddlrun: cannot create the output pipes of rank " + std::to_string(r) + ": " +
                            std::strerror(error) + (error == EMFILE ? " (raise the limit: ulimit -n)" : "") +
                            "\n");
    return false;
  }

  // A host's ddlrun reads the secret on its stdin, then watches it: a pipe whose write end stays here.
  int in_pipe[2] = {-1, -1};
  if (across() && pipe2(in_pipe, O_CLOEXEC) != 0) {
    const int error = errno;
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    emit(STDERR_FILENO,
         "ddlrun: cannot create the stdin pipe of " + rank.label + ": " + std::strerror(error) + "\n");
    return false;
  }
  const int in_fd = across() ? in_pipe[0] : (r == 0 && rank0_reads_stdin_) ? -1 : null_fd_;

  // Everything the child needs is built before fork(): between fork and exec it only makes system calls.
  std::vector<std::string> env =
      across() ? base_env_ : rankEnvironment(options_, r, root_, master_port_, secret_, base_env_);
  std::vector<char*> envp;
  for (std::string& entry : env) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> command =
      across() ? hostCommand(options_, remote_.parts[r], root_, master_port_, remote_.remote_ddlrun, remote_.cwd,
                             base_env_)
               : options_.command;
  std::vector<char*> argv;
  for (std::string& arg : command) argv.push_back(arg.data());
  argv.push_back(nullptr);

  // Block our signals across fork so the child cannot run ddlrun's handler (and write into ddlrun's
  // self-pipe) before it has put the original dispositions back.
  sigset_t blocked;
  sigset_t old_mask;
  sigemptyset(&blocked);
  for (int sig : kHandledSignals) sigaddset(&blocked, sig);
  sigprocmask(SIG_BLOCK, &blocked, &old_mask);
  pid_t pid = fork();
  if (pid == 0) execRank(in_fd, out_pipe[1], err_pipe[1], argv.data(), envp.data(), old_mask);
  int fork_error = errno;
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (in_pipe[0] >= 0) close(in_pipe[0]);
  if (pid < 0) {
    close(out_pipe[0]);
    close(err_pipe[0]);
    if (in_pipe[1] >= 0) close(in_pipe[1]);
    emit(STDERR_FILENO,
         "ddlrun: cannot start " + rank.label + ": fork failed: " + std::strerror(fork_error) + "\n");
    return false;
  }
  if (in_pipe[1] >= 0) {
    // Far below the pipe's buffer: this write never blocks, even before the host reads it.
    const std::string line = secret_ + "\n";
    ssize_t ignored = write(in_pipe[1], line.data(), line.size());
    (void)ignored;
    fcntl(in_pipe[1], F_SETFL, O_NONBLOCK);  // keepalives never block the launcher
    rank.stdin_fd = in_pipe[1];
  }
  // The child does this too; whichever runs first wins, so the group exists before we ever signal it.
  setpgid(pid, pid);
  fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
  rank.pid = pid;
  rank.running = true;
  rank.out.fd = out_pipe[0];
  rank.err.fd = err_pipe[0];
  return true;
}

void Launcher::execRank(int in_fd, int out_fd, int err_fd, char** argv, char** envp, const sigset_t& mask) {
  setpgid(0, 0);
#ifdef __linux__
  // If ddlrun dies without stopping us (SIGKILL, OOM), the rank must not live on as an orphan.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != ddlrun_pid_) _exit(kLaunchFailureStatus);  // it died before prctl took effect
#endif
  if (in_fd >= 0) dup2(in_fd, STDIN_FILENO);
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  // Back to the dispositions ddlrun started with: a signal ddlrun ignores would otherwise stay ignored.
  for (size_t i = 0; i < kNumHandledSignals; ++i) sigaction(kHandledSignals[i], &saved_actions_[i], nullptr);
  sigprocmask(SIG_SETMASK, &mask, nullptr);
  if (nofile_raised_) setrlimit(RLIMIT_NOFILE, &saved_nofile_);
  environ = envp;
  execvp(argv[0], argv);
  char message[1024];
  int length = std::snprintf(message, sizeof(message), "ddlrun: cannot execute '%s': %s\n", argv[0],
                             std::strerror(errno));
  if (length > 0) {
    ssize_t ignored = write(STDERR_FILENO, message, std::min<size_t>(length, sizeof(message) - 1));
    (void)ignored;
  }
  _exit(127);
}

void Launcher::superviseLoop() {
  while (true) {
    reap_pending_ |= takeSignals();
    if (reap_pending_) {
      reap_pending_ = false;
      reapRanks();
    }
    Clock::time_point now = Clock::now();
    if (stopping_ && !killed_ && now >= kill_at_) {
      sendKill("did not exit within " + std::to_string(options_.grace_ms) + " ms of " +
               signalName(stop_signal_) + "; sending SIGKILL");
    }
    bool any_running =
        std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& rank) { return rank.running; });
    bool any_pipe =
        std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& rank) { return rank.pipesOpen(); });
    if (!any_running && !any_pipe) return;
    if (killed_ && now >= give_up_at_) {
      giveUp();
      return;
    }
    if (!any_running && !stopping_) {
      // Every rank is gone but something they started still holds a pipe: give it kDrainMs, then stop it.
      if (!drain_deadline_) drain_deadline_ = now + std::chrono::milliseconds(kDrainMs);
      if (now >= *drain_deadline_) {
        emit(STDERR_FILENO, "ddlrun: every rank has exited, but processes started by " +
                                listOf(ranksWhere([](const Rank& rank) { return rank.pipesOpen(); })) +
                                " still hold the output pipes open; stopping them\n");
        beginStop(SIGTERM);
        continue;
      }
    }

    // Silence counts only once a keepalive came (a launcher of a ddlrun before keepalives sends none), and
    // only after what already waits on stdin is read (this loop may have been held up writing output).
    if (watch_stdin_ && heard_keepalive_ &&
        now - heard_from_launcher_ >= std::chrono::milliseconds(options_.launcher_silence_ms)) {
      readLauncher(0);
      if (watch_stdin_ &&
          Clock::now() - heard_from_launcher_ >= std::chrono::milliseconds(options_.launcher_silence_ms)) {
        onLauncherGone("has not been heard from for " + std::to_string(options_.launcher_silence_ms) + " ms");
      }
      continue;
    }

    int timeout_ms = -1;
    if (stopping_) {
      timeout_ms = msUntil(killed_ ? give_up_at_ : kill_at_, now);
    } else if (drain_deadline_) {
      timeout_ms = msUntil(*drain_deadline_, now);
    }
    auto sooner = [&](Clock::time_point when) {
      const int ms = msUntil(when, now);
      timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
    };
    if (watch_stdin_ && heard_keepalive_)
      sooner(heard_from_launcher_ + std::chrono::milliseconds(options_.launcher_silence_ms));
    pollOnce(timeout_ms);
  }
}

// Reads the signal numbers the handler queued; acts on INT/TERM/HUP and returns whether a SIGCHLD came.
bool Launcher::takeSignals() {
  bool child_changed = false;
  unsigned char bytes[64];
  while (true) {
    ssize_t n = read(signal_pipe_[0], bytes, sizeof(bytes));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (bytes[i] == SIGCHLD) {
        child_changed = true;
      } else {
        onSignalReceived(bytes[i]);
      }
    }
  }
  return child_changed;
}

void Launcher::onSignalReceived(int sig) {
  if (!stopping_) {
    status_ = 128 + sig;
    emit(STDERR_FILENO, "ddlrun: received " + signalName(sig) +
                            (across() ? "; stopping every host's ranks (SIGTERM, SIGKILL after "
                                      : "; forwarding it to the ranks (SIGKILL after ") +
                            std::to_string(options_.grace_ms) + " ms)\n");
    beginStop(sig);
  } else if (!killed_) {
    // Already stopping (a rank failed, or an earlier signal): the user is out of patience. The status stays
    // what started the stop.
    sendKill("still running; received " + signalName(sig) + " while stopping, sending SIGKILL now");
  }
}

void Launcher::reapRanks() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = ranks_[r];
    if (!rank.running) continue;
    int wait_status = 0;
    pid_t pid;
    do {
      pid = waitpid(rank.pid, &wait_status, WNOHANG);
    } while (pid < 0 && errno == EINTR);
    if (pid == rank.pid) {
      onRankExit(static_cast<int>(r), wait_status);
    } else if (pid < 0) {
      rank.running = false;  // ECHILD: someone else reaped it; nothing more to wait for
    }
  }
}

void Launcher::onRankExit(int r, int wait_status) {
  Rank& rank = ranks_[r];
  rank.running = false;
  bool success = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
  // Once a stop has begun, ranks dying of it (or failing because a peer did) are expected; the first failure
  // was already reported and decides the exit status.
  if (success || stopping_) return;
  drainRank(rank);  // its last words first, then ours
  bool others_running =
      std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& other) { return other.running; });
  const bool ssh_failed = across() && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 255;
  emit(STDERR_FILENO,
       "ddlrun: " + rank.label + " (pid " + std::to_string(rank.pid) + ") " + describeExit(wait_status) +
           (ssh_failed ? " (255: '" + options_.rsh + "' could not reach it? see its message above)" : "") +
           (others_running ? across() ? "; stopping the other hosts" : "; stopping the other ranks" : "") +
           "\n");
  status_ = exitCodeOf(wait_status);
  beginStop(SIGTERM);
}

void Launcher::beginStop(int sig) {
  stopping_ = true;
  stop_signal_ = sig;
  kill_at_ = Clock::now() + std::chrono::milliseconds(options_.grace_ms + (across() ? kHostStopExtraMs : 0));
  keepalives_.stop();
  for (Rank& rank : ranks_) {
    if (across()) {
      // A host's ddlrun stops its ranks (with the same grace) once its stdin closes; its connection is
      // killed only if it has not ended by kill_at_.
      if (rank.stdin_fd >= 0) close(rank.stdin_fd);
      rank.stdin_fd = -1;
    } else if (rank.pid > 0 && rank.groupMayLive()) {
      killpg(rank.pid, sig);
    }
  }
}

void Launcher::onLauncherGone(const std::string& how) {
  watch_stdin_ = false;
  if (stopping_) return;
  status_ = 128 + SIGHUP;
  if (how != "closed") {
    emit(STDERR_FILENO, "ddlrun: the launcher " + how + "; stopping this host's ranks\n");
    beginStop(SIGTERM);
    return;
  }
  emit(STDERR_FILENO,
       "ddlrun: the launcher closed its connection to this host (it stopped, or another host failed); "
       "stopping this host's ranks (SIGKILL after " +
           std::to_string(options_.grace_ms) + " ms)\n");
  beginStop(SIGTERM);
}

void Launcher::sendKill(const std::string& reason) {
  killed_ = true;
  give_up_at_ = Clock::now() + std::chrono::milliseconds(kAfterKillMs);
  std::vector<int> running = ranksWhere([](const Rank& rank) { return rank.running; });
  std::vector<int> holding = ranksWhere([](const Rank& rank) { return !rank.running && rank.pipesOpen(); });
  if (!running.empty()) emit(STDERR_FILENO, "ddlrun: " + listOf(running) + " " + reason + "\n");
  if (!holding.empty()) {
    emit(STDERR_FILENO, "ddlrun: processes started by " + listOf(holding) + " " + reason + "\n");
  }
  for (const Rank& rank : ranks_) {
    if (rank.pid > 0 && rank.groupMayLive()) killpg(rank.pid, SIGKILL);
  }
}

void Launcher::giveUp() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    Rank& rank = ranks_[r];
    if (rank.running) {
      emit(STDERR_FILENO, "ddlrun: " + rank.label + " (pid " + std::to_string(rank.pid) +
                              ") has not exited " + std::to_string(kAfterKillMs) +
                              " ms after SIGKILL; giving up on it\n");
    }
    drainRank(rank);
    closeStream(rank.out);
    closeStream(rank.err);
  }
}

void Launcher::pollOnce(int timeout_ms) {
  std::vector<pollfd> fds;
  std::vector<Stream*> streams;
  fds.push_back({signal_pipe_[0], POLLIN, 0});
  streams.push_back(nullptr);
  const bool stdin_polled = watch_stdin_;
  if (stdin_polled) {
    fds.push_back({STDIN_FILENO, POLLIN, 0});
    streams.push_back(nullptr);
  }
  for (Rank& rank : ranks_) {
    for (Stream* stream : {&rank.out, &rank.err}) {
      if (stream->fd < 0) continue;
      fds.push_back({stream->fd, POLLIN, 0});
      streams.push_back(stream);
    }
  }
  int ready = poll(fds.data(), fds.size(), timeout_ms);
  if (ready <= 0) return;  // timeout, or EINTR: the caller re-checks signals and deadlines
  // One read per stream per round keeps a chatty rank from starving the others.
  const size_t first_stream = stdin_polled ? 2 : 1;
  if (stdin_polled && fds[1].revents != 0) readLauncher(0);
  for (size_t i = first_stream; i < fds.size(); ++i) {
    if (fds[i].revents != 0) readStream(*streams[i]);
  }
}

// One read(); returns true if it got data (so there may be more).
bool Launcher::readStream(Stream& stream) {
  if (stream.fd < 0) return false;
  char buffer[65536];
  ssize_t n = read(stream.fd, buffer, sizeof(buffer));
  if (n > 0) {
    emit(stream.target, stream.tagger.feed(std::string_view(buffer, n)));
    return true;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
  closeStream(stream);  // EOF (or a read error, which nothing can fix)
  return false;
}

// Reads what a rank's pipes hold right now, without waiting for more (bounded even if a child keeps writing).
void Launcher::drainRank(Rank& rank) {
  for (Stream* stream : {&rank.out, &rank.err}) {
    for (int i = 0; i < 64 && readStream(*stream); ++i) {
    }
  }
}

void Launcher::closeStream(Stream& stream) {
  if (stream.fd < 0) return;
  emit(stream.target, stream.tagger.finish());
  close(stream.fd);
  stream.fd = -1;
}

// A host's part: reads what its launcher sent (keepalives) if any waits within timeout_ms; EOF or an error
// means the launcher is gone.
void Launcher::readLauncher(int timeout_ms) {
  pollfd p{STDIN_FILENO, POLLIN, 0};
  if (!watch_stdin_ || poll(&p, 1, timeout_ms) <= 0) return;
  char buffer[256];
  const ssize_t n = read(STDIN_FILENO, buffer, sizeof(buffer));
  if (n > 0) {
    heard_from_launcher_ = Clock::now();
    heard_keepalive_ = true;
  }
  if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) onLauncherGone();
}

std::vector<int> Launcher::hostStdins() const {
  std::vector<int> fds;
  for (const Rank& rank : ranks_) {
    if (rank.stdin_fd >= 0) fds.push_back(rank.stdin_fd);
  }
  return fds;
}

// Writes all of text to ddlrun's fd 1 or 2 (whole lines, so ranks never mix mid-line).
void Launcher::emit(int fd, std::string_view text) {
  if (text.empty() || output_broken_[fd]) return;
  std::optional<Clock::time_point> emit_deadline;
  while (!text.empty()) {
    ssize_t n = write(fd, text.data(), text.size());
    if (n > 0) {
      text.remove_prefix(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Our stdout was handed to us non-blocking: wait for the reader. A host's part waits a bounded time
      // (its reader is ssh), then drops its output rather than stop watching its ranks and its launcher.
      // A host part drops what it cannot write within a third of the silence limit (this text only: later
      // lines go out again once the reader is back), so that it goes back to its ranks and its launcher.
      pollfd writable{fd, POLLOUT, 0};
      if (!options_.host_part) {
        poll(&writable, 1, -1);
        continue;
      }
      if (!emit_deadline)
        emit_deadline = Clock::now() + std::chrono::milliseconds(options_.launcher_silence_ms / 3);
      if (poll(&writable, 1, msUntil(*emit_deadline, Clock::now())) == 0 && Clock::now() >= *emit_deadline) {
        return;
      }
    } else {
      output_broken_[fd] = true;  // EPIPE and the like: keep running the job, drop what would go there
      return;
    }
  }
}

// "rank 3", "ranks 0, 2, 5" (global ranks), or the hosts' labels across machines.
std::string Launcher::listOf(const std::vector<int>& indices) const {
  if (!across()) {
    std::vector<int> global;
    for (int i : indices) global.push_back(options_.rank_offset + i);
    return rankList(global);
  }
  std::string text;
  for (size_t i = 0; i < indices.size(); ++i) text += (i ? ", " : "") + ranks_[indices[i]].label;
  return text;
}

std::vector<int> Launcher::ranksWhere(bool (*predicate)(const Rank&)) const {
  std::vector<int> result;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (predicate(ranks_[r])) result.push_back(static_cast<int>(r));
  }
  return result;
}

}  // namespace

std::vector<std::string> rankEnvironment(const Options& options, int rank, const std::string& root,
                                         int master_port, const std::string& secret,
                                         const std::vector<std::string>& base_env) {
  std::vector<std::string> env;
  std::unordered_map<std::string, size_t> index;  // variable name -> its entry in env
  auto put = [&](const std::string& entry) {
    std::string name = entry.substr(0, entry.find('='));
    auto [it, inserted] = index.emplace(name, env.size());
    if (inserted) {
      env.push_back(entry);
    } else {
      env[it->second] = entry;
    }
  };
  for (const std::string& entry : base_env) put(entry);

  const StatusOr<HostPort> root_address = parseHostPort(root);  // checked by parseArgs, or made by ddlrun
  const HostPort host_port = root_address ? *root_address : HostPort{};
  RankEnvSpec spec;
  spec.rank = options.rank_offset + rank;
  spec.local_rank = rank;
  spec.world_size = options.host_part ? options.world_size : options.np;
  spec.local_size = options.np;
  spec.topology = options.topology;
  spec.root_host = host_port.host;
  spec.root_port = host_port.port;
  spec.master_port = master_port;
  spec.secret = secret;
  for (const auto& [name, value] : ddl::rankEnvironment(spec)) put(name + "=" + value);
  if (!options.algo.empty()) put("DDL_ALGO=" + options.algo);
  if (!options.timeout_ms.empty()) put("DDL_TIMEOUT_MS=" + options.timeout_ms);
  for (const std::string& entry : options.env) {
    if (entry.find('=') != std::string::npos) put(entry);  // a bare "-x VAR" is inherited with base_env
  }
  return env;
}

LineTagger::LineTagger(std::string prefix, bool tag, size_t max_line)
    : prefix_(tag ? std::move(prefix) : std::string()), tag_(tag), max_line_(max_line > 0 ? max_line : 1) {}

void LineTagger::appendLine(std::string& out, std::string_view line, bool add_newline) const {
  out += prefix_;
  out += line;
  if (add_newline) out += '\n';
}

std::string LineTagger::feed(std::string_view data) {
  std::string out;
  while (!data.empty()) {
    size_t newline = data.find('\n');
    bool complete = newline != std::string_view::npos;
    std::string_view segment = data.substr(0, complete ? newline + 1 : data.size());
    data.remove_prefix(segment.size());
    if (complete && pending_.empty() && segment.size() - 1 <= max_line_) {
      appendLine(out, segment, false);  // the common case: a whole line in one read, no copy into pending_
      continue;
    }
    pending_.append(segment);
    // Cut off max_line pieces while more than max_line bytes of line content remain, so a line is cut the
    // same way however the reads happened to split it.
    size_t content = pending_.size() - (complete ? 1 : 0);
    size_t position = 0;
    while (content - position > max_line_) {
      appendLine(out, std::string_view(pending_).substr(position, max_line_), tag_);
      position += max_line_;
    }
    if (complete) {
      appendLine(out, std::string_view(pending_).substr(position), false);
      pending_.clear();
    } else {
      pending_.erase(0, position);
    }
  }
  return out;
}

std::string LineTagger::finish() {
  std::string out;
  if (!pending_.empty()) appendLine(out, pending_, tag_);
  pending_.clear();
  return out;
}

int exitCodeOf(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

std::string describeExit(int wait_status) {
  if (WIFEXITED(wait_status)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    std::string text = "was killed by signal " + signalName(WTERMSIG(wait_status));
#ifdef WCOREDUMP
    if (WCOREDUMP(wait_status)) text += " (core dumped)";
#endif
    return text;
  }
  return "ended with wait status " + std::to_string(wait_status);
}

int run(const Options& options) {
  Launcher launcher(options);
  return launcher.run();
}

}  // namespace ddl::launcher
