// The scheduler's policy over a job trace in virtual time: what the coordinator's pass does (fair_share.h's
// prioritize, then placement.h's schedule, with its backfill) on a cluster that exists only here, so that a
// day of a shared cluster runs in a second and FIFO and fair-share can be compared on the same trace.
//
// Time advances in steps of step_ms (the coordinator's pass runs at most that often): at each step the jobs
// that ended free their GPUs, the running ones are charged their GPU-seconds (decayed with half_life_s), the
// jobs submitted by then join the queue, and one pass starts what it can. A job holds its GPUs for run_ms
// from its start. FIFO is the same pass without prioritize() (submit order; --priority is not used by
// traces). With preemption, a job of a QoS that may preempt has running jobs preempted for it.
//
// Pure; no I/O. Cost: steps x one pass (placement.h's cost over the queue).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "placement/cluster.h"
#include "placement/fair_share.h"

namespace ddl::placement {

struct SimJob {
  std::string id;
  std::string user;
  std::string account;
  int64_t submit_ms = 0;
  int gpus = 1;  // a total request (JobRequest::totalGpus)
  int64_t run_ms = 0;
  std::string qos;  // "" normal
};

struct SimOptions {
  Cluster cluster;  // its nodes' GPUs start free
  ShareTree tree;   // the accounts and their shares
  PriorityWeights weights;
  double half_life_s = 7 * 86400.0;
  bool fair_share = true;  // false: FIFO
  // Preemption as the coordinator does it (preemption.h's planPreemption, after a pass that started nothing,
  // one at a time; for shares too where tree.share_preemption is on): a victim holds its GPUs for its QoS's
  // grace, then goes back to the queue with the run time it had left (it checkpointed: no work is lost).
  bool preemption = false;
  int64_t step_ms = 1000;
  int64_t end_ms = 0;  // the simulation stops here (jobs still running are charged up to it)
};

struct SimResult {
  std::map<std::string, double> gpu_seconds;      // delivered per account
  std::map<std::string, int64_t> first_start_ms;  // per account: its first job's start
  std::vector<int64_t> waits_ms;                  // submit to start, per started job
  double utilisation = 0;                         // GPU-seconds delivered over GPU-seconds the cluster had
  // Jain's fairness index over the accounts that had work, of delivered / normalised share: 1 when each got
  // exactly its share, 1/n when one got everything.
  double jain = 0;
  int started = 0;
  int finished = 0;
  int preemptions = 0;
};

SimResult simulate(const std::vector<SimJob>& trace, const SimOptions& options);

// A backlog of `count` short jobs of one user, all submitted at at_ms: 4, 1 and 2 GPUs in turn, each running
// 5 to 20 s (a fixed spread, no RNG), ids ACCOUNT-N. Issue 41's scenario (the SchedSim test, sched-sim).
std::vector<SimJob> backlog(const std::string& account, const std::string& user, int count, int64_t at_ms);

}  // namespace ddl::placement
