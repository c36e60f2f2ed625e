// Placement inside a node by its NVLink islands and NUMA nodes (placement/within_node.h): hand-worked cases
// on Power S822LC nodes (2 sockets x an NVLink pair of P100s) and DGX H100 nodes (8 GPUs on NVSwitch, 2 NUMA
// nodes), a property test over random workloads on both, fragmentation against lowest-id placement on the
// same sequence, each rank's CPUs on its GPU's NUMA node, and the ring order along NVLink.
#include "placement/within_node.h"

#include <gtest/gtest.h>

#include "placement/placement.h"
#include "placement/ring_layout.h"

namespace ddl::placement {
namespace {

// 16 CPUs per NUMA node, numbered as a two-socket host numbers them (socket 0's first).
Node topologyNode(const std::string& name, const std::string& kind) {
  Node n;
  n.name = name;
  auto t = std::make_shared<NodeTopology>();
  if (kind == "s822lc") {
    n.gpus = 4;
    t->gpuIsland = {0, 0, 2, 2};
    t->gpuNuma = {0, 0, 1, 1};
  } else if (kind == "cross") {  // NVLink pairs that cut across the sockets: the island comes first
    n.gpus = 4;
    t->gpuIsland = {0, 0, 2, 2};
    t->gpuNuma = {0, 1, 0, 1};
  } else if (kind == "quad") {  // 2 sockets x 2 NVLink pairs: a 4-GPU job must get a socket
    n.gpus = 8;
    t->gpuIsland = {0, 0, 2, 2, 4, 4, 6, 6};
    t->gpuNuma = {0, 0, 0, 0, 1, 1, 1, 1};
  } else {  // dgx-h100
    n.gpus = 8;
    t->gpuIsland = {0, 0, 0, 0, 0, 0, 0, 0};
    t->gpuNuma = {0, 0, 0, 0, 1, 1, 1, 1};
  }
  for (int c = 0; c < 32; ++c) {
    n.cpus.push_back(c);
    t->cpuNuma.push_back(c / 16);
  }
  n.used.assign(n.gpus, false);
  n.topology = std::move(t);
  return n;
}

Node withUsed(Node n, std::vector<int> used) {
  for (int g : used) n.used[g] = true;
  return n;
}

// The GPUs a job of `count` gets on a node, as text "0,1".
std::string gpusOn(const Node& n, int count) {
  std::string s;
  for (int g : pickWithinNode(n, count, 0).gpus) s += (s.empty() ? "" : ",") + std::to_string(g);
  return s;
}

TEST(WithinNode, AnNvlinkPairIsTakenWholeAndTheBestFitPairFirst) {
  const Node free = topologyNode("n1", "s822lc");
  EXPECT_EQ(gpusOn(free, 2), "0,1");
  EXPECT_EQ(gpusOn(free, 1), "0");
  // GPU 1 is held: a 2-GPU job takes the other pair, not 0 and 2 across the socket bus (lowest ids would).
  EXPECT_EQ(gpusOn(withUsed(free, {1}), 2), "2,3");
  // A 1-GPU job goes where a pair is broken already, keeping the whole pair for a 2-GPU job.
  EXPECT_EQ(gpusOn(withUsed(free, {0}), 1), "1");
  EXPECT_EQ(gpusOn(withUsed(free, {2}), 1), "3");
  // Three GPUs: one whole pair and one of the other.
  EXPECT_EQ(gpusOn(free, 3), "0,1,2");
  EXPECT_EQ(gpusOn(withUsed(free, {0}), 3), "1,2,3");
}

TEST(WithinNode, OnNvswitchTheRanksStayOnOneNumaNode) {
  const Node free = topologyNode("d1", "dgx-h100");
  EXPECT_EQ(gpusOn(free, 4), "0,1,2,3");
  // Three held on NUMA node 0: a 2-GPU job takes the last one there? No: one GPU is left there, so it goes to
  // node 1, and a 1-GPU job fills node 0's last.
  EXPECT_EQ(gpusOn(withUsed(free, {0, 1, 2}), 2), "4,5");
  EXPECT_EQ(gpusOn(withUsed(free, {0, 1, 2}), 1), "3");
  // Five: one whole NUMA node and the best fit of the other.
  EXPECT_EQ(gpusOn(withUsed(free, {4}), 5), "0,1,2,3,5");
}

TEST(WithinNode, WithoutATopologyTheLowestFreeIdsAsBefore) {
  Node n = topologyNode("n1", "s822lc");
  n.topology = nullptr;
  n.used = {false, true, false, false};
  EXPECT_EQ(gpusOn(n, 2), "0,2");
}

TEST(WithinNode, EachRanksCpusComeFromItsGpusNumaNode) {
  const Node n = withUsed(topologyNode("n1", "s822lc"), {0, 1});
  const WithinNode w = pickWithinNode(n, 2, 3);
  EXPECT_EQ(w.gpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(w.cpus, (std::vector<int>{16, 17, 18, 19, 20, 21}));  // socket 1's, not CPUs 0-5
  // A NUMA node with too few free CPUs: the rank gets what is there, and the rest from elsewhere.
  Node busy = topologyNode("n1", "s822lc");
  busy.cpuUsed.assign(32, 0);
  for (int c = 0; c < 15; ++c) busy.cpuUsed[c] = 1;
  const WithinNode short_ = pickWithinNode(busy, 1, 2);
  EXPECT_EQ(short_.gpus, (std::vector<int>{0}));
  EXPECT_EQ(short_.cpus, (std::vector<int>{15, 16}));
}

TEST(WithinNode, PlaceGivesTheIslandAndItsCpus) {
  Cluster c;
  c.nodes = {withUsed(topologyNode("n1", "s822lc"), {1})};
  JobRequest j;
  j.id = "j";
  j.totalGpus = 2;
  j.cpusPerRank = 2;
  PlacementResult r = place(c, j);
  ASSERT_TRUE(r.ok()) << r.reason();
  EXPECT_EQ(r.allocation().nodes[0].gpus, (std::vector<int>{2, 3}));
  EXPECT_EQ(r.allocation().nodes[0].cpus, (std::vector<int>{16, 17, 18, 19}));
}

// ---- random workloads
// ---------------------------------------------------------------------------------------

Cluster clusterOf(const std::string& kind, int nodes) {
  Cluster c;
  for (int i = 0; i < nodes; ++i) c.nodes.push_back(topologyNode("n" + std::to_string(i), kind));
  return c;
}

TEST(WithinNode, RandomWorkloadsAlwaysGetOneIslandOrNumaNodeWhereOneFits) {
  for (const char* kind : {"s822lc", "dgx-h100", "cross", "quad"}) {
    for (uint32_t seed = 1; seed <= 5; ++seed) {
      for (int cpus : {0, 2}) {  // and, asking for CPUs, never one that is held
        const WorkloadRun w = runWorkload(clusterOf(kind, 8), seed, 3000, /*lowestId=*/false, cpus);
        EXPECT_EQ(w.violations, 0) << kind << " seed " << seed << ": first " << w.firstViolation;
        EXPECT_GT(w.placed, 500) << kind << " seed " << seed;
      }
    }
  }
}

// The check above can fail: lowest ids break the rules it checks.
TEST(WithinNode, TheRandomWorkloadsCheckCatchesLowestIds) {
  for (const char* kind : {"s822lc", "quad"})
    EXPECT_GT(runWorkload(clusterOf(kind, 8), 1, 3000, /*lowestId=*/true).violations, 0) << kind;
}

TEST(WithinNode, JobsSplitAcrossIslandsAreFewerThanHalfOfLowestIds) {
  // Split: a node's share of a job that spans more NVLink islands (on dgx-h100, one island: NUMA nodes) than
  // the fewest that could hold it. Lowest ids split a 2-GPU job given GPUs 1 and 2; the topology never does
  // where a pair is free anywhere.
  for (const char* kind : {"s822lc", "dgx-h100"}) {
    int aware = 0, lowest = 0;
    for (uint32_t seed = 1; seed <= 5; ++seed) {
      aware += runWorkload(clusterOf(kind, 8), seed, 3000, false).splitJobs;
      lowest += runWorkload(clusterOf(kind, 8), seed, 3000, true).splitJobs;
    }
    EXPECT_GT(lowest, 0) << kind;
    EXPECT_LE(2 * aware, lowest) << kind << ": " << aware << " jobs split with the topology, " << lowest
                                 << " with the lowest ids";
  }
}

TEST(WithinNode, BrokenIslandsAreCountedAsTheyStand) {
  Node n = withUsed(topologyNode("n1", "s822lc"), {0, 2, 3});
  EXPECT_EQ(brokenGroups(n).islands, 1);  // pair 0+1 half held; pair 2+3 whole
  EXPECT_EQ(brokenGroups(n).numaNodes, 1);
  Node d = withUsed(topologyNode("d1", "dgx-h100"), {0, 1, 2, 3, 4});
  EXPECT_EQ(brokenGroups(d).islands, 1);
  EXPECT_EQ(brokenGroups(d).numaNodes, 1);
  EXPECT_EQ(groupFit(d, 3, 0).island, 0);  // the island's 3 free GPUs hold 3 exactly
  EXPECT_EQ(groupFit(d, 2, 1).numa, 1);    // NUMA node 1 keeps one free
  EXPECT_EQ(groupFit(d, 4, -1).numa, GroupFit::kNoFit);
}

// ---- ring order -------------------------------------------------------------------------------------------

TEST(WithinNode, TheRingStepsAlongNvlinkBeforeCrossingIslands) {
  Cluster c;
  Node n = topologyNode("n1", "s822lc");
  auto t = std::make_shared<NodeTopology>(*n.topology);
  t->gpuIsland = {0, 1, 0, 1};  // pairs 0+2 and 1+3, as a file topology may say
  n.topology = t;
  c.nodes = {n};
  Allocation a;
  a.nodes.push_back({"n1", {0, 1, 2, 3}, {}, 0});
  RingLayout layout;
  ASSERT_EQ(buildRingLayout(a, c, "", &layout), "");
  std::vector<int> order;
  for (const RankSlot& s : layout.ranks) order.push_back(s.gpu);
  EXPECT_EQ(order, (std::vector<int>{0, 2, 1, 3}));
  EXPECT_EQ(validateRingLayout(layout), "");
  const std::string text = renderRingLayout(layout);
  EXPECT_NE(text.find("node n1:  [gpu0=r0 gpu2=r1]  [gpu1=r2 gpu3=r3]"), std::string::npos) << text;
  EXPECT_NE(text.find("NVLink island"), std::string::npos) << text;
}

}  // namespace
}  // namespace ddl::placement
