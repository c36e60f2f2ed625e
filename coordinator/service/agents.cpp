// The job side of the agents' calls: what a registration, a heartbeat or a rank event means for jobs (ranks
// reconciled, stale ranks stopped, jobs of lost nodes failed or requeued), and what the jobs hold on each
// node (the usage and the snapshot placement works on). The nodes themselves are the NodeRegistry's
// (node_registry.h). See coordinator.h for the whole object; the other parts are in coordinator.cpp and
// user_calls.cpp.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <limits>
#include <string_view>

#include "common/array_spec.h"
#include "common/clock.h"
#include "common/rank_env.h"
#include "common/resources.h"
#include "common/signals.h"
#include "placement/placement.h"
#include "service/actor.h"
#include "service/convert.h"
#include "service/coordinator.h"
#include "service/coordinator_internal.h"
#include "service/launch_plan.h"
#include "service/log_relay.h"

namespace ddl::coordinator {
namespace {

std::string describeExit(const v1::RankStatus& r) {
  if (r.has_signal()) {
    const char* name = signalAbbrev(r.signal());
    return "was killed by signal " + (name ? std::string(name) : std::to_string(r.signal()));
  }
  std::string text = "exited with code " + std::to_string(r.exit_code());
  // A shell's codes for a program that could not be run (the agent reports its own error text when it knows).
  if (r.exit_code() == 127) text += " (the program was not found: could not be executed)";
  if (r.exit_code() == 126)
    text += " (the program could not be executed: permission denied or not a program)";
  return text;
}

}  // namespace

// ---- Nodes and agents
// ----------------------------------------------------------------------------------------

void Coordinator::sweepLostJobsOnLoop() {
  std::vector<std::pair<std::string, std::string>> victims;  // (job, node)
  for (const auto& [id, job] : jobs_) {
    if (!isLive(job.state)) continue;
    for (const auto& a : job.allocation) {
      const Node* node = registry_->find(a.node);
      if (!node || node->record.state == state::NodeState::kDown) {
        victims.emplace_back(id, a.node);
        break;
      }
    }
  }
  for (const auto& [id, node] : victims) {
    failJobOnLoop(id, "node_lost: node " + node + " is DOWN", std::nullopt);
  }
}

void Coordinator::loseNodeJobsOnLoop(const std::string& node, const std::string& reason,
                                     const std::string& only_job, int only_rank) {
  std::vector<std::string> victims;
  for (const auto& [id, job] : jobs_) {
    if (!isLive(job.state) || (!only_job.empty() && id != only_job)) continue;
    for (const auto& a : job.allocation) {
      if (a.node == node) victims.push_back(id);
    }
  }
  for (const auto& id : victims) {
    // The ranks lost: the one named, else the job's ranks on the node (an elastic job may go on without
    // them).
    std::set<int> lost;
    if (auto rt = runtime_.find(id); rt != runtime_.end()) {
      for (int slot : rt->second.members())
        if (rt->second.rank_node.at(slot) == node && (only_rank < 0 || slot == only_rank)) lost.insert(slot);
    }
    loseRanksOnLoop(id, lost, reason, std::nullopt);
  }
}

bool Coordinator::placeAgainIfNeverStartedOnLoop(const std::string& id, const std::string& node) {
  auto rt = runtime_.find(id);
  if (jobs_[id].state != JobState::kStarting || rt == runtime_.end() || !rt->second.ranks.empty())
    return false;
  // No rank of this launch was ever reported anywhere, and `node` has none: its start never got there (the
  // coordinator that stored it stopped before sending it: a restart, a failover). Nothing ran, so nothing
  // failed: placed again, not counted as a restart.
  const int attempt = rt->second.attempt;
  const auto allocation = jobs_[id].allocation;
  const std::string reason = "its start never reached node " + node +
                             " (the coordinator stopped before sending it); placing it again";
  Status st =
      recordTransitionOnLoop(id, JobState::kPending, reason, std::nullopt, /*counts_as_restart=*/false);
  if (!st) spdlog::error("job {}: {}", id, st.toString());
  stopJobEverywhereOnLoop(id, attempt, reason, allocation);
  return true;
}

void Coordinator::registerAgent(const v1::RegisterRequest& req,
                                std::function<void(StatusOr<v1::RegisterResponse>)> done) {
  post([this, req, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::RegisterResponse>>(registerAgentOnLoop(req));
    actor_->reply([done, result] { done(std::move(*result)); }, result->isOk());
  });
}

StatusOr<v1::RegisterResponse> Coordinator::registerAgentOnLoop(const v1::RegisterRequest& req) {
  StatusOr<Node*> registered = registry_->registerOnLoop(req);
  if (!registered) return registered.status();
  Node& node = **registered;
  std::set<std::pair<std::string, int>> stale;
  for (const auto& r : req.ranks()) applyRankReportOnLoop(node, r, &stale);
  // Ranks this node should run but no longer has (the agent restarted without them, or never got the start).
  std::map<std::string, std::set<int>> lost;  // job -> ranks; failing a job edits runtime_, so collect first
  for (const auto& [id, rt] : runtime_) {
    for (const auto& [rank, where] : rt.rank_node) {
      if (where != req.node() || rt.gone.count(rank)) continue;
      auto known = rt.ranks.find(rank);
      bool reported = node.ranks.count(RankKey{id, rt.attempt, rank}) > 0;
      if (!reported && (known == rt.ranks.end() || !exitedCleanly(known->second))) {
        stale.erase({id, rt.attempt});
        lost[id].insert(rank);
      }
    }
  }
  for (const auto& [id, ranks] : lost) {
    if (placeAgainIfNeverStartedOnLoop(id, req.node())) continue;
    // Those ranks (an elastic job may go on without them; any other job fails or requeues).
    loseRanksOnLoop(id, ranks,
                    rankList({ranks.begin(), ranks.end()}) + " of job " + id +
                        (ranks.size() == 1 ? " is" : " are") + " gone from node " + req.node() +
                        " (its agent registered again without " + (ranks.size() == 1 ? "it)" : "them)"),
                    std::nullopt);
  }
  stopStaleOnLoop(req.node(), stale);
  schedule_wanted_ = true;
  spdlog::info("node {} registered from {} with {} GPUs, {} ranks running", req.node(), req.address(),
               req.gpus_size(), req.ranks_size());

  v1::RegisterResponse resp;
  resp.set_session(node.session);
  resp.set_heartbeat_interval_ms(static_cast<int32_t>(options_.heartbeat_interval_ms));
  resp.set_heartbeat_grace_ms(static_cast<int32_t>(options_.heartbeat_grace_ms));
  return resp;
}

void Coordinator::attachAgent(const std::string& node, const std::string& session,
                              std::shared_ptr<AgentLink> link, StatusDone done) {
  post([this, node, session, link = std::move(link), done = std::move(done)] {
    done(attachAgentOnLoop(node, session, link));
  });
}

Status Coordinator::attachAgentOnLoop(const std::string& node, const std::string& session,
                                      std::shared_ptr<AgentLink> link) {
  Status st = registry_->attachOnLoop(node, session, std::move(link));
  if (st) schedule_wanted_ = true;
  return st;
}

void Coordinator::detachAgent(const std::string& node, const std::string& session,
                              const std::shared_ptr<AgentLink>& link) {
  post([this, node, session, link] { registry_->detachOnLoop(node, session, link); });
}

void Coordinator::applyRankReportOnLoop(Node& node, const v1::RankStatus& r,
                                        std::set<std::pair<std::string, int>>* stale) {
  if (r.attempt() <= 0)
    return;  // not a launch this coordinator made; a stop for attempt 0 would stop them all
  v1::RankStatus report = r;
  if (report.state() == v1::RankStatus::EXITED && !report.has_exit_code() && !report.has_signal()) {
    report.set_exit_code(255);  // an exit with no status is not a success
  }
  RankKey key{r.job_id(), r.attempt(), r.rank()};
  auto prev = node.ranks.find(key);
  if (prev != node.ranks.end() && prev->second.state() == v1::RankStatus::EXITED) return;  // an exit is final
  if (report.state() == v1::RankStatus::EXITED) schedule_wanted_ = true;  // its GPU may be free now
  node.ranks[key] = report;
  recordRankResultOnLoop(node.record.name, report);

  auto job = jobs_.find(r.job_id());
  auto rt = runtime_.find(r.job_id());
  if (job == jobs_.end() || !isLive(job->second.state) || rt == runtime_.end() ||
      r.attempt() < rt->second.attempt) {
    stale->insert({r.job_id(), r.attempt()});  // an ended job or an older attempt: stop what is left of it
    return;
  }
  auto placed = rt->second.rank_node.find(r.rank());
  if (r.attempt() > rt->second.attempt || placed == rt->second.rank_node.end() ||
      placed->second != node.record.name) {
    spdlog::warn(
        "node {}: ignoring a report of job {} attempt {} rank {} that this coordinator did not place there",
        node.record.name, r.job_id(), r.attempt(), r.rank());
    return;
  }
  if (r.state() == v1::RankStatus::STATE_UNSPECIFIED) return;
  auto& known = rt->second.ranks[r.rank()];
  if (known.state() == v1::RankStatus::EXITED) return;  // an exit is final; a late RUNNING changes nothing
  if (rt->second.gone.count(r.rank())) {  // an elastic job went on without it: its end changes nothing
    known = report;
    return;
  }
  if (report.has_progress()) {
    telemetry_.recordRank(r.job_id(), r.attempt(), r.rank(), report.progress(), wall_ms_());
    // Totals for /metrics: what this rank did since its previous report (its counters only grow).
    const auto& before = known.progress();
    const auto& now = report.progress();
    if (before.bytes() >= 0 && now.bytes() >= before.bytes() && std::isfinite(now.seconds()) &&
        std::isfinite(before.seconds()) && now.seconds() >= before.seconds()) {
      counters_.collective_bytes_total += static_cast<double>(now.bytes() - before.bytes());
      counters_.collective_seconds_total += now.seconds() - before.seconds();
    }
  }
  if (known.has_progress() && !report.has_progress()) *report.mutable_progress() = known.progress();
  known = report;
  // A joiner whose communicator ran collectives has joined: its loss is a rank's like any other, and the
  // program takes joiners, so the grows need not wait (elastic.cpp).
  if (report.progress().collectives() > 0 && rt->second.joiners.erase(r.rank()))
    rt->second.grow_backoff_ms = 0;
  if (!job->second.preempted_by.empty()) {
    // Being preempted: the ranks stop as they can (a checkpoint, then any exit); the job goes back to the
    // queue once every one has, or at the deadline.
    if (report.state() == v1::RankStatus::EXITED && allRanksExitedOnLoop(r.job_id()))
      endPreemptionOnLoop(r.job_id(), "every rank exited", -1);
    return;
  }
  if (report.state() == v1::RankStatus::EXITED && !exitedCleanly(report)) {
    state::Failure failure;
    failure.rank = r.rank();
    failure.host = node.record.name;
    if (report.has_signal()) {
      failure.signal = report.signal();
    } else {
      failure.exit_code = report.exit_code();
    }
    const std::string rank = "rank " + std::to_string(r.rank()) + " on node " + node.record.name;
    loseRanksOnLoop(r.job_id(), {r.rank()},
                    report.error().empty() ? rank + " " + describeExit(report)
                                           : rank + " could not start: " + report.error(),
                    failure);
    return;
  }
  maybeCompleteOnLoop(r.job_id());
}

void Coordinator::recordRankResultOnLoop(const std::string& node, const v1::RankStatus& report) {
  auto it = jobs_.find(report.job_id());
  if (it == jobs_.end() || report.state() == v1::RankStatus::STATE_UNSPECIFIED) return;
  state::Job& job = it->second;
  if (report.attempt() != attemptOf(job) || report.rank() < 0) return;
  state::RankResult next = rankResultOf(report, node);
  auto pos = std::lower_bound(job.ranks.begin(), job.ranks.end(), next.rank,
                              [](const state::RankResult& r, int rank) { return r.rank < rank; });
  bool known = pos != job.ranks.end() && pos->rank == next.rank;
  // Only the node the rank was placed on speaks for it (the launch listed every rank with its node).
  if (known && pos->node != node) return;
  if (!known) {
    // A job launched before ranks were kept (a coordinator upgrade): its layout says where each rank runs.
    auto rt = runtime_.find(job.id);
    if (rt == runtime_.end()) return;
    auto placed = rt->second.rank_node.find(next.rank);
    if (placed == rt->second.rank_node.end() || placed->second != node) return;
  }
  if (known && pos->exited) return;                                  // an exit is final
  if (known && !report.has_progress()) next.figures = pos->figures;  // an exit report may carry none
  if (known) {  // an exit report may leave out what the start said
    if (next.pid == 0) next.pid = pos->pid;
    if (next.program_pid == 0) next.program_pid = pos->program_pid;
    if (next.started_ms == 0) next.started_ms = pos->started_ms;
  }
  // A start or an exit is stored; progress stays in memory until the next write of the job.
  const bool store = !known || pos->exited != next.exited || pos->pid != next.pid ||
                     pos->program_pid != next.program_pid || pos->started_ms != next.started_ms;
  // A rank that exits after its attempt ended (the others of a failed one): its CPU time and memory are added
  // to the attempt's usage.
  std::vector<state::Write> usage;
  if (next.exited && !job.attempts.empty() && job.attempts.back().attempt == next.attempt) {
    state::AttemptUsage& ended = job.attempts.back();
    ended.cpu_s += next.cpu_s;
    ended.max_rss_bytes = std::max(ended.max_rss_bytes, next.max_rss_bytes);
    usage =
        usage_book_->bookLateOnLoop(job.spec.account, job.spec.user, ended, next.cpu_s, next.max_rss_bytes);
  }
  if (known) {
    *pos = std::move(next);
  } else {
    job.ranks.insert(pos, std::move(next));
  }
  if (store || !usage.empty()) {
    putJobOnLoop(job, false, std::move(usage));
    if (state::isTerminal(job.state))
      rewritten_final_[job.id] = actor_->nextBatch();  // the batch this turn makes
  }
}

void Coordinator::stopStaleOnLoop(const std::string& node,
                                  const std::set<std::pair<std::string, int>>& stale) {
  // While the store fails, commands wait for it; a stale rank is reported again with every heartbeat, so its
  // stop is left for then instead of piling up a copy per heartbeat.
  if (stale.empty() || !health().ok) return;  // the common heartbeat has nothing stale: no lock taken
  for (const auto& [job, attempt] : stale) {
    auto it = jobs_.find(job);
    registry_->sendOnLoop(
        node, stopCommand(job, attempt,
                          it == jobs_.end() ? "the coordinator knows no job " + job
                                            : "job " + job + " attempt " + std::to_string(attempt) +
                                                  " is not running (" + toString(it->second.state) + ")"));
  }
}

void Coordinator::heartbeat(const std::string& node, const std::string& session, const v1::Heartbeat& hb,
                            StatusDone done) {
  post([this, node, session, hb, done = std::move(done)] { done(heartbeatOnLoop(node, session, hb)); });
}

Status Coordinator::heartbeatOnLoop(const std::string& node, const std::string& session,
                                    const v1::Heartbeat& hb) {
  Status error;
  Node* entry = registry_->sessionOnLoop(node, session, &error);
  if (!entry) return error;
  registry_->heardFromOnLoop(*entry, &hb.warning());
  nodeHealthOnLoop(*entry, hb);
  // A heartbeat lists every rank the agent holds, so it replaces what we knew.
  std::map<RankKey, v1::RankStatus> previous;
  previous.swap(entry->ranks);
  std::set<std::pair<std::string, int>> stale;
  for (const auto& r : hb.ranks()) applyRankReportOnLoop(*entry, r, &stale);
  if (entry->ranks.size() != previous.size()) schedule_wanted_ = true;  // ranks released: GPUs may be free
  // A rank of a live launch that was running and is simply gone (never reported as exited) is lost.
  std::vector<std::pair<std::string, int>> lost;
  for (const auto& [key, r] : previous) {
    if (r.state() != v1::RankStatus::RUNNING || entry->ranks.count(key)) continue;
    auto rt = runtime_.find(key.job);
    if (rt != runtime_.end() && rt->second.attempt == key.attempt) lost.emplace_back(key.job, key.rank);
  }
  for (const auto& [job, rank] : lost) {
    loseNodeJobsOnLoop(node,
                       "rank " + std::to_string(rank) + " of job " + job + " vanished from node " + node +
                           " without an exit status",
                       job, rank);
  }
  stopStaleOnLoop(node, stale);
  return Status::ok();
}

void Coordinator::nodeHealthOnLoop(Node& entry, const v1::Heartbeat& hb) {
  const std::string node = entry.record.name;
  // A new GPU fault: the GPU leaves placement (the snapshot counts it held) and the jobs on it fail, each
  // requeued where its restarts allow, with the GPU and the fault in the reason.
  for (const auto& [gpu, fault] : registry_->gpuFaultsOnLoop(entry, hb.gpu_faults())) {
    schedule_wanted_ = true;
    std::vector<std::string> victims;
    for (const auto& [id, job] : jobs_) {
      if (!isLive(job.state)) continue;
      for (const auto& a : job.allocation)
        if (a.node == node && std::find(a.gpus.begin(), a.gpus.end(), gpu) != a.gpus.end())
          victims.push_back(id);
    }
    for (const std::string& id : victims) {
      std::set<int> lost;  // the ranks on that GPU (an elastic job may go on without them)
      for (const state::RankResult& r : jobs_[id].ranks)
        if (r.node == node && r.gpu == gpu) lost.insert(r.rank);
      loseRanksOnLoop(id, lost,
                      "GPU " + std::to_string(gpu) + " of node " + node + " failed: " + fault.reason,
                      std::nullopt);
    }
  }
  // The site's health check: a failure drains the node with it as the reason; once it passes, the drain it
  // made (and only that one) ends. Refused while the store is unhealthy: the next heartbeat tries again.
  if (!hb.has_health_check()) return;  // no check here, or no run has ended since the agent started
  const std::string& failed = hb.health_check();
  const bool ours = entry.record.drained && entry.record.drain_reason.rfind(kHealthCheckDrain, 0) == 0;
  if (!failed.empty() && (!entry.record.drained || ours)) {
    const std::string reason = state::withoutControlCharacters(std::string(kHealthCheckDrain) + " " + failed)
                                   .substr(0, state::kMaxDrainReasonBytes);
    if (reason != entry.record.drain_reason) {
      if (auto st = drainOnLoop(node, true, reason); !st)
        spdlog::warn("node {}: {}", node, st.status().toString());
    }
  } else if (failed.empty() && ours) {
    if (auto st = drainOnLoop(node, false, ""); !st)
      spdlog::warn("node {}: {}", node, st.status().toString());
  }
}

void Coordinator::rankEvent(const std::string& node, const std::string& session, const v1::RankStatus& r,
                            StatusDone done) {
  post([this, node, session, r, done = std::move(done)] { done(rankEventOnLoop(node, session, r)); });
}

Status Coordinator::rankEventOnLoop(const std::string& node, const std::string& session,
                                    const v1::RankStatus& r) {
  Status error;
  Node* entry = registry_->sessionOnLoop(node, session, &error);
  if (!entry) return error;
  registry_->heardFromOnLoop(*entry);
  std::set<std::pair<std::string, int>> stale;
  applyRankReportOnLoop(*entry, r, &stale);
  stopStaleOnLoop(node, stale);
  return Status::ok();
}

std::map<std::string, NodeUsage> Coordinator::usageOnLoop(bool stopping_ranks) const {
  std::map<std::string, NodeUsage> usage;
  for (const auto& [id, job] : jobs_) {
    if (!isLive(job.state)) continue;
    for (const auto& a : job.allocation) {
      NodeUsage& u = usage[a.node];
      u.gpus.insert(a.gpus.begin(), a.gpus.end());
      u.cpus.insert(a.cpus.begin(), a.cpus.end());
      u.memory_bytes += a.memory_bytes;
      u.jobs.push_back(id);
    }
  }
  // Ranks still dying after a stop hold their GPU, and the CPUs and memory their job's allocation gave them
  // (kept once the job is final; a requeued job's earlier attempt is known by its GPU only).
  if (!stopping_ranks) return usage;
  for (const auto& [name, node] : registry_->all()) {
    for (const auto& [key, r] : node.ranks) {
      if (r.state() != v1::RankStatus::RUNNING) continue;
      NodeUsage& u = usage[name];
      u.gpus.insert(r.gpu());
      auto job = jobs_.find(key.job);
      if (job == jobs_.end() || isLive(job->second.state)) continue;  // a live job's allocation counts above
      for (const auto& a : job->second.allocation) {
        // The final allocation's own ranks only (a rank of an earlier attempt may have had another GPU).
        if (a.node != name || std::find(a.gpus.begin(), a.gpus.end(), r.gpu()) == a.gpus.end()) continue;
        const std::vector<int> cpus = placement::cpusOfGpu(a.gpus, a.cpus, r.gpu());
        u.cpus.insert(cpus.begin(), cpus.end());
        u.memory_bytes += job->second.spec.memory_per_rank_bytes;
      }
    }
  }
  return usage;
}

bool Coordinator::stillFreeOnLoop(const placement::Allocation& allocation,
                                  std::map<std::string, NodeUsage>& usage) const {
  for (const auto& a : allocation.nodes) {
    const Node* node = registry_->find(a.node);
    if (!node || node->record.state != state::NodeState::kUp || !node->link) return false;
    const auto& used = usage[a.node].gpus;
    for (int g : a.gpus) {
      if (used.count(g)) return false;
    }
    const auto& cpus_used = usage[a.node].cpus;
    for (int c : a.cpus) {
      if (cpus_used.count(c)) return false;
    }
    if (a.memoryBytes > 0 && usage[a.node].memory_bytes + a.memoryBytes > node->record.memory_bytes) {
      return false;
    }
  }
  return true;
}

placement::Cluster Coordinator::snapshotOnLoop(bool for_scheduling, bool stopping_ranks) const {
  const auto usage = usageOnLoop(stopping_ranks);
  placement::Cluster cluster;
  cluster.nodes.reserve(registry_->all().size());
  for (const auto& [name, entry] : registry_->all()) {
    placement::Node n;
    n.name = name;
    n.gpus = static_cast<int>(entry.record.gpus.size());
    n.labels = entry.record.labels;
    n.state = toPlacement(entry.record.state);
    // A node whose agent is not connected can take no new work now, but still counts for "could this job
    // ever fit" (it is probably reconnecting).
    if (for_scheduling && !entry.link) n.state = placement::NodeState::kDown;
    n.used.assign(n.gpus, false);
    n.cpus = entry.record.cpus;
    n.cpuUsed.assign(n.cpus.size(), false);
    n.memoryBytes = entry.record.memory_bytes;
    n.topology = topologyOf(entry.record);
    for (const auto& [gpu, fault] : entry.record.gpu_faults)
      if (!fault.cleared && gpu >= 0 && gpu < n.gpus) n.used[gpu] = true;  // no job until an admin clears it
    auto u = usage.find(name);
    if (u != usage.end()) {
      for (int g : u->second.gpus) {
        if (g >= 0 && g < n.gpus) n.used[g] = true;
      }
      for (size_t i = 0; i < n.cpus.size(); ++i) n.cpuUsed[i] = u->second.cpus.count(n.cpus[i]) > 0;
      n.memoryUsed = u->second.memory_bytes;
    }
    cluster.nodes.push_back(std::move(n));
  }
  return cluster;
}

}  // namespace ddl::coordinator
