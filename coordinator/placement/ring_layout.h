// Ring layout: the rank order of a placed job and the topology dims its ranks get as DDL_TOPOLOGY, which
// libddl's mdring reads ("4x8x2": dim 0 = GPUs per node, varying fastest; dim 1 = nodes per switch; dim 2 =
// switches). How the dims are derived and validated is described at the top of ring_layout.cpp.
//
// Threads: pure functions over values; any thread may call any of them concurrently.
#pragma once

#include "common/rank_env.h"

#include <string>
#include <utility>
#include <vector>

#include "placement/cluster.h"

namespace ddl::placement {

struct RankSlot {
  int rank = 0;
  std::string node;
  int gpu = 0;             // GPU index on the node
  int localRank = 0;       // position among this job's ranks on the node
  int localSize = 0;       // this job's ranks on the node
  std::string switchName;  // the node's switch label, "" if it has none
  int island = -1;         // its GPU's NVLink island on the node (cluster.h's NodeTopology); -1 unknown
};

struct RingLayout {
  std::vector<RankSlot> ranks;  // ranks[r].rank == r; ordered by switch, node, NVLink island, GPU index
  std::vector<int> dims;        // dims[0] fastest; product == ranks.size()
  bool overridden = false;      // dims came from the job's --topology
  std::string why;              // one line: how the dims were chosen (shown by `ddlctl ring`)

  int size() const { return static_cast<int>(ranks.size()); }
  std::string topology() const;  // "2x4": the value of DDL_TOPOLOGY
};

// Parses a user's topology ("4x2", 'x' or 'X' between positive integers) for a job of nranks ranks. On
// success fills dims and returns ""; otherwise returns a sentence that says what is wrong and what would be
// right.
std::string parseTopologyOverride(const std::string& text, int nranks, std::vector<int>* dims);

// Orders the allocation's GPUs into ranks (switch, then node, then NVLink island, then GPU index; names in
// natural order) and
// derives the dims, or applies `topologyOverride` when it is not empty. Nodes not in the cluster count as
// having no switch label. Returns "" on success; otherwise the override's error (the layout is then left
// empty).
std::string buildRingLayout(const Allocation& allocation, const Cluster& cluster,
                            const std::string& topologyOverride, RingLayout* layout);

// Checks the layout's invariants: ranks numbered 0..P-1, each (node, GPU) used once, local ranks consistent,
// the dims' product equal to P, and, for every dim, the rings along it (ranks that share every other
// coordinate) close after exactly dims[d] steps and together hold every rank exactly once. Returns "" or the
// first problem.
std::string validateRingLayout(const RingLayout& layout);

// What the layout says of a rank's environment (common/rank_env.h): its rank, the world size, its local rank
// and local size on its node, and the topology. The rendezvous address and ports come from the launch.
RankEnvSpec rankEnvSpec(const RingLayout& layout, int rank);

// A text rendering for `ddlctl ring JOB`: the dims and why, a rank table grouped by switch and node, and for
// each dim its rings and whether they stay within a node, within a switch, or cross switches.
std::string renderRingLayout(const RingLayout& layout);

}  // namespace ddl::placement
