// Supervisor tests with real processes (/bin/sh, sleep). Every test runs four times: waiting on pidfds, and on
// the polling fallback used where pidfd_open is missing; each with ranks exec'd directly and through
// ddl-rank-shim (which must not change anything a rank or the agent sees). Every wait is bounded; the suite
// takes a few seconds.
#include "supervisor.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

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

TEST_P(SupervisorTest, AppliesEnvironmentInOrderAndWorkdir) {
  fs::create_directories(dir_ / "wd");
  RankSpec spec = shell("j1", 0, "echo $FOO; echo $DDL_KEPT; pwd -P");
  spec.env = {{"FOO", "bar"}, {"FOO", "baz"}};
  spec.workdir = (dir_ / "wd").string();
  setenv("DDL_KEPT", "from-agent", 1);
  mustStart(spec);
  auto exit = recorder_.waitFor("j1", 1, 0);
  unsetenv("DDL_KEPT");
  ASSERT_TRUE(exit.has_value());
  EXPECT_EQ(exit->exit_code, 0);
  EXPECT_EQ(readFile(spec.log_path), "baz\nfrom-agent\n" + (dir_ / "wd").string() + "\n");
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
  EXPECT_NE(readFile(spec.log_path).find("cannot execute ddl-no-such-program"), std::string::npos);
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

INSTANTIATE_TEST_SUITE_P(Waiting, SupervisorTest,
                         ::testing::Values(Mode{true, false}, Mode{false, false}, Mode{true, true},
                                           Mode{false, true}),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return std::string(info.param.pidfd ? "Pidfd" : "Polling") +
                                  (info.param.shim ? "Shim" : "Direct");
                         });

}  // namespace
}  // namespace ddl::worker
