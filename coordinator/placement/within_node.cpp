// Ranks inside a node by its NVLink islands and NUMA nodes (within_node.h). Sets of GPUs are 64-bit masks (a
// node registers at most 64 GPUs), so nothing here allocates until the answer; cost: O(G^2) bit operations
// per level of the recursion for G GPUs, nothing next to choosing the node.
#include "placement/within_node.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "placement/placement.h"

namespace ddl::placement {

namespace {

using Mask = uint64_t;
constexpr int kMaxGpus = 64;

// A division of the node's GPUs into groups: key[i] is GPU i's group (-1: unknown, the GPU alone).
using Division = const std::vector<int>*;

int keyOf(Division d, int gpu) {
  if (gpu >= static_cast<int>(d->size()) || (*d)[gpu] < 0) return -1 - gpu;  // alone in a group of its own
  return (*d)[gpu];
}

int lowest(Mask m) { return std::countr_zero(m); }
int count(Mask m) { return std::popcount(m); }

// The GPUs of `set` by their group in `d`, into out[] in the order of their lowest GPU; how many groups.
int groupsOf(Mask set, Division d, Mask out[kMaxGpus]) {
  int n = 0;
  while (set) {
    const int key = keyOf(d, lowest(set));
    Mask group = 0;
    for (Mask rest = set; rest; rest &= rest - 1)
      if (keyOf(d, lowest(rest)) == key) group |= Mask{1} << lowest(rest);
    out[n++] = group;
    set &= ~group;
  }
  return n;
}

// The GPUs of `set` that share a group with `gpu` in `d`.
Mask groupOf(Mask set, Division d, int gpu) {
  Mask group = 0;
  const int key = keyOf(d, gpu);
  for (Mask rest = set; rest; rest &= rest - 1)
    if (keyOf(d, lowest(rest)) == key) group |= Mask{1} << lowest(rest);
  return group;
}

// How many GPUs of `set` share a group with `gpu` in each division but `skip`: how much a pick there would
// break of the other divisions (lower is better: it keeps the others' bigger groups whole).
int enclosing(Mask set, const std::vector<Division>& divisions, size_t skip, int gpu) {
  int n = 0;
  for (size_t k = 0; k < divisions.size(); ++k)
    if (k != skip) n += count(groupOf(set, divisions[k], gpu));
  return n;
}

Mask choose(Mask set, int need, const std::vector<Division>& divisions) {
  if (need >= count(set)) return set;
  Mask groups[kMaxGpus];
  // The smallest group that holds them, by the divisions in order (islands before NUMA nodes).
  for (size_t k = 0; k < divisions.size(); ++k) {
    const int n = groupsOf(set, divisions[k], groups);
    Mask best = 0;
    std::tuple<int, int, int> bestRank;
    for (int i = 0; i < n; ++i) {
      const Mask g = groups[i];
      if (count(g) < need || g == set) continue;
      const std::tuple<int, int, int> rank{count(g), enclosing(set, divisions, k, lowest(g)), lowest(g)};
      if (!best || rank < bestRank) {
        best = g;
        bestRank = rank;
      }
    }
    if (best) return choose(best, need, divisions);
  }
  // None holds them: span the groups of the coarsest division that splits the set, the biggest first and the
  // best fit for what is left.
  int n = 0;
  for (Division d : divisions) {
    Mask g[kMaxGpus];
    const int m = groupsOf(set, d, g);
    if (m > 1 && (n == 0 || m < n)) {
      std::copy(g, g + m, groups);
      n = m;
    }
  }
  if (n == 0) {  // one group: the lowest `need`
    Mask out = 0;
    for (Mask rest = set; need > 0; rest &= rest - 1, --need) out |= Mask{1} << lowest(rest);
    return out;
  }
  std::stable_sort(groups, groups + n, [](Mask a, Mask b) { return count(a) > count(b); });
  Mask out = 0;
  int left = need;
  for (int i = 0; i < n && left > 0; ++i) {
    // The smallest group not yet taken that holds the rest, if any (groups are by size, descending).
    int fit = n;
    for (int j = i; j < n; ++j)
      if (count(groups[j]) >= left) fit = j;
    if (fit < n) {
      out |= choose(groups[fit], left, divisions);
      left = 0;
    } else {
      out |= groups[i];
      left -= count(groups[i]);
    }
  }
  return out;
}

}  // namespace

WithinNode pickWithinNode(const Node& node, int count, int cpusPerRank) {
  WithinNode out;
  const std::vector<int> free = node.freeGpuIndices();
  assert(static_cast<int>(free.size()) >= count);
  std::vector<Division> divisions;
  const NodeTopology* t = node.topology.get();
  if (t && node.gpus <= kMaxGpus) {
    if (!t->gpuIsland.empty()) divisions.push_back(&t->gpuIsland);
    if (!t->gpuNuma.empty()) divisions.push_back(&t->gpuNuma);
  }
  if (divisions.empty() || count == static_cast<int>(free.size())) {
    out.gpus.assign(free.begin(), free.begin() + count);
  } else {
    Mask set = 0;
    for (int g : free) set |= Mask{1} << g;
    for (Mask chosen = choose(set, count, divisions); chosen; chosen &= chosen - 1)
      out.gpus.push_back(lowest(chosen));
  }
  if (cpusPerRank <= 0) return out;

  // Each rank's CPUs from its GPU's NUMA node first, then what is left anywhere, the lowest ids first.
  std::vector<bool> taken(node.cpus.size(), false);
  for (size_t i = 0; i < node.cpus.size(); ++i) taken[i] = node.isCpuUsed(i);
  const bool numaKnown = t && !t->gpuNuma.empty() && t->cpuNuma.size() == node.cpus.size();
  std::vector<std::vector<int>> perRank(out.gpus.size());
  for (int pass = numaKnown ? 0 : 1; pass < 2; ++pass) {
    for (size_t r = 0; r < out.gpus.size(); ++r) {
      const int gpu = out.gpus[r];
      const int numa = gpu < static_cast<int>(t ? t->gpuNuma.size() : 0) ? t->gpuNuma[gpu] : -1;
      for (size_t i = 0; i < node.cpus.size() && static_cast<int>(perRank[r].size()) < cpusPerRank; ++i) {
        if (taken[i] || (pass == 0 && (numa < 0 || t->cpuNuma[i] != numa))) continue;
        taken[i] = true;
        perRank[r].push_back(node.cpus[i]);
      }
    }
  }
  for (std::vector<int>& cpus : perRank) {
    assert(static_cast<int>(cpus.size()) == cpusPerRank);
    std::sort(cpus.begin(), cpus.end());
    out.cpus.insert(out.cpus.end(), cpus.begin(), cpus.end());
  }
  return out;
}

GroupFit groupFit(const Node& node, int need, int spare) {
  GroupFit out;
  const NodeTopology* t = node.topology.get();
  if (!t) return {spare, spare};
  if (node.gpus > kMaxGpus) return {GroupFit::kNoFit, GroupFit::kNoFit};  // more than a node may register
  // No allocation: placement asks this of every candidate node for every job.
  Mask free = 0;
  for (int g = 0; g < node.gpus; ++g)
    if (!node.isUsed(g)) free |= Mask{1} << g;
  auto waste = [&](const std::vector<int>& key) {
    if (key.empty()) return 0;
    int best = GroupFit::kNoFit;
    Mask groups[kMaxGpus];
    const int n = groupsOf(free, &key, groups);  // as choose() groups them
    for (int i = 0; i < n; ++i)
      if (count(groups[i]) >= need) best = std::min(best, count(groups[i]) - need);
    return best;
  };
  out.island = waste(t->gpuIsland);
  out.numa = waste(t->gpuNuma);
  return out;
}

BrokenGroups brokenGroups(const Node& node) {
  BrokenGroups out;
  const NodeTopology* t = node.topology.get();
  if (!t) return out;
  auto broken = [&](const std::vector<int>& key) {
    std::map<int, std::pair<int, int>> usedOfSize;  // group -> (used, size)
    for (int g = 0; g < node.gpus && g < static_cast<int>(key.size()); ++g) {
      if (key[g] < 0) continue;
      auto& [used, size] = usedOfSize[key[g]];
      used += node.isUsed(g);
      ++size;
    }
    int n = 0;
    for (const auto& [group, counts] : usedOfSize)
      n += counts.second > 1 && counts.first > 0 && counts.first < counts.second;
    return n;
  };
  out.islands = broken(t->gpuIsland);
  out.numaNodes = broken(t->gpuNuma);
  return out;
}

WorkloadRun runWorkload(Cluster cluster, uint32_t seed, int events, bool lowestId, int cpusPerRank) {
  std::vector<std::shared_ptr<const NodeTopology>> topo;
  int total = 0, held = 0;
  for (Node& n : cluster.nodes) {
    topo.push_back(n.topology);
    if (lowestId) n.topology = nullptr;
    total += n.gpus;
    held += n.gpus - n.freeGpus();
  }
  std::mt19937 rng(seed);
  std::map<std::string, Allocation> live;
  WorkloadRun w;
  for (int event = 0; event < events; ++event) {
    // A departure while more than three quarters of the GPUs are held, else one event in three.
    const bool depart = rng() % 3 == 0 || 4 * held > 3 * total;
    if (depart && !live.empty()) {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      releaseAllocation(cluster, it->second);
      held -= it->second.totalGpus();
      live.erase(it);
    } else {
      const int size = cluster.nodes[rng() % cluster.nodes.size()].gpus;
      const int roll = static_cast<int>(rng() % 10);
      JobRequest j;
      j.id = "j" + std::to_string(event);
      j.totalGpus = std::max(1, roll < 5 ? 1 : roll < 8 ? 2 : roll < 9 ? size / 2 : size - 1);
      j.cpusPerRank = cpusPerRank;
      const PlacementResult p = place(cluster, j);
      if (!p.ok()) {
        ++w.unplaced;
        continue;
      }
      ++w.placed;
      for (const NodeAllocation& a : p.allocation().nodes) {
        const Node* n = cluster.find(a.node);
        const NodeTopology* t = topo[static_cast<size_t>(n - cluster.nodes.data())].get();
        if (!t) continue;
        const size_t count = a.gpus.size();
        auto roomIn = [&](const std::vector<int>& key) {
          std::map<int, size_t> free;
          for (int g = 0; g < n->gpus && g < static_cast<int>(key.size()); ++g) free[key[g]] += !n->isUsed(g);
          return std::any_of(free.begin(), free.end(), [&](const auto& f) { return f.second >= count; });
        };
        auto oneOf = [&](const std::vector<int>& key) {
          std::set<int> groups;
          for (int g : a.gpus) groups.insert(g < static_cast<int>(key.size()) ? key[g] : -1 - g);
          return groups.size() == 1;
        };
        // One island where one has room; and one NUMA node where one has room, when the islands and NUMA
        // nodes nest (where they cut across each other, the island comes first and may span NUMA nodes).
        auto nested = [&](const std::vector<int>& inner, const std::vector<int>& outer) {
          std::map<int, int> outerOf;
          for (int g = 0; g < n->gpus && g < static_cast<int>(std::min(inner.size(), outer.size())); ++g)
            if (!outerOf.emplace(inner[g], outer[g]).second && outerOf[inner[g]] != outer[g]) return false;
          return true;
        };
        const bool hasIslands = !t->gpuIsland.empty(), numa = !t->gpuNuma.empty();
        const bool nest =
            hasIslands && numa && (nested(t->gpuIsland, t->gpuNuma) || nested(t->gpuNuma, t->gpuIsland));
        std::string bad;
        if (hasIslands && roomIn(t->gpuIsland) && !oneOf(t->gpuIsland)) bad = "spans islands";
        if ((nest || !hasIslands) && numa && roomIn(t->gpuNuma) && !oneOf(t->gpuNuma))
          bad = "spans NUMA nodes";
        for (int c : a.cpus) {
          const auto at = std::lower_bound(n->cpus.begin(), n->cpus.end(), c);
          if (at == n->cpus.end() || *at != c || n->isCpuUsed(static_cast<size_t>(at - n->cpus.begin())))
            bad = "CPU " + std::to_string(c) + " is not a free CPU of the node";
        }
        if (a.cpus.size() != a.gpus.size() * static_cast<size_t>(std::max(cpusPerRank, 0)))
          bad = "it has " + std::to_string(a.cpus.size()) + " CPUs";
        if (!bad.empty() && w.violations++ == 0)
          w.firstViolation = j.id + " " + bad + ": " + p.allocation().str();
        // Split: its GPUs span more groups than the fewest that could hold as many on this node (NVLink
        // islands where the node has several, else NUMA nodes).
        std::set<int> islands;
        for (int g = 0; g < n->gpus && g < static_cast<int>(t->gpuIsland.size()); ++g)
          islands.insert(t->gpuIsland[g]);
        const std::vector<int>& key = islands.size() > 1 ? t->gpuIsland : t->gpuNuma;
        std::map<int, int> sizes;
        std::set<int> spanned;
        for (int g = 0; g < n->gpus && g < static_cast<int>(key.size()); ++g) ++sizes[key[g]];
        for (int g : a.gpus) spanned.insert(g < static_cast<int>(key.size()) ? key[g] : -1 - g);
        std::vector<int> bySize;
        for (const auto& [group, size] : sizes) bySize.push_back(size);
        std::sort(bySize.rbegin(), bySize.rend());
        size_t fewest = 0;
        for (int covered = 0; covered < static_cast<int>(count) && fewest < bySize.size(); ++fewest)
          covered += bySize[fewest];
        w.splitJobs += spanned.size() > std::max<size_t>(fewest, 1);
      }
      applyAllocation(cluster, p.allocation());
      held += p.allocation().totalGpus();
      live[j.id] = p.allocation();
    }
    for (size_t i = 0; i < cluster.nodes.size(); ++i) {
      if (!topo[i]) continue;
      const Node& n = cluster.nodes[i];
      Node counted;
      counted.gpus = n.gpus;
      counted.used = n.used;
      counted.topology = topo[i];
      const BrokenGroups b = brokenGroups(counted);
      w.brokenIslands += b.islands;
      w.brokenNuma += b.numaNodes;
    }
  }
  return w;
}

}  // namespace ddl::placement
