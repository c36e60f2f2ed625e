// The coordinator through real gRPC on 127.0.0.1 (port chosen at run time) with fake agents that speak the
// agent protocol: register, run, succeed; heartbeat timeout -> DOWN -> job failed; cancel; a coordinator
// restart mid-job that the agents reconcile with; a node registering twice.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "ddl/v1/ddl.grpc.pb.h"
#include "rpc/server.h"
#include "service/blocking_coordinator.h"
#include "service/fake_agent.h"
#include "state/sqlite_store.h"

namespace ddl::coordinator {
namespace {

using ddl::testing::FakeAgent;

// Polls `pred` every 20 ms for at most timeout_ms.
template <typename Pred>
bool waitFor(Pred pred, int timeout_ms = 5000) {
  for (int waited = 0; waited <= timeout_ms; waited += 20) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

class RpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("ddl-rpc-test-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    startCoordinator("127.0.0.1:0");
  }
  void TearDown() override {
    stopCoordinator();
    std::filesystem::remove_all(dir_);
  }

  void startCoordinator(const std::string& listen) {
    state::SqliteStore::Options o;
    o.path = (dir_ / "state.db").string();
    auto store = state::SqliteStore::open(o);
    ASSERT_TRUE(store) << store.status().toString();
    store_ = std::move(*store);
    CoordinatorOptions options;
    options.heartbeat_grace_ms = 1500;
    options.tick_ms = 50;
    coordinator_ = std::make_unique<BlockingCoordinator>(*store_, options);
    ASSERT_TRUE(coordinator_->recover());
    SecurityOptions security;
    security.insecure = true;  // a unit test of the service over loopback (security_test covers TLS)
    server_ = std::make_unique<RpcServer>(*coordinator_, security);
    ASSERT_TRUE(server_->start(listen, &address_));
    coordinator_->start();
    user_ = v1::UserService::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void stopCoordinator() {
    if (coordinator_) coordinator_->stop();
    if (server_) server_->shutdown();
    server_.reset();
    coordinator_.reset();
    store_.reset();
  }

  std::string submit(int nodes, int gpus_per_node) {
    v1::SubmitRequest req;
    req.mutable_spec()->set_user("bob");
    req.mutable_spec()->set_nodes(nodes);
    req.mutable_spec()->set_gpus_per_node(gpus_per_node);
    req.mutable_spec()->add_command("train");
    v1::SubmitResponse resp;
    grpc::ClientContext ctx;
    grpc::Status st = user_->Submit(&ctx, req, &resp);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return resp.job().id();
  }
  v1::Job job(const std::string& id) {
    v1::GetJobRequest req;
    req.set_id(id);
    v1::Job out;
    grpc::ClientContext ctx;
    grpc::Status st = user_->GetJob(&ctx, req, &out);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return out;
  }
  bool reaches(const std::string& id, v1::JobState want, int timeout_ms = 5000) {
    return waitFor([&] { return job(id).state() == want; }, timeout_ms);
  }
  std::vector<v1::Node> nodes() {
    v1::ListNodesResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(user_->ListNodes(&ctx, v1::ListNodesRequest(), &resp).ok());
    return {resp.nodes().begin(), resp.nodes().end()};
  }

  std::filesystem::path dir_;
  std::unique_ptr<state::Store> store_;
  std::unique_ptr<BlockingCoordinator> coordinator_;
  std::unique_ptr<RpcServer> server_;
  std::string address_;
  std::unique_ptr<v1::UserService::Stub> user_;
};

TEST_F(RpcTest, ASecondServerOnTheSamePortIsRefusedAsAddressInUse) {
  // gRPC's default SO_REUSEPORT let a second coordinator start on a port in use, and the kernel then dealt the
  // clients out between the two at random.
  state::SqliteStore::Options o;
  o.path = (dir_ / "second.db").string();
  auto store = state::SqliteStore::open(o);
  ASSERT_TRUE(store) << store.status().toString();
  Coordinator second(**store, CoordinatorOptions());
  SecurityOptions security;
  security.insecure = true;
  RpcServer server(second, security);
  std::string bound;
  Status st = server.start(address_, &bound);
  ASSERT_FALSE(st) << "a second server started on " << address_ << " (" << bound << ")";
  EXPECT_NE(st.message().find("address in use"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find(address_), std::string::npos) << st.message();
  // The first still answers alone.
  EXPECT_EQ(nodes().size(), 0u);
}

TEST_F(RpcTest, AgentsRegisterAndAJobRunsToSucceeded) {
  FakeAgent a(address_, "n1", 2), b(address_, "n2", 2);
  ASSERT_EQ(a.connect(), "");
  ASSERT_EQ(b.connect(), "");
  a.startHeartbeats(200);
  b.startHeartbeats(200);
  ASSERT_TRUE(waitFor([&] { return nodes().size() == 2 && nodes()[1].connected(); }));
  std::string id = submit(2, 2);
  v1::StartRanks start;
  ASSERT_TRUE(a.waitStart(id, &start));
  EXPECT_EQ(start.ranks_size(), 2);
  ASSERT_TRUE(b.waitStart(id, nullptr));
  ASSERT_TRUE(reaches(id, v1::RUNNING));
  auto listed = nodes();
  EXPECT_EQ(listed[0].gpus_used_size(), 2);
  EXPECT_EQ(listed[0].jobs(0), id);
  ASSERT_TRUE(a.exitAll(id));
  ASSERT_TRUE(b.exitAll(id));
  ASSERT_TRUE(reaches(id, v1::SUCCEEDED));
  EXPECT_TRUE(a.waitStop(id));  // the agents are told to release the exited ranks
}

TEST_F(RpcTest, SilentNodeGoesDownAndItsJobFailsWithNodeLost) {
  FakeAgent a(address_, "n1", 1), b(address_, "n2", 1);
  ASSERT_EQ(a.connect(), "");
  ASSERT_EQ(b.connect(), "");
  b.startHeartbeats(200);
  a.startHeartbeats(200);
  std::string on_a = submit(1, 1);
  std::string on_b = submit(1, 1);
  ASSERT_TRUE(reaches(on_a, v1::RUNNING));
  ASSERT_TRUE(reaches(on_b, v1::RUNNING));
  // Find which agent got which job, then silence the first one's agent.
  FakeAgent& silent = a.waitStart(on_a, nullptr, 0) ? a : b;
  silent.stopHeartbeats();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(reaches(on_a, v1::FAILED, 5000));
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 2 * 1.5 + 1.0);  // DOWN within the grace period (generous slack for a loaded machine)
  EXPECT_EQ(job(on_a).reason().rfind("node_lost", 0), 0u) << job(on_a).reason();
  EXPECT_EQ(job(on_b).state(), v1::RUNNING);
  for (const auto& n : nodes()) EXPECT_EQ(n.state(), n.name() == silent.node() ? "DOWN" : "UP");
  EXPECT_FALSE(silent.lastStreamStatus().ok());  // the coordinator ended its stream
  // It comes back: UP again.
  ASSERT_EQ(silent.connect(), "");
  ASSERT_TRUE(waitFor([&] {
    for (const auto& n : nodes()) {
      if (n.name() == silent.node()) return n.state() == "UP";
    }
    return false;
  }));
}

TEST_F(RpcTest, CancelStopsARunningJob) {
  FakeAgent a(address_, "n1", 2);
  ASSERT_EQ(a.connect(), "");
  a.startHeartbeats(200);
  std::string id = submit(1, 2);
  ASSERT_TRUE(reaches(id, v1::RUNNING));
  v1::CancelJobRequest req;
  req.set_id(id);
  v1::Job resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(user_->CancelJob(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.state(), v1::CANCELLED);
  EXPECT_TRUE(a.waitStop(id));
  EXPECT_TRUE(waitFor([&] { return a.held().empty(); }));
  grpc::ClientContext again;
  grpc::Status st = user_->CancelJob(&again, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  v1::GetJobRequest unknown;
  unknown.set_id("j-424242");
  grpc::ClientContext ctx3;
  EXPECT_EQ(user_->GetJob(&ctx3, unknown, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(RpcTest, CoordinatorRestartMidJobReconcilesWithTheAgents) {
  FakeAgent a(address_, "n1", 2), b(address_, "n2", 2);
  ASSERT_EQ(a.connect(), "");
  ASSERT_EQ(b.connect(), "");
  a.startHeartbeats(200);
  b.startHeartbeats(200);
  std::string id = submit(2, 2);
  ASSERT_TRUE(reaches(id, v1::RUNNING));
  const std::string address = address_;
  stopCoordinator();
  a.stopHeartbeats();
  b.stopHeartbeats();
  startCoordinator(address);  // same port: the agents' address does not change
  EXPECT_EQ(job(id).state(), v1::RUNNING);
  // The agents notice the lost stream and come back with the ranks they run.
  ASSERT_EQ(a.connect(), "");
  ASSERT_EQ(b.connect(), "");
  a.startHeartbeats(200);
  b.startHeartbeats(200);
  ASSERT_TRUE(waitFor([&] { return nodes().size() == 2 && nodes()[0].connected() && nodes()[1].connected(); }));
  EXPECT_EQ(job(id).state(), v1::RUNNING);
  ASSERT_TRUE(a.exitAll(id));
  ASSERT_TRUE(b.exitAll(id));
  ASSERT_TRUE(reaches(id, v1::SUCCEEDED));
}

TEST_F(RpcTest, RegisteringAgainEndsTheOldStream) {
  FakeAgent first(address_, "n1", 1), second(address_, "n1", 1);
  ASSERT_EQ(first.connect(), "");
  ASSERT_EQ(second.connect(), "");
  EXPECT_FALSE(first.lastStreamStatus().ok());
  ASSERT_TRUE(second.heartbeat());
  ASSERT_TRUE(waitFor([&] { return nodes().size() == 1 && nodes()[0].connected(); }));
}

}  // namespace
}  // namespace ddl::coordinator
