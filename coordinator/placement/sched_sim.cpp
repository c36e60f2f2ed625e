// The scheduler's policy in virtual time (sched_sim.h).
#include "placement/sched_sim.h"

#include <algorithm>
#include <deque>
#include <set>

#include "placement/placement.h"
#include "placement/preemption.h"

namespace ddl::placement {

namespace {

struct Running {
  const SimJob* job = nullptr;
  Allocation allocation;
  int64_t start_ms = 0;
  int64_t end_ms = 0;
  int64_t run_end_ms = 0;  // when it would have ended; beyond end_ms when it was preempted
  bool preempted = false;
};

}  // namespace

std::vector<SimJob> backlog(const std::string& account, const std::string& user, int count, int64_t at_ms) {
  std::vector<SimJob> jobs;
  for (int i = 0; i < count; ++i) {
    const int gpus = (i % 3 == 0) ? 4 : (i % 3 == 1 ? 1 : 2);
    const int64_t run_ms = 5000 + (i * 7919 % 16) * 1000;
    jobs.push_back({account + "-" + std::to_string(i), user, account, at_ms, gpus, run_ms});
  }
  return jobs;
}

SimResult simulate(const std::vector<SimJob>& trace, const SimOptions& options) {
  SimResult result;
  Cluster cluster = options.cluster;
  int total_gpus = 0;
  for (const Node& n : cluster.nodes) total_gpus += n.gpus;
  std::vector<const SimJob*> arrivals;
  for (const SimJob& job : trace) arrivals.push_back(&job);
  std::stable_sort(arrivals.begin(), arrivals.end(),
                   [](const SimJob* a, const SimJob* b) { return a->submit_ms < b->submit_ms; });
  UsageLedger ledger;
  ledger.half_life_s = options.half_life_s;
  std::map<std::string, const SimJob*> queued;  // by id
  std::map<std::string, uint64_t> seq;          // submit order
  std::deque<SimJob> requeued;                  // preempted jobs with the run time they had left
  std::set<std::string> ever_started;
  std::vector<Running> running;
  std::string favored;  // the job that preempted for its share, until it starts (preemption.h's favor)
  std::set<std::string> with_work;  // accounts that submitted something
  size_t next = 0;
  const int64_t step = std::max<int64_t>(options.step_ms, 1);
  for (int64_t now = 0; now <= options.end_ms; now += step) {
    ledger.decayTo(now);
    // What ran during the last step: charged for the part of it each job held its GPUs.
    for (auto it = running.begin(); it != running.end();) {
      const int64_t held = std::min(it->end_ms, now) - std::max(it->start_ms, now - step);
      const double gpu_s = it->job->gpus * std::max<int64_t>(held, 0) / 1000.0;
      ledger.charge(it->job->account, it->job->user, gpu_s);
      result.gpu_seconds[it->job->account] += gpu_s;
      if (it->end_ms <= now) {
        releaseAllocation(cluster, it->allocation);
        if (it->run_end_ms > it->end_ms) {  // preempted: back to the queue with what it had left
          SimJob rest = *it->job;
          rest.run_ms = it->run_end_ms - it->end_ms;
          requeued.push_back(rest);
          queued[rest.id] = &requeued.back();
        } else {
          ++result.finished;
        }
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    if (now == options.end_ms) break;
    for (; next < arrivals.size() && arrivals[next]->submit_ms <= now; ++next) {
      queued[arrivals[next]->id] = arrivals[next];
      seq[arrivals[next]->id] = next + 1;
      with_work.insert(arrivals[next]->account);
    }
    std::vector<JobRequest> queue;
    for (const auto& [id, job] : queued) {
      JobRequest r;
      r.id = id;
      r.user = job->user;
      r.account = job->account;
      r.submitMs = job->submit_ms;
      r.submitSeq = seq[id];
      r.totalGpus = job->gpus;
      r.qos = job->qos;
      queue.push_back(std::move(r));
    }
    if (options.fair_share) prioritize(queue, options.tree, ledger, options.weights, now);
    if (!queued.count(favored)) favored.clear();  // it started
    if (!favored.empty()) favor(queue, favored);
    const ScheduleResult pass = schedule(cluster, queue);
    for (const Decision& d : pass.decisions) {
      if (d.action != Decision::Action::kStart) continue;
      const SimJob* job = queued.at(d.jobId);
      applyAllocation(cluster, d.allocation);
      running.push_back({job, d.allocation, now, now + job->run_ms, now + job->run_ms});
      if (ever_started.insert(job->id).second) {  // a job started again after a preemption waited once
        result.waits_ms.push_back(now - job->submit_ms);
        result.first_start_ms.try_emplace(job->account, now);
        ++result.started;
      }
      queued.erase(d.jobId);
    }
    const bool in_flight =
        std::any_of(running.begin(), running.end(), [](const Running& r) { return r.preempted; });
    if (options.preemption && pass.started().empty() && !in_flight) {
      std::vector<Preemptible> candidates;
      for (const Running& r : running)
        candidates.push_back({r.job->id, r.allocation, 0, r.start_ms, r.job->qos, r.job->account});
      const Preemption plan = planPreemption(options.tree, cluster, queue, pass, candidates);
      if (plan.forShare) favored = plan.jobId;
      for (Running& r : running) {
        if (std::find(plan.victims.begin(), plan.victims.end(), r.job->id) == plan.victims.end()) continue;
        const Qos* qos = options.tree.findQos(r.job->qos);
        r.end_ms = std::min(r.run_end_ms, now + (qos ? qos->grace_s : Qos{}.grace_s) * 1000);
        r.preempted = true;
        ++result.preemptions;
      }
    }
  }
  double delivered = 0;
  for (const auto& [account, gpu_s] : result.gpu_seconds) delivered += gpu_s;
  result.utilisation =
      options.end_ms > 0 && total_gpus > 0 ? delivered / (total_gpus * options.end_ms / 1000.0) : 0;
  // Jain's index of delivered / share over the accounts with work, the shares renormalised among them.
  std::map<std::string, double> share;
  for (const ShareRow& row : shares(options.tree, UsageLedger{})) {
    if (with_work.count(row.account)) share[row.account] = row.norm_share;
  }
  double sum_share = 0, sum = 0, sum_sq = 0;
  for (const auto& [account, s] : share) sum_share += s;
  for (const auto& [account, s] : share) {
    const double x = sum_share > 0 && s > 0 ? result.gpu_seconds[account] / (s / sum_share) : 0;
    sum += x;
    sum_sq += x * x;
  }
  result.jain = sum_sq > 0 ? sum * sum / (share.size() * sum_sq) : 0;
  return result;
}

}  // namespace ddl::placement
