// The launch plan (coordinator/service/launch_plan.h) as a pure function: a placed job, its layout and the
// attempt's rendezvous make one StartRanks per node with each rank's GPU, CPUs and environment.
#include "service/launch_plan.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

namespace ddl::coordinator {
namespace {

// Two nodes x two GPUs, CPUs 2 per rank on n1 only; the layout built the way the coordinator builds it.
struct Placed {
  state::Job job;
  placement::Allocation allocation;
  placement::RingLayout layout;
};

Placed placedJob() {
  Placed p;
  p.job.id = "j-000042";
  p.job.spec.name = "train";
  p.job.spec.user = "alice";
  p.job.spec.command = {"/usr/bin/python3", "train.py", "--lr=0.1"};
  p.job.spec.workdir = "/home/alice";
  p.job.spec.env = {"RANK=99", "A=x=y"};
  p.job.spec.memory_per_rank_bytes = 1 << 20;
  p.allocation.nodes = {{"n1", {0, 1}, {4, 5, 6, 7}, 2 << 20}, {"n2", {0, 1}, {}, 0}};
  placement::Cluster cluster;
  for (const char* name : {"n1", "n2"}) {
    placement::Node n;
    n.name = name;
    n.gpus = 2;
    cluster.nodes.push_back(n);
  }
  const std::string err = placement::buildRingLayout(p.allocation, cluster, "", &p.layout);
  EXPECT_EQ(err, "");
  return p;
}

// The value of the last `name` in a rank's environment (the one a process sees), or "<unset>".
std::string envOf(const v1::RankLaunch& rank, const std::string& name) {
  std::string value = "<unset>";
  for (const auto& e : rank.env()) {
    if (e.name() == name) value = e.value();
  }
  return value;
}

TEST(LaunchPlan, OneStartPerNodeWithEveryRankOfTheLayout) {
  Placed p = placedJob();
  const LaunchTarget target{3, "10.0.0.1", 29510, "s3cret", false};
  auto commands = startCommands(p.job, p.allocation, p.layout, target);
  ASSERT_EQ(commands.size(), 2u);
  std::set<int> ranks;
  for (const auto& [node, cmd] : commands) {
    ASSERT_TRUE(cmd.has_start()) << node;
    const v1::StartRanks& start = cmd.start();
    EXPECT_EQ(start.job_id(), "j-000042");
    EXPECT_EQ(start.attempt(), 3);
    EXPECT_EQ(std::vector<std::string>(start.command().begin(), start.command().end()), p.job.spec.command);
    EXPECT_EQ(start.workdir(), "/home/alice");
    EXPECT_EQ(start.user(), "alice");
    EXPECT_FALSE(start.allow_root());
    ASSERT_EQ(start.ranks_size(), 2) << node;
    for (const auto& r : start.ranks()) {
      ranks.insert(r.rank());
      EXPECT_EQ(p.layout.ranks[r.rank()].node, node);
      EXPECT_EQ(p.layout.ranks[r.rank()].gpu, r.gpu());
      EXPECT_EQ(r.memory_bytes(), 1 << 20);
      // The CPUs the allocation gave that GPU on n1; none on n2, which was given none.
      const std::vector<int> cpus(r.cpus().begin(), r.cpus().end());
      if (node == "n1") {
        EXPECT_EQ(cpus, r.gpu() == 0 ? (std::vector<int>{4, 5}) : (std::vector<int>{6, 7}));
      } else {
        EXPECT_TRUE(cpus.empty());
      }
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
}

TEST(LaunchPlan, DdlsVariablesComeAfterTheUsersAndWin) {
  Placed p = placedJob();
  p.job.spec.array_id = "j-000040";
  p.job.spec.array_index = 7;
  auto commands =
      startCommands(p.job, p.allocation, p.layout, LaunchTarget{1, "10.0.0.1", 29510, "s3cret", true});
  for (const auto& [node, cmd] : commands) {
    EXPECT_TRUE(cmd.start().allow_root());
    for (const auto& r : cmd.start().ranks()) {
      ASSERT_GE(r.env_size(), 2);
      EXPECT_EQ(r.env(0).name(), "RANK");  // the user's, first...
      EXPECT_EQ(r.env(0).value(), "99");
      EXPECT_EQ(r.env(1).name(), "A");
      EXPECT_EQ(r.env(1).value(), "x=y");                     // split at the first '='
      EXPECT_EQ(envOf(r, "RANK"), std::to_string(r.rank()));  // ...and ddl's after it, which wins
      EXPECT_EQ(envOf(r, "DDL_RANK"), std::to_string(r.rank()));
      EXPECT_EQ(envOf(r, "DDL_ROOT"), "10.0.0.1:29510");
      EXPECT_EQ(envOf(r, "MASTER_PORT"), "29511");
      EXPECT_EQ(envOf(r, "DDL_JOB_SECRET"), "s3cret");
      EXPECT_EQ(envOf(r, "DDL_ARRAY_JOB_ID"), "j-000040");
      EXPECT_EQ(envOf(r, "DDL_ARRAY_INDEX"), "7");
    }
  }
}

TEST(LaunchPlan, PlacedRanksAreInRankOrderWithTheirNodeAndGpu) {
  Placed p = placedJob();
  auto ranks = placedRanks(p.layout, 2);
  ASSERT_EQ(ranks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(ranks[r].rank, r);
    EXPECT_EQ(ranks[r].attempt, 2);
    EXPECT_EQ(ranks[r].node, p.layout.ranks[r].node);
    EXPECT_EQ(ranks[r].gpu, p.layout.ranks[r].gpu);
    EXPECT_FALSE(ranks[r].exited);
  }
}

TEST(LaunchPlan, RootPortStartsAtTheJobsSlotAndSkipsTakenPairs) {
  // 10 ports: 5 pairs (29500, 29502, ... 29508); job 7 starts at slot 7 % 5 = 2.
  auto none = [](int) { return false; };
  EXPECT_EQ(rootPort("j-000007", 29500, 29509, none), 29504);
  EXPECT_EQ(rootPort("j-000007", 29500, 29509, [](int port) { return port == 29504; }), 29506);
  EXPECT_EQ(rootPort("j-000009", 29500, 29509, [](int port) { return port == 29508; }), 29500);  // wraps
  // Every pair taken: the job's own slot (the clash is reported where the port is used).
  EXPECT_EQ(rootPort("j-000007", 29500, 29509, [](int) { return true; }), 29504);
  // A range of one port still has one slot; a malformed id counts as number 0.
  EXPECT_EQ(rootPort("j-000007", 29500, 29500, none), 29500);
  EXPECT_EQ(rootPort("not-an-id", 29500, 29509, none), 29500);
}

}  // namespace
}  // namespace ddl::coordinator
