// libddl over UCX with real processes: every collective over TCP and over shared memory, a rank killed with
// SIGKILL mid-allreduce, mismatched calls across processes, the C API's argument errors, a job whose rendezvous
// store turns away strangers and impostors (DDL_JOB_SECRET), and ddlrun driving ddl-bench end to end. Ranks
// are comm_worker processes started by this test (fork + exec) with the DDL_* environment, each writing its
// output to a file that the test reads.
#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddl/ddl.h"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const std::string kBin = DDL_BIN_DIR;

int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A set of rank processes of one communicator. env is set over the DDL_* variables (so it may change them);
// after_rank0, when given, runs once rank 0 is started and before the others are, with DDL_ROOT's port;
// per_rank, when given, adds a rank's own variables.
using PerRankEnv = std::function<std::map<std::string, std::string>(int rank)>;
class Ranks {
 public:
  Ranks(int n, const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
        const std::function<void(int root_port)>& after_rank0 = nullptr, const PerRankEnv& per_rank = nullptr)
      : n_(n) {
    char dir[] = "/tmp/ddl-ucx-test-XXXXXX";
    dir_ = mkdtemp(dir);
    const int root_port = freePort();
    root_ = "127.0.0.1:" + std::to_string(root_port);
    for (int r = 0; r < n; ++r) {
      if (r == 1 && after_rank0) after_rank0(root_port);
      std::map<std::string, std::string> all{{"DDL_RANK", std::to_string(r)},
                                             {"DDL_WORLD_SIZE", std::to_string(n)}};
      for (auto& [k, v] : env) all[k] = v;
      if (per_rank) {
        for (auto& [k, v] : per_rank(r)) all[k] = v;
      }
      start(args, all);
    }
  }
  // One more process, joining the job (DDL_JOIN=1): its output is output(n), n counting every process so far.
  void join(const std::vector<std::string>& args, std::map<std::string, std::string> env) {
    env["DDL_JOIN"] = "1";
    start(args, env);
    ++n_;
  }
  ~Ranks() {
    for (size_t r = 0; r < pids_.size(); ++r) {
      if (status_[r] == -1) {
        kill(pids_[r], SIGKILL);
        waitpid(pids_[r], nullptr, 0);
      }
    }
    std::system(("rm -rf " + dir_).c_str());
  }
  std::string output(int r) const { return readFile(dir_ + "/rank" + std::to_string(r) + ".out"); }
  // Waits until every rank exited or the limit passed; returns false on the limit (then kills them).
  bool waitAll(std::chrono::milliseconds limit) {
    const auto end = Clock::now() + limit;
    while (Clock::now() < end) {
      bool all = true;
      for (size_t r = 0; r < pids_.size(); ++r) {
        if (status_[r] != -1) continue;
        int st = 0;
        if (waitpid(pids_[r], &st, WNOHANG) == pids_[r]) {
          status_[r] = st;
          exited_at_[r] = Clock::now();
        } else {
          all = false;
        }
      }
      if (all) return true;
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }
  int exitCode(int r) const { return WIFEXITED(status_[r]) ? WEXITSTATUS(status_[r]) : 128 + WTERMSIG(status_[r]); }
  Clock::time_point exitedAt(int r) const { return exited_at_[r]; }
  pid_t pid(int r) const { return pids_[r]; }
  void markKilled(int r) {
    waitpid(pids_[r], &status_[r], 0);
    exited_at_[r] = Clock::now();
  }
  // Waits up to 60 s until the output of each of rs (every process when empty) holds what; false at the
  // limit.
  bool waitForOutput(const std::string& what, std::vector<int> rs = {}) const {
    if (rs.empty()) {
      for (int r = 0; r < n_; ++r) rs.push_back(r);
    }
    const auto until = Clock::now() + 60s;
    for (; Clock::now() < until; std::this_thread::sleep_for(10ms)) {
      bool all = true;
      for (int r : rs) all = all && output(r).find(what) != std::string::npos;
      if (all) return true;
    }
    return false;
  }
  // Starts comm_worker args with env over DDL_ROOT, its output going to output(<processes so far>).
  void start(const std::vector<std::string>& args, const std::map<std::string, std::string>& env) {
    const std::string out = dir_ + "/rank" + std::to_string(pids_.size()) + ".out";
    pid_t pid = fork();
    if (pid == 0) {
      FILE* f = std::fopen(out.c_str(), "w");
      dup2(fileno(f), 1);
      dup2(fileno(f), 2);
      setenv("DDL_ROOT", root_.c_str(), 1);
      for (auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
      std::vector<char*> argv;
      std::string prog = kBin + "/comm_worker";
      argv.push_back(prog.data());
      std::vector<std::string> copy = args;
      for (auto& a : copy) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(prog.c_str(), argv.data());
      _exit(127);
    }
    pids_.push_back(pid);
    status_.push_back(-1);
    exited_at_.push_back(Clock::time_point{});
  }
  std::string describe() const {
    std::string s;
    for (int r = 0; r < n_; ++r) s += "--- rank " + std::to_string(r) + ":\n" + output(r);
    return s;
  }

 private:
  int n_;
  std::string dir_;
  std::string root_;
  std::vector<pid_t> pids_;
  std::vector<int> status_;
  std::vector<Clock::time_point> exited_at_;
};

struct TransportCase {
  std::string name;
  std::string tls;
  std::string shm;  // DDL_SHM: libddl's own shared-memory segment among the ranks of a node
};
void PrintTo(const TransportCase& c, std::ostream* os) {
  *os << c.name << " (UCX_TLS=" << c.tls << " DDL_SHM=" << c.shm << ")";
}

class UcxCollectives : public testing::TestWithParam<std::tuple<TransportCase, int, std::string>> {};

TEST_P(UcxCollectives, EveryCollectiveIsCorrect) {
  const auto& [tc, n, algo] = GetParam();
  std::map<std::string, std::string> env{
      {"UCX_TLS", tc.tls}, {"DDL_SHM", tc.shm}, {"DDL_TIMEOUT_MS", "60000"}, {"DDL_ALGO", algo}};
  if (algo == "mdring") env["DDL_TOPOLOGY"] = n == 4 ? "2x2" : std::to_string(n);
  Ranks ranks(n, {"all"}, env);
  ASSERT_TRUE(ranks.waitAll(240s)) << "ranks did not finish:\n" << ranks.describe();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks.exitCode(r), 0) << ranks.describe();
    EXPECT_NE(ranks.output(r).find("OK all rank " + std::to_string(r)), std::string::npos) << ranks.describe();
    // Processes of one machine share a node: libddl's segment serves them unless DDL_SHM is off.
    const std::string path = tc.shm == "on" && algo == "auto" ? "shm" : "ucx";
    EXPECT_NE(ranks.output(r).find(" path " + path + "\n"), std::string::npos) << ranks.describe();
  }
}

std::string ucxCaseName(const testing::TestParamInfo<std::tuple<TransportCase, int, std::string>>& info) {
  return std::get<0>(info.param).name + "_" + std::to_string(std::get<1>(info.param)) + "ranks_" +
         std::get<2>(info.param);
}

// DDL_NODE_TAG splits this machine into two nodes of two ranks: each node's ranks share libddl's segment
// (mdring's dim 0), the nodes talk over UCX, and every collective is right.
TEST(UcxNodes, ANodeTagSplitsTheMachineIntoNodes) {
  Ranks ranks(4, {"all"}, {{"UCX_TLS", "sm,self"}, {"DDL_TIMEOUT_MS", "60000"}}, nullptr, [](int r) {
    return std::map<std::string, std::string>{{"DDL_NODE_TAG", std::to_string(r / 2)}};
  });
  ASSERT_TRUE(ranks.waitAll(240s)) << "ranks did not finish:\n" << ranks.describe();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks.exitCode(r), 0) << ranks.describe();
    EXPECT_NE(ranks.output(r).find("OK all rank " + std::to_string(r) + " of 4 path shm+ucx\n"),
              std::string::npos)
        << ranks.describe();
  }
}

// UCX over TCP and over its shared-memory transports (libddl's segment off, so UCX carries every byte), and
// libddl's own segment (collectives that have a shared-memory form use it; the rest go through UCX's).
const TransportCase kTcp{"tcp", "tcp", "off"};
const TransportCase kUcxShm{"ucxsm", "sm,self", "off"};
const TransportCase kShm{"shm", "sm,self", "on"};

INSTANTIATE_TEST_SUITE_P(Transports, UcxCollectives,
                         testing::Combine(testing::Values(kTcp, kUcxShm, kShm), testing::Values(2, 3, 4),
                                          testing::Values(std::string("auto"))),
                         ucxCaseName);
INSTANTIATE_TEST_SUITE_P(Algorithms, UcxCollectives,
                         testing::Combine(testing::Values(kTcp, kShm), testing::Values(4),
                                          testing::Values(std::string("ring"), std::string("rhd"),
                                                          std::string("mdring"))),
                         ucxCaseName);

// ddlWaitShare (torch_ddl's mode): waits block on UCX's wakeup fd; every collective and p2p call still
// completes, over shared memory and TCP.
TEST(UcxWaitModes, ShareModeRunsEveryCollective) {
  for (const char* tls : {"sm,self", "tcp"}) {
    Ranks ranks(3, {"all"}, {{"UCX_TLS", tls}, {"DDL_TIMEOUT_MS", "60000"}, {"DDL_WAIT", "share"}});
    ASSERT_TRUE(ranks.waitAll(240s)) << "ranks did not finish:\n" << ranks.describe();
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(ranks.exitCode(r), 0) << tls << "\n" << ranks.describe();
      EXPECT_NE(ranks.output(r).find("OK all rank " + std::to_string(r)), std::string::npos) << ranks.describe();
    }
  }
}

class UcxFailures : public testing::TestWithParam<TransportCase> {};

// SIGKILL one rank mid-loop: every other rank must return an error within twice the timeout.
void killOneRankMidLoop(const std::string& mode, const TransportCase& tc) {
  constexpr int n = 4, victim = 2;
  constexpr int timeout_ms = 10000;
  Ranks ranks(n, {mode, "100000"},
              {{"UCX_TLS", tc.tls}, {"DDL_SHM", tc.shm}, {"DDL_TIMEOUT_MS", std::to_string(timeout_ms)}});
  // Wait until every rank is looping, then kill one.
  ASSERT_TRUE(ranks.waitForOutput("iter 20\n")) << ranks.describe();
  const auto killed_at = Clock::now();
  kill(ranks.pid(victim), SIGKILL);
  ranks.markKilled(victim);
  ASSERT_TRUE(ranks.waitAll(std::chrono::milliseconds(2 * timeout_ms + 5000))) << ranks.describe();
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const double s = std::chrono::duration<double>(ranks.exitedAt(r) - killed_at).count();
    std::printf("rank %d noticed the dead rank after %.3f s\n", r, s);
    EXPECT_LT(s, 2.0 * timeout_ms / 1000) << ranks.describe();
    EXPECT_EQ(ranks.exitCode(r), 3) << ranks.describe();
    const std::string out = ranks.output(r);
    EXPECT_NE(out.find("ERROR"), std::string::npos) << out;
    EXPECT_NE(out.find("rank"), std::string::npos) << out;
  }
}

TEST_P(UcxFailures, KilledRankFailsTheOthersWithinTwiceTheTimeout) { killOneRankMidLoop("loop", GetParam()); }

// The same for ranks that exchange point-to-point messages: the neighbours of the dead rank find out from the
// transport, the others from them.
TEST_P(UcxFailures, KilledRankFailsPointToPointWithinTwiceTheTimeout) {
  killOneRankMidLoop("p2ploop", GetParam());
}

TEST_P(UcxFailures, MismatchedCountsFailFastOnEveryRank) {
  constexpr int n = 3;
  Ranks ranks(n, {"mismatch"},
              {{"UCX_TLS", GetParam().tls}, {"DDL_SHM", GetParam().shm}, {"DDL_TIMEOUT_MS", "60000"}});
  const auto t0 = Clock::now();
  ASSERT_TRUE(ranks.waitAll(60s)) << ranks.describe();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 30.0);
  bool saw_mismatch = false;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks.exitCode(r), 3) << ranks.describe();
    const std::string out = ranks.output(r);
    saw_mismatch = saw_mismatch || out.find("mismatch") != std::string::npos;
    EXPECT_EQ(out.find("ERROR 4 "), std::string::npos) << "a rank timed out instead: " << out;
  }
  EXPECT_TRUE(saw_mismatch) << ranks.describe();
}

// Elastic: SIGKILL one rank of four mid-loop; the three others shrink (ddlCommShrink), agree that the killed
// rank is gone, and finish the loop with allreduces that sum over three.
TEST_P(UcxFailures, SurvivorsOfAKilledRankShrinkAndGoOn) {
  constexpr int n = 4, victim = 2, iters = 400;
  Ranks ranks(n, {"elastic", std::to_string(iters)},
              {{"UCX_TLS", GetParam().tls}, {"DDL_SHM", GetParam().shm}, {"DDL_TIMEOUT_MS", "10000"}});
  ASSERT_TRUE(ranks.waitForOutput("iter 50 ")) << ranks.describe();
  kill(ranks.pid(victim), SIGKILL);
  ranks.markKilled(victim);
  ASSERT_TRUE(ranks.waitAll(60s)) << ranks.describe();
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const std::string out = ranks.output(r);
    EXPECT_EQ(ranks.exitCode(r), 0) << ranks.describe();
    EXPECT_NE(out.find("shrunk from 4 to 3 in "), std::string::npos) << out;
    EXPECT_NE(out.find("excluded 2\n"), std::string::npos) << out;
    EXPECT_NE(out.find("iter " + std::to_string(iters - 1) + " size 3\n"), std::string::npos) << out;
    const size_t at = out.find("shrunk from");
    if (at != std::string::npos)
      std::printf("rank %d: %s", r, out.substr(at, out.find('\n', at) - at + 1).c_str());
  }
}

// And back: after the shrink a new process joins (DDL_JOIN=1); at their next 10th iteration the survivors
// grow (ddlCommGrow) and all four finish the loop on four, the joiner from the survivors' iteration on.
TEST_P(UcxFailures, AJoinerGrowsTheSurvivorsBackToFour) {
  constexpr int n = 4, victim = 1, iters = 300;
  const std::map<std::string, std::string> env{
      {"UCX_TLS", GetParam().tls}, {"DDL_SHM", GetParam().shm}, {"DDL_TIMEOUT_MS", "10000"}};
  Ranks ranks(n, {"elastic", std::to_string(iters)}, env);
  ASSERT_TRUE(ranks.waitForOutput("iter 30 ")) << ranks.describe();
  kill(ranks.pid(victim), SIGKILL);
  ranks.markKilled(victim);
  ASSERT_TRUE(ranks.waitForOutput("shrunk from 4 to 3", {0, 2, 3})) << ranks.describe();
  ranks.join({"elastic", std::to_string(iters)}, env);
  ASSERT_TRUE(ranks.waitAll(60s)) << ranks.describe();
  for (int r : {0, 2, 3, 4}) {
    const std::string out = ranks.output(r);
    EXPECT_EQ(ranks.exitCode(r), 0) << ranks.describe();
    EXPECT_NE(out.find("iter " + std::to_string(iters - 1) + " size 4\n"), std::string::npos) << out;
  }
  EXPECT_NE(ranks.output(4).find("joined as rank 3 at iter "), std::string::npos) << ranks.output(4);
  EXPECT_NE(ranks.output(0).find("grew to 4 at iter "), std::string::npos) << ranks.output(0);
}

// A joiner that is not admitted within its timeout gives its place up, and the grow after it admits nobody
// instead of waiting for it.
TEST(UcxElastic, AJoinerThatGaveUpIsNotWaitedFor) {
  char dir[] = "/tmp/ddl-grow-once-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string go = std::string(dir) + "/go";
  Ranks ranks(2, {"grow-once", go}, {{"UCX_TLS", "tcp"}, {"DDL_TIMEOUT_MS", "10000"}});
  ASSERT_TRUE(ranks.waitForOutput("ready")) << ranks.describe();  // rank 0's store is up
  ranks.join({"grow-once", go}, {{"UCX_TLS", "tcp"}, {"DDL_TIMEOUT_MS", "300"}});
  ASSERT_TRUE(ranks.waitForOutput("ERROR", {2})) << ranks.describe();  // the joiner gave up
  std::ofstream(go).put('\n');                                         // and only then do the ranks grow
  ASSERT_TRUE(ranks.waitAll(30s)) << ranks.describe();
  std::system(("rm -rf " + std::string(dir)).c_str());
  EXPECT_EQ(ranks.exitCode(2), 3) << ranks.describe();
  EXPECT_NE(ranks.output(2).find("ERROR 4 "), std::string::npos) << ranks.output(2);
  EXPECT_NE(ranks.output(2).find("ddlCommGrow"), std::string::npos) << ranks.output(2);
  for (int r : {0, 1}) {
    EXPECT_EQ(ranks.exitCode(r), 0) << ranks.describe();
    EXPECT_NE(ranks.output(r).find("grow none"), std::string::npos) << ranks.output(r);
  }
}

// Rank 0 serves the rendezvous store (ddlCommInitRank): with it gone the survivors cannot agree, and say so.
TEST_P(UcxFailures, ShrinkWithoutRankZerosStoreFailsSayingWhy) {
  constexpr int n = 3;
  Ranks ranks(n, {"elastic", "100000"},
              {{"UCX_TLS", GetParam().tls}, {"DDL_SHM", GetParam().shm}, {"DDL_TIMEOUT_MS", "5000"}});
  ASSERT_TRUE(ranks.waitForOutput("iter 20 ")) << ranks.describe();
  kill(ranks.pid(0), SIGKILL);
  ranks.markKilled(0);
  ASSERT_TRUE(ranks.waitAll(60s)) << ranks.describe();
  for (int r = 1; r < n; ++r) {
    const std::string out = ranks.output(r);
    EXPECT_EQ(ranks.exitCode(r), 3) << ranks.describe();
    EXPECT_NE(out.find("ddlCommShrink"), std::string::npos) << out;
    EXPECT_NE(out.find("store"), std::string::npos) << out;
    const size_t at = out.find("ERROR");
    if (at != std::string::npos) std::printf("rank %d: %s", r, out.substr(at).c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, UcxFailures, testing::Values(kTcp, kUcxShm, kShm),
                         [](const auto& info) { return info.param.name; });

// libddl's UCX settings reach UCX without touching the environment: with no UCX_* variable set, endpoints with
// peer error handling run over shared memory (MM_ERROR_HANDLING; tcp otherwise) with inline messages up to
// 989 B (MM_FIFO_ELEM_SIZE=1024; 93 B otherwise), and libddl.so called no setenv, unsetenv, putenv or clearenv.
TEST(UcxSettings, SharedMemoryServesErrorHandlingEndpointsWithoutSetenv) {
  Ranks ranks(2, {"env"}, {{"DDL_DEBUG", "1"}, {"DDL_TIMEOUT_MS", "60000"}});
  ASSERT_TRUE(ranks.waitAll(120s)) << ranks.describe();
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ranks.exitCode(r), 0) << ranks.describe();
    const std::string out = ranks.output(r);
    EXPECT_NE(out.find("OK env changes=0"), std::string::npos) << out;
    // ucp_ep_print_info: lane 0 on a shared-memory transport, and the eager short limit of 989 bytes.
    const bool shm_lane = out.find("sysv/memory") != std::string::npos || out.find("posix/memory") != std::string::npos;
    EXPECT_TRUE(shm_lane) << "endpoints do not use shared memory:\n" << out;
    EXPECT_NE(out.find("<egr/short>..989.."), std::string::npos) << "FIFO elements are not 1 KiB:\n" << out;
  }
}

// Where the network is TCP (no RDMA device), libddl's messages up to 2 MiB go eager, not through UCX's
// rendezvous (about 20 KiB for tcp otherwise); a user's UCX_RNDV_THRESH still wins. ucp_ep_print_info's
// tag_send line shows where rendezvous starts.
TEST(UcxSettings, OverTcpSegmentsGoEagerUnlessTheUserSaysOtherwise) {
  if (std::getenv("UCX_RNDV_THRESH") != nullptr) {
    GTEST_SKIP() << "UCX_RNDV_THRESH is set in this environment, and the ranks inherit it";
  }
  if (DIR* d = opendir("/sys/class/infiniband")) {
    bool rdma = false;
    while (const dirent* e = readdir(d)) rdma = rdma || e->d_name[0] != '.';
    closedir(d);
    if (rdma) GTEST_SKIP() << "this host has an RDMA device: libddl leaves UCX's rendezvous threshold alone";
  }
  for (const auto& [thresh, want] : std::vector<std::pair<std::string, std::string>>{
           {"", "..2097153..<rndv>"}, {"100000", "..100000..<rndv>"}}) {
    std::map<std::string, std::string> env = {
        {"UCX_TLS", "tcp"}, {"DDL_SHM", "off"}, {"DDL_DEBUG", "1"}, {"DDL_TIMEOUT_MS", "60000"}};
    if (!thresh.empty()) env["UCX_RNDV_THRESH"] = thresh;
    Ranks ranks(2, {"env"}, env);
    ASSERT_TRUE(ranks.waitAll(120s)) << ranks.describe();
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(ranks.exitCode(r), 0) << ranks.describe();
      const std::string out = ranks.output(r);
      const size_t line = out.find("tag_send:");
      ASSERT_NE(line, std::string::npos) << "no endpoint configuration printed:\n" << out;
      EXPECT_NE(out.substr(line, out.find('\n', line) - line).find(want), std::string::npos)
          << "UCX_RNDV_THRESH=" << thresh << ": want " << want << " in\n"
          << out;
    }
  }
}

// ---- The C API's errors, in this process. ----

std::string rootAddr() { return "127.0.0.1:" + std::to_string(freePort()); }

// CUDA device buffers across processes over shared memory: libddl.so's own static CUDA runtime next to the
// program's. Skips (with comm_worker's reason) without a GPU or in a build without CUDA.
TEST(UcxDevice, DeviceBufferAllReduceAcrossProcesses) {
  Ranks ranks(2, {"device"}, {{"UCX_TLS", "sm,self"}, {"DDL_TIMEOUT_MS", "60000"}});
  ASSERT_TRUE(ranks.waitAll(240s)) << "ranks did not finish:\n" << ranks.describe();
  if (ranks.exitCode(0) == 77) GTEST_SKIP() << ranks.output(0);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks.exitCode(r), 0) << ranks.describe();
    EXPECT_NE(ranks.output(r).find("OK device rank " + std::to_string(r)), std::string::npos) << ranks.describe();
  }
}

// The same across two nodes of two ranks on this machine (DDL_NODE_TAG): the node's dim over CUDA IPC, the
// blocks across the nodes folded by the GPU, blocking and stream-ordered (the node kernel around the wire
// where the ranks' GPUs allow it: a GPU each, or MPS; host-paced otherwise).
TEST(UcxDevice, DeviceBufferAllReduceAcrossTwoNodesOfOneMachine) {
  Ranks ranks(4, {"device"}, {{"UCX_TLS", "sm,self"}, {"DDL_TIMEOUT_MS", "60000"}}, nullptr, [](int r) {
    return std::map<std::string, std::string>{{"DDL_NODE_TAG", std::to_string(r / 2)}};
  });
  ASSERT_TRUE(ranks.waitAll(240s)) << "ranks did not finish:\n" << ranks.describe();
  if (ranks.exitCode(0) == 77) GTEST_SKIP() << ranks.output(0);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks.exitCode(r), 0) << ranks.describe();
    EXPECT_NE(ranks.output(r).find("OK device rank " + std::to_string(r) + " of 4 path shm+ucx"),
              std::string::npos)
        << ranks.describe();
  }
}

// ---- ddlCommInitRankWithStore: ranks meet through a store the caller shares (torch's, here a map). ----

// A ddlStore_t over a map shared by the threads of this test; get() waits on a condition variable.
struct MapStore {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;
  int gets = 0;
  bool has_add = true;

  ddlStore_t api() {
    ddlStore_t s{};
    s.ctx = this;
    s.set = [](void* ctx, const char* key, const void* value, size_t len) {
      auto* m = static_cast<MapStore*>(ctx);
      {
        std::lock_guard<std::mutex> lk(m->mu);
        m->kv[key].assign(static_cast<const char*>(value), len);
      }
      m->cv.notify_all();
      return 0;
    };
    s.get = [](void* ctx, const char* key, int timeout_ms, void (*deliver)(void*, const void*, size_t), void* sink) {
      auto* m = static_cast<MapStore*>(ctx);
      std::unique_lock<std::mutex> lk(m->mu);
      ++m->gets;
      if (!m->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return m->kv.count(key) > 0; })) return 1;
      const std::string& v = m->kv[key];
      deliver(sink, v.data(), v.size());
      return 0;
    };
    if (has_add) {
      s.add = [](void* ctx, const char* key, long long delta, long long* result) {
        auto* m = static_cast<MapStore*>(ctx);
        std::lock_guard<std::mutex> lk(m->mu);
        long long v = m->kv.count(key) ? std::stoll(m->kv[key]) : 0;
        v += delta;
        m->kv[key] = std::to_string(v);
        *result = v;
        return 0;
      };
    }
    s.lastError = [](void*) -> const char* { return "the map store's key never came"; };
    return s;
  }
};

TEST(StoreInit, RanksMeetThroughTheCallersStoreWithNoPortOfTheirOwn) {
  constexpr int n = 3;
  MapStore store;
  ddlStore_t api = store.api();
  std::vector<std::string> errors(n);
  std::vector<float> results(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      ddlComm_t comm = nullptr;
      ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
      cfg.timeoutMs = 30000;
      if (ddlCommInitRankWithStore(&comm, n, r, &api, &cfg) != ddlSuccess) {
        errors[r] = ddlGetLastError(nullptr);
        return;
      }
      float v = static_cast<float>(r + 1);
      if (ddlAllReduce(&v, &v, 1, ddlFloat32, ddlSum, comm) != ddlSuccess) errors[r] = ddlGetLastError(comm);
      results[r] = v;
      ddlCommDestroy(comm);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(results[r], 6.0f) << "rank " << r;
  }
  EXPECT_EQ(store.kv.count("boot/2"), 1u);  // the records (UCX addresses) went through the caller's store
}

TEST(StoreInit, AMissingRankTimesOutWithTheStoresOwnReason) {
  MapStore store;
  ddlStore_t api = store.api();
  ddlComm_t comm = nullptr;
  ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
  cfg.timeoutMs = 300;
  EXPECT_EQ(ddlCommInitRankWithStore(&comm, 2, 1, &api, &cfg), ddlTimeout);  // rank 0 never comes
  EXPECT_EQ(comm, nullptr);
  const std::string err = ddlGetLastError(nullptr);
  EXPECT_NE(err.find("ddlCommInitRankWithStore: the rendezvous store's get of key 'shape' failed within 300 ms: "
                     "the map store's key never came"),
            std::string::npos)
      << err;
}

TEST(StoreInit, ASecondClaimOnARankAndBadArgumentsAreRefused) {
  MapStore store;
  store.kv["joined/1"] = "1";  // another process took rank 1
  ddlStore_t api = store.api();
  ddlComm_t comm = nullptr;
  EXPECT_EQ(ddlCommInitRankWithStore(&comm, 2, 1, &api, nullptr), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(nullptr)).find("two processes claim rank 1"), std::string::npos)
      << ddlGetLastError(nullptr);
  EXPECT_EQ(ddlCommInitRankWithStore(&comm, 2, 0, nullptr, nullptr), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(nullptr)).find("store is NULL"), std::string::npos);
  ddlStore_t no_get = api;
  no_get.get = nullptr;
  EXPECT_EQ(ddlCommInitRankWithStore(&comm, 2, 0, &no_get, nullptr), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(nullptr)).find("needs its set and get"), std::string::npos);
  EXPECT_EQ(ddlCommInitRankWithStore(&comm, 2, 2, &api, nullptr), ddlInvalidArgument);  // rank out of range
}

// Shrinking and growing need the store's add; a store without it is refused with a message, not an abort. A
// communicator of one shrinks to itself and grows by nobody; bad arguments are refused.
TEST(StoreInit, ElasticCallsOnOneRankAndAStoreWithoutAdd) {
  MapStore store;
  ddlStore_t api = store.api();
  ddlComm_t comm = nullptr, next = nullptr;
  ASSERT_EQ(ddlCommInitRankWithStore(&comm, 1, 0, &api, nullptr), ddlSuccess) << ddlGetLastError(nullptr);
  ASSERT_EQ(ddlCommShrink(comm, nullptr, 0, &next), ddlSuccess) << ddlGetLastError(comm);
  int size = 0, count = -1;
  EXPECT_EQ(ddlCommCount(next, &size), ddlSuccess);
  EXPECT_EQ(size, 1);
  EXPECT_EQ(ddlCommGetExcluded(next, nullptr, 0, &count), ddlSuccess);
  EXPECT_EQ(count, 0);
  ddlComm_t grown = reinterpret_cast<ddlComm_t>(&store);
  EXPECT_EQ(ddlCommGrow(next, 0, &grown), ddlSuccess) << ddlGetLastError(next);
  EXPECT_EQ(grown, nullptr);  // nobody waits
  const int self = 0, outside = 5;
  EXPECT_EQ(ddlCommShrink(next, &self, 1, &grown), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(next)).find("excludes itself"), std::string::npos)
      << ddlGetLastError(next);
  EXPECT_EQ(ddlCommShrink(next, &outside, 1, &grown), ddlInvalidArgument);
  EXPECT_EQ(ddlCommGrow(next, -1, &grown), ddlInvalidArgument);
  EXPECT_EQ(ddlCommDestroy(next), ddlSuccess);
  EXPECT_EQ(ddlCommDestroy(comm), ddlSuccess);

  MapStore plain;
  ddlStore_t no_add = plain.api();
  no_add.add = nullptr;
  ASSERT_EQ(ddlCommInitRankWithStore(&comm, 1, 0, &no_add, nullptr), ddlSuccess) << ddlGetLastError(nullptr);
  EXPECT_EQ(ddlCommShrink(comm, nullptr, 0, &next), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(comm)).find("no add function"), std::string::npos)
      << ddlGetLastError(comm);
  EXPECT_EQ(ddlCommGrow(comm, 0, &next), ddlInvalidArgument);
  EXPECT_EQ(ddlCommDestroy(comm), ddlSuccess);
}

TEST(CApi, VersionAndErrorStrings) {
  int v = 0;
  EXPECT_EQ(ddlGetVersion(&v), ddlSuccess);
  EXPECT_EQ(v, DDL_VERSION_CODE);
  for (int r = 0; r < ddlNumResults; ++r) EXPECT_STRNE(ddlGetErrorString(static_cast<ddlResult_t>(r)), "");
  EXPECT_STREQ(ddlGetErrorString(ddlTimeout), "timeout");
}

TEST(CApi, SingleRankCommunicatorAndBadArguments) {
  ddlComm_t comm = nullptr;
  ASSERT_EQ(ddlCommInitRank(&comm, 1, 0, rootAddr().c_str(), nullptr), ddlSuccess) << ddlGetLastError(nullptr);
  float buf[4] = {1, 2, 3, 4}, out[4] = {};
  EXPECT_EQ(ddlAllReduce(buf, out, 4, ddlFloat32, ddlSum, comm), ddlSuccess);
  EXPECT_EQ(out[3], 4.0f);
  EXPECT_EQ(ddlAllReduce(nullptr, out, 4, ddlFloat32, ddlSum, comm), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(comm)).find("sendbuff is NULL"), std::string::npos);
  EXPECT_EQ(ddlAllReduce(buf, out, 4, static_cast<ddlDataType_t>(17), ddlSum, comm), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(comm)).find("unknown data type 17"), std::string::npos);
  EXPECT_EQ(ddlAllReduce(buf, out, 4, ddlFloat32, static_cast<ddlRedOp_t>(9), comm), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(comm)).find("unknown reduction op 9"), std::string::npos);
  EXPECT_EQ(ddlAllReduce(buf, out, 4, ddlFloat32, ddlSum, nullptr), ddlInvalidArgument);
  char topo[16];
  EXPECT_EQ(ddlCommGetTopology(comm, topo, sizeof(topo)), ddlSuccess);
  EXPECT_STREQ(topo, "1");
  char scheme[8];  // no stream-ordered call yet: "unset"; too small a buffer is an argument error
  EXPECT_EQ(ddlCommGetStreamScheme(comm, scheme, sizeof(scheme)), ddlSuccess);
  EXPECT_STREQ(scheme, "unset");
  EXPECT_EQ(ddlCommGetStreamScheme(comm, scheme, 5), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(comm)).find("buffer too small for 'unset'"), std::string::npos);
  EXPECT_EQ(ddlCommGetStreamScheme(nullptr, scheme, sizeof(scheme)), ddlInvalidArgument);
  ddlResult_t async = ddlInternalError;
  EXPECT_EQ(ddlCommGetAsyncError(comm, &async), ddlSuccess);
  EXPECT_EQ(async, ddlSuccess);
  int capturing = 7;  // the legacy default stream is not being captured; a NULL answer is an argument error
  EXPECT_EQ(ddlCommStreamCapturing(comm, nullptr, &capturing), ddlSuccess) << ddlGetLastError(comm);
  EXPECT_EQ(capturing, 0);
  EXPECT_EQ(ddlCommStreamCapturing(comm, nullptr, nullptr), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(comm)).find("capturing is NULL"), std::string::npos);
  // Registered buffers: device memory only, a handle to fill, a handle that is a registration.
  void* handle = nullptr;
  EXPECT_EQ(ddlCommRegister(comm, buf, sizeof buf, nullptr), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(comm)).find("handle is NULL"), std::string::npos);
  EXPECT_EQ(ddlCommRegister(comm, buf, sizeof buf, &handle), ddlInvalidArgument);  // host memory
  EXPECT_EQ(handle, nullptr);
  EXPECT_EQ(ddlCommDeregister(comm, nullptr), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(comm)).find("not a registration"), std::string::npos);
  void* mem = &handle;
  EXPECT_EQ(ddlMemAlloc(nullptr, 64), ddlInvalidArgument);
  EXPECT_EQ(ddlMemAlloc(&mem, 0), ddlInvalidArgument);
  if (ddlMemAlloc(&mem, 64) == ddlSuccess) {  // a GPU here
    EXPECT_NE(mem, nullptr);
    EXPECT_EQ(ddlMemFree(mem), ddlSuccess);
  } else {
    EXPECT_EQ(mem, nullptr);
    EXPECT_STRNE(ddlGetLastError(nullptr), "");
  }
  EXPECT_EQ(ddlMemFree(nullptr), ddlSuccess);
  EXPECT_EQ(ddlCommAbort(comm), ddlSuccess);
  EXPECT_EQ(ddlAllReduce(buf, out, 4, ddlFloat32, ddlSum, comm), ddlAborted);
  EXPECT_EQ(ddlCommDestroy(comm), ddlSuccess);
}

TEST(CApi, TopologyProductMismatchIsRejectedAtInit) {
  ddlComm_t comm = nullptr;
  ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
  cfg.topology = "2x3";
  EXPECT_EQ(ddlCommInitRank(&comm, 4, 0, rootAddr().c_str(), &cfg), ddlInvalidArgument);
  EXPECT_EQ(comm, nullptr);
  std::string e = ddlGetLastError(nullptr);
  EXPECT_NE(e.find("topology 2x3 has 6 ranks but the communicator has 4"), std::string::npos) << e;
}

TEST(CApi, UnreachableRootTimesOutNamingTheAddress) {
  ddlComm_t comm = nullptr;
  ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
  cfg.timeoutMs = 700;
  const std::string root = rootAddr();
  const auto t0 = Clock::now();
  ddlResult_t r = ddlCommInitRank(&comm, 2, 1, root.c_str(), &cfg);
  EXPECT_TRUE(r == ddlTimeout || r == ddlSystemError) << ddlGetErrorString(r);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  std::string e = ddlGetLastError(nullptr);
  EXPECT_NE(e.find(root), std::string::npos) << e;
}

TEST(CApi, BadRootAndMissingEnvironment) {
  ddlComm_t comm = nullptr;
  EXPECT_EQ(ddlCommInitRank(&comm, 2, 0, "no-port-here", nullptr), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(nullptr)).find("no-port-here"), std::string::npos);
  EXPECT_EQ(ddlCommInitRank(&comm, 2, 2, "127.0.0.1:5", nullptr), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(nullptr)).find("rank must be in [0, 1]"), std::string::npos);
  unsetenv("DDL_RANK");
  unsetenv("DDL_WORLD_SIZE");
  unsetenv("DDL_ROOT");
  EXPECT_EQ(ddlCommInitFromEnv(&comm, nullptr), ddlInvalidArgument);
  EXPECT_NE(std::string(ddlGetLastError(nullptr)).find("DDL_RANK"), std::string::npos);
}

// ---- The rendezvous store admits only holders of the job's secret (DDL_JOB_SECRET). ----

// A loopback TCP connection to port, retried until something listens there or the limit passes (-1 then).
// Reads on it wait at most 10 s.
int connectWhenListening(int port, std::chrono::milliseconds limit) {
  const auto end = Clock::now() + limit;
  while (Clock::now() < end) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      timeval tv{10, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      return fd;
    }
    close(fd);
    std::this_thread::sleep_for(20ms);
  }
  return -1;
}

// A store request or handshake frame: u8 op, u32 id, u32 key length, u32 value length, key, value.
std::string storeFrame(uint8_t op, const std::string& value) {
  std::string s(1, static_cast<char>(op));
  for (uint32_t v : {0u, 0u, static_cast<uint32_t>(value.size())}) {
    uint32_t be = htonl(v);
    s.append(reinterpret_cast<const char*>(&be), 4);
  }
  return s + value;
}

void sendBytes(int fd, const std::string& bytes) { send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); }

// Everything the peer sends until it closes the connection (or 10 s of silence).
std::string readToEnd(int fd) {
  std::string all;
  char buf[4096];
  for (int i = 0; i < 1000; ++i) {  // bounded: each recv waits at most 10 s, and 4 MB is plenty
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    all.append(buf, static_cast<size_t>(n));
  }
  return all;
}

// A job of three ranks with a secret joins and runs every collective while strangers sit on rank 0's store:
// one silent, one sending garbage, one with a wrong proof, and two comm_worker processes posing as rank 1,
// one with a wrong secret and one with none. The impostors are refused with messages that say why; had
// either got in, it would have claimed rank 1 and broken the job.
TEST(StoreSecret, RanksJoinWhileStrangersAndImpostorsAreRefused) {
  constexpr int n = 3;
  const std::string secret =
      "ucx-test-" + std::to_string(getpid()) + "-" + std::to_string(Clock::now().time_since_epoch().count());
  int silent = -1, garbage = -1, wrong_proof = -1;
  std::unique_ptr<Ranks> wrong_secret, no_secret;
  Ranks ranks(n, {"all"}, {{"DDL_TIMEOUT_MS", "60000"}, {"DDL_JOB_SECRET", secret}}, [&](int port) {
    // Rank 0 runs alone so far, waiting in its store for the others.
    silent = connectWhenListening(port, 30s);
    garbage = connectWhenListening(port, 30s);
    wrong_proof = connectWhenListening(port, 30s);
    ASSERT_TRUE(silent >= 0 && garbage >= 0 && wrong_proof >= 0)
        << "rank 0's store never listened on " << port;
    sendBytes(garbage, "GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    sendBytes(wrong_proof, storeFrame(5, std::string(32, 'n')) + storeFrame(6, std::string(32, 'p')));
    const std::string root = "127.0.0.1:" + std::to_string(port);
    std::map<std::string, std::string> impostor{{"DDL_ROOT", root},
                                                {"DDL_WORLD_SIZE", std::to_string(n)},
                                                {"DDL_RANK", "1"},
                                                {"DDL_TIMEOUT_MS", "60000"}};
    impostor["DDL_JOB_SECRET"] = secret + "x";
    wrong_secret = std::make_unique<Ranks>(1, std::vector<std::string>{"all"}, impostor);
    impostor["DDL_JOB_SECRET"] = "";  // empty: none
    no_secret = std::make_unique<Ranks>(1, std::vector<std::string>{"all"}, impostor);
    ASSERT_TRUE(wrong_secret->waitAll(60s)) << wrong_secret->describe();
    ASSERT_TRUE(no_secret->waitAll(60s)) << no_secret->describe();
  });
  ASSERT_TRUE(ranks.waitAll(240s)) << "ranks did not finish:\n" << ranks.describe();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks.exitCode(r), 0) << ranks.describe();
    EXPECT_NE(ranks.output(r).find("OK all rank " + std::to_string(r)), std::string::npos)
        << ranks.describe();
  }
  ASSERT_TRUE(wrong_secret && no_secret);
  EXPECT_EQ(wrong_secret->exitCode(0), 3) << wrong_secret->describe();
  EXPECT_NE(
      wrong_secret->output(0).find("ERROR 1 ddlCommInitFromEnv: ddlCommInitFromEnv: rendezvous store at " +
                                   std::string("127.0.0.1:")),
      std::string::npos)
      << wrong_secret->describe();
  EXPECT_NE(
      wrong_secret->output(0).find("refused this rank: wrong DDL_JOB_SECRET (is this rank part of the job?)"),
      std::string::npos)
      << wrong_secret->describe();
  EXPECT_EQ(no_secret->exitCode(0), 3) << no_secret->describe();
  EXPECT_NE(no_secret->output(0).find("refused this rank: it admits only holders of the job's secret, and "
                                      "DDL_JOB_SECRET is not set here"),
            std::string::npos)
      << no_secret->describe();
  // The stranger with a wrong proof got the server's nonce (a 9-byte header and 32 bytes), then a refusal (a
  // 9-byte header, status 2), then the end of the connection; the one sending garbage just the end.
  const std::string answer = readToEnd(wrong_proof);
  ASSERT_EQ(answer.size(), 9u + 32 + 9) << "the server's answer to a wrong proof";
  EXPECT_EQ(answer[41], 2) << "kRefused";
  EXPECT_EQ(readToEnd(garbage), "");
  for (int fd : {silent, garbage, wrong_proof}) close(fd);
}

// A process that took DDL_ROOT's port before rank 0 and answers like a store that accepts any proof: the rank
// does not take it for the job's store.
TEST(StoreSecret, ARankDetectsAStoreThatCannotProveTheSecret) {
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
  const int port = ntohs(a.sin_port);
  std::thread impostor([listener] {
    pollfd p{listener, POLLIN, 0};
    if (poll(&p, 1, 60000) != 1) return;
    int fd = accept(listener, nullptr, nullptr);
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char hello[45], proof[45];
    auto reply = [&](const std::string& payload) {
      std::string r(1, '\0');  // kOk
      for (uint32_t v : {0u, static_cast<uint32_t>(payload.size())}) {
        uint32_t be = htonl(v);
        r.append(reinterpret_cast<const char*>(&be), 4);
      }
      sendBytes(fd, r + payload);
    };
    if (recv(fd, hello, sizeof hello, MSG_WAITALL) == sizeof hello) {
      reply(std::string(32, 's'));                                                                  // a nonce
      if (recv(fd, proof, sizeof proof, MSG_WAITALL) == sizeof proof) reply(std::string(32, 'm'));  // "proof"
    }
    readToEnd(fd);
    close(fd);
  });
  Ranks rank1(1, {"all"},
              {{"DDL_ROOT", "127.0.0.1:" + std::to_string(port)},
               {"DDL_WORLD_SIZE", "2"},
               {"DDL_RANK", "1"},
               {"DDL_TIMEOUT_MS", "60000"},
               {"DDL_JOB_SECRET", "the-job-secret"}});
  const bool finished = rank1.waitAll(60s);
  impostor.join();
  close(listener);
  ASSERT_TRUE(finished) << rank1.describe();
  EXPECT_EQ(rank1.exitCode(0), 3) << rank1.describe();
  EXPECT_NE(
      rank1.output(0).find("ERROR 3 ddlCommInitFromEnv: ddlCommInitFromEnv: rendezvous store at 127.0.0.1:" +
                           std::to_string(port) +
                           " did not prove the job's secret (another process on DDL_ROOT's port?)"),
      std::string::npos)
      << rank1.describe();
}

// ddlConfig_t.secret (version 3) does what DDL_JOB_SECRET does, for programs that launch their own ranks.
TEST(CApi, ConfigSecretGuardsTheRendezvous) {
  const std::string root = rootAddr();
  ddlComm_t comm0 = nullptr;
  ddlResult_t r0 = ddlInternalError;
  std::string error0;
  std::thread rank0([&] {
    ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
    cfg.timeoutMs = 60000;
    cfg.secret = "config-secret";
    r0 = ddlCommInitRank(&comm0, 2, 0, root.c_str(), &cfg);
    if (r0 != ddlSuccess) error0 = ddlGetLastError(nullptr);
  });
  ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
  cfg.timeoutMs = 60000;
  cfg.secret = "not-the-config-secret";
  ddlComm_t comm1 = nullptr;
  // Rank 0's store may not listen yet: a refused connection is retried, a refusal of the secret is final.
  const ddlResult_t r = ddlCommInitRank(&comm1, 2, 1, root.c_str(), &cfg);
  const std::string e = ddlGetLastError(nullptr);
  EXPECT_EQ(r, ddlInvalidArgument) << e;
  EXPECT_EQ(comm1, nullptr);
  EXPECT_NE(e.find("ddlCommInitRank: rendezvous store at 127.0.0.1:"), std::string::npos) << e;
  EXPECT_NE(e.find("refused this rank: wrong DDL_JOB_SECRET"), std::string::npos) << e;
  ddlResult_t r1 = ddlInternalError;
  std::string error1;
  if (comm1 == nullptr) {  // else the wrong secret got in, as rank 0's peer
    cfg.secret = "config-secret";
    r1 = ddlCommInitRank(&comm1, 2, 1, root.c_str(), &cfg);
    if (r1 != ddlSuccess) error1 = ddlGetLastError(nullptr);
  }
  rank0.join();  // bounded: rank 0 has its peer, or gives up at its timeout
  if (r0 != ddlSuccess || r1 != ddlSuccess) {
    for (ddlComm_t c : {comm0, comm1}) {
      if (c == nullptr) continue;
      ddlCommAbort(c);
      ddlCommDestroy(c);
    }
    FAIL() << "rank 0: " << error0 << "; rank 1: " << error1;
  }
  float in = 1, out0 = 0, out1 = 0;
  std::thread reduce0([&] { EXPECT_EQ(ddlAllReduce(&in, &out0, 1, ddlFloat32, ddlSum, comm0), ddlSuccess); });
  EXPECT_EQ(ddlAllReduce(&in, &out1, 1, ddlFloat32, ddlSum, comm1), ddlSuccess);
  reduce0.join();
  EXPECT_EQ(out0, 2.0f);
  EXPECT_EQ(out1, 2.0f);
  std::thread destroy0([&] { EXPECT_EQ(ddlCommDestroy(comm0), ddlSuccess); });
  EXPECT_EQ(ddlCommDestroy(comm1), ddlSuccess);
  destroy0.join();
}

// ---- Tools: ddlrun launching ddl-bench, as a user would. ----

// Runs cmd through the shell with stderr joined to stdout; the output, and its exit status in *status (-1 when
// the shell could not be started).
std::string runCommand(const std::string& cmd, int* status) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) {
    *status = -1;
    return "popen failed: " + std::string(std::strerror(errno));
  }
  std::string out;
  char buf[4096];
  while (size_t k = fread(buf, 1, sizeof(buf), p)) out.append(buf, k);
  *status = WEXITSTATUS(pclose(p));
  return out;
}

TEST(Tools, DdlrunRunsDdlBenchWithCorrectResults) {
  int st = 0;
  const std::string out =
      runCommand(kBin + "/ddlrun -np 3 --timeout-ms 60000 -- " + kBin + "/ddl-bench -b 8 -e 1M -f 8 -n 3 -w 1 -c 1", &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("Out of bounds values : 0 OK"), std::string::npos) << out;
  EXPECT_NE(out.find("1048576"), std::string::npos) << out;
}

// ddl-bench --tune writes a table per rank count into one file; libddl then runs from it with correct results,
// and a table that cannot be read stops the communicator's creation naming the file.
TEST(Tools, DdlBenchTuneWritesATableThatLibddlUses) {
  const std::string table = testing::TempDir() + "ddl-tune-test-" + std::to_string(getpid()) + ".tune";
  std::remove(table.c_str());
  const std::string sweep = " -b 8 -e 256K -f 8 -n 2 -w 1";
  int st = 0;
  std::string out = runCommand(kBin + "/ddlrun -np 2 --timeout-ms 60000 -- " + kBin + "/ddl-bench --tune " + table + sweep, &st);
  ASSERT_EQ(st, 0) << out;
  out = runCommand(kBin + "/ddlrun -np 3 --timeout-ms 60000 -- " + kBin + "/ddl-bench --tune " + table + sweep, &st);
  ASSERT_EQ(st, 0) << out;
  const std::string text = readFile(table);
  EXPECT_EQ(text.rfind("ddl-tune 1\n", 0), 0u) << text;
  EXPECT_NE(text.find("allreduce 2 2 "), std::string::npos) << text;  // the 2-rank rules were kept
  EXPECT_NE(text.find("allreduce 3 3 "), std::string::npos) << text;
  EXPECT_NE(text.find(" inf "), std::string::npos) << text;
  out = runCommand("DDL_TUNE_FILE=" + table + " " + kBin + "/ddlrun -np 3 --timeout-ms 60000 -- " + kBin +
                "/ddl-bench -b 8 -e 1M -f 8 -n 2 -w 1 -c 1",
            &st);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(out.find("Out of bounds values : 0 OK"), std::string::npos) << out;
  std::ofstream(table) << "ddl-tune 1\nallreduce * * inf quick 0\n";
  out = runCommand("DDL_TUNE_FILE=" + table + " " + kBin + "/ddlrun -np 2 --timeout-ms 60000 -- " + kBin +
                "/ddl-bench -b 8 -e 8 -n 1 -w 0",
            &st);
  EXPECT_NE(st, 0) << out;
  EXPECT_NE(out.find(table + ":2:"), std::string::npos) << out;
  EXPECT_NE(out.find("ALGO 'quick' is not ring, mdring or rhd"), std::string::npos) << out;
  std::remove(table.c_str());
}

// --tune assumes no port beyond DDL_ROOT's free: with the next one held by another listener, it still tunes
// (each next candidate meets on a port rank 0 finds free).
TEST(Tools, DdlBenchTuneNeedsNoPortBeyondDdlRoot) {
  int root = 0, held = -1;
  for (int i = 0; i < 20 && held < 0; ++i) {  // a root port whose successor this test can hold
    root = freePort();
    if (root <= 0 || root >= 65535) continue;
    held = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(root + 1));
    if (bind(held, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(held, 1) != 0) {
      close(held);
      held = -1;
    }
  }
  ASSERT_GE(held, 0) << "found no free port pair in 20 tries";
  const std::string table = testing::TempDir() + "ddl-tune-ports-" + std::to_string(getpid()) + ".tune";
  std::remove(table.c_str());
  int st = 0;
  const std::string out = runCommand(kBin + "/ddlrun -np 2 --timeout-ms 30000 --root 127.0.0.1:" +
                                         std::to_string(root) + " -- " + kBin + "/ddl-bench --tune " + table +
                                         " -b 8 -e 8K -f 8 -n 2 -w 1",
                                     &st);
  close(held);
  EXPECT_EQ(st, 0) << out;
  EXPECT_NE(readFile(table).find("allreduce 2 2 "), std::string::npos) << out;
  std::remove(table.c_str());
}

}  // namespace
