// Leader election over etcd (coordinator/state/etcd_election.h) and the fence on the leader's writes
// (EtcdStore::fence): one candidate leads at a time; a resignation or a lease that runs out lets another win;
// the deposed leader's writes are refused and change nothing. A real etcd member per test
// (etcd_for_test.h); the tests skip, saying why, where there is no etcd binary.
#include "state/etcd_election.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "etcd_for_test.h"
#include "state/direct_store.h"
#include "state/etcd_store.h"

namespace ddl::state {
namespace {

class EtcdElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test_util::EtcdForTest::binary().empty())
      GTEST_SKIP() << "no etcd binary (scripts/bootstrap unpacks one)";
    ASSERT_EQ(etcd_.start(), "");
    EtcdStore::Options o;
    o.endpoints = {etcd_.endpoint()};
    o.timeout_ms = 1000;
    for (int attempt = 0; attempt < 100 && !store_; ++attempt) {  // until the member answers (10 s at most)
      auto store = EtcdStore::open(o);
      if (store) {
        store_ = std::move(*store);
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    ASSERT_NE(store_, nullptr) << "etcd did not answer";
  }

  std::unique_ptr<EtcdElection> candidate(const std::string& id, int ttl_s = 3) {
    EtcdElection::Options o;
    o.endpoints = {etcd_.endpoint()};
    o.id = id;
    o.ttl_s = ttl_s;
    auto c = EtcdElection::create(o);
    EXPECT_TRUE(c) << c.status().toString();
    return c ? std::move(*c) : nullptr;
  }

  test_util::EtcdForTest etcd_;
  std::unique_ptr<EtcdStore> store_;
};

TEST_F(EtcdElectionTest, OneLeadsAtATimeAndAResignationHandsOver) {
  auto a = candidate("10.0.0.1:7070"), b = candidate("10.0.0.2:7070");
  ASSERT_TRUE(a && b);
  EXPECT_EQ(*a->campaign(), true);
  EXPECT_EQ(*a->campaign(), true);  // again: still a
  EXPECT_EQ(*b->campaign(), false);
  EXPECT_TRUE(a->leading());
  EXPECT_FALSE(b->leading());
  auto seen = b->leader();
  ASSERT_TRUE(seen);
  EXPECT_EQ(seen->id, "10.0.0.1:7070");
  EXPECT_EQ(seen->revision, a->revision());
  EXPECT_TRUE(a->keepAlive());

  ASSERT_TRUE(a->resign());
  EXPECT_FALSE(a->leading());
  EXPECT_EQ(b->leader()->id, "");
  EXPECT_EQ(*b->campaign(), true);
  EXPECT_GT(b->revision(), seen->revision);  // a new reign
  EXPECT_EQ(*a->campaign(), false);
  EXPECT_EQ(a->leader()->id, "10.0.0.2:7070");
}

// A leader that stops renewing (killed, cut off) loses the lead when its lease runs out, and its writes,
// fenced with its reign, are refused from then on; the new leader's go through.
TEST_F(EtcdElectionTest, ALeaseThatRunsOutDeposesAndTheFenceStopsTheOldLeadersWrites) {
  auto a = candidate("a", 2), b = candidate("b", 2);
  ASSERT_TRUE(a && b);
  ASSERT_EQ(*a->campaign(), true);
  store_->fence(a->key(), a->revision());
  DirectStore writes(*store_);
  auto before = writes.createJob(JobSpec{"first", "alice", 1, 1, 1, "", 0, 0, {}, "/", {"/bin/true"}});
  ASSERT_TRUE(before) << before.status().toString();

  // a stops renewing; b takes over once the lease has run out (bounded: 10 s).
  bool b_leads = false;
  for (int i = 0; i < 100 && !b_leads; ++i) {
    auto won = b->campaign();
    b_leads = won && *won;
    if (!b_leads) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(b_leads) << "b never won after a's lease should have run out";
  Status renewed = a->keepAlive();
  EXPECT_EQ(renewed.code(), StatusCode::kFailedPrecondition) << renewed.toString();
  EXPECT_FALSE(a->leading());

  // a's store has not been told: its next write is refused and leaves nothing behind.
  auto late = writes.createJob(JobSpec{"late", "alice", 1, 1, 1, "", 0, 0, {}, "/", {"/bin/true"}});
  ASSERT_FALSE(late);
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(late.status().message().find("another coordinator leads now"), std::string::npos)
      << late.status().message();
  EXPECT_EQ(*store_->lastJobNumber(), 1);
  EXPECT_EQ(writes.listJobs()->size(), 1u);

  // Fenced with b's reign, the same store writes again.
  store_->fence(b->key(), b->revision());
  auto next = writes.createJob(JobSpec{"next", "alice", 1, 1, 1, "", 0, 0, {}, "/", {"/bin/true"}});
  ASSERT_TRUE(next) << next.status().toString();
  EXPECT_EQ(next->id, "j-000002");
}

TEST(EtcdElection, BadOptionsAreRefused) {
  EtcdElection::Options o;
  EXPECT_EQ(EtcdElection::create(o).status().code(), StatusCode::kInvalidArgument);
  o.endpoints = {"127.0.0.1:1"};
  EXPECT_EQ(EtcdElection::create(o).status().code(), StatusCode::kInvalidArgument);  // no id
  o.id = "c1";
  o.ttl_s = 0;
  EXPECT_EQ(EtcdElection::create(o).status().code(), StatusCode::kInvalidArgument);
  o.ttl_s = 3;
  o.timeout_ms = 300;
  auto nobody = EtcdElection::create(o);
  ASSERT_TRUE(nobody);
  auto won = (*nobody)->campaign();
  EXPECT_EQ(won.status().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ddl::state
