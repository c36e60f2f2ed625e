// Preemption's policy: which running jobs a waiting job preempts, for its QoS or for its account's share. The
// coordinator (preemptForWaitingOnLoop) and the simulator (sched_sim.h) both ask it after a pass that started
// nothing, then signal the victims with their QoS's grace and requeue them.
//
// By QoS (Slurm's PreemptMode=REQUEUE): a QoS names the QoS it may preempt (ShareTree::mayPreempt); its tier
// orders the queue first, so what its victims free never goes back to their tier.
//
// By share (fairshare_preemption, ShareTree::share_preemption; Kueue's fair sharing with
// LessThanOrEqualToFinalShare): the job at the head of the queue may preempt running jobs of no higher tier
// of other accounts where its account, with the job, is served no more than each victim's account without its
// victims (fair_share.h's ShareBalance: GPUs held over the account's part of the cluster among the accounts
// that hold or want GPUs). Neither can then preempt the other back. What the victims free must go to the job
// that preempted them, although fair-share may order the victims' requeued jobs first (usage decays over
// days, the balance weighs GPUs held now): the caller favors it (favor()) until it starts.
#ifndef DDL_COORDINATOR_PLACEMENT_PREEMPTION_H_
#define DDL_COORDINATOR_PLACEMENT_PREEMPTION_H_

#include <map>
#include <string>
#include <vector>

#include "placement/fair_share.h"
#include "placement/placement.h"

namespace ddl::placement {

struct Preemption {
  std::string jobId;                 // the job it is for; "" when there is none to make
  std::vector<std::string> victims;  // the running jobs to preempt for it
  bool forShare = false;             // some victim was chosen for the job's share, not its QoS: favor() it
};

// After a pass (`pass`, over `queue`): the first job that waits for GPUs (Resources or Priority) whose QoS
// may preempt, or the head job (Resources) where tree.share_preemption is on, which cannot start on `live`
// (the cluster as the running jobs hold it, without the GPUs of ranks still stopping) and for which
// chooseVictims finds victims among the `running` jobs (their qosPriority is filled in from `tree`) as the
// file comment says. Where victims chosen for QoS and share together leave the shares unfair, the QoS'
// victims alone are tried. `held`: the GPUs each account's launched jobs hold, the starting ones too
// (nullptr: those of `running`). Jobs charged to root take no part in share preemption. At most 64 distinct
// requests are tried.
Preemption planPreemption(const ShareTree& tree, const Cluster& live, const std::vector<JobRequest>& queue,
                          const ScheduleResult& pass, const std::vector<Preemptible>& running,
                          const std::map<std::string, int>* held = nullptr);

// Orders job `id` of `queue` (already prioritized) ahead of every other job of its tier: the job that
// preempted for its share gets what its victims free. Nothing where the job is not in the queue.
void favor(std::vector<JobRequest>& queue, const std::string& id);

}  // namespace ddl::placement

#endif  // DDL_COORDINATOR_PLACEMENT_PREEMPTION_H_
