// End to end on this machine: a real ddl-coordinator and two real ddl-agents (two virtual GPUs each) as
// processes on 127.0.0.1, jobs submitted through the UserService (and ddlctl), ranks run as real processes.
// Every wait is bounded; every process started here is stopped at the end of each test.
//
// Run as root, the agents run every rank as its job's user, so the jobs here belong to a throwaway account
// (ddlt-PID-e, made with useradd for this test process and deleted afterwards; see tests/worker/
// test_accounts.h). Run as another user, the agents cannot switch users and the ranks run as that user.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "../worker/test_accounts.h"
#include "ddl/v1/ddl.grpc.pb.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

pid_t spawn(const std::vector<std::string>& argv, const fs::path& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// True when some process's command line contains `marker` (each test's ranks carry a unique one).
bool processWithMarker(const std::string& marker) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    std::string cmdline = slurp(e.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(marker) != std::string::npos && cmdline.find("cluster_test") == std::string::npos) return true;
  }
  return false;
}

template <typename Pred>
bool waitFor(Pred pred, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

class ClusterTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    if (!ddl::test::accountsUnavailable().empty()) return;  // not root: the ranks run as whoever runs this
    ddl::test::removeStaleTestAccounts();
    const std::string name = ddl::test::testAccountName('e');
    // A home of its own (under /tmp, removed with it): python and torch may want to write there.
    if (!ddl::test::shellOk("useradd --create-home --home-dir /tmp/" + name + " --shell /bin/sh " + name)) {
      FAIL() << "cannot make the test account " << name << " with useradd";
    }
    job_user_ = name;
  }
  static void TearDownTestSuite() {
    if (job_user_ != "e2e") ddl::test::shellOk("userdel --remove " + job_user_ + " 2>/dev/null");
    job_user_ = "e2e";
  }

 protected:
  // The jobs' user: the throwaway account where the agents (root) switch users, else a name they ignore.
  static inline std::string job_user_ = "e2e";
  static bool agentsSwitchUsers() { return job_user_ != "e2e"; }
  // Runs ddlctl's command line (without the binary) as the jobs' user, so that the job is theirs.
  std::string ddlctl(const std::string& args) const {
    const std::string ctl = std::string(DDL_BIN_DIR) + "/ddlctl --coordinator " + address_ + " " + args;
    return agentsSwitchUsers() ? "runuser -u " + job_user_ + " -- " + ctl : ctl;
  }

  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ddl-e2e-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    startCoordinator("127.0.0.1:0");
    if (HasFatalFailure()) return;
    for (int i = 1; i <= 2; ++i) startAgent(i);
    ASSERT_TRUE(waitFor([&] { return upNodes() == 2; }, 10000)) << slurp(dir_ / "agent-n1.log");
  }
  void TearDown() override {
    for (auto& [name, pid] : agents_) stop(pid);
    stop(coordinator_);
    if (HasFailure()) {
      std::cerr << "--- coordinator log\n" << slurp(dir_ / "coordinator.log") << "--- agent n1 log\n"
                << slurp(dir_ / "agent-n1.log") << "--- agent n2 log\n" << slurp(dir_ / "agent-n2.log");
    }
    fs::remove_all(dir_);
  }

  void startCoordinator(const std::string& listen) {
    fs::remove(dir_ / "coordinator" / "coordinator.addr");
    coordinator_ = spawn({std::string(DDL_BIN_DIR) + "/ddl-coordinator", "--listen", listen, "--http", "127.0.0.1:0", "--data-dir",
                          (dir_ / "coordinator").string(), "--heartbeat-grace", "3"},
                         dir_ / "coordinator.log");
    ASSERT_TRUE(waitFor([&] { return fs::exists(dir_ / "coordinator" / "coordinator.addr"); }, 10000))
        << slurp(dir_ / "coordinator.log");
    std::ifstream in(dir_ / "coordinator" / "coordinator.addr");
    std::getline(in, address_);
    user_ = ddl::v1::UserService::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  // stop_ranks_on_exit: the tests' agents take their ranks down with them (nothing outlives a test), except
  // where a test restarts an agent under a running job.
  void startAgent(int i, bool stop_ranks_on_exit = true) {
    const std::string node = "n" + std::to_string(i);
    const std::string ports = i == 1 ? "31000-31099" : "31100-31199";
    std::vector<std::string> argv = {std::string(DDL_BIN_DIR) + "/ddl-agent", "--coordinator", address_, "--node",
                                     node, "--address", "127.0.0.1", "--labels", "switch=s1", "--virtual-gpus", "2",
                                     "--force-virtual", "--data-dir", (dir_ / node).string(), "--port-range", ports};
    if (stop_ranks_on_exit) argv.push_back("--stop-ranks-on-exit");
    agents_[node] = spawn(argv, dir_ / ("agent-" + node + ".log"));
  }
  // SIGTERM, then SIGKILL after 15 s: a clean stop is part of what is tested, but never hang.
  static void stop(pid_t& pid) {
    if (pid <= 0) return;
    kill(pid, SIGTERM);
    int status = 0;
    bool gone = waitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 15000);
    if (!gone) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    pid = -1;
  }

  int upNodes() {
    if (!user_) return -1;
    ddl::v1::ListNodesResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (!user_->ListNodes(&ctx, {}, &resp).ok()) return -1;
    int up = 0;
    for (const auto& n : resp.nodes()) up += n.state() == "UP" && n.connected();
    return up;
  }
  std::string submit(int nodes, int gpus_per_node, std::vector<std::string> command,
                     const std::string& user = "") {
    ddl::v1::SubmitRequest req;
    auto* s = req.mutable_spec();
    s->set_user(user.empty() ? job_user_ : user);
    s->set_nodes(nodes);
    s->set_gpus_per_node(gpus_per_node);
    for (auto& a : command) s->add_command(a);
    ddl::v1::SubmitResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st = user_->Submit(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp.job().id();
  }
  ddl::v1::Job job(const std::string& id) {
    ddl::v1::GetJobRequest req;
    req.set_id(id);
    ddl::v1::Job out;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    user_->GetJob(&ctx, req, &out);
    return out;
  }
  bool reaches(const std::string& id, ddl::v1::JobState state, int timeout_ms) {
    return waitFor([&] { return job(id).state() == state; }, timeout_ms);
  }
  int64_t transitionMs(const ddl::v1::Job& j, ddl::v1::JobState to) {
    for (const auto& t : j.transitions()) {
      if (t.to() == to) return t.at_ms();
    }
    return -1;
  }

  fs::path dir_;
  pid_t coordinator_ = -1;
  std::map<std::string, pid_t> agents_;
  std::string address_;
  std::unique_ptr<ddl::v1::UserService::Stub> user_;
};

TEST_F(ClusterTest, FourRankAllreduceJobSucceedsWithCorrectOutput) {
  std::string id = submit(2, 2, {std::string(DDL_BIN_DIR) + "/ddl-bench", "-b", "8", "-e", "1M", "-f", "8", "-n",
                                 "3", "-w", "1", "-c", "1"});
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 120000)) << job(id).DebugString();
  auto j = job(id);
  EXPECT_EQ(j.topology(), "2x2");
  // Rank 0 printed the table; every size was checked and correct.
  std::string root = j.allocation(0).node();
  std::string log = slurp(dir_ / root / "logs" / id / "attempt-1" / "rank-0.log");
  EXPECT_NE(log.find("# Out of bounds values : 0 OK"), std::string::npos) << log;
  EXPECT_NE(log.find("1048576"), std::string::npos) << log;
  // ddlctl shows it SUCCEEDED with its transition times.
  std::string out = dir_ / "status.txt";
  std::string cmd = std::string(DDL_BIN_DIR) + "/ddlctl --coordinator " + address_ + " status " + id + " > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string status = slurp(out);
  EXPECT_NE(status.find("SUCCEEDED"), std::string::npos) << status;
  EXPECT_NE(status.find("RUNNING"), std::string::npos) << status;
}

TEST_F(ClusterTest, LogsAreReadThroughTheCoordinator) {
  std::string id = submit(2, 1, {"/bin/sh", "-c", "echo \"hello from $DDL_RANK of $WORLD_SIZE\"; printf 'no newline'"});
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 30000)) << job(id).DebugString();
  const std::string ctl = std::string(DDL_BIN_DIR) + "/ddlctl --coordinator " + address_ + " logs " + id;
  ASSERT_EQ(std::system((ctl + " > " + (dir_ / "all.txt").string()).c_str()), 0);
  std::string all = slurp(dir_ / "all.txt");
  EXPECT_NE(all.find("[0] hello from 0 of 2\n"), std::string::npos) << all;
  EXPECT_NE(all.find("[1] hello from 1 of 2\n"), std::string::npos) << all;
  EXPECT_NE(all.find("[1] no newline\n"), std::string::npos) << all;
  ASSERT_EQ(std::system((ctl + " --rank 1 > " + (dir_ / "one.txt").string()).c_str()), 0);
  EXPECT_EQ(slurp(dir_ / "one.txt"), "hello from 1 of 2\nno newline\n");
  EXPECT_NE(std::system((ctl + " --rank 5 2>/dev/null").c_str()), 0);
}

TEST_F(ClusterTest, FailingRankFailsTheJobAndTheOtherRanksAreStopped) {
  const std::string marker = "61." + std::to_string(getpid());
  std::string id = submit(2, 2, {"/bin/sh", "-c", "if [ \"$DDL_RANK\" = 3 ]; then sleep 0.5; exit 7; fi; exec sleep " + marker});
  ASSERT_TRUE(reaches(id, ddl::v1::FAILED, 30000)) << job(id).DebugString();
  auto j = job(id);
  EXPECT_EQ(j.failure().rank(), 3);
  EXPECT_EQ(j.failure().exit_code(), 7);
  // Rank 3 is the second GPU of the second node in ring order.
  EXPECT_EQ(j.failure().host(), j.allocation(1).node());
  EXPECT_TRUE(waitFor([&] { return !processWithMarker(marker); }, 15000)) << "ranks of the failed job survive";
}

TEST_F(ClusterTest, CancelLeavesNoProcessOfTheJob) {
  const std::string marker = "62." + std::to_string(getpid());
  std::string id = submit(2, 2, {"/bin/sleep", marker});
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000));
  ASSERT_TRUE(processWithMarker(marker));
  ddl::v1::CancelJobRequest req;
  req.set_id(id);
  ddl::v1::Job out;
  grpc::ClientContext ctx;
  ASSERT_TRUE(user_->CancelJob(&ctx, req, &out).ok());
  EXPECT_EQ(out.state(), ddl::v1::CANCELLED);
  EXPECT_TRUE(waitFor([&] { return !processWithMarker(marker); }, 15000)) << "ranks of the cancelled job survive";
}

TEST_F(ClusterTest, GangJobWaitsForGpusThenRuns) {
  std::string first = submit(2, 2, {"/bin/sleep", "2"});
  ASSERT_TRUE(reaches(first, ddl::v1::RUNNING, 30000));
  std::string second = submit(2, 1, {"/bin/true"});
  // Wait for a scheduling pass to have weighed it (its reason then says what it waits for).
  ddl::v1::Job waiting;
  ASSERT_TRUE(waitFor([&] {
    waiting = job(second);
    return waiting.reason() != "waiting for the next scheduling pass";
  }, 10000));
  EXPECT_EQ(waiting.state(), ddl::v1::PENDING) << waiting.reason();
  EXPECT_NE(waiting.reason().find("waiting for"), std::string::npos) << waiting.reason();
  ASSERT_TRUE(reaches(first, ddl::v1::SUCCEEDED, 30000));
  ASSERT_TRUE(reaches(second, ddl::v1::SUCCEEDED, 30000)) << job(second).DebugString();
  EXPECT_GE(transitionMs(job(second), ddl::v1::SCHEDULED), transitionMs(job(first), ddl::v1::SUCCEEDED));
}

TEST_F(ClusterTest, KilledAgentMarksNodeDownAndFailsOnlyItsJob) {
  const std::string marker = "63." + std::to_string(getpid());
  std::string a = submit(1, 2, {"/bin/sleep", marker});
  std::string b = submit(1, 2, {"/bin/sleep", marker});
  ASSERT_TRUE(reaches(a, ddl::v1::RUNNING, 30000));
  ASSERT_TRUE(reaches(b, ddl::v1::RUNNING, 30000));
  const std::string victim = job(a).allocation(0).node();
  kill(agents_[victim], SIGKILL);
  waitpid(agents_[victim], nullptr, 0);
  agents_[victim] = -1;
  const auto t0 = Clock::now();
  ASSERT_TRUE(reaches(a, ddl::v1::FAILED, 10000));
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(seconds, 2 * 3.0 + 1);  // DOWN within the 3 s grace (with slack for a loaded machine)
  EXPECT_EQ(job(a).reason().rfind("node_lost", 0), 0u) << job(a).reason();
  EXPECT_EQ(job(b).state(), ddl::v1::RUNNING);
  // The killed agent's ranks were left behind (it had no chance to stop them); clean up after the test.
  std::system(("pkill -f " + marker).c_str());
}

// An agent upgrade mid-job: the agent restarts, its ranks keep running, the new agent adopts them and reports
// how each one really ended (through ddl-rank-shim's exit records), so the job's outcome is the true one.
TEST_F(ClusterTest, AgentRestartMidJobAdoptsItsRanksAndTheirExitCodes) {
  stop(agents_["n1"]);
  startAgent(1, /*stop_ranks_on_exit=*/false);
  ASSERT_TRUE(waitFor([&] { return upNodes() == 2; }, 10000));
  const std::string marker = "64." + std::to_string(getpid());
  const std::string gate = (dir_ / "gate").string();
  // On n1 (its DDL_AGENT_SOCKET lies in n1's data dir), local rank 1 exits 5 a moment after local rank 0 exits
  // 0: if an adopted rank's clean exit were reported as unknown (255), the job would fail with 255 instead.
  // The gate is awaited at most 30 s, so a failed test leaves no rank behind for long.
  const std::string await_gate =
      "i=0; while [ ! -e " + gate + " ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; ";
  std::string id = submit(2, 2, {"/bin/sh", "-c", await_gate +
                                                      "case \"$DDL_AGENT_SOCKET\" in */n1/*) ;; *) exit 0;; esac; "
                                                      "[ \"$LOCAL_RANK\" = 0 ] && exit 0; sleep 0.5; exit 5",
                                 marker});
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000));
  stop(agents_["n1"]);  // SIGTERM: the agent exits, its ranks stay
  ASSERT_TRUE(processWithMarker(marker));
  startAgent(1, /*stop_ranks_on_exit=*/false);
  ASSERT_TRUE(waitFor([&] { return slurp(dir_ / "agent-n1.log").find("adopted 2 ranks") != std::string::npos; },
                      10000))
      << slurp(dir_ / "agent-n1.log");
  ASSERT_TRUE(waitFor([&] { return upNodes() == 2; }, 10000));
  EXPECT_EQ(job(id).state(), ddl::v1::RUNNING) << job(id).DebugString();
  std::ofstream(gate) << "go\n";
  ASSERT_TRUE(reaches(id, ddl::v1::FAILED, 30000)) << job(id).DebugString();
  auto j = job(id);
  EXPECT_EQ(j.failure().host(), "n1");
  EXPECT_EQ(j.failure().exit_code(), 5) << j.DebugString();
  EXPECT_TRUE(waitFor([&] { return !processWithMarker(marker); }, 15000));
}

// The training example (DDP over torch_ddl) submitted through ddlctl: its last rank fails the first attempt
// right after epoch 1's checkpoint; with --max-restarts 1 the job runs again, and the second attempt resumes
// after epoch 1 instead of starting over, then succeeds.
TEST_F(ClusterTest, TrainingExampleThroughDdlctlResumesFromItsCheckpointAfterAFailure) {
#ifndef DDL_TEST_TORCH
  GTEST_SKIP() << "torch_ddl is not built here (no libtorch-dev): nothing to train with";
#else
  // The job's user writes the checkpoints.
  fs::create_directories(dir_ / "checkpoints");
  chmod((dir_ / "checkpoints").c_str(), 01777);
  const std::string submit =
      ddlctl("submit --name fmnist --nodes 2 --gpus-per-node 1 --max-restarts 1 --env PYTHONPATH=" +
             std::string(DDL_TEST_PYTHONPATH) + " --env OMP_NUM_THREADS=1 -- /usr/bin/python3 " +
             DDL_SOURCE_DIR + "/examples/fashion_mnist/train.py --epochs 2 --train-samples 2048 --test-samples 1000 "
             "--batch-size 32 --timeout 60 --crash-after-epoch 1 --checkpoint-dir " +
             (dir_ / "checkpoints").string()) +
      " > " + (dir_ / "job.txt").string();
  ASSERT_EQ(std::system(submit.c_str()), 0);
  std::string id = slurp(dir_ / "job.txt");
  id.erase(id.find_last_not_of("\n") + 1);
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 240000)) << job(id).DebugString();
  auto j = job(id);
  EXPECT_EQ(j.restarts(), 1) << j.DebugString();
  const fs::path logs = dir_ / j.allocation(0).node() / "logs" / id;
  const std::string first = slurp(logs / "attempt-1" / "rank-0.log");
  const std::string second = slurp(logs / "attempt-2" / "rank-0.log");
  EXPECT_NE(first.find("epoch 1/2: loss"), std::string::npos) << first;
  EXPECT_EQ(first.find("epoch 2/2"), std::string::npos) << first;
  EXPECT_NE(second.find("resuming from the checkpoint of epoch 1"), std::string::npos) << second;
  EXPECT_EQ(second.find("epoch 1/2"), std::string::npos) << "the second attempt trained epoch 1 again:\n" << second;
  EXPECT_NE(second.find("epoch 2/2: loss"), std::string::npos) << second;
  EXPECT_NE(second.find("done: test accuracy"), std::string::npos) << second;
#endif
}

// Ranks run as the job's user (when the agents are root): its uid and HOME, a log that is its own (0600), and
// their libddl telemetry still reaches the agents (whose socket checks that a report comes from its rank). A
// user the nodes lack, or root without allow_root_jobs, fails the job with the agent's reason.
TEST_F(ClusterTest, RanksRunAsTheJobsUser) {
  if (!agentsSwitchUsers()) GTEST_SKIP() << "the agents are not root here: they cannot switch users";
  const std::string bench = std::string(DDL_BIN_DIR) + "/ddl-bench -b 64K -e 64K -n 1000000 -w 1 -c 0";
  std::string id = submit(2, 2, {"/bin/sh", "-c", "id -un; echo \"$HOME\"; exec " + bench});
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000)) << job(id).DebugString();
  // Every rank's progress reaches the coordinator.
  ASSERT_TRUE(waitFor(
      [&] {
        auto j = job(id);
        if (j.ranks_size() != 4) return false;
        for (const auto& r : j.ranks()) {
          if (r.progress().collectives() == 0) return false;
        }
        return true;
      },
      30000))
      << job(id).DebugString();
  auto j = job(id);
  const fs::path log = dir_ / j.allocation(0).node() / "logs" / id / "attempt-1" / "rank-0.log";
  EXPECT_EQ(slurp(log).rfind(job_user_ + "\n/tmp/" + job_user_ + "\n", 0), 0u) << slurp(log);
  struct stat st {};
  ASSERT_EQ(stat(log.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(st.st_uid, 0u);
  ddl::v1::CancelJobRequest cancel;
  cancel.set_id(id);
  ddl::v1::Job out;
  grpc::ClientContext ctx;
  ASSERT_TRUE(user_->CancelJob(&ctx, cancel, &out).ok());

  std::string unknown = submit(1, 1, {"/bin/true"}, "ddlt-no-such-user");
  ASSERT_TRUE(reaches(unknown, ddl::v1::FAILED, 30000)) << job(unknown).DebugString();
  EXPECT_NE(job(unknown).reason().find("could not start: user 'ddlt-no-such-user' does not exist on node"),
            std::string::npos)
      << job(unknown).reason();
  std::string root = submit(1, 1, {"/bin/true"}, "root");
  ASSERT_TRUE(reaches(root, ddl::v1::FAILED, 30000)) << job(root).DebugString();
  EXPECT_NE(job(root).reason().find("user 'root' is uid 0 and the coordinator does not allow root jobs"),
            std::string::npos)
      << job(root).reason();
}

TEST_F(ClusterTest, CoordinatorKilledMidJobRestartsAndTheJobStillSucceeds) {
  std::string id = submit(2, 2, {"/bin/sleep", "4"});
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000));
  kill(coordinator_, SIGKILL);
  waitpid(coordinator_, nullptr, 0);
  startCoordinator(address_);  // same port and data dir: the agents find it again
  EXPECT_EQ(job(id).state(), ddl::v1::RUNNING);
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 30000)) << job(id).DebugString();
  ddl::v1::ListJobsResponse list;
  grpc::ClientContext ctx;
  ASSERT_TRUE(user_->ListJobs(&ctx, {}, &list).ok());
  EXPECT_EQ(list.jobs_size(), 1);
}

}  // namespace
