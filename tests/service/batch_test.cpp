// One batch, one transaction (issue 40): the coordinator's batches stay within what one transaction of its
// store takes, so each is stored whole or not at all, whenever its process dies.
//  - BatchTest.*: over an in-memory store with small limits, every batch handed to the store stays within
//    them (a scheduling pass that places many jobs is cut between job records), an array is stored in one
//    batch, and an array or a job that could never fit one is refused at submit, naming the limit.
//  - BatchCrashTest.*: over etcd (skipped without the binary), the coordinator is "killed" before each of the
//    etcd requests of a scenario in turn (a gate that stops every request from then on, as if the process had
//    died), and a standby reading the store after it finds whole batches: the array all there or not at all,
//    meta/last_job at or above every stored job, every placed job with its allocation, and a state it
//    recovers.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "service/blocking_coordinator.h"
#include "state/memory_store.h"
#ifdef DDL_HAVE_ETCD
#include "../unit/etcd_for_test.h"
#include "state/etcd_store.h"
#endif

namespace ddl::coordinator {
namespace {

class RecordingLink : public AgentLink {
 public:
  void send(const v1::Command& c) override {
    std::lock_guard<std::mutex> lock(mu);
    commands.push_back(c);
  }
  void close() override {}
  std::mutex mu;
  std::vector<v1::Command> commands;
};

v1::JobSpec oneGpu(const std::string& name) {
  v1::JobSpec s;
  s.set_name(name);
  s.set_user("alice");
  s.set_total_gpus(1);
  s.add_command("/bin/train");
  return s;
}

v1::RegisterRequest node(const std::string& name, int gpus) {
  v1::RegisterRequest req;
  req.set_node(name);
  req.set_address("10.0.0.1");
  for (int i = 0; i < gpus; ++i) {
    auto* g = req.add_gpus();
    g->set_index(i);
    g->set_uuid(name + "-gpu" + std::to_string(i));
  }
  return req;
}

// A MemoryStore that takes at most kWrites writes in one batch, and keeps the keys of every batch it stored.
class LimitedStore : public state::MemoryStore {
 public:
  static constexpr size_t kWrites = 5;
  BatchLimits batchLimits() const override { return {kWrites, SIZE_MAX}; }
  state::Status applyBatch(const std::vector<state::Write>& batch) override {
    if (batch.size() > kWrites)
      return state::Status::invalidArgument("a batch of " + std::to_string(batch.size()));
    std::set<std::string> keys;
    for (const auto& w : batch) keys.insert(w.key());
    {
      std::lock_guard<std::mutex> lock(mu);
      batches.push_back(keys);
    }
    return MemoryStore::applyBatch(batch);
  }
  std::mutex mu;
  std::vector<std::set<std::string>> batches;
};

TEST(BatchTest, EveryBatchStaysWithinTheStoresLimitsAndAnArrayIsStoredWhole) {
  LimitedStore store;
  int64_t now = 1'000'000;
  BlockingCoordinator c(store, CoordinatorOptions{}, [&] { return now; });
  ASSERT_TRUE(c.recover());
  auto reg = c.registerAgent(node("n1", 16));
  ASSERT_TRUE(reg) << reg.status().toString();
  ASSERT_TRUE(c.attachAgent("n1", reg->session(), std::make_shared<RecordingLink>()));
  // An array of 6 is 6 writes: more than one batch takes. Refused at submit, naming what to do.
  v1::SubmitRequest array;
  *array.mutable_spec() = oneGpu("sweep");
  array.set_array("0-5");
  auto refused = c.submit(array);
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), state::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("an array of 6 jobs"), std::string::npos)
      << refused.status().toString();
  EXPECT_NE(refused.status().message().find("smaller arrays"), std::string::npos);
  // An array of 5 fits: all of it in one batch.
  array.set_array("0-4");
  auto made = c.submit(array);
  ASSERT_TRUE(made) << made.status().toString();
  std::set<std::string> array_keys;
  for (const auto& id : made->array_jobs()) array_keys.insert("j:" + id);
  {
    std::lock_guard<std::mutex> lock(store.mu);
    bool whole = false;
    for (const auto& b : store.batches) {
      bool all = true;
      for (const auto& k : array_keys) all = all && b.count(k);
      whole = whole || all;
    }
    EXPECT_TRUE(whole) << "the array's jobs were not stored in one batch";
  }
  // Eleven jobs more, placed in one scheduling pass: 16 job records in one turn, cut into batches of 5.
  for (int i = 0; i < 11; ++i) ASSERT_TRUE(c.submit(oneGpu("j" + std::to_string(i))));
  c.tick();
  v1::ListJobsRequest all;
  auto listed = c.listJobs(all);
  ASSERT_TRUE(listed);
  ASSERT_EQ(listed->jobs_size(), 16);
  for (const auto& j : listed->jobs()) EXPECT_EQ(j.state(), v1::STARTING) << j.id();
  for (const auto& j : listed->jobs()) {
    auto stored = store.getJob(j.id());
    ASSERT_TRUE(stored);
    EXPECT_EQ(stored->state, state::JobState::kStarting) << j.id();
  }
  std::lock_guard<std::mutex> lock(store.mu);
  for (const auto& b : store.batches) EXPECT_LE(b.size(), LimitedStore::kWrites);
}

#ifdef DDL_HAVE_ETCD
// The scenario a leader dies in: a node registers, an array of 4 jobs and 6 single jobs are submitted, and
// one scheduling pass places all 10 (10 job records: more than one batch of 5 takes). Each step waits for its
// answer, or stops as soon as the gate is shut (the process is dead: nothing more happens).
class BatchCrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = etcd_.start(1); !why.empty()) GTEST_SKIP() << why;
  }

  std::unique_ptr<state::EtcdStore> open(const std::string& prefix, std::function<bool()> gate = nullptr) {
    state::EtcdStore::Options o;
    o.endpoints = etcd_.endpoints();
    o.prefix = prefix;
    o.max_txn_ops = 6;  // 5 writes of the coordinator's a transaction
    o.timeout_ms = 2000;
    o.gate = std::move(gate);
    for (int attempt = 0; attempt < 100; ++attempt) {
      auto store = state::EtcdStore::open(o);
      if (store) return std::move(*store);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return nullptr;
  }

  // Runs the scenario over `store`; returns once it is done or `dead` says the process died.
  void scenario(state::EtcdStore& store, const std::atomic<bool>& dead) {
    CoordinatorOptions options;
    options.tick_ms = 20;
    BlockingCoordinator c(store, options);
    if (!c.recover()) return;
    // Waits for an asynchronous answer, or for the death.
    auto await = [&](const std::function<void(std::function<void()>)>& call) {
      auto done = std::make_shared<std::atomic<bool>>(false);
      call([done] { *done = true; });
      for (int i = 0; i < 2000 && !*done && !dead; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      return done->load();
    };
    std::string session;
    if (!await([&](auto done) {
          c.registerAgent(node("n1", 10), [&session, done](StatusOr<v1::RegisterResponse> r) {
            if (r) session = r->session();
            done();
          });
        })) {
      return;
    }
    auto link = std::make_shared<RecordingLink>();
    if (!await([&](auto done) { c.attachAgent("n1", session, link, [done](Status) { done(); }); })) return;
    v1::SubmitRequest array;
    *array.mutable_spec() = oneGpu("sweep");
    array.set_array("0-3");
    if (!await([&](auto done) { c.submit(array, [done](StatusOr<v1::SubmitResponse>) { done(); }); })) return;
    for (int i = 0; i < 6; ++i) {
      v1::SubmitRequest one;
      *one.mutable_spec() = oneGpu("j" + std::to_string(i));
      if (!await([&](auto done) { c.submit(one, [done](StatusOr<v1::SubmitResponse>) { done(); }); })) return;
    }
    c.start();  // the ticker places them
    for (int i = 0; i < 2000 && !dead; ++i) {
      {
        std::lock_guard<std::mutex> lock(link->mu);
        if (link->commands.size() >= 10) break;  // every start sent: all stored
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }

  test_util::EtcdForTest etcd_;
};

TEST_F(BatchCrashTest, ALeaderKilledBetweenAnyTwoEtcdRequestsLeavesWholeBatches) {
  // How many requests the whole scenario makes.
  std::atomic<bool> never{false};
  int64_t total = 0;
  {
    auto store = open("/whole/");
    ASSERT_NE(store, nullptr);
    const int64_t before = store->requests();
    scenario(*store, never);
    total = store->requests() - before;
    auto jobs = store->listJobsPage({}, 0, 100);
    ASSERT_TRUE(jobs);
    ASSERT_EQ(jobs->size(), 10u);
    for (const auto& j : *jobs) EXPECT_EQ(j.state, state::JobState::kStarting) << j.id;
  }
  ASSERT_GT(total, 5);
  std::printf("the scenario makes %lld requests to etcd\n", static_cast<long long>(total));
  for (int64_t budget = 0; budget <= total; ++budget) {
    SCOPED_TRACE("killed before request " + std::to_string(budget + 1) + " of " + std::to_string(total));
    const std::string prefix = "/crash-" + std::to_string(budget) + "/";
    std::atomic<int64_t> left{-1};  // -1: open() is not counted
    std::atomic<bool> dead{false};
    {
      auto store = open(prefix, [&] {
        if (left.load() < 0) return true;
        if (left.fetch_sub(1) > 0) return true;
        dead = true;
        return false;
      });
      ASSERT_NE(store, nullptr);
      left = budget;
      scenario(*store, dead);
    }  // the coordinator and its store are gone: what is in etcd is what the next leader finds
    auto standby = open(prefix);
    ASSERT_NE(standby, nullptr);
    auto jobs = standby->listJobsPage({}, 0, 100);
    ASSERT_TRUE(jobs) << jobs.status().toString();
    auto last = standby->lastJobNumber();
    ASSERT_TRUE(last);
    int array_jobs = 0;
    for (const auto& j : *jobs) {
      EXPECT_LE(jobIdNumber(j.id).value_or(0), *last) << j.id << " above meta/last_job";
      if (!j.spec.array_id.empty()) ++array_jobs;
      const bool placed = j.state == state::JobState::kScheduled || j.state == state::JobState::kStarting;
      EXPECT_EQ(placed, !j.allocation.empty()) << j.id << " " << state::toString(j.state);
    }
    EXPECT_TRUE(array_jobs == 0 || array_jobs == 4) << array_jobs << " of the array's 4 jobs were stored";
    // The next leader takes it from there: it recovers, and numbers go on past every stored job.
    BlockingCoordinator next(*standby, CoordinatorOptions{});
    ASSERT_TRUE(next.recover());
    auto reg = next.registerAgent(node("n2", 1));
    ASSERT_TRUE(reg) << reg.status().toString();
    auto more = next.submit(oneGpu("after"));
    ASSERT_TRUE(more) << more.status().toString();
    for (const auto& j : *jobs) EXPECT_GT(jobIdNumber(more->id()).value_or(0), jobIdNumber(j.id).value_or(0));
  }
}
#endif

}  // namespace
}  // namespace ddl::coordinator
