// ddlctl against a real ddl-coordinator process (started here on 127.0.0.1, port chosen at run time, with a PKI
// made by its own init-pki) with two fake agents registered over mutual TLS: every verb, in text and JSON, the
// errors a user can make, and the security rules (DdlctlTest.Security*): plaintext, foreign and expired
// certificates refused, no or wrong token refused, a node cannot speak for another, a user cannot touch another
// user's job, an admin can.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/pki.h"
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
    pki_ = (data_ / "pki").string();
    // The first admin is named after an account every Debian system has, so that the jobs it submits are
    // accepted: init-pki's default name, admin, is no account, and its jobs are refused (they could not run).
    Result init = runProgram({"ddl-coordinator", "init-pki", pki_, "--admin", "nobody"});
    ASSERT_EQ(init.code, 0) << init.err;
    for (const char* name : {"n1", "n2"}) {
      Result issued = runProgram({"ddl-coordinator", "--pki-dir", pki_, "issue-node", name, "--out",
                                  (data_ / name).string()});
      ASSERT_EQ(issued.code, 0) << issued.err;
    }
    pid_ = fork();
    if (pid_ == 0) {
      int log = open((data_ / "coordinator.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      dup2(log, 1);
      dup2(log, 2);
      std::string bin = std::string(DDL_BIN_DIR) + "/ddl-coordinator";
      execl(bin.c_str(), bin.c_str(), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data-dir", data_.c_str(),
            "--heartbeat-grace", "5", "--pki-dir", pki_.c_str(), nullptr);
      _exit(127);
    }
    for (int i = 0; i < 500 && !fs::exists(data_ / "coordinator.addr"); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::ifstream in(data_ / "coordinator.addr");
    std::getline(in, address_);
    ASSERT_FALSE(address_.empty()) << "the coordinator did not start; see " << (data_ / "coordinator.log");
    for (const char* name : {"n1", "n2"}) {
      agents_.push_back(std::make_unique<FakeAgent>(
          address_, name, 2, std::map<std::string, std::string>{{"switch", "s1"}}, (data_ / name).string()));
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

  // ddlctl as the admin (init-pki's token), or as the holder of token_file.
  Result ctl(std::vector<std::string> args, const std::string& token_file = "") {
    args.insert(args.begin(), {"ddlctl", "--coordinator", address_, "--ca", pki_ + "/ca.crt", "--token-file",
                               token_file.empty() ? pki_ + "/admin.token" : token_file});
    return runProgram(args);
  }
  // A new user (role user unless given) and the file its token is in.
  std::string addUser(const std::string& name, const std::string& role = "user") {
    auto j = json({"admin", "add-user", name, "--role", role});
    const std::string file = (data_ / (name + ".token")).string();
    std::string error;
    EXPECT_TRUE(ddl::pki::writeFile(file, j["token"].get<std::string>() + "\n", 0600, &error)) << error;
    return file;
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
  static inline std::string pki_;
  static inline pid_t pid_ = -1;
  static inline std::string address_;
  static inline std::vector<std::unique_ptr<FakeAgent>> agents_;
};

// Every program says its version, the same one. Fails without the coordinator's --version (CLI11: exit 109).
TEST_F(DdlctlTest, VersionOfCoordinatorAndDdlctl) {
  Result ctl_version = runProgram({"ddlctl", "--version"});
  ASSERT_EQ(ctl_version.code, 0) << ctl_version.err;
  ASSERT_EQ(ctl_version.out.rfind("ddlctl ", 0), 0u) << ctl_version.out;
  const std::string version = ctl_version.out.substr(7);
  EXPECT_GT(version.size(), 1u);
  Result coordinator = runProgram({"ddl-coordinator", "--version"});
  EXPECT_EQ(coordinator.code, 0) << coordinator.err;
  EXPECT_EQ(coordinator.out, "ddl-coordinator " + version);
}

// The daemons' flag typos are said as ddlctl's are: the nearest real flag, exit 2, no CLI11 text dump.
TEST_F(DdlctlTest, DaemonFlagTyposNameTheNearestFlag) {
  struct Case {
    std::vector<std::string> argv;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {{"ddl-agent", "--coordinater", "127.0.0.1:1"},
       "ddl-agent: unknown option --coordinater; did you mean --coordinator?"},
      {{"ddl-coordinator", "--listne", "127.0.0.1:0"},
       "ddl-coordinator: unknown option --listne; did you mean --listen?"},
      {{"ddl-coordinator", "init-pki", "/tmp/x", "--nmae", "h"},
       "unknown option --nmae for init-pki; did you mean --name?"},
      {{"ddl-agent", "--virtual-gpus", "two"}, "--virtual-gpus takes a number, got 'two'"},
  };
  for (const Case& c : cases) {
    Result r = runProgram(c.argv);
    EXPECT_EQ(r.code, 2) << c.argv[1] << ": " << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("--help"), std::string::npos) << r.err;
  }
}

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

  // Its usage: in the job (status) and in the day's rollup (usage, as a table and as CSV).
  EXPECT_NE(ctl({"status", id}).out.find("Usage:\n  ATTEMPT"), std::string::npos) << ctl({"status", id}).out;
  auto attempts = json({"status", id})["attempts"];
  ASSERT_EQ(attempts.size(), 1u);
  EXPECT_EQ(attempts[0]["gpus"], 4);
  EXPECT_EQ(attempts[0]["end"], "SUCCEEDED");
  Result usage = ctl({"usage", "--by-account"});
  ASSERT_EQ(usage.code, 0) << usage.err;
  EXPECT_NE(usage.out.find("ACCOUNT  GPU-HOURS"), std::string::npos) << usage.out;
  EXPECT_NE(usage.out.find("\nroot "), std::string::npos) << usage.out;
  EXPECT_NE(usage.out.find("\nTOTAL "), std::string::npos) << usage.out;
  Result csv = ctl({"usage", "-o", "csv", "--since", "1d"});
  ASSERT_EQ(csv.code, 0) << csv.err;
  EXPECT_EQ(csv.out.rfind("day,account,user,gpu_hours,cpu_hours,attempts,jobs,failed,requeued,max_rss_bytes,"
                          "preempted\n,root,",
                          0),
            0u)
      << csv.out;
  EXPECT_EQ(json({"usage"})["rows"][0]["jobs"], "1");  // int64 in JSON is a string
  Result bad = ctl({"list", "-o", "csv"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("-o csv goes with usage only"), std::string::npos) << bad.err;
  EXPECT_EQ(ctl({"usage", "--since", "1d", "--until", "2d"}).code, 2);
}

// An elastic job (--nodes MIN:MAX) that loses a rank goes on without its node and grows back onto it once it
// is free; ddlctl shows the range, each membership change and the GPUs held.
TEST_F(DdlctlTest, AnElasticJobShowsItsMembershipChanges) {
  std::string id = submit({"--nodes", "1:2", "--gpus-per-node", "2", "--", "python3", "train.py"});
  ASSERT_TRUE(reaches(id, "RUNNING"));
  auto job = json({"status", id});
  EXPECT_EQ(job["spec"]["min_nodes"], 1);
  EXPECT_EQ(job["spec"]["nodes"], 2);
  FakeAgent* lost = nullptr;
  for (auto& agent : agents_)
    for (const auto& r : agent->held())
      if (r.job_id() == id && r.rank() == 3) lost = agent.get();
  ASSERT_NE(lost, nullptr);
  ASSERT_TRUE(lost->exitRank(id, 3, 1));
  // Its node's other rank is stopped, and the node, free again, takes two joiners (ranks 4 and 5).
  bool grown = false;
  for (int i = 0; i < 100 && !grown; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const auto& r : lost->held()) grown = grown || (r.job_id() == id && r.rank() == 5);
  }
  ASSERT_TRUE(grown) << ctl({"status", id}).out;
  Result status = ctl({"status", id});
  EXPECT_EQ(json({"status", id})["state"], "RUNNING");
  EXPECT_NE(status.out.find("1 to 2 nodes x 2 GPUs"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("going on without ranks 2, 3: 2 of 4 ranks (elastic, at least 2)"),
            std::string::npos)
      << status.out;
  EXPECT_NE(status.out.find("grown: ranks 4, 5 started on " + lost->node()), std::string::npos) << status.out;
  for (auto& agent : agents_) ASSERT_TRUE(agent->exitAll(id));
  ASSERT_TRUE(reaches(id, "SUCCEEDED")) << ctl({"status", id}).out;
}

TEST_F(DdlctlTest, PendingJobShowsItsReasonAndCancelEndsIt) {
  std::string big = submit({"--nodes", "2", "--gpus-per-node", "2", "--", "sleep", "100"});
  std::string waits = submit({"--gpus", "4", "--", "sleep", "100"});
  ASSERT_TRUE(reaches(big, "RUNNING"));
  // The second submit's reason is "Submitting" until its store write is durable, and "" until a pass has
  // weighed it.
  auto weighed = [&] {
    const auto code = json({"status", waits})["reason_code"];
    return code != "Submitting" && code != "";
  };
  for (int i = 0; i < 100 && !weighed(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto pending = json({"status", waits});
  EXPECT_EQ(pending["state"], "PENDING");
  EXPECT_FALSE(pending["reason"].get<std::string>().empty());
  EXPECT_EQ(pending["reason_code"], "Resources");  // the first job that waits, waiting for GPUs to free
  Result list = ctl({"list"});
  EXPECT_NE(list.out.find("(Resources: " + pending["reason"].get<std::string>().substr(0, 20)),
            std::string::npos)
      << list.out;
  // A job behind it waits for priority; a held one says so.
  const std::string behind = submit({"--gpus", "4", "--", "sleep", "100"});
  const std::string held = submit({"--hold", "--gpus", "1", "--", "sleep", "100"});
  for (int i = 0; i < 100 && json({"status", behind})["reason_code"] != "Priority"; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(json({"status", behind})["reason_code"], "Priority");
  EXPECT_EQ(json({"status", held})["reason_code"], "JobHeldUser");
  ctl({"cancel", behind, held});

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
  // ddlctl knows the job's GPUs: a topology that does not multiply to them is a usage error, before any RPC.
  Result bad_topology = ctl({"submit", "--gpus", "4", "--topology", "3x3", "--", "x"});
  EXPECT_EQ(bad_topology.code, 2) << bad_topology.err;
  EXPECT_NE(bad_topology.err.find("--topology 3x3 has 9 ranks but the job has 4 GPUs"), std::string::npos)
      << bad_topology.err;
  Result bad_verb = ctl({"frobnicate"});
  EXPECT_EQ(bad_verb.code, 2);
  Result unreachable = runProgram(
      {"ddlctl", "--coordinator", "127.0.0.1:1", "--ca", pki_ + "/ca.crt", "--timeout", "2", "list"});
  EXPECT_EQ(unreachable.code, 3);
  EXPECT_NE(unreachable.err.find("cannot reach coordinator at 127.0.0.1:1: connection refused"), std::string::npos)
      << unreachable.err;
  Result from_env = runProgram({"ddlctl", "nodes"}, {"DDL_COORDINATOR=" + address_, "DDL_CA=" + pki_ + "/ca.crt",
                                                     "DDL_TOKEN_FILE=" + pki_ + "/admin.token"});
  EXPECT_EQ(from_env.code, 0) << from_env.err;
}

// What a new user's mistakes print: each says what happened and what to do, with its own exit status, and no
// raw gRPC log line and no "is ddl-coordinator running?" where it is running.
TEST_F(DdlctlTest, MistakesSayWhatHappenedAndWhatToDo) {
  const std::string garbage = (data_ / "garbage-ca.crt").string();
  std::string error;
  ASSERT_TRUE(ddl::pki::writeFile(garbage, "not a certificate\n", 0644, &error)) << error;
  const std::string expired = (data_ / "expired-ca.crt").string();
  {
    auto key = ddl::pki::newPrivateKey(&error);
    ASSERT_TRUE(key) << error;
    const int64_t now = std::time(nullptr);
    auto cert = ddl::pki::makeCertificate({"old-ca", {}, {}, ddl::pki::Usage::kCa}, *key, "", "",
                                          now - 86400 * 10, now - 86400, &error);
    ASSERT_TRUE(cert) << error;
    ASSERT_TRUE(ddl::pki::writeFile(expired, *cert, 0644, &error)) << error;
  }
  const std::string script_dir = (data_ / "scripts").string();
  fs::create_directories(script_dir);
  struct Case {
    const char* what;
    std::vector<std::string> argv;
    int code;
    std::string needle;
  };
  const std::string admin = pki_ + "/admin.token";
  const std::vector<Case> cases = {
      {"--insecure against a TLS coordinator",
       {"ddlctl", "--coordinator", address_, "--insecure", "--timeout", "5", "list"},
       3,
       "drop --insecure"},
      {"a CA file that is no certificate",
       {"ddlctl", "--coordinator", address_, "--ca", garbage, "--token-file", admin, "list"},
       4,
       "is not a CA certificate"},
      {"an expired CA",
       {"ddlctl", "--coordinator", address_, "--ca", expired, "--token-file", admin, "list"},
       4,
       "expired on"},
      {"a token file that is not there",
       {"ddlctl", "--coordinator", address_, "--ca", pki_ + "/ca.crt", "--token-file", "/nonexistent/token",
        "list"},
       4,
       "cannot read the token file /nonexistent/token: No such file or directory"},
      {"a typo in a job script's name",
       {"ddlctl", "--coordinator", address_, "--ca", pki_ + "/ca.crt", "--token-file", admin, "submit",
        "--gpus", "1", script_dir + "/tarin.sh"},
       2,
       "no such file: " + script_dir + "/tarin.sh"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Result r = runProgram(c.argv);
    EXPECT_EQ(r.code, c.code) << r.err;
    EXPECT_NE(r.err.find(c.needle), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("is ddl-coordinator running"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("ssl_transport_security"), std::string::npos) << "raw gRPC log lines:\n" << r.err;
  }
}

// A rank that could not start (the agent's error, exit 127 by convention): wait's line says why, not "exit
// code 127".
TEST_F(DdlctlTest, WaitSaysWhyARankCouldNotStart) {
  const std::string id = submit({"--gpus", "1", "--", "true"});
  {
    ddl::v1::StartRanks start;
    FakeAgent* where = nullptr;
    for (int round = 0; round < 100 && !where; ++round) {  // at most 10 s
      for (auto& a : agents_) {
        if (!where && a->waitStart(id, &start, 50)) where = a.get();
      }
    }
    ASSERT_NE(where, nullptr) << "no agent got the job";
    ASSERT_TRUE(where->exitRank(id, 0, 127, false, "user ddlt-gone does not exist on node " + where->node()));
  }
  Result r = ctl({"wait", id, "--wait-timeout", "20"});
  EXPECT_EQ(r.code, 127) << r.err;
  EXPECT_NE(r.out.find("could not start: user ddlt-gone does not exist on node"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("exit code 127"), std::string::npos) << r.out;
}

// The limits of validateJobSpec reach the user through the real coordinator as exit 1 with the limit named
// and the hostile bytes escaped; list pages through whatever the coordinator answers (one page, or many);
// nodes remove is an admin verb the coordinator answers (refused for an UP node, or UNIMPLEMENTED before its
// side).
TEST_F(DdlctlTest, BoundsPagingAndNodeRemoval) {
  Result long_name = ctl({"submit", "--gpus", "1", "--name", std::string(200, 'n'), "--", "true"});
  EXPECT_EQ(long_name.code, 1) << long_name.err;
  EXPECT_NE(long_name.err.find("the name is 200 bytes; the limit is 128"), std::string::npos)
      << long_name.err;
  Result escape = ctl({"submit", "--gpus", "1", "--name", "a\x1b[2Jb", "--", "true"});
  EXPECT_EQ(escape.code, 1) << escape.err;
  EXPECT_EQ(escape.err.find('\x1b'), std::string::npos) << "the refusal is printed escaped";
  EXPECT_NE(escape.err.find("control character"), std::string::npos) << escape.err;
  std::vector<std::string> huge = {"submit", "--gpus", "1", "--", "echo"};
  for (int i = 0; i < 2000; ++i)
    huge.push_back(std::string(100, 'x'));  // one argument may be at most 128 KiB
  Result huge_argv = ctl(huge);
  EXPECT_EQ(huge_argv.code, 1) << huge_argv.err;
  EXPECT_NE(huge_argv.err.find("the limit is 131072"), std::string::npos) << huge_argv.err;

  const std::string id = submit({"--gpus", "1", "--name", "paged", "--", "true"});
  auto all = json({"list", "--all", "--page-size", "1"});
  bool found = false;
  for (const auto& job : all["jobs"]) found = found || job["id"] == id;
  EXPECT_TRUE(found) << all.dump();
  EXPECT_EQ(all["next_page_token"], "");
  Result text = ctl({"list", "--all", "--page-size", "1"});
  EXPECT_EQ(text.code, 0) << text.err;
  EXPECT_EQ(text.out.rfind("ID ", 0), 0u) << text.out;
  EXPECT_EQ(text.out.find("\nID "), std::string::npos) << "one header for all pages: " << text.out;

  Result remove = ctl({"nodes", "remove", "n2"});
  EXPECT_EQ(remove.code, 1) << remove.err;
  EXPECT_TRUE(ctl({"nodes"}).out.find("n2") != std::string::npos) << "an UP node is not removed";
}

// ---- Security: each test fails if its protection is removed ---------------------------------------------------

TEST_F(DdlctlTest, SecurityPlaintextClientIsRefused) {
  // A plaintext gRPC client gets no answer from the TLS port (and ddlctl itself refuses --insecure elsewhere).
  auto stub = ddl::v1::UserService::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
  ddl::v1::ListNodesResponse resp;
  grpc::Status st = stub->ListNodes(&ctx, {}, &resp);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(resp.nodes_size(), 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
}

TEST_F(DdlctlTest, SecurityCertificatesFromAnotherCaOrExpiredAreRefused) {
  // Another cluster's CA: its node certificate fails the handshake, and ddlctl trusting that CA cannot talk to us.
  const std::string other = (data_ / "other-pki").string();
  ASSERT_EQ(runProgram({"ddl-coordinator", "init-pki", other}).code, 0);
  ASSERT_EQ(runProgram({"ddl-coordinator", "--pki-dir", other, "issue-node", "n3", "--out", (data_ / "n3-other").string()})
                .code,
            0);
  // The foreign node certificate, presented with OUR CA as the trust root (so only the server side can refuse).
  fs::copy_file(pki_ + "/ca.crt", data_ / "n3-other" / "ca.crt", fs::copy_options::overwrite_existing);
  FakeAgent foreign(address_, "n3", 1, {}, (data_ / "n3-other").string());
  EXPECT_NE(foreign.connect(), "");
  Result wrong_ca = runProgram({"ddlctl", "--coordinator", address_, "--ca", other + "/ca.crt", "--token-file",
                                pki_ + "/admin.token", "--timeout", "3", "nodes"});
  EXPECT_EQ(wrong_ca.code, 3) << wrong_ca.err;
  EXPECT_NE(wrong_ca.err.find("TLS handshake failed"), std::string::npos) << wrong_ca.err;

  // An expired certificate from our own CA.
  std::string error;
  auto ca = ddl::pki::readFile(pki_ + "/ca.crt", &error);
  auto ca_key = ddl::pki::readFile(pki_ + "/ca.key", &error);
  ASSERT_TRUE(ca && ca_key) << error;
  auto key = ddl::pki::newPrivateKey(&error);
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  auto cert = ddl::pki::makeCertificate({"n4", {"n4"}, {}, ddl::pki::Usage::kClient}, *key, *ca, *ca_key,
                                        now - 2 * 86400, now - 86400, &error);
  ASSERT_TRUE(cert) << error;
  const fs::path expired = data_ / "n4-expired";
  fs::create_directories(expired);
  ASSERT_TRUE(ddl::pki::writeFile((expired / "ca.crt").string(), *ca, 0644, &error));
  ASSERT_TRUE(ddl::pki::writeFile((expired / "node.crt").string(), *cert, 0644, &error));
  ASSERT_TRUE(ddl::pki::writeFile((expired / "node.key").string(), *key, 0600, &error));
  FakeAgent stale(address_, "n4", 1, {}, expired.string());
  EXPECT_NE(stale.connect(), "");
  auto nodes = json({"nodes"});
  for (const auto& n : nodes["nodes"]) {
    EXPECT_NE(n["name"], "n3");
    EXPECT_NE(n["name"], "n4");
  }
}

TEST_F(DdlctlTest, SecurityANodeCannotSpeakForAnother) {
  // n1's certificate, claiming to be n2: register refused, n2 untouched.
  FakeAgent impostor(address_, "n2", 8, {}, (data_ / "n1").string());
  const std::string error = impostor.connect();
  EXPECT_NE(error.find("cannot speak for node 'n2'"), std::string::npos) << error;
  auto nodes = json({"nodes"});
  ASSERT_EQ(nodes["nodes"].size(), 2u);
  EXPECT_EQ(nodes["nodes"][1]["gpus"].size(), 2u);  // still the real n2's inventory
  // No certificate at all: a TLS client without one is not a node.
  FakeAgent anonymous(address_, "n2", 8, {}, "");
  EXPECT_NE(anonymous.connect(), "");
}

TEST_F(DdlctlTest, SecurityNoTokenOrAWrongOneIsRefused) {
  Result none = runProgram({"ddlctl", "--coordinator", address_, "--ca", pki_ + "/ca.crt", "nodes"},
                           {"HOME=" + data_.string()});
  EXPECT_EQ(none.code, 4) << none.err;
  EXPECT_NE(none.err.find("no token"), std::string::npos) << none.err;
  Result wrong = runProgram({"ddlctl", "--coordinator", address_, "--ca", pki_ + "/ca.crt", "submit", "--gpus", "1",
                             "--", "true"},
                            {"DDL_TOKEN=ddl_0000000000000000000000000000000000000000000000000000000000000000"});
  EXPECT_EQ(wrong.code, 4) << wrong.err;
  EXPECT_NE(wrong.err.find("not valid"), std::string::npos) << wrong.err;
  // An admin verb for a plain user: denied.
  const std::string carol = addUser("carol");
  Result admin_verb = ctl({"admin", "add-user", "mallory"}, carol);
  EXPECT_EQ(admin_verb.code, 5) << admin_verb.err;
  Result drain = ctl({"drain", "n1"}, carol);
  EXPECT_EQ(drain.code, 5) << drain.err;
  Result who = ctl({"whoami"}, carol);
  EXPECT_EQ(who.out, "carol user (token), account root\n");
  // A rotated token: the old one stops working.
  auto rotated = json({"admin", "add-user", "carol", "--rotate"});
  EXPECT_EQ(ctl({"whoami"}, carol).code, 4);
  EXPECT_TRUE(rotated["token"].get<std::string>().rfind("ddl_", 0) == 0);
  // Tokens are stored hashed: the state store never holds one.
  std::string error, users;
  for (const char* f : {"state.db", "state.db-wal"})
    users += ddl::pki::readFile(data_ / f, &error).value_or("");
  EXPECT_EQ(users.find(rotated["token"].get<std::string>()), std::string::npos);
  EXPECT_NE(users.find(ddl::pki::sha256Hex(rotated["token"].get<std::string>())), std::string::npos);
}

TEST_F(DdlctlTest, SecurityAUserTouchesOnlyItsOwnJobsAndAnAdminAnyJob) {
  const std::string alice = addUser("alice"), bob = addUser("bob"), viewer = addUser("vera", "viewer");
  // The job's user is the token's, whatever the request claims ($USER is root here).
  Result submitted = ctl({"submit", "--gpus", "1", "--env", "SECRET=s3", "--", "sleep", "100"}, alice);
  ASSERT_EQ(submitted.code, 0) << submitted.err;
  const std::string id = submitted.out.substr(0, submitted.out.find('\n'));
  ASSERT_TRUE(reaches(id, "RUNNING"));
  EXPECT_EQ(json({"status", id})["spec"]["user"], "alice");

  for (const std::vector<std::string>& verb : std::vector<std::vector<std::string>>{
           {"status", id}, {"logs", id}, {"cancel", id}}) {
    Result r = ctl(verb, bob);
    EXPECT_EQ(r.code, 5) << verb[0] << ": " << r.err;
    EXPECT_NE(r.err.find("belongs to alice"), std::string::npos) << r.err;
  }
  EXPECT_EQ(ctl({"submit", "--gpus", "1", "--", "true"}, viewer).code, 5);
  // Bob's listing shows the job, but not its command or environment.
  Result listed = ctl({"list", "-o", "json"}, bob);
  ASSERT_EQ(listed.code, 0) << listed.err;
  auto jobs = nlohmann::json::parse(listed.out)["jobs"];
  bool seen = false;
  for (const auto& j : jobs) {
    if (j["id"] != id) continue;
    seen = true;
    EXPECT_TRUE(j["spec"]["command"].empty()) << j.dump();
    EXPECT_TRUE(j["spec"]["env"].empty()) << j.dump();
  }
  EXPECT_TRUE(seen);
  EXPECT_EQ(ctl({"status", id}, alice).code, 0);
  // An admin may cancel anyone's job.
  Result cancel = ctl({"cancel", id});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  EXPECT_TRUE(reaches(id, "CANCELLED"));
}

// Accounts through ddlctl: an admin builds the tree and puts a user in it; everyone may list it; a job is
// charged to its user's account, another only at an admin's word.
TEST_F(DdlctlTest, AccountsChargeJobsToTheirUsers) {
  ASSERT_EQ(ctl({"admin", "add-account", "lab", "--share", "2"}).code, 0);
  Result made = ctl({"admin", "add-account", "vision", "--parent", "lab", "--share", "3"});
  ASSERT_EQ(made.code, 0) << made.err;
  EXPECT_EQ(made.out, "made account vision under lab, share 3\n");
  auto added = json({"admin", "add-user", "dora", "--account", "vision"});
  EXPECT_EQ(added["account"], "vision");
  const std::string dora = (data_ / "dora.token").string();
  std::string error;
  ASSERT_TRUE(ddl::pki::writeFile(dora, added["token"].get<std::string>() + "\n", 0600, &error)) << error;
  EXPECT_EQ(ctl({"whoami"}, dora).out, "dora user (token), account vision\n");
  // The tree as anyone sees it: vision has all of lab, which has all of what root gives out.
  Result tree = ctl({"accounts"}, dora);
  ASSERT_EQ(tree.code, 0) << tree.err;
  EXPECT_NE(tree.out.find("\n  lab "), std::string::npos) << tree.out;
  const size_t vision = tree.out.find("\n    vision ");
  ASSERT_NE(vision, std::string::npos) << tree.out;
  const std::string line = tree.out.substr(vision + 1, tree.out.find('\n', vision + 1) - vision - 1);
  std::istringstream cells(line);
  std::string name, share, norm, members;
  cells >> name >> share >> norm >> members;
  EXPECT_EQ(share + " " + norm + " " + members, "3 1.000 1") << tree.out;

  // Limits: set one at a time, shown with the account and the user.
  Result limited = ctl({"admin", "set-limit", "--account", "lab", "--gpus", "8", "--pending", "100"});
  ASSERT_EQ(limited.code, 0) << limited.err;
  EXPECT_EQ(limited.out, "account lab: at most 8 GPUs, 100 pending\n");
  EXPECT_EQ(ctl({"admin", "set-limit", "--account", "lab", "--pending", "0"}).out,
            "account lab: at most 8 GPUs\n");
  EXPECT_EQ(ctl({"admin", "set-limit", "--user", "dora", "--running", "2"}).out,
            "user dora: at most 2 running\n");
  EXPECT_EQ(ctl({"admin", "set-limit", "--account", "lab", "--gpu-hours", "100", "--period", "week"}).out,
            "account lab: at most 8 GPUs, 100 GPU-hours a week\n");
  EXPECT_EQ(ctl({"admin", "set-limit", "--account", "lab", "--gpu-hours", "0"}).out,
            "account lab: at most 8 GPUs\n");
  EXPECT_EQ(ctl({"admin", "set-limit", "--account", "lab", "--gpu-hours", "1", "--period", "fortnight"}).code,
            2);
  EXPECT_NE(ctl({"accounts"}).out.find("at most 8 GPUs"), std::string::npos) << ctl({"accounts"}).out;
  EXPECT_NE(ctl({"admin", "users"}).out.find("dora user vision (at most 2 running)"), std::string::npos);
  EXPECT_EQ(ctl({"admin", "set-limit", "--gpus", "1"}).code, 2);       // neither --account nor --user
  EXPECT_EQ(ctl({"admin", "set-limit", "--account", "lab"}).code, 2);  // no limit given
  EXPECT_EQ(ctl({"admin", "set-limit", "--account", "nowhere", "--gpus", "1"}).code, 1);

  Result job = ctl({"submit", "--hold", "--gpus", "1", "--", "/bin/true"}, dora);
  ASSERT_EQ(job.code, 0) << job.err;
  const std::string id = job.out.substr(0, job.out.find('\n'));
  EXPECT_EQ(json({"status", id})["spec"]["account"], "vision");
  Result other = ctl({"submit", "--hold", "--account", "lab", "--gpus", "1", "--", "/bin/true"}, dora);
  EXPECT_EQ(other.code, 5) << other.err;
  EXPECT_NE(other.err.find("may not charge account lab"), std::string::npos) << other.err;
  const std::string charged = submit({"--hold", "--account", "lab", "--gpus", "1", "--", "/bin/true"});
  EXPECT_EQ(json({"status", charged})["spec"]["account"], "lab");
  Result missing = ctl({"submit", "--hold", "--account", "nowhere", "--gpus", "1", "--", "/bin/true"});
  EXPECT_EQ(missing.code, 1) << missing.err;  // refused: NOT_FOUND
  // Once an admin puts dora in lab too, her jobs may name it; her default stays vision.
  Result joined = ctl({"admin", "user-accounts", "dora", "--add", "lab"});
  ASSERT_EQ(joined.code, 0) << joined.err;
  EXPECT_EQ(joined.out, "user dora: accounts vision (default), lab\n");
  EXPECT_EQ(ctl({"whoami"}, dora).out, "dora user (token), account vision (default), lab\n");
  Result lab_job = ctl({"submit", "--hold", "--account", "lab", "--gpus", "1", "--", "/bin/true"}, dora);
  ASSERT_EQ(lab_job.code, 0) << lab_job.err;
  const std::string in_lab = lab_job.out.substr(0, lab_job.out.find('\n'));
  EXPECT_EQ(json({"status", in_lab})["spec"]["account"], "lab");
  EXPECT_EQ(ctl({"admin", "user-accounts", "dora"}).code, 2);  // nothing to change
  Result leave_default = ctl({"admin", "user-accounts", "dora", "--remove", "vision"});
  EXPECT_EQ(leave_default.code, 1) << leave_default.err;  // refused: FAILED_PRECONDITION
  EXPECT_NE(leave_default.err.find("default"), std::string::npos) << leave_default.err;
  ASSERT_EQ(ctl({"admin", "user-accounts", "dora", "--remove", "lab"}).code, 0);
  ctl({"cancel", id, charged, in_lab});

  // QoS: an admin makes one for lab; dora (in vision, under lab) sees it and may ask for it; a name that is
  // not a QoS is refused naming those there are; a user makes none.
  Result qos = ctl({"admin", "add-qos", "urgent", "--priority", "100", "--preempt", "normal", "--grace", "30",
                    "--accounts", "lab"});
  ASSERT_EQ(qos.code, 0) << qos.err;
  EXPECT_EQ(qos.out.rfind("made QoS urgent\n", 0), 0u) << qos.out;
  Result tiers = ctl({"qos"}, dora);
  ASSERT_EQ(tiers.code, 0) << tiers.err;
  EXPECT_NE(tiers.out.find("\nurgent  100       normal    30.0s  -     lab\n"), std::string::npos)
      << tiers.out;
  Result fast = ctl({"submit", "--hold", "--qos", "urgent", "--gpus", "1", "--", "/bin/true"}, dora);
  ASSERT_EQ(fast.code, 0) << fast.err;
  const std::string urgent = fast.out.substr(0, fast.out.find('\n'));
  EXPECT_EQ(json({"status", urgent})["spec"]["qos"], "urgent");
  Result typo = ctl({"submit", "--hold", "--qos", "urgnet", "--gpus", "1", "--", "/bin/true"}, dora);
  EXPECT_NE(typo.code, 0);
  EXPECT_NE(typo.err.find("there is no QoS 'urgnet' (there are: normal, urgent)"), std::string::npos)
      << typo.err;
  EXPECT_EQ(ctl({"admin", "add-qos", "mine", "--priority", "1"}, dora).code, 5);
  ctl({"cancel", urgent});
  ASSERT_EQ(ctl({"admin", "remove-qos", "urgent"}).code, 0);

  // Only an empty account goes, and only at an admin's word.
  Result refused = ctl({"admin", "remove-account", "vision"});
  EXPECT_NE(refused.code, 0);
  EXPECT_NE(refused.err.find("user dora"), std::string::npos) << refused.err;
  EXPECT_EQ(ctl({"admin", "add-account", "x"}, dora).code, 5);
  ASSERT_EQ(ctl({"admin", "remove-user", "dora"}).code, 0);
  EXPECT_EQ(ctl({"admin", "remove-account", "vision"}).code, 0);
}

TEST_F(DdlctlTest, SecurityJobsOfRootAreRefused) {
  const std::string root = addUser("root");
  Result r = ctl({"submit", "--gpus", "1", "--", "true"}, root);
  EXPECT_EQ(r.code, 5) << r.err;
  EXPECT_NE(r.err.find("allow_root_jobs"), std::string::npos) << r.err;
}

}  // namespace
