// placement_bench: how long placement and scheduling take on a large cluster snapshot. Prints figures (and
// writes them as JSON with --json FILE); it asserts nothing.
//
// Snapshot: 1,000 nodes (--nodes) x 4 GPUs under 32 switches, 4 switches per rack, built from a
// fixed-seed RNG: about 30% of nodes have 1-4 GPUs in use, 2% are DRAINING, 1% DOWN.
// Figures: place() of a 256-GPU job (64 nodes x 4 GPUs, and 256 GPUs as a total), checkFeasible(), ring
// layout build + validate for the placed job, each over --runs runs (median, p99, max); and schedule() of a
// queue of 1,000 pending jobs of mixed shapes and priorities over --queue-runs runs; and a whole fair-share
// pass, prioritize() then schedule(), of --fair-jobs (10,000) pending jobs from 1,000 users in 100 accounts
// (10 groups of 10 under root, random shares and usage), as the coordinator runs it.
//
// With --cpus-per-rank C every node also offers 64 CPUs and 512 GiB (a busy GPU holds C of them and 16 GiB),
// and every job asks for C CPUs and 16 GiB per rank: the cost of placing CPUs and memory as well.
//
// With --node-topology s822lc every node reports the topology of a Power S822LC (two NVLink pairs, one per
// NUMA node): the cost of placing by islands and NUMA nodes (placement/within_node.h). It also prints the
// fragmentation figures: a random workload (within_node.h's runWorkload: 3,000 arrivals and departures, 5
// seeds, three quarters of the GPUs held) on 64 s822lc and 64 dgx-h100 nodes, placed by the topology and by
// the lowest ids: the jobs split across more NVLink islands (NUMA nodes) than they need, and the groups left
// partly held on average after each event.
//
// Usage: placement_bench [--nodes N] [--runs N] [--queue-runs N] [--fair-jobs N] [--seed S] [--cpus-per-rank
// C]
//                        [--node-topology s822lc] [--json FILE]
//        (--nodes: 1000)
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "placement/fair_share.h"
#include "placement/placement.h"
#include "placement/ring_layout.h"
#include "placement/within_node.h"

using namespace ddl::placement;

namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// A node's insides as its agent's --virtual-topology reports them (worker/topology.cpp), with `cpus` CPUs
// split between its two NUMA nodes (none: no CPU's node).
std::shared_ptr<const NodeTopology> topologyOf(const std::string& kind, int cpus) {
  auto t = std::make_shared<NodeTopology>();
  if (kind == "s822lc") {
    t->gpuIsland = {0, 0, 2, 2};
    t->gpuNuma = {0, 0, 1, 1};
  } else {  // dgx-h100
    t->gpuIsland.assign(8, 0);
    t->gpuNuma = {0, 0, 0, 0, 1, 1, 1, 1};
  }
  for (int c = 0; c < cpus; ++c) t->cpuNuma.push_back(c * 2 / cpus);
  return t;
}

Cluster makeCluster(uint32_t seed, int nodes, int cpusPerRank, bool s822lc) {
  const std::shared_ptr<const NodeTopology> topology =
      s822lc ? topologyOf("s822lc", cpusPerRank > 0 ? 64 : 0) : nullptr;
  std::mt19937 rng(seed);
  Cluster c;
  for (int i = 0; i < nodes; ++i) {
    Node n;
    n.name = "n" + std::to_string(i + 1);
    n.gpus = 4;
    n.used.assign(4, false);
    n.topology = topology;
    const int sw = i * 32 / nodes;  // 32 switches of nodes/32 consecutive nodes
    n.labels[kSwitchLabel] = "s" + std::to_string(sw + 1);
    n.labels[kRackLabel] = "r" + std::to_string(sw / 4 + 1);
    const int roll = rng() % 100;
    if (roll < 30) {
      const int busy = 1 + rng() % 4;
      for (int g = 0; g < busy; ++g) n.used[g] = true;
      if (cpusPerRank > 0) {
        n.cpuUsed.assign(64, false);
        for (int c = 0; c < busy * cpusPerRank && c < 64; ++c) n.cpuUsed[c] = true;
        n.memoryUsed = busy * 16 * kGiB;
      }
    } else if (roll < 32) {
      n.state = NodeState::kDraining;
    } else if (roll < 33) {
      n.state = NodeState::kDown;
    }
    if (cpusPerRank > 0) {
      for (int cpu = 0; cpu < 64; ++cpu) n.cpus.push_back(cpu);
      n.memoryBytes = 512 * kGiB;
    }
    c.nodes.push_back(std::move(n));
  }
  return c;
}

std::vector<JobRequest> makeQueue(uint32_t seed, int count, int cpusPerRank) {
  std::mt19937 rng(seed + 1);
  std::vector<JobRequest> q;
  for (int i = 0; i < count; ++i) {
    JobRequest j;
    j.id = "job" + std::to_string(i);
    j.priority = rng() % 4;
    j.submitSeq = i;
    if (rng() % 4 == 0) {
      j.totalGpus = 1 + rng() % 32;
    } else {
      static const int kNodes[] = {1, 1, 1, 2, 2, 4, 8, 16, 32, 64};
      j.nodes = kNodes[rng() % 10];
      j.gpusPerNode = 1 + rng() % 4;
    }
    if (cpusPerRank > 0) {
      j.cpusPerRank = cpusPerRank;
      j.memoryPerRank = 16 * kGiB;
    }
    q.push_back(std::move(j));
  }
  return q;
}

// Keeps the optimiser from dropping the timed calls.
void keep(size_t value) {
  static volatile size_t sink;
  sink = sink + value;
}

struct Stats {
  std::string name;
  int runs = 0;
  double median = 0, p99 = 0, max = 0;  // microseconds
};

Stats timeIt(const std::string& name, int runs, const std::function<void()>& f) {
  std::vector<double> us;
  f();  // warm-up
  for (int i = 0; i < runs; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  Stats s{name, runs, us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)], us.back()};
  std::printf("%-44s runs %5d   median %10.1f us   p99 %10.1f us   max %10.1f us\n", name.c_str(), runs,
              s.median, s.p99, s.max);
  return s;
}

}  // namespace

struct Args {
  int runs = 100, queueRuns = 10, nodes = 1000, cpusPerRank = 0, fairJobs = 10000;
  bool s822lc = false;  // --node-topology s822lc
  uint32_t seed = 42;
  const char* jsonPath = nullptr;
};

// The command line; exits with 2 on a mistake.
Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "placement_bench: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--runs"))
      a.runs = std::max(1, std::atoi(value()));
    else if (!std::strcmp(argv[i], "--queue-runs"))
      a.queueRuns = std::max(1, std::atoi(value()));
    else if (!std::strcmp(argv[i], "--fair-jobs"))
      a.fairJobs = std::max(1, std::atoi(value()));
    else if (!std::strcmp(argv[i], "--seed"))
      a.seed = static_cast<uint32_t>(std::strtoul(value(), nullptr, 10));
    else if (!std::strcmp(argv[i], "--nodes"))
      a.nodes = std::clamp(std::atoi(value()), 64, 100000);
    else if (!std::strcmp(argv[i], "--json"))
      a.jsonPath = value();
    else if (!std::strcmp(argv[i], "--cpus-per-rank"))
      a.cpusPerRank = std::clamp(std::atoi(value()), 0, 16);
    else if (!std::strcmp(argv[i], "--node-topology") && !std::strcmp(value(), "s822lc"))
      a.s822lc = true;
    else {
      std::fprintf(
          stderr,
          "usage: placement_bench [--nodes N] [--runs N] [--queue-runs N] [--fair-jobs N] [--seed S] "
          "[--cpus-per-rank C] [--node-topology s822lc] [--json FILE]\n");
      std::exit(2);
    }
  }
  return a;
}

int main(int argc, char** argv) {
  const Args args = parseArgs(argc, argv);
  const int runs = args.runs, queueRuns = args.queueRuns, nodes = args.nodes, cpusPerRank = args.cpusPerRank;
  const uint32_t seed = args.seed;
  const char* jsonPath = args.jsonPath;
  const Cluster cluster = makeCluster(seed, nodes, cpusPerRank, args.s822lc);
  int up = 0, draining = 0, down = 0, freeGpus = 0, wholeFree = 0;
  for (const Node& n : cluster.nodes) {
    up += n.state == NodeState::kUp;
    draining += n.state == NodeState::kDraining;
    down += n.state == NodeState::kDown;
    if (n.state == NodeState::kUp) {
      freeGpus += n.freeGpus();
      wholeFree += n.freeGpus() == n.gpus;
    }
  }
  std::printf(
      "snapshot: %d nodes x 4 GPUs, 32 switches, 8 racks, seed %u: %d UP (%d fully free, %d free GPUs), "
      "%d DRAINING, %d DOWN%s\n",
      nodes, seed, up, wholeFree, freeGpus, draining, down,
      args.s822lc ? "; every node an S822LC (2 NVLink pairs on 2 NUMA nodes)" : "");

  JobRequest shape;
  shape.id = "big";
  shape.nodes = 64;
  shape.gpusPerNode = 4;
  JobRequest total;
  total.id = "big-total";
  total.totalGpus = 256;
  if (cpusPerRank > 0) {
    std::printf("every node offers 64 CPUs and 512 GiB; every job asks for %d CPUs and 16 GiB per rank\n",
                cpusPerRank);
    for (JobRequest* j : {&shape, &total}) {
      j->cpusPerRank = cpusPerRank;
      j->memoryPerRank = 16 * kGiB;
    }
  }

  PlacementResult placed = place(cluster, shape);
  if (!placed.ok()) {
    std::fprintf(stderr, "placement_bench: the 256-GPU job did not place: %s\n", placed.reason().c_str());
    return 1;
  }
  RingLayout layout;
  if (std::string err = buildRingLayout(placed.allocation(), cluster, "", &layout); !err.empty()) {
    std::fprintf(stderr, "placement_bench: ring layout failed: %s\n", err.c_str());
    return 1;
  }
  std::printf("64x4 job placed on %zu nodes, DDL_TOPOLOGY=%s (%s)\n", placed.allocation().nodes.size(),
              layout.topology().c_str(), layout.why.c_str());

  std::vector<Stats> stats;
  stats.push_back(timeIt("place 64 nodes x 4 GPUs", runs,
                         [&] { keep(place(cluster, shape).allocation().nodes.size()); }));
  stats.push_back(
      timeIt("place 256 GPUs (total)", runs, [&] { keep(place(cluster, total).allocation().nodes.size()); }));
  stats.push_back(timeIt("checkFeasible 64 x 4", runs, [&] { keep(checkFeasible(cluster, shape).size()); }));
  stats.push_back(timeIt("ring layout build + validate (256 ranks)", runs, [&] {
    RingLayout l;
    buildRingLayout(placed.allocation(), cluster, "", &l);
    keep(validateRingLayout(l).size());
  }));

  const std::vector<JobRequest> queue = makeQueue(seed, 1000, cpusPerRank);
  ScheduleResult first = schedule(cluster, queue);
  int started = 0, backfilled = 0, refused = 0;
  for (const Decision& d : first.decisions) {
    started += d.action == Decision::Action::kStart;
    backfilled += d.backfilled;
    refused += d.action == Decision::Action::kRefused;
  }
  std::printf("schedule of 1000 queued jobs: %d start (%d by backfill), %d refused, %d pending, head %s\n",
              started, backfilled, refused, 1000 - started - refused,
              first.headJob.empty() ? "-" : first.headJob.c_str());
  stats.push_back(timeIt("schedule 1000 pending jobs", queueRuns,
                         [&] { keep(schedule(cluster, queue).decisions.size()); }));

  // The fair-share pass: 100 accounts in 10 groups, 1,000 users, each with decayed usage; the queue's jobs
  // spread over the users.
  std::mt19937 fairRng(seed + 1);
  ShareTree tree;
  UsageLedger usage;
  for (int g = 0; g < 10; ++g)
    tree.accounts["g" + std::to_string(g)] = {kRootAccount, 1 + int64_t(fairRng() % 5)};
  for (int a = 0; a < 100; ++a) {
    tree.accounts["a" + std::to_string(a)] = {"g" + std::to_string(a / 10), 1 + int64_t(fairRng() % 10)};
  }
  for (int u = 0; u < 1000; ++u) {
    usage.charge("a" + std::to_string(u / 10), "u" + std::to_string(u), double(fairRng() % 100000));
  }
  std::vector<JobRequest> fairQueue = makeQueue(seed + 2, args.fairJobs, cpusPerRank);
  for (size_t i = 0; i < fairQueue.size(); ++i) {
    const int u = static_cast<int>(fairRng() % 1000);
    fairQueue[i].user = "u" + std::to_string(u);
    fairQueue[i].account = "a" + std::to_string(u / 10);
    fairQueue[i].submitMs = int64_t(i) * 1000;
  }
  const int64_t fairNow = int64_t(fairQueue.size()) * 1000;
  stats.push_back(
      timeIt("fair-share pass " + std::to_string(fairQueue.size()) + " jobs (1000 users)", queueRuns, [&] {
        std::vector<JobRequest> q = fairQueue;
        prioritize(q, tree, usage, PriorityWeights{}, fairNow);
        keep(schedule(cluster, q).decisions.size());
      }));
  stats.push_back(timeIt("  of which prioritize()", queueRuns, [&] {
    std::vector<JobRequest> q = fairQueue;
    prioritize(q, tree, usage, PriorityWeights{}, fairNow);
    keep(q.size());
  }));

  // Fragmentation: the same random workloads placed by the topology and by the lowest ids.
  struct Fragmentation {
    std::string kind;
    double aware = 0, lowest = 0;         // broken groups per node after an event, on average
    int splitAware = 0, splitLowest = 0;  // jobs split across more groups than they need
    int violations = 0;
  };
  std::vector<Fragmentation> fragmentation;
  if (args.s822lc) {
    for (const char* kind : {"s822lc", "dgx-h100"}) {
      Cluster small;
      for (int i = 0; i < 64; ++i) {
        Node n;
        n.name = "n" + std::to_string(i);
        n.topology = topologyOf(kind, 0);
        n.gpus = static_cast<int>(n.topology->gpuIsland.size());
        small.nodes.push_back(std::move(n));
      }
      Fragmentation f{kind};
      long aware = 0, lowest = 0;
      for (uint32_t s = 1; s <= 5; ++s) {
        const WorkloadRun a = runWorkload(small, s, 3000, false), l = runWorkload(small, s, 3000, true);
        // s822lc: its islands are its NUMA nodes; dgx-h100: one island, so its NUMA nodes are what breaks.
        aware += std::string(kind) == "s822lc" ? a.brokenIslands : a.brokenNuma;
        lowest += std::string(kind) == "s822lc" ? l.brokenIslands : l.brokenNuma;
        f.violations += a.violations;
        f.splitAware += a.splitJobs;
        f.splitLowest += l.splitJobs;
      }
      f.aware = double(aware) / (5.0 * 3000 * 64);
      f.lowest = double(lowest) / (5.0 * 3000 * 64);
      std::printf(
          "fragmentation on 64 %s nodes, 5 x 3000 events: jobs split across %s: %d by the topology, %d "
          "by the lowest ids; %s partly held per node: %.3f and %.3f; %d jobs that fitted one group and "
          "did not get one\n",
          kind, std::string(kind) == "s822lc" ? "NVLink islands" : "NUMA nodes", f.splitAware, f.splitLowest,
          std::string(kind) == "s822lc" ? "islands" : "NUMA nodes", f.aware, f.lowest, f.violations);
      fragmentation.push_back(f);
    }
  }

  if (jsonPath) {
    FILE* f = std::fopen(jsonPath, "w");
    if (!f) {
      std::fprintf(stderr, "placement_bench: cannot write %s: %s\n", jsonPath, std::strerror(errno));
      return 1;
    }
    std::fprintf(f,
                 "{\n  \"snapshot\": {\"nodes\": %d, \"gpus_per_node\": 4, \"switches\": 32, \"seed\": %u, "
                 "\"up\": %d, \"draining\": %d, \"down\": %d, \"free_gpus\": %d, \"cpus_per_rank\": %d},\n",
                 nodes, seed, up, draining, down, freeGpus, cpusPerRank);
    std::fprintf(f, "  \"job_topology\": \"%s\",\n", layout.topology().c_str());
    std::fprintf(f, "  \"node_topology\": \"%s\",\n", args.s822lc ? "s822lc" : "");
    std::fprintf(f, "  \"fragmentation\": [");
    for (size_t i = 0; i < fragmentation.size(); ++i) {
      std::fprintf(
          f,
          "%s{\"kind\": \"%s\", \"broken_per_node_topology\": %.4f, \"broken_per_node_lowest_id\": %.4f, "
          "\"split_jobs_topology\": %d, \"split_jobs_lowest_id\": %d, \"violations\": %d}",
          i ? ", " : "", fragmentation[i].kind.c_str(), fragmentation[i].aware, fragmentation[i].lowest,
          fragmentation[i].splitAware, fragmentation[i].splitLowest, fragmentation[i].violations);
    }
    std::fprintf(f, "],\n");
    std::fprintf(f,
                 "  \"schedule\": {\"jobs\": 1000, \"started\": %d, \"backfilled\": %d, \"refused\": %d},\n",
                 started, backfilled, refused);
    std::fprintf(f, "  \"timings_us\": [\n");
    for (size_t i = 0; i < stats.size(); ++i) {
      const Stats& s = stats[i];
      std::fprintf(f,
                   "    {\"name\": \"%s\", \"runs\": %d, \"median\": %.1f, \"p99\": %.1f, \"max\": %.1f}%s\n",
                   s.name.c_str(), s.runs, s.median, s.p99, s.max, i + 1 < stats.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  return 0;
}
