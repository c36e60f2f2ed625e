// Preemption's policy (preemption.h): the waiting job that preempts, its candidates, and the share check.
#include "placement/preemption.h"

#include <algorithm>
#include <optional>
#include <set>

namespace ddl::placement {

Preemption planPreemption(const ShareTree& tree, const Cluster& live, const std::vector<JobRequest>& queue,
                          const ScheduleResult& pass, const std::vector<Preemptible>& running,
                          const std::map<std::string, int>* held) {
  std::map<std::string, const JobRequest*> request_of;
  for (const JobRequest& r : queue) request_of[r.id] = &r;
  auto waitsForGpus = [](const Decision& d) {
    return d.action == Decision::Action::kPending && (d.code == "Resources" || d.code == "Priority");
  };
  std::optional<ShareBalance> balance;
  if (tree.share_preemption) {
    std::map<std::string, int> of_running;
    if (!held) {
      for (const Preemptible& r : running) of_running[r.account] += r.allocation.totalGpus();
      held = &of_running;
    }
    std::set<std::string> waiting;
    for (const Decision& d : pass.decisions) {
      auto req = request_of.find(d.jobId);
      if (waitsForGpus(d) && req != request_of.end()) waiting.insert(req->second->account);
    }
    balance.emplace(tree, *held, waiting);
  }
  // A request (shape, QoS, and for its share its account) tried once is not tried again in the pass:
  // thousands of like jobs that cannot get enough victims cost one try; and at most 64 tries a pass.
  std::set<std::string> tried;
  for (const Decision& d : pass.decisions) {
    if (!waitsForGpus(d)) continue;
    auto req = request_of.find(d.jobId);
    if (req == request_of.end()) continue;
    const JobRequest& job = *req->second;
    const Qos* qos = tree.findQos(job.qos);
    const bool by_qos = qos && !qos->preempt.empty();
    // For its share, only the head job (Resources: the first that waits): a later one would take GPUs that
    // fair-share gives the jobs before it.
    const bool by_share = balance && d.code == "Resources" && balance->takesPart(job.account);
    if (!by_qos && !by_share) continue;
    if (tried.size() >= 64 ||
        !tried.insert(requestKey(job) + '\n' + job.qos + '\n' + (by_share ? job.account : "")).second)
      continue;
    if (place(live, job).ok()) continue;
    // The victims among `running` that its QoS allows, and with `share` those its share allows too; and which
    // of them were taken for the share (account, GPUs).
    auto choose = [&](bool share, std::vector<std::pair<std::string, int>>* for_share) {
      std::vector<Preemptible> candidates;
      std::set<std::string> share_ids;  // the candidates its share allows and its QoS does not
      for (const Preemptible& r : running) {
        const Qos* theirs = tree.findQos(r.qos);
        if (!theirs) continue;
        const bool qos_allows = by_qos && tree.mayPreempt(job.qos, r.qos);
        const bool share_allows =
            share && !qos_allows && theirs->priority <= (qos ? qos->priority : 0) &&
            balance->fair(job.account, job.gpuCount(), {{r.account, r.allocation.totalGpus()}});
        if (!qos_allows && !share_allows) continue;
        candidates.push_back(r);
        candidates.back().qosPriority = theirs->priority;
        if (share_allows) share_ids.insert(r.id);
      }
      std::vector<std::string> victims = chooseVictims(live, job, candidates);
      for (const Preemptible& c : candidates) {
        if (share_ids.count(c.id) && std::find(victims.begin(), victims.end(), c.id) != victims.end())
          for_share->push_back({c.account, c.allocation.totalGpus()});
      }
      return victims;
    };
    std::vector<std::pair<std::string, int>> for_share;
    std::vector<std::string> victims = choose(by_share, &for_share);
    if (victims.empty()) continue;  // freeing every candidate would not be enough
    // Each victim taken for the share was fair alone; together they must be too. If not, its QoS' victims
    // alone, where it has any.
    if (for_share.empty() || balance->fair(job.account, job.gpuCount(), for_share))
      return {d.jobId, std::move(victims), !for_share.empty()};
    if (!by_qos) continue;
    for_share.clear();
    victims = choose(false, &for_share);
    if (!victims.empty()) return {d.jobId, std::move(victims), false};
  }
  return {};
}

void favor(std::vector<JobRequest>& queue, const std::string& id) {
  auto it = std::find_if(queue.begin(), queue.end(), [&](const JobRequest& j) { return j.id == id; });
  if (it == queue.end()) return;
  double top = it->order;
  for (const JobRequest& j : queue) {
    if (j.tier == it->tier && j.id != id) top = std::max(top, j.order + 1);
  }
  it->order = top;
}

}  // namespace ddl::placement
