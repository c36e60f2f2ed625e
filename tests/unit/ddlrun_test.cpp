// Tests of the ddlrun launcher, run as users run it: the built binary (DDL_BIN_DIR "/ddlrun") is forked with
// pipes on its stdout and stderr, and its output, exit status and the fate of the rank processes are checked.
// Ranks are /bin/sh scripts. Where a test needs the ranks to be up before something happens, the ranks write
// their pids to a file in a per-test temporary directory and the trigger waits (boundedly) for that file; the
// same pids then prove that a stop left no process behind. Every wait in this file has a deadline, and a
// ddlrun that overruns it is SIGKILLed (its ranks die with it through PR_SET_PDEATHSIG).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/version.h"
#include "gtest/gtest.h"
#include "topology_cases.h"

#ifndef DDL_BIN_DIR
#error "DDL_BIN_DIR must name the directory that holds the ddlrun binary"
#endif

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kRunTimeoutMs = 30000;

struct RunResult {
  std::string out;
  std::string err;
  int status = -1;  // exit code, or 128 + signal
  bool timed_out = false;
  double seconds = 0;
};

// A ddlrun process started by the test; finish() collects what it printed and how it ended.
class Ddlrun {
 public:
  // program: the path ddlrun is started by (a link to it, say).
  explicit Ddlrun(const std::vector<std::string>& args, const std::string& program = DDL_BIN_DIR "/ddlrun")
      : start_(Clock::now()) {
    int out[2];
    int err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) std::abort();
    std::vector<std::string> argv_strings = {program};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ < 0) std::abort();
    if (pid_ == 0) {
      int null_fd = open("/dev/null", O_RDONLY);
      dup2(null_fd, 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execv(argv[0], argv.data());
      _exit(126);
    }
    close(out[1]);
    close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
  }

  ~Ddlrun() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
  }

  pid_t pid() const { return pid_; }

  RunResult finish(int timeout_ms = kRunTimeoutMs) {
    RunResult result;
    auto deadline = start_ + std::chrono::milliseconds(timeout_ms);
    while ((out_fd_ >= 0 || err_fd_ >= 0) && Clock::now() < deadline) {
      pollfd fds[2] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}};
      int wait_ms = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count() + 1);
      if (poll(fds, 2, wait_ms) <= 0) continue;
      readSome(fds[0], &out_fd_, &result.out);
      readSome(fds[1], &err_fd_, &result.err);
    }
    int wait_status = 0;
    while (waitpid(pid_, &wait_status, WNOHANG) == 0) {
      if (Clock::now() >= deadline) {
        result.timed_out = true;
        kill(pid_, SIGKILL);
        waitpid(pid_, &wait_status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    reaped_ = true;
    result.status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
    result.seconds = std::chrono::duration<double>(Clock::now() - start_).count();
    return result;
  }

 private:
  static void readSome(const pollfd& fd, int* our_fd, std::string* into) {
    if (fd.fd < 0 || fd.revents == 0) return;
    char buffer[65536];
    ssize_t n = read(fd.fd, buffer, sizeof(buffer));
    if (n > 0) {
      into->append(buffer, n);
    } else if (n == 0 || errno != EINTR) {
      close(*our_fd);
      *our_fd = -1;
    }
  }

  Clock::time_point start_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int out_fd_ = -1;
  int err_fd_ = -1;
};

RunResult runDdlrun(const std::vector<std::string>& args, int timeout_ms = kRunTimeoutMs) {
  return Ddlrun(args).finish(timeout_ms);
}

// ddlrun -np N [options...] -- /bin/sh -c SCRIPT sh EXTRA...  ($1... in the script are EXTRA).
std::vector<std::string> shArgs(int np, std::vector<std::string> options, const std::string& script,
                                const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"-np", std::to_string(np)};
  args.insert(args.end(), options.begin(), options.end());
  args.insert(args.end(), {"--", "/bin/sh", "-c", script, "sh"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> result;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) result.push_back(line);
  return result;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Gone, or a zombie nobody has reaped yet (PID 1 in a container may be slow to, or never).
bool processGone(pid_t pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t paren = content.rfind(')');
  if (paren == std::string::npos || paren + 2 >= content.size()) return true;  // vanished while we read
  char state = content[paren + 2];
  return state == 'Z' || state == 'X';
}

// Waits (up to timeout_ms) for every pid to be gone; returns those still alive.
std::vector<pid_t> survivors(const std::vector<pid_t>& pids, int timeout_ms = 3000) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::vector<pid_t> alive;
  do {
    alive.clear();
    for (pid_t pid : pids) {
      if (!processGone(pid)) alive.push_back(pid);
    }
    if (alive.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (Clock::now() < deadline);
  return alive;
}

std::vector<pid_t> readPids(const std::string& path) {
  std::vector<pid_t> pids;
  std::ifstream file(path);
  for (long pid; file >> pid;) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

// Waits (up to timeout_ms) until path holds at least `count` pids.
bool waitForPids(const std::string& path, size_t count, int timeout_ms = 10000) {
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    if (readPids(path).size() >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// Shell snippet: wait (at most 10 s) until file $1/pids has at least N lines.
std::string waitForPidsSh(int count) {
  return "i=0; while [ \"$(cat \"$1/pids\" 2>/dev/null | wc -l)\" -lt " + std::to_string(count) +
         " ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; ";
}

class DdlrunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/ddlrun_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string pidFile() const { return dir_ + "/pids"; }

  std::string dir_;
};

TEST_F(DdlrunTest, EachRankGetsItsEnvironmentAndTaggedStdout) {
  RunResult result = runDdlrun(
      shArgs(3, {},
             "echo \"$DDL_RANK $DDL_WORLD_SIZE $RANK $MASTER_PORT $DDL_ROOT $MASTER_ADDR $DDL_LOCAL_RANK "
             "$DDL_LOCAL_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $WORLD_SIZE\""));
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 0) << result.err;
  std::vector<std::string> out = lines(result.out);
  ASSERT_EQ(out.size(), 3u) << result.out;
  std::map<int, std::string> by_rank;
  std::string master_port, root_port;
  for (const std::string& line : out) {
    int prefix_rank = -1;
    int rank = -1;
    int world = -1;
    int torch_rank = -1;
    char port_text[16] = {0};
    char root_text[64] = {0};
    ASSERT_EQ(std::sscanf(line.c_str(), "[%d] %d %d %d %15s 127.0.0.1:%63s", &prefix_rank, &rank, &world,
                          &torch_rank, port_text, root_text),
              6)
        << line;
    EXPECT_EQ(prefix_rank, rank) << line;
    EXPECT_EQ(torch_rank, rank) << line;
    EXPECT_EQ(world, 3) << line;
    EXPECT_GT(std::atoi(port_text), 0) << line;
    if (master_port.empty()) master_port = port_text;
    if (root_port.empty()) root_port = root_text;
    EXPECT_EQ(master_port, port_text) << "every rank must get the same MASTER_PORT";
    EXPECT_EQ(root_port, root_text) << "every rank must get the same DDL_ROOT";
    // torch's store and libddl's rendezvous must be able to run side by side.
    EXPECT_NE(master_port, root_port) << line;
    std::string r = std::to_string(rank);
    EXPECT_EQ(line, "[" + r + "] " + r + " 3 " + r + " " + master_port + " 127.0.0.1:" + root_port + " 127.0.0.1 " +
                        r + " 3 " + r + " 3 3");
    by_rank[rank] = line;
  }
  EXPECT_EQ(by_rank.size(), 3u) << "one line from each of ranks 0, 1, 2";
  EXPECT_EQ(result.err, "");
}

// Every rank of a run gets the same DDL_JOB_SECRET (64 hex digits), made afresh for each run: one that ddlrun
// inherits is replaced, so two runs (or a ddlrun inside a job) never share their rendezvous store's key.
TEST_F(DdlrunTest, EachRunGivesItsRanksOneFreshSecret) {
  setenv("DDL_JOB_SECRET", "inherited", 1);
  std::set<std::string> secrets;
  for (int run = 0; run < 2; ++run) {
    RunResult result = runDdlrun(shArgs(3, {}, "echo \"$DDL_JOB_SECRET\""));
    ASSERT_EQ(result.status, 0) << result.err;
    std::vector<std::string> out = lines(result.out);
    ASSERT_EQ(out.size(), 3u) << result.out;
    std::string first;
    for (const std::string& line : out) {
      const std::string secret = line.substr(line.find(' ') + 1);
      EXPECT_EQ(secret.size(), 64u) << line;
      EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos) << line;
      if (first.empty()) first = secret;
      EXPECT_EQ(secret, first) << "every rank of a run must hold the same secret";
    }
    secrets.insert(first);
  }
  unsetenv("DDL_JOB_SECRET");
  EXPECT_EQ(secrets.size(), 2u) << "each run must make its own secret";
}

TEST_F(DdlrunTest, StderrIsTaggedAndStaysOnStderr) {
  RunResult result = runDdlrun(shArgs(2, {}, "echo out$DDL_RANK; echo err$DDL_RANK >&2"));
  EXPECT_EQ(result.status, 0);
  std::vector<std::string> out = lines(result.out);
  std::vector<std::string> err = lines(result.err);
  std::sort(out.begin(), out.end());
  std::sort(err.begin(), err.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[0] out0", "[1] out1"}));
  EXPECT_EQ(err, (std::vector<std::string>{"[0] err0", "[1] err1"}));
}

TEST_F(DdlrunTest, LinesOfDifferentRanksNeverMix) {
  // 4 ranks write 200 lines of 3000 bytes each as fast as they can: far more than a pipe holds at once.
  RunResult result = runDdlrun(shArgs(4, {},
                                      "s=$(printf '%03000d' 0); i=0; while [ $i -lt 200 ]; do "
                                      "echo \"$DDL_RANK:$i:$s:end\"; i=$((i+1)); done"));
  ASSERT_EQ(result.status, 0) << result.err;
  std::string zeros(3000, '0');
  std::map<int, int> next_index;
  for (const std::string& line : lines(result.out)) {
    int rank = -1;
    int index = -1;
    ASSERT_EQ(std::sscanf(line.c_str(), "[%d] ", &rank), 1) << line.substr(0, 80);
    ASSERT_GE(rank, 0);
    ASSERT_LT(rank, 4);
    std::string r = std::to_string(rank);
    index = next_index[rank]++;
    ASSERT_EQ(line, "[" + r + "] " + r + ":" + std::to_string(index) + ":" + zeros + ":end")
        << "line of rank " << rank << " is torn or out of order";
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(next_index[r], 200) << "rank " << r;
}

TEST_F(DdlrunTest, PartialLastLineIsFlushedAtExit) {
  RunResult result = runDdlrun(shArgs(1, {}, "printf 'first\\nno newline'; printf 'e1\\ne2' >&2"));
  EXPECT_EQ(result.status, 0);
  EXPECT_EQ(result.out, "[0] first\n[0] no newline\n");
  EXPECT_EQ(result.err, "[0] e1\n[0] e2\n");
}

TEST_F(DdlrunTest, OverlongLineIsCutIntoTaggedPieces) {
  RunResult result = runDdlrun(shArgs(1, {}, "head -c 100000 /dev/zero | tr '\\0' a; echo"));
  EXPECT_EQ(result.status, 0);
  EXPECT_EQ(result.out,
            "[0] " + std::string(65536, 'a') + "\n[0] " + std::string(100000 - 65536, 'a') + "\n");

  result = runDdlrun(shArgs(1, {}, "head -c 65536 /dev/zero | tr '\\0' b; echo"));
  EXPECT_EQ(result.out, "[0] " + std::string(65536, 'b') + "\n") << "a line of exactly 64 KiB stays whole";

  result = runDdlrun(shArgs(1, {"--no-tag-output"}, "head -c 100000 /dev/zero | tr '\\0' c; echo"));
  EXPECT_EQ(result.out, std::string(100000, 'c') + "\n") << "untagged bytes pass unchanged";
}

TEST_F(DdlrunTest, NoTagOutputPassesBytesUnchanged) {
  RunResult result = runDdlrun(shArgs(1, {"--no-tag-output"}, "printf 'a\\nb'; printf 'c\\n' >&2"));
  EXPECT_EQ(result.status, 0);
  EXPECT_EQ(result.out, "a\nb");
  EXPECT_EQ(result.err, "c\n");

  result = runDdlrun(shArgs(2, {"--no-tag-output", "--tag-output"}, "echo x"));
  EXPECT_TRUE(contains(result.out, "[0] x\n") && contains(result.out, "[1] x\n")) << result.out;
}

TEST_F(DdlrunTest, FirstFailingRankDecidesTheStatusAndTheOthersAreStopped) {
  // Ranks 0 and 2 start a background sleeper and wait on it; rank 1 fails once all four pids are written.
  std::string script = "if [ \"$DDL_RANK\" = 1 ]; then " + waitForPidsSh(4) +
                       "echo failing >&2; exit 7; fi; "
                       "sleep 30 & echo $! >> \"$1/pids\"; echo $$ >> \"$1/pids\"; wait";
  RunResult result = runDdlrun(shArgs(3, {}, script, {dir_}));
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 7) << result.err;
  EXPECT_LT(result.seconds, 20.0);
  EXPECT_TRUE(contains(result.err, "[1] failing\nddlrun: rank 1 (pid ")) << result.err;
  EXPECT_TRUE(contains(result.err, ") exited with status 7; stopping the other ranks\n")) << result.err;
  std::vector<pid_t> pids = readPids(pidFile());
  EXPECT_EQ(pids.size(), 4u);
  EXPECT_EQ(survivors(pids), std::vector<pid_t>{}) << "ranks or their children outlived ddlrun";
}

TEST_F(DdlrunTest, RankKilledBySignalGives128PlusSignal) {
  std::string script = "if [ \"$DDL_RANK\" = 0 ]; then " + waitForPidsSh(1) +
                       "kill -9 $$; fi; echo $$ >> \"$1/pids\"; exec sleep 30";
  RunResult result = runDdlrun(shArgs(2, {}, script, {dir_}));
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 128 + 9);
  EXPECT_LT(result.seconds, 20.0);
  EXPECT_TRUE(contains(result.err, ") was killed by signal SIGKILL; stopping the other ranks\n"))
      << result.err;
  EXPECT_EQ(survivors(readPids(pidFile())), std::vector<pid_t>{});
}

TEST_F(DdlrunTest, RankIgnoringSigtermIsKilledAfterTheGracePeriod) {
  // Rank 1 and its child ignore SIGTERM; only the SIGKILL 500 ms later can end them.
  std::string script = "if [ \"$DDL_RANK\" = 0 ]; then " + waitForPidsSh(2) +
                       "exit 3; fi; trap '' TERM; sleep 30 & echo $! >> \"$1/pids\"; echo $$ >> \"$1/pids\"; "
                       "wait; wait";
  RunResult result = runDdlrun(shArgs(2, {"--grace-ms", "500"}, script, {dir_}));
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 3) << result.err;
  EXPECT_GE(result.seconds, 0.5) << "SIGKILL must wait for the grace period";
  EXPECT_LT(result.seconds, 20.0);
  EXPECT_TRUE(contains(result.err, "ddlrun: rank 1 did not exit within 500 ms of SIGTERM; sending SIGKILL"))
      << result.err;
  std::vector<pid_t> pids = readPids(pidFile());
  EXPECT_EQ(pids.size(), 2u);
  EXPECT_EQ(survivors(pids), std::vector<pid_t>{});
}

class DdlrunSignalTest : public DdlrunTest, public ::testing::WithParamInterface<int> {};

TEST_P(DdlrunSignalTest, SignalToDdlrunIsForwardedAndGives128PlusSignal) {
  int sig = GetParam();
  Ddlrun ddlrun(shArgs(3, {"--grace-ms", "500"}, "echo $$ >> \"$1/pids\"; exec sleep 30", {dir_}));
  ASSERT_TRUE(waitForPids(pidFile(), 3));
  ASSERT_EQ(kill(ddlrun.pid(), sig), 0);
  RunResult result = ddlrun.finish();
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 128 + sig) << result.err;
  EXPECT_LT(result.seconds, 20.0);
  EXPECT_TRUE(contains(result.err, "ddlrun: received SIG")) << result.err;
  EXPECT_EQ(survivors(readPids(pidFile())), std::vector<pid_t>{});
}

INSTANTIATE_TEST_SUITE_P(IntAndTerm, DdlrunSignalTest, ::testing::Values(SIGINT, SIGTERM));

TEST_F(DdlrunTest, ProcessesLeftHoldingTheOutputAreStoppedAfterSuccess) {
  // The rank exits 0 at once but its background child keeps the stdout pipe open; ddlrun must not wait 30 s.
  RunResult result =
      runDdlrun(shArgs(1, {"--grace-ms", "500"}, "sleep 30 & echo $! >> \"$1/pids\"; echo done", {dir_}));
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 0);
  EXPECT_EQ(result.out, "[0] done\n");
  EXPECT_LT(result.seconds, 20.0);
  EXPECT_EQ(survivors(readPids(pidFile())), std::vector<pid_t>{});
}

TEST_F(DdlrunTest, ProgramNotFoundGives127) {
  RunResult result = runDdlrun({"-np", "2", "--", "ddlrun-test-no-such-program"});
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 127);
  EXPECT_TRUE(contains(result.err,
                       "ddlrun: cannot execute 'ddlrun-test-no-such-program': No such file or "
                       "directory"))
      << result.err;
}

TEST_F(DdlrunTest, ProgramIsFoundThroughPath) {
  RunResult result = runDdlrun({"-np", "1", "--", "sh", "-c", "echo found"});
  EXPECT_EQ(result.status, 0);
  EXPECT_EQ(result.out, "[0] found\n");
}

TEST_F(DdlrunTest, ExportedVariablesAndSettingsReachEveryRank) {
  RunResult result = runDdlrun(shArgs(
      4,
      {"-x", "FOO=bar", "-x", "BAZ=a=b c", "-x", "FOO=last", "-x", "HOME", "--topology", "2x2", "--algo",
       "ring", "--timeout-ms", "1234", "--root=10.1.2.3:29500"},
      "echo \"$FOO|$BAZ|$DDL_TOPOLOGY|$DDL_ALGO|$DDL_TIMEOUT_MS|$DDL_ROOT|$MASTER_ADDR|$MASTER_PORT\""));
  EXPECT_EQ(result.status, 0) << result.err;
  std::vector<std::string> out = lines(result.out);
  ASSERT_EQ(out.size(), 4u) << result.out;
  for (const std::string& line : out) {
    const size_t bar = line.rfind('|');
    EXPECT_EQ(line.substr(4, bar + 1 - 4), "last|a=b c|2x2|ring|1234|10.1.2.3:29500|10.1.2.3|") << line;
    const int master_port = std::atoi(line.substr(bar + 1).c_str());
    EXPECT_GT(master_port, 0) << line;
    EXPECT_NE(master_port, 29500) << line;
  }
}

TEST_F(DdlrunTest, SettingsNotGivenAreNotSet) {
  RunResult result = runDdlrun(shArgs(1, {}, "echo \"${DDL_TOPOLOGY-unset} ${DDL_ALGO-unset}\""));
  EXPECT_EQ(result.out, "[0] unset unset\n");
}

TEST_F(DdlrunTest, ManyRanks) {
  RunResult result = runDdlrun(shArgs(64, {}, "echo $DDL_RANK"));
  ASSERT_EQ(result.status, 0) << result.err;
  std::vector<std::string> out = lines(result.out);
  std::sort(out.begin(), out.end());
  std::vector<std::string> expected;
  for (int r = 0; r < 64; ++r) expected.push_back("[" + std::to_string(r) + "] " + std::to_string(r));
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(out, expected);
}

// ddlrun's side of the one topology grammar (topology_cases.h): -np is the rank count.
TEST_F(DdlrunTest, TheSharedTopologyCases) {
  for (const TopologyCase& c : kTopologyCases) {
    RunResult r = runDdlrun({"-np", std::to_string(c.ranks), "--topology", c.text, "--", "/bin/true"});
    EXPECT_EQ(r.status == 0, c.ok) << "'" << c.text << "' for " << c.ranks << " ranks: " << r.err;
    if (!c.ok) EXPECT_NE(r.err.find("--topology"), std::string::npos) << r.err;
  }
}

TEST_F(DdlrunTest, HelpPrintsUsage) {
  RunResult result = runDdlrun({"--help"});
  EXPECT_EQ(result.status, 0);
  EXPECT_TRUE(contains(result.out, "usage: ddlrun -np N")) << result.out;
  EXPECT_EQ(result.err, "");
}

// Fails without --version (an unknown option, exit 2).
TEST_F(DdlrunTest, VersionPrintsIt) {
  RunResult result = runDdlrun({"--version"});
  EXPECT_EQ(result.status, 0);
  EXPECT_EQ(result.out, std::string("ddlrun ") + ddl::kVersion + "\n");
  EXPECT_EQ(result.err, "");
}

// ---- across machines (-H, --hostfile)
// -----------------------------------------------------------------------
// --rsh is a stand-in for ssh that runs the host's command here and logs the host and its arguments, so the
// whole path (one ddlrun per host, the secret on its stdin, global ranks, stopping) runs on one machine. The
// same over real ssh between network-namespace hosts: tests/comm/ddlrun_hosts_test.sh.
std::string readAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class DdlrunHostsTest : public DdlrunTest {
 protected:
  void SetUp() override {
    DdlrunTest::SetUp();
    rsh_ = dir_ + "/rsh";
    std::ofstream(rsh_) << "#!/bin/sh\n"
                           "host=$1; shift\n"
                           "printf '%s|%s\\n' \"$host\" \"$*\" >> " +
                               dir_ +
                               "/rsh.log\n"
                               "exec sh -c \"$*\"\n";
    std::filesystem::permissions(rsh_, std::filesystem::perms::owner_all);
  }
  // ddlrun's arguments for a shell that plays a host's launcher: it sends the secret, then runs `after` (a
  // keepalive: echo; none: true) and stays silent, while a --host-part ddlrun with `options` runs one rank of
  // `rank_script`. The shell prints the host part's status as status=N.
  std::vector<std::string> hostPartWithLauncher(const std::string& after, const std::string& options,
                                                const std::string& rank_script) {
    const std::string fifo = dir_ + "/launcher";
    const std::string script = "mkfifo " + fifo + "; (echo 0123456789abcdef; " + after +
                               "; exec sleep 30) > " + fifo +
                               " & " DDL_BIN_DIR "/ddlrun --host-part 0,1,29999 " + options +
                               " -np 1 --root 127.0.0.1:29998 -- /bin/sh -c '" + rank_script + "' < " + fifo +
                               "; echo status=$?; kill $!";
    return {"-np", "1", "--", "/bin/sh", "-c", script};
  }
  std::vector<std::string> across(const std::string& hosts, const std::string& script,
                                  std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"-H", hosts, "--rsh", rsh_};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--", "/bin/sh", "-c", script});
    return args;
  }
  std::string rsh_;
};

TEST_F(DdlrunHostsTest, RanksFillEachHostsSlotsWithGlobalRanksAndOneSecret) {
  RunResult result = runDdlrun(across("h1:2,h2:1",
                                      "echo \"$DDL_RANK/$DDL_WORLD_SIZE $DDL_LOCAL_RANK/$DDL_LOCAL_SIZE "
                                      "$DDL_ROOT $MASTER_ADDR:$MASTER_PORT $DDL_JOB_SECRET $PWD\"",
                                      {"--root", "h1:29601"}));
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 0) << result.err;
  std::vector<std::string> out = lines(result.out);
  std::sort(out.begin(), out.end());
  ASSERT_EQ(out.size(), 3u) << result.out;
  const std::string secret = out[0].substr(out[0].find("h1:29602 ") + 9, 64);
  EXPECT_EQ(secret.size(), 64u);
  const std::string cwd = std::filesystem::current_path().string();
  EXPECT_EQ(out[0], "[0] 0/3 0/2 h1:29601 h1:29602 " + secret + " " + cwd);
  EXPECT_EQ(out[1], "[1] 1/3 1/2 h1:29601 h1:29602 " + secret + " " + cwd);
  EXPECT_EQ(out[2], "[2] 2/3 0/1 h1:29601 h1:29602 " + secret + " " + cwd);
  // One connection per host (the two start at once, so their log lines come in either order); the secret is
  // on none of the command lines.
  const std::string log = readAll(dir_ + "/rsh.log");
  std::vector<std::string> connections = lines(log);
  std::sort(connections.begin(), connections.end());
  ASSERT_EQ(connections.size(), 2u) << log;
  EXPECT_EQ(connections[0].rfind("h1|cd ", 0), 0u) << log;
  EXPECT_EQ(connections[1].rfind("h2|cd ", 0), 0u) << log;
  EXPECT_TRUE(contains(log, "--host-part 2,3,29602 -np 1 --root h1:29601")) << log;
  EXPECT_FALSE(contains(log, secret)) << log;
}

// The hosts run ddlrun by the path it was started by, not the file it resolves to: a link (or an emulator's
// wrapper, which scripts/cross-ppc64el's runs depend on) stays as the user ran it.
TEST_F(DdlrunHostsTest, TheHostsRunDdlrunByThePathItWasStartedBy) {
  const std::string link = dir_ + "/ddlrun-link";
  std::filesystem::create_symlink(DDL_BIN_DIR "/ddlrun", link);
  RunResult result = Ddlrun(across("h1:1,h2:1", "echo rank $DDL_RANK"), link).finish(kRunTimeoutMs);
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 0) << result.err;
  const std::string log = readAll(dir_ + "/rsh.log");
  ASSERT_EQ(lines(log).size(), 2u) << log;
  for (const std::string& connection : lines(log)) {
    EXPECT_TRUE(contains(connection, "exec " + link + " --host-part")) << log;
  }
  // --remote-path still wins (started through the link, so the link's path would show if it did not).
  std::filesystem::remove(dir_ + "/rsh.log");
  result =
      Ddlrun(across("h1:1", "true", {"--remote-path", DDL_BIN_DIR "/ddlrun"}), link).finish(kRunTimeoutMs);
  EXPECT_EQ(result.status, 0) << result.err;
  EXPECT_TRUE(contains(readAll(dir_ + "/rsh.log"), "exec " DDL_BIN_DIR "/ddlrun --host-part"))
      << readAll(dir_ + "/rsh.log");
  EXPECT_FALSE(contains(readAll(dir_ + "/rsh.log"), link)) << readAll(dir_ + "/rsh.log");
}

TEST_F(DdlrunHostsTest, AHostfileAndANpBelowTheSlots) {
  std::ofstream(dir_ + "/hosts") << "# the rack\nh1 slots=2 max_slots=4\n\nh2:3  # two more\nh3\n";
  RunResult result = runDdlrun({"--hostfile", dir_ + "/hosts", "-np", "3", "--rsh", rsh_, "--", "/bin/sh",
                                "-c", "echo $DDL_RANK $DDL_LOCAL_SIZE"});
  EXPECT_EQ(result.status, 0) << result.err;
  std::vector<std::string> out = lines(result.out);
  std::sort(out.begin(), out.end());
  EXPECT_EQ(out, (std::vector<std::string>{"[0] 0 2", "[1] 1 2", "[2] 2 1"}));
  EXPECT_EQ(lines(readAll(dir_ + "/rsh.log")).size(), 2u) << "h3 has no rank, so no connection";
}

TEST_F(DdlrunHostsTest, AFailingRankOnOneHostStopsEveryHostAndGivesItsStatus) {
  const auto start = Clock::now();
  RunResult result = runDdlrun(across("h1:2,h2:2",
                                      "echo $$ >> " + dir_ +
                                          "/pids; if [ $DDL_RANK = 3 ]; then sleep 0.5; exit 7; fi; "
                                          "exec sleep 60",
                                      {"--grace-ms", "1000"}));
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 7) << result.err;
  EXPECT_TRUE(contains(result.err, "ddlrun: host h2 (ranks 2-3)")) << result.err;
  EXPECT_TRUE(contains(result.err, "exited with status 7; stopping the other hosts")) << result.err;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15));
  EXPECT_TRUE(survivors(readPids(pidFile())).empty()) << "a rank outlived the run";
}

TEST_F(DdlrunHostsTest, ALauncherKilledOutrightLeavesNoRankOnAnyHost) {
  Ddlrun run(across("h1:1,h2:1", "echo $$ >> " + dir_ + "/pids; exec sleep 60"));
  ASSERT_TRUE(waitForPids(pidFile(), 2));
  ASSERT_EQ(kill(run.pid(), SIGKILL), 0);
  EXPECT_TRUE(survivors(readPids(pidFile()), 10000).empty()) << "each host's ddlrun must stop its ranks";
}

// A network gone without a word leaves ssh open for hours: a host's ddlrun that hears no keepalive from its
// launcher stops its ranks (here the "launcher" is a shell that sends the secret and then nothing).
TEST_F(DdlrunHostsTest, AHostWhoseLauncherFallsSilentStopsItsRanks) {
  const auto start = Clock::now();
  RunResult result = runDdlrun(hostPartWithLauncher("echo", "--host-silence-ms 500 --grace-ms 200",
                                                    "echo $$ >> " + dir_ + "/pids; exec sleep 60"));
  ASSERT_FALSE(result.timed_out);
  EXPECT_TRUE(contains(result.out, "status=129")) << result.out << result.err;
  EXPECT_TRUE(
      contains(result.err, "the launcher has not been heard from for 500 ms; stopping this host's ranks"))
      << result.err;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(20));
  EXPECT_TRUE(survivors(readPids(pidFile())).empty());
}

// Silence counts only once a keepalive came: a launcher from before keepalives sends none, and its hosts'
// ranks must run to their end.
TEST_F(DdlrunHostsTest, ALauncherThatSendsNoKeepalivesIsNotTakenForGone) {
  RunResult result = runDdlrun(hostPartWithLauncher("true", "--host-silence-ms 200", "sleep 1; echo done"));
  ASSERT_FALSE(result.timed_out);
  EXPECT_TRUE(contains(result.out, "[0] done")) << result.out << result.err;
  EXPECT_TRUE(contains(result.out, "status=0")) << result.out << result.err;
}

struct BadArgs {
  std::vector<std::string> args;
  std::string message;
};

class DdlrunBadArgsTest : public ::testing::TestWithParam<BadArgs> {};

TEST_P(DdlrunBadArgsTest, ExitsWithUsageAndStatus2) {
  RunResult result = runDdlrun(GetParam().args);
  ASSERT_FALSE(result.timed_out);
  EXPECT_EQ(result.status, 2);
  EXPECT_TRUE(contains(result.err, GetParam().message)) << result.err;
  EXPECT_TRUE(contains(result.err, "usage: ddlrun")) << result.err;
  EXPECT_EQ(result.out, "") << "no rank may start";
}

INSTANTIATE_TEST_SUITE_P(
    Cases, DdlrunBadArgsTest,
    ::testing::Values(
        BadArgs{{}, "ddlrun: missing -np N"}, BadArgs{{"--", "true"}, "ddlrun: missing -np N"},
        BadArgs{{"-np", "0", "--", "true"}, "ddlrun: -np must be an integer from 1 to 1024, got '0'"},
        BadArgs{{"-np", "-2", "--", "true"}, "got '-2'"}, BadArgs{{"-np", "abc", "--", "true"}, "got 'abc'"},
        BadArgs{{"-np", "1025", "--", "true"}, "got '1025'"},
        BadArgs{{"-np", "3x", "--", "true"}, "got '3x'"},
        BadArgs{{"-np"}, "ddlrun: option '-np' needs a value"},
        BadArgs{{"-np", "2", "true"}, "ddlrun: unexpected argument 'true'; put '--' before the program"},
        BadArgs{{"-np", "2"}, "ddlrun: missing '--'"},
        BadArgs{{"-np", "2", "--"}, "ddlrun: missing the program to run after '--'"},
        BadArgs{{"-np", "2", "--fo", "--", "true"}, "ddlrun: unknown option '--fo'; see ddlrun --help"},
        BadArgs{{"-np", "2", "--tag-output=1", "--", "true"}, "takes no value"},
        BadArgs{{"-np", "4", "--topology", "2x3", "--", "true"},
                "ddlrun: --topology 2x3 has 6 ranks but -np is 4"},
        BadArgs{{"-np", "4", "--topology", "2048x2048x2048", "--", "true"},
                "multiply to more than 2^31 ranks"},
        BadArgs{{"-np", "4", "--topology", "2x", "--", "true"}, "is not of the form AxBxC"},
        BadArgs{{"-np", "4", "--topology", "x4", "--", "true"}, "is not of the form AxBxC"},
        BadArgs{{"-np", "4", "--topology", "2xx2", "--", "true"}, "is not of the form AxBxC"},
        BadArgs{{"-np", "4", "--topology", "0x4", "--", "true"}, "is not of the form AxBxC"},
        BadArgs{{"-np", "4", "--topology", "2x-2", "--", "true"}, "is not of the form AxBxC"},
        BadArgs{{"-np", "4", "--topology=", "--", "true"}, "is not of the form AxBxC"},
        BadArgs{{"-np", "2", "--timeout-ms", "soon", "--", "true"},
                "--timeout-ms must be a positive integer"},
        BadArgs{{"-np", "2", "--grace-ms", "-1", "--", "true"}, "--grace-ms must be an integer"},
        BadArgs{{"-np", "2", "--algo", "bogus", "--", "true"},
                "ddlrun: --algo needs one of auto, ring, mdring, rhd, shm (got 'bogus')"},
        BadArgs{{"-np", "2", "--root", "localhost", "--", "true"}, "--root must be HOST:PORT"},
        BadArgs{{"-np", "2", "--root", "host:99999", "--", "true"}, "--root must be HOST:PORT"},
        BadArgs{{"-np", "2", "-x", "=v", "--", "true"}, "-x needs VAR=VALUE"},
        BadArgs{{"-H", "a:2,b:1", "-np", "4", "--", "true"},
                "ddlrun: -np 4 but the hosts have 3 slots; give more with HOST:SLOTS"},
        BadArgs{{"-H", "a:0", "--", "true"}, "must be HOST or HOST:SLOTS with SLOTS from 1 to 1024"},
        BadArgs{{"-H", "a,,b", "--", "true"}, "has an empty host"},
        BadArgs{{"-H", "-a", "--", "true"}, "'-a' is not a host name or address"},
        BadArgs{{"--hostfile", "/nonexistent/hosts", "--", "true"},
                "cannot read the hostfile /nonexistent/hosts"},
        BadArgs{{"--rsh", " ", "-H", "a", "--", "true"}, "--rsh needs a command"},
        BadArgs{{"-H", "fe80::10", "--", "true"}, "write an IPv6 address in brackets"},
        BadArgs{{"-np", "1", "--host-silence-ms", "500", "--", "true"},
                "--host-silence-ms goes with --host-part"}));

}  // namespace
