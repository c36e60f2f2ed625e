// Supervisor tests with real processes (/bin/sh, sleep). Every test runs four times: waiting on pidfds, and on
// the polling fallback used where pidfd_open is missing; each with ranks exec'd directly and through
// ddl-rank-shim (which must not change anything a rank or the agent sees). RunAsTest runs ranks as throwaway
// accounts (needs root; skipped otherwise). Every wait is bounded; the suite takes a few seconds.
#include "supervisor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/fd.h"
#include "common/resources.h"
#include "launch_protocol.h"
#include "run_as.h"
#include "test_accounts.h"

namespace ddl::worker {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr auto kExitWait = milliseconds(5000);  // Generous: the machine running the suite may be busy.

// Collects on_exit reports; tests wait on it with a deadline.
class Recorder {
 public:
  void record(const RankState& state) {
    std::lock_guard lock(mu_);
    exits_.push_back(state);
    cv_.notify_all();
  }

  std::optional<RankState> waitFor(const std::string& job_id, int attempt, int rank,
                                   milliseconds timeout = kExitWait) {
    std::unique_lock lock(mu_);
    std::optional<RankState> found;
    cv_.wait_for(lock, timeout, [&] {
      for (const auto& s : exits_) {
        if (s.job_id == job_id && s.attempt == attempt && s.rank == rank) found = s;
      }
      return found.has_value();
    });
    return found;
  }

  size_t count() {
    std::lock_guard lock(mu_);
    return exits_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RankState> exits_;
};

bool waitUntil(const std::function<bool()>& done, milliseconds timeout = kExitWait) {
  auto deadline = Clock::now() + timeout;
  while (!done()) {
    if (Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return true;
}

std::string readFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Gone, or a zombie: orphans are reparented to init (or a subreaper), which may not reap them at once.
bool processGone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  auto paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

// The pid a shell wrote to `path` once the line is complete.
pid_t waitForPidFile(const fs::path& path) {
  pid_t pid = -1;
  waitUntil([&] {
    std::string text = readFile(path);
    if (text.empty() || text.back() != '\n') return false;
    pid = static_cast<pid_t>(std::stol(text));
    return true;
  });
  return pid;
}

struct Mode {
  bool pidfd;
  bool shim;
};

class SupervisorTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddl-supervisor-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = fs::canonical(tmpl);
    sup_ = std::make_unique<Supervisor>([this](const RankState& s) { recorder_.record(s); }, options());
  }

  Supervisor::Options options() const {
    Supervisor::Options options;
    options.use_pidfd = GetParam().pidfd;
    options.poll_interval_ms = 50;
    options.state_dir = (dir_ / "state").string();
    if (GetParam().shim) options.shim_path = DDL_BIN_DIR "/ddl-rank-shim";
    return options;
  }

  void TearDown() override {
    if (sup_) sup_->stopAll(0);
    // Let the SIGKILLs land and be reaped before the supervisor goes, so no test leaves a process behind.
    if (sup_) {
      waitUntil([&] {
        for (const auto& s : sup_->ranks()) {
          if (s.running) return false;
        }
        return true;
      });
    }
    sup_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  RankSpec shell(const std::string& job, int rank, const std::string& script) {
    RankSpec spec;
    spec.job_id = job;
    spec.attempt = 1;
    spec.rank = rank;
    spec.argv = {"sh", "-c", script};
    spec.log_path = (dir_ / "logs" / job / ("rank" + std::to_string(rank) + ".log")).string();
    return spec;
  }

  RankState mustStart(const RankSpec& spec) {
    std::string error = "not cleared";
    RankState state = sup_->start(spec, &error);
    EXPECT_EQ(error, "");
    EXPECT_TRUE(state.running);
    EXPECT_GT(state.pid, 0);
    return state;
  }

  fs::path dir_;
  Recorder recorder_;
  std::unique_ptr<Supervisor> sup_;
};

TEST_P(SupervisorTest, ReportsExitCodeAndAppendsOutputToLog) {
  RankSpec spec = shell("j1", 0, "echo out; echo err >&2; exit 3");
  fs::create_directories(fs::path(spec.log_path).parent_path());
  std::ofstream(spec.log_path) << "earlier attempt\n";
  RankState started = mustStart(spec);
  EXPECT_EQ(started.job_id, "j1");
  EXPECT_GT(started.started_ms, 0);

  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_FALSE(exit->running);
  EXPECT_EQ(exit->pid, started.pid);
  EXPECT_EQ(exit->exit_code, 3);
  EXPECT_EQ(exit->signal, std::nullopt);
  EXPECT_FALSE(exit->stop_requested);
  EXPECT_GE(exit->exited_ms, exit->started_ms);
  std::string log = readFile(spec.log_path);
  EXPECT_EQ(log.rfind("earlier attempt\n", 0), 0u) << log;
  EXPECT_NE(log.find("out\n"), std::string::npos) << log;
  EXPECT_NE(log.find("err\n"), std::string::npos) << log;
}

// Issue 41, accounting: a reaped rank's exit carries what it used, the program's own included where the shim
// runs it (the shim waits for it, so wait4's figures hold it): CPU time and peak resident memory.
TEST_P(SupervisorTest, AnExitCarriesTheCpuTimeAndPeakMemoryTheRankUsed) {
  mustStart(shell("ju", 0, "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"));
  auto exit = recorder_.waitFor("ju", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_GT(exit->cpu_s, 0.01) << "a loop of 100,000 shell steps takes CPU time";
  EXPECT_LT(exit->cpu_s, 60.0);
  EXPECT_GT(exit->max_rss_bytes, 100 * 1024) << "a shell holds more than 100 KiB";
}

TEST_P(SupervisorTest, PinsTheRankToItsCpusAndMovesItIntoItsCgroup) {
  // The CPU the agent itself may run on last; a rank's Cpus_allowed_list shows what it was pinned to.
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  int cpu = -1;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mine)) cpu = c;
  ASSERT_GE(cpu, 0);
  RankSpec spec = shell("jc", 0, "grep Cpus_allowed_list /proc/self/status");
  spec.cpus = {cpu};
  // A plain file stands in for the cgroup's cgroup.procs: the child writes "0" (itself) into it.
  const fs::path procs = dir_ / "cgroup.procs";
  Fd fd(open(procs.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
  ASSERT_GE(fd.get(), 0);
  spec.cgroup_procs_fd = fd.get();
  mustStart(spec);
  auto exit = recorder_.waitFor("jc", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_NE(readFile(spec.log_path).find("Cpus_allowed_list:\t" + std::to_string(cpu) + "\n"),
            std::string::npos)
      << readFile(spec.log_path);
  EXPECT_EQ(readFile(procs.string()), "0");
}

// A rank's memory comes first from its NUMA node: its memory policy (numa_maps shows it for every mapping) is
// that node preferred; a node that does not exist leaves the default and the rank runs.
TEST_P(SupervisorTest, TheRanksMemoryPrefersItsNumaNode) {
  RankSpec spec = shell("jn", 0, "grep -m1 -o 'prefer[^ ]*\\|default' /proc/self/numa_maps");
  spec.prefer_numa = {0};
  mustStart(spec);
  auto exit = recorder_.waitFor("jn", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_EQ(readFile(spec.log_path), "prefer:0\n");
  RankSpec absent = shell("jo", 0, "grep -m1 -o 'prefer[^ ]*\\|default' /proc/self/numa_maps");
  absent.prefer_numa = {1000};
  mustStart(absent);
  exit = recorder_.waitFor("jo", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_EQ(readFile(absent.log_path), "default\n");
}

TEST_P(SupervisorTest, ACpuTheAgentMayNotUseFailsTheRankAndSaysWhy) {
  RankSpec spec = shell("jx", 0, "true");
  spec.cpus = {kMaxCpuId};  // no machine that runs this suite has 65536 CPUs
  std::string error;
  RankState state = sup_->start(spec, &error);
  EXPECT_FALSE(state.running);
  EXPECT_NE(error.find("cannot confine the rank to its CPUs 65535"), std::string::npos) << error;
  auto exit = recorder_.waitFor("jx", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_NE(exit->error.find("Invalid argument"), std::string::npos) << exit->error;
}

// The agent's environment reaches ranks through its allow-list only: a node-wide libddl setting does, the
// operator's ddlctl credentials and anything unlisted (a cloud key in the shell that started it) do not.
TEST_P(SupervisorTest, AppliesEnvironmentInOrderAndWorkdir) {
  fs::create_directories(dir_ / "wd");
  RankSpec spec =
      shell("j1", 0,
            "echo $FOO; echo $DDL_TUNE_FILE; echo x${DDL_TOKEN}${DDL_TOKEN_FILE}${AWS_SECRET_KEY}x; "
            "pwd -P");
  spec.env = {{"FOO", "bar"}, {"FOO", "baz"}};
  spec.workdir = (dir_ / "wd").string();
  setenv("DDL_TUNE_FILE", "from-agent", 1);
  setenv("DDL_TOKEN", "ddl_secret", 1);
  setenv("DDL_TOKEN_FILE", "/root/.config/ddl/token", 1);
  setenv("AWS_SECRET_KEY", "s3cr3t", 1);
  mustStart(spec);
  auto exit = recorder_.waitFor("j1", 1, 0);
  for (const char* name : {"DDL_TUNE_FILE", "DDL_TOKEN", "DDL_TOKEN_FILE", "AWS_SECRET_KEY"}) unsetenv(name);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_EQ(readFile(spec.log_path), "baz\nfrom-agent\nxx\n" + (dir_ / "wd").string() + "\n");
}

TEST_P(SupervisorTest, MissingProgramFailsStartAndIsRecordedAs127) {
  RankSpec spec = shell("j1", 0, "");
  spec.argv = {"ddl-no-such-program", "--flag"};
  std::string error;
  RankState state = sup_->start(spec, &error);
  EXPECT_NE(error.find("ddl-no-such-program"), std::string::npos) << error;
  EXPECT_FALSE(state.running);
  EXPECT_EQ(state.exit_code, Supervisor::kExitCodeNotFound);

  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 127);
  EXPECT_EQ(exit->signal, std::nullopt);
  EXPECT_EQ(exit->program_pid, 0);
  // The reason travels with the exit report (RankStatus.error), not only in start()'s answer and the log.
  EXPECT_EQ(
      exit->error.rfind("cannot execute 'ddl-no-such-program': No such file or directory (searched PATH=", 0),
      0u)
      << exit->error;
  EXPECT_NE(readFile(spec.log_path).find("cannot execute 'ddl-no-such-program'"), std::string::npos);
  ASSERT_EQ(sup_->ranks().size(), 1u);
  EXPECT_EQ(sup_->ranks()[0].exit_code, 127);
}

TEST_P(SupervisorTest, ProgramIsLookedUpInTheRanksPath) {
  RankSpec spec = shell("j1", 0, "exit 0");
  spec.env = {{"PATH", (dir_ / "empty-bin").string()}};
  std::string error;
  RankState state = sup_->start(spec, &error);
  EXPECT_NE(error.find("PATH=" + (dir_ / "empty-bin").string()), std::string::npos) << error;
  EXPECT_EQ(state.exit_code, 127);
}

TEST_P(SupervisorTest, NonExecutableProgramIs126) {
  fs::path script = dir_ / "not-executable.sh";
  std::ofstream(script) << "#!/bin/sh\necho hi\n";
  chmod(script.c_str(), 0644);
  RankSpec spec = shell("j1", 0, "");
  spec.argv = {script.string()};
  std::string error;
  RankState state = sup_->start(spec, &error);
  EXPECT_NE(error.find("Permission denied"), std::string::npos) << error;
  EXPECT_EQ(state.exit_code, Supervisor::kExitCodeNotExecutable);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 126);
  EXPECT_EQ(exit->error, "cannot execute '" + script.string() + "': Permission denied") << exit->error;
}

// A file that is executable but neither a binary nor a script with a #! line: execve's ENOEXEC, which a shell
// would run through /bin/sh and the supervisor refuses (supervisor.h), with 126 as a shell gives for it.
TEST_P(SupervisorTest, NotABinaryIs126AndSaysSo) {
  fs::path file = dir_ / "trian.py";
  std::ofstream(file) << "print('no #! line')\n";
  chmod(file.c_str(), 0755);
  RankSpec spec = shell("j1", 0, "");
  spec.argv = {file.string()};
  std::string error;
  RankState state = sup_->start(spec, &error);
  EXPECT_EQ(state.exit_code, Supervisor::kExitCodeNotExecutable);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 126);
  EXPECT_EQ(exit->error,
            "cannot execute '" + file.string() + "': Exec format error (a script needs a #! line)");
}

TEST_P(SupervisorTest, MissingWorkdirIs127WithMessageInLog) {
  RankSpec spec = shell("j1", 0, "echo should-not-run");
  spec.workdir = (dir_ / "no-such-dir").string();
  std::string error;
  RankState state = sup_->start(spec, &error);
  EXPECT_NE(error.find("working directory"), std::string::npos) << error;
  EXPECT_EQ(state.exit_code, 127);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 127);
  std::string log = readFile(spec.log_path);
  EXPECT_NE(log.find("no-such-dir"), std::string::npos) << log;
  EXPECT_EQ(log.find("should-not-run"), std::string::npos) << log;
}

TEST_P(SupervisorTest, FailuresBeforeForkAreRecordedAs127) {
  std::ofstream(dir_ / "a-file") << "not a directory\n";
  RankSpec no_argv = shell("j1", 0, "exit 0");
  no_argv.argv.clear();
  RankSpec bad_env = shell("j1", 1, "exit 0");
  bad_env.env = {{"A=B", "c"}};
  RankSpec bad_log = shell("j1", 2, "exit 0");
  bad_log.log_path = (dir_ / "a-file" / "rank2.log").string();

  for (const RankSpec& spec : {no_argv, bad_env, bad_log}) {
    std::string error;
    RankState state = sup_->start(spec, &error);
    EXPECT_NE(error, "") << "rank " << spec.rank;
    EXPECT_EQ(state.pid, -1);
    EXPECT_FALSE(state.running);
    EXPECT_EQ(state.exit_code, 127);
    auto exit = recorder_.waitFor("j1", 1, spec.rank);
    ASSERT_TRUE(exit.has_value()) << "rank " << spec.rank;
    EXPECT_EQ(exit->exit_code, 127);
  }
  EXPECT_NE(readFile(no_argv.log_path).find("empty command line"), std::string::npos);
  EXPECT_EQ(sup_->ranks().size(), 3u);
}

TEST_P(SupervisorTest, EmptyJobIdRecordsNothing) {
  std::string error;
  EXPECT_EQ(sup_->start(shell("", 0, "exit 0"), &error).pid, -1);
  EXPECT_NE(error, "");
  EXPECT_TRUE(sup_->ranks().empty());
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(recorder_.count(), 0u);
}

TEST_P(SupervisorTest, ReportsDeathBySignal) {
  mustStart(shell("j1", 0, "kill -9 $$"));
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_EQ(exit->exit_code, std::nullopt);
}

TEST_P(SupervisorTest, RunningRankCannotBeStartedTwice) {
  RankSpec spec = shell("j1", 0, "exec sleep 100");
  RankState first = mustStart(spec);
  std::string error;
  RankState second = sup_->start(spec, &error);
  EXPECT_NE(error.find("already running"), std::string::npos) << error;
  EXPECT_EQ(second.pid, -1);
  ASSERT_EQ(sup_->ranks().size(), 1u);
  EXPECT_EQ(sup_->ranks()[0].pid, first.pid);
  EXPECT_TRUE(sup_->ranks()[0].running);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(recorder_.count(), 0u);
}

TEST_P(SupervisorTest, StopEndsRankWithSigterm) {
  RankSpec spec = shell("j1", 0, "");
  spec.argv = {"sleep", "100"};
  mustStart(spec);
  auto t0 = Clock::now();
  sup_->stop("j1", 0, 5000);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_LT(Clock::now() - t0, milliseconds(3000));
  EXPECT_EQ(exit->signal, SIGTERM);
  EXPECT_TRUE(exit->stop_requested);
}

TEST_P(SupervisorTest, StopEscalatesToSigkillAfterGrace) {
  RankSpec spec = shell("j1", 0, "trap '' TERM; echo ready; sleep 100");
  mustStart(spec);
  ASSERT_TRUE(waitUntil([&] { return readFile(spec.log_path) == "ready\n"; }));
  auto t0 = Clock::now();
  sup_->stop("j1", 1, 300);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_GE(Clock::now() - t0, milliseconds(290));
  EXPECT_EQ(exit->signal, SIGKILL);
  EXPECT_TRUE(exit->stop_requested);
}

TEST_P(SupervisorTest, StopKillsTheWholeProcessGroup) {
  fs::path pid_file = dir_ / "bg.pid";
  mustStart(shell("j1", 0, "sleep 100 & echo $! > " + pid_file.string() + "; wait"));
  pid_t bg = waitForPidFile(pid_file);
  ASSERT_GT(bg, 0);
  ASSERT_FALSE(processGone(bg));
  sup_->stop("j1", 0, 5000);
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 0).has_value());
  EXPECT_TRUE(waitUntil([&] { return processGone(bg); }, milliseconds(2000)));
}

TEST_P(SupervisorTest, LeaderExitKillsStragglersEvenIfTheyIgnoreSigterm) {
  fs::path pid_file = dir_ / "bg.pid";
  // The straggler ignores SIGTERM and outlives its leader: only the leader-exit SIGKILL can end it in time.
  mustStart(
      shell("j1", 0, "(trap '' TERM HUP; exec sleep 100) & echo $! > " + pid_file.string() + "; exit 0"));
  pid_t bg = waitForPidFile(pid_file);
  ASSERT_GT(bg, 0);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_TRUE(waitUntil([&] { return processGone(bg); }, milliseconds(2000)));
}

TEST_P(SupervisorTest, StopMatchesAttemptsUpToTheGivenOne) {
  RankSpec old_attempt = shell("j1", 0, "exec sleep 100");
  RankSpec new_attempt = old_attempt;
  new_attempt.attempt = 2;
  RankSpec other_job = shell("j2", 0, "exec sleep 100");
  mustStart(old_attempt);
  mustStart(new_attempt);
  mustStart(other_job);

  sup_->stop("j1", 1, 5000);
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 0).has_value());
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(recorder_.count(), 1u);

  sup_->stopAll(5000);
  EXPECT_TRUE(recorder_.waitFor("j1", 2, 0).has_value());
  EXPECT_TRUE(recorder_.waitFor("j2", 1, 0).has_value());
}

TEST_P(SupervisorTest, AStopOfNamedRanksStopsOnlyThoseOfThatAttempt) {
  // An elastic job that goes on without rank 1: ranks 0 and 2 and the same rank of another attempt go on.
  std::vector<RankSpec> ranks;
  for (int r = 0; r < 3; ++r) ranks.push_back(shell("j1", r, "exec sleep 100"));
  RankSpec later = shell("j1", 1, "exec sleep 100");
  later.attempt = 2;
  for (const RankSpec& r : ranks) mustStart(r);
  mustStart(later);

  sup_->stop("j1", 1, 5000, {1});
  auto stopped = recorder_.waitFor("j1", 1, 1);
  ASSERT_TRUE(stopped.has_value());
  EXPECT_EQ(stopped->signal, SIGTERM);
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(recorder_.count(), 1u);

  sup_->stopAll(5000);
  for (int r : {0, 2}) EXPECT_TRUE(recorder_.waitFor("j1", 1, r).has_value());
  EXPECT_TRUE(recorder_.waitFor("j1", 2, 1).has_value());
}

TEST_P(SupervisorTest, ReleaseForgetsOnlyExitedRanks) {
  mustStart(shell("j1", 0, "exit 0"));
  mustStart(shell("j1", 1, "exec sleep 100"));
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 0).has_value());
  auto held = sup_->ranks();
  ASSERT_EQ(held.size(), 2u);
  EXPECT_EQ(held[0].rank, 0);
  EXPECT_FALSE(held[0].running);
  EXPECT_TRUE(held[1].running);

  sup_->release("j1", 0);
  held = sup_->ranks();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].rank, 1);
  EXPECT_TRUE(held[0].running);
}

TEST_P(SupervisorTest, ExitedRankCanBeStartedAgain) {
  RankSpec spec = shell("j1", 0, "exit 4");
  mustStart(spec);
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 0).has_value());
  spec.argv = {"sh", "-c", "exec sleep 100"};
  RankState again = mustStart(spec);
  ASSERT_EQ(sup_->ranks().size(), 1u);
  EXPECT_TRUE(sup_->ranks()[0].running);
  EXPECT_EQ(sup_->ranks()[0].pid, again.pid);
}

TEST_P(SupervisorTest, CallbackMayCallBackIntoTheSupervisor) {
  std::mutex mu;
  std::vector<size_t> held_in_callback;
  Supervisor* self = nullptr;
  Supervisor sup(
      [&](const RankState& s) {
        size_t held = self->ranks().size();
        self->release(s.job_id, 0);
        std::lock_guard lock(mu);
        held_in_callback.push_back(held);
      },
      options());
  self = &sup;
  std::string error;
  sup.start(shell("j1", 0, "exit 0"), &error);
  ASSERT_EQ(error, "");
  ASSERT_TRUE(waitUntil([&] {
    std::lock_guard lock(mu);
    return !held_in_callback.empty();
  }));
  EXPECT_EQ(held_in_callback[0], 1u);
  EXPECT_TRUE(sup.ranks().empty());
}

TEST_P(SupervisorTest, AdoptedProcessExitIsReportedAsUnknown) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setsid();
    execl("/bin/sleep", "sleep", "0.5", static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_TRUE(waitUntil([&] { return getpgid(pid) == pid; }));

  RankState previous;
  previous.job_id = "j1";
  previous.attempt = 3;
  previous.rank = 2;
  previous.gpu = 1;
  previous.pid = pid;
  previous.running = true;
  previous.started_ms = 12345;
  std::string error;
  EXPECT_TRUE(sup_->adopt(previous, &error)) << error;
  EXPECT_TRUE(sup_->adopt(previous, &error)) << error;  // Idempotent.
  ASSERT_EQ(sup_->ranks().size(), 1u);
  EXPECT_TRUE(sup_->ranks()[0].running);
  EXPECT_EQ(sup_->ranks()[0].gpu, 1);

  auto exit = recorder_.waitFor("j1", 3, 2);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->pid, pid);
  EXPECT_EQ(exit->exit_code, Supervisor::kExitCodeUnknown);
  EXPECT_EQ(exit->signal, std::nullopt);
  EXPECT_EQ(exit->started_ms, 12345);
  EXPECT_FALSE(exit->running);
  // This test process is the real parent; the supervisor must not have reaped it.
  int status = 0;
  EXPECT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST_P(SupervisorTest, AdoptingAGoneProcessReportsItAtOnce) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(0);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);

  RankState previous;
  previous.job_id = "j1";
  previous.attempt = 1;
  previous.rank = 0;
  previous.pid = pid;
  std::string error;
  EXPECT_TRUE(sup_->adopt(previous, &error)) << error;
  auto exit = recorder_.waitFor("j1", 1, 0, milliseconds(2000));
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, Supervisor::kExitCodeUnknown);

  previous.pid = 0;
  EXPECT_FALSE(sup_->adopt(previous, &error));
  EXPECT_NE(error, "");
}

TEST_P(SupervisorTest, DestructorLeavesRanksRunningAndReturnsPromptly) {
  RankState state = mustStart(shell("j1", 0, "exec sleep 100"));
  auto t0 = Clock::now();
  sup_.reset();
  EXPECT_LT(Clock::now() - t0, milliseconds(1500));
  EXPECT_FALSE(processGone(state.pid));
  // Clean up by hand: the rank is still this process's child.
  kill(-state.pid, SIGKILL);
  EXPECT_EQ(waitpid(state.pid, nullptr, 0), state.pid);
}

// An agent restart: the first supervisor goes (its ranks keep running), a second one on the same state dir
// recovers them from their run records and learns how each ended from its shim's exit record.
TEST_P(SupervisorTest, RecoveredRanksReportTheirRealExitThroughTheShim) {
  fs::path gate = dir_ / "gate";
  // Waits for the gate, at most 10 s, so that a failed test leaves no rank behind for long.
  const std::string await_gate =
      "i=0; while [ ! -e " + gate.string() + " ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; ";
  RankState slow = mustStart(shell("j1", 0, await_gate + "exit 3"));
  RankState killed = mustStart(shell("j1", 1, await_gate + "kill -USR1 $$"));
  RankSpec quick_spec = shell("j1", 2, "exit 4");
  quick_spec.gpu = 5;
  RankState quick = mustStart(quick_spec);
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 2).has_value());
  sup_.reset();  // The "agent" exits: ranks 0 and 1 are still running, rank 2 exited but was never released.

  Recorder second;
  Supervisor sup([&](const RankState& s) { second.record(s); }, options());
  EXPECT_EQ(sup.recover(), std::vector<std::string>{});
  auto held = sup.ranks();
  ASSERT_EQ(held.size(), 3u);
  EXPECT_TRUE(held[0].running);
  EXPECT_EQ(held[0].pid, slow.pid);
  EXPECT_EQ(held[0].started_ms, slow.started_ms);
  EXPECT_EQ(held[2].gpu, 5);
  std::ofstream(gate) << "go\n";

  auto r0 = second.waitFor("j1", 1, 0), r1 = second.waitFor("j1", 1, 1), r2 = second.waitFor("j1", 1, 2);
  ASSERT_TRUE(r0 && r1 && r2);
  if (GetParam().shim) {
    EXPECT_EQ(r0->exit_code, 3);
    EXPECT_EQ(r1->signal, SIGUSR1);
    EXPECT_EQ(r1->exit_code, std::nullopt);
    EXPECT_EQ(r2->exit_code, 4);
  } else {  // Without the shim nobody recorded it: unknown, never a success.
    EXPECT_EQ(r0->exit_code, Supervisor::kExitCodeUnknown);
    EXPECT_EQ(r1->exit_code, Supervisor::kExitCodeUnknown);
    EXPECT_EQ(r2->exit_code, Supervisor::kExitCodeUnknown);
  }
  // Releasing forgets them, records included.
  sup.release("j1", 0);
  EXPECT_TRUE(sup.ranks().empty());
  EXPECT_FALSE(fs::exists(dir_ / "state" / "j1"));
  // This test process is still the parent of the shims (or ranks) it started: reap them.
  for (pid_t pid : {slow.pid, killed.pid, quick.pid}) waitpid(pid, nullptr, 0);
}

TEST_P(SupervisorTest, StopReachesARecoveredRank) {
  RankState state = mustStart(shell("j1", 0, "exec sleep 100"));
  sup_.reset();
  Recorder second;
  Supervisor sup([&](const RankState& s) { second.record(s); }, options());
  EXPECT_EQ(sup.recover(), std::vector<std::string>{});
  sup.stop("j1", 0, 5000);
  auto exit = second.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->stop_requested);
  if (GetParam().shim) {
    EXPECT_EQ(exit->signal, SIGTERM);
  }
  waitpid(state.pid, nullptr, 0);
}

// What the agent believes rank telemetry from: processes of the rank's session, through the shim or not.
TEST_P(SupervisorTest, InRankSessionKnowsTheRanksProcesses) {
  fs::path pid_file = dir_ / "bg.pid";
  RankState state = mustStart(shell("j1", 0, "sleep 100 & echo $! > " + pid_file.string() + "; wait"));
  pid_t bg = waitForPidFile(pid_file);
  ASSERT_GT(bg, 0);
  EXPECT_TRUE(sup_->inRankSession("j1", 1, 0, state.pid));
  EXPECT_TRUE(sup_->inRankSession("j1", 1, 0, bg));
  EXPECT_FALSE(sup_->inRankSession("j1", 1, 1, bg));  // another rank's
  EXPECT_FALSE(sup_->inRankSession("j1", 2, 0, bg));  // another attempt's
  EXPECT_FALSE(sup_->inRankSession("j1", 1, 0, getpid()));
  sup_->stop("j1", 0, 5000);
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 0).has_value());
  EXPECT_FALSE(sup_->inRankSession("j1", 1, 0, state.pid));  // exited
}

TEST_P(SupervisorTest, RecoverSkipsUnreadableRecordsAndNamesThem) {
  fs::create_directories(dir_ / "state" / "j9" / "attempt-2");
  std::ofstream(dir_ / "state" / "j9" / "attempt-2" / "rank-0.run") << "garbage\n";
  std::ofstream(dir_ / "state" / "j9" / "attempt-2" / "notes.txt") << "not a record\n";
  auto problems = sup_->recover();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("rank-0.run: unreadable"), std::string::npos) << problems[0];
  EXPECT_TRUE(sup_->ranks().empty());
}

TEST_P(SupervisorTest, JobIdsThatCannotNameADirectoryAreRefused) {
  std::string error;
  RankState state = sup_->start(shell("../evil", 0, "exit 0"), &error);
  EXPECT_NE(error.find("cannot name a directory"), std::string::npos) << error;
  EXPECT_EQ(state.pid, -1);
  EXPECT_TRUE(sup_->ranks().empty());
}

// RankState::program_pid is the program's own pid, through the shim too, and an agent that re-adopts the rank
// after a restart still knows it (the run record keeps it).
TEST_P(SupervisorTest, ProgramPidIsTheProgramsOwnAndSurvivesARestart) {
  fs::path pid_file = dir_ / "program.pid";
  RankState state = mustStart(shell("j1", 0, "echo $$ > " + pid_file.string() + "; exec sleep 100"));
  const pid_t program = waitForPidFile(pid_file);
  ASSERT_GT(program, 0);
  EXPECT_EQ(state.program_pid, program);
  if (GetParam().shim) {
    EXPECT_NE(state.program_pid, state.pid);  // the shim leads the group; the program is its child
    EXPECT_EQ(getpgid(program), state.pid);
  } else {
    EXPECT_EQ(state.program_pid, state.pid);
  }
  ASSERT_EQ(sup_->ranks().size(), 1u);
  EXPECT_EQ(sup_->ranks()[0].program_pid, program);

  sup_.reset();
  Recorder second;
  Supervisor sup([&](const RankState& s) { second.record(s); }, options());
  EXPECT_EQ(sup.recover(), std::vector<std::string>{});
  ASSERT_EQ(sup.ranks().size(), 1u);
  EXPECT_EQ(sup.ranks()[0].program_pid, program);
  sup.stop("j1", 0, 5000);
  auto exit = second.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->program_pid, program);
  waitpid(state.pid, nullptr, 0);
}

// A run record written before program_pid existed is still adopted, with the program's pid unknown (0).
TEST_P(SupervisorTest, RunRecordsWithoutProgramPidAreAdopted) {
  fs::create_directories(dir_ / "state" / "j9" / "attempt-2");
  // A pid that is gone: adopted and reported as exited at once.
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) _exit(0);
  ASSERT_EQ(waitpid(pid, nullptr, 0), pid);
  std::ofstream(dir_ / "state" / "j9" / "attempt-2" / "rank-0.run")
      << "pid " << pid << " gpu 3 started_ms 1234\n";
  EXPECT_EQ(sup_->recover(), std::vector<std::string>{});
  auto exit = recorder_.waitFor("j9", 2, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->gpu, 3);
  EXPECT_EQ(exit->program_pid, 0);
}

// SignalJob: the signal reaches the programs of that job's running ranks of that attempt (not the shim, and
// not other jobs' or attempts' ranks), and each program decides what to do with it.
// The coordinator repeats a stop with every heartbeat that still reports the rank: the program gets one
// SIGTERM, whatever the number of stops, and SIGKILL once the first grace has passed.
TEST_P(SupervisorTest, RepeatedStopsSendOneSigterm) {
  const fs::path terms = dir_ / "terms";
  const fs::path ready = dir_ / "ready";
  RankSpec spec = shell("j1", 0,
                        "trap 'echo TERM >> " + terms.string() + "' TERM; echo $$ > " + ready.string() +
                            "; i=0; while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done");
  mustStart(spec);
  ASSERT_GT(waitForPidFile(ready.string()), 0);
  for (int i = 0; i < 5; ++i) {
    sup_->stop("j1", 0, 1500);
    std::this_thread::sleep_for(milliseconds(100));
  }
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_TRUE(exit->stop_requested);  // ended by the SIGKILL after the grace: the trap kept it alive
  EXPECT_EQ(readFile(terms), "TERM\n");
}

TEST_P(SupervisorTest, SignalJobReachesOnlyThatJobsProgramsWhichDecide) {
  // Each rank traps SIGUSR1: rank 0 writes a file and exits 7, rank 1 writes a file and goes on. `ready`
  // says the trap is set. Every loop ends within 10 s, so a failed test leaves nothing running for long.
  auto ranked = [&](const std::string& job, int attempt, int rank, const std::string& on_usr1) {
    const fs::path base = dir_ / (job + "-" + std::to_string(attempt) + "-" + std::to_string(rank));
    RankSpec spec = shell(job, rank,
                          "trap '" + on_usr1 + "' USR1; echo $$ > " + base.string() +
                              ".ready; i=0; while [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done");
    spec.attempt = attempt;
    return std::make_pair(spec, base);
  };
  auto [r0, base0] = ranked("j1", 1, 0, "echo got > " + (dir_ / "j1-1-0.got").string() + "; exit 7");
  auto [r1, base1] = ranked("j1", 1, 1, "echo got > " + (dir_ / "j1-1-1.got").string());
  auto [other_job, base2] = ranked("j2", 1, 0, "echo got > " + (dir_ / "j2-1-0.got").string() + "; exit 8");
  auto [other_attempt, base3] =
      ranked("j1", 2, 5, "echo got > " + (dir_ / "j1-2-5.got").string() + "; exit 9");
  for (const RankSpec* spec : {&r0, &r1, &other_job, &other_attempt}) mustStart(*spec);
  for (const fs::path& base : {base0, base1, base2, base3}) {
    ASSERT_GT(waitForPidFile(base.string() + ".ready"), 0) << base;
  }

  EXPECT_EQ(sup_->signalJob("j1", 0, 0), 0);          // not a signal
  EXPECT_EQ(sup_->signalJob("j1", 0, 65), 0);         // beyond SIGRTMAX
  EXPECT_EQ(sup_->signalJob("nope", 0, SIGUSR1), 0);  // a job not held here
  EXPECT_EQ(sup_->signalJob("j1", 3, SIGUSR1), 0);    // an attempt not held here
  EXPECT_EQ(sup_->signalJob("j1", 1, SIGUSR1), 2);

  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 7);  // the program's own decision, through the shim unchanged
  EXPECT_EQ(exit->signal, std::nullopt);
  EXPECT_FALSE(exit->stop_requested);
  EXPECT_TRUE(waitUntil([&] { return readFile(dir_ / "j1-1-1.got") == "got\n"; }));
  // Rank 1 caught it and goes on; the other job and the other attempt never saw it.
  std::this_thread::sleep_for(milliseconds(200));
  for (const RankState& s : sup_->ranks()) {
    if (s.job_id == "j1" && s.attempt == 1 && s.rank == 0) continue;
    EXPECT_TRUE(s.running) << s.job_id << " " << s.attempt << " " << s.rank;
  }
  EXPECT_FALSE(fs::exists(dir_ / "j2-1-0.got"));
  EXPECT_FALSE(fs::exists(dir_ / "j1-2-5.got"));
  EXPECT_EQ(recorder_.count(), 1u);

  // Attempt 0 means every attempt of the job: rank 1 again, and attempt 2's rank, which exits 9.
  EXPECT_EQ(sup_->signalJob("j1", 0, SIGUSR1), 2);
  auto later = recorder_.waitFor("j1", 2, 5);
  ASSERT_TRUE(later.has_value());
  EXPECT_EQ(later->exit_code, 9);
  EXPECT_FALSE(fs::exists(dir_ / "j2-1-0.got"));
}

TEST_P(SupervisorTest, AMissingShimIsExplained) {
  if (!GetParam().shim) GTEST_SKIP() << "only with the shim";
  Supervisor::Options broken = options();
  broken.shim_path = (dir_ / "no-such-shim").string();
  Recorder rec;
  Supervisor sup([&](const RankState& s) { rec.record(s); }, broken);
  std::string error;
  RankState state = sup.start(shell("j1", 0, "exit 0"), &error);
  EXPECT_NE(error.find("cannot execute the rank shim"), std::string::npos) << error;
  EXPECT_EQ(state.exit_code, Supervisor::kExitCodeNotFound);
  ASSERT_TRUE(rec.waitFor("j1", 1, 0).has_value());
}

// The report pipe's records (launch_protocol.h): what an old and a new shim send, and what is refused.
TEST(LaunchProtocol, ParseReport) {
  using launch::Failure;
  Failure failure{9, 9};
  pid_t program_pid = 9;
  EXPECT_TRUE(launch::parseReport("", 0, &failure, &program_pid));  // exec'd, pid not told (an older shim)
  EXPECT_EQ(failure.stage, 0);
  EXPECT_EQ(program_pid, 0);

  const Failure started{launch::kStageStarted, 4242};
  EXPECT_TRUE(launch::parseReport(&started, sizeof started, &failure, &program_pid));
  EXPECT_EQ(failure.stage, 0);
  EXPECT_EQ(program_pid, 4242);

  const Failure exec{launch::kStageExec, ENOENT};
  EXPECT_TRUE(launch::parseReport(&exec, sizeof exec, &failure, &program_pid));
  EXPECT_EQ(failure.stage, launch::kStageExec);
  EXPECT_EQ(failure.err, ENOENT);
  EXPECT_EQ(program_pid, 0);

  failure = Failure{1, 1};
  program_pid = 1;
  for (const Failure& bad : {Failure{launch::kStageStarted, 0}, Failure{launch::kStageStarted, -5},
                             Failure{0, 0}, Failure{9, 1}, Failure{-1, 1}}) {
    EXPECT_FALSE(launch::parseReport(&bad, sizeof bad, &failure, &program_pid))
        << bad.stage << " " << bad.err;
  }
  EXPECT_FALSE(launch::parseReport(&exec, sizeof exec - 1, &failure, &program_pid));  // torn
  EXPECT_EQ(failure.stage, 1);                                                        // untouched on refusal
  EXPECT_EQ(program_pid, 1);
}

// Running ranks as the job's user. The accounts are real: a throwaway group and two users made with
// groupadd/useradd for each test process (ddlt-PID-a, a member of ddlt-PID-g; ddlt-PID-r, a second name for
// uid 0) and deleted afterwards, also when a test fails; accounts that a crashed run left behind (their pid
// is gone) are deleted first. Skipped, with the reason, where the suite is not root or useradd is missing.
class RunAsTest : public SupervisorTest {
 public:
  static void SetUpTestSuite() {
    skip_ = test::accountsUnavailable();
    if (!skip_.empty()) return;
    test::removeStaleTestAccounts();
    group_ = test::testAccountName('g');
    user_ = test::testAccountName('a');
    root_alias_ = test::testAccountName('r');
    const std::string no_home = " --no-create-home --shell /bin/sh --home-dir /nonexistent/";
    // 2>/dev/null: useradd warns that uid 0 is "outside of the UID_MIN ... range", which is the point.
    const bool made = test::shellOk("groupadd " + group_) &&
                      test::shellOk("useradd --groups " + group_ + no_home + user_ + " " + user_) &&
                      test::shellOk("useradd --non-unique --uid 0 --gid 0 --no-user-group" + no_home +
                                    root_alias_ + " " + root_alias_ + " 2>/dev/null");
    if (!made) skip_ = "could not make the test accounts with groupadd/useradd (see above)";
  }

  static void TearDownTestSuite() {
    if (group_.empty()) return;
    // --force: the uid-0 alias shares its uid with every root process. Never --remove (its home is not its).
    test::shellOk("userdel --force " + root_alias_ + " 2>/dev/null");
    test::shellOk("userdel " + user_ + " 2>/dev/null");
    test::shellOk("groupdel " + group_ + " 2>/dev/null");
    group_.clear();
  }

 protected:
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    SupervisorTest::SetUp();
    // The ranks run as the test user: let it reach what the tests share with it (dir_ is 0700 from mkdtemp).
    chmod(dir_.c_str(), 0755);
    fs::create_directories(dir_ / "shared");
    chmod((dir_ / "shared").c_str(), 01777);
    std::string error;
    auto account = lookupAccount(user_, "test-node", false, &error);
    ASSERT_TRUE(account.has_value()) << error;
    user_account_ = *account;
  }

  void TearDown() override {
    if (!skip_.empty()) return;
    SupervisorTest::TearDown();
  }

  RankSpec as(RankSpec spec, const Account& account) {
    spec.run_as = account;
    return spec;
  }

  // The uid in /proc/PID/status ("Uid: real effective saved fs").
  static std::string procUids(pid_t pid) {
    std::istringstream lines(readFile("/proc/" + std::to_string(pid) + "/status"));
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("Uid:", 0) == 0) return line;
    }
    return "";
  }

  static std::string uidLine(uid_t uid) {
    const std::string u = std::to_string(uid);
    return "Uid:\t" + u + "\t" + u + "\t" + u + "\t" + u;
  }

  static inline std::string skip_;
  static inline std::string group_, user_, root_alias_;
  Account user_account_;
};

TEST(LookupAccount, ResolvesRefusesUnknownAndRoot) {
  std::string error;
  EXPECT_FALSE(lookupAccount("ddlt-no-such-user", "n1", false, &error).has_value());
  EXPECT_EQ(error, "user 'ddlt-no-such-user' does not exist on node n1");
  EXPECT_FALSE(lookupAccount("", "n1", true, &error).has_value());
  EXPECT_NE(error.find("no user"), std::string::npos) << error;
  EXPECT_FALSE(lookupAccount("root", "n1", false, &error).has_value());
  EXPECT_EQ(error, "user 'root' is uid 0 and the coordinator does not allow root jobs (allow_root_jobs)");
  auto root = lookupAccount("root", "n1", true, &error);
  ASSERT_TRUE(root.has_value()) << error;
  EXPECT_EQ(error, "");
  EXPECT_EQ(root->uid, 0u);
  EXPECT_EQ(root->gid, 0u);
  EXPECT_NE(std::find(root->groups.begin(), root->groups.end(), 0u), root->groups.end());
  EXPECT_EQ(root->home, "/root");
}

TEST_P(RunAsTest, LookupGivesTheAccountsIdsGroupsHomeAndShell) {
  const Account& a = user_account_;
  EXPECT_EQ(a.name, user_);
  EXPECT_NE(a.uid, 0u);
  EXPECT_EQ(a.home, "/nonexistent/" + user_);
  EXPECT_EQ(a.shell, "/bin/sh");
  std::string error;
  ASSERT_TRUE(lookupAccount(group_, "n1", false, &error) == std::nullopt);  // a group is not a user
  EXPECT_NE(std::find(a.groups.begin(), a.groups.end(), a.gid), a.groups.end());
  EXPECT_EQ(a.groups.size(), 2u);  // its own group and ddlt-PID-g
  // Refused by its uid, whatever its name.
  EXPECT_FALSE(lookupAccount(root_alias_, "n1", false, &error).has_value());
  EXPECT_EQ(error, "user '" + root_alias_ +
                       "' is uid 0 and the coordinator does not allow root jobs (allow_root_jobs)");
  auto alias = lookupAccount(root_alias_, "n1", true, &error);
  ASSERT_TRUE(alias.has_value()) << error;
  EXPECT_EQ(alias->uid, 0u);
}

TEST_P(RunAsTest, RankRunsWithTheUsersIdsGroupsAndEnvironment) {
  RankSpec spec =
      as(shell("j1", 0, "id -u; id -g; id -G; echo $HOME; echo $USER; echo $LOGNAME; echo $SHELL"),
         user_account_);
  // The job cannot claim to be someone else; it may pick its SHELL.
  spec.env = {{"HOME", "/root"}, {"USER", "root"}, {"LOGNAME", "root"}};
  RankSpec shell_spec = as(shell("j1", 1, "echo $SHELL"), user_account_);
  shell_spec.env = {{"SHELL", "/bin/bash"}};
  mustStart(spec);
  mustStart(shell_spec);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0) << readFile(spec.log_path);
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 1).has_value());

  std::istringstream out(readFile(spec.log_path));
  std::string uid, gid, groups, home, user, logname, sh;
  std::getline(out, uid);
  std::getline(out, gid);
  std::getline(out, groups);
  std::getline(out, home);
  std::getline(out, user);
  std::getline(out, logname);
  std::getline(out, sh);
  EXPECT_EQ(uid, std::to_string(user_account_.uid));
  EXPECT_EQ(gid, std::to_string(user_account_.gid));
  std::vector<gid_t> seen, want = user_account_.groups;
  std::istringstream words(groups);
  for (unsigned long g; words >> g;) seen.push_back(static_cast<gid_t>(g));
  std::sort(seen.begin(), seen.end());
  std::sort(want.begin(), want.end());
  EXPECT_EQ(seen, want) << groups;
  EXPECT_EQ(home, "/nonexistent/" + user_);
  EXPECT_EQ(user, user_);
  EXPECT_EQ(logname, user_);
  EXPECT_EQ(sh, "/bin/sh");
  EXPECT_EQ(readFile(shell_spec.log_path), "/bin/bash\n");
}

// A PATH with a directory the rank's user may not enter (root's PATH into /root) makes execvp fail with
// EACCES although the program is nowhere: the rank is reported as not found (127), as it is.
TEST_P(RunAsTest, AProgramFoundNowhereIsNotFoundEvenBehindAClosedDirectory) {
  const fs::path closed = dir_ / "closed";
  fs::create_directories(closed);
  chmod(closed.c_str(), 0700);  // root's; the test user may not enter it
  RankSpec spec = as(shell("j1", 0, "true"), user_account_);
  spec.argv = {"ddlt-no-such-program"};
  spec.env = {{"PATH", closed.string() + ":/usr/bin:/bin"}};
  std::string error;
  RankState state = sup_->start(spec, &error);
  auto exit = state.running ? recorder_.waitFor("j1", 1, 0) : std::optional<RankState>(state);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 127) << exit->error;
  EXPECT_NE(exit->error.find("No such file or directory"), std::string::npos) << exit->error;
  EXPECT_NE(exit->error.find("closed to the rank's user"), std::string::npos) << exit->error;
}

TEST_P(RunAsTest, LogBelongsToTheUserWithMode0600) {
  RankSpec spec = as(shell("j1", 0, "echo hello"), user_account_);
  // An earlier start left a world-readable root-owned log: it is taken over too.
  fs::create_directories(fs::path(spec.log_path).parent_path());
  std::ofstream(spec.log_path) << "earlier\n";
  chmod(spec.log_path.c_str(), 0644);
  RankSpec fresh = as(shell("j1", 1, "echo hello"), user_account_);
  mustStart(spec);
  mustStart(fresh);
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 0).has_value());
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 1).has_value());
  for (const RankSpec& s : {spec, fresh}) {
    struct stat st {};
    ASSERT_EQ(stat(s.log_path.c_str(), &st), 0);
    EXPECT_EQ(st.st_uid, user_account_.uid) << s.log_path;
    EXPECT_EQ(st.st_gid, user_account_.gid) << s.log_path;
    EXPECT_EQ(st.st_mode & 07777, 0600u) << s.log_path;
    EXPECT_NE(readFile(s.log_path).find("hello\n"), std::string::npos);
  }
  struct stat dir {};
  ASSERT_EQ(stat(fs::path(spec.log_path).parent_path().c_str(), &dir), 0);
  EXPECT_EQ(dir.st_uid, 0u);  // The log's directories stay the agent's.
}

TEST_P(RunAsTest, WorkdirIsEnteredAsTheUser) {
  fs::create_directories(dir_ / "roots-only");
  chmod((dir_ / "roots-only").c_str(), 0700);
  RankSpec denied = as(shell("j1", 0, "echo should-not-run"), user_account_);
  denied.workdir = (dir_ / "roots-only").string();
  std::string error;
  RankState state = sup_->start(denied, &error);
  EXPECT_NE(error.find("cannot change to the working directory"), std::string::npos) << error;
  EXPECT_NE(error.find("Permission denied"), std::string::npos) << error;
  EXPECT_EQ(state.exit_code, 127);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_NE(exit->error.find("Permission denied"), std::string::npos) << exit->error;
  EXPECT_EQ(readFile(denied.log_path).find("should-not-run"), std::string::npos);

  RankSpec allowed = as(shell("j1", 1, "pwd -P"), user_account_);
  allowed.workdir = (dir_ / "shared").string();
  mustStart(allowed);
  ASSERT_TRUE(recorder_.waitFor("j1", 1, 1).has_value());
  EXPECT_EQ(readFile(allowed.log_path), (dir_ / "shared").string() + "\n");
}

TEST_P(RunAsTest, UnknownUserIsRejectedWithTheReason) {
  std::string why;
  ASSERT_FALSE(lookupAccount("ddlt-no-such-user", "n1", false, &why).has_value());
  RankSpec spec = shell("j1", 0, "echo should-not-run");
  std::string error;
  RankState state = sup_->reject(spec, why, &error);
  EXPECT_EQ(error, "rank 0 of job j1 attempt 1: user 'ddlt-no-such-user' does not exist on node n1");
  EXPECT_FALSE(state.running);
  EXPECT_EQ(state.pid, -1);
  EXPECT_EQ(state.exit_code, Supervisor::kExitCodeNotFound);
  EXPECT_EQ(state.error, why);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->error, why);
  EXPECT_EQ(exit->exit_code, 127);
  EXPECT_NE(readFile(spec.log_path).find(why), std::string::npos);
  ASSERT_EQ(sup_->ranks().size(), 1u);
  EXPECT_EQ(sup_->ranks()[0].error, why);
  // Like any other exit it stays until released, and a running rank is never replaced by a rejection.
  RankSpec running = shell("j1", 1, "exec sleep 100");
  mustStart(running);
  EXPECT_FALSE(sup_->reject(running, why, &error).running);
  EXPECT_NE(error.find("already running"), std::string::npos) << error;
  EXPECT_TRUE(sup_->ranks()[1].running);
}

TEST_P(RunAsTest, Uid0AccountRunsOnlyWhenAllowed) {
  std::string error;
  ASSERT_FALSE(lookupAccount(root_alias_, "n1", false, &error).has_value());
  auto alias = lookupAccount(root_alias_, "n1", true, &error);
  ASSERT_TRUE(alias.has_value()) << error;
  RankSpec spec = as(shell("j1", 0, "id -u; echo $USER"), *alias);
  mustStart(spec);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_EQ(readFile(spec.log_path), "0\n" + root_alias_ + "\n");
}

// What an agent that is not root gets when it is asked to switch anyway: the kernel's refusal, as a start
// failure that names the user. The "agent" here is a child of the test switched to the test user.
TEST_P(RunAsTest, ASwitchTheKernelRefusesFailsTheStartWithTheReason) {
  std::string error;
  auto alias = lookupAccount(root_alias_, "n1", true, &error);
  ASSERT_TRUE(alias.has_value()) << error;
  const fs::path own = dir_ / "shared" / "agent";
  fs::create_directories(own);
  ASSERT_EQ(chown(own.c_str(), user_account_.uid, user_account_.gid), 0);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // glibc's fork leaves malloc usable in the child; the supervisor below is this process's only one.
    alarm(10);
    close(pipe_fds[0]);
    launch::Identity me{user_account_.uid, user_account_.gid, user_account_.groups.data(),
                        user_account_.groups.size()};
    if (launch::switchUser(me).stage != 0) _exit(3);
    Supervisor::Options options = this->options();
    options.state_dir = (own / "state").string();
    Supervisor sup([](const RankState&) {}, options);
    RankSpec spec = as(shell("j1", 0, "echo should-not-run"), *alias);
    spec.log_path = "";  // A log would fail first: it cannot be given to uid 0 either.
    std::string why;
    RankState state = sup.start(spec, &why);
    why += "|" + state.error + "|" + std::to_string(state.exit_code.value_or(-1));
    ssize_t ignored = write(pipe_fds[1], why.data(), why.size());
    (void)ignored;
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string why = "cannot switch to user " + root_alias_ + " (uid 0): Operation not permitted";
  EXPECT_EQ(got, "rank 0 of job j1 attempt 1: " + why + "|" + why + "|127");
}

// The exit record stays trustworthy: the shim that writes it stays root while the program runs as the user,
// and a rank adopted after an agent restart still reports its real exit.
// The job's environment is the program's only: a root process (the shim) started with it would run the job's
// LD_PRELOAD library as root.
TEST_P(RunAsTest, TheJobsEnvironmentRunsNoCodeAsRoot) {
  const fs::path out = dir_ / "shared" / "probe.txt";
  std::ofstream(out).close();
  ASSERT_EQ(chmod(out.c_str(), 0666), 0);
  RankSpec spec = as(shell("j1", 0, "echo ran"), user_account_);
  spec.env = {{"LD_PRELOAD", DDL_PRELOAD_PROBE}, {"DDL_PRELOAD_PROBE_OUT", out.string()}};
  mustStart(spec);
  auto exit = recorder_.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0) << readFile(spec.log_path);
  const std::string loaded = readFile(out.string());
  EXPECT_EQ(loaded.find("euid=0\n"), std::string::npos) << "a root process ran the job's LD_PRELOAD:\n" << loaded;
  EXPECT_NE(readFile(spec.log_path).find("ran"), std::string::npos);
}

TEST_P(RunAsTest, ShimStaysRootAndAnAdoptedRankReportsItsExit) {
  fs::path gate = dir_ / "shared" / "gate";
  fs::path pid_file = dir_ / "shared" / "program.pid";
  const std::string script = "echo $$ > " + pid_file.string() + "; i=0; while [ ! -e " + gate.string() +
                             " ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; exit 3";
  RankState started = mustStart(as(shell("j1", 0, script), user_account_));
  pid_t program = waitForPidFile(pid_file);
  ASSERT_GT(program, 0);
  EXPECT_EQ(procUids(program), uidLine(user_account_.uid));
  EXPECT_EQ(procUids(started.pid), uidLine(GetParam().shim ? 0 : user_account_.uid));

  sup_.reset();  // The agent restarts; the rank keeps running.
  Recorder second;
  Supervisor sup([&](const RankState& s) { second.record(s); }, options());
  EXPECT_EQ(sup.recover(), std::vector<std::string>{});
  ASSERT_EQ(sup.ranks().size(), 1u);
  EXPECT_TRUE(sup.ranks()[0].running);
  std::ofstream(gate) << "go\n";
  auto exit = second.waitFor("j1", 1, 0);
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, GetParam().shim ? 3 : Supervisor::kExitCodeUnknown);
  EXPECT_EQ(exit->error, "");
  waitpid(started.pid, nullptr, 0);
}

INSTANTIATE_TEST_SUITE_P(Waiting, RunAsTest, ::testing::Values(Mode{true, false}, Mode{true, true}),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return std::string(info.param.shim ? "Shim" : "Direct");
                         });

INSTANTIATE_TEST_SUITE_P(Waiting, SupervisorTest,
                         ::testing::Values(Mode{true, false}, Mode{false, false}, Mode{true, true},
                                           Mode{false, true}),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return std::string(info.param.pidfd ? "Pidfd" : "Polling") +
                                  (info.param.shim ? "Shim" : "Direct");
                         });

}  // namespace
}  // namespace ddl::worker
