// Chaos: a real ddl-coordinator and two real ddl-agents (two virtual GPUs each) over mutual TLS, as in
// cluster_test, with jobs flowing (through the UserService and through ddlctl, some with --max-restarts, some
// cancelled) while the coordinator, the agents and the ranks are killed (SIGKILL) or frozen (SIGSTOP, SIGCONT
// later) at random points. A seeded RNG picks everything; the seed is printed, and DDL_CHAOS_SEED=N replays
// it.
//
// What the ranks really did is written by the ranks themselves: each rank (a shell) writes
// DIR/runs/JOB/aATTEMPT-rRANK.start when it starts (and .dup if that file was already there: the same
// attempt's rank started twice) and .exit with its exit code when it ends normally. After the chaos, with
// every process running again and the cluster settled, the test checks that:
//  - every acknowledged job (Submit answered an id, or ddlctl printed one) exists and has ended;
//  - a SUCCEEDED job had an attempt whose ranks all exited 0 (by their own .exit files);
//  - no attempt of any job ran a rank twice (.dup);
//  - no GPU is left allocated (ListNodes: gpus_used empty on every node) and both nodes are UP;
//  - no rank process is left (the ranks carry a marker in their command line).
// The chaos phase is bounded in rounds (60) and time (60 s), the settling in time (120 s); every wait is
// bounded.
//
// HaChaosTest runs the same with three coordinators sharing a 3-member etcd cluster (issue 30): ddlctl and
// the agents are given all three addresses, the coordinator that is killed or frozen is the leader (a standby
// takes over; the killed one comes back as a standby, one that finds its lease gone exits and is started
// again), and etcd members are killed and started again one at a time. The invariants are the same: no
// acknowledged job lost, no attempt's rank started twice, nothing left held.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "ddl/tls.h"
#include "ddl/v1/ddl.grpc.pb.h"
#include "e2e_helpers.h"
#ifdef DDL_HAVE_ETCD
#include "../unit/etcd_for_test.h"
#include "state/etcd_store.h"
#endif

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using ddl::e2e::processesWithMarker;
using ddl::e2e::slurp;
using ddl::e2e::spawn;
using ddl::e2e::waitFor;
namespace v1 = ddl::v1;

constexpr int kRounds = 60;
constexpr int kChaosSeconds = 60;
constexpr int kSettleSeconds = 120;

struct Acked {
  std::string id;
  int world = 0;   // ranks per attempt
  int fails = 0;   // attempts 1..fails exit 1, later ones 0
  int restarts = 0;
  bool via_ctl = false;
};

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("DDL_CHAOS_SEED");
    seed_ = env && *env ? std::strtoull(env, nullptr, 10) : std::random_device{}();
    std::cout << "chaos seed " << seed_ << " (replay: DDL_CHAOS_SEED=" << seed_ << ")" << std::endl;
    RecordProperty("chaos_seed", std::to_string(seed_));
    rng_.seed(seed_);
    // The marker must not be part of the directory's name: the agents' and coordinator's command lines hold that.
    marker_ = "chaos-rank-" + std::to_string(getpid());
    dir_ = fs::temp_directory_path() / ("ddl-chaos-test-" + std::to_string(getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "runs");
    const std::string bin = DDL_BIN_DIR;
    ASSERT_EQ(run({bin + "/ddl-coordinator", "init-pki", pki()}), 0) << slurp(dir_ / "run.log");
    for (const char* node : {"n1", "n2"}) {
      ASSERT_EQ(run({bin + "/ddl-coordinator", "--pki-dir", pki(), "issue-node", node, "--out",
                     (dir_ / (std::string(node) + "-pki")).string()}),
                0)
          << slurp(dir_ / "run.log");
    }
    admin_token_ = slurp(dir_ / "pki" / "admin.token");
    admin_token_.erase(admin_token_.find_last_not_of("\n") + 1);
    if (ha_) {
      startHaCluster();
    } else {
      startCoordinator("127.0.0.1:0");
      // Later starts reuse the first port, so that the agents find the coordinator again.
      listen_ = address_;
    }
    if (HasFatalFailure() || IsSkipped()) return;
    // The ranks are root's where the test runs as root (the coordinator then needs --allow-root-jobs): the
    // account exists on every machine.
    const std::string out = (dir_ / "root.json").string();
    ASSERT_EQ(std::system((ctl() + " admin add-user root -o json > " + out).c_str()), 0);
    const std::string text = slurp(out);
    const size_t at = text.find("\"token\":\"");
    ASSERT_NE(at, std::string::npos) << text;
    root_token_ = text.substr(at + 9, text.find('"', at + 9) - at - 9);
    std::ofstream(dir_ / "root.token") << root_token_ << "\n";
    for (int i = 1; i <= 2; ++i) startAgent(i);
    ASSERT_TRUE(waitFor([&] { return upNodes() == 2; }, 20000)) << slurp(dir_ / "agent-n1.log");
  }

  void TearDown() override {
    for (auto& [name, pid] : agents_) stop(pid);
    if (ha_) coordinator_ = -1;  // one of coordinators_
    stop(coordinator_);
    for (pid_t& pid : coordinators_) stop(pid);
    for (pid_t p : processesWithMarker(marker_)) kill(p, SIGKILL);  // only after a failure: the test checks none is left
    if (HasFailure()) {
      for (size_t i = 0; i < coordinators_.size(); ++i) {
        std::cerr << "--- coordinator " << i << " log (tail)\n"
                  << tail(dir_ / ("coordinator-" + std::to_string(i) + ".log"));
      }
      std::cerr << "chaos seed " << seed_ << "\n--- coordinator log (tail)\n" << tail(dir_ / "coordinator.log")
                << "--- agent n1 log (tail)\n" << tail(dir_ / "agent-n1.log") << "--- agent n2 log (tail)\n"
                << tail(dir_ / "agent-n2.log");
    }
    if (!HasFailure() || std::getenv("DDL_CHAOS_KEEP") == nullptr) fs::remove_all(dir_);
  }

  static std::string tail(const fs::path& p) {
    std::string s = slurp(p);
    return s.size() > 12000 ? s.substr(s.size() - 12000) : s;
  }
  std::string pki() const { return (dir_ / "pki").string(); }
  int run(const std::vector<std::string>& argv) { return ddl::e2e::runToEnd(argv, dir_ / "run.log"); }
  std::string ctl(const std::string& token_file = "") const {
    return std::string(DDL_BIN_DIR) + "/ddlctl --coordinator " + listen_or_address() + " --ca " + pki() +
           "/ca.crt --token-file " + (token_file.empty() ? pki() + "/admin.token" : token_file);
  }
  std::string listen_or_address() const { return listen_.empty() ? address_ : listen_; }

  void startCoordinator(const std::string& listen) {
    fs::remove(dir_ / "coordinator" / "coordinator.addr");
    coordinator_ = spawn({std::string(DDL_BIN_DIR) + "/ddl-coordinator", "--listen", listen, "--http", "127.0.0.1:0",
                          "--data-dir", (dir_ / "coordinator").string(), "--heartbeat-grace", "3", "--pki-dir", pki(),
                          "--allow-root-jobs"},
                         dir_ / "coordinator.log");
    ASSERT_TRUE(waitFor(
        [&] {
          int status = 0;
          if (waitpid(coordinator_, &status, WNOHANG) == coordinator_) {  // e.g. the port not free yet: try again
            coordinator_ = spawn({std::string(DDL_BIN_DIR) + "/ddl-coordinator", "--listen", listen, "--http",
                                  "127.0.0.1:0", "--data-dir", (dir_ / "coordinator").string(), "--heartbeat-grace",
                                  "3", "--pki-dir", pki(), "--allow-root-jobs"},
                                 dir_ / "coordinator.log");
          }
          return fs::exists(dir_ / "coordinator" / "coordinator.addr");
        },
        20000))
        << tail(dir_ / "coordinator.log");
    std::ifstream in(dir_ / "coordinator" / "coordinator.addr");
    std::getline(in, address_);
    grpc::ChannelArguments args;
    ddl::tls::addChannelArgs(&args);
    user_ = v1::UserService::NewStub(
        grpc::CreateCustomChannel(address_, ddl::tls::channelCredentials({pki() + "/ca.crt", "", ""}), args));
  }
  // HA: a 3-member etcd cluster and three coordinators on it, of which one leads.
  void startHaCluster() {
#ifdef DDL_HAVE_ETCD
    if (std::string why = etcd_.start(3); !why.empty()) GTEST_SKIP() << why;
    std::string endpoints;
    for (const std::string& e : etcd_.endpoints()) endpoints += (endpoints.empty() ? "" : ",") + e;
    store_url_ = "etcd://" + endpoints + "/chaos/";
    ddl::state::EtcdStore::Options options;
    options.endpoints = etcd_.endpoints();
    options.prefix = "/chaos/";
    ASSERT_TRUE(waitFor([&] { return static_cast<bool>(ddl::state::EtcdStore::open(options)); }, 30000))
        << "etcd never answered";
    for (int i = 0; i < 3; ++i) {
      const int port = ddl::test_util::EtcdForTest::freePort();
      ASSERT_GT(port, 0);
      listens_.push_back("127.0.0.1:" + std::to_string(port));
      listen_ += (i ? "," : "") + listens_.back();
      coordinators_.push_back(-1);
      startHaCoordinator(i);
    }
    ASSERT_TRUE(waitFor([&] { return followLeader(); }, 20000)) << "no coordinator leads";
#else
    GTEST_SKIP() << "built without the etcd client";
#endif
  }
  void startHaCoordinator(size_t i) {
    const fs::path data = dir_ / ("coordinator-" + std::to_string(i));
    fs::remove(data / "coordinator.addr");
    coordinators_[i] =
        spawn({std::string(DDL_BIN_DIR) + "/ddl-coordinator", "--listen", listens_[i], "--http",
               "127.0.0.1:0", "--data-dir", data.string(), "--heartbeat-grace", "3", "--pki-dir", pki(),
               "--allow-root-jobs", "--store", store_url_, "--etcd-insecure", "--leader-lease", "3"},
              dir_ / ("coordinator-" + std::to_string(i) + ".log"));
  }
  // HA: points the test's own stub at the coordinator that leads now (the newest address file of a live one);
  // false when none leads.
  bool followLeader() {
    if (!ha_) return true;
    int best = -1;
    fs::file_time_type newest;
    for (size_t i = 0; i < coordinators_.size(); ++i) {
      std::error_code ec;
      const fs::path addr = dir_ / ("coordinator-" + std::to_string(i)) / "coordinator.addr";
      const auto t = fs::last_write_time(addr, ec);
      if (ec || coordinators_[i] <= 0 || frozen_.count(coordinators_[i])) continue;
      if (best < 0 || t > newest) best = static_cast<int>(i), newest = t;
    }
    if (best < 0) return false;
    coordinator_ = coordinators_[best];
    leader_ = best;
    std::string address = listens_[best];
    if (address != address_ || !user_) {
      address_ = address;
      grpc::ChannelArguments args;
      ddl::tls::addChannelArgs(&args);
      user_ = v1::UserService::NewStub(grpc::CreateCustomChannel(
          address_, ddl::tls::channelCredentials({pki() + "/ca.crt", "", ""}), args));
    }
    return true;
  }
  // HA: coordinators that exited (one that found its lease gone) start again, as standbys.
  void reviveCoordinators() {
    for (size_t i = 0; i < coordinators_.size(); ++i) {
      int status = 0;
      if (coordinators_[i] > 0 && waitpid(coordinators_[i], &status, WNOHANG) == coordinators_[i]) {
        coordinators_[i] = -1;
      }
      if (coordinators_[i] <= 0) startHaCoordinator(i);
    }
  }

  void startAgent(int i) {
    const std::string node = "n" + std::to_string(i);
    const std::string ports = i == 1 ? "31200-31299" : "31300-31399";
    agents_[node] = spawn({std::string(DDL_BIN_DIR) + "/ddl-agent", "--coordinator", listen_or_address(), "--node",
                           node, "--address", "127.0.0.1", "--labels", "switch=s1", "--virtual-gpus", "2",
                           "--force-virtual", "--data-dir", (dir_ / node).string(), "--port-range", ports,
                           "--pki-dir", (dir_ / (node + "-pki")).string()},
                          dir_ / ("agent-" + node + ".log"));
  }
  static void stop(pid_t& pid) { ddl::e2e::stopProcess(pid); }

  static void killNow(pid_t& pid) {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
  }

  void authorize(grpc::ClientContext* ctx, const std::string& token, int deadline_ms = 3000) const {
    ctx->AddMetadata("authorization", "Bearer " + token);
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  }
  std::optional<v1::ListNodesResponse> nodes() {
    followLeader();
    v1::ListNodesResponse resp;
    grpc::ClientContext ctx;
    authorize(&ctx, admin_token_);
    if (!user_->ListNodes(&ctx, {}, &resp).ok()) return std::nullopt;
    return resp;
  }
  int upNodes() {
    auto resp = nodes();
    if (!resp) return -1;
    int up = 0;
    for (const auto& n : resp->nodes()) up += n.state() == "UP" && n.connected();
    return up;
  }
  std::optional<v1::Job> job(const std::string& id) {
    followLeader();
    v1::GetJobRequest req;
    req.set_id(id);
    v1::Job out;
    grpc::ClientContext ctx;
    authorize(&ctx, admin_token_);
    if (!user_->GetJob(&ctx, req, &out).ok()) return std::nullopt;
    return out;
  }

  // The rank program: records its start (and a second start of the same attempt's rank), runs a while, exits
  // with the job's planned code for this attempt, and records that. argv[0] of the shell carries the marker.
  std::vector<std::string> rankCommand(int fails, int sleep_ms) const {
    const std::string runs = (dir_ / "runs").string();
    std::ostringstream script;
    script << "d=" << runs << "/$DDL_JOB_ID; mkdir -p $d; f=$d/a${DDL_JOB_ATTEMPT}-r${DDL_RANK}; "
           << "[ -e $f.start ] && echo $$ >> $f.dup; echo $$ > $f.start; sleep " << sleep_ms / 1000.0 << "; "
           << "if [ ${DDL_JOB_ATTEMPT} -le " << fails << " ]; then c=1; else c=0; fi; echo $c > $f.exit; exit $c";
    return {"/bin/sh", "-c", script.str(), marker_};
  }

  // One job, through the API or ddlctl; recorded only when acknowledged.
  void submitOne() {
    std::uniform_int_distribution<int> shape(0, 3), fails(0, 2), restarts(0, 2), sleep_ms(200, 1200), coin(0, 2);
    Acked a;
    const int s = shape(rng_);
    const int nodes = s >= 2 ? 2 : 1, per_node = s % 2 == 1 ? 2 : 1;
    a.world = nodes * per_node;
    a.fails = fails(rng_) == 2 ? 1 : 0;
    a.restarts = restarts(rng_);
    a.via_ctl = coin(rng_) == 0;
    const auto command = rankCommand(a.fails, sleep_ms(rng_));
    if (a.via_ctl) {
      std::string cmd = ctl((dir_ / "root.token").string()) + " submit --nodes " + std::to_string(nodes) +
                        " --gpus-per-node " + std::to_string(per_node) + " --max-restarts " +
                        std::to_string(a.restarts) + " --";
      for (const auto& arg : command) cmd += " '" + arg + "'";  // no ' in the script
      cmd += " > " + (dir_ / "ctl.out").string() + " 2>>" + (dir_ / "run.log").string();
      // ddlctl's own deadline bounds this; a frozen coordinator makes it time out, which is not an ack.
      fs::remove(dir_ / "ctl.out");
      if (std::system(("timeout 5 " + cmd).c_str()) != 0) return;
      std::string id = slurp(dir_ / "ctl.out");
      id.erase(id.find_last_not_of("\n ") + 1);
      if (id.empty()) return;
      a.id = id;
    } else {
      followLeader();
      v1::SubmitRequest req;
      auto* spec = req.mutable_spec();
      spec->set_nodes(nodes);
      spec->set_gpus_per_node(per_node);
      spec->set_max_restarts(a.restarts);
      for (const auto& arg : command) spec->add_command(arg);
      v1::SubmitResponse resp;
      grpc::ClientContext ctx;
      authorize(&ctx, root_token_);
      if (!user_->Submit(&ctx, req, &resp).ok()) return;
      a.id = resp.job().id();
    }
    acked_.push_back(a);
  }

  void cancelOne() {
    if (acked_.empty()) return;
    followLeader();
    std::uniform_int_distribution<size_t> pick(0, acked_.size() - 1);
    v1::CancelJobRequest req;
    req.set_id(acked_[pick(rng_)].id);
    v1::Job out;
    grpc::ClientContext ctx;
    authorize(&ctx, admin_token_);
    user_->CancelJob(&ctx, req, &out);  // may fail: finished already, or the coordinator is down
  }

  // One random disruption; what it froze is thawed later by thaw().
  void disrupt(std::ostream& log) {
    std::uniform_int_distribution<int> what(0, 9), node(1, 2);
    const int w = what(rng_);
    const std::string n = "n" + std::to_string(node(rng_));
    if (w == 0 && ha_) {
      killLeader(log);
    } else if (w == 0) {
      log << "SIGKILL coordinator; ";
      killNow(coordinator_);
      startCoordinator(listen_);
    } else if (w == 1) {
      if (!followLeader() || coordinator_ <= 0) return;  // HA: none leads this moment
      log << "SIGSTOP coordinator; ";
      kill(coordinator_, SIGSTOP);
      frozen_.insert(coordinator_);
    } else if (w == 2 || w == 3) {
      log << "SIGKILL agent " << n << "; ";
      killNow(agents_[n]);
      startAgent(n == "n1" ? 1 : 2);
    } else if (w == 4) {
      if (agents_[n] <= 0) return;
      log << "SIGSTOP agent " << n << "; ";
      kill(agents_[n], SIGSTOP);
      frozen_.insert(agents_[n]);
    } else if (w <= 7) {
      auto ranks = processesWithMarker(marker_);
      if (ranks.empty()) return;
      std::uniform_int_distribution<size_t> pick(0, ranks.size() - 1);
      log << "SIGKILL a rank; ";
      kill(ranks[pick(rng_)], SIGKILL);
    } else if (ha_) {
      disruptEtcd(log);
    }
  }
  // HA: SIGKILL of the coordinator that leads now (if one does), started again at once as a standby.
  void killLeader(std::ostream& log) {
    if (!followLeader()) return;
    log << "SIGKILL the leader (coordinator " << leader_ << "); ";
    killNow(coordinators_[leader_]);
    coordinator_ = -1;
    startHaCoordinator(leader_);
    ++leader_kills_;
  }
  // HA: kills an etcd member, or starts the killed one again: never more than one down, so a quorum stays.
  void disruptEtcd(std::ostream& log) {
#ifdef DDL_HAVE_ETCD
    for (size_t i = 0; i < etcd_.size(); ++i) {
      if (!etcd_.running(i)) {
        log << "etcd member " << i << " back; ";
        etcd_.restart(i);
        return;
      }
    }
    std::uniform_int_distribution<size_t> pick(0, etcd_.size() - 1);
    const size_t i = pick(rng_);
    log << "SIGKILL etcd member " << i << "; ";
    etcd_.kill(i);
#else
    (void)log;
#endif
  }
  void restartEtcd() {
#ifdef DDL_HAVE_ETCD
    for (size_t i = 0; i < etcd_.size(); ++i) etcd_.restart(i);
#endif
  }
  void thaw() {
    for (pid_t p : frozen_) {
      if (p > 0) kill(p, SIGCONT);  // never -1: that would signal every process
    }
    frozen_.clear();
  }
  void runChaos();  // the chaos, then the checks (below)

  bool ha_ = false;  // set by HaChaosTest's constructor
  std::string store_url_;
  std::vector<pid_t> coordinators_;  // HA: the three, by index; listens_ their addresses
  std::vector<std::string> listens_;
  int leader_ = -1;
  int leader_kills_ = 0;
#ifdef DDL_HAVE_ETCD
  ddl::test_util::EtcdForTest etcd_;
#endif
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::string marker_;
  fs::path dir_;
  pid_t coordinator_ = -1;
  std::map<std::string, pid_t> agents_;
  std::string address_, listen_;
  std::unique_ptr<v1::UserService::Stub> user_;
  std::string admin_token_, root_token_;
  std::vector<Acked> acked_;
  std::set<pid_t> frozen_;
};

bool isFinal(v1::JobState s) { return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED; }

class HaChaosTest : public ChaosTest {
 protected:
  HaChaosTest() { ha_ = true; }
};

void ChaosTest::runChaos() {
  std::uniform_int_distribution<int> jobs(0, 2), pause_ms(100, 1500), coin(0, 9);
  const auto t0 = Clock::now();
  std::ostringstream log;
  for (int round = 0; round < kRounds && Clock::now() - t0 < std::chrono::seconds(kChaosSeconds); ++round) {
    log << "round " << round << " at " << std::chrono::duration<double>(Clock::now() - t0).count() << " s: ";
    for (int j = jobs(rng_); j > 0; --j) submitOne();
    if (coin(rng_) == 0) cancelOne();
    if (coin(rng_) < 4) disrupt(log);
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms(rng_)));
    if (coin(rng_) < 6) thaw();  // a frozen process stays frozen across some rounds (longer than the grace)
    if (ha_) reviveCoordinators();
    log << "\n";
  }
  if (ha_ && leader_kills_ == 0) {
    // The dice may have killed no leader: a failover while jobs run is what this test is for.
    thaw();
    ASSERT_TRUE(waitFor([&] { return followLeader(); }, 30000)) << "no coordinator leads";
    log << "at the end: ";
    killLeader(log);
    log << "\n";
    EXPECT_EQ(leader_kills_, 1);
  }
  thaw();
  std::cout << log.str() << "acknowledged " << acked_.size() << " jobs" << std::endl;
  if (ha_) {
    restartEtcd();
    // A thawed leader finds its lease gone and exits; every coordinator runs again, one of them leading.
    ASSERT_TRUE(waitFor(
        [&] {
          reviveCoordinators();
          return followLeader();
        },
        30000))
        << "no coordinator leads after the chaos";
  } else if (coordinator_ <= 0) {
    startCoordinator(listen_);
  }
  for (auto& [node, pid] : agents_) {
    if (pid <= 0) startAgent(node == "n1" ? 1 : 2);
  }

  // Settle: both nodes back, every acknowledged job ended.
  ASSERT_TRUE(waitFor([&] { return upNodes() == 2; }, 30000)) << "nodes not back after the chaos";
  std::map<std::string, v1::Job> final;
  const bool settled = waitFor(
      [&] {
        for (const auto& a : acked_) {
          if (final.count(a.id)) continue;
          auto j = job(a.id);
          if (!j || !isFinal(j->state())) return false;
          final[a.id] = *j;
        }
        return true;
      },
      kSettleSeconds * 1000);
  for (const auto& a : acked_) {
    auto j = job(a.id);
    ASSERT_TRUE(j.has_value()) << "acknowledged job " << a.id << " is lost";
    EXPECT_TRUE(isFinal(j->state())) << "job " << a.id << " has not ended: " << j->DebugString();
  }
  ASSERT_TRUE(settled);
  // Jobs whose submit was never acknowledged (a timed-out ddlctl) may exist too: they end as well.
  EXPECT_TRUE(waitFor(
      [&] {
        v1::ListJobsRequest req;
        for (auto s : {v1::PENDING, v1::SCHEDULED, v1::STARTING, v1::RUNNING}) req.add_states(s);
        v1::ListJobsResponse resp;
        grpc::ClientContext ctx;
        authorize(&ctx, admin_token_);
        followLeader();
        return user_->ListJobs(&ctx, req, &resp).ok() && resp.jobs_size() == 0;
      },
      kSettleSeconds * 1000));

  // What the ranks really did.
  int succeeded = 0, failed = 0, cancelled = 0;
  for (const auto& a : acked_) {
    const v1::Job& j = final[a.id];
    const fs::path runs = dir_ / "runs" / a.id;
    std::map<int, int> zero_exits;  // attempt -> ranks that wrote exit 0
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(runs, ec)) {
      const std::string name = e.path().filename().string();
      EXPECT_NE(e.path().extension(), ".dup") << "job " << a.id << ": a rank of one attempt started twice: " << name
                                              << " (pids " << slurp(e.path()) << ")";
      if (e.path().extension() == ".exit" && slurp(e.path()) == "0\n") {
        zero_exits[std::atoi(name.c_str() + 1)]++;
      }
    }
    if (j.state() == v1::SUCCEEDED) {
      ++succeeded;
      bool some_attempt_all_zero = false;
      for (const auto& [attempt, n] : zero_exits) some_attempt_all_zero |= n == a.world;
      EXPECT_TRUE(some_attempt_all_zero) << "job " << a.id << " SUCCEEDED but no attempt had all " << a.world
                                         << " ranks exit 0: " << j.DebugString();
      EXPECT_LE(j.restarts(), a.restarts) << j.DebugString();
    } else if (j.state() == v1::FAILED) {
      ++failed;
    } else {
      ++cancelled;
    }
  }
  std::cout << "ended: " << succeeded << " succeeded, " << failed << " failed, " << cancelled << " cancelled"
            << std::endl;

  // Nothing held: no GPU allocated once every job ended, and no rank process left.
  EXPECT_TRUE(waitFor(
      [&] {
        auto resp = nodes();
        if (!resp) return false;
        for (const auto& n : resp->nodes()) {
          if (n.gpus_used_size() > 0) return false;
        }
        return true;
      },
      15000))
      << (nodes() ? nodes()->DebugString() : "ListNodes failed");
  EXPECT_TRUE(waitFor([&] { return processesWithMarker(marker_).empty(); }, 15000))
      << processesWithMarker(marker_).size() << " rank processes left";
}

TEST_F(ChaosTest, JobsSurviveKillsOfCoordinatorAgentsAndRanks) { runChaos(); }

// Issue 30's failover and chaos test: the leader killed or frozen while jobs flow, etcd members killed.
TEST_F(HaChaosTest, JobsSurviveLeaderKillsAndEtcdMemberKills) { runChaos(); }

}  // namespace
