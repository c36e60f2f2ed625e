// Gang placement, topology-aware best fit and the priority queue with backfill. The algorithm, its cost and
// the exact rules are described at the top of placement.cpp.
//
// Threads: every function here is a pure function of its arguments (no globals, no I/O, no clock), so any
// thread may call any of them concurrently. The coordinator calls them with a snapshot it copied under its
// lock.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "placement/cluster.h"
#include "placement/fair_share.h"

namespace ddl::placement {

// The answer for one job: placed now (with its GPUs), pending (with the reason it waits), or infeasible (it
// can never run on this cluster, with the reason). Built through the factories, as Ray's scheduling results
// are.
class PlacementResult {
 public:
  enum class Kind { kSuccess, kPending, kInfeasible };

  static PlacementResult success(Allocation allocation) {
    return PlacementResult(Kind::kSuccess, std::move(allocation), "");
  }
  static PlacementResult pending(std::string reason) {
    return PlacementResult(Kind::kPending, {}, std::move(reason));
  }
  static PlacementResult infeasible(std::string reason) {
    return PlacementResult(Kind::kInfeasible, {}, std::move(reason));
  }

  Kind kind() const { return kind_; }
  bool ok() const { return kind_ == Kind::kSuccess; }
  bool isPending() const { return kind_ == Kind::kPending; }
  bool isInfeasible() const { return kind_ == Kind::kInfeasible; }
  const Allocation& allocation() const { return allocation_; }  // empty unless ok()
  const std::string& reason() const { return reason_; }         // empty when ok()

 private:
  PlacementResult(Kind kind, Allocation allocation, std::string reason)
      : kind_(kind), allocation_(std::move(allocation)), reason_(std::move(reason)) {}

  Kind kind_;
  Allocation allocation_;
  std::string reason_;
};

// Whether the job could ever run on this cluster, checked at submit. A job never fits when its request is
// malformed, when its topology override has the wrong product, when no node carries its labels, or when it
// asks for more than the UP and DRAINING nodes could offer with every GPU idle. DRAINING nodes count (a drain
// is usually maintenance that ends); DOWN nodes do not (they may never come back), but the reason mentions
// them. Returns "" when feasible, otherwise a sentence that says why and what the cluster has.
std::string checkFeasible(const Cluster& cluster, const JobRequest& job);

// checkFeasible, but a job that would fit once its DOWN nodes are back is feasible: what the queue decides
// (such a job waits, with pendingReason naming the DOWN nodes), and what a submit decides, so that a script
// does not break while nodes reboot.
std::string neverFits(const Cluster& cluster, const JobRequest& job);

// Places the job on the free GPUs of UP nodes, all or nothing: success with the allocation, pending with the
// reason it waits ("waiting for 4 nodes with 2 free GPUs each: ...", "node n3 draining: ..."), or infeasible
// (checkFeasible's reason). For a queued job DOWN nodes do count here: a job that would fit if its DOWN nodes
// came back is pending ("node n5 DOWN: ..."), not infeasible.
PlacementResult place(const Cluster& cluster, const JobRequest& job);

// Why the job cannot be placed right now, in words. Meaningful only when place() would not succeed.
std::string pendingReason(const Cluster& cluster, const JobRequest& job);

struct Decision {
  enum class Action { kStart, kPending, kRefused };

  std::string jobId;
  Action action = Action::kPending;
  Allocation allocation;    // kStart only
  std::string reason;       // kPending / kRefused
  // kPending: why it waits, as squeue's REASON says it: "Resources" (the first job that waits: for GPUs to
  // free), "Priority" (behind it), "ReqNodeNotAvail" (only DOWN or draining nodes could take it).
  std::string code;
  bool backfilled = false;  // kStart behind a blocked head job
};

struct ScheduleResult {
  std::vector<Decision> decisions;  // one per queued job, in scheduling order (priority, then submit order)
  std::string headJob;  // the first job that could not start (the one backfill protects); "" if none

  const Decision* find(const std::string& jobId) const;
  std::vector<std::string> started() const;  // ids of kStart decisions, in order
};

// One scheduling pass over the pending queue (any order; sorted here by priority, then submit order). Jobs
// start in that order until one cannot (the head); later jobs may then start only by backfill, which never
// delays the head job (rule in placement.cpp). Jobs that can never fit are refused and do not block the
// queue.
// With `limits` (fair_share.h), a job that would pass an account's or user's limit waits (code AccountLimit
// or UserLimit) without becoming the head, and every start is counted against them.
ScheduleResult schedule(const Cluster& cluster, const std::vector<JobRequest>& queue,
                        LimitTracker* limits = nullptr);

// What placement reads of a job: jobs whose keys are equal are placed alike on the same cluster (schedule()
// memoises by it).
std::string requestKey(const JobRequest& job);

// A launched job that a waiting one may preempt (its QoS allows it: ShareTree::mayPreempt).
struct Preemptible {
  std::string id;
  Allocation allocation;    // what preempting it gives back
  int64_t qosPriority = 0;  // its QoS's priority: lower tiers are preempted first
  int64_t startedMs = 0;    // when it was placed: of one tier, the youngest (least work lost) goes first
  std::string qos;          // its QoS ("" normal)
  std::string account;      // its account, for fair-share preemption ("" or unknown: charged to root)
};

// The fewest of `candidates`, lowest tier and youngest first, whose GPUs (and CPUs and memory) once freed let
// `job` start now on `cluster` (the cluster as it is: the candidates' allocations are in use in it). Empty
// when freeing all of them would not be enough. Greedy: candidates are added in that order until the job
// fits, then each is spared again, the last chosen first, where the job still fits without it. Cost: one
// placement per candidate tried and per victim.
std::vector<std::string> chooseVictims(const Cluster& cluster, const JobRequest& job,
                                       std::vector<Preemptible> candidates);

}  // namespace ddl::placement
