// Ring layout: which rank runs on which GPU, and the topology dims libddl's multi-dimensional ring (mdring)
// uses.
//
// Rank order. Nodes are grouped by their `switch` label (a node without one is alone in its group), groups in
// natural name order ("s2" before "s10"), nodes in natural name order within a group, and within a node the
// GPUs of one NVLink island together (islands in the order of their lowest GPU, where the node reports them),
// each island's in index order: the ring inside a node steps along NVLink before it crosses to another
// island. So ranks 0..g-1 are the GPUs of the first node, the next g the second node, and a switch's ranks
// are contiguous: neighbouring ranks are as close in the fabric as the allocation allows.
//
// Dims (DDL_TOPOLOGY, dim 0 fastest). With G = GPUs per node, N = nodes per switch, S = switches:
//   - every node has the same G and every switch the same N: G x N x S (4 nodes x 2 GPUs on one switch: 2x4;
//     2 switches x 2 nodes x 2 GPUs: 2x2x2). Rings along dim 0 stay inside a node, along dim 1 inside a
//     switch.
//   - the same G, but switches hold different numbers of nodes: G x (all nodes). Dim 1 rings cross switches.
//   - nodes with different GPU counts: P (flat), the one shape valid for any rank count.
// Dims equal to 1 are then dropped (one node: "4", not "4x1x1"; one GPU per node on one switch: "8"), keeping
// at least one. A user override (--topology 4x2 at submit) replaces the derived dims when its product is the
// rank count; the rank order stays the same, so the override only changes how ranks are grouped into rings.
//
// Validation walks every ring of every dim explicitly (next rank = this rank + stride of the dim, wrapping)
// and checks it closes after exactly dims[d] steps and that the rings of a dim hold every rank once. Cost:
// O(P · D) for P ranks and D dims, microseconds for thousands of ranks.
#include "placement/ring_layout.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include "common/topology_dims.h"

namespace ddl::placement {

namespace {

std::string groupKey(const std::string& switchName, const std::string& node) {
  return switchName.empty() ? "node:" + node : switchName;
}

int stride(const std::vector<int>& dims, int d) {
  int s = 1;
  for (int i = 0; i < d; ++i) s *= dims[i];
  return s;
}

// The next rank along dim d, wrapping at the end of the ring.
int nextAlong(const std::vector<int>& dims, int rank, int d) {
  const int s = stride(dims, d);
  const int coord = (rank / s) % dims[d];
  return coord + 1 < dims[d] ? rank + s : rank - coord * s;
}

}  // namespace

std::string RingLayout::topology() const { return formatTopologyDims(dims); }

std::string parseTopologyOverride(const std::string& text, int nranks, std::vector<int>* dims) {
  const std::string expect =
      " (expected positive integers joined by 'x', like 4x2 or 4x8x2, whose product is " +
      std::to_string(nranks) + ", the job's GPU count)";
  std::vector<int> out;
  if (std::string why = parseTopologyDims(text, &out); !why.empty()) {
    return "topology '" + text + "' is malformed: " + why + expect;
  }
  if (const long long product = topologyRanks(out); product != nranks) {
    return "topology " + text + " has " + std::to_string(product) + " ranks but the job has " +
           std::to_string(nranks) + " GPUs; the dims must multiply to the GPU count";
  }
  *dims = std::move(out);
  return "";
}

std::string buildRingLayout(const Allocation& allocation, const Cluster& cluster,
                            const std::string& topologyOverride, RingLayout* layout) {
  *layout = RingLayout();
  struct Host {
    const NodeAllocation* alloc;
    std::string switchName, key;
    const Node* node;  // null when the cluster does not know it
  };
  std::vector<Host> hosts;
  for (const NodeAllocation& a : allocation.nodes) {
    if (a.gpus.empty()) continue;
    const Node* node = cluster.find(a.node);
    std::string sw = node ? node->label(kSwitchLabel) : "";
    hosts.push_back({&a, sw, groupKey(sw, a.node), node});
  }
  if (hosts.empty()) return "the allocation has no GPUs, so there are no ranks to lay out";
  std::stable_sort(hosts.begin(), hosts.end(), [](const Host& a, const Host& b) {
    if (a.key != b.key) return naturalLess(a.key, b.key);
    return naturalLess(a.alloc->node, b.alloc->node);
  });

  RingLayout out;
  std::vector<std::pair<std::string, int>> perSwitch;  // group key, nodes; in rank order
  std::set<int> gpuCounts;
  for (const Host& h : hosts) {
    const std::vector<int>* islands = h.node && h.node->topology ? &h.node->topology->gpuIsland : nullptr;
    auto islandOf = [&](int gpu) {
      return islands && gpu >= 0 && gpu < static_cast<int>(islands->size()) ? (*islands)[gpu] : -1;
    };
    std::vector<int> gpus = h.alloc->gpus;
    std::sort(gpus.begin(), gpus.end(),
              [&](int a, int b) { return std::make_pair(islandOf(a), a) < std::make_pair(islandOf(b), b); });
    for (size_t i = 0; i < gpus.size(); ++i) {
      out.ranks.push_back({out.size(), h.alloc->node, gpus[i], static_cast<int>(i),
                           static_cast<int>(gpus.size()), h.switchName, islandOf(gpus[i])});
    }
    gpuCounts.insert(static_cast<int>(gpus.size()));
    if (perSwitch.empty() || perSwitch.back().first != h.key) perSwitch.push_back({h.key, 0});
    ++perSwitch.back().second;
  }
  const int p = out.size();
  const int nodes = static_cast<int>(hosts.size());

  if (!topologyOverride.empty()) {
    if (std::string bad = parseTopologyOverride(topologyOverride, p, &out.dims); !bad.empty()) return bad;
    out.overridden = true;
    out.why = "set at submit (--topology " + topologyOverride + ")";
    *layout = std::move(out);
    return "";
  }

  std::set<int> nodesPerSwitch;
  for (const auto& [key, n] : perSwitch) nodesPerSwitch.insert(n);
  const int g = *gpuCounts.begin();
  std::vector<int> dims;
  if (gpuCounts.size() == 1 && nodesPerSwitch.size() == 1) {
    const int n = *nodesPerSwitch.begin(), s = static_cast<int>(perSwitch.size());
    dims = {g, n, s};
    out.why = std::to_string(g) + " GPUs per node x " + std::to_string(n) + " nodes per switch x " +
              std::to_string(s) + (s == 1 ? " switch" : " switches");
  } else if (gpuCounts.size() == 1) {
    dims = {g, nodes};
    std::string counts;
    for (const auto& [key, n] : perSwitch)
      counts += (counts.empty() ? "" : ", ") + key + ": " + std::to_string(n);
    out.why = std::to_string(g) + " GPUs per node x " + std::to_string(nodes) +
              " nodes; switches hold different numbers of nodes (" + counts + "), so dim 1 spans switches";
  } else {
    dims = {p};
    out.why = "flat: the nodes give different numbers of GPUs (" + std::to_string(*gpuCounts.begin()) +
              " to " + std::to_string(*gpuCounts.rbegin()) + "), so no grid fits";
  }
  for (int d : dims)
    if (d != 1) out.dims.push_back(d);
  if (out.dims.empty()) out.dims = {1};
  *layout = std::move(out);
  return "";
}

std::string validateRingLayout(const RingLayout& layout) {
  const int p = layout.size();
  if (p == 0) return "the layout has no ranks";
  if (layout.dims.empty()) return "the layout has no dims";
  long long product = 1;
  for (int d : layout.dims) {
    if (d < 1) return "dim " + std::to_string(d) + " in " + layout.topology() + " is not positive";
    product *= d;
    if (product > p) break;
  }
  if (product != p) {
    return "topology " + layout.topology() + " does not multiply to the " + std::to_string(p) + " ranks";
  }
  std::set<std::pair<std::string, int>> gpus;
  std::map<std::string, std::vector<const RankSlot*>> byNode;
  for (int r = 0; r < p; ++r) {
    const RankSlot& s = layout.ranks[r];
    if (s.rank != r) return "rank slot " + std::to_string(r) + " is numbered " + std::to_string(s.rank);
    if (!gpus.insert({s.node, s.gpu}).second) {
      return "GPU " + std::to_string(s.gpu) + " of node " + s.node + " is given to more than one rank";
    }
    byNode[s.node].push_back(&s);
  }
  for (const auto& [node, slots] : byNode) {
    std::vector<bool> seen(slots.size(), false);
    for (const RankSlot* s : slots) {
      if (s->localSize != static_cast<int>(slots.size()) || s->localRank < 0 ||
          s->localRank >= s->localSize || seen[s->localRank]) {
        return "rank " + std::to_string(s->rank) + " on node " + node + " has local rank " +
               std::to_string(s->localRank) + " of " + std::to_string(s->localSize) + " but the node runs " +
               std::to_string(slots.size()) + " ranks";
      }
      seen[s->localRank] = true;
    }
  }
  for (int d = 0; d < static_cast<int>(layout.dims.size()); ++d) {
    std::vector<bool> inRing(p, false);
    for (int start = 0; start < p; ++start) {
      if (inRing[start]) continue;
      int cur = start, steps = 0;
      do {
        if (inRing[cur]) {
          return "rank " + std::to_string(cur) + " is in two rings along dim " + std::to_string(d);
        }
        inRing[cur] = true;
        cur = nextAlong(layout.dims, cur, d);
        ++steps;
      } while (cur != start && steps <= layout.dims[d]);
      if (cur != start || steps != layout.dims[d]) {
        return "the ring along dim " + std::to_string(d) + " from rank " + std::to_string(start) +
               " does not close after " + std::to_string(layout.dims[d]) + " ranks";
      }
    }
  }
  return "";
}

RankEnvSpec rankEnvSpec(const RingLayout& layout, int rank) {
  const RankSlot& s = layout.ranks.at(rank);
  RankEnvSpec spec;
  spec.rank = rank;
  spec.world_size = layout.size();
  spec.local_rank = s.localRank;
  spec.local_size = s.localSize;
  spec.topology = layout.topology();
  return spec;
}

std::string renderRingLayout(const RingLayout& layout) {
  std::string out = "topology " + layout.topology() + " (DDL_TOPOLOGY), " + std::to_string(layout.size()) +
                    " ranks: " + layout.why + "\n";
  std::string lastSwitch = "\x01", lastNode;
  for (const RankSlot& s : layout.ranks) {
    if (s.switchName != lastSwitch) {
      out += s.switchName.empty() ? "(no switch label)\n" : "switch " + s.switchName + "\n";
      lastSwitch = s.switchName;
      lastNode.clear();
    }
    if (s.node != lastNode) {
      out += "  node " + s.node + ":";
      lastNode = s.node;
    }
    // An NVLink island's ranks in brackets, where the node reports islands: "[gpu0=r0 gpu1=r1]".
    const bool first = s.rank == 0 || layout.ranks[s.rank - 1].node != s.node;
    const bool last = s.rank + 1 == layout.size() || layout.ranks[s.rank + 1].node != s.node;
    const bool opens = s.island >= 0 && (first || layout.ranks[s.rank - 1].island != s.island);
    const bool closes = s.island >= 0 && (last || layout.ranks[s.rank + 1].island != s.island);
    out += std::string(opens                   ? "  ["
                       : first || s.island < 0 ? "  "
                                               : " ") +
           "gpu" + std::to_string(s.gpu) + "=r" + std::to_string(s.rank) + (closes ? "]" : "");
    if (last) out += "\n";
  }
  if (std::any_of(layout.ranks.begin(), layout.ranks.end(), [](const RankSlot& s) { return s.island >= 0; }))
    out += "  ([...]: the GPUs of one NVLink island)\n";
  const int p = layout.size();
  for (int d = 0; d < static_cast<int>(layout.dims.size()); ++d) {
    if (layout.dims[d] == 1) continue;
    std::vector<std::vector<int>> rings;
    std::vector<bool> seen(p, false);
    bool oneNode = true, oneSwitch = true, labeled = true;
    for (int start = 0; start < p; ++start) {
      if (seen[start]) continue;
      std::vector<int> ring;
      int cur = start;
      do {
        seen[cur] = true;
        ring.push_back(cur);
        const RankSlot &a = layout.ranks[start], &b = layout.ranks[cur];
        oneNode = oneNode && a.node == b.node;
        oneSwitch = oneSwitch && !a.switchName.empty() && a.switchName == b.switchName;
        labeled = labeled && !b.switchName.empty();
        cur = nextAlong(layout.dims, cur, d);
      } while (cur != start);
      rings.push_back(std::move(ring));
    }
    const char* where = oneNode     ? "each within one node"
                        : oneSwitch ? "each within one switch"
                        : labeled   ? "crossing switches"
                                    : "crossing nodes";
    out += "dim " + std::to_string(d) + " (size " + std::to_string(layout.dims[d]) +
           "): " + std::to_string(rings.size()) + (rings.size() == 1 ? " ring, " : " rings, ") + where + ":";
    const size_t shown = std::min<size_t>(rings.size(), 4);
    for (size_t i = 0; i < shown; ++i) {
      out += " [";
      const size_t n = std::min<size_t>(rings[i].size(), 16);
      for (size_t k = 0; k < n; ++k) out += (k ? " " : "") + std::to_string(rings[i][k]);
      if (rings[i].size() > n) out += " ...";
      out += "]";
    }
    if (rings.size() > shown) out += " and " + std::to_string(rings.size() - shown) + " more";
    out += "\n";
  }
  return out;
}

}  // namespace ddl::placement
