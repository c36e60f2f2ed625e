// ddlctl against a real ddl-coordinator process (started here on 127.0.0.1, port chosen at run time) with
// two fake agents registered over gRPC: every verb, in text and JSON, and the errors a user can make.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "service/fake_agent.h"

namespace {

namespace fs = std::filesystem;
using ddl::testing::FakeAgent;

struct Result {
  int code = -1;
  std::string out, err;
};

// Runs bin/ARGV[0] with the rest as arguments; captures stdout and stderr; bounded by the CLI's own timeout.
Result runProgram(std::vector<std::string> argv, const std::vector<std::string>& env = {}) {
  const std::string dir = fs::temp_directory_path() / ("ddlctl-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  argv[0] = std::string(DDL_BIN_DIR) + "/" + argv[0];
  pid_t pid = fork();
  if (pid == 0) {
    int o = open((dir + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open((dir + "/err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    for (const auto& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  r.out = slurp(dir + "/out");
  r.err = slurp(dir + "/err");
  fs::remove_all(dir);
  return r;
}

class DdlctlTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = fs::temp_directory_path() / ("ddlctl-coord-" + std::to_string(getpid()));
    fs::remove_all(data_);
    fs::create_directories(data_);
    pid_ = fork();
    if (pid_ == 0) {
      int log = open((data_ / "coordinator.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(log, 1);
      dup2(log, 2);
      std::string bin = std::string(DDL_BIN_DIR) + "/ddl-coordinator";
      execl(bin.c_str(), bin.c_str(), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", data_.c_str(),
            "--heartbeat-grace", "5", nullptr);
      _exit(127);
    }
    for (int i = 0; i < 500 && !fs::exists(data_ / "coordinator.addr"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream in(data_ / "coordinator.addr");
    std::getline(in, address_);
    ASSERT_FALSE(address_.empty()) << "the coordinator did not start; see " << (data_ / "coordinator.log");
    for (const char* name : {"n1", "n2"}) {
      agents_.push_back(std::make_unique<FakeAgent>(address_, name, 2, std::map<std::string, std::string>{
                                                                             {"switch", "s1"}}));
      ASSERT_EQ(agents_.back()->connect(), "");
      agents_.back()->startHeartbeats(500);
    }
  }
  static void TearDownTestSuite() {
    agents_.clear();
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      waitpid(pid_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the coordinator did not stop cleanly";
    }
    fs::remove_all(data_);
  }

  Result ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {"ddlctl", "--coordinator", address_});
    return runProgram(args);
  }
  std::string submit(std::vector<std::string> args) {
    args.insert(args.begin(), "submit");
    Result r = ctl(args);
    EXPECT_EQ(r.code, 0) << r.err;
    std::string id = r.out.substr(0, r.out.find('\n'));
    EXPECT_EQ(id.rfind("j-", 0), 0u) << r.out;
    return id;
  }
  nlohmann::json json(std::vector<std::string> args) {
    args.insert(args.end(), {"-o", "json"});
    Result r = ctl(args);
    EXPECT_EQ(r.code, 0) << r.err;
    return nlohmann::json::parse(r.out);
  }
  // Polls the job's state through ddlctl for at most 5 s.
  bool reaches(const std::string& id, const std::string& state) {
    for (int i = 0; i < 100; ++i) {
      if (json({"status", id})["state"] == state) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  static inline fs::path data_;
  static inline pid_t pid_ = -1;
  static inline std::string address_;
  static inline std::vector<std::unique_ptr<FakeAgent>> agents_;
};

TEST_F(DdlctlTest, NodesListsBothAgents) {
  Result r = ctl({"nodes"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("n1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("n2"), std::string::npos);
  EXPECT_NE(r.out.find("UP"), std::string::npos);
  auto j = json({"nodes"});
  ASSERT_EQ(j["nodes"].size(), 2u);
  EXPECT_EQ(j["nodes"][0]["name"], "n1");
  EXPECT_EQ(j["nodes"][0]["labels"]["switch"], "s1");
}

TEST_F(DdlctlTest, SubmitRunsAndEveryViewShowsTheJob) {
  std::string id = submit({"--name", "resnet", "--nodes", "2", "--gpus-per-node", "2", "--env", "A=1", "--",
                           "python3", "train.py", "--epochs", "1"});
  ASSERT_TRUE(reaches(id, "RUNNING"));
  Result list = ctl({"list"});
  ASSERT_EQ(list.code, 0) << list.err;
  for (const char* col : {"ID", "NAME", "USER", "STATE", "AGE", "NODES", "GPUS", "NODELIST"}) {
    EXPECT_NE(list.out.find(col), std::string::npos) << col << " missing in\n" << list.out;
  }
  EXPECT_NE(list.out.find(id), std::string::npos);
  EXPECT_NE(list.out.find("resnet"), std::string::npos);
  EXPECT_NE(list.out.find("RUNNING"), std::string::npos);

  Result status = ctl({"status", id});
  ASSERT_EQ(status.code, 0) << status.err;
  EXPECT_NE(status.out.find("python3 train.py --epochs 1"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("STARTING"), std::string::npos);  // the transition history

  Result ring = ctl({"ring", id});
  ASSERT_EQ(ring.code, 0) << ring.err;
  EXPECT_NE(ring.out.find("2x2"), std::string::npos) << ring.out;
  auto ring_json = json({"ring", id});
  EXPECT_EQ(ring_json["topology"], "2x2");
  EXPECT_EQ(ring_json["ranks"].size(), 4u);

  for (auto& agent : agents_) ASSERT_TRUE(agent->exitAll(id));
  ASSERT_TRUE(reaches(id, "SUCCEEDED"));
  EXPECT_EQ(ctl({"list"}).out.find(id), std::string::npos);  // default: live jobs only
  EXPECT_NE(ctl({"list", "--all"}).out.find(id), std::string::npos);
  auto done = json({"list", "--state", "succeeded"});
  bool found = false;
  for (const auto& j : done["jobs"]) found = found || j["id"] == id;
  EXPECT_TRUE(found);
}

TEST_F(DdlctlTest, PendingJobShowsItsReasonAndCancelEndsIt) {
  std::string big = submit({"--nodes", "2", "--gpus-per-node", "2", "--", "sleep", "100"});
  std::string waits = submit({"--gpus", "4", "--", "sleep", "100"});
  ASSERT_TRUE(reaches(big, "RUNNING"));
  auto pending = json({"status", waits});
  EXPECT_EQ(pending["state"], "PENDING");
  EXPECT_FALSE(pending["reason"].get<std::string>().empty());
  Result list = ctl({"list"});
  EXPECT_NE(list.out.find("(" + pending["reason"].get<std::string>().substr(0, 20)), std::string::npos) << list.out;

  Result cancel = ctl({"cancel", big});
  ASSERT_EQ(cancel.code, 0) << cancel.err;
  EXPECT_NE(cancel.out.find("CANCELLED"), std::string::npos);
  // The waiting job runs once the cancelled one's ranks are gone.
  ASSERT_TRUE(reaches(waits, "RUNNING"));
  Result again = ctl({"cancel", big});
  EXPECT_EQ(again.code, 1);
  EXPECT_NE(again.err.find("already ended"), std::string::npos) << again.err;
  ASSERT_EQ(ctl({"cancel", waits}).code, 0);
}

TEST_F(DdlctlTest, DrainAndUndrain) {
  Result d = ctl({"drain", "n2"});
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_NE(d.out.find("DRAINING"), std::string::npos) << d.out;
  EXPECT_EQ(json({"nodes"})["nodes"][1]["state"], "DRAINING");
  Result u = ctl({"undrain", "n2"});
  ASSERT_EQ(u.code, 0) << u.err;
  EXPECT_NE(u.out.find("UP"), std::string::npos) << u.out;
  Result unknown = ctl({"drain", "n9"});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("n9"), std::string::npos);
}

TEST_F(DdlctlTest, BadInputGivesClearErrorsAndExitCodes) {
  Result negative = ctl({"submit", "--nodes", "1", "--gpus-per-node", "-1", "--", "x"});
  EXPECT_EQ(negative.code, 2) << negative.err;
  EXPECT_TRUE(negative.out.empty());
  Result empty = ctl({"submit", "--gpus", "1", "--"});
  EXPECT_EQ(empty.code, 2);
  EXPECT_NE(empty.err.find("command"), std::string::npos) << empty.err;
  Result unknown = ctl({"status", "j-987654"});
  EXPECT_EQ(unknown.code, 1);
  EXPECT_NE(unknown.err.find("j-987654"), std::string::npos) << unknown.err;
  Result too_big = ctl({"submit", "--gpus", "64", "--", "x"});
  EXPECT_EQ(too_big.code, 1);
  EXPECT_NE(too_big.err.find("refused"), std::string::npos) << too_big.err;
  Result bad_topology = ctl({"submit", "--gpus", "4", "--topology", "3x3", "--", "x"});
  EXPECT_EQ(bad_topology.code, 1) << bad_topology.err;
  Result bad_verb = ctl({"frobnicate"});
  EXPECT_EQ(bad_verb.code, 2);
  Result unreachable = runProgram({"ddlctl", "--coordinator", "127.0.0.1:1", "--timeout", "2", "list"});
  EXPECT_EQ(unreachable.code, 3);
  EXPECT_NE(unreachable.err.find("cannot reach coordinator at 127.0.0.1:1: connection refused"), std::string::npos)
      << unreachable.err;
  Result from_env = runProgram({"ddlctl", "nodes"}, {"DDL_COORDINATOR=" + address_});
  EXPECT_EQ(from_env.code, 0) << from_env.err;
}

}  // namespace
