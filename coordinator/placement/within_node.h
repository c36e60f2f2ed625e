// Which of a node's free GPUs and CPUs a job's ranks there get, by the node's NVLink islands and NUMA nodes.
//
// The GPUs: as placement across nodes takes the lowest subtree that holds the job, here the smallest group
// that holds the ranks: an NVLink island where one has room (the best fit: the island with the fewest free
// GPUs that hold them, then the one whose NUMA node has the fewest free, then the lowest index), else a NUMA
// node, then within the group chosen the same again; so a job that fits in one island or one NUMA node always
// gets one, and the whole islands and NUMA nodes are kept for later jobs. A job that fits in no group takes
// the groups of the coarser division (NUMA nodes, or islands) with the most free GPUs first and the best fit
// for the rest. A node whose agent reports no topology gives the lowest free indices, as before.
//
// The CPUs (a job that asks for them per rank): each rank's from its GPU's NUMA node, the lowest free ids
// there; a rank whose node has too few free gets the lowest free ids elsewhere (the node still runs it: a
// rank's CPUs are a preference of place, its count a promise).
//
// Threads: pure functions over values; any thread may call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "placement/cluster.h"

namespace ddl::placement {

struct WithinNode {
  std::vector<int> gpus;  // ascending
  std::vector<int> cpus;  // cpusPerRank per GPU, in the order of gpus; empty when none are asked for
};

// `count` of the node's free GPUs and, with cpusPerRank > 0, that many of its free CPUs for each. The node
// must have them free (placement checked ranksFitting).
WithinNode pickWithinNode(const Node& node, int count, int cpusPerRank);

// How well `need` ranks fit the node's groups: the free GPUs left in the best-fitting NVLink island (and NUMA
// node) that holds them all; kNoFit where none does. A node with no topology is one group: both are `spare`,
// the GPUs the node keeps free (so a cluster without topology is placed by spare GPUs alone, as before, and a
// mixed one favours neither kind). Placement's single-node best fit ranks nodes by it before their spare
// GPUs: a 1-GPU job takes the free half of a broken pair on one node before it breaks a whole pair on
// another.
struct GroupFit {
  static constexpr int kNoFit = 1 << 20;
  int island = 0;
  int numa = 0;
};
GroupFit groupFit(const Node& node, int need, int spare);

// The NVLink islands and NUMA nodes (of more than one GPU) that are partly held: broken groups, where a job
// that wants a whole one cannot have it. For the fragmentation figures of placement-bench and the tests.
struct BrokenGroups {
  int islands = 0;
  int numaNodes = 0;
};
BrokenGroups brokenGroups(const Node& node);

// A random workload on `cluster` (its nodes as given, all free or not): `events` arrivals (1 GPU half the
// time, 2 three times in ten, half a node or all but one GPU of one otherwise; placed by place()) and
// departures (48%), with `seed`. With lowestId the nodes hide their topology from placement, as before it
// was used; the broken groups are counted by it either way, summed after every event. With cpusPerRank every
// job asks for that many CPUs per rank. Violations: a node's share of a job that fitted in one island of that
// node and was not given one, or in one NUMA node (where islands and NUMA nodes nest) and was not given one,
// or that was given a CPU that is not a free one of the node, or not cpusPerRank per GPU. Split
// jobs: node shares that span more NVLink islands (NUMA nodes, on a node of one island) than the fewest that
// could hold as many GPUs there: a 2-GPU job across the socket bus of an S822LC.
// For placement-bench's fragmentation figures and the property test.
struct WorkloadRun {
  int placed = 0;
  int unplaced = 0;
  int violations = 0;
  std::string firstViolation;
  int splitJobs = 0;
  long brokenIslands = 0;
  long brokenNuma = 0;
};
WorkloadRun runWorkload(Cluster cluster, uint32_t seed, int events, bool lowestId, int cpusPerRank = 0);

}  // namespace ddl::placement
