// The Coordinator object driven directly: a fake clock, fake agent links that record commands, and the
// in-memory or SQLite store. Covers the job lifecycle, failures, cancel, node loss, requeue, drain, gang
// waiting, refusal at submit, and a restart that reconciles with the agents.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "service/blocking_coordinator.h"
#include "state/data_dir_lock.h"
#include "state/memory_store.h"
#include "state/sqlite_store.h"

namespace ddl::coordinator {
namespace {

class RecordingLink : public AgentLink {
 public:
  void send(const v1::Command& c) override { commands.push_back(c); }
  void close() override { closed = true; }
  std::vector<v1::Command> commands;
  bool closed = false;
};

v1::JobSpec spec(int nodes, int gpus_per_node, int max_restarts = 0) {
  v1::JobSpec s;
  s.set_name("train");
  s.set_user("alice");
  s.set_nodes(nodes);
  s.set_gpus_per_node(gpus_per_node);
  s.set_max_restarts(max_restarts);
  s.add_command("/bin/train");
  s.add_command("--epochs=1");
  s.add_env("FOO=bar=baz");
  s.set_workdir("/tmp");
  return s;
}

// A job of `gpus` GPUs on one node that `user` charges to `account`.
v1::JobSpec chargedSpec(const std::string& user, const std::string& account, int gpus = 1) {
  v1::JobSpec s = spec(1, gpus);
  s.set_user(user);
  s.set_account(account);
  return s;
}

v1::RankStatus rankStatus(const std::string& job, int attempt, int rank, int gpu,
                          v1::RankStatus::State st = v1::RankStatus::RUNNING, std::optional<int> code = {},
                          std::optional<int> sig = {}) {
  v1::RankStatus r;
  r.set_job_id(job);
  r.set_attempt(attempt);
  r.set_rank(rank);
  r.set_gpu(gpu);
  r.set_state(st);
  if (code) r.set_exit_code(*code);
  if (sig) r.set_signal(*sig);
  return r;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { makeCoordinator(std::make_unique<state::MemoryStore>()); }

  void makeCoordinator(std::unique_ptr<state::Store> store) {
    coordinator.reset();
    store_ = std::move(store);
    CoordinatorOptions o = options;
    o.heartbeat_grace_ms = 10000;
    coordinator = std::make_unique<BlockingCoordinator>(*store_, o, [this] { return now; });
    ASSERT_TRUE(coordinator->recover());
  }

  // Registers and attaches a node with `gpus` GPUs (and a rendezvous port range of its own where given); returns
  // its session.
  std::string addNode(const std::string& name, int gpus, std::map<std::string, std::string> labels = {},
                      std::vector<v1::RankStatus> ranks = {}, std::pair<int, int> ports = {0, 0}) {
    v1::RegisterRequest req;
    req.set_node(name);
    req.set_address("10.0.0." + name.substr(1));
    req.set_port_first(ports.first);
    req.set_port_last(ports.second);
    for (int i = 0; i < gpus; ++i) {
      auto* g = req.add_gpus();
      g->set_index(i);
      g->set_uuid(name + "-gpu" + std::to_string(i));
    }
    for (auto& [k, v] : labels) (*req.mutable_labels())[k] = v;
    for (auto& r : ranks) *req.add_ranks() = r;
    for (int c : node_cpus) req.add_cpus(c);
    req.set_memory_bytes(node_memory);
    req.set_confinement(node_confinement);
    auto resp = coordinator->registerAgent(req);
    EXPECT_TRUE(resp) << resp.status().toString();
    links[name] = std::make_shared<RecordingLink>();
    sessions[name] = resp->session();
    EXPECT_TRUE(coordinator->attachAgent(name, resp->session(), links[name]));
    return resp->session();
  }

  std::string submit(const v1::JobSpec& s) {
    auto job = coordinator->submit(s);
    EXPECT_TRUE(job) << job.status().toString();
    return job ? job->id() : "";
  }

  v1::JobState stateOf(const std::string& id) { return coordinator->getJob(id)->state(); }

  // The StartRanks commands a node got for a job.
  std::vector<v1::StartRanks> starts(const std::string& node, const std::string& job) {
    std::vector<v1::StartRanks> out;
    for (const auto& c : links[node]->commands) {
      if (c.has_start() && c.start().job_id() == job) out.push_back(c.start());
    }
    return out;
  }
  int stops(const std::string& node, const std::string& job) {
    int n = 0;
    for (const auto& c : links[node]->commands) n += c.has_stop() && c.stop().job_id() == job;
    return n;
  }

  // Reports every rank of the node's latest start for the job as RUNNING.
  void runAll(const std::string& node, const std::string& job) {
    ASSERT_FALSE(starts(node, job).empty());
    auto s = starts(node, job).back();
    for (const auto& r : s.ranks()) {
      ASSERT_TRUE(coordinator->rankEvent(node, sessions[node], rankStatus(job, s.attempt(), r.rank(), r.gpu())));
    }
  }
  // A heartbeat in which the node's ranks of the job (its latest start) are all running.
  Status beat(const std::string& node, const std::string& job) {
    v1::Heartbeat hb;
    auto s = starts(node, job).back();
    for (const auto& r : s.ranks()) *hb.add_ranks() = rankStatus(job, s.attempt(), r.rank(), r.gpu());
    return coordinator->heartbeat(node, sessions[node], hb);
  }
  // Nodes of `gpus` GPUs each, and job `s` placed on them and running on every one; its id.
  std::string runningOn(std::initializer_list<const char*> nodes, int gpus, const v1::JobSpec& s) {
    for (const char* n : nodes) addNode(n, gpus);
    const std::string id = submit(s);
    coordinator->tick();
    for (const char* n : nodes) runAll(n, id);
    return id;
  }
  void exitAll(const std::string& node, const std::string& job, int code = 0) {
    ASSERT_FALSE(starts(node, job).empty());
    exitRanks(node, starts(node, job).back(), code);
  }
  void exitRanks(const std::string& node, const v1::StartRanks& s, int code = 0) {
    const std::string& job = s.job_id();
    for (const auto& r : s.ranks()) {
      ASSERT_TRUE(coordinator->rankEvent(
          node, sessions[node], rankStatus(job, s.attempt(), r.rank(), r.gpu(), v1::RankStatus::EXITED, code)));
    }
  }

  int64_t now = 1'000'000;
  std::vector<int> node_cpus;  // what addNode's agents offer ranks
  int64_t node_memory = 0;
  std::string node_confinement;
  CoordinatorOptions options;
  std::unique_ptr<state::Store> store_;
  std::unique_ptr<BlockingCoordinator> coordinator;
  std::map<std::string, std::shared_ptr<RecordingLink>> links;
  std::map<std::string, std::string> sessions;
};

std::map<std::string, std::string> envOf(const v1::RankLaunch& r) {
  std::map<std::string, std::string> env;
  for (const auto& e : r.env()) env[e.name()] = e.value();  // later entries win, as on the agent
  return env;
}

TEST_F(CoordinatorTest, JobRunsThroughEveryStateToSucceeded) {
  addNode("n1", 2, {{"switch", "s1"}});
  addNode("n2", 2, {{"switch", "s1"}});
  std::string id = submit(spec(2, 2));
  EXPECT_EQ(stateOf(id), v1::PENDING);
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::STARTING);
  ASSERT_EQ(starts("n1", id).size(), 1u);
  ASSERT_EQ(starts("n2", id).size(), 1u);
  const auto s1 = starts("n1", id)[0];
  EXPECT_EQ(s1.attempt(), 1);
  EXPECT_EQ(s1.command_size(), 2);
  EXPECT_EQ(s1.workdir(), "/tmp");
  ASSERT_EQ(s1.ranks_size(), 2);
  auto env = envOf(s1.ranks(1));
  EXPECT_EQ(env["DDL_RANK"], "1");
  EXPECT_EQ(env["RANK"], "1");
  EXPECT_EQ(env["DDL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["WORLD_SIZE"], "4");
  EXPECT_EQ(env["DDL_LOCAL_RANK"], "1");
  EXPECT_EQ(env["DDL_TOPOLOGY"], "2x2");
  EXPECT_EQ(env["DDL_JOB_ID"], id);
  EXPECT_EQ(env["FOO"], "bar=baz");
  EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(env["DDL_ROOT"], "10.0.0.1:" + std::to_string(std::stoi(env["MASTER_PORT"]) - 1));
  auto env2 = envOf(starts("n2", id)[0].ranks(0));
  EXPECT_EQ(env2["DDL_RANK"], "2");
  EXPECT_EQ(env2["DDL_ROOT"], env["DDL_ROOT"]);

  runAll("n1", id);
  EXPECT_EQ(stateOf(id), v1::STARTING);  // n2's ranks have not started
  runAll("n2", id);
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  exitAll("n1", id);
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  exitAll("n2", id);
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  std::vector<v1::JobState> path;
  for (const auto& t : job->transitions()) path.push_back(t.to());
  EXPECT_EQ(path, (std::vector<v1::JobState>{v1::PENDING, v1::SCHEDULED, v1::STARTING, v1::RUNNING,
                                             v1::SUCCEEDED}));
  EXPECT_EQ(stops("n1", id), 1);  // releases the exited ranks
  EXPECT_FALSE(job->has_failure());
}

TEST_F(CoordinatorTest, FailingRankFailsTheJobNamingItAndStopsTheOthers) {
  addNode("n1", 2);
  addNode("n2", 2);
  std::string id = submit(spec(2, 2));
  coordinator->tick();
  runAll("n1", id);
  runAll("n2", id);
  auto s = starts("n2", id)[0];
  ASSERT_TRUE(coordinator->rankEvent("n2", sessions["n2"],
                                     rankStatus(id, 1, 3, s.ranks(1).gpu(), v1::RankStatus::EXITED, 7)));
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_EQ(job->failure().rank(), 3);
  EXPECT_EQ(job->failure().host(), "n2");
  EXPECT_EQ(job->failure().exit_code(), 7);
  EXPECT_NE(job->reason().find("rank 3 on node n2 exited with code 7"), std::string::npos) << job->reason();
  EXPECT_EQ(stops("n1", id), 1);
  EXPECT_EQ(stops("n2", id), 1);
  // The other ranks dying from the stop change nothing.
  ASSERT_TRUE(coordinator->rankEvent("n1", sessions["n1"],
                                     rankStatus(id, 1, 0, 0, v1::RankStatus::EXITED, {}, 15)));
  EXPECT_EQ(coordinator->getJob(id)->failure().rank(), 3);
}

TEST_F(CoordinatorTest, RankThatVanishesFromHeartbeatsFailsTheJob) {
  addNode("n1", 2);
  std::string id = submit(spec(1, 2));
  coordinator->tick();
  runAll("n1", id);
  ASSERT_TRUE(beat("n1", id));
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  v1::Heartbeat only_rank0;
  *only_rank0.add_ranks() = rankStatus(id, 1, 0, 0);
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], only_rank0));
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->reason().find("rank 1 of job " + id + " vanished"), std::string::npos) << job->reason();
}

TEST_F(CoordinatorTest, ReportsThatDoNotMatchTheLaunchAreIgnored) {
  addNode("n1", 1);
  addNode("n2", 1);
  std::string id = submit(spec(1, 1));
  coordinator->tick();
  std::string placed = coordinator->getJob(id)->allocation(0).node();
  std::string other = placed == "n1" ? "n2" : "n1";
  // Attempt 0 (would mean "stop every attempt"), a future attempt, and the right rank from the wrong node.
  ASSERT_TRUE(coordinator->rankEvent(placed, sessions[placed], rankStatus(id, 0, 0, 0)));
  ASSERT_TRUE(coordinator->rankEvent(placed, sessions[placed], rankStatus(id, 5, 0, 0, v1::RankStatus::EXITED, 1)));
  ASSERT_TRUE(coordinator->rankEvent(other, sessions[other], rankStatus(id, 1, 0, 0, v1::RankStatus::EXITED, 1)));
  EXPECT_EQ(stateOf(id), v1::STARTING);
  EXPECT_EQ(stops(placed, id), 0);
  // An exit without a status is not a success.
  ASSERT_TRUE(coordinator->rankEvent(placed, sessions[placed], rankStatus(id, 1, 0, 0)));
  ASSERT_TRUE(coordinator->rankEvent(placed, sessions[placed], rankStatus(id, 1, 0, 0, v1::RankStatus::EXITED)));
  EXPECT_EQ(stateOf(id), v1::FAILED);
}

// The agent's reason (RankStatus.error: its user does not exist on the node, ...) becomes the job's.
TEST_F(CoordinatorTest, ARankThatCouldNotStartFailsTheJobWithTheAgentsReason) {
  addNode("n1", 1);
  std::string id = submit(spec(1, 1));
  coordinator->tick();
  ASSERT_EQ(starts("n1", id).size(), 1u);
  EXPECT_EQ(starts("n1", id)[0].user(), "alice");
  v1::RankStatus failed = rankStatus(id, 1, 0, 0, v1::RankStatus::EXITED, 127);
  failed.set_error("user 'alice' does not exist on node n1");
  ASSERT_TRUE(coordinator->rankEvent("n1", sessions["n1"], failed));
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_EQ(job->failure().exit_code(), 127);
  EXPECT_NE(job->reason().find("rank 0 on node n1 could not start: user 'alice' does not exist on node n1"),
            std::string::npos)
      << job->reason();
}

TEST_F(CoordinatorTest, SignalIsReportedByName) {
  addNode("n1", 1);
  std::string id = submit(spec(1, 1));
  coordinator->tick();
  runAll("n1", id);
  ASSERT_TRUE(coordinator->rankEvent("n1", sessions["n1"], rankStatus(id, 1, 0, 0, v1::RankStatus::EXITED, {}, 9)));
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->failure().signal(), 9);
  EXPECT_NE(job->reason().find("SIGKILL"), std::string::npos) << job->reason();
}

TEST_F(CoordinatorTest, CancelStopsRanksAndFreesGpus) {
  addNode("n1", 2);
  std::string a = submit(spec(1, 2));
  std::string b = submit(spec(1, 2));
  coordinator->tick();
  EXPECT_EQ(stateOf(a), v1::STARTING);
  EXPECT_EQ(stateOf(b), v1::PENDING);
  EXPECT_NE(coordinator->getJob(b)->reason().find("waiting"), std::string::npos) << coordinator->getJob(b)->reason();
  runAll("n1", a);
  auto c = coordinator->cancel(a);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->state(), v1::CANCELLED);
  EXPECT_EQ(stops("n1", a), 1);
  // The ranks are still dying: their GPUs stay taken until the agent stops reporting them running.
  v1::Heartbeat hb;
  *hb.add_ranks() = rankStatus(a, 1, 0, 0);
  *hb.add_ranks() = rankStatus(a, 1, 1, 1);
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], hb));
  coordinator->tick();
  EXPECT_EQ(stateOf(b), v1::PENDING);
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], v1::Heartbeat()));
  coordinator->tick();
  EXPECT_EQ(stateOf(b), v1::STARTING);
  // Cancelling a finished job is refused and changes nothing.
  auto again = coordinator->cancel(a);
  EXPECT_EQ(again.status().code(), state::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator->cancel("j-999").status().code(), state::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, MissedHeartbeatsMarkNodeDownAndFailItsJobsOnly) {
  addNode("n1", 2);
  addNode("n2", 2);
  std::string a = submit(spec(1, 2));
  std::string b = submit(spec(1, 2));
  coordinator->tick();
  std::string a_node = coordinator->getJob(a)->allocation(0).node();
  std::string b_node = coordinator->getJob(b)->allocation(0).node();
  ASSERT_NE(a_node, b_node);
  runAll(a_node, a);
  runAll(b_node, b);
  now += 9000;
  ASSERT_TRUE(beat(b_node, b));
  coordinator->tick();
  EXPECT_EQ(stateOf(a), v1::RUNNING);  // within the grace period
  now += 2000;
  coordinator->tick();
  auto job = coordinator->getJob(a);
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_EQ(job->reason().rfind("node_lost", 0), 0u) << job->reason();
  EXPECT_EQ(stateOf(b), v1::RUNNING);
  auto nodes = coordinator->listNodes();
  for (const auto& n : nodes) EXPECT_EQ(n.state(), n.name() == a_node ? "DOWN" : "UP");
  EXPECT_TRUE(links[a_node]->closed);
  // The lost node's old session is refused; registering again brings it back UP.
  EXPECT_FALSE(coordinator->heartbeat(a_node, sessions[a_node], v1::Heartbeat()));
  addNode(a_node, 2);
  for (const auto& n : coordinator->listNodes()) EXPECT_EQ(n.state(), "UP");
}

TEST_F(CoordinatorTest, NodeLossRequeuesWhileRestartsRemain) {
  addNode("n1", 2);
  addNode("n2", 2);
  std::string id = submit(spec(1, 2, /*max_restarts=*/1));
  coordinator->tick();
  std::string first = coordinator->getJob(id)->allocation(0).node();
  std::string other = first == "n1" ? "n2" : "n1";
  runAll(first, id);
  now += 6000;
  ASSERT_TRUE(coordinator->heartbeat(other, sessions[other], v1::Heartbeat()));
  now += 6000;
  coordinator->tick();  // `first` is lost; the job goes back to the queue and is placed on `other`
  coordinator->tick();
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_EQ(job->state(), v1::STARTING);
  EXPECT_EQ(job->allocation(0).node(), other);
  EXPECT_EQ(starts(other, id).back().attempt(), 2);
  // A late report from attempt 1 is answered with a stop for attempt 1 and does not touch attempt 2.
  addNode(first, 2, {}, {rankStatus(id, 1, 0, 0)});
  ASSERT_GE(links[first]->commands.size(), 1u);
  EXPECT_TRUE(links[first]->commands.back().has_stop());
  EXPECT_EQ(links[first]->commands.back().stop().attempt(), 1);
  EXPECT_EQ(stateOf(id), v1::STARTING);
  // The second loss has no restarts left.
  runAll(other, id);
  now += 11000;
  ASSERT_TRUE(coordinator->heartbeat(first, sessions[first], v1::Heartbeat()));
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::FAILED);
}

TEST_F(CoordinatorTest, SubmitRefusesJobsThatCanNeverFit) {
  addNode("n1", 4, {{"gpu", "a100"}});
  auto too_big = coordinator->submit(spec(2, 4));
  EXPECT_EQ(too_big.status().code(), state::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.status().message().find("job refused"), std::string::npos) << too_big.status().message();
  v1::JobSpec labelled = spec(1, 1);
  (*labelled.mutable_required_labels())["gpu"] = "h100";
  EXPECT_EQ(coordinator->submit(labelled).status().code(), state::StatusCode::kInvalidArgument);
  v1::JobSpec empty = spec(1, 1);
  empty.clear_command();
  EXPECT_EQ(coordinator->submit(empty).status().code(), state::StatusCode::kInvalidArgument);
  v1::JobSpec negative = spec(1, -1);
  EXPECT_EQ(coordinator->submit(negative).status().code(), state::StatusCode::kInvalidArgument);
  v1::JobSpec topo = spec(1, 4);
  topo.set_topology("3x1");
  EXPECT_EQ(coordinator->submit(topo).status().code(), state::StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator->listJobs(v1::ListJobsRequest())->jobs_size(), 0);  // nothing refused was stored
}

TEST_F(CoordinatorTest, DrainedNodeTakesNoNewWorkAndTheReasonSaysSo) {
  addNode("n1", 2);
  auto drained = coordinator->drain("n1", true);
  ASSERT_TRUE(drained);
  EXPECT_EQ(drained->state(), "DRAINING");
  std::string id = submit(spec(1, 2));  // feasible: a drain usually ends
  coordinator->tick();
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::PENDING);
  EXPECT_NE(job->reason().find("n1 draining"), std::string::npos) << job->reason();
  ASSERT_TRUE(coordinator->drain("n1", false));
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::STARTING);
  EXPECT_EQ(coordinator->drain("nope", true).status().code(), state::StatusCode::kNotFound);
}

// A GPU fault in a heartbeat: the job on that GPU fails (requeued: it has a restart), the GPU leaves
// placement (kept in the store) until an admin clears it, and the agent is told; a report of the cleared
// fault still in flight does not raise it again.
TEST_F(CoordinatorTest, AFaultedGpuFailsItsJobAndTakesNoneUntilCleared) {
  addNode("n1", 2);
  const std::string a = submit(spec(1, 1, /*max_restarts=*/1));
  coordinator->tick();
  runAll("n1", a);
  ASSERT_EQ(starts("n1", a).back().ranks(0).gpu(), 0);
  v1::Heartbeat hb;
  v1::GpuFault* f = hb.add_gpu_faults();
  f->set_gpu(0);
  f->set_reason("Xid 79 (fallen off the bus)");
  f->set_xid(79);
  f->set_at_ms(5);
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], hb));
  auto job = coordinator->getJob(a);
  EXPECT_EQ(job->state(), v1::PENDING);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_NE(
      job->transitions().rbegin()->reason().find("GPU 0 of node n1 failed: Xid 79 (fallen off the bus)"),
      std::string::npos)
      << job->DebugString();
  ASSERT_EQ(coordinator->listNodes()[0].gpu_faults_size(), 1);
  auto stored = store_->listNodes();  // kept across a restart
  ASSERT_TRUE(stored);
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].gpu_faults.at(0).xid, 79);
  exitAll("n1", a, 137);  // the old attempt's rank dies with its GPU
  coordinator->tick();
  EXPECT_EQ(starts("n1", a).back().ranks(0).gpu(), 1);  // placed again, on the good GPU
  const std::string b = submit(spec(1, 1));
  coordinator->tick();
  EXPECT_EQ(stateOf(b), v1::PENDING);  // GPU 0 is faulted, GPU 1 held
  ASSERT_TRUE(coordinator->clearGpuFault("n1", 0));
  EXPECT_TRUE(links["n1"]->commands.back().has_clear_gpu_fault());
  links["n1"]->commands.clear();
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], hb));  // the same report, sent before the clear
  ASSERT_EQ(links["n1"]->commands.size(), 1u);  // old news: the agent is told of the clear again
  EXPECT_TRUE(links["n1"]->commands[0].has_clear_gpu_fault());
  coordinator->tick();
  EXPECT_EQ(stateOf(b), v1::STARTING);
  EXPECT_EQ(starts("n1", b).back().ranks(0).gpu(), 0);
  EXPECT_EQ(coordinator->listNodes()[0].gpu_faults_size(), 0);
  EXPECT_EQ(coordinator->clearGpuFault("n1", 0).status().code(), state::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator->clearGpuFault("n1", 7).status().code(), state::StatusCode::kInvalidArgument);
  // A new fault on the cleared GPU (seen after the clear) takes it out again, and its job with it.
  f->set_at_ms(9);
  f->set_reason("Xid 48 (double-bit ECC error)\nforged log line");
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], hb));
  EXPECT_EQ(stateOf(b), v1::FAILED);
  ASSERT_EQ(coordinator->listNodes()[0].gpu_faults_size(), 1);
  EXPECT_EQ(coordinator->listNodes()[0].gpu_faults(0).reason(),
            "Xid 48 (double-bit ECC error) forged log line");
}

// What an agent may register is bounded: at most 64 GPUs, peers that are other GPUs of the node, once.
TEST_F(CoordinatorTest, ARegistrationWithTooManyGpusOrBadPeersIsRefused) {
  v1::RegisterRequest req;
  req.set_node("n1");
  req.set_address("10.0.0.1");
  for (int i = 0; i < 65; ++i) req.add_gpus()->set_index(i);
  EXPECT_EQ(coordinator->registerAgent(req).status().code(), state::StatusCode::kInvalidArgument);
  req.clear_gpus();
  for (int i = 0; i < 2; ++i) req.add_gpus()->set_index(i);
  req.mutable_gpus(0)->add_nvlink_peers(1);
  req.mutable_gpus(0)->add_nvlink_peers(1);
  auto twice = coordinator->registerAgent(req);
  EXPECT_NE(twice.status().message().find("listed twice"), std::string::npos) << twice.status().toString();
  req.mutable_gpus(0)->clear_nvlink_peers();
  req.mutable_gpus(0)->add_nvlink_peers(2);
  EXPECT_EQ(coordinator->registerAgent(req).status().code(), state::StatusCode::kInvalidArgument);
  req.mutable_gpus(0)->clear_nvlink_peers();
  req.mutable_gpus(0)->add_nvlink_peers(1);
  req.mutable_gpus(1)->add_nvlink_peers(0);
  req.mutable_gpus(0)->set_island(0);
  req.mutable_gpus(1)->set_island(0);
  EXPECT_TRUE(coordinator->registerAgent(req));
}

// A failing health check drains the node with its words; passing again ends that drain, never an operator's.
TEST_F(CoordinatorTest, AFailingHealthCheckDrainsTheNodeUntilItPasses) {
  addNode("n1", 2);
  v1::Heartbeat failing;
  failing.set_health_check("exit 1: GPU 1: NVLink down");
  v1::Heartbeat passing;
  passing.set_health_check("");
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], failing));
  EXPECT_EQ(coordinator->listNodes()[0].state(), "DRAINING");
  EXPECT_EQ(coordinator->listNodes()[0].drain_reason(), "health check: exit 1: GPU 1: NVLink down");
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], passing));
  EXPECT_EQ(coordinator->listNodes()[0].state(), "UP");
  ASSERT_TRUE(coordinator->drain("n1", true, "new DIMMs"));
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], failing));
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], passing));
  EXPECT_EQ(coordinator->listNodes()[0].drain_reason(), "new DIMMs");  // the operator's stands
  EXPECT_EQ(coordinator->listNodes()[0].state(), "DRAINING");
  // The check's prefix is its own; a restarted agent reports nothing until its first run ended.
  EXPECT_EQ(coordinator->drain("n1", true, "health check: by hand").status().code(),
            state::StatusCode::kInvalidArgument);
  ASSERT_TRUE(coordinator->drain("n1", false));
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], failing));
  v1::Heartbeat unknown;  // no health_check: no run ended yet
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], unknown));
  EXPECT_EQ(coordinator->listNodes()[0].state(), "DRAINING");
}

// Heartbeat grace runs on the coordinator's monotonic clock: the system clock stepping an hour (NTP, an
// operator's `date`) marks no node DOWN, while the heartbeat time users see follows the system clock.
TEST_F(CoordinatorTest, AWallClockStepMarksNoNodeDown) {
  int64_t wall = 1'700'000'000'000;
  coordinator.reset();
  CoordinatorOptions o;
  o.heartbeat_grace_ms = 10000;
  coordinator = std::make_unique<BlockingCoordinator>(
      *store_, o, [this] { return now; }, [&wall] { return wall; });
  ASSERT_TRUE(coordinator->recover());
  addNode("n1", 2);
  EXPECT_EQ(coordinator->listNodes()[0].last_heartbeat_ms(), wall);
  std::string id = submit(spec(1, 2));
  coordinator->tick();
  runAll("n1", id);
  wall += 3'600'000;  // an hour forward
  now += 1000;
  ASSERT_TRUE(beat("n1", id));
  coordinator->tick();
  EXPECT_EQ(coordinator->listNodes()[0].state(), "UP");
  EXPECT_EQ(coordinator->listNodes()[0].last_heartbeat_ms(), wall);
  wall -= 7'200'000;  // two hours back
  now += 5000;
  coordinator->tick();
  EXPECT_EQ(coordinator->listNodes()[0].state(), "UP");
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  now += 6000;  // silent past the grace on the monotonic clock: DOWN, whatever the wall clock says
  coordinator->tick();
  EXPECT_EQ(coordinator->listNodes()[0].state(), "DOWN");
  EXPECT_EQ(stateOf(id), v1::FAILED);
}

// A drain is the operator's, not the heartbeat's: a drained node that goes DOWN (a reboot for maintenance)
// registers again DRAINING and takes no work until undrained. A DOWN node can be drained or undrained for
// when it is back.
TEST_F(CoordinatorTest, DrainOutlivesTheNodeGoingDownAndComingBack) {
  addNode("n1", 2);
  addNode("n2", 2);
  // n1 misses its heartbeats past the grace while n2 keeps beating: n1 is DOWN.
  auto loseN1 = [&] {
    now += 11000;
    ASSERT_TRUE(coordinator->heartbeat("n2", sessions["n2"], v1::Heartbeat()));
    coordinator->tick();
    ASSERT_EQ(coordinator->listNodes()[0].state(), "DOWN");
  };
  ASSERT_TRUE(coordinator->drain("n1", true));
  loseN1();
  auto nodes = coordinator->listNodes();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_TRUE(nodes[0].drained());
  EXPECT_FALSE(nodes[1].drained());

  addNode("n1", 2);  // the agent is back
  EXPECT_EQ(coordinator->listNodes()[0].state(), "DRAINING");
  std::string id = submit(spec(2, 2));
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::PENDING);
  EXPECT_TRUE(starts("n1", id).empty());

  // Undrained while DOWN: back UP, and the job is placed.
  loseN1();
  auto undrained = coordinator->drain("n1", false);
  ASSERT_TRUE(undrained) << undrained.status().toString();
  EXPECT_EQ(undrained->state(), "DOWN");
  EXPECT_FALSE(undrained->drained());
  addNode("n1", 2);
  EXPECT_EQ(coordinator->listNodes()[0].state(), "UP");
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::STARTING);

  // Drained while DOWN: back DRAINING.
  loseN1();
  auto drained = coordinator->drain("n1", true);
  ASSERT_TRUE(drained) << drained.status().toString();
  EXPECT_EQ(drained->state(), "DOWN");
  EXPECT_TRUE(drained->drained());
  addNode("n1", 2);
  EXPECT_EQ(coordinator->listNodes()[0].state(), "DRAINING");
}

TEST_F(CoordinatorTest, RingLayoutOfAPlacedJob) {
  addNode("n1", 2, {{"switch", "s1"}});
  addNode("n2", 2, {{"switch", "s1"}});
  v1::JobSpec s = spec(2, 2);
  s.set_topology("4x1");
  std::string id = submit(s);
  EXPECT_EQ(coordinator->ring(id).status().code(), state::StatusCode::kFailedPrecondition);
  coordinator->tick();
  auto ring = coordinator->ring(id);
  ASSERT_TRUE(ring) << ring.status().toString();
  EXPECT_EQ(ring->topology(), "4x1");
  EXPECT_TRUE(ring->overridden());
  EXPECT_EQ(ring->ranks_size(), 4);
  EXPECT_EQ(ring->ranks(2).node(), "n2");
  EXPECT_FALSE(ring->text().empty());
}

TEST_F(CoordinatorTest, StaleSessionAndUnknownNodeAreRefused) {
  std::string old_session = addNode("n1", 1);
  addNode("n1", 1);  // registers again: the old stream is closed
  EXPECT_EQ(coordinator->heartbeat("n1", old_session, v1::Heartbeat()).code(),
            state::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator->heartbeat("n9", "x", v1::Heartbeat()).code(), state::StatusCode::kNotFound);
  v1::RegisterRequest bad;
  bad.set_node("bad name");
  bad.set_address("x");
  EXPECT_EQ(coordinator->registerAgent(bad).status().code(), state::StatusCode::kInvalidArgument);
}

// Two ddl-agents claiming one node name (a second agent with the same --node, a cloned machine): the second
// is refused, naming both addresses, while the first is live; they no longer take turns. The same agent
// registering again (a reconnect) and a restarted agent whose predecessor's stream is gone are let in.
TEST_F(CoordinatorTest, ASecondLiveAgentForOneNodeIsRefusedNamingBoth) {
  auto request = [](const std::string& instance, const std::string& address) {
    v1::RegisterRequest req;
    req.set_node("n1");
    req.set_address(address);
    req.set_instance(instance);
    req.add_gpus()->set_index(0);
    return req;
  };
  auto first = coordinator->registerAgent(request("100-aaaa", "10.0.0.1"));
  ASSERT_TRUE(first) << first.status().toString();
  auto link = std::make_shared<RecordingLink>();
  ASSERT_TRUE(coordinator->attachAgent("n1", first->session(), link));

  auto second = coordinator->registerAgent(request("200-bbbb", "10.0.0.2"));
  ASSERT_FALSE(second);
  EXPECT_EQ(second.status().code(), state::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("10.0.0.1"), std::string::npos) << second.status().message();
  EXPECT_NE(second.status().message().find("10.0.0.2"), std::string::npos) << second.status().message();
  EXPECT_FALSE(link->closed) << "the live agent's stream was cut by the refused one";
  EXPECT_EQ(coordinator->listNodes()[0].address(), "10.0.0.1");

  // The same agent again (its stream broke and it reconnects): let in.
  auto again = coordinator->registerAgent(request("100-aaaa", "10.0.0.1"));
  ASSERT_TRUE(again) << again.status().toString();
  auto link2 = std::make_shared<RecordingLink>();
  ASSERT_TRUE(coordinator->attachAgent("n1", again->session(), link2));

  // It stops (or dies): its stream closes. A restarted agent (another instance) is let in at once.
  coordinator->detachAgent("n1", again->session(), link2);
  auto restarted = coordinator->registerAgent(request("300-cccc", "10.0.0.1"));
  ASSERT_TRUE(restarted) << restarted.status().toString();
  // Between its Register and its stream, a registered agent holds the node too (for two heartbeat intervals).
  auto between = coordinator->registerAgent(request("400-dddd", "10.0.0.4"));
  EXPECT_FALSE(between) << "a second agent slipped in before the first attached its stream";
}

TEST_F(CoordinatorTest, ALateDetachOfAReplacedStreamKeepsTheNewOne) {
  std::string session = addNode("n1", 1);
  auto old_link = links["n1"];
  auto new_link = std::make_shared<RecordingLink>();
  ASSERT_TRUE(coordinator->attachAgent("n1", session, new_link));
  EXPECT_TRUE(old_link->closed);
  coordinator->detachAgent("n1", session, old_link);  // the old stream's handler finishes late
  EXPECT_TRUE(coordinator->listNodes()[0].connected());
  coordinator->detachAgent("n1", session, new_link);
  EXPECT_FALSE(coordinator->listNodes()[0].connected());
}

// A store whose batches fail while `failing` is set (a full disk), to check that nothing is lost or stuck.
class FlakyStore : public state::MemoryStore {
 public:
  Status applyBatch(const std::vector<state::Write>& batch) override {
    if (failing) return Status::unavailable("disk full (injected)");
    return MemoryStore::applyBatch(batch);
  }
  std::atomic<bool> failing{false};
};

// Waits (bounded) until the coordinator's health is `ok`.
bool waitHealth(BlockingCoordinator& c, bool ok) {
  for (int i = 0; i < 500 && c.health().ok != ok; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  return c.health().ok == ok;
}

TEST_F(CoordinatorTest, AFailedWriteIsRetriedAndNothingWaitsForeverOrLeaksGpus) {
  auto flaky = std::make_unique<FlakyStore>();
  FlakyStore* store = flaky.get();
  makeCoordinator(std::move(flaky));
  addNode("n1", 2);
  std::string a = submit(spec(1, 2));
  store->failing = true;
  // The placement cannot be stored: the StartRanks must not leave, and nothing else may hang meanwhile.
  std::thread ticker([&] { coordinator->tick(); });  // waits for the durable placement, so on its own thread
  ASSERT_TRUE(waitHealth(*coordinator, false));
  EXPECT_NE(coordinator->health().message.find("disk full"), std::string::npos) << coordinator->health().message;
  EXPECT_EQ(stateOf(a), v1::STARTING);    // the loop moved on in memory...
  EXPECT_EQ(coordinator->listNodes().size(), 1u);  // ...and still answers reads
  auto refused = coordinator->submit(spec(1, 1));
  EXPECT_EQ(refused.status().code(), state::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("cannot store"), std::string::npos) << refused.status().toString();
  EXPECT_FALSE(coordinator->metrics().store_healthy);
  store->failing = false;  // space is back: the same writes are stored, then the start goes out
  ticker.join();
  EXPECT_TRUE(coordinator->health().ok);
  ASSERT_EQ(starts("n1", a).size(), 1u);
  EXPECT_EQ(store->getJob(a)->state, state::JobState::kStarting);
  runAll("n1", a);
  exitAll("n1", a);
  EXPECT_EQ(stateOf(a), v1::SUCCEEDED);
  EXPECT_EQ(store->getJob(a)->state, state::JobState::kSucceeded);
  EXPECT_EQ(coordinator->metrics().gpus_allocated, 0);
}

// A submit retried with its request id (ddlctl repeats one whose answer was lost to a restart or a failover)
// gets the job the first made, also after a coordinator restart; another user's same id is theirs; an array
// comes back whole; a malformed id is refused.
TEST_F(CoordinatorTest, ARepeatedRequestIdGetsTheSameJobNeverASecond) {
  addNode("n1", 2);
  v1::SubmitRequest req;
  *req.mutable_spec() = spec(1, 1);
  req.set_request_id("ci-1234:try.1");
  auto first = coordinator->submit(req);
  ASSERT_TRUE(first) << first.status().toString();
  EXPECT_FALSE(first->existing());
  auto again = coordinator->submit(req);
  ASSERT_TRUE(again) << again.status().toString();
  EXPECT_TRUE(again->existing());
  EXPECT_EQ(again->job().id(), first->job().id());
  v1::SubmitRequest bobs = req;
  bobs.mutable_spec()->set_user("bob");
  auto other = coordinator->submit(bobs);
  ASSERT_TRUE(other);
  EXPECT_NE(other->job().id(), first->job().id());  // request ids are per user
  v1::SubmitRequest array = req;
  array.set_request_id("sweep-7");
  array.set_array("0-3");
  auto made = coordinator->submit(array);
  ASSERT_TRUE(made);
  ASSERT_EQ(made->array_jobs_size(), 4);
  // The coordinator restarts: the ids come back with the jobs from the store.
  makeCoordinator(std::move(store_));
  addNode("n1", 2);
  auto after = coordinator->submit(req);
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->existing());
  EXPECT_EQ(after->job().id(), first->job().id());
  auto array_again = coordinator->submit(array);
  ASSERT_TRUE(array_again);
  EXPECT_TRUE(array_again->existing());
  EXPECT_EQ(std::vector<std::string>(array_again->array_jobs().begin(), array_again->array_jobs().end()),
            std::vector<std::string>(made->array_jobs().begin(), made->array_jobs().end()));
  v1::ListJobsRequest all;
  EXPECT_EQ(coordinator->listJobs(all)->jobs_size(), 6);  // 1 + bob's 1 + 4: no repeat made a job
  req.set_request_id("has space");
  EXPECT_EQ(coordinator->submit(req).status().code(), state::StatusCode::kInvalidArgument);
  // The same id for another job is a mistake said as such, not answered with the first job.
  v1::SubmitRequest other_job = array;
  other_job.mutable_spec()->add_command("--lr=0.1");
  auto mismatch = coordinator->submit(other_job);
  EXPECT_EQ(mismatch.status().code(), state::StatusCode::kFailedPrecondition) << mismatch.status().toString();
  EXPECT_NE(mismatch.status().message().find("another job spec"), std::string::npos);
}

// An array's request id holds while any of its jobs is in memory, not only its first (which may end and leave
// memory first), and the answer lists the whole array.
TEST_F(CoordinatorTest, AnArraysRequestIdOutlivesItsFirstJobInMemory) {
  options.max_finished_in_memory = 0;  // a final job leaves memory once stored
  makeCoordinator(std::make_unique<state::MemoryStore>());
  addNode("n1", 1);
  v1::SubmitRequest req;
  *req.mutable_spec() = spec(1, 1);
  req.set_request_id("sweep-1");
  req.set_array("0-2");
  auto made = coordinator->submit(req);
  ASSERT_TRUE(made);
  const std::string first = made->array_jobs(0);
  coordinator->tick();
  runAll("n1", first);
  exitAll("n1", first);
  ASSERT_EQ(stateOf(first), v1::SUCCEEDED);
  coordinator->tick();  // evicted from memory (read back from the store)
  auto again = coordinator->submit(req);
  ASSERT_TRUE(again) << again.status().toString();
  EXPECT_TRUE(again->existing());
  EXPECT_EQ(again->array_jobs_size(), 3);
  EXPECT_EQ(again->job().id(), made->array_jobs(1));  // the first of them still in memory
}

// A submit whose batch the store cannot take (a full disk) is refused at once with the store's reason, not
// left waiting past the caller's deadline; its job is withdrawn (CANCELLED, never placed) so that it does not
// run once space is back, and a retry with the same request id makes a new job then.
TEST_F(CoordinatorTest, ASubmitTheStoreCannotTakeIsRefusedAtOnceAndNeverRuns) {
  auto flaky = std::make_unique<FlakyStore>();
  FlakyStore* store = flaky.get();
  makeCoordinator(std::move(flaky));
  addNode("n1", 2);
  store->failing =
      true;  // the disk filled up; nothing has failed yet, so the coordinator still looks healthy
  v1::SubmitRequest req;
  *req.mutable_spec() = spec(1, 1);
  req.set_request_id("nightly-42");
  // Scheduling passes meanwhile must not place it (a tick waits for what it stores: its own thread).
  std::thread ticker([&] {
    for (int i = 0; i < 5; ++i) coordinator->tick();
  });
  auto refused = coordinator->submit(req);  // bounded: answered at the first failed commit
  store->failing = false;                   // space is back
  ticker.join();
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), state::StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("disk full (injected)"), std::string::npos)
      << refused.status().toString();
  EXPECT_NE(refused.status().message().find("nothing was submitted"), std::string::npos);
  ASSERT_TRUE(waitHealth(*coordinator, true));
  coordinator->tick();
  EXPECT_TRUE(links["n1"]->commands.empty()) << "a refused submit's job was started";
  auto stored = store->listJobsPage({}, 0, 100);
  ASSERT_TRUE(stored);
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ(stored->front().state, state::JobState::kCancelled);  // withdrawn, in the history with the reason
  EXPECT_NE(stored->front().transitions.back().reason.find("the submit was refused"), std::string::npos);
  // The same request id again, after a restart too: a new job (the refused one made nothing), which runs.
  makeCoordinator(std::move(store_));
  addNode("n1", 2);
  coordinator->tick();  // every node is back: the recovery window ends
  auto retried = coordinator->submit(req);
  ASSERT_TRUE(retried) << retried.status().toString();
  EXPECT_FALSE(retried->existing());
  EXPECT_NE(retried->job().id(), stored->front().id);
  coordinator->tick();
  EXPECT_EQ(starts("n1", retried->job().id()).size(), 1u);
}

TEST_F(CoordinatorTest, FinishedJobsLeaveMemoryAndAreReadFromTheStore) {
  options.max_finished_in_memory = 2;
  makeCoordinator(std::make_unique<state::MemoryStore>());
  addNode("n1", 1);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    ids.push_back(submit(spec(1, 1)));
    coordinator->tick();
    runAll("n1", ids.back());
    exitAll("n1", ids.back());
    ASSERT_EQ(stateOf(ids.back()), v1::SUCCEEDED);
    ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], v1::Heartbeat()));
  }
  coordinator->tick();
  EXPECT_LE(coordinator->metrics().jobs_in_memory, 2u);
  EXPECT_EQ(stateOf(ids[0]), v1::SUCCEEDED);  // from the store
  EXPECT_EQ(coordinator->getJob("j-999999").status().code(), state::StatusCode::kNotFound);
  // Every job, a page of two at a time, in submit order, across memory and the store.
  std::vector<std::string> seen;
  v1::ListJobsRequest req;
  req.set_page_size(2);
  for (int page = 0; page < 10; ++page) {
    auto resp = coordinator->listJobs(req);
    ASSERT_TRUE(resp) << resp.status().toString();
    EXPECT_LE(resp->jobs_size(), 2);
    for (const auto& j : resp->jobs()) seen.push_back(j.id());
    if (resp->next_page_token().empty()) break;
    req.set_page_token(resp->next_page_token());
  }
  EXPECT_EQ(seen, ids);
  // Newest first (the dashboard's history), the pages going back in time, across memory and the store.
  std::vector<std::string> back;
  v1::ListJobsRequest newest;
  newest.set_page_size(2);
  newest.set_newest_first(true);
  for (int page = 0; page < 10; ++page) {
    auto resp = coordinator->listJobs(newest);
    ASSERT_TRUE(resp) << resp.status().toString();
    EXPECT_LE(resp->jobs_size(), 2);
    for (const auto& j : resp->jobs()) back.push_back(j.id());
    if (resp->next_page_token().empty()) break;
    newest.set_page_token(resp->next_page_token());
  }
  EXPECT_EQ(back, std::vector<std::string>(ids.rbegin(), ids.rend()));
  req.set_page_token("nonsense");
  EXPECT_EQ(coordinator->listJobs(req).status().code(), state::StatusCode::kInvalidArgument);
  req.clear_page_token();
  req.set_page_size(100000);
  EXPECT_EQ(coordinator->listJobs(req).status().code(), state::StatusCode::kInvalidArgument);
  // Filters reach the store too.
  v1::ListJobsRequest mine;
  mine.set_user("nobody");
  EXPECT_EQ(coordinator->listJobs(mine)->jobs_size(), 0);
  mine.set_user("alice");
  mine.add_states(v1::SUCCEEDED);
  EXPECT_EQ(coordinator->listJobs(mine)->jobs_size(), 5);
}

// A history page where the store's first rows are jobs memory holds in a newer state that no longer matches:
// the page must go on past them to the stored jobs behind (it used to end early, with no token, losing them).
TEST_F(CoordinatorTest, AHistoryPageGoesOnPastJobsThatMemoryHoldsDifferently) {
  options.max_finished_in_memory = 0;  // a final job leaves memory as soon as it is stored
  auto flaky = std::make_unique<FlakyStore>();
  FlakyStore* store = flaky.get();
  makeCoordinator(std::move(flaky));
  addNode("n1", 3);
  std::string a = submit(spec(1, 1)), b = submit(spec(1, 1));
  coordinator->tick();
  runAll("n1", a);
  runAll("n1", b);
  std::string c = submit(spec(1, 1));
  coordinator->tick();
  runAll("n1", c);
  exitAll("n1", c);  // SUCCEEDED, stored, then out of memory
  coordinator->tick();
  ASSERT_EQ(store->getJob(a)->state, state::JobState::kRunning);
  store->failing = true;  // a and b fail in memory; the store still says RUNNING
  for (const auto& id : {a, b}) {
    auto s = starts("n1", id).back();
    coordinator->rankEvent("n1", sessions["n1"],
                           rankStatus(id, s.attempt(), 0, s.ranks(0).gpu(), v1::RankStatus::EXITED, 3),
                           [](Status) {});
  }
  ASSERT_TRUE(waitHealth(*coordinator, false));
  v1::ListJobsRequest req;
  req.add_states(v1::RUNNING);
  req.add_states(v1::SUCCEEDED);
  req.set_page_size(1);
  std::vector<std::string> seen;
  for (int page = 0; page < 10; ++page) {
    auto resp = coordinator->listJobs(req);
    ASSERT_TRUE(resp) << resp.status().toString();
    for (const auto& j : resp->jobs()) seen.push_back(j.id());
    if (resp->next_page_token().empty()) break;
    req.set_page_token(resp->next_page_token());
  }
  EXPECT_EQ(seen, std::vector<std::string>{c});
  store->failing = false;
  ASSERT_TRUE(waitHealth(*coordinator, true));
}

TEST_F(CoordinatorTest, OnlyADownNodeWithNoLiveJobIsRemoved) {
  addNode("n1", 1);
  addNode("n2", 1);
  std::string a = submit(spec(1, 1));
  coordinator->tick();
  EXPECT_EQ(coordinator->removeNode("n1").status().code(), state::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator->removeNode("nope").status().code(), state::StatusCode::kNotFound);
  coordinator->detachAgent("n1", sessions["n1"], links["n1"]);
  coordinator->detachAgent("n2", sessions["n2"], links["n2"]);
  now += 20000;
  coordinator->tick();  // both DOWN; a's node is lost, a fails
  auto removed = coordinator->removeNode("n2");
  ASSERT_TRUE(removed) << removed.status().toString();
  EXPECT_TRUE(coordinator->removeNode("n1"));
  EXPECT_TRUE(coordinator->listNodes().empty());
  EXPECT_EQ(store_->listNodes()->size(), 0u);
  EXPECT_EQ(stateOf(a), v1::FAILED);
}

// Every map is bounded: the nodes too. A node known already registers again at the limit; a new one is
// refused, naming the way out, until a node that is gone is removed.
TEST_F(CoordinatorTest, ANewNodeBeyondTheLimitIsRefusedUntilAGoneOneIsRemoved) {
  options.max_nodes = 2;
  makeCoordinator(std::make_unique<state::MemoryStore>());
  addNode("n1", 1);
  addNode("n2", 1);
  v1::RegisterRequest third;
  third.set_node("n3");
  third.set_address("10.0.0.3");
  auto refused = coordinator->registerAgent(third);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), state::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("knows 2 nodes"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("ddlctl nodes remove"), std::string::npos);
  addNode("n2", 1);  // a known node comes back at the limit
  EXPECT_EQ(store_->listNodes()->size(), 2u);
  coordinator->detachAgent("n1", sessions["n1"], links["n1"]);
  now += 20000;
  coordinator->tick();  // n1 DOWN (n2 too: the test's clock moved past its grace)
  ASSERT_TRUE(coordinator->removeNode("n1"));
  EXPECT_TRUE(coordinator->registerAgent(third));
}

TEST(DataDirLockTest, ASecondHolderIsRefusedWithTheFirstOnesPid) {
  auto dir = std::filesystem::temp_directory_path() / ("ddl-lock-test-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    auto first = state::DataDirLock::acquire(dir.string());
    ASSERT_TRUE(first) << first.status().toString();
    auto second = state::DataDirLock::acquire(dir.string());
    ASSERT_FALSE(second);
    EXPECT_EQ(second.status().code(), state::StatusCode::kFailedPrecondition);
    EXPECT_NE(second.status().message().find("pid " + std::to_string(getpid())), std::string::npos)
        << second.status().message();
  }
  EXPECT_TRUE(state::DataDirLock::acquire(dir.string()));  // released with its holder
  std::filesystem::remove_all(dir);
}

class CoordinatorRestartTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() / ("ddl-coord-test-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    reopen();
  }
  void TearDown() override {
    coordinator.reset();
    store_.reset();
    std::filesystem::remove_all(dir);
  }
  void reopen() {
    coordinator.reset();
    store_.reset();
    state::SqliteStore::Options o;
    o.path = (dir / "state.db").string();
    auto s = state::SqliteStore::open(o);
    ASSERT_TRUE(s) << s.status().toString();
    makeCoordinator(std::move(*s));
    links.clear();
  }
  std::filesystem::path dir;
};

TEST_F(CoordinatorRestartTest, RunningJobSurvivesARestartAndSucceeds) {
  addNode("n1", 2);
  addNode("n2", 2);
  std::string id = submit(spec(2, 2));
  std::string queued = submit(spec(2, 2));
  coordinator->tick();
  runAll("n1", id);
  runAll("n2", id);
  ASSERT_EQ(stateOf(id), v1::RUNNING);
  auto n1_start = starts("n1", id)[0];
  auto n2_start = starts("n2", id)[0];

  reopen();  // the coordinator restarts; the agents keep their ranks
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  EXPECT_EQ(stateOf(queued), v1::PENDING);
  EXPECT_EQ(coordinator->listNodes().size(), 2u);
  auto held = [&](const v1::StartRanks& s) {
    std::vector<v1::RankStatus> out;
    for (const auto& r : s.ranks()) out.push_back(rankStatus(id, s.attempt(), r.rank(), r.gpu()));
    return out;
  };
  addNode("n1", 2, {}, held(n1_start));
  coordinator->tick();
  EXPECT_EQ(stateOf(queued), v1::PENDING);  // n2 has not reconnected: its GPUs may still be busy
  EXPECT_NE(coordinator->getJob(queued)->reason().find("restarted"), std::string::npos);
  addNode("n2", 2, {}, held(n2_start));
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  EXPECT_EQ(stateOf(queued), v1::PENDING);  // the running job still holds every GPU
  EXPECT_EQ(stops("n1", id), 0);
  exitRanks("n1", n1_start);
  exitRanks("n2", n2_start);
  EXPECT_EQ(stateOf(id), v1::SUCCEEDED);
  coordinator->tick();
  EXPECT_EQ(stateOf(queued), v1::STARTING);
}

TEST_F(CoordinatorRestartTest, RanksGoneAfterRestartFailTheJob) {
  addNode("n1", 1);
  std::string id = submit(spec(1, 1));
  coordinator->tick();
  runAll("n1", id);
  reopen();
  addNode("n1", 1);  // the agent came back without the rank
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->reason().find("gone from node n1"), std::string::npos) << job->reason();
}

// A start that was stored but never reached the node (the coordinator died between its commit and the send;
// a failover): the node registers with nothing of the job, and no rank of it was ever reported, so nothing
// ran and nothing failed. The job is placed again without counting a restart, and runs.
TEST_F(CoordinatorRestartTest, AStartThatNeverArrivedIsPlacedAgainNotFailed) {
  addNode("n1", 1);
  std::string id = submit(spec(1, 1));
  coordinator->tick();
  ASSERT_EQ(stateOf(id), v1::STARTING);
  reopen();          // the start was stored; the agent never got it
  addNode("n1", 1);  // registers with no rank
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::PENDING) << job->reason();
  EXPECT_EQ(job->restarts(), 0);
  ASSERT_GT(job->transitions_size(), 0);
  const auto& last = job->transitions(job->transitions_size() - 1);
  EXPECT_EQ(last.to(), v1::PENDING);
  EXPECT_NE(last.reason().find("never reached node n1"), std::string::npos) << last.reason();
  coordinator->tick();
  ASSERT_EQ(stateOf(id), v1::STARTING);
  runAll("n1", id);
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  EXPECT_EQ(starts("n1", id).back().attempt(), 2);
}

// A job's rendezvous port is recorded with its placement: after a restart, a job placed on the same node gets
// another port, also where the agent has a port range of its own (which a restarted coordinator does not know
// until the agent registers again).
TEST_F(CoordinatorRestartTest, ARestartedCoordinatorKnowsTheRunningJobsPorts) {
  const std::pair<int, int> ports = {40000, 40003};  // two slots: 40000 and 40002
  auto rootOf = [&](const std::string& job) { return envOf(starts("n1", job).back().ranks(0))["DDL_ROOT"]; };
  addNode("n1", 2, {}, {}, ports);
  std::string a = submit(spec(1, 1));  // j-000001
  ASSERT_TRUE(coordinator->cancel(submit(spec(1, 1))));  // j-000002, so that the next id has a's slot
  coordinator->tick();
  runAll("n1", a);
  const std::string a_root = rootOf(a);
  EXPECT_EQ(a_root, "10.0.0.1:40002");

  reopen();
  addNode("n1", 2, {}, {rankStatus(a, 1, 0, 0)}, ports);
  std::string b = submit(spec(1, 1));  // j-000003: would start from a's slot
  coordinator->tick();
  ASSERT_EQ(stateOf(a), v1::RUNNING);
  ASSERT_FALSE(starts("n1", b).empty());
  EXPECT_EQ(rootOf(b), "10.0.0.1:40000");
}

TEST_F(CoordinatorRestartTest, ADrainOutlivesARestartAndTheNodeGoingDown) {
  addNode("n1", 1);
  ASSERT_TRUE(coordinator->drain("n1", true));
  reopen();
  now += 11000;  // the agent does not come back within the grace
  coordinator->tick();
  ASSERT_EQ(coordinator->listNodes()[0].state(), "DOWN");
  reopen();
  EXPECT_TRUE(coordinator->listNodes()[0].drained());
  addNode("n1", 1);
  EXPECT_EQ(coordinator->listNodes()[0].state(), "DRAINING");
}

TEST_F(CoordinatorRestartTest, NodesThatNeverReturnAreDownAfterTheGrace) {
  addNode("n1", 1);
  std::string id = submit(spec(1, 1));
  coordinator->tick();
  runAll("n1", id);
  reopen();
  now += 5000;
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  now += 6000;
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::FAILED);
  EXPECT_EQ(coordinator->listNodes()[0].state(), "DOWN");
}

TEST_F(CoordinatorRestartTest, HistoryPastMemoryAndPurgedNumbersSurviveARestart) {
  options.max_finished_in_memory = 1;
  reopen();
  addNode("n1", 1);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(submit(spec(1, 1)));
    coordinator->tick();
    runAll("n1", ids.back());
    exitAll("n1", ids.back());
    ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], v1::Heartbeat()));
  }
  reopen();
  EXPECT_EQ(stateOf(ids[0]), v1::SUCCEEDED);  // read from the database
  EXPECT_EQ(coordinator->listJobs(v1::ListJobsRequest())->jobs_size(), 3);
  // Purged jobs' numbers are never handed out again.
  coordinator.reset();
  auto* sqlite = static_cast<state::SqliteStore*>(store_.get());
  auto purged = sqlite->purgeFinished(state::systemNowMs() + 1, 1000);
  ASSERT_TRUE(purged) << purged.status().toString();
  EXPECT_EQ(*purged, 3);
  reopen();
  addNode("n1", 1);
  EXPECT_EQ(submit(spec(1, 1)), "j-000004");
}


// ---- Slurm's habits: time limits, dependencies, arrays, hold/release/requeue, signals ------------------------

TEST_F(CoordinatorTest, ARunningJobPastItsTimeLimitEndsTimeoutAndItsRanksAreStopped) {
  addNode("n1", 1);
  v1::JobSpec s = spec(1, 1);
  s.set_time_limit_s(60);
  const std::string id = submit(s);
  coordinator->tick();
  runAll("n1", id);
  ASSERT_EQ(stateOf(id), v1::RUNNING);
  for (int i = 0; i < 59; ++i) {  // heartbeats go on, so only the limit can end it
    now += 1'000;
    ASSERT_TRUE(beat("n1", id));
    coordinator->tick();
  }
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  EXPECT_EQ(stops("n1", id), 0);
  now += 1'000;
  coordinator->tick();
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::TIMEOUT);
  EXPECT_NE(job->reason().find("time limit of 60.0 s"), std::string::npos) << job->reason();
  EXPECT_EQ(stops("n1", id), 1);
  EXPECT_GT(job->end_ms(), 0);
  // The rank's end, reported after the stop, is kept with the job.
  exitAll("n1", id, 143);
  job = coordinator->getJob(id);
  ASSERT_EQ(job->ranks_size(), 1);
  EXPECT_EQ(job->ranks(0).exit_code(), 143);
  EXPECT_EQ(job->ranks(0).node(), "n1");
  EXPECT_EQ(job->state(), v1::TIMEOUT);
}

TEST_F(CoordinatorTest, EachRanksResultIsKeptAfterTheJobEnds) {
  addNode("n1", 2);
  const std::string id = submit(spec(1, 2));
  coordinator->tick();
  auto start = starts("n1", id).back();
  for (const auto& r : start.ranks()) {
    v1::RankStatus st = rankStatus(id, start.attempt(), r.rank(), r.gpu());
    st.set_pid(100 + r.rank());
    st.set_program_pid(200 + r.rank());
    st.set_started_ms(now);
    st.mutable_progress()->set_collectives(7);
    st.mutable_progress()->set_bytes(1 << 20);
    st.mutable_progress()->set_seconds(0.5);
    ASSERT_TRUE(coordinator->rankEvent("n1", sessions["n1"], st));
  }
  exitAll("n1", id, 0);  // the exit reports carry no progress: the last figures stay
  auto job = coordinator->getJob(id);
  ASSERT_EQ(job->state(), v1::SUCCEEDED);
  ASSERT_EQ(job->ranks_size(), 2);
  for (int i = 0; i < 2; ++i) {
    const auto& r = job->ranks(i);
    EXPECT_EQ(r.rank(), i);
    EXPECT_EQ(r.node(), "n1");
    EXPECT_EQ(r.pid(), 100 + i);
    EXPECT_EQ(r.program_pid(), 200 + i);
    EXPECT_EQ(r.state(), v1::RankStatus::EXITED);
    EXPECT_EQ(r.exit_code(), 0);
    EXPECT_EQ(r.progress().collectives(), 7);
    EXPECT_DOUBLE_EQ(r.progress().seconds(), 0.5);
  }
  EXPECT_GT(job->start_ms(), 0);
  EXPECT_GE(job->end_ms(), job->start_ms());
}

TEST_F(CoordinatorTest, AProgramThatCannotBeExecutedIsNamedInTheReason) {
  addNode("n1", 1);
  const std::string id = submit(spec(1, 1));
  coordinator->tick();
  exitAll("n1", id, 127);
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->reason().find("could not be executed"), std::string::npos) << job->reason();
}

TEST_F(CoordinatorTest, AfterOkWaitsForSuccessAndIsCancelledWhenTheDependencyFails) {
  addNode("n1", 1);
  const std::string first = submit(spec(1, 1));
  const std::string second = submit(spec(1, 1));
  v1::JobSpec ok = spec(1, 1);
  ok.add_after_ok(first);
  const std::string after_first = submit(ok);
  v1::JobSpec ok2 = spec(1, 1);
  ok2.add_after_ok(second);
  const std::string after_second = submit(ok2);
  v1::JobSpec any = spec(1, 1);
  any.add_after_any(second);
  const std::string any_second = submit(any);
  coordinator->tick();
  runAll("n1", first);
  auto waiting = coordinator->getJob(after_first);
  EXPECT_EQ(waiting->state(), v1::PENDING);
  EXPECT_NE(waiting->reason().find("waiting for " + first + " (RUNNING) to succeed"), std::string::npos)
      << waiting->reason();
  exitAll("n1", first, 0);
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], v1::Heartbeat()));
  coordinator->tick();  // the second job (no dependency, submitted earlier) goes first
  ASSERT_EQ(stateOf(second), v1::STARTING);
  exitAll("n1", second, 3);
  auto cancelled = coordinator->getJob(after_second);
  EXPECT_EQ(cancelled->state(), v1::CANCELLED);
  EXPECT_NE(cancelled->reason().find("dependency " + second + " ended FAILED"), std::string::npos)
      << cancelled->reason();
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], v1::Heartbeat()));
  coordinator->tick();
  EXPECT_EQ(stateOf(after_first), v1::STARTING);  // its dependency succeeded
  EXPECT_EQ(stateOf(any_second), v1::PENDING);    // waits for the GPU, not for its dependency
  EXPECT_EQ(coordinator->getJob(any_second)->reason().find("waiting for j-"), std::string::npos);

  // A dependency that does not exist, or already failed, is refused at submit.
  v1::JobSpec missing = spec(1, 1);
  missing.add_after_ok("j-999999");
  EXPECT_EQ(coordinator->submit(missing).status().code(), StatusCode::kNotFound);
  v1::JobSpec never = spec(1, 1);
  never.add_after_ok(second);
  auto refused = coordinator->submit(never);
  EXPECT_EQ(refused.status().code(), state::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("could never start"), std::string::npos);
  v1::JobSpec bad = spec(1, 1);
  bad.add_after_any("5");
  EXPECT_EQ(coordinator->submit(bad).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, AJobArrayRunsAtMostItsLimitAndEachJobKnowsItsIndex) {
  addNode("n1", 4);
  v1::SubmitRequest req;
  *req.mutable_spec() = spec(1, 1);
  req.set_array("0-6:2%2");  // 0, 2, 4, 6; two at a time
  auto resp = coordinator->submit(req);
  ASSERT_TRUE(resp) << resp.status().toString();
  ASSERT_EQ(resp->array_jobs_size(), 4);
  const std::string first = resp->array_jobs(0);
  EXPECT_EQ(resp->job().id(), first);
  coordinator->tick();
  std::vector<std::string> started;
  for (const auto& id : resp->array_jobs()) {
    auto job = coordinator->getJob(id);
    EXPECT_EQ(job->spec().array_id(), first);
    if (job->state() == v1::STARTING) started.push_back(id);
  }
  ASSERT_EQ(started.size(), 2u);  // 4 GPUs free, but the limit is 2
  auto waiting = coordinator->getJob(resp->array_jobs(3));
  EXPECT_NE(waiting->reason().find("already runs or is placing 2 of its jobs"), std::string::npos) << waiting->reason();
  auto s = starts("n1", started[1]).back();
  std::map<std::string, std::string> env;
  for (const auto& e : s.ranks(0).env()) env[e.name()] = e.value();
  EXPECT_EQ(env["DDL_ARRAY_INDEX"], "2");
  EXPECT_EQ(env["DDL_ARRAY_JOB_ID"], first);

  for (const char* wrong : {"", "5-1", "a", "1,", "0-20000", "0-3%0", "0-3:0"}) {
    if (!*wrong) continue;
    req.set_array(wrong);
    EXPECT_EQ(coordinator->submit(req).status().code(), StatusCode::kInvalidArgument) << wrong;
  }
}

TEST_F(CoordinatorTest, HoldReleaseAndRequeue) {
  addNode("n1", 1);
  v1::JobSpec held = spec(1, 1);
  held.set_hold(true);
  const std::string id = submit(held);
  coordinator->tick();
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::PENDING);
  EXPECT_TRUE(job->held());
  EXPECT_NE(job->reason().find("held"), std::string::npos);
  ASSERT_TRUE(coordinator->hold(id, false));
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::STARTING);
  EXPECT_EQ(coordinator->hold(id, true).status().code(), StatusCode::kFailedPrecondition);
  runAll("n1", id);
  // An admin's hold is released only by an admin.
  const std::string other = submit(spec(1, 1));
  ASSERT_TRUE(coordinator->hold(other, true, /*by_admin=*/true));
  EXPECT_TRUE(coordinator->getJob(other)->held_by_admin());
  EXPECT_EQ(coordinator->hold(other, false).status().code(), StatusCode::kPermissionDenied);
  ASSERT_TRUE(coordinator->hold(other, false, /*by_admin=*/true));
  EXPECT_FALSE(coordinator->getJob(other)->held());
  ASSERT_TRUE(coordinator->cancel(other));
  auto requeued = coordinator->requeue(id);
  ASSERT_TRUE(requeued) << requeued.status().toString();
  EXPECT_EQ(requeued->state(), v1::PENDING);
  EXPECT_EQ(requeued->restarts(), 0);  // the user's requeue uses none of max_restarts (0 here)
  EXPECT_EQ(stops("n1", id), 1);
  EXPECT_EQ(coordinator->requeue(id).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], v1::Heartbeat()));
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::STARTING);
  EXPECT_EQ(starts("n1", id).back().attempt(), 2);
}

TEST_F(CoordinatorTest, CancelWithASignalSignalsTheRanksAndTheJobGoesOn) {
  addNode("n1", 1);
  const std::string id = submit(spec(1, 1));
  EXPECT_EQ(coordinator->cancel(id, 10).status().code(), StatusCode::kFailedPrecondition);  // not launched
  coordinator->tick();
  runAll("n1", id);
  auto job = coordinator->cancel(id, 10);
  ASSERT_TRUE(job) << job.status().toString();
  EXPECT_EQ(job->state(), v1::RUNNING);
  int signals = 0;
  for (const auto& c : links["n1"]->commands) {
    if (!c.has_signal()) continue;
    ++signals;
    EXPECT_EQ(c.signal().job_id(), id);
    EXPECT_EQ(c.signal().attempt(), 1);
    EXPECT_EQ(c.signal().signal(), 10);
  }
  EXPECT_EQ(signals, 1);
  EXPECT_EQ(coordinator->cancel(id, 99).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, ASubmitThatFitsOnceDownNodesAreBackIsQueuedWithAReason) {
  addNode("n1", 2);
  addNode("n2", 2);
  now += 11'000;  // both miss their heartbeats
  coordinator->tick();
  const std::string id = submit(spec(2, 2));  // was refused: "(2 more GPUs are DOWN)"
  coordinator->tick();
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::PENDING);
  EXPECT_NE(job->reason().find("DOWN"), std::string::npos) << job->reason();
  // Larger than the cluster even with every node back: still refused at once.
  EXPECT_EQ(coordinator->submit(spec(3, 2)).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, ADrainKeepsItsReason) {
  addNode("n1", 1);
  auto node = coordinator->drain("n1", true, "bad DIMM, ticket 42");
  ASSERT_TRUE(node) << node.status().toString();
  EXPECT_EQ(node->drain_reason(), "bad DIMM, ticket 42");
  EXPECT_EQ(coordinator->listNodes()[0].drain_reason(), "bad DIMM, ticket 42");
  EXPECT_EQ(coordinator->drain("n1", true, "esc \x1b[2J").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator->drain("n1", false)->drain_reason(), "");
}

TEST_F(CoordinatorRestartTest, DependenciesHoldsAndRankResultsSurviveARestart) {
  addNode("n1", 1);
  const std::string first = submit(spec(1, 1));
  v1::JobSpec after = spec(1, 1);
  after.add_after_ok(first);
  after.set_hold(true);
  const std::string second = submit(after);
  coordinator->tick();
  runAll("n1", first);
  reopen();
  addNode("n1", 1, {}, {rankStatus(first, 1, 0, 0)});
  auto job = coordinator->getJob(second);
  EXPECT_TRUE(job->held());
  ASSERT_TRUE(coordinator->hold(second, false));
  ASSERT_TRUE(coordinator->rankEvent("n1", sessions["n1"], rankStatus(first, 1, 0, 0, v1::RankStatus::EXITED, 0)));
  EXPECT_EQ(stateOf(first), v1::SUCCEEDED);
  reopen();
  addNode("n1", 1);  // every node is back: the recovery window ends
  coordinator->tick();
  EXPECT_EQ(stateOf(second), v1::STARTING);  // held no more, and its dependency succeeded
  auto done = coordinator->getJob(first);
  ASSERT_EQ(done->ranks_size(), 1);
  EXPECT_EQ(done->ranks(0).exit_code(), 0);
}
}  // namespace
}  // namespace ddl::coordinator

namespace ddl::coordinator {
namespace {

TEST_F(CoordinatorRestartTest, CpusAndMemoryArePlacedGivenToEachRankAndKeptAcrossARestart) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  node_cpus = {0, 1, 2, 3, 4, 5, 6, 7};
  node_memory = 32 * kGiB;
  node_confinement = "cgroups v2 under /sys/fs/cgroup/ddl/ranks: cpuset, memory.max";
  addNode("n1", 4);
  v1::JobSpec a = spec(1, 2);
  a.set_cpus_per_rank(2);
  a.set_memory_per_rank_bytes(8 * kGiB);
  const std::string id = submit(a);
  v1::JobSpec b = spec(1, 2);
  b.set_cpus_per_rank(3);  // 2 GPUs are free beside a, but 4 CPUs are not 2 x 3
  const std::string waiting = submit(b);
  coordinator->tick();
  ASSERT_EQ(stateOf(id), v1::STARTING);
  const v1::StartRanks start = starts("n1", id).at(0);
  ASSERT_EQ(start.ranks_size(), 2);
  EXPECT_EQ(std::vector<int>(start.ranks(0).cpus().begin(), start.ranks(0).cpus().end()),
            (std::vector<int>{0, 1}));
  EXPECT_EQ(std::vector<int>(start.ranks(1).cpus().begin(), start.ranks(1).cpus().end()),
            (std::vector<int>{2, 3}));
  EXPECT_EQ(start.ranks(1).memory_bytes(), 8 * kGiB);
  EXPECT_EQ(stateOf(waiting), v1::PENDING);
  EXPECT_NE(coordinator->getJob(waiting)->reason().find("(and 3 CPUs per GPU)"), std::string::npos)
      << coordinator->getJob(waiting)->reason();
  auto node = coordinator->listNodes().at(0);
  EXPECT_EQ(node.cpus_size(), 8);
  EXPECT_EQ(node.cpus_used_size(), 4);
  EXPECT_EQ(node.memory_bytes(), 32 * kGiB);
  EXPECT_EQ(node.memory_used_bytes(), 16 * kGiB);
  EXPECT_EQ(node.confinement(), node_confinement);
  const v1::Job job = *coordinator->getJob(id);
  EXPECT_EQ(job.spec().cpus_per_rank(), 2);
  EXPECT_EQ(job.allocation(0).cpus_size(), 4);
  EXPECT_EQ(job.allocation(0).memory_bytes(), 16 * kGiB);
  runAll("n1", id);

  reopen();  // the allocation's CPUs and memory, and the node's, come back from the store
  std::vector<v1::RankStatus> held;
  for (const auto& r : start.ranks()) held.push_back(rankStatus(id, start.attempt(), r.rank(), r.gpu()));
  addNode("n1", 4, {}, held);
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  EXPECT_EQ(stateOf(waiting), v1::PENDING);
  EXPECT_EQ(coordinator->listNodes().at(0).cpus_used_size(), 4);
  EXPECT_EQ(coordinator->getJob(id)->spec().memory_per_rank_bytes(), 8 * kGiB);
  exitRanks("n1", start);
  coordinator->tick();
  ASSERT_EQ(stateOf(waiting), v1::STARTING);
  EXPECT_EQ(starts("n1", waiting).at(0).ranks(1).cpus_size(), 3);
  // A job that can never get its CPUs is refused at submit, naming what the node has.
  v1::JobSpec huge = spec(1, 1);
  huge.set_cpus_per_rank(9);
  auto refused = coordinator->submit(huge);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("has 4 GPUs, 8 CPUs and 32 GiB for ranks"), std::string::npos)
      << refused.status().message();
}

}  // namespace
}  // namespace ddl::coordinator

namespace ddl::coordinator {
namespace {

TEST_F(CoordinatorTest, ANodesWarningIsShownUntilItsAgentNoLongerSendsIt) {
  addNode("n1", 1);
  v1::Heartbeat hb;
  hb.set_warning("the rank logs' disk is full (0 MiB free in /var/lib/ddl/agent/logs, under 256 MiB)");
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], hb));
  EXPECT_EQ(coordinator->listNodes().at(0).warning(), hb.warning());
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], v1::Heartbeat{}));
  EXPECT_EQ(coordinator->listNodes().at(0).warning(), "");
}

}  // namespace
}  // namespace ddl::coordinator

namespace ddl::coordinator {
namespace {

// A cancelled job's ranks still dying hold their CPUs and memory, not only their GPUs: another job gets them
// only once the agent stops reporting those ranks running.
TEST_F(CoordinatorTest, DyingRanksHoldTheirCpusAndMemoryUntilTheyAreGone) {
  node_cpus = {0, 1, 2, 3};
  node_memory = int64_t{8} << 30;
  addNode("n1", 2);
  v1::JobSpec a = spec(1, 1);
  a.set_cpus_per_rank(4);
  a.set_memory_per_rank_bytes(int64_t{6} << 30);
  const std::string first = submit(a);
  coordinator->tick();
  runAll("n1", first);
  ASSERT_TRUE(coordinator->cancel(first));
  v1::Heartbeat hb;
  *hb.add_ranks() = rankStatus(first, 1, 0, 0);  // still dying
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], hb));
  EXPECT_EQ(coordinator->listNodes().at(0).cpus_used_size(), 4);
  EXPECT_EQ(coordinator->listNodes().at(0).memory_used_bytes(), int64_t{6} << 30);
  v1::JobSpec b = spec(1, 1);  // GPU 1 is free; the CPUs are not
  b.set_cpus_per_rank(1);
  const std::string cpus = submit(b);
  v1::JobSpec m = spec(1, 1);
  m.set_memory_per_rank_bytes(int64_t{4} << 30);  // 2 GiB left
  const std::string memory = submit(m);
  coordinator->tick();
  EXPECT_EQ(stateOf(cpus), v1::PENDING);
  EXPECT_EQ(stateOf(memory), v1::PENDING);
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], v1::Heartbeat()));
  coordinator->tick();
  EXPECT_EQ(stateOf(cpus), v1::STARTING);
}

// Issue 41: the GPUs a job holds are charged to its user in its account as time passes; the account over its
// share waits behind the one under it, however old its job; the usage is stored and a restarted coordinator
// (or the next leader) has it.
TEST_F(CoordinatorTest, UsageIsChargedStoredAndOrdersTheQueueByShare) {
  placement::ShareTree tree;
  tree.accounts["a"] = {"root", 1};
  tree.accounts["b"] = {"root", 1};
  coordinator->setAccounts(tree);
  addNode("n1", 1);
  // Time passes with the node's heartbeats, the job's ranks running.
  auto pass = [&](int64_t ms, const std::string& job) {
    for (int64_t left = ms; left > 0; left -= 5000) {
      now += std::min<int64_t>(left, 5000);
      ASSERT_TRUE(beat("n1", job));
      coordinator->tick();
    }
  };
  const std::string first = submit(chargedSpec("alice", "a"));
  coordinator->tick();  // placed; the usage clock starts
  EXPECT_EQ(stateOf(first), v1::STARTING);
  pass(100 * 1000, first);  // 100 GPU-seconds to alice in a
  auto shares = coordinator->shares();
  ASSERT_TRUE(shares);
  std::map<std::string, v1::ShareRow> by_account;
  for (const auto& r : shares->accounts()) by_account[r.account()] = r;
  EXPECT_NEAR(by_account["a"].usage_gpu_s(), 100, 0.01);
  EXPECT_NEAR(by_account["root"].usage_gpu_s(), 100, 0.01);
  EXPECT_NEAR(by_account["a"].factor(), 0.25, 0.001);  // all the usage on half the shares: 2^-2
  EXPECT_DOUBLE_EQ(by_account["b"].factor(), 1.0);

  const std::string older = submit(chargedSpec("alice", "a"));
  now += 1000;
  const std::string newer = submit(chargedSpec("bob", "b"));
  exitAll("n1", first);
  coordinator->tick();
  EXPECT_EQ(stateOf(newer), v1::STARTING) << "the account under its share goes first";
  EXPECT_EQ(stateOf(older), v1::PENDING);

  pass(61 * 1000, newer);  // past the save interval: the figures go to the store
  auto stored = store_->listEntries("usage");
  ASSERT_TRUE(stored);
  ASSERT_EQ(stored->size(), 2u);
  EXPECT_EQ((*stored)[0].key, "a:alice");
  EXPECT_EQ((*stored)[1].key, "b:bob");
  coordinator.reset();
  coordinator = std::make_unique<BlockingCoordinator>(*store_, options, [this] { return now; });
  ASSERT_TRUE(coordinator->recover());
  coordinator->setAccounts(tree);
  shares = coordinator->shares();
  ASSERT_TRUE(shares);
  for (const auto& r : shares->accounts()) by_account[r.account()] = r;
  EXPECT_NEAR(by_account["a"].usage_gpu_s(), 100, 0.1);  // decayed by a 7-day half-life over a minute
  EXPECT_NEAR(by_account["b"].usage_gpu_s(), 61, 0.1);
}

// Fair-share's billing weights (TRESBillingWeights): a job holding 2 GPUs, 4 CPUs and 8 GiB is charged, per
// second, 2 + 0.5 x 4 + 0.25 x 8 = 6 GPU-seconds; the metrics' GPU-seconds stay GPUs alone.
TEST_F(CoordinatorTest, CpusAndMemoryAreChargedAtTheirWeights) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  options.shares.cpu_weight = 0.5;
  options.shares.mem_weight_per_gib = 0.25;
  coordinator.reset();
  coordinator = std::make_unique<BlockingCoordinator>(*store_, options, [this] { return now; });
  ASSERT_TRUE(coordinator->recover());
  node_cpus = {0, 1, 2, 3, 4, 5, 6, 7};
  node_memory = 32 * kGiB;
  node_confinement = "cgroups v2 under /sys/fs/cgroup/ddl/ranks: cpuset, memory.max";
  addNode("n1", 4);
  v1::JobSpec s = spec(1, 2);
  s.set_cpus_per_rank(2);
  s.set_memory_per_rank_bytes(4 * kGiB);
  s.set_account("root");
  const std::string id = submit(s);
  coordinator->tick();  // placed; the usage clock starts
  ASSERT_EQ(stateOf(id), v1::STARTING);
  for (int i = 0; i < 20; ++i) {  // 100 s
    now += 5000;
    ASSERT_TRUE(beat("n1", id));
    coordinator->tick();
  }
  auto shares = coordinator->shares();
  ASSERT_TRUE(shares);
  ASSERT_FALSE(shares->accounts().empty());
  EXPECT_NEAR(shares->accounts(0).usage_gpu_s(), 600, 0.5);  // root
}

// Issue 41: --signal USR1@30 with --time 2m: the running ranks get SIGUSR1 once, 30 s before the limit (not
// before), and the job still ends TIMEOUT at the limit. A spec that asks for it without a limit is refused.
TEST_F(CoordinatorTest, AWarningSignalComesBeforeTheTimeLimitOnce) {
  addNode("n1", 1);
  v1::JobSpec s = spec(1, 1);
  s.set_time_limit_s(120);
  s.set_warn_signal(SIGUSR1);
  s.set_warn_before_s(30);
  const std::string id = submit(s);
  coordinator->tick();
  runAll("n1", id);
  auto signals = [&] {
    std::vector<int> out;
    for (const auto& c : links["n1"]->commands)
      if (c.has_signal() && c.signal().job_id() == id) out.push_back(c.signal().signal());
    return out;
  };
  for (int i = 0; i < 17; ++i) {  // 85 s
    now += 5000;
    ASSERT_TRUE(beat("n1", id));
    coordinator->tick();
  }
  EXPECT_TRUE(signals().empty()) << "35 s before the limit";
  now += 5000;  // 90 s: 30 s before
  ASSERT_TRUE(beat("n1", id));
  coordinator->tick();
  EXPECT_EQ(signals(), std::vector<int>{SIGUSR1});
  for (int i = 0; i < 5; ++i) {
    now += 5000;
    ASSERT_TRUE(beat("n1", id));
    coordinator->tick();
  }
  EXPECT_EQ(signals(), std::vector<int>{SIGUSR1}) << "once";
  now += 6000;
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::TIMEOUT);

  v1::JobSpec no_limit = spec(1, 1);
  no_limit.set_warn_signal(SIGUSR1);
  no_limit.set_warn_before_s(30);
  EXPECT_EQ(coordinator->submit(no_limit).status().code(), state::StatusCode::kInvalidArgument);
}

// Issue 41, accounting: civil days and their text, and an interval's share of each UTC day it touches.
TEST(UsageDays, DaysAndTheirText) {
  EXPECT_EQ(utcDayText(0), "1970-01-01");
  EXPECT_EQ(utcDayText(utcDayOf(1'798'761'600'000)), "2027-01-01");  // 2027-01-01T00:00:00Z
  EXPECT_EQ(utcDayText(utcDayOf(1'798'761'599'999)), "2026-12-31");
  EXPECT_EQ(utcDayText(*parseUtcDay("2024-02-29") + 1), "2024-03-01");
  for (int64_t day = 0; day < 200 * 366; day += 7)
    EXPECT_EQ(parseUtcDay(utcDayText(day)), day) << utcDayText(day);
  for (const char* bad :
       {"2026-02-29", "2026-13-01", "2026-1-01", "2026-01-01x", "", "1969-12-31", "yesterday"})
    EXPECT_FALSE(parseUtcDay(bad)) << bad;

  const int64_t midnight = 20000 * 86400000LL;
  auto spread = spreadOverDays(midnight - 30000, midnight + 90000);
  ASSERT_EQ(spread.size(), 2u);
  EXPECT_EQ(spread[0].first, 19999);
  EXPECT_DOUBLE_EQ(spread[0].second, 0.25);
  EXPECT_EQ(spread[1].first, 20000);
  EXPECT_DOUBLE_EQ(spread[1].second, 0.75);
  EXPECT_EQ(spreadOverDays(midnight, midnight), (std::vector<std::pair<int64_t, double>>{{20000, 1.0}}));
  EXPECT_EQ(spreadOverDays(midnight - 86400000LL * 3, midnight).size(), 3u);
}

// Issue 41, accounting: each ended attempt of a job is recorded in the job (GPU time from placement, the
// ranks' CPU time and memory, how it ended, a rank that exits after the attempt ended included) and in daily
// rollups per account and user, spread over the UTC days it spanned, which a restarted coordinator reads back
// and which are dropped past their retention; /metrics counts GPU-seconds and attempts per account.
TEST_F(CoordinatorTest, EndedAttemptsGoToDailyRollupsThatOutliveTheJob) {
  const int64_t midnight = 20000 * 86400000LL;  // 2024-10-04T00:00Z
  now = midnight - 30000;
  placement::ShareTree tree;
  tree.accounts["a"] = {"root", 1};
  coordinator->setAccounts(tree);
  addNode("n1", 2);
  v1::JobSpec s = spec(1, 2, /*max_restarts=*/1);
  s.set_account("a");
  const std::string id = submit(s);
  coordinator->tick();
  const int64_t placed = now;
  runAll("n1", id);
  for (int i = 0; i < 12; ++i) {  // 60 s, half of them after midnight
    now += 5000;
    ASSERT_TRUE(beat("n1", id));
    coordinator->tick();
  }
  auto exited = [&](int attempt, int rank, int code, double cpu_s, int64_t rss) {
    v1::RankStatus r = rankStatus(id, attempt, rank, rank, v1::RankStatus::EXITED, code);
    r.set_cpu_seconds(cpu_s);
    r.set_max_rss_bytes(rss);
    return coordinator->rankEvent("n1", sessions["n1"], r);
  };
  ASSERT_TRUE(exited(1, 0, 1, 10, 1 << 20));  // rank 0 fails: requeued (a restart is left)
  EXPECT_EQ(stateOf(id), v1::PENDING);
  ASSERT_TRUE(exited(1, 1, 143, 20, 3 << 20));  // rank 1 stopped after the attempt ended: still counted
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::STARTING);
  runAll("n1", id);
  now += 40000;
  ASSERT_TRUE(exited(2, 0, 0, 5, 2 << 20));
  ASSERT_TRUE(exited(2, 1, 0, 5, 2 << 20));
  EXPECT_EQ(stateOf(id), v1::SUCCEEDED);

  auto job = coordinator->getJob(id);
  ASSERT_TRUE(job);
  ASSERT_EQ(job->attempts_size(), 2);
  const v1::AttemptUsage& first = job->attempts(0);
  EXPECT_EQ(first.attempt(), 1);
  EXPECT_EQ(first.start_ms(), placed);
  EXPECT_EQ(first.end_ms(), placed + 60000);
  EXPECT_EQ(first.gpus(), 2);
  EXPECT_DOUBLE_EQ(first.gpu_seconds(), 120);
  EXPECT_DOUBLE_EQ(first.cpu_seconds(), 30);
  EXPECT_EQ(first.max_rss_bytes(), 3 << 20);
  EXPECT_EQ(first.end(), "REQUEUED");
  EXPECT_EQ(job->attempts(1).end(), "SUCCEEDED");
  EXPECT_DOUBLE_EQ(job->attempts(1).gpu_seconds(), 80);
  EXPECT_DOUBLE_EQ(job->attempts(1).cpu_seconds(), 10);

  v1::GetUsageRequest daily;
  daily.set_since_ms(midnight - 86400000LL);
  daily.set_daily(true);
  auto report = [&](const v1::GetUsageRequest& req) {
    auto got = coordinator->usage(req);
    EXPECT_TRUE(got) << got.status().toString();
    return got ? *got : v1::GetUsageResponse();
  };
  auto checkDaily = [&](const v1::GetUsageResponse& r) {
    ASSERT_EQ(r.rows_size(), 2);
    EXPECT_EQ(r.rows(0).day(), "2024-10-03");
    EXPECT_EQ(r.rows(0).account(), "a");
    EXPECT_EQ(r.rows(0).user(), "alice");
    EXPECT_NEAR(r.rows(0).gpu_seconds(), 60, 1e-9);  // the first attempt's 30 s before midnight, on 2 GPUs
    EXPECT_NEAR(r.rows(0).cpu_seconds(), 5, 1e-9);   // its first 10 s of CPU, spread the same way
    EXPECT_EQ(r.rows(0).attempts(), 0);
    EXPECT_EQ(r.rows(1).day(), "2024-10-04");
    EXPECT_NEAR(r.rows(1).gpu_seconds(), 60 + 80, 1e-9);
    EXPECT_NEAR(r.rows(1).cpu_seconds(), 5 + 20 + 10, 1e-9);
    EXPECT_EQ(r.rows(1).attempts(), 2);
    EXPECT_EQ(r.rows(1).jobs(), 1);
    EXPECT_EQ(r.rows(1).requeued(), 1);
    EXPECT_EQ(r.rows(1).failed(), 0);
    EXPECT_EQ(r.rows(1).max_rss_bytes(), 3 << 20);
  };
  checkDaily(report(daily));
  v1::GetUsageRequest by_account;
  by_account.set_since_ms(midnight - 86400000LL);
  by_account.set_by_account(true);
  const auto accounts = report(by_account);
  ASSERT_EQ(accounts.rows_size(), 1);
  EXPECT_EQ(accounts.rows(0).user(), "");
  EXPECT_NEAR(accounts.rows(0).gpu_seconds(), 200, 1e-9);
  EXPECT_EQ(accounts.first_day(), "2024-10-03");
  EXPECT_EQ(accounts.last_day(), "2024-10-04");
  v1::GetUsageRequest backwards;
  backwards.set_since_ms(now);
  backwards.set_until_ms(now - 1);
  EXPECT_EQ(coordinator->usage(backwards).status().code(), state::StatusCode::kInvalidArgument);

  const MetricsSnapshot m = coordinator->metrics();
  EXPECT_GT(m.account_gpu_seconds.at("a"), 0);  // charged as the GPUs were held, once a second
  EXPECT_EQ(m.account_attempts.at({"a", "REQUEUED"}), 1);
  EXPECT_EQ(m.account_attempts.at({"a", "SUCCEEDED"}), 1);

  // The rollups outlive the coordinator and the job's history; past retention they go.
  coordinator.reset();
  coordinator = std::make_unique<BlockingCoordinator>(*store_, options, [this] { return now; });
  ASSERT_TRUE(coordinator->recover());
  checkDaily(report(daily));
  coordinator.reset();
  CoordinatorOptions short_memory = options;
  short_memory.accounting.retention_days = 2;  // today and yesterday
  coordinator = std::make_unique<BlockingCoordinator>(*store_, short_memory, [this] { return now; });
  ASSERT_TRUE(coordinator->recover());
  now = midnight + 86400000LL + 1000;  // 2024-10-05: 2024-10-03 is past retention
  coordinator->tick();
  const auto left = report(daily);
  ASSERT_EQ(left.rows_size(), 1);
  EXPECT_EQ(left.rows(0).day(), "2024-10-04");
  EXPECT_EQ(left.first_day_kept(), "2024-10-04");
  coordinator.reset();  // its last writes are stored
  auto stored = store_->listEntries("usage_daily");
  ASSERT_TRUE(stored);
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].key, "2024-10-04:a:alice");
}

// Issue 41, accounting: an attempt that ends exactly at a UTC midnight is counted on the day its time was in,
// and names the rollups' keys could not hold (an insecure coordinator takes the user from the request) come
// back whole after a restart.
TEST_F(CoordinatorTest, RollupsOfAnAttemptEndingAtMidnightAndOfOddNames) {
  const int64_t midnight = 20000 * 86400000LL;  // 2024-10-04T00:00Z
  now = midnight - 60000;
  addNode("n1", 1);
  v1::JobSpec s = spec(1, 1);
  s.set_user("ev:e/1%");
  const std::string id = submit(s);
  coordinator->tick();
  runAll("n1", id);
  now = midnight;
  ASSERT_TRUE(
      coordinator->rankEvent("n1", sessions["n1"], rankStatus(id, 1, 0, 0, v1::RankStatus::EXITED, 0)));
  ASSERT_EQ(stateOf(id), v1::SUCCEEDED);
  v1::GetUsageRequest daily;
  daily.set_since_ms(midnight - 86400000LL);
  daily.set_until_ms(midnight + 86400000LL);
  daily.set_daily(true);
  auto check = [&] {
    auto r = coordinator->usage(daily);
    ASSERT_TRUE(r) << r.status().toString();
    ASSERT_EQ(r->rows_size(), 1);
    EXPECT_EQ(r->rows(0).day(), "2024-10-03");
    EXPECT_EQ(r->rows(0).user(), "ev:e/1%");
    EXPECT_EQ(r->rows(0).account(), "root");
    EXPECT_EQ(r->rows(0).attempts(), 1);
    EXPECT_EQ(r->rows(0).jobs(), 1);
    EXPECT_NEAR(r->rows(0).gpu_seconds(), 60, 1e-9);
  };
  check();
  coordinator.reset();
  coordinator = std::make_unique<BlockingCoordinator>(*store_, options, [this] { return now; });
  ASSERT_TRUE(coordinator->recover());
  check();
  auto stored = store_->listEntries("usage_daily");
  ASSERT_TRUE(stored);
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].key, "2024-10-03:root:ev%3Ae%2F1%25");
}

// Issue 41, accounting: past the cap on rollups the oldest days go, from memory and the store, and a report
// says from which day on it is whole.
TEST_F(CoordinatorTest, TheCapOnRollupsDropsTheOldestDays) {
  options.accounting.max_rows = 1;
  makeCoordinator(std::make_unique<state::MemoryStore>());
  const int64_t midnight = 20000 * 86400000LL;
  addNode("n1", 1);
  for (int64_t start : {midnight - 3600000, midnight + 3600000}) {  // one job on each side of midnight
    now = start;
    ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], v1::Heartbeat()));
    const std::string id = submit(spec(1, 1));
    coordinator->tick();
    runAll("n1", id);
    now += 1000;
    exitAll("n1", id);
    ASSERT_EQ(stateOf(id), v1::SUCCEEDED);
  }
  v1::GetUsageRequest daily;
  daily.set_since_ms(midnight - 86400000LL);
  daily.set_daily(true);
  auto r = coordinator->usage(daily);
  ASSERT_TRUE(r);
  ASSERT_EQ(r->rows_size(), 1);
  EXPECT_EQ(r->rows(0).day(), "2024-10-04");
  EXPECT_EQ(r->first_day_kept(), "2024-10-04");
  coordinator->tick();  // the deletion is stored with the next batch
  auto stored = store_->listEntries("usage_daily");
  ASSERT_TRUE(stored);
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].key.substr(0, 10), "2024-10-04");
}

// Issue 41: limits. An account limited to 2 GPUs runs 2 of its 1-GPU jobs and the third waits (AccountLimit)
// while another account's job starts beside them; a job that could never fit the limit is refused at submit
// naming it; a user past its pending limit is refused at submit. Never more than the limit at any pass.
TEST_F(CoordinatorTest, LimitsHoldJobsBackAndRefuseWhatCanNeverFit) {
  placement::ShareTree tree;
  tree.accounts["a"] = {"root", 1, {2, 0, 0}};
  tree.accounts["b"] = {"root", 1};
  tree.users["bob"] = {0, 0, 1};
  coordinator->setAccounts(tree);
  addNode("n1", 4);
  const std::string a1 = submit(chargedSpec("alice", "a", 1)), a2 = submit(chargedSpec("alice", "a", 1)),
                    a3 = submit(chargedSpec("alice", "a", 1)), b1 = submit(chargedSpec("bob", "b", 1));
  coordinator->tick();
  EXPECT_EQ(stateOf(a1), v1::STARTING);
  EXPECT_EQ(stateOf(a2), v1::STARTING);
  EXPECT_EQ(stateOf(b1), v1::STARTING);
  auto waiting = coordinator->getJob(a3);
  ASSERT_TRUE(waiting);
  EXPECT_EQ(waiting->state(), v1::PENDING);
  EXPECT_EQ(waiting->reason_code(), "AccountLimit");
  EXPECT_NE(waiting->reason().find("account a holds 2 of its 2 GPUs"), std::string::npos)
      << waiting->reason();
  // Never fits the limit: refused, naming it.
  auto big = coordinator->submit(chargedSpec("alice", "a", 3));
  EXPECT_EQ(big.status().code(), state::StatusCode::kInvalidArgument);
  EXPECT_NE(big.status().message().find("account a may hold at most 2"), std::string::npos)
      << big.status().message();
  // bob may have one job waiting: the first waits (no GPU left), the second is refused.
  const std::string b2 = submit(chargedSpec("bob", "b", 4));
  coordinator->tick();
  EXPECT_EQ(stateOf(b2), v1::PENDING);
  auto refused = coordinator->submit(chargedSpec("bob", "b", 1));
  EXPECT_EQ(refused.status().code(), state::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("user bob has 1 jobs waiting"), std::string::npos)
      << refused.status().message();
  // a's first job ends: its third starts.
  exitAll("n1", a1);
  coordinator->tick();
  EXPECT_EQ(stateOf(a3), v1::STARTING);
}

// GPU-hours per period: once account a used its 0.1 GPU-hours of the day (its running job counted as it
// runs, then its rollup once it ended), its next job waits with AccountLimit while b's starts; the next UTC
// day it starts.
TEST_F(CoordinatorTest, AGpuHoursLimitHoldsJobsBackUntilTheNextPeriod) {
  placement::ShareTree tree;
  tree.accounts["a"] = {"root", 1, {0, 0, 0, 0.1, placement::Period::kDay}};
  tree.accounts["b"] = {"root", 1};
  coordinator->setAccounts(tree);
  addNode("n1", 2);
  const std::string a1 = submit(chargedSpec("alice", "a"));
  coordinator->tick();
  ASSERT_EQ(stateOf(a1), v1::STARTING);
  for (int i = 0; i < 80; ++i) {  // 400 s: past 360 GPU-seconds
    now += 5000;
    ASSERT_TRUE(beat("n1", a1));
    coordinator->tick();
  }
  const std::string a2 = submit(chargedSpec("alice", "a")), b1 = submit(chargedSpec("alice", "b"));
  coordinator->tick();
  EXPECT_EQ(stateOf(b1), v1::STARTING);
  auto waiting = coordinator->getJob(a2);
  ASSERT_TRUE(waiting);
  EXPECT_EQ(waiting->state(), v1::PENDING);
  EXPECT_EQ(waiting->reason_code(), "AccountLimit");
  EXPECT_NE(waiting->reason().find("account a used 0.111 of its 0.1 GPU-hours today; its jobs start again on "
                                   "1970-01-02 (UTC)"),
            std::string::npos)
      << waiting->reason();
  exitAll("n1", a1);  // its attempt goes to the day's rollup, which counts from now on
  coordinator->tick();
  ASSERT_TRUE(beat("n1", b1));  // b1 RUNNING: nothing else changes from here on
  coordinator->tick();
  EXPECT_EQ(stateOf(a2), v1::PENDING);
  now = 86400 * 1000 + 1000;  // the next UTC day: the day's change alone brings a pass
  ASSERT_TRUE(beat("n1", b1));
  coordinator->tick();
  EXPECT_EQ(stateOf(a2), v1::STARTING);
}

// Fair-share preemption (fairshare_preemption): b holds both GPUs; a's job, at the head of the queue,
// preempts b's younger job (a with it and b without it are served alike), which is requeued as PREEMPTED
// after normal's grace. The freed GPU goes to a's job although fair-share orders b's first (a used both GPUs
// for 10 minutes before; b's job is older), and nothing preempts it back. Off, nothing is preempted.
TEST_F(CoordinatorTest, AnAccountUnderItsSharePreemptsOneOverIt) {
  placement::ShareTree tree;
  tree.accounts["a"] = {"root", 1};
  tree.accounts["b"] = {"root", 1};
  coordinator->setAccounts(tree);
  addNode("n1", 2);
  v1::JobSpec both = chargedSpec("alice", "a");
  both.set_gpus_per_node(2);
  const std::string a0 = submit(both);
  coordinator->tick();
  runAll("n1", a0);
  for (int i = 0; i < 60; ++i) {  // 10 minutes: 1200 GPU-seconds for a
    now += 10000;
    ASSERT_TRUE(beat("n1", a0));
    coordinator->tick();
  }
  exitAll("n1", a0, 0);
  ASSERT_EQ(stateOf(a0), v1::SUCCEEDED);
  const std::string b1 = submit(chargedSpec("bob", "b"));
  coordinator->tick();
  runAll("n1", b1);
  now += 1000;
  const std::string b2 = submit(chargedSpec("bob", "b"));
  coordinator->tick();
  runAll("n1", b2);
  const std::string a1 = submit(chargedSpec("alice", "a"));
  coordinator->tick();
  auto signalled = [&](const std::string& job) {
    return std::count_if(links["n1"]->commands.begin(), links["n1"]->commands.end(),
                         [&](const auto& c) { return c.has_signal() && c.signal().job_id() == job; });
  };
  EXPECT_EQ(signalled(b2), 0) << "off unless the config turns it on";
  tree.share_preemption = true;
  coordinator->setAccounts(tree);
  coordinator->tick();
  EXPECT_EQ(signalled(b2), 1);
  EXPECT_EQ(signalled(b1), 0);
  EXPECT_EQ(coordinator->getJob(a1)->reason_code(), "Preempting");
  now += 2000;
  exitAll("n1", b2, 143);
  EXPECT_EQ(stateOf(b2), v1::PENDING);
  EXPECT_EQ(coordinator->getJob(b2)->attempts(0).end(), "PREEMPTED");
  coordinator->tick();
  EXPECT_EQ(stateOf(a1), v1::STARTING) << "b2 ranks first by fair-share, but a1 preempted for it";
  runAll("n1", a1);
  coordinator->tick();  // b2 waits: b, with it, would be served more than a without a1
  EXPECT_EQ(signalled(a1), 0);
  EXPECT_EQ(stateOf(b2), v1::PENDING);
}

// Issue 41, preemption: a job of a QoS that may preempt, finding no free GPU, has the youngest running job of
// the lower tier preempted: its ranks get SIGTERM with a deadline (its QoS's grace), the waiting job is
// Preempting meanwhile; once the ranks have all exited (any code) the job is back in the queue as PREEMPTED,
// without using a restart, and the GPU goes to the preempting job. A victim whose ranks do not exit is
// requeued at the deadline and its ranks killed at once (a stop with no grace). A QoS that does not exist, or
// that the job's account may not use, is refused at submit; a job of normal preempts nothing.
TEST_F(CoordinatorTest, AHigherQosPreemptsTheYoungestLowerJobWithoutLosingARestart) {
  coordinator.reset();
  CoordinatorOptions o;
  o.heartbeat_grace_ms = 10000;
  coordinator = std::make_unique<BlockingCoordinator>(
      *store_, o, [this] { return now; }, [this] { return now; });
  ASSERT_TRUE(coordinator->recover());
  placement::ShareTree tree;
  tree.accounts["ops"] = {"root", 1};
  tree.qos["urgent"] = {100, {"normal"}, 0, 0, {"root"}};
  tree.qos["urgent"].grace_s = 30;
  tree.qos["normal"] = {0, {}, 20, 0, {}};
  tree.qos["private"] = {50, {}, 60, 0, {"ops"}};
  coordinator->setAccounts(tree);
  addNode("n1", 2);
  const std::string older = submit(spec(1, 1));
  coordinator->tick();
  runAll("n1", older);
  now += 1000;
  const std::string younger = submit(spec(1, 1));
  coordinator->tick();
  runAll("n1", younger);
  ASSERT_EQ(stateOf(younger), v1::RUNNING);

  v1::JobSpec normal = spec(1, 1);
  const std::string waiting = submit(normal);
  coordinator->tick();
  auto signalsTo = [&](const std::string& job) {
    std::vector<v1::SignalJob> out;
    for (const auto& c : links["n1"]->commands)
      if (c.has_signal() && c.signal().job_id() == job) out.push_back(c.signal());
    return out;
  };
  EXPECT_TRUE(signalsTo(younger).empty()) << "a normal job preempts nothing";

  v1::JobSpec urgent = spec(1, 1);
  urgent.set_qos("urgent");
  const std::string first = submit(urgent);
  coordinator->tick();
  ASSERT_EQ(signalsTo(younger).size(), 1u);
  EXPECT_EQ(signalsTo(younger)[0].signal(), SIGTERM);
  EXPECT_EQ(signalsTo(younger)[0].preempt_deadline_ms(), now + 20000) << "normal's grace";
  EXPECT_TRUE(signalsTo(older).empty());
  auto job = coordinator->getJob(first);
  ASSERT_TRUE(job);
  EXPECT_EQ(job->reason_code(), "Preempting");
  EXPECT_NE(job->reason().find("preempting " + younger), std::string::npos) << job->reason();
  EXPECT_EQ(stateOf(younger), v1::RUNNING) << "its ranks have the grace to stop";

  now += 2000;  // the ranks checkpoint and exit (143: the signal's default action is no failure here)
  exitAll("n1", younger, 143);
  EXPECT_EQ(stateOf(younger), v1::PENDING);
  auto requeued = coordinator->getJob(younger);
  EXPECT_EQ(requeued->restarts(), 0) << "not counted as a restart";
  ASSERT_EQ(requeued->attempts_size(), 1);
  EXPECT_EQ(requeued->attempts(0).end(), "PREEMPTED");
  coordinator->tick();
  EXPECT_EQ(stateOf(first), v1::STARTING);
  EXPECT_EQ(stateOf(waiting), v1::PENDING);
  runAll("n1", first);

  // The older job's ranks ignore the signal: at the deadline it is requeued and its ranks killed at once.
  const std::string second = submit(urgent);
  coordinator->tick();
  ASSERT_EQ(signalsTo(older).size(), 1u);
  const int stops_before = stops("n1", older);
  now += 19000;
  v1::Heartbeat hb;  // both jobs' ranks run on
  for (const auto& id : {older, first}) {
    const auto s = starts("n1", id).back();
    for (const auto& r : s.ranks()) *hb.add_ranks() = rankStatus(id, s.attempt(), r.rank(), r.gpu());
  }
  ASSERT_TRUE(coordinator->heartbeat("n1", sessions["n1"], hb));
  coordinator->tick();
  EXPECT_EQ(stateOf(older), v1::RUNNING);
  EXPECT_EQ(coordinator->getJob(second)->reason_code(), "Preempting");
  now += 1000;
  coordinator->tick();
  EXPECT_EQ(stateOf(older), v1::PENDING);
  EXPECT_EQ(coordinator->getJob(older)->attempts(0).end(), "PREEMPTED");
  ASSERT_GT(stops("n1", older), stops_before);
  EXPECT_EQ(links["n1"]->commands.back().stop().grace_ms(), 0) << "killed: the grace is spent";
  EXPECT_EQ(stateOf(first), v1::RUNNING);

  // Refused at submit: no such QoS, and one the job's account (root) may not use.
  v1::JobSpec typo = spec(1, 1);
  typo.set_qos("urgnet");
  auto refused = coordinator->submit(typo);
  EXPECT_EQ(refused.status().code(), state::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("there is no QoS 'urgnet'"), std::string::npos)
      << refused.status().message();
  typo.set_qos("private");
  refused = coordinator->submit(typo);
  EXPECT_NE(refused.status().message().find("may not use QoS private"), std::string::npos)
      << refused.status().message();
}

// Issue 41, preemption: a coordinator that restarts while a job is being preempted still requeues it when its
// ranks exit, even with code 0 (a checkpoint, then a clean exit, is not a success).
TEST_F(CoordinatorTest, APreemptionOutlivesACoordinatorRestart) {
  auto restart = [&] {
    coordinator.reset();
    CoordinatorOptions o;
    o.heartbeat_grace_ms = 10000;
    coordinator = std::make_unique<BlockingCoordinator>(
        *store_, o, [this] { return now; }, [this] { return now; });
    ASSERT_TRUE(coordinator->recover());
  };
  restart();
  placement::ShareTree tree;
  tree.qos["urgent"] = {100, {"normal"}, 30, 0, {}};
  coordinator->setAccounts(tree);
  addNode("n1", 1);
  const std::string victim = submit(spec(1, 1));
  coordinator->tick();
  runAll("n1", victim);
  v1::JobSpec urgent = spec(1, 1);
  urgent.set_qos("urgent");
  const std::string first = submit(urgent);
  coordinator->tick();
  ASSERT_EQ(coordinator->getJob(first)->reason_code(), "Preempting");

  restart();
  coordinator->setAccounts(tree);
  addNode("n1", 1, {}, {rankStatus(victim, 1, 0, 0)});  // the agent comes back, the rank still running
  coordinator->tick();
  EXPECT_EQ(stateOf(victim), v1::RUNNING);
  ASSERT_TRUE(
      coordinator->rankEvent("n1", sessions["n1"], rankStatus(victim, 1, 0, 0, v1::RankStatus::EXITED, 0)));
  EXPECT_EQ(stateOf(victim), v1::PENDING);
  EXPECT_EQ(coordinator->getJob(victim)->attempts(0).end(), "PREEMPTED");
  coordinator->tick();
  EXPECT_EQ(stateOf(first), v1::STARTING);
}

// ---- Elastic jobs (elastic.cpp)
// ----------------------------------------------------------------------------

v1::JobSpec elasticGpus(int least, int most) {
  v1::JobSpec s = spec(0, 0);
  s.clear_nodes();
  s.clear_gpus_per_node();
  s.set_total_gpus(most);
  s.set_min_gpus(least);
  return s;
}

v1::JobSpec elasticNodes(int least, int most, int gpus_per_node) {
  v1::JobSpec s = spec(most, gpus_per_node);
  s.set_min_nodes(least);
  return s;
}

// The StartRanks of the job that every node got, by rank (launch slot): node and launch.
std::map<int, std::pair<std::string, v1::RankLaunch>> launchedRanks(
    const std::map<std::string, std::shared_ptr<RecordingLink>>& links, const std::string& job) {
  std::map<int, std::pair<std::string, v1::RankLaunch>> out;
  for (const auto& [node, link] : links)
    for (const auto& c : link->commands)
      if (c.has_start() && c.start().job_id() == job)
        for (const auto& r : c.start().ranks()) out[r.rank()] = {node, r};
  return out;
}

int heldGpus(const v1::Job& job) {
  int n = 0;
  for (const auto& a : job.allocation()) n += a.gpus_size();
  return n;
}

TEST_F(CoordinatorTest, AnElasticJobGoesOnWithoutALostRankAndGrowsBackOnTheFreedGpu) {
  const int64_t placed = now;
  const std::string id = runningOn({"n1", "n2", "n3", "n4"}, 1, elasticGpus(2, 4));
  ASSERT_EQ(stateOf(id), v1::RUNNING);
  auto first = launchedRanks(links, id);
  ASSERT_EQ(first.size(), 4u);
  const std::string lost_node = first[2].first;

  now += 4'000;  // (within the nodes' heartbeat grace: the test sends none)
  ASSERT_TRUE(coordinator->rankEvent(lost_node, sessions[lost_node],
                                     rankStatus(id, 1, 2, 0, v1::RankStatus::EXITED, {}, 9)));
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::RUNNING);
  const auto& change = job->transitions(job->transitions_size() - 1);
  EXPECT_EQ(change.from(), v1::RUNNING);
  EXPECT_EQ(change.to(), v1::RUNNING);
  EXPECT_NE(change.reason().find("rank 2 on node " + lost_node), std::string::npos) << change.reason();
  EXPECT_NE(change.reason().find("going on without rank 2: 3 of 4 ranks (elastic, at least 2)"),
            std::string::npos)
      << change.reason();
  EXPECT_EQ(change.failure().rank(), 2);
  EXPECT_EQ(change.failure().signal(), 9);
  EXPECT_EQ(heldGpus(*job), 3);
  for (const auto& [node, link] : links) EXPECT_EQ(stops(node, id), 0) << node;  // nobody is stopped

  // The freed GPU is taken back by a joiner: the next slot, DDL_JOIN=1, the attempt's secret and rendezvous.
  now += 2'000;
  coordinator->tick();
  auto grown = launchedRanks(links, id);
  ASSERT_EQ(grown.size(), 5u);
  ASSERT_EQ(grown.count(4), 1u);
  EXPECT_EQ(grown[4].first, lost_node);
  auto joiner = envOf(grown[4].second);
  auto old = envOf(first[0].second);
  EXPECT_EQ(joiner["DDL_JOIN"], "1");
  EXPECT_EQ(old.count("DDL_JOIN"), 0u);
  EXPECT_EQ(joiner["WORLD_SIZE"], "4");
  EXPECT_EQ(joiner["RANK"], "4");
  for (const char* k : {"DDL_JOB_SECRET", "MASTER_ADDR", "MASTER_PORT", "DDL_ROOT", "DDL_JOB_ATTEMPT"})
    EXPECT_EQ(joiner[k], old[k]) << k;
  job = coordinator->getJob(id);
  EXPECT_EQ(heldGpus(*job), 4);
  EXPECT_NE(
      job->transitions(job->transitions_size() - 1).reason().find("grown: rank 4 started on " + lost_node),
      std::string::npos);
  coordinator->tick();
  EXPECT_EQ(launchedRanks(links, id).size(), 5u);  // full again: nothing more starts

  ASSERT_TRUE(coordinator->rankEvent(lost_node, sessions[lost_node], rankStatus(id, 1, 4, 0)));
  now += 2'000;
  for (int rank : {0, 1, 3, 4}) {
    const std::string& node = grown[rank].first;
    ASSERT_TRUE(
        coordinator->rankEvent(node, sessions[node], rankStatus(id, 1, rank, 0, v1::RankStatus::EXITED, 0)));
  }
  job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::SUCCEEDED);
  EXPECT_EQ(job->ranks_size(), 5);
  // GPU-seconds: ranks 0, 1 and 3 for 8 s, rank 2 for 4 s, the joiner for 2 s.
  ASSERT_EQ(job->attempts_size(), 1);
  EXPECT_EQ(job->attempts(0).start_ms(), placed);
  EXPECT_DOUBLE_EQ(job->attempts(0).gpu_seconds(), 30.0);
}

TEST_F(CoordinatorTest, AnElasticJobBelowItsMinimumOrWithoutRankZeroFailsAsAnyOther) {
  const std::string id = runningOn({"n1", "n2", "n3", "n4"}, 1, elasticGpus(3, 4));
  auto ranks = launchedRanks(links, id);
  auto lose = [&](int rank, int code) {
    const std::string& node = ranks[rank].first;
    ASSERT_TRUE(coordinator->rankEvent(node, sessions[node],
                                       rankStatus(id, 1, rank, 0, v1::RankStatus::EXITED, code)));
  };
  lose(1, 3);
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  lose(1, 3);  // the same exit again (a heartbeat) changes nothing
  lose(3, 4);
  auto job = coordinator->getJob(id);
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->reason().find("(elastic: 2 ranks left, below its minimum of 3)"), std::string::npos)
      << job->reason();
  EXPECT_EQ(job->failure().rank(), 3);
  EXPECT_EQ(stops(ranks[0].first, id), 1);

  const std::string zero = submit(elasticGpus(1, 2));
  coordinator->tick();
  coordinator->tick();
  auto zr = launchedRanks(links, zero);
  ASSERT_EQ(zr.size(), 2u);
  for (const auto& [rank, where] : zr)
    ASSERT_TRUE(coordinator->rankEvent(where.first, sessions[where.first],
                                       rankStatus(zero, 1, rank, where.second.gpu())));
  ASSERT_TRUE(coordinator->rankEvent(zr[0].first, sessions[zr[0].first],
                                     rankStatus(zero, 1, 0, zr[0].second.gpu(), v1::RankStatus::EXITED, 1)));
  job = coordinator->getJob(zero);
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_NE(job->reason().find("rank 0 serves the job's rendezvous store"), std::string::npos)
      << job->reason();
}

TEST_F(CoordinatorTest, AnElasticJobOfWholeNodesLosesANodeWholeAndGrowsOnAnother) {
  const std::string id = runningOn({"n1", "n2", "n3"}, 2, elasticNodes(2, 3, 2));
  auto ranks = launchedRanks(links, id);
  // Rank 3's node loses it; its other rank there is stopped (by name: the job's others go on).
  const std::string node = ranks[3].first;
  int other = -1;
  for (const auto& [rank, where] : ranks)
    if (where.first == node && rank != 3) other = rank;
  ASSERT_GE(other, 0);
  ASSERT_TRUE(coordinator->rankEvent(node, sessions[node],
                                     rankStatus(id, 1, 3, ranks[3].second.gpu(), v1::RankStatus::EXITED, 1)));
  auto job = coordinator->getJob(id);
  ASSERT_EQ(job->state(), v1::RUNNING);
  EXPECT_EQ(job->allocation_size(), 2);
  EXPECT_EQ(heldGpus(*job), 4);
  ASSERT_EQ(stops(node, id), 1);
  const v1::StopJob& stop = links[node]->commands.back().stop();
  ASSERT_EQ(stop.ranks_size(), 1);
  EXPECT_EQ(stop.ranks(0), other);
  EXPECT_EQ(stop.attempt(), 1);
  for (const char* n : {"n1", "n2", "n3"})
    if (n != node) EXPECT_EQ(stops(n, id), 0);

  // Its other rank is still stopping: that node is not free, so nothing fits until n4 comes.
  coordinator->tick();
  EXPECT_EQ(launchedRanks(links, id).size(), 6u);
  addNode("n4", 2);
  now += 1'000;
  coordinator->tick();
  auto grown = launchedRanks(links, id);
  ASSERT_EQ(grown.size(), 8u);
  EXPECT_EQ(grown[6].first, "n4");
  EXPECT_EQ(grown[7].first, "n4");
  EXPECT_EQ(envOf(grown[7].second)["LOCAL_RANK"], "1");
  EXPECT_EQ(envOf(grown[7].second)["DDL_JOIN"], "1");
  EXPECT_EQ(heldGpus(*coordinator->getJob(id)), 6);
  // The stopped rank's exit changes nothing.
  ASSERT_TRUE(coordinator->rankEvent(
      node, sessions[node],
      rankStatus(id, 1, other, ranks[other].second.gpu(), v1::RankStatus::EXITED, {}, 15)));
  EXPECT_EQ(stateOf(id), v1::RUNNING);
}

TEST_F(CoordinatorTest, AnElasticJobGoesOnWithoutALostNodeAndGrowsBackWhenItReturns) {
  const std::string id = runningOn({"n1", "n2", "n3"}, 1, elasticNodes(2, 3, 1));
  auto ranks = launchedRanks(links, id);
  const std::string lost = ranks[2].first;
  now += 6'000;
  for (const char* n : {"n1", "n2", "n3"})
    if (n != lost) ASSERT_TRUE(beat(n, id));
  now += 6'000;
  coordinator->tick();  // `lost` missed its heartbeats
  auto job = coordinator->getJob(id);
  ASSERT_EQ(job->state(), v1::RUNNING);
  const auto& change = job->transitions(job->transitions_size() - 1);
  EXPECT_EQ(change.reason().rfind("node_lost", 0), 0u) << change.reason();
  EXPECT_NE(change.reason().find("2 of 3 ranks"), std::string::npos) << change.reason();
  coordinator->tick();
  EXPECT_EQ(launchedRanks(links, id).size(), 3u);  // no node to grow on

  addNode(lost, 1);  // the node is back, without the old rank
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  now += 1'000;
  coordinator->tick();
  auto grown =
      launchedRanks(links, id);  // (the returned node's link is a new one: rank 2's start is not in it)
  ASSERT_EQ(grown.count(3), 1u);
  EXPECT_EQ(grown[3].first, lost);
  EXPECT_EQ(envOf(grown[3].second)["DDL_JOIN"], "1");
  EXPECT_EQ(heldGpus(*coordinator->getJob(id)), 3);
}

TEST_F(CoordinatorTest, ElasticRangesAreCheckedAtSubmit) {
  addNode("n1", 4);
  v1::JobSpec s = elasticGpus(4, 4);
  EXPECT_FALSE(coordinator->submit(s));  // MIN must be below MAX
  s = spec(2, 1);
  s.set_min_gpus(1);  // a GPU minimum for a job of nodes
  EXPECT_FALSE(coordinator->submit(s));
  s = spec(2, 1);
  s.set_min_nodes(1);
  s.set_min_gpus(1);
  EXPECT_FALSE(coordinator->submit(s));
  s = spec(1, 2);
  s.set_min_nodes(1);
  auto refused = coordinator->submit(s);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("--nodes MIN:MAX with MIN < MAX"), std::string::npos)
      << refused.status().message();
  s = elasticGpus(2, 4);
  s.set_topology("2x2");  // the ring changes size
  refused = coordinator->submit(s);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("give no --topology"), std::string::npos)
      << refused.status().message();
  EXPECT_TRUE(coordinator->submit(elasticGpus(1, 4)));
}

// A change of ranks is no new start: the time limit counts from the job's RUNNING. Joiners that are lost (a
// program that cannot take them) make the next grow wait, doubling.
TEST_F(CoordinatorTest, AnElasticJobsTimeLimitOutlivesItsChangesAndLostJoinersBackTheGrowsOff) {
  v1::JobSpec s = elasticGpus(1, 3);
  s.set_time_limit_s(8);
  const std::string id = runningOn({"n1", "n2", "n3"}, 1, s);
  auto ranks = launchedRanks(links, id);
  const std::string node = ranks[2].first;
  now += 1'000;
  ASSERT_TRUE(
      coordinator->rankEvent(node, sessions[node], rankStatus(id, 1, 2, 0, v1::RankStatus::EXITED, 1)));
  coordinator->tick();  // grows at once: rank 3
  ASSERT_EQ(launchedRanks(links, id).count(3), 1u);
  ASSERT_TRUE(coordinator->rankEvent(node, sessions[node], rankStatus(id, 1, 3, 0)));
  ASSERT_TRUE(
      coordinator->rankEvent(node, sessions[node], rankStatus(id, 1, 3, 0, v1::RankStatus::EXITED, 1)));
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  coordinator->tick();
  EXPECT_EQ(launchedRanks(links, id).count(4), 0u) << "a lost joiner backs the next grow off";
  now += 1'000;
  coordinator->tick();
  ASSERT_EQ(launchedRanks(links, id).count(4), 1u);
  ASSERT_TRUE(
      coordinator->rankEvent(node, sessions[node], rankStatus(id, 1, 4, 0, v1::RankStatus::EXITED, 1)));
  now += 1'000;
  coordinator->tick();
  EXPECT_EQ(launchedRanks(links, id).count(5), 0u) << "the second loss doubles the wait";
  now += 1'000;
  coordinator->tick();
  EXPECT_EQ(launchedRanks(links, id).count(5), 1u);
  // A joiner that ran collectives has joined: its loss is any rank's, and the next grow waits no more.
  v1::RankStatus joined = rankStatus(id, 1, 5, 0);
  joined.mutable_progress()->set_collectives(3);
  ASSERT_TRUE(coordinator->rankEvent(node, sessions[node], joined));
  ASSERT_TRUE(
      coordinator->rankEvent(node, sessions[node], rankStatus(id, 1, 5, 0, v1::RankStatus::EXITED, 1)));
  coordinator->tick();
  EXPECT_EQ(launchedRanks(links, id).count(6), 1u);
  // 8 s after RUNNING, however many changes since.
  now += 3'500;
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  now += 1'000;
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::TIMEOUT);
}

// An agent that registers again without several of a job's ranks: those are lost, not its others there.
TEST_F(CoordinatorTest, AnAgentBackWithoutSomeRanksLosesThoseOnly) {
  addNode("n1", 1);
  addNode("n2", 3);
  const std::string id = submit(elasticGpus(1, 4));
  coordinator->tick();
  runAll("n1", id);
  runAll("n2", id);
  auto ranks = launchedRanks(links, id);
  std::vector<v1::RankStatus> kept;
  std::vector<int> dropped;
  for (const auto& [rank, where] : ranks) {
    if (where.first != "n2") continue;
    if (kept.empty()) {
      kept.push_back(rankStatus(id, 1, rank, where.second.gpu()));
    } else {
      dropped.push_back(rank);
    }
  }
  ASSERT_EQ(dropped.size(), 2u);
  addNode("n2", 3, {}, kept);
  auto job = coordinator->getJob(id);
  ASSERT_EQ(job->state(), v1::RUNNING);
  EXPECT_NE(
      job->transitions(job->transitions_size() - 1)
          .reason()
          .find("going on without ranks " + std::to_string(dropped[0]) + ", " + std::to_string(dropped[1])),
      std::string::npos)
      << job->transitions(job->transitions_size() - 1).reason();
  EXPECT_EQ(heldGpus(*job), 2);
}

TEST_F(CoordinatorRestartTest, AShrunkElasticJobIsStillShrunkAfterARestart) {
  const std::string id = runningOn({"n1", "n2", "n3"}, 1, elasticGpus(1, 3));
  auto ranks = launchedRanks(links, id);
  const std::string lost = ranks[1].first;
  ASSERT_TRUE(
      coordinator->rankEvent(lost, sessions[lost], rankStatus(id, 1, 1, 0, v1::RankStatus::EXITED, 2)));
  ASSERT_EQ(stateOf(id), v1::RUNNING);

  reopen();  // before any grow: the agents keep their ranks, the lost one's exit among them
  for (const auto& [rank, where] : ranks) {
    addNode(where.first, 1, {},
            {rank == 1 ? rankStatus(id, 1, 1, 0, v1::RankStatus::EXITED, 2) : rankStatus(id, 1, rank, 0)});
  }
  coordinator->tick();
  EXPECT_EQ(stateOf(id), v1::RUNNING);
  EXPECT_EQ(heldGpus(*coordinator->getJob(id)), 2);
  for (int rank : {0, 2}) {
    const std::string& node = ranks[rank].first;
    ASSERT_TRUE(
        coordinator->rankEvent(node, sessions[node], rankStatus(id, 1, rank, 0, v1::RankStatus::EXITED, 0)));
  }
  EXPECT_EQ(stateOf(id), v1::SUCCEEDED);  // the lost rank counts no more
}

}  // namespace
}  // namespace ddl::coordinator
