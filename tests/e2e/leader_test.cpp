// Several ddl-coordinator processes on one etcd store (issue 30): one leads and serves, the others wait; a
// standby takes over when the leader stops (SIGTERM: it resigns) or dies (SIGKILL: its lease runs out), with
// every acknowledged job there and no job number used twice; a leader cut off from etcd exits (status 75) by
// its own clock before its lease can run out; etcd over TLS with client certificates. Real processes on
// loopback ports; an etcd member started by the test (skipped without the binary). Every wait is bounded.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "../unit/etcd_for_test.h"
#include "common/pki.h"
#include "e2e_helpers.h"

namespace {

namespace fs = std::filesystem;
using ddl::e2e::slurp;
using ddl::e2e::spawn;
using ddl::e2e::waitFor;
using ddl::test_util::EtcdForTest;

class LeaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ddl-leader-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    stop(agent_);
    for (auto& c : coordinators_) stop(c.pid);
    if (HasFailure()) {
      for (size_t i = 0; i < coordinators_.size(); ++i)
        std::cerr << "--- coordinator " << i << "\n" << log(i);
      std::cerr << "--- ddlctl's errors\n"
                << slurp(dir_ / "ctl.err") << "--- agent\n"
                << slurp(dir_ / "agent.log");
    }
    fs::remove_all(dir_);
  }

  // Starts etcd (one member, plaintext unless tls) and says whether it answers; skips without etcd.
  bool startEtcd(const EtcdForTest::Tls& tls = {}) {
    if (std::string why = etcd_.start(1, tls); !why.empty()) {
      skip_ = why;
      return false;
    }
    store_ = "etcd://" + etcd_.endpoint() + "/leader-test/";
    return true;
  }

  // Coordinator i (a new one when i is the count so far), plaintext gRPC on loopback, its state in etcd
  // unless extra names another --store.
  size_t startCoordinator(size_t i, std::vector<std::string> extra = {"--etcd-insecure"}) {
    if (i == coordinators_.size()) {
      coordinators_.push_back({-1, "127.0.0.1:" + std::to_string(EtcdForTest::freePort())});
    }
    const fs::path data = dir_ / ("c" + std::to_string(i));
    fs::remove(data / "coordinator.addr");
    std::vector<std::string> argv = {std::string(DDL_BIN_DIR) + "/ddl-coordinator",
                                     tls_ ? "--pki-dir" : "--insecure",
                                     "--listen",
                                     coordinators_[i].listen,
                                     "--http",
                                     "127.0.0.1:0",
                                     "--data-dir",
                                     data.string(),
                                     "--leader-lease",
                                     "3",
                                     "--allow-root-jobs"};
    if (tls_) argv.insert(argv.begin() + 2, pki());
    argv.insert(argv.end(), extra.begin(), extra.end());
    if (std::find(extra.begin(), extra.end(), "--store") == extra.end()) {
      argv.insert(argv.end(), {"--store", store_});
    }
    coordinators_[i].pid = spawn(argv, dir_ / ("c" + std::to_string(i) + ".log"));
    return i;
  }
  bool serving(size_t i) const { return fs::exists(dir_ / ("c" + std::to_string(i)) / "coordinator.addr"); }
  std::string log(size_t i) const { return slurp(dir_ / ("c" + std::to_string(i) + ".log")); }
  // The exit status of coordinator i once it has exited within ms, else -1.
  int exitStatus(size_t i, int ms) {
    int status = 0;
    if (!waitFor([&] { return waitpid(coordinators_[i].pid, &status, WNOHANG) == coordinators_[i].pid; },
                 ms)) {
      return -1;
    }
    coordinators_[i].pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // A node with one virtual GPU whose agent is given every coordinator's address; true once the leader has it
  // UP.
  bool startAgent() {
    std::string list;
    for (const auto& c : coordinators_) list += (list.empty() ? "" : ",") + c.listen;
    std::vector<std::string> argv = {std::string(DDL_BIN_DIR) + "/ddl-agent",
                                     "--insecure",
                                     "--coordinator",
                                     list,
                                     "--node",
                                     "n1",
                                     "--address",
                                     "127.0.0.1",
                                     "--virtual-gpus",
                                     "1",
                                     "--force-virtual",
                                     "--data-dir",
                                     (dir_ / "n1").string()};
    if (tls_)
      argv.insert(argv.begin() + 1, {"--pki-dir", (dir_ / "n1-pki").string(), "--stop-ranks-on-exit"});
    if (tls_) argv.erase(std::find(argv.begin(), argv.end(), "--insecure"));
    agent_ = spawn(argv, dir_ / "agent.log");
    return nodeUp();
  }
  bool nodeUp() {
    return waitFor([&] { return ctl("nodes").find(" UP") != std::string::npos; }, 20000);
  }

  // ddlctl against every coordinator's address, as a user would give them, as a shell command's start.
  // With TLS the admin's token unless token_file names another user's.
  std::string ctlCommand(const std::string& token_file = "") const {
    std::string list;
    for (const auto& c : coordinators_) list += (list.empty() ? "" : ",") + c.listen;
    return std::string(DDL_BIN_DIR) + "/ddlctl " +
           (tls_ ? "--ca " + pki() + "/ca.crt --token-file " +
                       (token_file.empty() ? pki() + "/admin.token" : token_file)
                 : "--insecure") +
           " --timeout 5 --coordinator " + list;
  }
  // ddlctl's stdout, or "" when it failed.
  std::string ctl(const std::string& words, const std::string& token_file = "") {
    const std::string out = (dir_ / "ctl.out").string();
    const std::string cmd =
        ctlCommand(token_file) + " " + words + " > " + out + " 2>> " + (dir_ / "ctl.err").string();
    if (std::system(cmd.c_str()) != 0) return "";
    std::string text = slurp(out);
    text.erase(text.find_last_not_of("\n ") + 1);
    return text;
  }
  // Submits a job that stays PENDING (held); its id, or "".
  std::string submit() { return ctl("submit --hold --gpus 1 -- /bin/true"); }

  static void stop(pid_t& pid) { ddl::e2e::stopProcess(pid); }

  // gRPC over TLS from here on (coordinators, agent, ddlctl): a cluster PKI whose first admin is root (its
  // jobs run as root: --allow-root-jobs) and the agent's node certificate.
  bool useTls() {
    const std::string bin = std::string(DDL_BIN_DIR) + "/ddl-coordinator";
    if (ddl::e2e::runToEnd({bin, "init-pki", pki(), "--name", "127.0.0.1", "--admin", "root"},
                           dir_ / "pki.log") != 0 ||
        ddl::e2e::runToEnd({bin, "--pki-dir", pki(), "issue-node", "n1", "--out", (dir_ / "n1-pki").string()},
                           dir_ / "pki.log") != 0) {
      return false;
    }
    tls_ = true;
    return true;
  }
  std::string pki() const { return (dir_ / "pki").string(); }

  // Over TLS, on etcd: coordinator 0 leads, coordinator 1 stands by. "" or what went wrong.
  std::string startLeaderAndStandbyOverTls(const std::vector<std::string>& extra = {"--etcd-insecure"}) {
    if (!useTls()) return "init-pki failed: " + slurp(dir_ / "pki.log");
    startCoordinator(0, extra);
    if (!waitFor([&] { return serving(0); }, 30000)) return "coordinator 0 never led:\n" + log(0);
    startCoordinator(1, extra);
    if (!waitFor([&] { return log(1).find("standby: ") != std::string::npos; }, 15000))
      return "coordinator 1 never stood by:\n" + log(1);
    return "";
  }

  struct Coordinator {
    pid_t pid;
    std::string listen;
  };
  fs::path dir_;
  pid_t agent_ = -1;
  EtcdForTest etcd_;
  std::string store_, skip_;
  std::vector<Coordinator> coordinators_;
  bool tls_ = false;
};

TEST_F(LeaderTest, AStandbyTakesOverWhenTheLeaderStopsOrDiesAndNothingIsLost) {
  if (!startEtcd()) GTEST_SKIP() << skip_;
  startCoordinator(0);
  ASSERT_TRUE(waitFor([&] { return serving(0); }, 30000)) << "the first coordinator never led";
  startCoordinator(1);
  ASSERT_TRUE(waitFor(
      [&] { return log(1).find("standby: " + coordinators_[0].listen + " leads") != std::string::npos; },
      15000));
  EXPECT_FALSE(serving(1)) << "a standby must not serve";
  // ...but its dashboard answers: Prometheus scrapes every coordinator, and each says whether it leads.
  const std::string standby_http = slurp(dir_ / "c1" / "coordinator.http");
  ASSERT_FALSE(standby_http.empty()) << log(1);
  const std::string metrics = ddl::e2e::httpGet(standby_http.substr(0, standby_http.find('\n')), "/metrics");
  EXPECT_NE(metrics.find("200 OK"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("ddl_coordinator_leader 0"), std::string::npos) << metrics;
  EXPECT_EQ(metrics.find("ddl_jobs"), std::string::npos) << "a standby has no cluster to tell of:\n"
                                                         << metrics;
  const std::string health = ddl::e2e::httpGet(standby_http.substr(0, standby_http.find('\n')), "/healthz");
  EXPECT_NE(health.find("503"), std::string::npos) << health;
  EXPECT_NE(health.find("standby: " + coordinators_[0].listen + " leads"), std::string::npos) << health;
  const std::string leader_http = slurp(dir_ / "c0" / "coordinator.http");
  EXPECT_NE(ddl::e2e::httpGet(leader_http.substr(0, leader_http.find('\n')), "/metrics")
                .find("ddl_coordinator_leader 1"),
            std::string::npos);
  ASSERT_TRUE(startAgent()) << "the agent did not find the leader";
  const std::string first = submit();
  ASSERT_EQ(first, "j-000001");

  // SIGTERM: the leader resigns, the standby leads with the job there.
  stop(coordinators_[0].pid);
  ASSERT_TRUE(waitFor([&] { return serving(1); }, 15000)) << "the standby did not take over";
  EXPECT_NE(log(0).find("stopped"), std::string::npos);
  startCoordinator(0);  // back, as a standby
  EXPECT_TRUE(nodeUp()) << "the agent did not follow the new leader";
  EXPECT_NE(ctl("list").find(first), std::string::npos) << "the acknowledged job is lost";
  const std::string second = submit();
  EXPECT_EQ(second, "j-000002") << "a job number used twice, or the submit failed";

  // SIGKILL: the lease runs out, the other one leads.
  kill(coordinators_[1].pid, SIGKILL);
  EXPECT_EQ(exitStatus(1, 5000), 128 + SIGKILL);
  ASSERT_TRUE(waitFor([&] { return serving(0); }, 20000)) << "no takeover after the leader died";
  EXPECT_TRUE(nodeUp()) << "the agent did not follow the new leader";
  const std::string list = ctl("list");
  EXPECT_NE(list.find(first), std::string::npos) << list;
  EXPECT_NE(list.find(second), std::string::npos) << list;
  EXPECT_EQ(submit(), "j-000003");
}

TEST_F(LeaderTest, ALeaderCutOffFromEtcdExitsBeforeItsLeaseRunsOut) {
  if (!startEtcd()) GTEST_SKIP() << skip_;
  startCoordinator(0);
  ASSERT_TRUE(waitFor([&] { return serving(0); }, 30000));
  // etcd frozen: no renewal answers. The leader must give up by its own clock, before its 3 s lease ends.
  ::kill(etcd_.pid(0), SIGSTOP);
  const int status = exitStatus(0, 20000);
  ::kill(etcd_.pid(0), SIGCONT);
  ASSERT_EQ(status, 75) << "the leader kept running without its lease";
  std::smatch m;
  const std::string text = log(0);
  ASSERT_TRUE(
      std::regex_search(text, m, std::regex("cannot renew the leader's lease for ([0-9]+) ms of its 3000")))
      << text;
  EXPECT_LT(std::stoi(m[1]), 3000) << "it stopped after its lease could have run out";
  EXPECT_FALSE(serving(0)) << "its address file outlived it";
}

TEST_F(LeaderTest, ASqliteStateMigratesToEtcd) {
  if (!startEtcd()) GTEST_SKIP() << skip_;
  // One coordinator on SQLite, with a node and two jobs.
  startCoordinator(0, {"--store", "sqlite"});
  ASSERT_TRUE(waitFor([&] { return serving(0); }, 30000));
  ASSERT_TRUE(startAgent());
  ASSERT_EQ(submit(), "j-000001");
  ASSERT_EQ(submit(), "j-000002");
  stop(agent_);
  stop(coordinators_[0].pid);
  const std::string bin = std::string(DDL_BIN_DIR) + "/ddl-coordinator";
  const std::string data = (dir_ / "c0").string();
  ASSERT_EQ(
      ddl::e2e::runToEnd({bin, "migrate-to-etcd", "--data-dir", data, "--store", store_, "--etcd-insecure"},
                         dir_ / "migrate.log"),
      0)
      << slurp(dir_ / "migrate.log");
  EXPECT_NE(slurp(dir_ / "migrate.log").find("copied 2 jobs, 1 nodes and 0 entries"), std::string::npos)
      << slurp(dir_ / "migrate.log");
  EXPECT_NE(slurp(dir_ / "migrate.log").find("job numbers go on after 2"), std::string::npos)
      << slurp(dir_ / "migrate.log");
  // Only into an empty prefix: a second copy is refused.
  EXPECT_EQ(
      ddl::e2e::runToEnd({bin, "migrate-to-etcd", "--data-dir", data, "--store", store_, "--etcd-insecure"},
                         dir_ / "again.log"),
      1);
  EXPECT_NE(slurp(dir_ / "again.log").find("holds a state already"), std::string::npos)
      << slurp(dir_ / "again.log");

  // A coordinator on etcd has both jobs and the node, and numbers on.
  startCoordinator(0);
  ASSERT_TRUE(waitFor([&] { return serving(0); }, 30000)) << log(0);
  const std::string list = ctl("list");
  EXPECT_NE(list.find("j-000001"), std::string::npos) << list;
  EXPECT_NE(list.find("j-000002"), std::string::npos) << list;
  EXPECT_NE(ctl("nodes").find("n1"), std::string::npos);
  ASSERT_TRUE(startAgent());
  EXPECT_EQ(submit(), "j-000003");
}

TEST_F(LeaderTest, EtcdOverTlsWithAClientCertificate) {
  // A CA, etcd's server certificate for 127.0.0.1 and a client certificate, all from ddl's own PKI code.
  std::string error;
  const auto now = static_cast<int64_t>(std::time(nullptr));
  auto write = [&](const std::string& name, const std::string& pem) {
    ASSERT_TRUE(ddl::pki::writeFile((dir_ / name).string(), pem, 0600, &error)) << error;
  };
  auto ca_key = ddl::pki::newPrivateKey(&error);
  ASSERT_TRUE(ca_key) << error;
  auto ca = ddl::pki::makeCertificate({"etcd-ca", {}, {}, ddl::pki::Usage::kCa}, *ca_key, "", "", now - 60,
                                      now + 86400, &error);
  ASSERT_TRUE(ca) << error;
  auto server_key = ddl::pki::newPrivateKey(&error);
  auto server = ddl::pki::makeCertificate({"etcd", {"localhost"}, {"127.0.0.1"}, ddl::pki::Usage::kServer},
                                          *server_key, *ca, *ca_key, now - 60, now + 86400, &error);
  ASSERT_TRUE(server) << error;
  auto client_key = ddl::pki::newPrivateKey(&error);
  auto client = ddl::pki::makeCertificate({"ddl-coordinator", {}, {}, ddl::pki::Usage::kClient}, *client_key,
                                          *ca, *ca_key, now - 60, now + 86400, &error);
  ASSERT_TRUE(client) << error;
  write("ca.crt", *ca);
  write("etcd.crt", *server);
  write("etcd.key", *server_key);
  write("client.crt", *client);
  write("client.key", *client_key);
  if (!startEtcd({(dir_ / "ca.crt").string(), (dir_ / "etcd.crt").string(), (dir_ / "etcd.key").string()})) {
    GTEST_SKIP() << skip_;
  }
  const std::vector<std::string> tls = {"--etcd-ca",   (dir_ / "ca.crt").string(),
                                        "--etcd-cert", (dir_ / "client.crt").string(),
                                        "--etcd-key",  (dir_ / "client.key").string()};
  startCoordinator(0, tls);
  ASSERT_TRUE(waitFor([&] { return serving(0); }, 30000)) << "no lead over TLS";
  ASSERT_TRUE(startAgent());
  EXPECT_EQ(submit(), "j-000001");

  // Without the client certificate etcd refuses the connection, and so it does a plaintext coordinator: each
  // says it cannot reach etcd, keeps trying (as a standby started before etcd does) and serves nothing.
  startCoordinator(1, {"--etcd-ca", (dir_ / "ca.crt").string()});
  startCoordinator(2);
  for (size_t i : {1, 2}) {
    EXPECT_TRUE(waitFor([&] { return log(i).find("cannot reach etcd") != std::string::npos; }, 30000))
        << log(i);
    EXPECT_FALSE(serving(i));
  }
}

// Issue 41: users, accounts and join tokens live in etcd, not in one coordinator's users.json or memory. A
// user added on the leader works after a failover (SIGKILL: no resignation), one removed stays removed, an
// account made there is there, and a join token made before the failover is good after it, once.
TEST_F(LeaderTest, UsersAccountsAndJoinTokensOutliveAFailover) {
  if (!startEtcd()) GTEST_SKIP() << skip_;
  ASSERT_EQ(startLeaderAndStandbyOverTls({"--etcd-insecure", "--http-auth"}), "");
  EXPECT_NE(log(0).find("imported 1 users"), std::string::npos) << log(0);
  ASSERT_NE(ctl("admin add-account physics --share 2"), "");
  // A token per user, in a file of its own.
  auto addUser = [&](const std::string& name) {
    const std::string out = ctl("admin add-user " + name + " --account physics");
    const std::string token = out.substr(out.rfind("ddl_"), 68);
    const fs::path file = dir_ / (name + ".token");
    std::string error;
    EXPECT_TRUE(ddl::pki::writeFile(file.string(), token + "\n", 0600, &error)) << error << out;
    return file.string();
  };
  const std::string alice = addUser("alice"), bob = addUser("bob");
  ASSERT_NE(ctl("admin remove-user bob"), "");
  // The standby's dashboard reads the users from the store, not from users.json: alice's token, made with
  // ddlctl on the leader, opens its /metrics within a few seconds; bob's, removed, does not.
  const std::string standby_http = slurp(dir_ / "c1" / "coordinator.http");
  const std::string standby = standby_http.substr(0, standby_http.find('\n'));
  auto tokenIn = [](const std::string& file) {
    const std::string text = slurp(file);
    return text.substr(0, text.find('\n'));
  };
  EXPECT_TRUE(waitFor(
      [&] {
        return ddl::e2e::httpGet(standby, "/metrics", tokenIn(alice)).find(" 200 ") != std::string::npos;
      },
      15000))
      << ddl::e2e::httpGet(standby, "/metrics", tokenIn(alice)) << log(1);
  EXPECT_EQ(ddl::e2e::httpGet(standby, "/metrics", tokenIn(bob)).find(" 200 "), std::string::npos);
  const std::string join = ctl("admin join-token n9");
  const std::string join_token = join.substr(join.rfind("ddlj_"));
  ASSERT_EQ(join_token.size(), 69u) << join;

  kill(coordinators_[0].pid, SIGKILL);
  EXPECT_EQ(exitStatus(0, 5000), 128 + SIGKILL);
  ASSERT_TRUE(waitFor([&] { return serving(1); }, 20000)) << "no takeover after the leader died";
  EXPECT_EQ(log(1).find("imported"), std::string::npos) << "users.json was imported twice:\n" << log(1);
  // As each user would call, with its own token.
  EXPECT_EQ(ctl("whoami", alice), "alice user (token), account physics");
  EXPECT_EQ(ctl("whoami", bob), "") << "a removed user is back";
  EXPECT_NE(ctl("accounts").find("physics"), std::string::npos) << ctl("accounts");
  // The join token made on the old leader admits n9 on the new one, once.
  const std::string agent = std::string(DDL_BIN_DIR) + "/ddl-agent";
  const std::string token_file = (dir_ / "join.token").string();
  std::string error;
  ASSERT_TRUE(ddl::pki::writeFile(token_file, join_token + "\n", 0600, &error)) << error;
  const std::string ca_sha256 = join.substr(join.find("--ca-sha256 ") + 12, 64);
  auto joined = [&](const std::string& out) {
    return ddl::e2e::runToEnd(
        {agent, "--node", "n9", "--coordinator", coordinators_[1].listen, "--pki-dir",
         (dir_ / "n9-pki").string(), "join", "--ca-sha256", ca_sha256, "--token-file", token_file},
        dir_ / out);
  };
  EXPECT_EQ(joined("join1.log"), 0) << slurp(dir_ / "join1.log");
  EXPECT_TRUE(fs::exists(dir_ / "n9-pki" / "node.crt"));
  EXPECT_NE(joined("join2.log"), 0) << "a join token worked twice";
  EXPECT_NE(slurp(dir_ / "join2.log").find("unknown or used join token"), std::string::npos)
      << slurp(dir_ / "join2.log");
}

// Issue 39: what a user waiting on a job meets when the leader changes: submit --wait, wait and logs -f over
// TLS ride out five leader changes (SIGKILL and SIGTERM in turn), each on a fresh connection to the new
// leader (the old channel's handshake was never driven), and end with the job's true result and its whole
// output. How soon each is back after a fresh call would be is bench/failover.py --waiters' figure, not
// asserted here.
TEST_F(LeaderTest, WaitersRideOutLeaderChangesOverTls) {
  if (!startEtcd()) GTEST_SKIP() << skip_;
  ASSERT_EQ(startLeaderAndStandbyOverTls(), "");
  ASSERT_TRUE(startAgent()) << slurp(dir_ / "agent.log") << slurp(dir_ / "ctl.err");
  const fs::path wait_out = dir_ / "submit-wait.out", logs_out = dir_ / "logs.out",
                 waited_out = dir_ / "wait.out";
  const pid_t submitter = spawn({"/bin/sh", "-c",
                                 ctlCommand() + " submit --wait --gpus 1 -- /bin/sh -c "
                                                "'for i in $(seq 1 40); do echo tick $i; sleep 1; done'"},
                                wait_out);
  const std::string id = ddl::e2e::submittedId(wait_out, 20000);
  ASSERT_FALSE(id.empty()) << slurp(wait_out);
  ASSERT_TRUE(waitFor([&] { return ctl("status " + id).find("RUNNING") != std::string::npos; }, 30000));
  const pid_t follower = spawn({"/bin/sh", "-c", ctlCommand() + " logs -f " + id}, logs_out);
  const pid_t waiter = spawn({"/bin/sh", "-c", ctlCommand() + " wait " + id}, waited_out);
  for (int change = 0; change < 5; ++change) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    const size_t leader = serving(0) ? 0 : 1, standby = 1 - leader;
    if (change % 2 == 0) {
      kill(coordinators_[leader].pid, SIGKILL);
      exitStatus(leader, 5000);
    } else {
      stop(coordinators_[leader].pid);  // SIGTERM: it resigns, the calls in flight are cut
    }
    ASSERT_TRUE(waitFor([&] { return serving(standby); }, 20000)) << "no takeover at change " << change;
    startCoordinator(leader);  // back, as a standby
  }
  int status = -1;
  auto ended = [&](pid_t pid) {
    return waitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 120000) && WIFEXITED(status)
               ? WEXITSTATUS(status)
               : -1;
  };
  EXPECT_EQ(ended(submitter), 0) << slurp(wait_out);
  EXPECT_EQ(ended(waiter), 0) << slurp(waited_out);
  EXPECT_EQ(ended(follower), 0) << slurp(logs_out);
  for (const fs::path& out : {wait_out, waited_out}) {
    const std::string text = slurp(out);
    EXPECT_NE(text.find("lost the coordinator"), std::string::npos) << text;
    EXPECT_NE(text.find("answers again"), std::string::npos) << text;
    EXPECT_NE(text.find(id + " SUCCEEDED"), std::string::npos) << text;
    EXPECT_EQ(text.find("CANCELLED"), std::string::npos) << text;
  }
  const std::string followed = slurp(logs_out);
  for (int i = 1; i <= 40; ++i) {
    EXPECT_NE(followed.find("tick " + std::to_string(i) + "\n"), std::string::npos) << i << ":\n" << followed;
  }
  EXPECT_EQ(followed.find("Handshake"), std::string::npos) << "gRPC's own log lines:\n" << followed;
}

}  // namespace
