// Gang placement, topology-aware best fit, and the priority queue with backfill.
//
// Placement. A job is placed all or nothing on the free GPUs of UP nodes that carry its labels. A shape job
// (nodes x gpusPerNode) needs `nodes` distinct nodes with gpusPerNode free GPUs each; we count it in "units"
// of one such node. A total job (totalGpus) needs that many free GPUs anywhere; a unit is one free GPU. Like
// Slurm's topology/tree, we look for the lowest subtree that can hold the job, from the bottom:
//   1. one node (a 1-node shape job, or a total job that fits one node): the best fit over the whole cluster,
//      i.e. the node left with the fewest free GPUs;
//   2. one switch (nodes grouped by their `switch` label): among the switches that can hold the job, the one
//      with the least capacity (best fit, so big switches stay whole for big jobs), then the one whose nodes
//      have the fewest spare GPUs, then by name;
//   3. one rack (`rack` label), the same way; 4. the whole cluster.
// Inside the chosen subtree, when the job must span several child groups (switches in a rack, racks in the
// cluster), it takes the groups with the most capacity first, so it spans as few as possible, and the last
// one is the best fit for what is left (the smallest group that covers it). On nodes, a shape job takes the
// nodes with the least free GPUs beyond its need (best fit: fully free nodes stay free, no node is split
// needlessly); a total job takes the fullest nodes first and the best-fitting node for the remainder. GPUs
// and CPUs on a node are chosen by its NVLink islands and NUMA nodes (within_node.h). Nodes without a
// `switch` (or `rack`) label are each alone in their own group. Cost: O(N log N) for N nodes per placement
// (grouping by label strings and sorting); a 256-GPU job on 1,000 nodes takes well under a millisecond
// (bench/placement_bench.cpp).
//
// Feasibility (checked at submit, see checkFeasible in placement.h): the job never fits when it asks for more
// than UP and DRAINING nodes carrying its labels could hold with every GPU idle. Such a job is refused with a
// sentence that says why; it never sits in the queue forever. Once queued, a job is refused by place() and
// schedule() only if it could not fit even with the DOWN nodes back: a job whose nodes went DOWN after submit
// stays pending with a reason that names them, rather than being thrown out during a reboot.
//
// Queue. schedule() sorts the queue by its order (fair_share.h's prioritize(): fair-share and age, each
// user's
// --priority as nice; 0 where it was not called), then --priority (higher first), then submit order, then id,
// and starts jobs in that order until one cannot start: that job is the head. A job that cannot start even if
// every UP node were idle (it waits for DRAINING or DOWN nodes to come back, not for jobs to end) does not
// become the head; it stays pending with its reason and the pass goes on, so one such job cannot stall the
// whole queue.
//
// Backfill. We know no job runtimes, so EASY backfill's "finishes before the head's reserved start" cannot be
// computed. We implement the conservative rule instead: after the head H blocks, a later job may start only
// on GPUs that H could not use while that job runs. We build a view of the cluster in which some free GPUs
// are reserved for H, and a backfill job must be placeable in that view:
//   - nodes H can never use (labels that do not match, fewer GPUs than H's gpusPerNode, not UP) are open;
//   - on a node H can use, for a shape head: if the node has at least gpusPerNode free GPUs, gpusPerNode of
//     them are reserved (the surplus is open); if it has fewer, all its free GPUs are reserved;
//   - on a node H can use, for a total head: all its free GPUs are reserved.
// Why this never delays H: H starts at the first moment enough of its nodes (shape) or GPUs (total) are free.
// We do not know how the busy GPUs on a node are split among running jobs, so the free count of a node may
// later take any value between today's free count and its GPU count. A shape node with f >= g free today and
// a backfill job holding at most f - g keeps at least g free at every later moment, so it qualifies for H
// exactly when it would have without the backfill job; a node with f < g free could reach exactly g later, so
// one backfilled GPU there could disqualify it, and we reserve all of f. A total head counts every free GPU
// it can use, so any backfilled GPU on its nodes could be the one it is missing. Only the head is protected
// (as in EASY backfill); H may end up on a different (less compact) placement than it would have got, but
// never later. Future passes rebuild the same reservation while H stays the head.
#include "placement/placement.h"

#include <algorithm>
#include <cassert>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "common/resources.h"
#include "placement/ring_layout.h"
#include "placement/within_node.h"

namespace ddl::placement {

// ---- cluster.h --------------------------------------------------------------------------------------------

const char* nodeStateName(NodeState state) {
  switch (state) {
    case NodeState::kUp:
      return "UP";
    case NodeState::kDraining:
      return "DRAINING";
    case NodeState::kDown:
      return "DOWN";
  }
  return "?";
}

int Node::freeGpus() const {
  int n = 0;
  for (int i = 0; i < gpus; ++i) n += !isUsed(i);
  return n;
}

std::vector<int> Node::freeGpuIndices() const {
  std::vector<int> out;
  for (int i = 0; i < gpus; ++i)
    if (!isUsed(i)) out.push_back(i);
  return out;
}

std::vector<int> Node::freeCpus() const {
  std::vector<int> out;
  for (size_t i = 0; i < cpus.size(); ++i)
    if (!isCpuUsed(i)) out.push_back(cpus[i]);
  return out;
}

int Node::freeCpuCount() const {
  const size_t held = cpuUsed.size() <= cpus.size()
                          ? static_cast<size_t>(std::count_if(cpuUsed.begin(), cpuUsed.end(),
                                                              [](uint8_t u) { return u != 0; }))
                          : static_cast<size_t>(std::count_if(cpuUsed.begin(), cpuUsed.begin() + cpus.size(),
                                                              [](uint8_t u) { return u != 0; }));
  return static_cast<int>(cpus.size() - held);
}

const std::string& Node::label(const std::string& key) const {
  static const std::string kNone;
  auto it = labels.find(key);
  return it == labels.end() ? kNone : it->second;
}

const Node* Cluster::find(const std::string& name) const {
  if (byName) {
    auto it = std::lower_bound(nodes.begin(), nodes.end(), name, [](const Node& n, const std::string& key) {
      return naturalLess(n.name, key);
    });
    return it != nodes.end() && it->name == name ? &*it : nullptr;
  }
  for (const Node& n : nodes)
    if (n.name == name) return &n;
  return nullptr;
}

Node* Cluster::find(const std::string& name) {
  return const_cast<Node*>(static_cast<const Cluster*>(this)->find(name));
}

namespace {

std::string labelsText(const std::map<std::string, std::string>& labels) {
  std::string s;
  for (const auto& [k, v] : labels) s += (s.empty() ? "" : ", ") + k + "=" + v;
  return s;
}

std::string plural(long long n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// "n3", "n3 and n4", "n3, n4, n5 and 2 more".
std::string nameList(const std::vector<std::string>& names) {
  std::string s;
  const size_t shown = std::min<size_t>(names.size(), 3);
  for (size_t i = 0; i < shown; ++i) {
    if (i) s += (i + 1 == shown && names.size() == shown) ? " and " : ", ";
    s += names[i];
  }
  if (names.size() > shown) s += " and " + std::to_string(names.size() - shown) + " more";
  return s;
}

}  // namespace

namespace {

// "4 CPUs and 8 GiB", "4 CPUs", or "" for a job that asks for neither.
std::string perRankCore(const JobRequest& job) {
  std::string s;
  if (job.cpusPerRank > 0) s = plural(job.cpusPerRank, "CPU", "CPUs");
  if (job.memoryPerRank > 0) s += (s.empty() ? "" : " and ") + formatBytes(job.memoryPerRank);
  return s;
}

// " with 4 CPUs and 8 GiB each" or "".
std::string perRankText(const JobRequest& job) {
  return perRankCore(job).empty() ? "" : " with " + perRankCore(job) + " each";
}

}  // namespace

std::string JobRequest::describe() const {
  std::string s = isShape() ? plural(nodes, "node", "nodes") + " x " + plural(gpusPerNode, "GPU", "GPUs")
                            : plural(totalGpus, "GPU", "GPUs");
  s += perRankText(*this);
  if (!requiredLabels.empty())
    s += (perRankText(*this).empty() ? " with " : ", on nodes with ") + labelsText(requiredLabels);
  return s;
}

int JobRequest::ranksFitting(const Node& node, bool now) const {
  long long fit = now ? node.freeGpus() : node.gpus;
  if (fit == 0) return 0;  // most nodes of a busy cluster: no need to count their CPUs
  if (cpusPerRank > 0) {
    const long long cpus = now ? node.freeCpuCount() : static_cast<long long>(node.cpus.size());
    fit = std::min(fit, cpus / cpusPerRank);
  }
  if (memoryPerRank > 0) {
    const int64_t memory = now ? std::max<int64_t>(0, node.memoryBytes - node.memoryUsed) : node.memoryBytes;
    fit = std::min<long long>(fit, memory / memoryPerRank);
  }
  return static_cast<int>(fit);
}

std::vector<int> cpusOfGpu(const std::vector<int>& gpus, const std::vector<int>& cpus, int gpu) {
  auto it = std::find(gpus.begin(), gpus.end(), gpu);
  if (it == gpus.end() || gpus.empty() || cpus.size() % gpus.size() != 0) return {};
  const size_t per = cpus.size() / gpus.size();
  const size_t at = static_cast<size_t>(it - gpus.begin()) * per;
  return {cpus.begin() + at, cpus.begin() + at + per};
}

std::vector<int> NodeAllocation::cpusOf(int gpu) const { return cpusOfGpu(gpus, cpus, gpu); }

const NodeAllocation* Allocation::find(const std::string& node) const {
  for (const NodeAllocation& a : nodes)
    if (a.node == node) return &a;
  return nullptr;
}

int Allocation::totalGpus() const {
  int n = 0;
  for (const NodeAllocation& a : nodes) n += static_cast<int>(a.gpus.size());
  return n;
}

std::string Allocation::str() const {
  std::string s;
  for (const NodeAllocation& a : nodes) {
    if (!s.empty()) s += ' ';
    s += a.node + "[";
    for (size_t i = 0; i < a.gpus.size(); ++i) s += (i ? "," : "") + std::to_string(a.gpus[i]);
    s += "]";
    if (!a.cpus.empty()) s += " cpus " + formatCpuList(a.cpus);
  }
  return s;
}

bool naturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) && std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ie = i, je = j;
      while (ie < a.size() && std::isdigit(static_cast<unsigned char>(a[ie]))) ++ie;
      while (je < b.size() && std::isdigit(static_cast<unsigned char>(b[je]))) ++je;
      size_t is = i, js = j;  // skip leading zeros, then the longer number is larger
      while (is + 1 < ie && a[is] == '0') ++is;
      while (js + 1 < je && b[js] == '0') ++js;
      if (ie - is != je - js) return ie - is < je - js;
      int c = a.compare(is, ie - is, b, js, je - js);
      if (c != 0) return c < 0;
      i = ie;
      j = je;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  if (a.size() - i != b.size() - j) return a.size() - i < b.size() - j;
  return a < b;  // "n01" vs "n1": any fixed order
}

void applyAllocation(Cluster& cluster, const Allocation& allocation) {
  for (const NodeAllocation& a : allocation.nodes) {
    // A broken invariant, not a user error: crash loudly, in release builds too.
    Node* node = cluster.find(a.node);
    if (!node) {
      std::fprintf(stderr, "ddl placement: allocation names node %s, which is not in the cluster\n",
                   a.node.c_str());
      std::abort();
    }
    if (node->used.size() < static_cast<size_t>(node->gpus)) node->used.resize(node->gpus, false);
    for (int g : a.gpus) {
      if (g < 0 || g >= node->gpus || node->used[g]) {
        std::fprintf(stderr, "ddl placement: allocation takes GPU %d of node %s, which is not free\n", g,
                     a.node.c_str());
        std::abort();
      }
      node->used[g] = true;
    }
    if (node->cpuUsed.size() < node->cpus.size()) node->cpuUsed.resize(node->cpus.size(), false);
    for (int c : a.cpus) {
      auto it = std::lower_bound(node->cpus.begin(), node->cpus.end(), c);
      const size_t i = static_cast<size_t>(it - node->cpus.begin());
      if (it == node->cpus.end() || *it != c || node->cpuUsed[i]) {
        std::fprintf(stderr, "ddl placement: allocation takes CPU %d of node %s, which is not free\n", c,
                     a.node.c_str());
        std::abort();
      }
      node->cpuUsed[i] = true;
    }
    node->memoryUsed += a.memoryBytes;
  }
}

void releaseAllocation(Cluster& cluster, const Allocation& allocation) {
  for (const NodeAllocation& a : allocation.nodes) {
    Node* node = cluster.find(a.node);
    if (!node) continue;  // a node that left the cluster gives nothing back
    for (int g : a.gpus) {
      if (g >= 0 && g < static_cast<int>(node->used.size())) node->used[g] = false;
    }
    for (int c : a.cpus) {
      auto it = std::lower_bound(node->cpus.begin(), node->cpus.end(), c);
      const size_t i = static_cast<size_t>(it - node->cpus.begin());
      if (it != node->cpus.end() && *it == c && i < node->cpuUsed.size()) node->cpuUsed[i] = 0;
    }
    node->memoryUsed = std::max<int64_t>(0, node->memoryUsed - a.memoryBytes);
  }
}

// ---- placement --------------------------------------------------------------------------------------------

namespace {

bool labelsMatch(const Node& node, const JobRequest& job) {
  for (const auto& [k, v] : job.requiredLabels)
    if (node.label(k) != v) return false;
  return true;
}

// Whether the node could ever hold its share of the job (ignoring its state and current use).
bool canEverHost(const Node& node, const JobRequest& job) {
  const int fit = job.ranksFitting(node, /*now=*/false);
  return labelsMatch(node, job) && (job.isShape() ? fit >= job.gpusPerNode : fit > 0);
}

std::string switchKey(const Node& node) {
  const std::string& s = node.label(kSwitchLabel);
  return s.empty() ? "node:" + node.name : s;
}

std::string rackKey(const Node& node) {
  const std::string& r = node.label(kRackLabel);
  if (!r.empty()) return r;
  const std::string& s = node.label(kSwitchLabel);
  return s.empty() ? "node:" + node.name : "switch:" + s;
}

// A node that can take part of the job now.
struct Candidate {
  const Node* node;
  int cap;       // units it offers: 1 (shape) or its free GPUs (total)
  int leftover;  // free GPUs it keeps if it takes a shape job's share
};

std::vector<Candidate> candidatesNow(const Cluster& cluster, const JobRequest& job) {
  std::vector<Candidate> out;
  for (const Node& n : cluster.nodes) {
    if (n.state != NodeState::kUp || !labelsMatch(n, job)) continue;
    const int free = job.ranksFitting(n, /*now=*/true);
    if (job.isShape()) {
      if (free >= job.gpusPerNode) out.push_back({&n, 1, free - job.gpusPerNode});
    } else if (free > 0) {
      out.push_back({&n, free, 0});
    }
  }
  // Name order makes every later tie deterministic (the nodes' own order where the cluster keeps them so).
  if (!cluster.byName) {
    std::sort(out.begin(), out.end(),
              [](const Candidate& a, const Candidate& b) { return naturalLess(a.node->name, b.node->name); });
  }
  return out;
}

int unitsNeeded(const JobRequest& job) { return job.isShape() ? job.nodes : job.totalGpus; }

long long capacityOf(const std::vector<Candidate>& cands) {
  long long c = 0;
  for (const Candidate& x : cands) c += x.cap;
  return c;
}

// Chooses groups to reach `need` units: the largest first (the fewest groups), then for the remainder the
// smallest group that covers it (best fit). Returns (group index, units taken from it). Requires sum(caps) >=
// need.
std::vector<std::pair<int, int>> chooseFewest(const std::vector<long long>& caps, int need) {
  std::vector<int> order(caps.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return caps[a] > caps[b]; });
  std::vector<std::pair<int, int>> chosen;
  long long remaining = need;
  for (size_t next = 0; remaining > 0 && next < order.size(); ++next) {
    // order[next..] is sorted by capacity, descending: the best fit is the last one that still covers the
    // rest, or among equal capacities the first (name order).
    size_t fit = order.size();
    for (size_t k = next; k < order.size() && caps[order[k]] >= remaining; ++k) fit = k;
    while (fit != order.size() && fit > next && caps[order[fit - 1]] == caps[order[fit]]) --fit;
    if (fit != order.size()) {
      chosen.push_back({order[fit], static_cast<int>(remaining)});
      return chosen;
    }
    chosen.push_back({order[next], static_cast<int>(caps[order[next]])});
    remaining -= caps[order[next]];
  }
  assert(remaining <= 0);
  return chosen;
}

using Picks = std::vector<std::pair<const Node*, int>>;  // node, GPUs it gives

void pickNodes(std::vector<Candidate> cands, int need, const JobRequest& job, Picks* out) {
  if (job.isShape()) {
    std::stable_sort(cands.begin(), cands.end(),
                     [](const Candidate& a, const Candidate& b) { return a.leftover < b.leftover; });
    for (int i = 0; i < need; ++i) out->push_back({cands[i].node, job.gpusPerNode});
    return;
  }
  std::vector<long long> caps;
  for (const Candidate& c : cands) caps.push_back(c.cap);
  for (auto [i, take] : chooseFewest(caps, need)) out->push_back({cands[i].node, take});
}

// Level 2 splits by rack, level 1 by switch, level 0 picks nodes.
void pickIn(const std::vector<Candidate>& cands, int need, int level, const JobRequest& job, Picks* out) {
  if (level == 0) return pickNodes(cands, need, job, out);
  std::map<std::string, std::vector<Candidate>> groups;
  for (const Candidate& c : cands) groups[level == 2 ? rackKey(*c.node) : switchKey(*c.node)].push_back(c);
  std::vector<std::pair<std::string, std::vector<Candidate>*>> keyed;
  for (auto& [key, members] : groups) keyed.push_back({key, &members});
  std::sort(keyed.begin(), keyed.end(),
            [](const auto& a, const auto& b) { return naturalLess(a.first, b.first); });
  std::vector<std::vector<Candidate>*> list;
  for (auto& [key, members] : keyed) list.push_back(members);
  std::vector<long long> caps;
  for (auto* members : list) caps.push_back(capacityOf(*members));
  for (auto [g, take] : chooseFewest(caps, need)) pickIn(*list[g], take, level - 1, job, out);
}

// The best subtree that holds `need` units at one grouping level (switch or rack), or false.
bool pickAtLevel(const std::vector<Candidate>& cands, int need, int level, const JobRequest& job,
                 Picks* out) {
  std::map<std::string, std::vector<Candidate>> groups;
  for (const Candidate& c : cands) groups[level == 2 ? rackKey(*c.node) : switchKey(*c.node)].push_back(c);
  // Best fit: the least capacity, then (shape jobs) the fewest spare GPUs on its nodes, then the name.
  const std::vector<Candidate>* best = nullptr;
  long long bestCap = 0, bestSpare = 0;
  std::string bestKey;
  for (const auto& [key, members] : groups) {
    const long long cap = capacityOf(members);
    if (cap < need) continue;
    long long spare = 0;
    for (const Candidate& c : members) spare += c.leftover;
    if (!best || cap < bestCap || (cap == bestCap && spare < bestSpare) ||
        (cap == bestCap && spare == bestSpare && naturalLess(key, bestKey))) {
      best = &members;
      bestCap = cap;
      bestSpare = spare;
      bestKey = key;
    }
  }
  if (!best) return false;
  pickIn(*best, need, level - 1, job, out);
  return true;
}

// The placement on the free GPUs of UP nodes, or an empty allocation when the job does not fit now.
Allocation placeNow(const Cluster& cluster, const JobRequest& job) {
  const std::vector<Candidate> cands = candidatesNow(cluster, job);
  const int need = unitsNeeded(job);
  if (need <= 0 || capacityOf(cands) < need) return {};
  Picks picks;
  const bool oneNode = job.isShape() ? job.nodes == 1 : false;
  if (oneNode || !job.isShape()) {
    // The lowest subtree is a single node: the best fit over the whole cluster. Below a node are its NVLink
    // islands and NUMA nodes (within_node.h): the best-fitting island first, then NUMA node, then node.
    const int count = job.isShape() ? job.gpusPerNode : need;
    const Candidate* best = nullptr;
    std::tuple<int, int, int> bestRank;
    for (const Candidate& c : cands) {
      const int spare = job.isShape() ? c.leftover : c.cap - need;
      if (spare < 0) continue;
      const GroupFit fit = groupFit(*c.node, count, spare);
      const std::tuple<int, int, int> rank{fit.island, fit.numa, spare};
      if (!best || rank < bestRank) {
        best = &c;
        bestRank = rank;
      }
    }
    if (best) picks.push_back({best->node, job.isShape() ? job.gpusPerNode : need});
  }
  if (picks.empty() && !pickAtLevel(cands, need, 1, job, &picks) &&
      !pickAtLevel(cands, need, 2, job, &picks)) {
    pickIn(cands, need, 2, job, &picks);
  }
  Allocation alloc;
  for (auto [node, count] : picks) {
    WithinNode within = pickWithinNode(*node, count, job.cpusPerRank);
    alloc.nodes.push_back(
        {node->name, std::move(within.gpus), std::move(within.cpus), job.memoryPerRank * count});
  }
  std::sort(alloc.nodes.begin(), alloc.nodes.end(),
            [](const NodeAllocation& a, const NodeAllocation& b) { return naturalLess(a.node, b.node); });
  assert(alloc.totalGpus() == job.gpuCount());
  return alloc;
}

std::string validateRequest(const JobRequest& job) {
  const std::string who = "job " + job.id + ": ";
  const bool shape = job.nodes > 0 && job.gpusPerNode > 0 && job.totalGpus == 0;
  const bool total = job.totalGpus > 0 && job.nodes == 0 && job.gpusPerNode == 0;
  if (!shape && !total) {
    return who +
           "ask for either nodes x gpus_per_node (both at least 1) or total_gpus (at least 1), not both"
           " (got nodes=" +
           std::to_string(job.nodes) + ", gpus_per_node=" + std::to_string(job.gpusPerNode) +
           ", total_gpus=" + std::to_string(job.totalGpus) + ")";
  }
  if (shape && static_cast<long long>(job.nodes) * job.gpusPerNode > (1 << 24)) {
    return who + "asks for more than " + std::to_string(1 << 24) + " GPUs";
  }
  if (job.cpusPerRank < 0 || job.memoryPerRank < 0)
    return who + "asks for a negative number of CPUs or bytes";
  return "";
}

// The names of the nodes in `state` that could host the job.
std::vector<std::string> hostsIn(const Cluster& cluster, const JobRequest& job, NodeState state) {
  std::vector<std::string> names;
  for (const Node& n : cluster.nodes)
    if (n.state == state && canEverHost(n, job)) names.push_back(n.name);
  std::sort(names.begin(), names.end(), naturalLess);
  return names;
}

// Units the job could get from nodes in `state` that can host it, if they were idle.
long long unitsIn(const Cluster& cluster, const JobRequest& job, NodeState state) {
  long long units = 0;
  for (const Node& n : cluster.nodes)
    if (n.state == state && canEverHost(n, job)) units += job.isShape() ? 1 : job.ranksFitting(n, false);
  return units;
}

std::string downNote(const Cluster& cluster, const JobRequest& job) {
  const long long down = unitsIn(cluster, job, NodeState::kDown);
  if (down == 0) return "";
  return " (" +
         plural(down, job.isShape() ? "more such node is" : "more GPU is",
                job.isShape() ? "more such nodes are" : "more GPUs are") +
         " DOWN)";
}

// The "ask for nodes that have label X" part of an infeasibility message, or "".
std::string labelProblem(const Cluster& cluster, const JobRequest& job) {
  const std::string who = "job " + job.id + " ";
  auto live = [](const Node& n) { return n.state != NodeState::kDown; };
  for (const auto& [k, v] : job.requiredLabels) {
    bool any = false;
    std::vector<std::string> seen, downWith;
    for (const Node& n : cluster.nodes) {
      const std::string& value = n.label(k);
      if (value == v) {
        if (live(n))
          any = true;
        else
          downWith.push_back(n.name);
      }
      if (!value.empty() && value != v && std::find(seen.begin(), seen.end(), value) == seen.end())
        seen.push_back(value);
    }
    if (any) continue;
    std::string s = who + "requires label " + k + "=" + v + " but no UP or DRAINING node has it";
    if (!downWith.empty()) {
      std::sort(downWith.begin(), downWith.end(), naturalLess);
      s += " (only DOWN nodes do: " + nameList(downWith) + ")";
    } else if (!seen.empty()) {
      std::sort(seen.begin(), seen.end(), naturalLess);
      s += " (values of '" + k + "' in the cluster: " + nameList(seen) + ")";
    } else {
      s += " (no node has a '" + k + "' label at all)";
    }
    return s;
  }
  if (job.requiredLabels.size() > 1) {
    bool any = false;
    for (const Node& n : cluster.nodes) any |= live(n) && labelsMatch(n, job);
    if (!any)
      return who + "requires labels " + labelsText(job.requiredLabels) +
             " together, and no UP or DRAINING node has all of them";
  }
  return "";
}

// Whether the job could fit if every known node, DOWN ones included, were UP and idle.
bool fitsCountingDown(const Cluster& cluster, const JobRequest& job) {
  if (!validateRequest(job).empty()) return false;
  std::vector<int> dims;
  if (!job.topology.empty() && !parseTopologyOverride(job.topology, job.gpuCount(), &dims).empty())
    return false;
  long long units = 0;
  for (const Node& n : cluster.nodes)
    if (canEverHost(n, job)) units += job.isShape() ? 1 : job.ranksFitting(n, false);
  return units >= unitsNeeded(job);
}

// For a job that asks for CPUs or memory: what the biggest node offers, so that the user sees which of the
// three falls short. "the largest UP or DRAINING node (n1) has 8 GPUs, 64 CPUs and 512 GiB".
std::string largestText(const Cluster& cluster, const JobRequest& job) {
  const Node* best = nullptr;
  for (const Node& n : cluster.nodes) {
    if (n.state == NodeState::kDown || !labelsMatch(n, job)) continue;
    if (!best || job.ranksFitting(n, false) > job.ranksFitting(*best, false) ||
        (job.ranksFitting(n, false) == job.ranksFitting(*best, false) && n.gpus > best->gpus))
      best = &n;
  }
  if (!best) return "no UP or DRAINING node carries its labels";
  return "the largest UP or DRAINING node (" + best->name + ") has " + plural(best->gpus, "GPU", "GPUs") +
         ", " + plural(static_cast<long long>(best->cpus.size()), "CPU", "CPUs") + " and " +
         formatBytes(best->memoryBytes) + " for ranks";
}

}  // namespace

// The verdict for a job already in the queue: checkFeasible's reason, unless the job only lacks nodes that
// are DOWN now; such a job stays pending (nodes come back after a reboot) and pendingReason names them.
std::string neverFits(const Cluster& cluster, const JobRequest& job) {
  std::string never = checkFeasible(cluster, job);
  return never.empty() || fitsCountingDown(cluster, job) ? "" : never;
}

std::string checkFeasible(const Cluster& cluster, const JobRequest& job) {
  if (std::string bad = validateRequest(job); !bad.empty()) return bad;
  const std::string who = "job " + job.id + " ";
  if (!job.topology.empty()) {
    std::vector<int> dims;
    if (std::string bad = parseTopologyOverride(job.topology, job.gpuCount(), &dims); !bad.empty())
      return who + bad;
  }
  if (std::string bad = labelProblem(cluster, job); !bad.empty()) return bad;
  const std::string with = job.requiredLabels.empty() ? "" : " with " + labelsText(job.requiredLabels);
  const long long have = unitsIn(cluster, job, NodeState::kUp) + unitsIn(cluster, job, NodeState::kDraining);
  if (job.isShape()) {
    if (have == 0) {
      if (!perRankText(job).empty())
        return who + "asks for " + plural(job.gpusPerNode, "GPU", "GPUs") + perRankText(job) +
               " per node but " + largestText(cluster, job) + downNote(cluster, job);
      int largest = 0;
      for (const Node& n : cluster.nodes)
        if (n.state != NodeState::kDown && labelsMatch(n, job)) largest = std::max(largest, n.gpus);
      return who + "asks for " + plural(job.gpusPerNode, "GPU", "GPUs") +
             " per node but the largest UP or DRAINING node" + with + " has " + std::to_string(largest) +
             downNote(cluster, job);
    }
    if (have < job.nodes) {
      return who + "asks for " + job.describe() + " but the cluster has only " +
             plural(have, "UP or DRAINING node", "UP or DRAINING nodes") + with + " with at least " +
             plural(job.gpusPerNode, "GPU", "GPUs") +
             (perRankCore(job).empty() ? "" : " and " + perRankCore(job) + " for each") +
             downNote(cluster, job);
    }
  } else if (have < job.totalGpus) {
    if (!perRankText(job).empty())
      return who + "asks for " + job.describe() + " but the UP and DRAINING nodes" + with +
             " can hold only " + plural(have, "such rank", "such ranks") + " in all (" +
             largestText(cluster, job) + ")" + downNote(cluster, job);
    return who + "asks for " + job.describe() + " but the UP and DRAINING nodes" + with + " have only " +
           plural(have, "GPU", "GPUs") + " in all" + downNote(cluster, job);
  }
  return "";
}

std::string pendingReason(const Cluster& cluster, const JobRequest& job) {
  if (std::string never = neverFits(cluster, job); !never.empty()) return never;
  const long long need = unitsNeeded(job);
  const long long freeNow = capacityOf(candidatesNow(cluster, job));
  const long long up = unitsIn(cluster, job, NodeState::kUp);
  const std::string with = job.requiredLabels.empty() ? "" : " with " + labelsText(job.requiredLabels);
  if (up >= need) {
    // Enough UP hardware: it waits for running jobs to end.
    if (job.isShape()) {
      return "waiting for " + plural(job.nodes, "node", "nodes") + with + " with " +
             plural(job.gpusPerNode, "free GPU", "free GPUs") + (job.nodes == 1 ? "" : " each") +
             (perRankCore(job).empty() ? "" : " (and " + perRankCore(job) + " per GPU)") + ": " +
             std::to_string(freeNow) + " of the " + plural(up, "eligible UP node", "eligible UP nodes") +
             (freeNow == 1 ? " has" : " have") + " them now, the others are running jobs";
    }
    if (!perRankText(job).empty())
      return "waiting for " + plural(job.totalGpus, "GPU", "GPUs") + perRankText(job) + with +
             ": the eligible UP nodes could hold " + std::to_string(up) + " such ranks and have room for " +
             std::to_string(freeNow) + " now, the rest is held by running jobs";
    return "waiting for " + plural(job.totalGpus, "GPU", "GPUs") + with + ": " + std::to_string(freeNow) +
           " of the " + plural(up, "eligible UP GPU", "eligible UP GPUs") + (freeNow == 1 ? " is" : " are") +
           " free now, the others are running jobs";
  }
  // Not enough UP hardware: it waits for nodes to come back.
  const std::vector<std::string> draining = hostsIn(cluster, job, NodeState::kDraining);
  const std::vector<std::string> down = hostsIn(cluster, job, NodeState::kDown);
  std::string who;
  if (!draining.empty()) who = (draining.size() == 1 ? "node " : "nodes ") + nameList(draining) + " draining";
  if (!down.empty())
    who += (who.empty() ? (down.size() == 1 ? "node " : "nodes ") : " and ") + nameList(down) + " DOWN";
  const std::string unit = job.isShape() ? "UP node" : "UP GPU";
  return who + ": needs " + job.describe() + " and only " + plural(up, unit.c_str(), (unit + "s").c_str()) +
         (up == 1 ? " qualifies" : " qualify");
}

PlacementResult place(const Cluster& cluster, const JobRequest& job) {
  if (std::string never = neverFits(cluster, job); !never.empty()) return PlacementResult::infeasible(never);
  Allocation alloc = placeNow(cluster, job);
  if (!alloc.empty()) return PlacementResult::success(std::move(alloc));
  return PlacementResult::pending(pendingReason(cluster, job));
}

// ---- schedule ---------------------------------------------------------------------------------------------

const Decision* ScheduleResult::find(const std::string& jobId) const {
  for (const Decision& d : decisions)
    if (d.jobId == jobId) return &d;
  return nullptr;
}

std::vector<std::string> ScheduleResult::started() const {
  std::vector<std::string> ids;
  for (const Decision& d : decisions)
    if (d.action == Decision::Action::kStart) ids.push_back(d.jobId);
  return ids;
}

namespace {

// The cluster as backfill jobs see it while `head` waits: the rule at the top of this file.
// CPUs and memory follow the GPUs' rule: a shape head's share on a node that can give it now (GPUs, CPUs and
// memory together), otherwise everything free that the head would use, so no backfill job can take what
// might be the piece it lacks.
Cluster reserveFor(const Cluster& cluster, const JobRequest& head) {
  Cluster view = cluster;
  for (Node& n : view.nodes) {
    if (n.state != NodeState::kUp || !canEverHost(n, head)) continue;
    const bool share = head.isShape() && head.ranksFitting(n, /*now=*/true) >= head.gpusPerNode;
    // A share: the very GPUs and CPUs the head would take there now (its island, its NUMA node's CPUs);
    // without a topology that is the lowest free ids, taken here without building the pick.
    n.used.resize(n.gpus, false);
    if (share && n.topology) {
      const WithinNode headsShare = pickWithinNode(n, head.gpusPerNode, head.cpusPerRank);
      for (int g : headsShare.gpus) n.used[g] = true;
      if (head.cpusPerRank > 0) {
        n.cpuUsed.resize(n.cpus.size(), false);
        for (size_t i = 0; i < n.cpus.size(); ++i)
          if (std::find(headsShare.cpus.begin(), headsShare.cpus.end(), n.cpus[i]) != headsShare.cpus.end())
            n.cpuUsed[i] = true;
      }
    } else {
      int reserve = share ? head.gpusPerNode : n.gpus;
      for (int g = 0; g < n.gpus && reserve > 0; ++g) {
        if (!n.used[g]) {
          n.used[g] = true;
          --reserve;
        }
      }
      if (head.cpusPerRank > 0) {
        size_t cpus = share ? static_cast<size_t>(head.gpusPerNode) * head.cpusPerRank : n.cpus.size();
        n.cpuUsed.resize(n.cpus.size(), false);
        for (size_t i = 0; i < n.cpus.size() && cpus > 0; ++i) {
          if (!n.cpuUsed[i]) {
            n.cpuUsed[i] = true;
            --cpus;
          }
        }
      }
    }
    if (head.memoryPerRank > 0) {
      const int64_t free_memory = std::max<int64_t>(0, n.memoryBytes - n.memoryUsed);
      n.memoryUsed += share ? std::min(free_memory, head.memoryPerRank * head.gpusPerNode) : free_memory;
    }
  }
  return view;
}

// A job's priority as people read it: the fair-share order where it was set, else --priority.
std::string priorityText(const JobRequest& job) {
  if (job.order == 0) return std::to_string(job.priority);
  char text[32];
  std::snprintf(text, sizeof(text), "%.0f", job.order);
  return text;
}

}  // namespace

std::string requestKey(const JobRequest& job) {
  std::string key = std::to_string(job.nodes) + "x" + std::to_string(job.gpusPerNode) + "/" +
                    std::to_string(job.totalGpus) + "/" + std::to_string(job.cpusPerRank) + "/" +
                    std::to_string(job.memoryPerRank) + "/" + job.topology;
  for (const auto& [k, v] : job.requiredLabels) key += "\n" + k + "=" + v;
  return key;
}

ScheduleResult schedule(const Cluster& cluster, const std::vector<JobRequest>& queue, LimitTracker* limits) {
  std::vector<const JobRequest*> order;
  for (const JobRequest& j : queue) order.push_back(&j);
  std::stable_sort(order.begin(), order.end(), [](const JobRequest* a, const JobRequest* b) {
    if (a->tier != b->tier) return a->tier > b->tier;
    if (a->order != b->order) return a->order > b->order;
    if (a->priority != b->priority) return a->priority > b->priority;
    if (a->submitSeq != b->submitSeq) return a->submitSeq < b->submitSeq;
    return a->id < b->id;
  });

  ScheduleResult result;
  Cluster work = cluster;  // free GPUs as the pass starts jobs
  if (!work.byName) {
    std::sort(work.nodes.begin(), work.nodes.end(),
              [](const Node& a, const Node& b) { return naturalLess(a.name, b.name); });
    work.byName = true;
  }
  Cluster view;            // `work` minus the GPUs reserved for the head, once there is one
  const JobRequest* head = nullptr;
  // Memos, by requestKey. Placement is a function of the request and the cluster, and a start only takes
  // GPUs away: a request that could not start cannot start later in the pass either (until the head is
  // chosen, which changes the cluster it is tried in), so a queue of thousands of jobs asking for a few
  // shapes costs a few placements, not one per job. Why it waits is said as of the last start (the counts in
  // it change). Feasibility ignores what is in use, so a feasible request stays feasible for the whole pass.
  std::set<std::string> feasible;
  std::set<std::string> failed;              // requests that cannot start in this phase
  std::map<std::string, std::string> waits;  // request -> why it cannot start; cleared at every start
  auto why = [&](const JobRequest& job) {
    if (!head) return pendingReason(work, job);
    if (!placeNow(work, job).empty()) {
      return "waiting behind job " + head->id + " (priority " + priorityText(*head) +
             "): it would fit now, but only on GPUs that job " + head->id + " needs to start";
    }
    return pendingReason(work, job);
  };
  for (const JobRequest* job : order) {
    Decision d;
    d.jobId = job->id;
    const std::string key = requestKey(*job);
    if (!feasible.count(key)) {
      if (std::string never = neverFits(work, *job); !never.empty()) {
        d.action = Decision::Action::kRefused;
        d.reason = never;
        result.decisions.push_back(std::move(d));
        continue;
      }
      feasible.insert(key);
    }
    if (limits) {
      if (std::string over = limits->blocks(*job, &d.code); !over.empty()) {
        d.reason = over;  // waits for its own account or user, holding nobody else back
        result.decisions.push_back(std::move(d));
        continue;
      }
    }
    if (failed.count(key)) {
      auto known = waits.find(key);
      d.reason = known != waits.end() ? known->second : (waits[key] = why(*job));
      d.code = head ? "Priority" : "ReqNodeNotAvail";
    } else if (!head) {
      d.allocation = placeNow(work, *job);
      if (!d.allocation.empty()) {
        d.action = Decision::Action::kStart;
        applyAllocation(work, d.allocation);
        if (limits) limits->hold(job->account, job->user, job->gpuCount(), job->qos);
        waits.clear();
      } else {
        d.reason = pendingReason(work, *job);
        d.code = "ReqNodeNotAvail";
        // It becomes the head only if it waits for running jobs, not for nodes to come back.
        if (unitsIn(work, *job, NodeState::kUp) >= unitsNeeded(*job)) {
          d.code = "Resources";
          head = job;
          result.headJob = job->id;
          view = reserveFor(work, *job);
          failed.clear();  // from here on a request is tried in the view
          waits.clear();
        } else {
          failed.insert(key);
          waits[key] = d.reason;
        }
      }
    } else {
      d.allocation = placeNow(view, *job);
      if (!d.allocation.empty()) {
        d.action = Decision::Action::kStart;
        d.backfilled = true;
        applyAllocation(work, d.allocation);
        applyAllocation(view, d.allocation);
        if (limits) limits->hold(job->account, job->user, job->gpuCount(), job->qos);
        waits.clear();
      } else {
        d.reason = why(*job);
        d.code = "Priority";
        failed.insert(key);
        waits[key] = d.reason;
      }
    }
    result.decisions.push_back(std::move(d));
  }
  return result;
}

std::vector<std::string> chooseVictims(const Cluster& cluster, const JobRequest& job,
                                       std::vector<Preemptible> candidates) {
  if (candidates.empty() || !neverFits(cluster, job).empty()) return {};
  std::stable_sort(candidates.begin(), candidates.end(), [](const Preemptible& a, const Preemptible& b) {
    if (a.qosPriority != b.qosPriority) return a.qosPriority < b.qosPriority;
    return a.startedMs > b.startedMs;  // the youngest loses the least work
  });
  Cluster freed = cluster;
  if (!freed.byName) {
    std::sort(freed.nodes.begin(), freed.nodes.end(),
              [](const Node& a, const Node& b) { return naturalLess(a.name, b.name); });
    freed.byName = true;
  }
  // Only what the cluster's nodes have can be freed: an allocation of an agent that came back with fewer GPUs
  // or other CPUs gives back what is still there.
  for (Preemptible& c : candidates) {
    std::erase_if(c.allocation.nodes, [&](const NodeAllocation& a) { return freed.find(a.node) == nullptr; });
    for (NodeAllocation& a : c.allocation.nodes) {
      const Node* node = freed.find(a.node);
      std::erase_if(a.gpus, [&](int g) { return g < 0 || g >= node->gpus; });
      std::erase_if(a.cpus,
                    [&](int cpu) { return !std::binary_search(node->cpus.begin(), node->cpus.end(), cpu); });
    }
  }
  const Cluster before = freed;
  std::vector<const Preemptible*> chosen;
  bool fits = false;
  for (const Preemptible& c : candidates) {
    releaseAllocation(freed, c.allocation);
    chosen.push_back(&c);
    if (!placeNow(freed, job).empty()) {
      fits = true;
      break;
    }
  }
  if (!fits) return {};
  // Spares every victim the job can start without, the one chosen last (the most valuable) first: the cluster
  // with the others freed, built again from the one before (nothing is marked used twice).
  for (size_t i = chosen.size(); i-- > 0 && chosen.size() > 1;) {
    Cluster without = before;
    for (size_t k = 0; k < chosen.size(); ++k) {
      if (k != i) releaseAllocation(without, chosen[k]->allocation);
    }
    if (!placeNow(without, job).empty()) chosen.erase(chosen.begin() + static_cast<std::ptrdiff_t>(i));
  }
  std::vector<std::string> ids;
  for (const Preemptible* c : chosen) ids.push_back(c->id);
  return ids;
}

}  // namespace ddl::placement
