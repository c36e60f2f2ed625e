// Placement and ring layout: gang, best fit, topology preference, the queue with backfill, infeasible
// requests, odd cluster shapes, and the ring dims ranks get as DDL_TOPOLOGY. Every expectation is worked out
// by hand from the rules at the top of placement.cpp and ring_layout.cpp.
#include "placement/placement.h"

#include <gtest/gtest.h>

#include <random>

#include "placement/ring_layout.h"
#include "topology_cases.h"

namespace ddl::placement {
namespace {

Node makeNode(const std::string& name, int gpus, const std::string& sw = "s1", std::vector<int> used = {},
              NodeState state = NodeState::kUp, const std::string& rack = "") {
  Node n;
  n.name = name;
  n.gpus = gpus;
  n.used.assign(gpus, false);
  for (int g : used) n.used[g] = true;
  if (!sw.empty()) n.labels[kSwitchLabel] = sw;
  if (!rack.empty()) n.labels[kRackLabel] = rack;
  n.state = state;
  return n;
}

JobRequest shapeJob(const std::string& id, int nodes, int gpusPerNode, int priority = 0, uint64_t seq = 0) {
  JobRequest j;
  j.id = id;
  j.nodes = nodes;
  j.gpusPerNode = gpusPerNode;
  j.priority = priority;
  j.submitSeq = seq;
  return j;
}

JobRequest totalJob(const std::string& id, int gpus, int priority = 0, uint64_t seq = 0) {
  JobRequest j;
  j.id = id;
  j.totalGpus = gpus;
  j.priority = priority;
  j.submitSeq = seq;
  return j;
}

std::string allocOf(const Cluster& c, const JobRequest& j) {
  PlacementResult r = place(c, j);
  return r.ok() ? r.allocation().str() : "<" + r.reason() + ">";
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

#define EXPECT_CONTAINS(haystack, needle) EXPECT_TRUE(contains(haystack, needle)) << "in: " << (haystack)

// ---- gang and best fit ------------------------------------------------------------------------------------

TEST(Placement, GangIsAllOrNothing) {
  Cluster c{{makeNode("n1", 4, "s1", {0, 1}), makeNode("n2", 4), makeNode("n3", 4)}};
  PlacementResult r = place(c, shapeJob("j", 3, 4));
  ASSERT_TRUE(r.isPending()) << r.reason();
  EXPECT_TRUE(r.allocation().empty());
  EXPECT_EQ(
      r.reason(),
      "waiting for 3 nodes with 4 free GPUs each: 2 of the 3 eligible UP nodes have them now, the others are "
      "running jobs");
  EXPECT_EQ(allocOf(c, shapeJob("j", 2, 4)), "n2[0,1,2,3] n3[0,1,2,3]");
  EXPECT_EQ(allocOf(c, shapeJob("j", 3, 2)), "n1[2,3] n2[0,1] n3[0,1]");
}

TEST(Placement, SingleNodeJobsTakeTheBestFittingNode) {
  // n1 has 2 free, n2 4 free, n3 3 free of 8.
  Cluster c{
      {makeNode("n1", 4, "s1", {0, 1}), makeNode("n2", 4, "s2"), makeNode("n3", 8, "s3", {0, 1, 2, 3, 4})}};
  EXPECT_EQ(allocOf(c, shapeJob("a", 1, 2)), "n1[2,3]");
  EXPECT_EQ(allocOf(c, shapeJob("b", 1, 3)), "n3[5,6,7]");
  EXPECT_EQ(allocOf(c, totalJob("c", 3)), "n3[5,6,7]");
  EXPECT_EQ(allocOf(c, totalJob("d", 4)), "n2[0,1,2,3]");
}

TEST(Placement, BestFitKeepsWholeNodesForLaterJobs) {
  // Fragmentation case: two 2-GPU jobs go on the same node, so the 4-GPU job still finds a whole node. A
  // most-free-first policy would put them on n1 and n2 and leave the 4-GPU job waiting.
  Cluster c{{makeNode("n1", 4), makeNode("n2", 4)}};
  ScheduleResult s =
      schedule(c, {shapeJob("a", 1, 2, 0, 1), shapeJob("b", 1, 2, 0, 2), shapeJob("c", 1, 4, 0, 3)});
  EXPECT_EQ(s.started(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(s.find("a")->allocation.str(), "n1[0,1]");
  EXPECT_EQ(s.find("b")->allocation.str(), "n1[2,3]");
  EXPECT_EQ(s.find("c")->allocation.str(), "n2[0,1,2,3]");
  EXPECT_EQ(s.headJob, "");
}

TEST(Placement, TotalGpuJobsUseFewestNodesThenBestFit) {
  // Free GPUs 1, 2, 3, 4: a 5-GPU job takes the fullest node (4), then the node that fits the last 1 exactly.
  Cluster c{{makeNode("n1", 4, "s1", {0, 1, 2}), makeNode("n2", 4, "s1", {0, 1}),
             makeNode("n3", 4, "s1", {0}), makeNode("n4", 4)}};
  EXPECT_EQ(allocOf(c, totalJob("j", 5)), "n1[3] n4[0,1,2,3]");
  EXPECT_EQ(allocOf(c, totalJob("j", 6)), "n2[2,3] n4[0,1,2,3]");
  EXPECT_EQ(allocOf(c, totalJob("j", 10)), "n1[3] n2[2,3] n3[1,2,3] n4[0,1,2,3]");
  EXPECT_TRUE(place(c, totalJob("j", 11)).isPending());
}

// ---- topology ---------------------------------------------------------------------------------------------

Cluster threeSwitches() {
  // Rack r1: s1 with n1-n4, s2 with n5-n6. Rack r2: s3 with n7-n9. 4 GPUs each, all free.
  Cluster c;
  for (int i = 1; i <= 9; ++i) {
    const std::string sw = i <= 4 ? "s1" : i <= 6 ? "s2" : "s3";
    c.nodes.push_back(makeNode("n" + std::to_string(i), 4, sw, {}, NodeState::kUp, i <= 6 ? "r1" : "r2"));
  }
  return c;
}

std::vector<std::string> nodesOf(const PlacementResult& r) {
  std::vector<std::string> names;
  for (const auto& a : r.allocation().nodes) names.push_back(a.node);
  return names;
}

TEST(Placement, PrefersTheSmallestSwitchThatHoldsTheJob) {
  Cluster c = threeSwitches();
  using V = std::vector<std::string>;
  EXPECT_EQ(nodesOf(place(c, shapeJob("j", 2, 4))), (V{"n5", "n6"}));
  EXPECT_EQ(nodesOf(place(c, shapeJob("j", 3, 4))), (V{"n7", "n8", "n9"}));
  EXPECT_EQ(nodesOf(place(c, shapeJob("j", 4, 4))), (V{"n1", "n2", "n3", "n4"}));
  EXPECT_EQ(nodesOf(place(c, totalJob("j", 12))), (V{"n7", "n8", "n9"}));
}

TEST(Placement, SpansFewestSwitchesInTheLowestRack) {
  Cluster c = threeSwitches();
  using V = std::vector<std::string>;
  // 5 nodes fit no switch; rack r1 (6 nodes) holds them: all of s1, then the best fit for 1 more (s2).
  EXPECT_EQ(nodesOf(place(c, shapeJob("j", 5, 4))), (V{"n1", "n2", "n3", "n4", "n5"}));
  // 7 nodes fit no rack: the cluster, r1 first (largest), then 1 node of r2.
  EXPECT_EQ(nodesOf(place(c, shapeJob("j", 7, 4))), (V{"n1", "n2", "n3", "n4", "n5", "n6", "n7"}));
  // With n1 busy, s1 and s3 both hold 3 nodes; 4 nodes no longer fit s1, so rack r1 gives s1's 3 and one of
  // s2.
  c.nodes[0].used.assign(4, true);
  EXPECT_EQ(nodesOf(place(c, shapeJob("j", 4, 4))), (V{"n2", "n3", "n4", "n5"}));
}

TEST(Placement, AmongEqualSwitchesPrefersPartlyUsedNodes) {
  // s1 has two empty nodes, s2 two half-used nodes: a 2x2 job fills s2's halves and leaves s1 whole.
  Cluster c{{makeNode("n1", 4, "s1"), makeNode("n2", 4, "s1"), makeNode("n3", 4, "s2", {0, 1}),
             makeNode("n4", 4, "s2", {0, 1})}};
  EXPECT_EQ(allocOf(c, shapeJob("j", 2, 2)), "n3[2,3] n4[2,3]");
}

TEST(Placement, NodesWithoutSwitchLabelsAreNotAssumedToShareOne) {
  Cluster c{{makeNode("a", 4, ""), makeNode("b", 4, ""), makeNode("c", 4, "s1"), makeNode("d", 4, "s1")}};
  // s1 holds 2 nodes; unlabeled a and b are each alone, so a 2-node job goes to s1.
  EXPECT_EQ(allocOf(c, shapeJob("j", 2, 4)), "c[0,1,2,3] d[0,1,2,3]");
  EXPECT_EQ(allocOf(c, shapeJob("j", 3, 4)), "a[0,1,2,3] c[0,1,2,3] d[0,1,2,3]");
}

// ---- infeasible requests ----------------------------------------------------------------------------------

TEST(Feasibility, RefusesWhatCanNeverFitAndSaysWhy) {
  Cluster c{{makeNode("n1", 4), makeNode("n2", 4)}};
  c.nodes[0].labels["gpu"] = "a100";
  c.nodes[1].labels["gpu"] = "a100";
  EXPECT_EQ(checkFeasible(c, shapeJob("j", 2, 4)), "");
  EXPECT_EQ(
      checkFeasible(c, shapeJob("j", 3, 4)),
      "job j asks for 3 nodes x 4 GPUs but the cluster has only 2 UP or DRAINING nodes with at least 4 GPUs");
  EXPECT_EQ(checkFeasible(c, shapeJob("j", 1, 8)),
            "job j asks for 8 GPUs per node but the largest UP or DRAINING node has 4");
  EXPECT_EQ(checkFeasible(c, totalJob("j", 9)),
            "job j asks for 9 GPUs but the UP and DRAINING nodes have only 8 GPUs in all");

  JobRequest h100 = shapeJob("j", 1, 1);
  h100.requiredLabels["gpu"] = "h100";
  EXPECT_EQ(checkFeasible(c, h100),
            "job j requires label gpu=h100 but no UP or DRAINING node has it (values of 'gpu' in the "
            "cluster: a100)");
  JobRequest pool = shapeJob("j", 1, 1);
  pool.requiredLabels["pool"] = "x";
  EXPECT_CONTAINS(checkFeasible(c, pool), "no node has a 'pool' label at all");

  EXPECT_CONTAINS(checkFeasible(c, shapeJob("j", 2, 0)), "ask for either nodes x gpus_per_node");
  JobRequest both = shapeJob("j", 1, 1);
  both.totalGpus = 1;
  EXPECT_CONTAINS(checkFeasible(c, both), "not both");

  JobRequest topo = shapeJob("j", 2, 4);
  topo.topology = "3x3";
  EXPECT_EQ(checkFeasible(c, topo),
            "job j topology 3x3 has 9 ranks but the job has 8 GPUs; the dims must multiply to the GPU count");
  topo.topology = "4x2";
  EXPECT_EQ(checkFeasible(c, topo), "");

  PlacementResult r = place(c, shapeJob("j", 3, 4));
  EXPECT_TRUE(r.isInfeasible());
  EXPECT_CONTAINS(r.reason(), "only 2 UP or DRAINING nodes");
}

TEST(Feasibility, DownNodesDoNotCountButDrainingNodesDo) {
  Cluster c{{makeNode("n1", 4), makeNode("n2", 4), makeNode("n3", 4, "s1", {}, NodeState::kDown)}};
  EXPECT_EQ(
      checkFeasible(c, shapeJob("j", 3, 4)),
      "job j asks for 3 nodes x 4 GPUs but the cluster has only 2 UP or DRAINING nodes with at least 4 GPUs "
      "(1 more such node is DOWN)");
  EXPECT_EQ(allocOf(c, shapeJob("j", 3, 4)),
            "<node n3 DOWN: needs 3 nodes x 4 GPUs and only 2 UP nodes qualify>");
  c.nodes[2].state = NodeState::kDraining;
  EXPECT_EQ(checkFeasible(c, shapeJob("j", 3, 4)), "");
  PlacementResult r = place(c, shapeJob("j", 3, 4));
  ASSERT_TRUE(r.isPending());
  EXPECT_EQ(r.reason(), "node n3 draining: needs 3 nodes x 4 GPUs and only 2 UP nodes qualify");

  // A label only a DOWN node carries.
  c.nodes[2].state = NodeState::kDown;
  c.nodes[2].labels["gpu"] = "h100";
  JobRequest h100 = shapeJob("j", 1, 1);
  h100.requiredLabels["gpu"] = "h100";
  EXPECT_EQ(checkFeasible(c, h100),
            "job j requires label gpu=h100 but no UP or DRAINING node has it (only DOWN "
            "nodes do: n3)");
  EXPECT_EQ(allocOf(c, h100),
            "<node n3 DOWN: needs 1 node x 1 GPU with gpu=h100 and only 0 UP nodes qualify>");
}

// ---- odd shapes -------------------------------------------------------------------------------------------

TEST(Placement, NodesWithDifferentGpuCounts) {
  Cluster c{{makeNode("n1", 2), makeNode("n2", 4), makeNode("n3", 8), makeNode("cpu", 0)}};
  EXPECT_EQ(allocOf(c, shapeJob("j", 2, 4)), "n2[0,1,2,3] n3[0,1,2,3]");
  EXPECT_EQ(allocOf(c, shapeJob("j", 1, 8)), "n3[0,1,2,3,4,5,6,7]");
  EXPECT_EQ(allocOf(c, shapeJob("j", 3, 2)), "n1[0,1] n2[0,1] n3[0,1]");
  EXPECT_EQ(allocOf(c, totalJob("j", 10)), "n1[0,1] n3[0,1,2,3,4,5,6,7]");
  EXPECT_EQ(allocOf(c, totalJob("j", 14)), "n1[0,1] n2[0,1,2,3] n3[0,1,2,3,4,5,6,7]");
  EXPECT_CONTAINS(checkFeasible(c, shapeJob("j", 3, 4)), "only 2 UP or DRAINING nodes with at least 4 GPUs");
}

TEST(Placement, DrainedNodesTakeNoNewWork) {
  Cluster c{{makeNode("n1", 2), makeNode("n2", 4), makeNode("n3", 8, "s1", {}, NodeState::kDraining)}};
  EXPECT_EQ(allocOf(c, shapeJob("j", 1, 4)), "n2[0,1,2,3]");
  EXPECT_EQ(allocOf(c, shapeJob("j", 1, 8)),
            "<node n3 draining: needs 1 node x 8 GPUs and only 0 UP nodes qualify>");
  EXPECT_EQ(allocOf(c, shapeJob("j", 2, 4)),
            "<node n3 draining: needs 2 nodes x 4 GPUs and only 1 UP node qualifies>");
  c.nodes.push_back(makeNode("n4", 8, "s1", {}, NodeState::kDown));
  EXPECT_EQ(allocOf(c, shapeJob("j", 2, 4)),
            "<node n3 draining and n4 DOWN: needs 2 nodes x 4 GPUs and only 1 UP node qualifies>");
  // Refused at submit (DOWN nodes do not count), but once queued it waits for them.
  EXPECT_CONTAINS(checkFeasible(c, shapeJob("j", 3, 4)), "only 2 UP or DRAINING nodes");
  EXPECT_EQ(allocOf(c, shapeJob("j", 3, 4)),
            "<node n3 draining and n4 DOWN: needs 3 nodes x 4 GPUs and only 1 UP node qualifies>");
  EXPECT_TRUE(place(c, shapeJob("j", 4, 4)).isInfeasible());
}

// ---- queue and backfill -----------------------------------------------------------------------------------

TEST(Schedule, PriorityThenSubmitOrder) {
  Cluster c{{makeNode("n1", 4)}};
  ScheduleResult s =
      schedule(c, {shapeJob("a", 1, 4, 0, 1), shapeJob("b", 1, 4, 5, 3), shapeJob("c", 1, 4, 5, 2)});
  ASSERT_EQ(s.decisions.size(), 3u);
  EXPECT_EQ(s.decisions[0].jobId, "c");
  EXPECT_EQ(s.decisions[1].jobId, "b");
  EXPECT_EQ(s.decisions[2].jobId, "a");
  EXPECT_EQ(s.started(), (std::vector<std::string>{"c"}));
  EXPECT_EQ(s.headJob, "b");
  EXPECT_EQ(s.find("b")->reason,
            "waiting for 1 node with 4 free GPUs: 0 of the 1 eligible UP node have them now, the others are "
            "running "
            "jobs");
}

TEST(Schedule, BackfillMayNotTakeWhatTheHeadNeeds) {
  // n1 is busy, n2 half busy; the head wants 3 whole nodes. The small job would fit on n2's free half, but n2
  // may be one of the head's three nodes as soon as n2's job ends, so it must wait.
  Cluster c{{makeNode("n1", 4, "s1", {0, 1, 2, 3}), makeNode("n2", 4, "s1", {0, 1}), makeNode("n3", 4),
             makeNode("n4", 4)}};
  ScheduleResult s = schedule(c, {shapeJob("head", 3, 4, 10, 1), shapeJob("small", 1, 2, 0, 2)});
  EXPECT_EQ(s.headJob, "head");
  EXPECT_TRUE(s.started().empty());
  EXPECT_EQ(s.find("small")->action, Decision::Action::kPending);
  EXPECT_EQ(s.find("small")->reason,
            "waiting behind job head (priority 10): it would fit now, but only on GPUs that job head needs "
            "to start");
  // squeue's words: the head waits for Resources, the job behind it for Priority.
  EXPECT_EQ(s.find("head")->code, "Resources");
  EXPECT_EQ(s.find("small")->code, "Priority");
  // Without the head in the queue it starts at once.
  EXPECT_EQ(schedule(c, {shapeJob("small", 1, 2)}).started(), (std::vector<std::string>{"small"}));
}

TEST(Schedule, BackfillUsesTheSurplusTheHeadCannotUse) {
  // The head wants 4 nodes x 4 GPUs; only n3, n4, n5 have 4 free. n5 has 8 GPUs: the head can use 4 of them,
  // the other 4 are surplus. n6 lacks the head's label.
  Cluster c{{makeNode("n1", 4, "s1", {0, 1, 2, 3}), makeNode("n2", 4, "s1", {0, 1}), makeNode("n3", 4),
             makeNode("n4", 4), makeNode("n5", 8), makeNode("n6", 4)}};
  for (int i = 0; i < 5; ++i) c.nodes[i].labels["pool"] = "train";
  c.nodes[5].labels["pool"] = "dev";
  JobRequest head = shapeJob("head", 4, 4, 10, 1);
  head.requiredLabels["pool"] = "train";
  ScheduleResult s = schedule(c, {head, shapeJob("b1", 1, 4, 0, 2), shapeJob("b2", 1, 4, 0, 3),
                                  shapeJob("b3", 1, 2, 0, 4), totalJob("b4", 1, 0, 5)});
  EXPECT_EQ(s.headJob, "head");
  EXPECT_EQ(s.started(), (std::vector<std::string>{"b1", "b2"}));
  EXPECT_EQ(s.find("b1")->allocation.str(), "n5[4,5,6,7]");  // the surplus half of n5
  EXPECT_TRUE(s.find("b1")->backfilled);
  EXPECT_EQ(s.find("b2")->allocation.str(), "n6[0,1,2,3]");  // a node the head can never use
  EXPECT_CONTAINS(s.find("b3")->reason, "waiting behind job head");
  EXPECT_CONTAINS(s.find("b4")->reason, "waiting behind job head");
}

TEST(Schedule, TotalGpuHeadReservesEveryFreeGpuItCanUse) {
  Cluster c{{makeNode("n1", 4, "s1", {0, 1, 2}), makeNode("n2", 4, "s1", {0, 1})}};
  ScheduleResult s = schedule(c, {totalJob("head", 6, 1, 1), totalJob("one", 1, 0, 2)});
  EXPECT_EQ(s.headJob, "head");
  EXPECT_TRUE(s.started().empty());
}

TEST(Schedule, InfeasibleJobsAreRefusedAndJobsWaitingForNodesDoNotBlock) {
  Cluster c{{makeNode("n1", 4), makeNode("n2", 8, "s1", {}, NodeState::kDraining)}};
  ScheduleResult s =
      schedule(c, {shapeJob("huge", 4, 4, 9, 1), shapeJob("big", 1, 8, 5, 2), shapeJob("small", 1, 4, 0, 3)});
  EXPECT_EQ(s.find("huge")->action, Decision::Action::kRefused);
  EXPECT_CONTAINS(s.find("huge")->reason, "job huge asks for 4 nodes x 4 GPUs");
  EXPECT_EQ(s.find("big")->action, Decision::Action::kPending);
  EXPECT_EQ(s.find("big")->reason, "node n2 draining: needs 1 node x 8 GPUs and only 0 UP nodes qualify");
  EXPECT_EQ(s.headJob, "");  // "big" waits for the drain to end, not for jobs: it holds nothing back
  EXPECT_EQ(s.find("big")->code, "ReqNodeNotAvail");
  EXPECT_EQ(s.started(), (std::vector<std::string>{"small"}));
  EXPECT_FALSE(s.find("small")->backfilled);
}

// One job running before a scheduling pass: what it holds, freed when it ends.
struct Running {
  int node;
  std::vector<int> gpus;
  std::vector<size_t> cpus = {};  // indices into the node's cpus
  int64_t memory = 0;
};

// The backfill property on one cluster and queue: for every way the running jobs could end, if the head could
// start without the backfilled jobs it can also start with them. Counts heads and backfills seen.
void expectBackfillNeverDelaysTheHead(const Cluster& c, const std::vector<JobRequest>& queue,
                                      const std::vector<Running>& running, int round, int* heads,
                                      int* backfills) {
  ScheduleResult s = schedule(c, queue);
  if (s.headJob.empty()) return;
  ++*heads;
  const JobRequest* head = nullptr;
  for (const JobRequest& j : queue)
    if (j.id == s.headJob) head = &j;
  Cluster before = c, withBackfill;  // "before": plus the jobs started ahead of the head
  for (const Decision& d : s.decisions)
    if (d.action == Decision::Action::kStart && !d.backfilled) applyAllocation(before, d.allocation);
  withBackfill = before;
  for (const Decision& d : s.decisions) {
    if (d.action == Decision::Action::kStart && d.backfilled) {
      applyAllocation(withBackfill, d.allocation);
      ++*backfills;
    }
  }
  for (uint32_t ended = 0; ended < (1u << running.size()); ++ended) {
    Cluster a = before, b = withBackfill;
    for (size_t k = 0; k < running.size(); ++k) {
      if (!(ended & (1u << k))) continue;
      for (Cluster* x : {&a, &b}) {
        Node& n = x->nodes[running[k].node];
        for (int g : running[k].gpus) n.used[g] = false;
        for (size_t i : running[k].cpus) n.cpuUsed[i] = false;
        n.memoryUsed -= running[k].memory;
      }
    }
    if (place(a, *head).ok()) {
      ASSERT_TRUE(place(b, *head).ok()) << "round " << round << ": backfill delayed head " << head->id;
    }
  }
}

// The property itself, on random small clusters.
TEST(Schedule, RandomisedBackfillNeverDelaysTheHead) {
  std::mt19937 rng(12345);
  int heads = 0, backfills = 0;
  for (int round = 0; round < 400; ++round) {
    Cluster c;
    std::vector<Running> running;
    const int nodes = 2 + rng() % 5;
    for (int i = 0; i < nodes; ++i) {
      const int gpus = 1 + rng() % 8;
      c.nodes.push_back(makeNode("n" + std::to_string(i), gpus, "s" + std::to_string(rng() % 2)));
      if (rng() % 4 == 0) c.nodes.back().labels["pool"] = "b";
      for (int g = 0; g < gpus;) {  // split some GPUs into running jobs of 1-3 GPUs
        const int size = std::min<int>(1 + rng() % 3, gpus - g);
        if (rng() % 2 && running.size() < 8) {
          Running r{i, {}};
          for (int k = 0; k < size; ++k) r.gpus.push_back(g + k);
          running.push_back(r);
          for (int k : r.gpus) c.nodes[i].used[k] = true;
        }
        g += size;
      }
    }
    std::vector<JobRequest> queue;
    for (int j = 0; j < 6; ++j) {
      JobRequest job = rng() % 3
                           ? shapeJob("j" + std::to_string(j), 1 + rng() % 3, 1 + rng() % 4, rng() % 3, j)
                           : totalJob("j" + std::to_string(j), 1 + rng() % 10, rng() % 3, j);
      if (rng() % 5 == 0) job.requiredLabels["pool"] = "b";
      queue.push_back(job);
    }
    expectBackfillNeverDelaysTheHead(c, queue, running, round, &heads, &backfills);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(heads, 50);      // the test exercised the rule...
  EXPECT_GT(backfills, 20);  // ...including real backfills
}

// ---- CPUs and memory per rank
// ------------------------------------------------------------------------------

constexpr int64_t kGiB = int64_t{1} << 30;

Node withCpus(Node n, int cpus, int64_t memory) {
  for (int c = 0; c < cpus; ++c) n.cpus.push_back(c);
  n.memoryBytes = memory;
  return n;
}

JobRequest withRequest(JobRequest j, int cpus, int64_t memory) {
  j.cpusPerRank = cpus;
  j.memoryPerRank = memory;
  return j;
}

TEST(Resources, PlacementGivesEachRankItsCpusAndCountsMemory) {
  Cluster c{{withCpus(makeNode("n1", 4), 16, 64 * kGiB)}};
  PlacementResult r = place(c, withRequest(shapeJob("a", 1, 2), 4, 8 * kGiB));
  ASSERT_TRUE(r.ok()) << r.reason();
  const NodeAllocation& a = r.allocation().nodes[0];
  EXPECT_EQ(a.gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(a.cpus, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(a.memoryBytes, 16 * kGiB);
  EXPECT_EQ(a.cpusOf(1), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_TRUE(a.cpusOf(3).empty());  // not the job's GPU
  EXPECT_EQ(r.allocation().str(), "n1[0,1] cpus 0-7");
  applyAllocation(c, r.allocation());
  EXPECT_EQ(c.nodes[0].freeCpus(), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(c.nodes[0].memoryUsed, 16 * kGiB);
  // Two GPUs are still free, but 8 CPUs are not enough for 2 ranks of 5: it waits, and says for what.
  PlacementResult w = place(c, withRequest(shapeJob("b", 1, 2), 5, 0));
  ASSERT_TRUE(w.isPending());
  EXPECT_EQ(w.reason(),
            "waiting for 1 node with 2 free GPUs (and 5 CPUs per GPU): 0 of the 1 eligible UP node have them "
            "now, the others are running jobs");
  // Memory binds the same way: 48 GiB left holds one rank of 30 GiB, not two.
  EXPECT_TRUE(place(c, withRequest(shapeJob("m", 1, 1), 0, 30 * kGiB)).ok());
  EXPECT_TRUE(place(c, withRequest(shapeJob("m2", 1, 2), 0, 30 * kGiB)).isPending());
  EXPECT_TRUE(place(c, withRequest(shapeJob("m3", 1, 2), 0, 40 * kGiB)).isInfeasible());  // 80 of 64 GiB
  // A job that asks for neither ignores CPUs and memory, as before.
  EXPECT_EQ(allocOf(c, shapeJob("plain", 1, 2)), "n1[2,3]");
}

TEST(Resources, PlacementPrefersTheNodeWhoseCpusFit) {
  // n1 has the most free GPUs but too few CPUs for the job; n2 has fewer GPUs and enough CPUs.
  Cluster c{{withCpus(makeNode("n1", 8), 4, 64 * kGiB), withCpus(makeNode("n2", 2), 32, 64 * kGiB)}};
  EXPECT_EQ(allocOf(c, withRequest(shapeJob("a", 1, 2), 8, 0)), "n2[0,1] cpus 0-15");
  // A total job counts each node's ranks by what binds there: n1 holds 1 rank of 4 CPUs, n2 two.
  EXPECT_EQ(allocOf(c, withRequest(totalJob("t", 3), 4, 0)), "n1[0] cpus 0-3 n2[0,1] cpus 0-7");
}

TEST(Resources, RefusesWhatNoNodeCanHoldAndNamesTheShortfall) {
  Cluster c{{withCpus(makeNode("n1", 4), 8, 32 * kGiB), withCpus(makeNode("n2", 4), 8, 16 * kGiB)}};
  EXPECT_EQ(checkFeasible(c, withRequest(shapeJob("a", 1, 4), 4, 0)),
            "job a asks for 4 GPUs with 4 CPUs each per node but the largest UP or DRAINING node (n1) has "
            "4 GPUs, 8 CPUs and 32 GiB for ranks");
  EXPECT_EQ(checkFeasible(c, withRequest(totalJob("t", 6), 0, 16 * kGiB)),
            "job t asks for 6 GPUs with 16 GiB each but the UP and DRAINING nodes can hold only 3 such ranks "
            "in all (the largest UP or DRAINING node (n1) has 4 GPUs, 8 CPUs and 32 GiB for ranks)");
  EXPECT_EQ(checkFeasible(c, withRequest(totalJob("t", 3), 0, 16 * kGiB)), "");
  // A node whose agent offers no CPUs (an older agent) hosts only jobs that ask for none.
  Cluster old{{makeNode("n1", 4)}};
  EXPECT_FALSE(checkFeasible(old, withRequest(shapeJob("a", 1, 1), 1, 0)).empty());
  EXPECT_EQ(checkFeasible(old, shapeJob("a", 1, 1)), "");
}

TEST(Resources, BackfillMayNotTakeTheCpusTheHeadNeeds) {
  // n1: 4 GPUs, 2 in use; 8 CPUs, 6 held. The head wants 2 GPUs x 4 CPUs there, which n1 lacks only in CPUs
  // today. A small job for 1 GPU and 2 CPUs would fit, but those CPUs may be the ones the head is missing.
  Node n1 = withCpus(makeNode("n1", 4, "s1", {0, 1}), 8, 64 * kGiB);
  n1.cpuUsed = {true, true, true, true, true, true, false, false};
  Cluster c{{n1}};
  ScheduleResult s = schedule(c, {withRequest(shapeJob("head", 1, 2, 10, 1), 4, 0),
                                  withRequest(shapeJob("small", 1, 1, 0, 2), 2, 0)});
  EXPECT_EQ(s.headJob, "head");
  EXPECT_TRUE(s.started().empty());
  EXPECT_CONTAINS(s.find("small")->reason, "waiting behind job head");
  // A job that asks for no CPUs takes a GPU beside the head's share: GPUs 2 and 3 are all the head could
  // use, though, so not even that.
  EXPECT_TRUE(schedule(c, {withRequest(shapeJob("head", 1, 2, 10, 1), 4, 0), shapeJob("gpu", 1, 1, 0, 2)})
                  .started()
                  .empty());
}

// The backfill property of Schedule.RandomisedBackfillNeverDelaysTheHead, with CPUs and memory as well.
TEST(Resources, RandomisedBackfillNeverDelaysTheHead) {
  std::mt19937 rng(777);
  int heads = 0, backfills = 0;
  for (int round = 0; round < 400; ++round) {
    Cluster c;
    std::vector<Running> running;
    const int nodes = 2 + rng() % 4;
    for (int i = 0; i < nodes; ++i) {
      const int gpus = 1 + rng() % 6;
      Node n = withCpus(makeNode("n" + std::to_string(i), gpus, "s" + std::to_string(rng() % 2)),
                        2 + rng() % 12, (4 + rng() % 12) * kGiB);
      n.cpuUsed.assign(n.cpus.size(), false);
      c.nodes.push_back(n);
      size_t nextCpu = 0;
      for (int g = 0; g < gpus; ++g) {
        if (rng() % 2 || running.size() >= 8) continue;
        Running r{i, {g}, {}, static_cast<int64_t>(rng() % 3) * kGiB};
        const size_t cpus = rng() % 3;
        for (size_t k = 0; k < cpus && nextCpu < n.cpus.size(); ++k) r.cpus.push_back(nextCpu++);
        if (c.nodes[i].memoryUsed + r.memory > c.nodes[i].memoryBytes) r.memory = 0;
        c.nodes[i].used[g] = true;
        for (size_t k : r.cpus) c.nodes[i].cpuUsed[k] = true;
        c.nodes[i].memoryUsed += r.memory;
        running.push_back(r);
      }
    }
    std::vector<JobRequest> queue;
    for (int j = 0; j < 6; ++j) {
      JobRequest job = rng() % 3
                           ? shapeJob("j" + std::to_string(j), 1 + rng() % 3, 1 + rng() % 3, rng() % 3, j)
                           : totalJob("j" + std::to_string(j), 1 + rng() % 8, rng() % 3, j);
      job.cpusPerRank = rng() % 3;
      job.memoryPerRank = static_cast<int64_t>(rng() % 3) * kGiB;
      queue.push_back(job);
    }
    expectBackfillNeverDelaysTheHead(c, queue, running, round, &heads, &backfills);
    if (HasFatalFailure()) return;
  }
  EXPECT_GT(heads, 50);
  EXPECT_GT(backfills, 10);
}

// ---- ring layout ------------------------------------------------------------------------------------------

RingLayout layoutOf(const Allocation& a, const Cluster& c, const std::string& topo = "") {
  RingLayout l;
  std::string err = buildRingLayout(a, c, topo, &l);
  EXPECT_EQ(err, "");
  EXPECT_EQ(validateRingLayout(l), "");
  return l;
}

Allocation allocation(std::vector<std::pair<std::string, int>> nodes) {
  Allocation a;
  for (auto& [name, gpus] : nodes) {
    NodeAllocation n{name, {}};
    for (int g = 0; g < gpus; ++g) n.gpus.push_back(g);
    a.nodes.push_back(n);
  }
  return a;
}

TEST(RingLayout, FourNodesOfTwoGpusOnOneSwitchIs2x4) {
  Cluster c{{makeNode("n1", 2), makeNode("n2", 2), makeNode("n3", 2), makeNode("n4", 2)}};
  RingLayout l = layoutOf(allocation({{"n3", 2}, {"n1", 2}, {"n4", 2}, {"n2", 2}}), c);
  EXPECT_EQ(l.topology(), "2x4");
  ASSERT_EQ(l.size(), 8);
  EXPECT_EQ(l.ranks[0].node, "n1");
  EXPECT_EQ(l.ranks[3].node, "n2");
  EXPECT_EQ(l.ranks[3].gpu, 1);
  EXPECT_EQ(l.ranks[3].localRank, 1);
  EXPECT_EQ(l.ranks[7].node, "n4");
  RankEnvSpec spec = rankEnvSpec(l, 5);
  EXPECT_EQ(spec.rank, 5);
  EXPECT_EQ(spec.world_size, 8);
  EXPECT_EQ(spec.local_rank, 1);
  EXPECT_EQ(spec.local_size, 2);
  EXPECT_EQ(spec.topology, "2x4");
}

TEST(RingLayout, TwoSwitchesIs2x2x2InSwitchOrder) {
  Cluster c{
      {makeNode("a", 2, "s10"), makeNode("b", 2, "s10"), makeNode("c", 2, "s2"), makeNode("d", 2, "s2")}};
  RingLayout l = layoutOf(allocation({{"a", 2}, {"b", 2}, {"c", 2}, {"d", 2}}), c);
  EXPECT_EQ(l.topology(), "2x2x2");
  // s2 comes before s10 (natural order), so c and d hold ranks 0-3.
  EXPECT_EQ(l.ranks[0].node, "c");
  EXPECT_EQ(l.ranks[2].node, "d");
  EXPECT_EQ(l.ranks[4].node, "a");
  EXPECT_EQ(l.ranks[4].switchName, "s10");
  const std::string text = renderRingLayout(l);
  EXPECT_CONTAINS(
      text, "topology 2x2x2 (DDL_TOPOLOGY), 8 ranks: 2 GPUs per node x 2 nodes per switch x 2 switches");
  EXPECT_CONTAINS(text, "switch s2\n  node c:  gpu0=r0  gpu1=r1\n  node d:  gpu0=r2  gpu1=r3\nswitch s10\n");
  EXPECT_CONTAINS(text, "dim 0 (size 2): 4 rings, each within one node: [0 1] [2 3] [4 5] [6 7]\n");
  EXPECT_CONTAINS(text, "dim 1 (size 2): 4 rings, each within one switch: [0 2] [1 3] [4 6] [5 7]\n");
  EXPECT_CONTAINS(text, "dim 2 (size 2): 4 rings, crossing switches: [0 4] [1 5] [2 6] [3 7]\n");
}

TEST(RingLayout, UnevenShapesFallBackToValidDims) {
  Cluster c{
      {makeNode("n1", 4, "s1"), makeNode("n2", 4, "s1"), makeNode("n3", 4, "s2"), makeNode("n4", 8, "s2")}};
  // Switches with 2 and 1 nodes: GPUs per node x all nodes.
  RingLayout l = layoutOf(allocation({{"n1", 2}, {"n2", 2}, {"n3", 2}}), c);
  EXPECT_EQ(l.topology(), "2x3");
  EXPECT_CONTAINS(l.why, "switches hold different numbers of nodes (s1: 2, s2: 1)");
  // Different GPU counts per node: flat.
  l = layoutOf(allocation({{"n1", 2}, {"n4", 4}}), c);
  EXPECT_EQ(l.topology(), "6");
  EXPECT_CONTAINS(l.why, "flat");
  // Dims of 1 are dropped.
  EXPECT_EQ(layoutOf(allocation({{"n4", 8}}), c).topology(), "8");
  EXPECT_EQ(layoutOf(allocation({{"n1", 1}, {"n2", 1}, {"n3", 1}, {"n4", 1}}), c).topology(), "2x2");
  Cluster unlabeled{{makeNode("x", 2, ""), makeNode("y", 2, ""), makeNode("z", 2, "")}};
  EXPECT_EQ(layoutOf(allocation({{"x", 2}, {"y", 2}, {"z", 2}}), unlabeled).topology(), "2x3");
}

TEST(RingLayout, OverrideIsValidatedAndExplained) {
  Cluster c{{makeNode("n1", 2), makeNode("n2", 2), makeNode("n3", 2), makeNode("n4", 2)}};
  const Allocation a = allocation({{"n1", 2}, {"n2", 2}, {"n3", 2}, {"n4", 2}});
  RingLayout l = layoutOf(a, c, "4x2");
  EXPECT_EQ(l.dims, (std::vector<int>{4, 2}));
  EXPECT_TRUE(l.overridden);
  EXPECT_EQ(l.ranks[2].node, "n2");  // the rank order does not change
  EXPECT_CONTAINS(renderRingLayout(l),
                  "dim 0 (size 4): 2 rings, each within one switch: [0 1 2 3] [4 5 6 7]");
  EXPECT_EQ(layoutOf(a, c, "8").topology(), "8");
  EXPECT_EQ(layoutOf(a, c, "2X2x2").topology(), "2x2x2");

  RingLayout bad;
  EXPECT_EQ(buildRingLayout(a, c, "3x3", &bad),
            "topology 3x3 has 9 ranks but the job has 8 GPUs; the dims must multiply to the GPU count");
  EXPECT_EQ(bad.size(), 0);
  for (const char* text : {"4x", "x4", "0x8", "-8", "four", "4 x 2", "2.0x4"}) {
    EXPECT_CONTAINS(buildRingLayout(a, c, text, &bad), "is malformed");
  }
  EXPECT_CONTAINS(
      buildRingLayout(a, c, "4x", &bad),
      "topology '4x' is malformed: '' is not a positive integer (expected positive integers joined by 'x'");
}

TEST(RingLayout, ValidationCatchesBrokenLayouts) {
  Cluster c{{makeNode("n1", 2), makeNode("n2", 2)}};
  RingLayout good = layoutOf(allocation({{"n1", 2}, {"n2", 2}}), c);
  RingLayout l = good;
  l.dims = {3};
  EXPECT_EQ(validateRingLayout(l), "topology 3 does not multiply to the 4 ranks");
  l = good;
  l.ranks[1].gpu = 0;
  EXPECT_EQ(validateRingLayout(l), "GPU 0 of node n1 is given to more than one rank");
  l = good;
  l.ranks[3].localRank = 0;
  EXPECT_CONTAINS(validateRingLayout(l), "rank 3 on node n2 has local rank 0 of 2");
  l = good;
  l.ranks[2].rank = 7;
  EXPECT_EQ(validateRingLayout(l), "rank slot 2 is numbered 7");
  l = good;
  l.dims = {2, 0, 2};
  EXPECT_CONTAINS(validateRingLayout(l), "is not positive");
}

TEST(RingLayout, FromAPlacementAcrossSwitches) {
  Cluster c = threeSwitches();
  JobRequest j = shapeJob("j", 6, 2);  // no switch holds 6 nodes; rack r1 does: s1 (4) and s2 (2)
  PlacementResult r = place(c, j);
  ASSERT_TRUE(r.ok());
  RingLayout l = layoutOf(r.allocation(), c);
  EXPECT_EQ(l.topology(), "2x6");  // 4 + 2 nodes per switch: uneven, so dim 1 spans both switches
  EXPECT_EQ(l.ranks[8].node, "n5");
}

// The coordinator's side of the one topology grammar (tests/unit/topology_cases.h).
TEST(RingLayout, TheSharedTopologyCases) {
  for (const TopologyCase& c : kTopologyCases) {
    std::vector<int> dims;
    const std::string why = parseTopologyOverride(c.text, c.ranks, &dims);
    EXPECT_EQ(why.empty(), c.ok) << "'" << c.text << "' for " << c.ranks << " GPUs: " << why;
  }
}

}  // namespace
}  // namespace ddl::placement
