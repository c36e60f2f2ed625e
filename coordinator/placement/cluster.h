// Snapshot types for placement and ring layout: the nodes as the coordinator last saw them, a job's request,
// and the GPUs an allocation gives it. Plain values with no I/O; the coordinator copies its registry into a
// Cluster and hands it to the pure functions in placement.h and ring_layout.h.
//
// Threads: these are plain values. Any thread may build or read one; concurrent reads of one value are safe,
// a write needs the caller's own lock as for any standard container.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ddl::placement {

// Well-known node labels. Nodes are grouped by them for topology-aware placement and ring order; a node that
// lacks one is treated as alone in its own switch (or rack), never as sharing one with other unlabeled nodes.
inline constexpr const char* kSwitchLabel = "switch";
inline constexpr const char* kRackLabel = "rack";

// Where a node's GPUs and CPUs sit inside it, as its agent reports them; each list empty where unknown.
struct NodeTopology {
  std::vector<int> gpuIsland;  // gpuIsland[i]: GPU i's NVLink island (the lowest index NVLink joins it to)
  std::vector<int> gpuNuma;    // gpuNuma[i]: GPU i's NUMA node, -1 unknown
  std::vector<int> cpuNuma;    // cpuNuma[i]: the NUMA node of Node::cpus[i]

  bool empty() const { return gpuIsland.empty() && gpuNuma.empty(); }
};

enum class NodeState {
  kUp,        // takes new work
  kDraining,  // keeps its running ranks, takes no new work; counts for "could this job ever fit"
  kDown,      // missed heartbeats; counts for nothing
};

const char* nodeStateName(NodeState state);  // "UP", "DRAINING", "DOWN"

struct Node {
  std::string name;
  int gpus = 0;                               // GPU indices are 0..gpus-1
  std::vector<bool> used;                     // used[i]: GPU i is held by a running job; empty = all free
  std::map<std::string, std::string> labels;  // "rack", "switch", and anything else ("gpu": "a100")
  NodeState state = NodeState::kUp;
  // CPUs and memory its agent offers ranks, and what live jobs hold of them. Only jobs that ask for CPUs or
  // memory per rank count them; a node that offers none can host only jobs that ask for none.
  std::vector<int> cpus;      // CPU ids, ascending
  std::vector<uint8_t> cpuUsed;  // cpuUsed[i] != 0: cpus[i] is held; empty = all free (bytes: counted fast)
  int64_t memoryBytes = 0;
  int64_t memoryUsed = 0;
  // Its NVLink islands and NUMA nodes (within_node.h places a job's ranks by them); null when unknown.
  // Shared: the scheduler copies clusters often, and a node's insides change only when its agent registers.
  std::shared_ptr<const NodeTopology> topology;

  bool isUsed(int gpu) const { return gpu < static_cast<int>(used.size()) && used[gpu]; }
  int freeGpus() const;
  std::vector<int> freeGpuIndices() const;  // ascending
  bool isCpuUsed(size_t i) const { return i < cpuUsed.size() && cpuUsed[i] != 0; }
  std::vector<int> freeCpus() const;  // ids, ascending
  int freeCpuCount() const;
  // The label's value, or "" when the node has no such label.
  const std::string& label(const std::string& key) const;
};

struct Cluster {
  std::vector<Node> nodes;  // names are unique
  // The nodes are in naturalLess order of their names (schedule() sorts its working copies so): find() is a
  // binary search, and placement need not sort what it gathers from them.
  bool byName = false;

  const Node* find(const std::string& name) const;  // nullptr if absent
  Node* find(const std::string& name);
};

// What a job asks for. Exactly one of the two shapes:
//   nodes x gpusPerNode   (nodes > 0, gpusPerNode > 0, totalGpus == 0): that many GPUs on each of that many
//   nodes; totalGpus             (totalGpus > 0, nodes == gpusPerNode == 0): that many GPUs, split over as
//   few nodes as
//                         placement can manage.
struct JobRequest {
  std::string id;
  int priority = 0;        // --priority: orders a user's own jobs (fair_share.h); higher runs first
  uint64_t submitSeq = 0;  // submit order; lower runs first among equal priorities
  std::string user;        // who the job's GPU-seconds are charged to, in `account`
  std::string account;
  std::string qos;       // its quality of service (fair_share.h's Qos); "" is normal
  int64_t submitMs = 0;  // unix ms, for the age factor
  int64_t tier = 0;  // its QoS's priority (prioritize() sets it): a higher tier runs first, whatever `order`
  double order = 0;  // fair_share.h's prioritize(): higher runs first; ties go by priority, then submitSeq
  int nodes = 0;
  int gpusPerNode = 0;
  int totalGpus = 0;
  std::map<std::string, std::string> requiredLabels;  // every one must match the node's label exactly
  std::string topology;  // user override of the ring dims ("4x2"); empty = derived from the allocation
  int cpusPerRank = 0;   // per GPU (a rank); 0: not asked for
  int64_t memoryPerRank = 0;  // bytes per GPU; 0: not asked for

  bool isShape() const { return nodes > 0 || gpusPerNode > 0; }
  int gpuCount() const { return isShape() ? nodes * gpusPerNode : totalGpus; }
  // "4 nodes x 2 GPUs" / "6 GPUs", plus " with 4 CPUs and 8 GiB each" for a request and " with gpu=a100"
  // for labels.
  std::string describe() const;
  // How many of its ranks the node could run: with `now`, on what is free; without, were it idle.
  int ranksFitting(const Node& node, bool now) const;
};

struct NodeAllocation {
  std::string node;
  std::vector<int> gpus;  // ascending GPU indices on that node
  std::vector<int> cpus;  // cpusPerRank per GPU, in the order of gpus; empty when the job asks for none
  int64_t memoryBytes = 0;  // memoryPerRank times the GPUs

  // The CPUs of the rank on `gpu`: the slice of cpus in the place of gpu in gpus; empty if it has none.
  std::vector<int> cpusOf(int gpu) const;

  bool operator==(const NodeAllocation&) const = default;
};

struct Allocation {
  std::vector<NodeAllocation> nodes;  // in the order placement chose them; ring_layout.h sorts for rank order

  int totalGpus() const;
  bool empty() const { return nodes.empty(); }
  std::string str() const;  // "n1[0,1] n2[0,1]", plus " cpus 0-7" per node that has CPUs
  const NodeAllocation* find(const std::string& node) const;  // nullptr if the job has nothing there
};

// The CPUs of the rank on `gpu` when a node's share of a job is `gpus` and `cpus` (as many per GPU, in the
// order of gpus): the slice of cpus in the place of gpu; empty if gpu is not there or there are no CPUs.
std::vector<int> cpusOfGpu(const std::vector<int>& gpus, const std::vector<int>& cpus, int gpu);

// Name order for people: digit runs compare as numbers, so "n2" < "n10". Used for every tie and listing.
bool naturalLess(const std::string& a, const std::string& b);

// Marks the allocation's GPUs, CPUs and memory as used in the cluster (a job starts). Asserts that they were
// free.
void applyAllocation(Cluster& cluster, const Allocation& allocation);
// Gives an allocation's GPUs, CPUs and memory back to the cluster (nodes it does not have are skipped).
void releaseAllocation(Cluster& cluster, const Allocation& allocation);

}  // namespace ddl::placement
