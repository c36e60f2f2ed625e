// End to end on this machine: a real ddl-coordinator and two real ddl-agents (two virtual GPUs each) as
// processes on 127.0.0.1, jobs submitted through the UserService (and ddlctl), ranks run as real processes.
// Everything runs secure, as on a cluster: a PKI made by init-pki per test, agents with node certificates
// (mutual TLS), users with tokens. Most jobs here are root's (the coordinator runs with --allow-root-jobs) because
// their programs live in the build tree, which another account may not be able to reach; the tests of running as
// the submitting user run system programs only.
// Every wait is bounded; every process started here is stopped at the end of each test.
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "ddl/tls.h"
#include "ddl/v1/ddl.grpc.pb.h"
#include "e2e_helpers.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

using ddl::e2e::processWithMarker;
using ddl::e2e::slurp;
using ddl::e2e::spawn;
using ddl::e2e::waitFor;

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ddl-e2e-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    ASSERT_EQ(run({std::string(DDL_BIN_DIR) + "/ddl-coordinator", "init-pki", pki()}), 0) << slurp(dir_ / "run.log");
    for (const char* node : {"n1", "n2"}) {
      ASSERT_EQ(run({std::string(DDL_BIN_DIR) + "/ddl-coordinator", "--pki-dir", pki(), "issue-node", node, "--out",
                     (dir_ / (std::string(node) + "-pki")).string()}),
                0)
          << slurp(dir_ / "run.log");
    }
    admin_token_ = slurp(dir_ / "pki" / "admin.token");
    admin_token_.erase(admin_token_.find_last_not_of("\n") + 1);
    startCoordinator("127.0.0.1:0");
    if (HasFatalFailure()) return;
    root_token_ = addUser("root");
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
    coordinator_ = spawn({std::string(DDL_BIN_DIR) + "/ddl-coordinator", "--listen", listen, "--http", "127.0.0.1:0",
                          "--data-dir", (dir_ / "coordinator").string(), "--heartbeat-grace", "3", "--pki-dir", pki(),
                          "--allow-root-jobs", "--config", tlsRefreshConfig()},
                         dir_ / "coordinator.log");
    ASSERT_TRUE(waitFor([&] { return fs::exists(dir_ / "coordinator" / "coordinator.addr"); }, 10000))
        << slurp(dir_ / "coordinator.log");
    std::ifstream in(dir_ / "coordinator" / "coordinator.addr");
    std::getline(in, address_);
    grpc::ChannelArguments args;
    ddl::tls::addChannelArgs(&args);
    user_ = ddl::v1::UserService::NewStub(
        grpc::CreateCustomChannel(address_, ddl::tls::channelCredentials({pki() + "/ca.crt", "", ""}), args));
  }
  std::string pki() const { return (dir_ / "pki").string(); }
  // Certificate files re-read every second (default 60), so the rotation test need not wait long.
  std::string tlsRefreshConfig() const {
    const fs::path path = dir_ / "tls-refresh.json";
    if (!fs::exists(path)) std::ofstream(path) << "{\"tls_refresh_s\": 1}\n";
    return path.string();
  }
  // Runs a program to its end (bounded by its own work: init-pki, issue-node, ddlctl); its output goes to run.log.
  int run(const std::vector<std::string>& argv) { return ddl::e2e::runToEnd(argv, dir_ / "run.log"); }
  // ddlctl with the cluster's CA and a token (the admin's by default), as a shell command prefix.
  std::string ctl(const std::string& token_file = "") const {
    return std::string(DDL_BIN_DIR) + "/ddlctl --coordinator " + address_ + " --ca " + pki() + "/ca.crt --token-file " +
           (token_file.empty() ? pki() + "/admin.token" : token_file);
  }
  // A ddl user `name` made by the admin; returns its token (also written to DIR/NAME.token).
  std::string addUser(const std::string& name) {
    const std::string out = (dir_ / (name + ".json")).string();
    EXPECT_EQ(std::system((ctl() + " admin add-user " + name + " -o json > " + out).c_str()), 0);
    const std::string text = slurp(out);
    const size_t at = text.find("\"token\":\"");
    if (at == std::string::npos) return "";
    const std::string token = text.substr(at + 9, text.find('"', at + 9) - at - 9);
    std::ofstream(dir_ / (name + ".token")) << token << "\n";
    return token;
  }
  // Calls are the admin's (who sees every job), submits root's unless another token is given.
  void authorize(grpc::ClientContext* ctx, const std::string& token = "") const {
    ctx->AddMetadata("authorization", "Bearer " + (token.empty() ? admin_token_ : token));
  }
  // stop_ranks_on_exit: the tests' agents take their ranks down with them (nothing outlives a test), except
  // where a test restarts an agent under a running job.
  // `gpus`: how the agent finds its GPUs (2 virtual ones by default); `config`: its settings file.
  void startAgent(int i, bool stop_ranks_on_exit = true,
                  const std::vector<std::string>& gpus = {"--virtual-gpus", "2", "--force-virtual"},
                  const std::string& config = "") {
    const std::string node = "n" + std::to_string(i);
    const std::string ports = i == 1
                                  ? std::to_string(portBase()) + "-" + std::to_string(portBase() + 99)
                                  : std::to_string(portBase() + 100) + "-" + std::to_string(portBase() + 199);
    std::vector<std::string> argv = {std::string(DDL_BIN_DIR) + "/ddl-agent",
                                     "--coordinator",
                                     address_,
                                     "--node",
                                     node,
                                     "--address",
                                     "127.0.0.1",
                                     "--labels",
                                     "switch=s1",
                                     "--data-dir",
                                     (dir_ / node).string(),
                                     "--port-range",
                                     ports,
                                     "--pki-dir",
                                     (dir_ / (node + "-pki")).string(),
                                     "--config",
                                     config.empty() ? tlsRefreshConfig() : config};
    argv.insert(argv.end(), gpus.begin(), gpus.end());
    if (stop_ranks_on_exit) argv.push_back("--stop-ranks-on-exit");
    agents_[node] = spawn(argv, dir_ / ("agent-" + node + ".log"));
  }
  static void stop(pid_t& pid) { ddl::e2e::stopProcess(pid); }
  // The agents' rendezvous ports: n1 [base, base + 99], n2 [base + 100, base + 199], in 20000-29399 (below
  // the agents' default 29500-29999 that other tests' agents use, and Linux's ephemeral ports) and apart for
  // each test process, so that tests run side by side (ctest -j) do not root their jobs on one port (the
  // coordinator picks the same one for each cluster's first job).
  static int portBase() { return 20000 + static_cast<int>(getpid() % 47) * 200; }
  // `ddlctl submit ARGS` with root's token; the job's id.
  std::string submitAsRoot(const std::string& args) {
    const std::string out = (dir_ / "submit.txt").string();
    EXPECT_EQ(std::system((ctl((dir_ / "root.token").string()) + " submit " + args + " > " + out).c_str()),
              0);
    std::string id = slurp(out);
    id.erase(id.find_last_not_of("\n") + 1);
    return id;
  }

  int upNodes() {
    if (!user_) return -1;
    ddl::v1::ListNodesResponse resp;
    grpc::ClientContext ctx;
    authorize(&ctx);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    if (!user_->ListNodes(&ctx, {}, &resp).ok()) return -1;
    int up = 0;
    for (const auto& n : resp.nodes()) up += n.state() == "UP" && n.connected();
    return up;
  }
  std::string submit(int nodes, int gpus_per_node, std::vector<std::string> command, const std::string& token = "") {
    ddl::v1::SubmitRequest req;
    auto* s = req.mutable_spec();
    s->set_nodes(nodes);
    s->set_gpus_per_node(gpus_per_node);
    for (auto& a : command) s->add_command(a);
    ddl::v1::SubmitResponse resp;
    grpc::ClientContext ctx;
    authorize(&ctx, token.empty() ? root_token_ : token);
    grpc::Status st = user_->Submit(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp.job().id();
  }
  ddl::v1::Job job(const std::string& id) {
    ddl::v1::GetJobRequest req;
    req.set_id(id);
    ddl::v1::Job out;
    grpc::ClientContext ctx;
    authorize(&ctx);
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
  std::string admin_token_, root_token_;
};

// A throwaway account of this machine (useradd), removed when the object goes; empty name where that cannot be
// done (not root, no useradd), with the reason in why().
class ScratchAccount {
 public:
  ScratchAccount() {
    if (geteuid() != 0) {
      why_ = "not root: cannot create accounts, and a non-root agent runs every rank as itself";
      return;
    }
    if (std::system("command -v useradd >/dev/null && command -v userdel >/dev/null") != 0) {
      why_ = "useradd/userdel not installed (package passwd)";
      return;
    }
    const std::string name = "ddlt" + std::to_string(getpid() % 1000000);
    if (std::system(("useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin " + name +
                     " 2>/dev/null").c_str()) != 0) {
      why_ = "useradd " + name + " failed";
      return;
    }
    name_ = name;
  }
  ~ScratchAccount() {
    if (!name_.empty()) std::system(("userdel " + name_ + " 2>/dev/null").c_str());
  }
  const std::string& name() const { return name_; }
  const std::string& why() const { return why_; }

 private:
  std::string name_, why_;
};

// The submitting user's account runs the ranks: uid, gid, groups, HOME and USER are its own on the node, and
// the rank's log belongs to it (0600).
TEST_F(ClusterTest, RanksRunAsTheSubmittingUser) {
  ScratchAccount account;
  if (account.name().empty()) GTEST_SKIP() << account.why();
  const std::string token = addUser(account.name());
  std::string id = submit(1, 1, {"/bin/sh", "-c", "echo uid=$(id -u) gid=$(id -g) groups=$(id -G) user=$USER home=$HOME"},
                          token);
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 30000)) << job(id).DebugString();
  passwd* pw = getpwnam(account.name().c_str());
  ASSERT_NE(pw, nullptr);
  const fs::path log = dir_ / job(id).allocation(0).node() / "logs" / id / "attempt-1" / "rank-0.log";
  const std::string text = slurp(log);
  EXPECT_NE(text.find("uid=" + std::to_string(pw->pw_uid) + " gid=" + std::to_string(pw->pw_gid) + " groups=" +
                      std::to_string(pw->pw_gid) + " user=" + account.name() + " home=/nonexistent"),
            std::string::npos)
      << text;
  struct stat st {};
  ASSERT_EQ(stat(log.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, pw->pw_uid);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // Another user cannot read those logs through the coordinator; the owner can.
  const std::string other = addUser("ddltother");
  (void)other;
  EXPECT_NE(std::system((ctl((dir_ / "ddltother.token").string()) + " logs " + id + " 2>/dev/null >/dev/null").c_str()), 0);
  EXPECT_EQ(std::system((ctl((dir_ / (account.name() + ".token")).string()) + " logs " + id + " >/dev/null").c_str()), 0);

  // A libddl job of that user: its telemetry still reaches the agents (whose socket the ranks, no longer root,
  // must be able to write to). Only where the account can reach ddl-bench in the build tree.
  bool reachable = true;
  for (fs::path p = fs::path(DDL_BIN_DIR); p != p.root_path() && !p.empty(); p = p.parent_path()) {
    struct stat dir {};
    reachable = reachable && stat(p.c_str(), &dir) == 0 && (dir.st_mode & S_IXOTH);
  }
  if (!reachable) GTEST_SKIP() << DDL_BIN_DIR << " is not reachable by other accounts: no libddl job as " << account.name();
  std::string bench = submit(2, 2, {std::string(DDL_BIN_DIR) + "/ddl-bench", "-b", "64K", "-e", "64K", "-n", "1000000",
                                    "-w", "1", "-c", "0"},
                             token);
  ASSERT_TRUE(reaches(bench, ddl::v1::RUNNING, 30000)) << job(bench).DebugString();
  EXPECT_TRUE(waitFor(
      [&] {
        auto j = job(bench);
        if (j.ranks_size() != 4) return false;
        for (const auto& r : j.ranks()) {
          if (r.progress().collectives() == 0) return false;
        }
        return true;
      },
      30000))
      << job(bench).DebugString();
  ddl::v1::CancelJobRequest cancel;
  cancel.set_id(bench);
  ddl::v1::Job out;
  grpc::ClientContext ctx;
  authorize(&ctx);
  EXPECT_TRUE(user_->CancelJob(&ctx, cancel, &out).ok());
}

// A user the node does not know: the ranks cannot start, and the job says why.
TEST_F(ClusterTest, AUserUnknownOnTheNodeFailsTheJobWithTheReason) {
  if (geteuid() != 0) GTEST_SKIP() << "not root: a non-root agent runs every rank as itself";
  const std::string token = addUser("ddlt-nosuchuser");
  std::string id = submit(1, 1, {"/bin/true"}, token);
  ASSERT_TRUE(reaches(id, ddl::v1::FAILED, 30000)) << job(id).DebugString();
  EXPECT_NE(job(id).reason().find("does not exist on node"), std::string::npos) << job(id).DebugString();
}

// A stranger that connects to a job's rendezvous port while the ranks meet is refused (it does not hold the
// job's DDL_JOB_SECRET), and the job goes on to succeed.
TEST_F(ClusterTest, AStrangerOnTheRendezvousPortIsRefusedAndTheJobSucceeds) {
  const std::string gate = (dir_ / "rendezvous-gate").string();
  // Rank 0 opens the store and waits; the others wait (at most 30 s) for the gate, which opens once the
  // stranger has been refused.
  std::string id = submit(2, 1, {"/bin/sh", "-c",
                                 "if [ \"$DDL_RANK\" != 0 ]; then i=0; while [ ! -e " + gate +
                                     " ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; fi; exec " +
                                     std::string(DDL_BIN_DIR) + "/ddl-bench -b 8 -e 64K -f 4 -n 2 -w 1 -c 1"});
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000));
  // The store listens in the root node's port range (portBase(): 100 for n1, then 100 for n2).
  int port = -1;
  int fd = -1;
  ASSERT_TRUE(waitFor(
      [&] {
        for (int p = portBase(); p < portBase() + 200 && port < 0; ++p) {
          int s = socket(AF_INET, SOCK_STREAM, 0);
          sockaddr_in addr{};
          addr.sin_family = AF_INET;
          addr.sin_port = htons(static_cast<uint16_t>(p));
          addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
          if (connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
            port = p;
            fd = s;
          } else {
            close(s);
          }
        }
        return port > 0;
      },
      20000))
      << "no rendezvous store listening";
  // A well-formed store request (SET k=v, libddl's wire format) where the handshake should be: a store that
  // admitted anyone would answer it and keep the connection; the job's store drops it.
  const unsigned char set_request[] = {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 'k', 'v'};
  ASSERT_EQ(write(fd, set_request, sizeof(set_request)), static_cast<ssize_t>(sizeof(set_request)));
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[4096];
  ssize_t n = 1;
  for (int i = 0; i < 64 && n > 0; ++i) n = read(fd, buf, sizeof(buf));  // its challenge, perhaps, then EOF
  EXPECT_EQ(n, 0) << "the store kept the stranger's connection (port " << port << ")";
  close(fd);
  std::ofstream(gate) << "go\n";
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 60000)) << job(id).DebugString();
}

// A new node joins with a one-time token: it makes its own key, pins the CA by the hash printed with the token,
// and comes UP; the token does not work twice.
TEST_F(ClusterTest, ANodeJoinsWithAOneTimeTokenPinnedToTheCa) {
  const std::string out = (dir_ / "join.json").string();
  ASSERT_EQ(std::system((ctl() + " admin join-token n3 --ttl 120 -o json > " + out).c_str()), 0);
  const std::string text = slurp(out);
  auto field = [&](const std::string& name) {
    const size_t at = text.find("\"" + name + "\":\"");
    return at == std::string::npos ? "" : text.substr(at + name.size() + 4, text.find('"', at + name.size() + 4) - at - name.size() - 4);
  };
  std::ofstream(dir_ / "join.token") << field("token") << "\n";
  const std::string pin = field("ca_sha256");
  ASSERT_EQ(pin.size(), 64u) << text;
  auto join = [&](const std::string& node, const std::string& ca_pin, const std::string& pki_dir) {
    return run({std::string(DDL_BIN_DIR) + "/ddl-agent", "--coordinator", address_, "--node", node, "--pki-dir",
                pki_dir, "join", "--token-file", (dir_ / "join.token").string(), "--ca-sha256", ca_pin});
  };
  // A wrong pin: nothing is sent, the token stays good.
  EXPECT_NE(join("n3", std::string(64, '0'), (dir_ / "n3-wrong").string()), 0);
  EXPECT_FALSE(fs::exists(dir_ / "n3-wrong" / "node.crt"));
  EXPECT_NE(slurp(dir_ / "run.log").find("refusing to join"), std::string::npos) << slurp(dir_ / "run.log");
  // Another node's name with n3's token: refused, and the token is still n3's.
  EXPECT_NE(join("n4", pin, (dir_ / "n4-pki").string()), 0);
  ASSERT_EQ(join("n3", pin, (dir_ / "n3-pki").string()), 0) << slurp(dir_ / "run.log");
  EXPECT_NE(join("n3", pin, (dir_ / "n3-again").string()), 0);  // used up
  struct stat st {};
  ASSERT_EQ(stat((dir_ / "n3-pki" / "node.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  startAgent(3);
  EXPECT_TRUE(waitFor([&] { return upNodes() == 3; }, 10000)) << slurp(dir_ / "agent-n3.log");
}

// Certificates renewed under a running job: the coordinator serves its new certificate to new connections
// without a restart (the fingerprint it presents changes), a node whose certificate was re-issued registers
// again with its files as they are now after a coordinator restart, and the job goes on throughout. (Which of
// its two valid certificates the agent presented is not visible from here: gRPC's file watcher is trusted.)
TEST_F(ClusterTest, RenewedCertificatesArePickedUpWithoutRestartingJobs) {
  const std::string marker = "65." + std::to_string(getpid());
  std::string id = submit(2, 2, {"/bin/sh", "-c", "sleep 5; echo " + marker});
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000));
  auto served = [&] {
    const std::string out = (dir_ / "served.txt").string();
    std::system(("openssl s_client -connect " + address_ + " </dev/null 2>/dev/null | openssl x509 -noout " +
                 "-fingerprint -sha256 > " + out + " 2>/dev/null").c_str());
    return slurp(out);
  };
  auto onDisk = [&] {
    const std::string out = (dir_ / "disk.txt").string();
    std::system(("openssl x509 -noout -fingerprint -sha256 -in " + pki() + "/coordinator.crt > " + out).c_str());
    return slurp(out);
  };
  const std::string before = served();
  ASSERT_EQ(before, onDisk());
  ASSERT_EQ(run({std::string(DDL_BIN_DIR) + "/ddl-coordinator", "--pki-dir", pki(), "renew-cert", "--days", "30"}), 0);
  ASSERT_NE(onDisk(), before);
  EXPECT_TRUE(waitFor([&] { return served() == onDisk(); }, 10000)) << "still serving the old certificate";
  // n1's certificate renewed, then its stream cut (a coordinator restart): it comes back with the new one.
  ASSERT_EQ(run({std::string(DDL_BIN_DIR) + "/ddl-coordinator", "--pki-dir", pki(), "issue-node", "n1", "--out",
                 (dir_ / "n1-pki").string(), "--days", "30"}),
            0);
  kill(coordinator_, SIGKILL);
  waitpid(coordinator_, nullptr, 0);
  startCoordinator(address_);
  EXPECT_TRUE(waitFor([&] { return upNodes() == 2; }, 15000)) << slurp(dir_ / "agent-n1.log");
  EXPECT_EQ(job(id).state(), ddl::v1::RUNNING);
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 30000)) << job(id).DebugString();
  EXPECT_EQ(job(id).restarts(), 0);
}

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
  std::string cmd = ctl() + " status " + id + " > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  std::string status = slurp(out);
  EXPECT_NE(status.find("SUCCEEDED"), std::string::npos) << status;
  EXPECT_NE(status.find("RUNNING"), std::string::npos) << status;
}

TEST_F(ClusterTest, LogsAreReadThroughTheCoordinator) {
  std::string id = submit(2, 1, {"/bin/sh", "-c", "echo \"hello from $DDL_RANK of $WORLD_SIZE\"; printf 'no newline'"});
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 30000)) << job(id).DebugString();
  const std::string ctl = this->ctl() + " logs " + id;
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
  std::string id = submit(2, 2,
                          {"/bin/sh", "-c",
                           "if [ \"$DDL_RANK\" = 3 ]; then echo out of memory in step 12; "
                           "sleep 0.5; exit 7; fi; exec sleep " +
                               marker});
  ASSERT_TRUE(reaches(id, ddl::v1::FAILED, 30000)) << job(id).DebugString();
  auto j = job(id);
  EXPECT_EQ(j.failure().rank(), 3);
  EXPECT_EQ(j.failure().exit_code(), 7);
  // Rank 3 is the second GPU of the second node in ring order.
  EXPECT_EQ(j.failure().host(), j.allocation(1).node());
  EXPECT_TRUE(waitFor([&] { return !processWithMarker(marker); }, 15000)) << "ranks of the failed job survive";
  // wait and status show the failing rank's last lines (on stderr), so nobody needs a second command to see
  // why.
  const fs::path err = dir_ / "wait.err";
  EXPECT_EQ(
      std::system((ctl((dir_ / "root.token").string()) + " wait " + id + " > /dev/null 2> " + err.string())
                      .c_str()) >>
          8,
      7);
  EXPECT_NE(slurp(err).find("the last lines of rank 3 of " + id), std::string::npos) << slurp(err);
  EXPECT_NE(slurp(err).find("  out of memory in step 12\n"), std::string::npos) << slurp(err);
  EXPECT_EQ(
      std::system((ctl((dir_ / "root.token").string()) + " status " + id + " > /dev/null 2> " + err.string())
                      .c_str()),
      0);
  EXPECT_NE(slurp(err).find("out of memory in step 12"), std::string::npos) << slurp(err);
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
  authorize(&ctx);
  ASSERT_TRUE(user_->CancelJob(&ctx, req, &out).ok());
  EXPECT_EQ(out.state(), ddl::v1::CANCELLED);
  EXPECT_TRUE(waitFor([&] { return !processWithMarker(marker); }, 15000)) << "ranks of the cancelled job survive";
}

// cancel --signal reaches the program itself (not its shim), which decides how it ends; each rank's result
// (node, the program's own pid, exit code) stays with the job after it ends.
TEST_F(ClusterTest, ASignalReachesTheProgramAndEveryRanksResultIsKept) {
  const fs::path pid_file = dir_ / "program.pid";
  std::string id = submit(1, 1, {"/bin/sh", "-c", "trap 'exit 7' USR1; echo $$ > " + pid_file.string() +
                                                      "; for i in $(seq 600); do sleep 0.1; done"});
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000));
  ASSERT_TRUE(waitFor([&] { return fs::exists(pid_file) && fs::file_size(pid_file) > 0; }, 10000));
  ddl::v1::CancelJobRequest req;
  req.set_id(id);
  req.set_signal(SIGUSR1);
  ddl::v1::Job out;
  grpc::ClientContext ctx;
  authorize(&ctx);
  grpc::Status st = user_->CancelJob(&ctx, req, &out);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(out.state(), ddl::v1::RUNNING);  // only signalled
  ASSERT_TRUE(reaches(id, ddl::v1::FAILED, 15000)) << job(id).DebugString();
  ASSERT_TRUE(waitFor([&] { return job(id).ranks_size() == 1 && job(id).ranks(0).has_exit_code(); }, 10000));
  auto j = job(id);
  EXPECT_EQ(j.failure().exit_code(), 7);
  const auto& r = j.ranks(0);
  EXPECT_EQ(r.exit_code(), 7);
  EXPECT_EQ(r.node(), j.allocation(0).node());
  EXPECT_EQ(std::to_string(r.program_pid()) + "\n", slurp(pid_file));
  EXPECT_NE(r.pid(), r.program_pid());  // the pid is the shim's, the group leader
  EXPECT_GT(r.exited_ms(), 0);
}

// --time: SIGTERM at the limit, the job ends TIMEOUT, and no process of it is left.
TEST_F(ClusterTest, AJobPastItsTimeLimitEndsTimeoutWithNoProcessLeft) {
  const std::string marker = "63." + std::to_string(getpid());
  ddl::v1::SubmitRequest req;
  req.mutable_spec()->set_nodes(1);
  req.mutable_spec()->set_gpus_per_node(1);
  req.mutable_spec()->set_time_limit_s(1);
  req.mutable_spec()->add_command("/bin/sleep");
  req.mutable_spec()->add_command(marker);
  ddl::v1::SubmitResponse resp;
  grpc::ClientContext ctx;
  authorize(&ctx, root_token_);  // ranks run as the submitter
  grpc::Status st = user_->Submit(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  const std::string id = resp.job().id();
  ASSERT_TRUE(reaches(id, ddl::v1::TIMEOUT, 30000)) << job(id).DebugString();
  EXPECT_TRUE(waitFor([&] { return !processWithMarker(marker); }, 15000)) << "ranks of the timed-out job survive";
  ASSERT_TRUE(waitFor([&] { return job(id).ranks_size() == 1 && job(id).ranks(0).has_signal(); }, 10000))
      << job(id).DebugString();
  EXPECT_EQ(job(id).ranks(0).signal(), SIGTERM);
  const auto j = job(id);
  EXPECT_GE(j.end_ms() - j.start_ms(), 1000);
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

// Issue 28 item 7: a job asks for CPUs and memory per rank; placement counts them, each rank is pinned to its
// own CPUs (and, where the node has cgroups v2 for the agent, confined by cpuset and memory.max), and nodes
// show what is held. What cannot be held is refused at submit.
TEST_F(ClusterTest, RanksGetTheCpusTheirJobAskedForAndNodesShowWhatIsHeld) {
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  if (CPU_COUNT(&mine) < 2) GTEST_SKIP() << "skipped: needs 2 CPUs to give 2 ranks one each";
  const std::string out = (dir_ / "submit.txt").string();
  ASSERT_EQ(std::system((ctl((dir_ / "root.token").string()) +
                         " submit --nodes 1 --gpus-per-node 2 --cpus-per-rank 1 --mem-per-rank 64M -- "
                         "/bin/sh -c 'grep Cpus_allowed_list /proc/self/status; sleep 3' > " +
                         out)
                            .c_str()),
            0);
  std::string id = slurp(out);
  id.erase(id.find_last_not_of("\n") + 1);
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000)) << job(id).DebugString();
  const std::string node = job(id).allocation(0).node();
  ddl::v1::ListNodesResponse nodes;
  {
    grpc::ClientContext ctx;
    authorize(&ctx);
    ASSERT_TRUE(user_->ListNodes(&ctx, {}, &nodes).ok());
  }
  for (const auto& n : nodes.nodes()) {
    EXPECT_EQ(n.cpus_size(), CPU_COUNT(&mine)) << n.name();
    EXPECT_GT(n.memory_bytes(), 0) << n.name();
    EXPECT_FALSE(n.confinement().empty()) << n.name();
    EXPECT_EQ(n.cpus_used_size(), n.name() == node ? 2 : 0) << n.name();
    EXPECT_EQ(n.memory_used_bytes(), n.name() == node ? int64_t{128} << 20 : 0) << n.name();
  }
  ASSERT_EQ(std::system((ctl() + " nodes > " + (dir_ / "nodes.txt").string()).c_str()), 0);
  const std::string table = slurp(dir_ / "nodes.txt");
  EXPECT_NE(table.find("CPUS  MEMORY"), std::string::npos) << table;
  EXPECT_NE(table.find("2/" + std::to_string(CPU_COUNT(&mine))), std::string::npos) << table;
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 30000)) << job(id).DebugString();
  // Each rank saw exactly one CPU, and not the same one.
  std::set<std::string> seen;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = (dir_ / ("rank" + std::to_string(rank) + ".txt")).string();
    ASSERT_EQ(std::system((ctl() + " logs " + id + " --rank " + std::to_string(rank) + " > " + log).c_str()),
              0);
    std::string line = slurp(log);
    ASSERT_EQ(line.rfind("Cpus_allowed_list:\t", 0), 0u) << line;
    line = line.substr(19);
    line.erase(line.find_last_not_of("\n") + 1);
    EXPECT_EQ(line.find_first_not_of("0123456789"), std::string::npos) << "one CPU, got " << line;
    seen.insert(line);
  }
  EXPECT_EQ(seen.size(), 2u);
  // More CPUs than any node offers: refused at submit, saying what the nodes have.
  const std::string err = (dir_ / "err.txt").string();
  EXPECT_NE(std::system((ctl((dir_ / "root.token").string()) +
                         " submit --gpus 1 --cpus-per-rank 4096 -- /bin/true 2> " + err)
                            .c_str()),
            0);
  EXPECT_NE(slurp(err).find("CPUs and"), std::string::npos) << slurp(err);
}

// A node of S822LC topology (2 NVLink pairs on 2 NUMA nodes; the agent's CPUs split between them): a 1-GPU
// job alone gets socket 0's first GPU, a CPU of socket 0, memory from NUMA node 0 first and socket 0's NIC; a
// job of 2 GPUs gets a pair, and a 1-GPU job beside it the other socket's GPU, CPU and NIC; nodes -v and ring
// show it.
TEST_F(ClusterTest, RanksGetAnNvlinkPairAndTheirGpusNumaNodeAndNic) {
  cpu_set_t mine;
  ASSERT_EQ(sched_getaffinity(0, sizeof mine, &mine), 0);
  if (CPU_COUNT(&mine) < 2) GTEST_SKIP() << "skipped: needs 2 CPUs for 2 NUMA nodes";
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &mine)) cpus.push_back(c);
  const int secondHalf = cpus[cpus.size() / 2];  // the first CPU of virtual NUMA node 1
  for (const char* node : {"n1", "n2"}) stop(agents_[node]);
  startAgent(1, true, {"--virtual-topology", "s822lc", "--force-virtual"});
  ASSERT_TRUE(waitFor([&] { return upNodes() == 1; }, 15000)) << slurp(dir_ / "agent-n1.log");
  // What a rank on a GPU sees of its CPUs, its memory's NUMA policy and its NIC.
  const std::string probe =
      "--gpus 1 --cpus-per-rank 1 -- /bin/sh -c 'grep Cpus_allowed_list /proc/self/status; "
      "echo policy=$(grep -m1 -o \"prefer[^ ]*\\|default\" /proc/self/numa_maps); "
      "echo gpu=$DDL_GPU nic=$DDL_NET_DEVICE ucx=${UCX_NET_DEVICES:-unset}'";
  auto output = [&](const std::string& id) {
    const std::string log = (dir_ / (id + ".txt")).string();
    EXPECT_EQ(std::system((ctl() + " logs " + id + " > " + log).c_str()), 0);
    return slurp(log);
  };
  // Alone on the node: the first NVLink pair's first GPU, a CPU of socket 0 and memory from NUMA node 0.
  const std::string first = submitAsRoot(probe);
  ASSERT_TRUE(reaches(first, ddl::v1::SUCCEEDED, 30000)) << job(first).DebugString();
  std::string text = output(first);
  EXPECT_NE(text.find("Cpus_allowed_list:\t" + std::to_string(cpus[0]) + "\n"), std::string::npos) << text;
  const bool node0 =
      fs::exists("/sys/devices/system/node/node0");  // a machine without NUMA in sysfs binds none
  EXPECT_NE(text.find(node0 ? "policy=prefer:0\n" : "policy=default\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu=0 nic=mlx5_0 ucx=unset"), std::string::npos) << text;  // mlx5_0 is made up
  const std::string pair = submitAsRoot("--gpus 2 -- sleep 30");
  ASSERT_TRUE(reaches(pair, ddl::v1::RUNNING, 30000)) << job(pair).DebugString();
  EXPECT_EQ(job(pair).allocation(0).gpus_size(), 2);
  EXPECT_EQ(job(pair).allocation(0).gpus(0), 0);
  EXPECT_EQ(job(pair).allocation(0).gpus(1), 1);
  // Beside the pair: the other socket's GPU and CPU (its made-up NUMA node 1 is not on this machine, so its
  // memory keeps the default policy).
  const std::string one = submitAsRoot(probe);
  ASSERT_TRUE(reaches(one, ddl::v1::SUCCEEDED, 30000)) << job(one).DebugString();
  text = output(one);
  EXPECT_NE(text.find("Cpus_allowed_list:\t" + std::to_string(secondHalf) + "\n"), std::string::npos) << text;
  EXPECT_NE(text.find("policy=default\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpu=2 nic=mlx5_1 ucx=unset"), std::string::npos) << text;

  ASSERT_EQ(std::system((ctl() + " nodes -v > " + (dir_ / "nodes.txt").string()).c_str()), 0);
  const std::string nodes = slurp(dir_ / "nodes.txt");
  EXPECT_NE(nodes.find("ISLAND"), std::string::npos) << nodes;
  EXPECT_NE(nodes.find("Tesla P100-SXM2-16GB"), std::string::npos) << nodes;
  EXPECT_NE(nodes.find("NICs: mlx5_0 (ib, numa 0), mlx5_1 (ib, numa 1)"), std::string::npos) << nodes;
  ASSERT_EQ(std::system((ctl() + " ring " + pair + " > " + (dir_ / "ring.txt").string()).c_str()), 0);
  const std::string ring = slurp(dir_ / "ring.txt");
  EXPECT_NE(ring.find("[gpu0=r0 gpu1=r1]"), std::string::npos) << ring;
}

// A node whose GPUs the fake NVML reports: an Xid 79 on GPU 0 fails and requeues the job on it, naming the
// GPU and the Xid; nothing is placed on GPU 0 until an admin clears it; a failing health check drains the
// node with its last line as the reason, and undrains it when it passes again.
TEST_F(ClusterTest, AFaultedGpuLeavesPlacementUntilClearedAndAFailedCheckDrains) {
  for (const char* node : {"n1", "n2"}) stop(agents_[node]);
  const std::string faults = (dir_ / "faults").string(), flag = (dir_ / "unhealthy").string();
  std::ofstream(faults).close();
  const fs::path check = dir_ / "check.sh";
  std::ofstream(check) << "#!/bin/sh\nif [ -e " << flag
                       << " ]; then echo checking; echo 'GPU 1: NVLink down'; exit 1; fi\nexit 0\n";
  fs::permissions(check, fs::perms::owner_all);
  const fs::path config = dir_ / "health.json";
  std::ofstream(config) << "{\"tls_refresh_s\": 1, \"health_check_program\": \"" << check.string()
                        << "\", \"health_check_interval_s\": 1}\n";
  setenv("LD_LIBRARY_PATH", DDL_FAKE_NVML_DIR, 1);  // the agent's dlopen finds the fake libnvidia-ml.so.1
  setenv("DDL_FAKE_NVML", "01,02;0-1", 1);
  setenv("DDL_FAKE_NVML_FAULTS", faults.c_str(), 1);
  startAgent(1, true, {}, config.string());
  for (const char* name : {"LD_LIBRARY_PATH", "DDL_FAKE_NVML", "DDL_FAKE_NVML_FAULTS"}) unsetenv(name);
  ASSERT_TRUE(waitFor([&] { return upNodes() == 1; }, 15000)) << slurp(dir_ / "agent-n1.log");
  auto nodeOne = [&] {
    ddl::v1::ListNodesResponse nodes;
    grpc::ClientContext ctx;
    authorize(&ctx);
    EXPECT_TRUE(user_->ListNodes(&ctx, {}, &nodes).ok());
    for (const auto& n : nodes.nodes())
      if (n.name() == "n1") return n;
    return ddl::v1::Node();
  };
  const std::string a = submitAsRoot("--gpus 1 --max-restarts 1 -- sleep 60");
  ASSERT_TRUE(reaches(a, ddl::v1::RUNNING, 30000)) << job(a).DebugString();
  ASSERT_EQ(job(a).allocation(0).gpus(0), 0);
  std::ofstream(faults, std::ios::app) << "xid 0 79\n";
  // Requeued (a restart), and running again on the other GPU.
  ASSERT_TRUE(waitFor([&] { return job(a).restarts() == 1 && job(a).state() == ddl::v1::RUNNING; }, 20000))
      << job(a).DebugString();
  EXPECT_EQ(job(a).allocation(0).gpus(0), 1);
  bool named = false;
  const ddl::v1::Job requeued = job(a);
  for (const auto& t : requeued.transitions())
    named =
        named || t.reason().find("GPU 0 of node n1 failed: Xid 79 (fallen off the bus)") != std::string::npos;
  EXPECT_TRUE(named) << job(a).DebugString();
  ASSERT_EQ(nodeOne().gpu_faults_size(), 1);
  EXPECT_EQ(nodeOne().gpu_faults(0).gpu(), 0);
  EXPECT_EQ(nodeOne().gpu_faults(0).xid(), 79);
  // No job lands on GPU 0 while it is faulted.
  const std::string b = submitAsRoot("--gpus 1 -- sleep 60");
  // A scheduling pass has decided on it (its reason code is the pass's), and it still waits.
  ASSERT_TRUE(waitFor(
      [&] {
        const std::string code = job(b).reason_code();
        return !code.empty() && code != "Submitting";
      },
      15000))
      << job(b).DebugString();
  EXPECT_EQ(job(b).state(), ddl::v1::PENDING) << job(b).DebugString();
  ASSERT_EQ(std::system((ctl() + " nodes > " + (dir_ / "nodes.txt").string()).c_str()), 0);
  EXPECT_NE(slurp(dir_ / "nodes.txt").find("1/2 (1 faulted)"), std::string::npos)
      << slurp(dir_ / "nodes.txt");
  ASSERT_EQ(std::system((ctl() + " admin gpu-ok n1 0 > " + (dir_ / "ok.txt").string()).c_str()), 0);
  ASSERT_TRUE(reaches(b, ddl::v1::RUNNING, 20000)) << job(b).DebugString();
  EXPECT_EQ(job(b).allocation(0).gpus(0), 0);
  EXPECT_EQ(nodeOne().gpu_faults_size(), 0);
  EXPECT_NE(std::system((ctl() + " admin gpu-ok n1 0 2> " + (dir_ / "err.txt").string()).c_str()), 0);
  EXPECT_NE(slurp(dir_ / "err.txt").find("has no fault to clear"), std::string::npos)
      << slurp(dir_ / "err.txt");

  std::ofstream(flag).close();
  ASSERT_TRUE(waitFor([&] { return nodeOne().state() == "DRAINING"; }, 15000)) << nodeOne().DebugString();
  EXPECT_EQ(nodeOne().drain_reason(), "health check: exit 1: GPU 1: NVLink down");
  fs::remove(flag);
  ASSERT_TRUE(waitFor([&] { return nodeOne().state() == "UP"; }, 15000)) << nodeOne().DebugString();
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
  const std::string ctl = this->ctl(dir_ / "root.token");
  const std::string submit = ctl + " submit --name fmnist --nodes 2 --gpus-per-node 1 --max-restarts 1 --env PYTHONPATH=" +
                             DDL_TEST_PYTHONPATH + " --env OMP_NUM_THREADS=1 -- /usr/bin/python3 " + DDL_SOURCE_DIR +
                             "/examples/fashion_mnist/train.py --epochs 2 --train-samples 2048 --test-samples 1000 "
                             "--batch-size 32 --timeout 60 --crash-after-epoch 1 --checkpoint-dir " +
                             (dir_ / "checkpoints").string() + " > " + (dir_ / "job.txt").string();
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

// Issue 44: an elastic job (--gpus 2:4) of the training example loses a rank to SIGKILL. The others go on
// from the step they agree on, the coordinator records the change instead of failing the job, starts a new
// rank on the freed GPU with DDL_JOIN=1, and the job grows back to 4 ranks at a --grow-every point and ends
// SUCCEEDED: the step log ("epoch step ranks loss") shows every step once, 4 ranks, then 3, then 4 again.
TEST_F(ClusterTest, AnElasticTrainingJobLosesARankGoesOnAndGrowsBack) {
#ifndef DDL_TEST_TORCH
  GTEST_SKIP() << "torch_ddl is not built here (no libtorch-dev): nothing to train with";
#else
  const fs::path steps = dir_ / "steps.log";
  const std::string submit = ctl(dir_ / "root.token") +
                             " submit --name elastic --gpus 2:4 --env PYTHONPATH=" + DDL_TEST_PYTHONPATH +
                             " --env OMP_NUM_THREADS=1 -- /usr/bin/python3 " + DDL_SOURCE_DIR +
                             "/examples/fashion_mnist/train.py --elastic --epochs 2 --train-samples 6400 "
                             "--test-samples 1000 --batch-size 16 --timeout 60 --grow-every 10 --step-log " +
                             steps.string() + " > " + (dir_ / "job.txt").string();
  ASSERT_EQ(std::system(submit.c_str()), 0);
  std::string id = slurp(dir_ / "job.txt");
  id.erase(id.find_last_not_of("\n") + 1);
  auto lines = [&] {
    std::vector<std::string> out;
    std::ifstream in(steps);
    for (std::string line; std::getline(in, line);) out.push_back(line);
    return out;
  };
  ASSERT_TRUE(waitFor([&] { return lines().size() >= 30; }, 120000)) << job(id).DebugString();
  int victim = 0;
  const auto running = job(id);
  for (const auto& r : running.ranks())
    if (r.rank() == 2) victim = r.program_pid();
  ASSERT_GT(victim, 0) << running.DebugString();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 240000)) << job(id).DebugString();

  const auto j = job(id);
  std::string changes;
  for (const auto& t : j.transitions())
    if (t.from() == ddl::v1::RUNNING && t.to() == ddl::v1::RUNNING) changes += t.reason() + "\n";
  EXPECT_NE(changes.find("rank 2 on node"), std::string::npos) << changes;
  EXPECT_NE(changes.find("was killed by signal SIGKILL; going on without rank 2: 3 of 4 ranks"),
            std::string::npos)
      << changes;
  EXPECT_NE(changes.find("grown: rank 4 started on"), std::string::npos) << changes;
  // Every step once, in order; the ranks went 4, 3, 4.
  std::vector<int> worlds;
  int expected = 1;
  for (const std::string& line : lines()) {
    std::istringstream in(line);
    int epoch = 0, step = 0, ranks = 0;
    ASSERT_TRUE(in >> epoch >> step >> ranks) << line;
    EXPECT_EQ(step, expected++) << "a step lost or repeated at: " << line;
    if (worlds.empty() || worlds.back() != ranks) worlds.push_back(ranks);
  }
  EXPECT_EQ(worlds, (std::vector<int>{4, 3, 4})) << slurp(steps);
  std::string joiner;
  for (const auto& r : j.ranks())
    if (r.rank() == 4) joiner = slurp(dir_ / r.node() / "logs" / id / "attempt-1" / "rank-4.log");
  EXPECT_NE(joiner.find("joined as rank 3 of 4"), std::string::npos) << joiner;
#endif
}

// Two agents for one node: a second ddl-agent on n1's data dir exits at once naming the first (it would adopt
// n1's ranks and unlink its agent.sock); one with a data dir of its own but n1's name and certificate (a
// cloned machine) is refused by the coordinator, naming both, and n1 stays registered from its first agent
// throughout.
TEST_F(ClusterTest, ASecondAgentForOneNodeOrOneDataDirIsRefused) {
  const std::string agent = std::string(DDL_BIN_DIR) + "/ddl-agent";
  auto argv = [&](const fs::path& data) {
    return std::vector<std::string>{agent,
                                    "--coordinator",
                                    address_,
                                    "--node",
                                    "n1",
                                    "--address",
                                    "127.0.0.2",
                                    "--virtual-gpus",
                                    "2",
                                    "--force-virtual",
                                    "--data-dir",
                                    data.string(),
                                    "--port-range",
                                    "31200-31299",
                                    "--pki-dir",
                                    (dir_ / "n1-pki").string()};
  };
  const fs::path same_dir_log = dir_ / "agent-dup-dir.log";
  pid_t dup = spawn(argv(dir_ / "n1"), same_dir_log);
  int status = 0;
  const bool exited = waitFor([&] { return waitpid(dup, &status, WNOHANG) == dup; }, 10000);
  if (!exited) stop(dup);
  EXPECT_TRUE(exited && WIFEXITED(status) && WEXITSTATUS(status) != 0)
      << "a second agent ran on n1's data dir";
  EXPECT_NE(slurp(same_dir_log)
                .find("another ddl-agent (pid " + std::to_string(agents_["n1"]) + ") uses the data dir"),
            std::string::npos)
      << slurp(same_dir_log);
  EXPECT_TRUE(fs::exists(dir_ / "n1" / "agent.sock")) << "the refused agent removed the first one's socket";

  const fs::path clone_log = dir_ / "agent-clone.log";
  pid_t clone = spawn(argv(dir_ / "n1-clone"), clone_log);
  EXPECT_TRUE(waitFor(
      [&] { return slurp(clone_log).find("held by another live ddl-agent") != std::string::npos; }, 15000))
      << slurp(clone_log);
  const std::string refused = slurp(clone_log);
  EXPECT_NE(refused.find("127.0.0.1"), std::string::npos) << refused;  // the first agent's address
  EXPECT_NE(refused.find("127.0.0.2"), std::string::npos) << refused;  // its own
  // n1 keeps its first agent: registered from 127.0.0.1, never from the clone.
  for (int i = 0; i < 20; ++i) {
    ddl::v1::ListNodesResponse nodes;
    grpc::ClientContext ctx;
    authorize(&ctx);
    ASSERT_TRUE(user_->ListNodes(&ctx, {}, &nodes).ok());
    for (const auto& n : nodes.nodes()) {
      if (n.name() == "n1") EXPECT_EQ(n.address(), "127.0.0.1") << "n1 flapped to the clone";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  stop(clone);
  std::string id = submit(2, 2, {"/bin/true"});
  EXPECT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 30000)) << job(id).DebugString();
}

TEST_F(ClusterTest, CoordinatorKilledMidJobRestartsAndTheJobStillSucceeds) {
  std::string id = submit(2, 2, {"/bin/sleep", "4"});
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000));
  kill(coordinator_, SIGKILL);
  waitpid(coordinator_, nullptr, 0);
  startCoordinator(address_);  // same port and data dir: the agents find it again
  // RUNNING may not have been stored yet when the coordinator died (reads answer from memory before a batch
  // is durable): then the job comes back STARTING and turns RUNNING when its agents report their ranks again.
  // Either way it is still the same open job, not lost, requeued or failed.
  const auto back = job(id).state();
  EXPECT_TRUE(back == ddl::v1::RUNNING || back == ddl::v1::STARTING) << job(id).DebugString();
  ASSERT_TRUE(reaches(id, ddl::v1::SUCCEEDED, 30000)) << job(id).DebugString();
  ddl::v1::ListJobsResponse list;
  grpc::ClientContext ctx;
  authorize(&ctx);
  ASSERT_TRUE(user_->ListJobs(&ctx, {}, &list).ok());
  EXPECT_EQ(list.jobs_size(), 1);
}

// What a CI step `ddlctl submit --wait && next` meets at an upgrade: the coordinator is stopped and started
// again six times while the job runs, by SIGKILL and by SIGTERM in turn (a clean stop cuts the calls in
// flight: they end CANCELLED, which used to end every waiting command). submit --wait, wait and logs -f ride
// each outage out (saying so) and end with the job's true result and its whole output.
TEST_F(ClusterTest, SubmitWaitAndLogsFollowRideOutFiveCoordinatorRestarts) {
  const std::string ctl = this->ctl((dir_ / "root.token").string());
  const fs::path wait_out = dir_ / "wait.out", logs_out = dir_ / "logs.out";
  const pid_t waiter = spawn({"/bin/sh", "-c",
                              ctl + " submit --wait --nodes 2 --gpus-per-node 1 -- /bin/sh -c "
                                    "'for i in $(seq 1 16); do echo tick $i; sleep 1; done'"},
                             wait_out);
  const std::string id = ddl::e2e::submittedId(wait_out, 20000);
  ASSERT_FALSE(id.empty()) << slurp(wait_out);
  ASSERT_TRUE(reaches(id, ddl::v1::RUNNING, 30000)) << job(id).DebugString();
  const pid_t follower = spawn({"/bin/sh", "-c", ctl + " logs -f --rank 0 " + id}, logs_out);
  const fs::path waited_out = dir_ / "waited.out";
  const pid_t wait_verb = spawn({"/bin/sh", "-c", ctl + " wait " + id}, waited_out);
  for (int restart = 0; restart < 6; ++restart) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    if (restart % 2 == 0) {
      kill(coordinator_, SIGKILL);
      waitpid(coordinator_, nullptr, 0);
    } else {
      stop(coordinator_);  // SIGTERM, and wait for it to end
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    startCoordinator(address_);  // same port and data dir
  }
  int status = -1;
  auto ended = [&](pid_t pid) {
    return waitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 90000) && WIFEXITED(status)
               ? WEXITSTATUS(status)
               : -1;
  };
  EXPECT_EQ(ended(waiter), 0) << slurp(wait_out);
  const std::string waited = slurp(wait_out);
  EXPECT_NE(waited.find("lost the coordinator at " + address_), std::string::npos) << waited;
  EXPECT_NE(waited.find("answers again"), std::string::npos) << waited;
  EXPECT_NE(waited.find(id + " SUCCEEDED"), std::string::npos) << waited;
  EXPECT_EQ(waited.find("CANCELLED"), std::string::npos) << waited;
  EXPECT_EQ(ended(wait_verb), 0) << slurp(waited_out);
  EXPECT_NE(slurp(waited_out).find(id + " SUCCEEDED"), std::string::npos) << slurp(waited_out);
  EXPECT_EQ(ended(follower), 0) << slurp(logs_out);
  const std::string followed = slurp(logs_out);
  for (int i = 1; i <= 16; ++i) {
    EXPECT_NE(followed.find("tick " + std::to_string(i) + "\n"), std::string::npos) << i << ":\n" << followed;
  }
  EXPECT_EQ(job(id).state(), ddl::v1::SUCCEEDED) << job(id).DebugString();
}

}  // namespace
