// The scaling model of ddl-sim: what an allreduce of n bytes costs on a cluster described by per-link-class
// latency and bandwidth, for the algorithms libddl has (comm/src/algo/ring.cpp, mdring.cpp, rhd.cpp).
//
// Pure functions over plain structs: no I/O, no clock, no global state, so the unit tests check step counts
// and byte volumes against hand calculation in microseconds. docs/scaling-model.md says what is and is not
// modelled.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "common/status.h"

namespace ddl::sim {

// Where two ranks sit relative to each other; the order is from fastest to slowest.
enum class LinkClass { kIntra = 0, kNode = 1, kSwitch = 2 };
constexpr int kLinkClasses = 3;
const char* linkClassName(LinkClass c);  // "intra", "node", "switch"

// One link class: a message of b bytes takes alpha_s + b / beta_Bps (one way, one flow alone on the link).
struct Link {
  double alpha_s = 0;
  double beta_Bps = 0;
};

// A cluster: ranks_per_node ranks per node (dim 0), nodes_per_switch nodes under one switch (dim 1), then
// switches. Rank r lives on node r / ranks_per_node, and node m under switch m / nodes_per_switch.
//
// nics_per_node: the node's ports to the network, shared by every flow that leaves the node at once (kNode
// and kSwitch alike); 0 means one port per rank (never shared). k flows leaving a node with c ports get
// beta·min(1, c/k) each. Intra-node flows never share (each pair of ranks has its own link, as NVLink pairs
// or shared memory with enough cores).
struct Machine {
  std::string name;
  int ranks_per_node = 1;
  int nodes_per_switch = 1 << 30;
  int nics_per_node = 0;
  std::array<Link, kLinkClasses> links{};
  double reduce_Bps = 0;  // bytes of reduced output per second (0: free)
};

enum class Algo { kRing, kMdRing, kRhd };
const char* algoName(Algo a);
StatusOr<Algo> parseAlgo(const std::string& name);

// How libddl runs the ring steps (ring.cpp): segments of segment_bytes, up to window in flight.
struct RingParams {
  double segment_bytes = 256 * 1024;
  int window = 4;
};

// The segment libddl's built-in tuning table gives a forced algorithm (comm/src/algo/tune.cpp): mdring runs
// 64 KiB segments on a configured hierarchy, the flat ring the default 256 KiB.
RingParams libddlRingParams(Algo a);

// One sequential phase of an algorithm: `steps` rounds in which every busy rank sends bytes_per_step, the
// slowest flow of which crosses `link` (with `flows` flows sharing its node's port).
struct Phase {
  std::string what;  // "ring reduce-scatter", "dim 1 allgather", "rhd halving mask 2", ...
  int steps = 0;
  double bytes_per_step = 0;
  LinkClass link = LinkClass::kIntra;
  int flows = 1;
  bool reduce = false;
  double seconds = 0;
};

struct Prediction {
  Algo algo = Algo::kRing;
  int ranks = 0;
  double bytes = 0;
  std::vector<int> dims;      // mdring's grid; empty for the others
  int steps = 0;              // sequential rounds on the critical path
  double bytes_sent_max = 0;  // bytes sent by the busiest rank
  double seconds = 0;
  std::vector<Phase> phases;
};

// The link class between ranks a and b of m.
LinkClass linkBetween(const Machine& m, int a, int b);

// mdring's grid for p ranks on m: ranks per node x nodes per switch x switches, dims of 1 left out, the
// innermost partial (p need not fill whole nodes or switches: the last nontrivial dim takes what is left).
// Invalid when p is not a multiple of the inner dims.
StatusOr<std::vector<int>> defaultGrid(const Machine& m, int p);

// Checks that a machine is usable (positive sizes and bandwidths, non-negative latencies).
Status validate(const Machine& m);

// The modelled allreduce of `bytes` over p ranks. dims: mdring's grid (product p), empty for defaultGrid.
StatusOr<Prediction> predict(const Machine& m, Algo algo, int p, double bytes, const RingParams& ring = {},
                             std::vector<int> dims = {});

// The cost of consecutive ring steps over one effective link (ring.cpp's pipeline, to first order): each step
// moves `block` bytes in ceil(block/segment) equal segments of s bytes; a segment's hop costs c = alpha +
// s/beta (+ s/reduce when the step reduces), and a step keeps the link busy for nseg * u, u = max(s/beta,
// s/reduce, (alpha + s/beta)/window). A step takes max(nseg * u, c); the last one (nseg - 1) * u + c.
double ringStepsSeconds(int steps, bool reduce, double block, const Link& link, double reduce_Bps,
                        const RingParams& ring);

// Training-step efficiency: compute / (compute + exposed communication), where overlap (0..1) of the
// allreduce hides behind the backward pass (backward_fraction of compute) at most.
double scalingEfficiency(double compute_s, double allreduce_s, double overlap,
                         double backward_fraction = 2.0 / 3);

}  // namespace ddl::sim
