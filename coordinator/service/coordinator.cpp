#include "service/coordinator.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cassert>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <future>
#include <limits>
#include <string_view>
#include <thread>

#include "common/array_spec.h"
#include "common/clock.h"
#include "common/rank_env.h"
#include "common/resources.h"
#include "common/signals.h"
#include "placement/placement.h"
#include "service/actor.h"
#include "service/convert.h"
#include "service/launch_plan.h"
#include "service/log_relay.h"

namespace ddl::coordinator {

namespace {

using state::JobState;

bool isLive(JobState s) {
  return s == JobState::kScheduled || s == JobState::kStarting || s == JobState::kRunning;
}

bool isValidName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  return std::all_of(name.begin(), name.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_' || c == '.'; });
}

std::string describeExit(const v1::RankStatus& r) {
  if (r.has_signal()) {
    const char* name = signalAbbrev(r.signal());
    return "was killed by signal " + (name ? std::string(name) : std::to_string(r.signal()));
  }
  std::string text = "exited with code " + std::to_string(r.exit_code());
  // A shell's codes for a program that could not be run (the agent reports its own error text when it knows).
  if (r.exit_code() == 127) text += " (the program was not found: could not be executed)";
  if (r.exit_code() == 126) text += " (the program could not be executed: permission denied or not a program)";
  return text;
}

// When the latest attempt reached `state` (STARTING: launched; RUNNING: what a time limit counts from); 0 if
// it never did, or the job was requeued since.
int64_t latestAttemptReached(const state::Job& job, JobState state) {
  for (auto t = job.transitions.rbegin(); t != job.transitions.rend(); ++t) {
    if (t->to == state) return t->at_ms;
    if (t->to == JobState::kPending && t->from != JobState::kPending) return 0;  // requeued since
  }
  return 0;
}

bool exitedCleanly(const v1::RankStatus& r) {
  return r.state() == v1::RankStatus::EXITED && !r.has_signal() && r.exit_code() == 0;
}

placement::NodeState toPlacement(state::NodeState s) {
  switch (s) {
    case state::NodeState::kUp:
      return placement::NodeState::kUp;
    case state::NodeState::kDraining:
      return placement::NodeState::kDraining;
    case state::NodeState::kDown:
      return placement::NodeState::kDown;
  }
  return placement::NodeState::kDown;
}

// A job as users see it, from its record alone (the loop adds what only it knows: toProtoOnLoop).
v1::Job jobToProto(const state::Job& job) {
  v1::Job out;
  out.set_id(job.id);
  toProto(job.spec, out.mutable_spec());
  out.set_state(toProto(job.state));
  out.set_restarts(job.restarts);
  out.set_submit_ms(job.submit_ms);
  for (const auto& t : job.transitions) {
    v1::Transition* p = out.add_transitions();
    p->set_from(toProto(t.from));
    p->set_to(toProto(t.to));
    p->set_at_ms(t.at_ms);
    p->set_reason(t.reason);
    if (t.failure) toProto(*t.failure, p->mutable_failure());
  }
  if (job.failure) toProto(*job.failure, out.mutable_failure());
  for (const auto& a : job.allocation) {
    v1::NodeAllocation* p = out.add_allocation();
    p->set_node(a.node);
    for (int g : a.gpus) p->add_gpus(g);
    for (int c : a.cpus) p->add_cpus(c);
    p->set_memory_bytes(a.memory_bytes);
  }
  out.set_topology(job.topology);
  if (!job.transitions.empty()) out.set_reason(job.transitions.back().reason);
  out.set_gpus(requestOf(job.id, job.spec).gpuCount());
  out.set_held(job.held);
  out.set_held_by_admin(job.held_by_admin);
  out.set_start_ms(latestAttemptReached(job, JobState::kStarting));
  out.set_end_ms(state::endedAtMs(job));
  for (const auto& r : job.ranks) {
    if (r.pid == 0 && r.started_ms == 0 && !r.exited) continue;  // placed, never reported
    v1::RankStatus* rank = out.add_ranks();
    toProto(r, rank);
    rank->set_job_id(job.id);
  }
  return out;
}

}  // namespace

Coordinator::Coordinator(state::Store& store, CoordinatorOptions options, std::function<int64_t()> now_ms,
                         std::function<int64_t()> wall_ms)
    : store_(store),
      options_(options),
      now_ms_(now_ms ? now_ms : std::function<int64_t()>(ddl::steadyNowMs)),
      wall_ms_(wall_ms  ? std::move(wall_ms)
               : now_ms ? std::move(now_ms)
                        : state::systemNowMs) {
  counters_.scheduling_bounds_s = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                   2.5,   5,    10,    30,   60,  300,  1800};
  counters_.scheduling_buckets.assign(counters_.scheduling_bounds_s.size() + 1, 0);
  GroupCommitter::Options co;
  co.retry_max_ms = options_.store_retry_max_ms;
  co.retention_ms = options_.history_retention_ms;
  co.wall_ms = wall_ms_;
  actor_ = std::make_unique<Actor>(store_, co, [this] { evictFinishedOnLoop(); });
  logs_ = std::make_unique<LogRelay>(actor_->io(), options_.log_timeout_ms, CoordinatorOptions::kMaxLogReads);
  reader_ = std::make_unique<StoreReader>();
}

Coordinator::~Coordinator() {
  stop();
  reader_->stop();
  actor_->stopLoop();
  logs_.reset();  // its timers go before the loop's io_context
}

bool Coordinator::onLoop() const { return actor_->onLoop(); }

void Coordinator::post(std::function<void()> fn) { actor_->post(std::move(fn)); }

void Coordinator::whenDurable(std::function<void()> done) {
  post([this, done = std::move(done)]() mutable { actor_->afterCommit(std::move(done)); });
}

Coordinator::Health Coordinator::health() const { return actor_->health(); }

void Coordinator::putJobOnLoop(const state::Job& job, bool new_job) {
  state::Write w;
  w.kind = state::Write::Kind::kPutJob;
  w.job = job;
  w.new_job = new_job;
  actor_->put(std::move(w));
}

void Coordinator::putNodeOnLoop(const state::NodeRecord& record) {
  ++node_epoch_;
  state::Write w;
  w.kind = state::Write::Kind::kPutNode;
  w.node = record;
  actor_->put(std::move(w));
}

void Coordinator::evictFinishedOnLoop() {
  const int64_t now = wall_ms_();
  while (!finished_.empty()) {
    const Finished& f = finished_.front();
    const bool over = finished_.size() > options_.max_finished_in_memory ||
                      now - f.ended_ms > options_.finished_in_memory_ms;
    if (!over || f.seq > actor_->committedBatch()) break;
    if (auto re = rewritten_final_.find(f.id); re != rewritten_final_.end()) {
      if (re->second > actor_->committedBatch()) break;  // its latest write is not durable yet
      rewritten_final_.erase(re);
    }
    auto it = jobs_.find(f.id);
    if (it != jobs_.end() && state::isTerminal(it->second.state)) {
      jobs_.erase(it);
      pending_reason_.erase(f.id);
    }
    finished_.pop_front();
  }
}

// ---- Lifecycle
// ---------------------------------------------------------------------------------------------

Status Coordinator::recover() {
  return actor_->call<Status>([this] { return recoverOnLoop(); });
}

Status Coordinator::recoverOnLoop() {
  const int64_t now = now_ms_();
  auto nodes = store_.listNodes();
  if (!nodes) return nodes.status();
  for (auto& record : *nodes) {
    NodeEntry& entry = nodes_[record.name];
    entry.record = record;
    entry.port_first = options_.port_first;
    entry.port_last = options_.port_last;
    entry.last_seen_ms = now;  // every node gets a full grace period to reconnect
    if (record.state != state::NodeState::kDown) recovery_until_ms_ = now + options_.heartbeat_grace_ms;
  }
  auto last = store_.lastJobNumber();
  if (!last) return last.status();
  last_job_number_ = *last;
  // Every job that has not ended, and the most recent final ones; older history stays in the store.
  state::JobFilter open;
  for (auto st : state::kAllJobStates) {
    if (!state::isTerminal(st)) open.states.insert(st);
  }
  auto live = store_.listJobsPage(open, 0, std::numeric_limits<int>::max());
  if (!live) return live.status();
  state::JobFilter ended;
  for (auto st : state::kAllJobStates) {
    if (state::isTerminal(st)) ended.states.insert(st);
  }
  auto recent = store_.listJobsPage(ended, 0, static_cast<int>(options_.max_finished_in_memory), true);
  if (!recent) return recent.status();
  std::vector<const state::Job*> finished;
  for (auto& job : *recent) {
    jobs_[job.id] = job;
    finished.push_back(&jobs_[job.id]);
  }
  std::sort(finished.begin(), finished.end(), [](const state::Job* a, const state::Job* b) {
    return state::endedAtMs(*a) < state::endedAtMs(*b);
  });
  for (const state::Job* job : finished) finished_.push_back({job->id, 0, state::endedAtMs(*job)});
  for (auto& job : *live) jobs_[job.id] = job;
  std::vector<std::string> ended_deps;  // dependencies that ended without their dependents being told (none
                                        // unless a crash came between): resolved below, once all is loaded
  for (auto& job : *live) {
    for (const auto& dep : job.waiting_for) {
      dependents_[dep].insert(job.id);
      auto it = jobs_.find(dep);
      if (it == jobs_.end() || state::isTerminal(it->second.state)) ended_deps.push_back(dep);
    }
  }
  for (const auto& dep : ended_deps) {
    if (!jobs_.count(dep)) {
      auto stored = store_.getJob(dep);  // recover runs before anything else; reading here is fine
      if (!stored && stored.status().code() != StatusCode::kNotFound) {
        spdlog::warn("recover: dependency {}: {}; read again by the scheduling passes", dep,
                     stored.status().toString());
        continue;
      }
      if (stored) {
        jobs_[dep] = *stored;
        finished_.push_back({dep, 0, state::endedAtMs(*stored)});  // leaves memory as other final jobs do
      }
    }
    resolveDependentsOnLoop(dep);
  }
  for (auto& job : *live) {
    const std::string& id = job.id;
    if (job.state == JobState::kScheduled) {
      Status st = recordTransitionOnLoop(
          id, JobState::kPending, "coordinator restarted before the launch was confirmed; placing again");
      if (!st) spdlog::error("recover: {}", st.toString());
    } else if (isLive(job.state)) {
      placement::RingLayout layout;
      std::string err = placement::buildRingLayout(toPlacement(job.allocation), snapshotOnLoop(false),
                                                   job.topology, &layout);
      if (!err.empty()) {
        failJobOnLoop(id, "coordinator restarted and cannot rebuild the ring layout: " + err, std::nullopt);
        continue;
      }
      buildRuntimeOnLoop(jobs_[id], layout);
    }
  }
  spdlog::info("recovered {} open and {} recent final jobs and {} nodes from the store (last job number {})",
               live->size(), recent->size(), nodes_.size(), last_job_number_);
  return Status::ok();
}

void Coordinator::start() {
  post([this] {
    if (stopping_) return;
    actor_->startTicker(options_.tick_ms, [this] {
      housekeepingOnLoop();
      schedulePassOnLoop();
      evictFinishedOnLoop();
    });
  });
}

void Coordinator::closeAgents() {
  if (!actor_ || onLoop() || actor_->io().stopped()) return;
  actor_->call<bool>(
      [this] {
        stopping_ = true;
        actor_->stopTicker();
        for (auto& [name, node] : nodes_) {
          if (node.link) node.link->close();
          node.link.reset();
        }
        logs_->cancelTimers();
        return true;
      },
      /*wait_for_commit=*/false);
}

void Coordinator::stop() {
  if (!actor_) return;
  closeAgents();
  actor_->stopCommitter();  // stores what is left
}

void Coordinator::tick() {
  actor_->call<bool>([this] {
    housekeepingOnLoop();
    schedulePassOnLoop();
    evictFinishedOnLoop();
    return true;
  });
}

void Coordinator::housekeepingOnLoop() {
  const int64_t now = now_ms_();
  checkHeartbeatsOnLoop(now);
  sweepLostJobsOnLoop();
  enforceTimeLimitsOnLoop();
  if (const int64_t wall = wall_ms_(); telemetry_.clusterDue(wall)) {  // the dashboard's cluster plot
    const MetricsSnapshot m = metricsOnLoop();
    telemetry_.recordCluster(wall, m.gpus_allocated, m.gpus_total, m.jobs_by_state,
                             [this](const std::string& id) {
                               auto job = jobs_.find(id);
                               return job != jobs_.end() && isLive(job->second.state);
                             });
  }
  if (recovery_until_ms_ != 0) {
    bool all_back = std::all_of(nodes_.begin(), nodes_.end(), [](const auto& kv) {
      return kv.second.record.state == state::NodeState::kDown || kv.second.link != nullptr;
    });
    if (all_back || now >= recovery_until_ms_) {
      spdlog::info("recovery over: {}", all_back ? "every node reconnected" : "grace period passed");
      recovery_until_ms_ = 0;
      schedule_wanted_ = true;
    }
  }
}

void Coordinator::enforceTimeLimitsOnLoop() {
  const int64_t now = wall_ms_();
  std::vector<std::string> over;
  for (const auto& [id, rt] : runtime_) {  // the launched jobs only
    auto it = jobs_.find(id);
    if (it == jobs_.end() || it->second.state != JobState::kRunning || it->second.spec.time_limit_s <= 0) continue;
    const int64_t started = latestAttemptReached(it->second, JobState::kRunning);
    if (started > 0 && now - started >= it->second.spec.time_limit_s * 1000) over.push_back(id);
  }
  for (const auto& id : over) {
    const state::Job& job = jobs_[id];
    const int attempt = runtime_[id].attempt;
    const auto allocation = job.allocation;
    const std::string reason = "ran past its time limit of " + secondsText(job.spec.time_limit_s * 1000) +
                               " (--time); its ranks were sent SIGTERM, and SIGKILL after " +
                               secondsText(options_.stop_grace_ms);
    Status st = recordTransitionOnLoop(id, JobState::kTimeout, reason);
    if (!st) {
      spdlog::error("job {}: {}", id, st.toString());
      continue;
    }
    stopJobEverywhereOnLoop(id, attempt, "time limit reached", allocation);
  }
}

bool Coordinator::recoveringOnLoop(int64_t now) const {
  return recovery_until_ms_ != 0 && now < recovery_until_ms_;
}

// ---- Jobs: transitions, scheduling, launch
// -----------------------------------------------------------------

Status Coordinator::recordTransitionOnLoop(const std::string& id, JobState to, const std::string& reason,
                                           const std::optional<state::Failure>& failure,
                                           bool counts_as_restart) {
  auto found = jobs_.find(id);
  if (found == jobs_.end()) return state::jobNotFound(id);
  state::Job job = found->second;
  const JobState from = job.state;
  Status applied = state::applyTransition(job, to, reason, failure, wall_ms_(), counts_as_restart);
  if (!applied) return applied;
  spdlog::info("job {}: {} -> {}: {}", id, toString(from), toString(job.state), reason);
  if (to == JobState::kFailed) ++counters_.jobs_failed_total;
  if (to == JobState::kScheduled) {
    // Queued since the last move to PENDING (the submit, or a requeue).
    int64_t queued_at = job.submit_ms;
    for (const auto& t : job.transitions) {
      if (t.to == JobState::kPending) queued_at = t.at_ms;
    }
    const double waited = std::max<int64_t>(0, job.transitions.back().at_ms - queued_at) / 1000.0;
    const auto& bounds = counters_.scheduling_bounds_s;
    counters_.scheduling_buckets[std::lower_bound(bounds.begin(), bounds.end(), waited) - bounds.begin()]++;
    counters_.scheduling_sum_s += waited;
    counters_.scheduling_count++;
  }
  found->second = std::move(job);
  putJobOnLoop(found->second);
  if (state::isTerminal(found->second.state)) {
    finished_.push_back(
        {id, actor_->nextBatch(), state::endedAtMs(found->second)});  // the batch this turn makes
  }
  if (!isLive(found->second.state)) runtime_.erase(id);
  if (found->second.state != JobState::kPending) pending_reason_.erase(id);
  schedule_wanted_ = true;
  if (state::isTerminal(found->second.state)) {
    // It waits for nothing any more, and what waited for it may go (or never will).
    for (const auto& dep : found->second.waiting_for) {
      auto waiting = dependents_.find(dep);
      if (waiting == dependents_.end()) continue;
      waiting->second.erase(id);
      if (waiting->second.empty()) dependents_.erase(waiting);
    }
    resolveDependentsOnLoop(id);
  }
  return Status::ok();
}

void Coordinator::resolveDependentsOnLoop(const std::string& id) {
  ended_for_dependents_.push_back(id);
  if (resolving_dependents_) return;  // the loop below is already running further up the stack
  resolving_dependents_ = true;
  while (!ended_for_dependents_.empty()) {
    const std::string dep = ended_for_dependents_.front();
    ended_for_dependents_.pop_front();
    auto waiting = dependents_.find(dep);
    if (waiting == dependents_.end()) continue;
    const std::set<std::string> ids = std::move(waiting->second);
    dependents_.erase(waiting);
    auto ended = jobs_.find(dep);
    const bool gone = ended == jobs_.end();  // purged from the history: how it ended is not known
    const JobState dep_state = gone ? JobState::kFailed : ended->second.state;
    for (const auto& dependent : ids) {
      auto it = jobs_.find(dependent);
      if (it == jobs_.end() || it->second.state != JobState::kPending) continue;
      state::Job& job = it->second;
      const auto& ok = job.spec.after_ok;
      if (dep_state != JobState::kSucceeded && std::find(ok.begin(), ok.end(), dep) != ok.end()) {
        Status st = recordTransitionOnLoop(
            dependent, JobState::kCancelled,
            "dependency " + dep +
                (gone ? " is no longer in the job history" : " ended " + std::string(toString(dep_state))) +
                ", and the job runs only after it succeeds (--after-ok)");
        if (!st) spdlog::error("job {}: {}", dependent, st.toString());
        continue;  // recordTransitionOnLoop queued this job's own dependents
      }
      job.waiting_for.erase(std::remove(job.waiting_for.begin(), job.waiting_for.end(), dep),
                            job.waiting_for.end());
      putJobOnLoop(job);
      schedule_wanted_ = true;
    }
  }
  resolving_dependents_ = false;
}

std::string Coordinator::notYetOnLoop(const state::Job& job, const std::map<std::string, int>& array_running) const {
  if (job.held_by_admin) return "held by an admin: an admin releases it with ddlctl release " + job.id;
  if (job.held) return "held: release it with ddlctl release " + job.id;
  if (!job.waiting_for.empty()) {
    const std::string& dep = job.waiting_for.front();
    auto it = jobs_.find(dep);
    const auto& ok = job.spec.after_ok;
    const bool needs_success = std::find(ok.begin(), ok.end(), dep) != ok.end();
    std::string text = "waiting for " + dep + (it != jobs_.end() ? std::string(" (") + toString(it->second.state) + ")" : "") +
                       (needs_success ? " to succeed" : " to end");
    if (job.waiting_for.size() > 1) text += " and " + std::to_string(job.waiting_for.size() - 1) + " more";
    return text;
  }
  if (!job.spec.array_id.empty() && job.spec.array_max_running > 0) {
    auto it = array_running.find(job.spec.array_id);
    const int running = it != array_running.end() ? it->second : 0;
    if (running >= job.spec.array_max_running)
      return "array " + job.spec.array_id + " already runs or is placing " + std::to_string(running) + " of its jobs (limit " +
             std::to_string(job.spec.array_max_running) + ")";
  }
  return "";
}

int Coordinator::attemptOf(const state::Job& job) {
  return static_cast<int>(std::count_if(job.transitions.begin(), job.transitions.end(),
                                        [](const auto& t) { return t.to == JobState::kScheduled; }));
}

void Coordinator::readMissingDependenciesOnLoop() {
  // A dependency neither in memory nor live: one that could not be read at recovery. Read it again (a few per
  // pass, on the reader thread) and resolve its dependents once it is known.
  int asked = 0;
  for (const auto& [dep, waiting] : dependents_) {
    if (jobs_.count(dep) || asked >= 16) continue;
    ++asked;
    withJobOnLoop(dep, [this, dep = dep](StatusOr<state::Job> job) {
      if (jobs_.count(dep) || !dependents_.count(dep)) return;
      if (!job && job.status().code() != StatusCode::kNotFound) return;  // still unreadable: the next pass
      if (job) {
        jobs_[dep] = *job;
        finished_.push_back({dep, 0, state::endedAtMs(*job)});
      }
      resolveDependentsOnLoop(dep);
    });
  }
}

void Coordinator::schedulePassOnLoop() {
  readMissingDependenciesOnLoop();
  if (!schedule_wanted_) return;
  schedule_wanted_ = false;
  const int64_t now = now_ms_();
  std::map<std::string, int> array_running;  // array id -> its live jobs
  for (const auto& [id, job] : jobs_) {
    if (isLive(job.state) && !job.spec.array_id.empty()) ++array_running[job.spec.array_id];
  }
  std::vector<placement::JobRequest> queue;
  // An array's jobs enter placement only up to its limit (the earliest first), so that no other job is
  // weighed against GPUs given to array jobs that may not start.
  std::map<std::string, int> array_slots = array_running;
  for (const auto& [id, job] : jobs_) {
    if (job.state != JobState::kPending) continue;
    if (std::string why = notYetOnLoop(job, array_slots); !why.empty()) {
      pending_reason_[id] = why;
      continue;
    }
    if (!job.spec.array_id.empty()) ++array_slots[job.spec.array_id];
    queue.push_back(requestOf(id, job.spec));
  }
  if (queue.empty()) return;
  if (recoveringOnLoop(now)) {
    for (const auto& r : queue) {
      pending_reason_[r.id] = "coordinator restarted; waiting up to " +
                              secondsText(recovery_until_ms_ - now) + " for agents to reconnect";
    }
    return;
  }
  placement::Cluster cluster = snapshotOnLoop(true);
  placement::ScheduleResult result = placement::schedule(cluster, queue);
  // The GPUs in use, once for the pass (not once per decision: that was quadratic at thousands of jobs),
  // with each start added as it is applied.
  auto usage = usageOnLoop();
  for (const auto& d : result.decisions) {
    auto it = jobs_.find(d.jobId);
    if (it == jobs_.end() || it->second.state != JobState::kPending) continue;  // cancelled meanwhile
    const state::Job& job = it->second;
    if (d.action == placement::Decision::Action::kPending) {
      pending_reason_[d.jobId] = d.reason;
      continue;
    }
    if (d.action == placement::Decision::Action::kRefused) {
      Status st =
          recordTransitionOnLoop(d.jobId, JobState::kFailed, "can never run on this cluster: " + d.reason);
      if (!st) spdlog::error("schedule: {}", st.toString());
      continue;
    }
    if (!stillFreeOnLoop(d.allocation, usage)) {
      schedule_wanted_ = true;  // the cluster changed while placement ran: decide again next tick
      continue;
    }
    if (std::string why = notYetOnLoop(job, array_running); !why.empty()) {
      pending_reason_[d.jobId] = why;  // its array reached its limit earlier in this pass
      continue;
    }
    placement::RingLayout layout;
    std::string err = placement::buildRingLayout(d.allocation, cluster, job.spec.topology_override, &layout);
    if (err.empty()) err = placement::validateRingLayout(layout);
    if (!err.empty()) {
      Status st = recordTransitionOnLoop(d.jobId, JobState::kFailed, "no valid ring layout: " + err);
      if (!st) spdlog::error("schedule: {}", st.toString());
      continue;
    }
    const int port = pickPortOnLoop(layout.ranks.empty() ? "" : layout.ranks[0].node, d.jobId);
    Status st = state::checkAllocationAllowed(job);
    if (st) {
      jobs_[d.jobId].allocation = toState(d.allocation);
      jobs_[d.jobId].topology = layout.topology();
      jobs_[d.jobId].root_port = port;
      st = recordTransitionOnLoop(d.jobId, JobState::kScheduled,
                                  std::string(d.backfilled ? "backfilled on " : "placed on ") +
                                      d.allocation.str() + ", ring " + layout.topology());
    }
    if (!st) {
      spdlog::error("schedule: job {}: {}; it stays pending", d.jobId, st.toString());
      pending_reason_[d.jobId] = "the coordinator could not record its placement: " + st.message();
      continue;
    }
    if (!job.spec.array_id.empty()) ++array_running[job.spec.array_id];
    launchOnLoop(d.jobId, d.allocation, layout);
    for (const auto& a : d.allocation.nodes) {
      usage[a.node].gpus.insert(a.gpus.begin(), a.gpus.end());
      usage[a.node].cpus.insert(a.cpus.begin(), a.cpus.end());
      usage[a.node].memory_bytes += a.memoryBytes;
    }
  }
}

void Coordinator::buildRuntimeOnLoop(const state::Job& job, const placement::RingLayout& layout) {
  JobRuntime& rt = runtime_[job.id];
  rt = JobRuntime{};
  rt.attempt = attemptOf(job);
  rt.root_node = layout.ranks.empty() ? "" : layout.ranks[0].node;
  for (const auto& slot : layout.ranks) rt.rank_node[slot.rank] = slot.node;
  // The port recorded at placement; jobs placed before it was recorded (state schema 3) derive it again.
  rt.port = job.root_port > 0 ? job.root_port : pickPortOnLoop(rt.root_node, job.id);
}

void Coordinator::launchOnLoop(const std::string& id, const placement::Allocation& allocation,
                               const placement::RingLayout& layout) {
  const state::Job& job = jobs_[id];
  buildRuntimeOnLoop(job, layout);
  const JobRuntime& rt = runtime_[id];
  const std::string root_addr = nodes_[rt.root_node].record.address;

  // One secret per launch: every rank of this attempt holds it, no other process does (it travels in
  // StartRanks over the agents' TLS streams and lives in the ranks' environments, readable only by the job's
  // user).
  const std::string secret = newJobSecret();
  if (secret.empty()) {  // never launch with an open rendezvous
    Status back =
        recordTransitionOnLoop(id, JobState::kPending, "no random bytes for the job's secret; retrying");
    if (!back) spdlog::error("launch: {}", back.toString());
    return;
  }
  const std::map<std::string, v1::Command> commands =
      startCommands(job, allocation, layout,
                    LaunchTarget{rt.attempt, root_addr, rt.port, secret, options_.allow_root_jobs});
  // The results kept are the latest attempt's; each rank's node is known from now on, so only that node's
  // agent can report it.
  jobs_[id].ranks = placedRanks(layout, rt.attempt);
  // STARTING is written before anything is sent: a job whose start may have gone out is never silently
  // rescheduled. If the write fails, nothing was sent and the job goes back to the queue.
  Status st = recordTransitionOnLoop(
      id, JobState::kStarting,
      "start sent to " + std::to_string(commands.size()) + " node" + (commands.size() == 1 ? "" : "s"));
  if (!st) {
    spdlog::error("launch: {}", st.toString());
    Status back =
        recordTransitionOnLoop(id, JobState::kPending, "could not record the launch: " + st.message());
    if (!back) spdlog::error("launch: {}", back.toString());
    return;
  }
  for (const auto& [node, cmd] : commands) sendOnLoop(node, cmd);
}

int Coordinator::pickPortOnLoop(const std::string& node, const std::string& job) const {
  auto it = nodes_.find(node);
  int first = it != nodes_.end() && it->second.port_first ? it->second.port_first : options_.port_first;
  int last = it != nodes_.end() && it->second.port_last ? it->second.port_last : options_.port_last;
  return rootPort(job, first, last, [&](int port) {
    return std::any_of(runtime_.begin(), runtime_.end(), [&](const auto& kv) {
      return kv.first != job && kv.second.root_node == node && kv.second.port == port;
    });
  });
}

void Coordinator::sendOnLoop(const std::string& node, const v1::Command& command) {
  if (nodes_.find(node) == nodes_.end()) return;
  // Commands go out once what led to them is durable (a StartRanks never leaves before STARTING is stored).
  actor_->afterCommit([this, node, command] {
    auto it = nodes_.find(node);
    if (it == nodes_.end()) return;
    if (it->second.link) {
      it->second.link->send(command);
    } else if (it->second.outbox.size() < kMaxOutbox) {
      it->second.outbox.push_back(command);
    } else {
      spdlog::warn(
          "node {}: {} commands wait for its agent; dropping one (the agent reconciles when it is back)",
          node, kMaxOutbox);
    }
  });
}

v1::Command Coordinator::stopCommand(const std::string& id, int attempt, const std::string& reason) const {
  v1::Command cmd;
  v1::StopJob* stop = cmd.mutable_stop();
  stop->set_job_id(id);
  stop->set_attempt(attempt);
  stop->set_grace_ms(static_cast<int32_t>(options_.stop_grace_ms));
  stop->set_reason(reason);
  return cmd;
}

void Coordinator::stopJobEverywhereOnLoop(const std::string& id, int attempt, const std::string& reason,
                                          const std::vector<state::NodeAllocation>& allocation) {
  const v1::Command cmd = stopCommand(id, attempt, reason);
  for (const auto& a : allocation) sendOnLoop(a.node, cmd);
}

void Coordinator::failJobOnLoop(const std::string& id, const std::string& reason,
                                std::optional<state::Failure> failure) {
  state::Job& job = jobs_[id];
  if (!isLive(job.state)) return;
  const int attempt = runtime_.count(id) ? runtime_[id].attempt : attemptOf(job);
  const auto allocation = job.allocation;  // the requeue clears it; the stops need it
  Status st;
  if (job.restarts < job.spec.max_restarts && job.state != JobState::kScheduled) {
    st = recordTransitionOnLoop(id, JobState::kPending,
                                "requeued (restart " + std::to_string(job.restarts + 1) + " of " +
                                    std::to_string(job.spec.max_restarts) + "): " + reason,
                                failure);
  } else {
    st = recordTransitionOnLoop(id, JobState::kFailed, reason, failure);
  }
  if (!st) spdlog::error("job {}: {}", id, st.toString());
  stopJobEverywhereOnLoop(id, attempt, reason, allocation);
}

void Coordinator::maybeCompleteOnLoop(const std::string& id) {
  auto rt = runtime_.find(id);
  if (rt == runtime_.end()) return;
  const size_t nranks = rt->second.rank_node.size();
  const auto& ranks = rt->second.ranks;
  if (jobs_[id].state == JobState::kStarting && ranks.size() == nranks) {
    Status st =
        recordTransitionOnLoop(id, JobState::kRunning, "all " + std::to_string(nranks) + " ranks started");
    if (!st) spdlog::error("job {}: {}", id, st.toString());
  }
  if (jobs_[id].state != JobState::kRunning || ranks.size() != nranks) return;
  if (!std::all_of(ranks.begin(), ranks.end(), [](const auto& kv) { return exitedCleanly(kv.second); }))
    return;
  const int attempt = rt->second.attempt;
  Status st = recordTransitionOnLoop(id, JobState::kSucceeded,
                                     "all " + std::to_string(nranks) + " ranks exited with code 0");
  if (!st) spdlog::error("job {}: {}", id, st.toString());
  // Releases the exited ranks on the agents.
  stopJobEverywhereOnLoop(id, attempt, "job succeeded", jobs_[id].allocation);
}

// ---- Nodes and agents
// ----------------------------------------------------------------------------------------

void Coordinator::checkHeartbeatsOnLoop(int64_t now) {
  for (auto& [name, node] : nodes_) {
    if (node.record.state == state::NodeState::kDown) continue;
    if (now - node.last_seen_ms <= options_.heartbeat_grace_ms) continue;
    const std::string reason = "node_lost: node " + name + " sent no heartbeat for " +
                               secondsText(now - node.last_seen_ms) + " (grace " +
                               secondsText(options_.heartbeat_grace_ms) + ")";
    spdlog::warn("{}; marking it DOWN", reason);
    node.record.state = state::NodeState::kDown;
    putNodeOnLoop(node.record);
    if (node.link) node.link->close();
    node.link.reset();
    node.outbox.clear();
    loseNodeJobsOnLoop(name, reason);
    node.ranks.clear();
    schedule_wanted_ = true;
  }
}

void Coordinator::sweepLostJobsOnLoop() {
  std::vector<std::pair<std::string, std::string>> victims;  // (job, node)
  for (const auto& [id, job] : jobs_) {
    if (!isLive(job.state)) continue;
    for (const auto& a : job.allocation) {
      auto node = nodes_.find(a.node);
      if (node == nodes_.end() || node->second.record.state == state::NodeState::kDown) {
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
                                     const std::string& only_job) {
  std::vector<std::string> victims;
  for (const auto& [id, job] : jobs_) {
    if (!isLive(job.state) || (!only_job.empty() && id != only_job)) continue;
    for (const auto& a : job.allocation) {
      if (a.node == node) victims.push_back(id);
    }
  }
  for (const auto& id : victims) failJobOnLoop(id, reason, std::nullopt);
}

void Coordinator::registerAgent(const v1::RegisterRequest& req,
                                std::function<void(StatusOr<v1::RegisterResponse>)> done) {
  post([this, req, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::RegisterResponse>>(registerAgentOnLoop(req));
    actor_->reply([done, result] { done(std::move(*result)); }, result->isOk());
  });
}

StatusOr<v1::RegisterResponse> Coordinator::registerAgentOnLoop(const v1::RegisterRequest& req) {
  if (!isValidName(req.node())) {
    return Status::invalidArgument("register: node name '" + req.node() +
                                   "' is empty or has characters other than letters, digits, '-', '_', '.'");
  }
  if (req.address().empty())
    return Status::invalidArgument("register: node " + req.node() + " gave no address");
  for (int i = 0; i < req.gpus_size(); ++i) {
    if (req.gpus(i).index() != i) {
      return Status::invalidArgument("register: node " + req.node() + ": GPU " + std::to_string(i) +
                                     " has index " + std::to_string(req.gpus(i).index()) +
                                     "; list GPUs by index 0..n-1");
    }
  }
  std::vector<int> cpus(req.cpus().begin(), req.cpus().end());
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  if (!cpus.empty() && (cpus.front() < 0 || cpus.back() > kMaxCpuId))
    return Status::invalidArgument("register: node " + req.node() + ": CPU ids must lie in 0-" +
                                   std::to_string(kMaxCpuId));
  if (req.memory_bytes() < 0)
    return Status::invalidArgument("register: node " + req.node() + ": negative memory");
  int first = req.port_first(), last = req.port_last();
  if (first == 0 && last == 0) {
    first = options_.port_first;
    last = options_.port_last;
  } else if (first < 1024 || last > 65535 || last <= first) {
    return Status::invalidArgument("register: node " + req.node() + ": port range " + std::to_string(first) +
                                   "-" + std::to_string(last) + " must lie in 1024-65535 and hold 2 ports");
  }

  const int64_t now = now_ms_();
  // Another live agent already holds this node (its stream is attached, or it registered moments ago and is
  // about to attach): a second ddl-agent with the same --node, a cloned machine or a copied certificate.
  // Refused, naming both, instead of the two taking turns. An agent that restarts is another instance too:
  // its predecessor's stream closed when it stopped or died, so it is let in at once.
  if (auto it = nodes_.find(req.node()); it != nodes_.end() && !req.instance().empty() &&
                                         !it->second.instance.empty() &&
                                         it->second.instance != req.instance()) {
    const NodeEntry& held = it->second;
    const int64_t silent = now - held.last_seen_ms;
    if (held.link || (!held.attached && now - held.registered_ms < 2 * options_.heartbeat_interval_ms)) {
      return Status::failedPrecondition(
          "register: node " + req.node() + " is held by another live ddl-agent (at " + held.registered_from +
          ", heard from " + secondsText(silent) + " ago); this one (at " + req.address() +
          ") is refused. Two agents claim one node name: give each machine its own --node and certificate, "
          "or "
          "stop one; a restarted agent is let in once its predecessor's connection is gone");
    }
  }
  NodeEntry& node = nodes_[req.node()];
  state::NodeRecord record = node.record;
  record.name = req.node();
  record.address = req.address();
  record.gpus.clear();
  for (const auto& g : req.gpus()) record.gpus.push_back({g.index(), g.uuid(), g.model(), g.memory_bytes()});
  record.labels = {req.labels().begin(), req.labels().end()};
  record.cpus = std::move(cpus);
  record.memory_bytes = req.memory_bytes();
  if (record.state == state::NodeState::kDown) {
    record.state = record.drained ? state::NodeState::kDraining : state::NodeState::kUp;
  }
  record.last_heartbeat_ms = wall_ms_();
  putNodeOnLoop(record);
  if (node.link) node.link->close();
  node.link.reset();
  node.outbox.clear();  // commands for the old stream are lost with it; reconciliation below decides
  node.record = record;
  node.nics.assign(req.nics().begin(), req.nics().end());
  node.confinement = req.confinement().substr(0, 1024);
  node.port_first = first;
  node.port_last = last;
  node.last_seen_ms = now;
  node.session = req.node() + "-" + std::to_string(wall_ms_()) + "-" + std::to_string(++session_counter_);
  node.instance = req.instance();
  node.registered_from = req.address();
  node.registered_ms = now;
  node.attached = false;
  node.ranks.clear();

  std::set<std::pair<std::string, int>> stale;
  for (const auto& r : req.ranks()) applyRankReportOnLoop(node, r, &stale);
  // Ranks this node should run but no longer has (the agent restarted without them, or never got the start).
  std::vector<std::pair<std::string, int>>
      lost;  // (job, rank); failing a job edits runtime_, so collect first
  for (const auto& [id, rt] : runtime_) {
    for (const auto& [rank, where] : rt.rank_node) {
      if (where != req.node()) continue;
      auto known = rt.ranks.find(rank);
      bool reported = node.ranks.count(RankKey{id, rt.attempt, rank}) > 0;
      if (!reported && (known == rt.ranks.end() || !exitedCleanly(known->second))) {
        stale.erase({id, rt.attempt});
        lost.emplace_back(id, rank);
        break;
      }
    }
  }
  for (const auto& [id, rank] : lost) {
    loseNodeJobsOnLoop(req.node(),
                       "rank " + std::to_string(rank) + " of job " + id + " is gone from node " + req.node() +
                           " (its agent registered again without it)",
                       id);
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

Coordinator::NodeEntry* Coordinator::checkSessionOnLoop(const std::string& node, const std::string& session,
                                                        Status* error) {
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.session.empty()) {
    *error = Status::notFound("node " + node + " has not registered; call Register first");
    return nullptr;
  }
  if (it->second.session != session) {
    *error = Status::failedPrecondition("node " + node + ": session " + session +
                                        " is no longer current (the node registered again); register again");
    return nullptr;
  }
  if (it->second.record.state == state::NodeState::kDown) {
    *error = Status::failedPrecondition("node " + node + " was marked DOWN; register again");
    return nullptr;
  }
  return &it->second;
}

void Coordinator::attachAgent(const std::string& node, const std::string& session,
                              std::shared_ptr<AgentLink> link, StatusDone done) {
  post([this, node, session, link = std::move(link), done = std::move(done)] {
    done(attachAgentOnLoop(node, session, link));
  });
}

Status Coordinator::attachAgentOnLoop(const std::string& node, const std::string& session,
                                      std::shared_ptr<AgentLink> link) {
  Status error;
  NodeEntry* entry = checkSessionOnLoop(node, session, &error);
  if (!entry) return error;
  if (entry->link && entry->link != link) entry->link->close();
  entry->link = std::move(link);
  entry->attached = true;
  entry->last_seen_ms = now_ms_();
  // Queued commands were durable when they were queued: they go out first, in order, ahead of newer ones that
  // still wait for the store.
  for (const auto& cmd : entry->outbox) entry->link->send(cmd);
  entry->outbox.clear();
  schedule_wanted_ = true;
  return Status::ok();
}

void Coordinator::detachAgent(const std::string& node, const std::string& session,
                              const std::shared_ptr<AgentLink>& link) {
  post([this, node, session, link] {
    auto it = nodes_.find(node);
    if (it == nodes_.end() || it->second.session != session || it->second.link != link) return;
    it->second.link.reset();
    spdlog::info("node {}: agent stream closed; DOWN unless it is back within {}", node,
                 secondsText(options_.heartbeat_grace_ms));
  });
}

void Coordinator::applyRankReportOnLoop(NodeEntry& node, const v1::RankStatus& r,
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
    failJobOnLoop(r.job_id(),
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
  if (known && pos->exited) return;  // an exit is final
  if (known && !report.has_progress()) next.figures = pos->figures;  // an exit report may carry none
  if (known) {  // an exit report may leave out what the start said
    if (next.pid == 0) next.pid = pos->pid;
    if (next.program_pid == 0) next.program_pid = pos->program_pid;
    if (next.started_ms == 0) next.started_ms = pos->started_ms;
  }
  // A start or an exit is stored; progress stays in memory until the next write of the job.
  const bool store = !known || pos->exited != next.exited || pos->pid != next.pid ||
                     pos->program_pid != next.program_pid || pos->started_ms != next.started_ms;
  if (known) {
    *pos = std::move(next);
  } else {
    job.ranks.insert(pos, std::move(next));
  }
  if (store) {
    putJobOnLoop(job);
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
    sendOnLoop(node,
               stopCommand(job, attempt,
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
  NodeEntry* entry = checkSessionOnLoop(node, session, &error);
  if (!entry) return error;
  entry->last_seen_ms = now_ms_();
  entry->record.last_heartbeat_ms = wall_ms_();
  // Kept bounded; compared as kept, so an over-long warning is logged once, not at every heartbeat.
  if (const std::string_view warning = std::string_view(hb.warning()).substr(0, 1024); warning != entry->warning) {
    if (!warning.empty()) spdlog::warn("node {}: {}", node, warning);
    entry->warning.assign(warning);
  }
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
                       job);
  }
  stopStaleOnLoop(node, stale);
  return Status::ok();
}

void Coordinator::rankEvent(const std::string& node, const std::string& session, const v1::RankStatus& r,
                            StatusDone done) {
  post([this, node, session, r, done = std::move(done)] { done(rankEventOnLoop(node, session, r)); });
}

Status Coordinator::rankEventOnLoop(const std::string& node, const std::string& session,
                                    const v1::RankStatus& r) {
  Status error;
  NodeEntry* entry = checkSessionOnLoop(node, session, &error);
  if (!entry) return error;
  entry->last_seen_ms = now_ms_();
  std::set<std::pair<std::string, int>> stale;
  applyRankReportOnLoop(*entry, r, &stale);
  stopStaleOnLoop(node, stale);
  return Status::ok();
}

std::map<std::string, Coordinator::NodeUsage> Coordinator::usageOnLoop() const {
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
  for (const auto& [name, node] : nodes_) {
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
    auto node = nodes_.find(a.node);
    if (node == nodes_.end() || node->second.record.state != state::NodeState::kUp || !node->second.link) {
      return false;
    }
    const auto& used = usage[a.node].gpus;
    for (int g : a.gpus) {
      if (used.count(g)) return false;
    }
    const auto& cpus_used = usage[a.node].cpus;
    for (int c : a.cpus) {
      if (cpus_used.count(c)) return false;
    }
    if (a.memoryBytes > 0 && usage[a.node].memory_bytes + a.memoryBytes > node->second.record.memory_bytes) {
      return false;
    }
  }
  return true;
}

placement::Cluster Coordinator::snapshotOnLoop(bool for_scheduling) const {
  const auto usage = usageOnLoop();
  placement::Cluster cluster;
  cluster.nodes.reserve(nodes_.size());
  for (const auto& [name, entry] : nodes_) {
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

// ---- Users
// -------------------------------------------------------------------------------------------------

namespace {

// An array's jobs are whole copies of its spec, all in memory while they wait: their bytes together are
// bounded, so one submit cannot take the coordinator's memory (10,000 jobs of 6 KiB; 100 of 640 KiB).
constexpr size_t kMaxArrayBytes = 64 << 20;

}  // namespace

StatusOr<v1::SubmitResponse> Coordinator::submitOnLoop(const v1::SubmitRequest& request,
                                                       const std::map<std::string, state::JobState>& known) {
  state::JobSpec spec = fromProto(request.spec());
  if (spec.user.empty()) spec.user = "unknown";
  spec.array_id.clear();  // set here, never by the caller
  spec.array_index = 0;
  spec.array_max_running = 0;
  Status st = state::validateJobSpec(spec);
  if (!st) return st;
  ArraySpec array;
  if (!request.array().empty()) {
    if (std::string why = parseArraySpec(request.array(), &array); !why.empty()) {
      return Status::invalidArgument("array '" + state::quoteForMessage(request.array()) + "': " + why + " (" +
                                     kArrayForms + ")");
    }
  }
  if (Health h = health(); !h.ok) return Status::unavailable("job refused: " + h.message);
  // Dependencies: each must exist; one that already ended is met now (or can never be, for --after-ok).
  std::vector<std::string> waiting_for;
  for (const auto* deps : {&spec.after_ok, &spec.after_any}) {
    const bool needs_success = deps == &spec.after_ok;
    for (const std::string& dep : *deps) {
      auto number = state::jobIdNumber(dep);
      if (!number || *number > last_job_number_)
        return Status::notFound("dependency " + dep + " does not exist; list jobs to see the ids that exist");
      std::optional<JobState> dep_state;
      if (auto it = jobs_.find(dep); it != jobs_.end()) dep_state = it->second.state;
      else if (auto k = known.find(dep); k != known.end()) dep_state = k->second;
      else if (needs_success)
        return Status::notFound("dependency " + dep + " is no longer in the job history");
      else dep_state = JobState::kCancelled;  // left memory, so it ended; --after-any needs no more
      if (!state::isTerminal(*dep_state)) {
        if (std::find(waiting_for.begin(), waiting_for.end(), dep) == waiting_for.end()) waiting_for.push_back(dep);
      } else if (needs_success && *dep_state != JobState::kSucceeded) {
        return Status::failedPrecondition("dependency " + dep + " ended " + toString(*dep_state) +
                                          "; a job submitted with --after-ok " + dep + " could never start");
      }
    }
  }
  // Not stored yet, so no id: the message names the job by its name.
  // The nodes as "could this ever fit" sees them (GPU counts, labels; DOWN nodes count, as in the queue: a
  // node that reboots must not break a script's submit): rebuilt only when a node record changed, not for
  // every submit (2,000 nodes at 1,000 submits a second).
  if (feasibility_epoch_ != node_epoch_ || !feasibility_cluster_) {
    feasibility_cluster_ = std::make_unique<placement::Cluster>(snapshotOnLoop(false));
    feasibility_epoch_ = node_epoch_;
  }
  std::string never = placement::neverFits(*feasibility_cluster_,
                                           requestOf(spec.name.empty() ? "(unnamed)" : spec.name, spec));
  if (!never.empty()) return Status::invalidArgument("job refused: " + never);
  const size_t count = array.indices.empty() ? 1 : array.indices.size();
  if (count > 1) {
    size_t spec_bytes = 1024 + spec.name.size() + spec.workdir.size();
    for (const auto& a : spec.command) spec_bytes += a.size() + 32;
    for (const auto& e : spec.env) spec_bytes += e.size() + 32;
    for (const auto& [k, v] : spec.required_labels) spec_bytes += k.size() + v.size() + 64;
    if (spec_bytes * count > kMaxArrayBytes)
      return Status::invalidArgument("array of " + std::to_string(count) + " jobs of about " +
                                     std::to_string(spec_bytes / 1024 + 1) + " KiB each: more than " +
                                     std::to_string(kMaxArrayBytes >> 20) +
                                     " MiB in all; make the array smaller or pass large inputs in a file");
  }
  v1::SubmitResponse response;
  const int64_t now = wall_ms_();
  for (size_t i = 0; i < count; ++i) {
    state::Job job = state::newJob(state::formatJobId(++last_job_number_), spec, now,
                                   spec.hold ? "submitted held" : "submitted");
    if (!array.indices.empty()) {
      job.spec.array_id = response.array_jobs().empty() ? job.id : response.array_jobs(0);
      job.spec.array_index = array.indices[i];
      job.spec.array_max_running = array.max_running;
      response.add_array_jobs(job.id);
    }
    job.held = spec.hold;
    job.waiting_for = waiting_for;
    for (const auto& dep : waiting_for) dependents_[dep].insert(job.id);
    jobs_[job.id] = job;
    putJobOnLoop(job, /*new_job=*/true);  // the answer waits for it: only a durable job is acknowledged
    ++counters_.jobs_submitted_total;
    if (i == 0) *response.mutable_job() = toProtoOnLoop(job);
  }
  spdlog::info("job {} submitted by {}: {}{}", response.job().id(), spec.user,
               requestOf(response.job().id(), spec).describe(),
               count > 1 ? " (an array of " + std::to_string(count) + " jobs)" : "");
  schedule_wanted_ = true;
  return response;
}

void Coordinator::submitAsyncOnLoop(const v1::SubmitRequest& request, Done<v1::SubmitResponse> done) {
  // An --after-ok dependency that left memory is read back first (a final job: did it succeed?).
  std::vector<std::string> unknown;
  for (const auto& dep : request.spec().after_ok()) {
    auto number = state::jobIdNumber(dep);
    if (number && *number <= last_job_number_ && !jobs_.count(dep) && unknown.size() < state::kMaxDependencies)
      unknown.push_back(dep);
  }
  auto known = std::make_shared<std::map<std::string, JobState>>();
  auto finish = [this, request, done, known] {
    auto result = std::make_shared<StatusOr<v1::SubmitResponse>>(submitOnLoop(request, *known));
    actor_->reply([done, result] { done(std::move(*result)); }, result->isOk());
  };
  if (unknown.empty()) return finish();
  auto left = std::make_shared<size_t>(unknown.size());
  for (const auto& dep : unknown) {
    withJobOnLoop(dep, [known, left, finish, dep](StatusOr<state::Job> job) {
      if (job) (*known)[dep] = job->state;
      if (--*left == 0) finish();
    });
  }
}

void Coordinator::submit(const v1::SubmitRequest& request, Done<v1::SubmitResponse> done) {
  post([this, request, done = std::move(done)] { submitAsyncOnLoop(request, done); });
}

void Coordinator::submit(const v1::JobSpec& spec, Done<v1::Job> done) {
  v1::SubmitRequest request;
  *request.mutable_spec() = spec;
  submit(request, [done = std::move(done)](StatusOr<v1::SubmitResponse> r) {
    if (!r) return done(r.status());
    done(std::move(*r->mutable_job()));
  });
}

void Coordinator::withJobOnLoop(const std::string& id, std::function<void(StatusOr<state::Job>)> fn) {
  auto it = jobs_.find(id);
  if (it != jobs_.end()) return fn(it->second);
  auto number = state::jobIdNumber(id);
  if (!number || *number > last_job_number_ || *number <= 0) return fn(state::jobNotFound(id));
  // A job that left memory: its final state is durable (it leaves only then), so the store has it.
  const bool queued = reader_->run([this, id, fn] {
    auto job = store_.getJob(id);
    post([fn, job = std::move(job)] { fn(job); });
  });
  if (!queued) fn(Status::unavailable("too many reads of job history at once; try again"));
}

void Coordinator::getJob(const std::string& id, Done<v1::Job> done) {
  post([this, id, done = std::move(done)] {
    withJobOnLoop(id, [this, done](StatusOr<state::Job> job) {
      if (!job) return done(job.status());
      done(toProtoOnLoop(*job));
    });
  });
}

namespace {

constexpr int kDefaultPageSize = 500, kMaxPageSize = 5000;
constexpr size_t kMaxPageBytes = 3 << 20;

bool onlyOpenStates(const state::JobFilter& filter) {
  return !filter.states.empty() && std::none_of(filter.states.begin(), filter.states.end(),
                                                [](JobState s) { return state::isTerminal(s); });
}

}  // namespace

void Coordinator::listJobsOnLoop(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done) {
  state::JobFilter filter;
  for (int s : request.states()) {
    auto state = fromProto(static_cast<v1::JobState>(s));
    if (!state) return done(Status::invalidArgument("list: unknown job state " + std::to_string(s)));
    filter.states.insert(*state);
  }
  if (!request.user().empty()) filter.user = request.user();
  if (!request.name().empty()) filter.name = request.name();
  filter.since_ms = std::max<int64_t>(0, request.since_ms());
  filter.until_ms = std::max<int64_t>(0, request.until_ms());
  if (request.page_size() < 0 || request.page_size() > kMaxPageSize) {
    return done(Status::invalidArgument("list: page size " + std::to_string(request.page_size()) +
                                        " is outside 0.." + std::to_string(kMaxPageSize) +
                                        " (0: " + std::to_string(kDefaultPageSize) + ")"));
  }
  const int limit = request.page_size() == 0 ? kDefaultPageSize : request.page_size();
  int64_t after = 0;
  if (!request.page_token().empty()) {
    auto n = state::jobIdNumber("j-" + request.page_token());
    if (!n)
      return done(Status::invalidArgument("list: page token '" + request.page_token() +
                                          "' is not one this coordinator gave; start again without it"));
    after = *n;
  }
  // Memory: every open job and the recent final ones, as they are now (newer than the store).
  std::vector<const state::Job*> mine;
  std::set<int64_t> in_memory;
  for (const auto& [id, job] : jobs_) {
    const int64_t n = state::jobIdNumber(id).value_or(0);
    if (n <= after) continue;
    in_memory.insert(n);
    if (state::matches(filter, job)) mine.push_back(&job);
  }
  std::sort(mine.begin(), mine.end(), [](const state::Job* a, const state::Job* b) {
    return state::jobIdNumber(a->id) < state::jobIdNumber(b->id);
  });
  if (mine.size() > static_cast<size_t>(limit) + 1) mine.resize(limit + 1);
  std::vector<v1::Job> page;
  page.reserve(mine.size());
  for (const state::Job* job : mine) page.push_back(toProtoOnLoop(*job));
  auto finish = [limit](std::vector<v1::Job> jobs, Done<v1::ListJobsResponse> done) {
    std::sort(jobs.begin(), jobs.end(), [](const v1::Job& a, const v1::Job& b) {
      return state::jobIdNumber(a.id()) < state::jobIdNumber(b.id());
    });
    // A page ends at `limit` jobs or at kMaxPageBytes (clients take 4 MiB answers by default, and one job at
    // every limit of validateJobSpec is about 270 KiB), whichever comes first; it always holds one job.
    v1::ListJobsResponse resp;
    size_t bytes = 0, i = 0;
    for (; i < jobs.size() && i < static_cast<size_t>(limit); ++i) {
      bytes += jobs[i].ByteSizeLong();
      if (i > 0 && bytes > kMaxPageBytes) break;
      *resp.add_jobs() = std::move(jobs[i]);
    }
    if (i < jobs.size()) {
      resp.set_next_page_token(
          std::to_string(state::jobIdNumber(resp.jobs(resp.jobs_size() - 1).id()).value_or(0)));
    }
    done(std::move(resp));
  };
  // Open jobs are all in memory: no need for the store.
  if (onlyOpenStates(filter)) return finish(std::move(page), std::move(done));
  // Final jobs may have left memory: the store has those (committed), the memory wins where it has the job.
  const bool queued = reader_->run([this, filter, after, limit, page = std::move(page),
                                    in_memory = std::move(in_memory), finish, done]() mutable {
    // limit + 1 stored jobs that memory does not hold (the ones it holds are skipped, not counted), or as many
    // as there are: each round starts after the last row of the one before, at most 64 rounds.
    int64_t from = after;
    size_t taken = 0;
    for (int round = 0; round < 64 && taken < static_cast<size_t>(limit) + 1; ++round) {
      auto stored = store_.listJobsPage(filter, from, limit + 1);
      if (!stored) return done(stored.status());
      for (const auto& job : *stored) {
        const int64_t n = state::jobIdNumber(job.id).value_or(0);
        from = std::max(from, n);
        if (in_memory.count(n)) continue;
        page.push_back(jobToProto(job));
        ++taken;
      }
      if (stored->size() < static_cast<size_t>(limit) + 1) break;  // the store has no more
    }
    finish(std::move(page), std::move(done));
  });
  if (!queued) done(Status::unavailable("too many reads of job history at once; try again"));
}

void Coordinator::listJobs(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done) {
  post([this, request, done = std::move(done)] { listJobsOnLoop(request, done); });
}

StatusOr<v1::Job> Coordinator::cancelOnLoop(const state::Job& found, int signal) {
  const std::string id = found.id;
  if (signal != 0) {
    if (signal < 1 || signal > 64)
      return Status::invalidArgument("signal " + std::to_string(signal) + " is not a signal number (1 to 64)");
    if (found.state != JobState::kRunning)
      return Status::failedPrecondition("job " + id + " is " + toString(found.state) +
                                        "; only the ranks of a RUNNING job can be signalled");
    v1::Command cmd;
    v1::SignalJob* sig = cmd.mutable_signal();
    sig->set_job_id(id);
    sig->set_attempt(runtime_.count(id) ? runtime_[id].attempt : attemptOf(found));
    sig->set_signal(signal);
    for (const auto& a : found.allocation) sendOnLoop(a.node, cmd);
    spdlog::info("job {}: signal {} sent to its ranks", id, signal);
    return toProtoOnLoop(found);
  }
  if (state::isTerminal(found.state)) {
    return Status::failedPrecondition("job " + id + " already ended " + toString(found.state) +
                                      "; nothing to cancel");
  }
  if (Health h = health(); !h.ok) return Status::unavailable("cancel refused: " + h.message);
  const int attempt = runtime_.count(id) ? runtime_[id].attempt : 0;
  const bool launched = isLive(found.state);
  Status st = recordTransitionOnLoop(id, JobState::kCancelled, "cancelled by user");
  if (!st) return st;
  if (launched) stopJobEverywhereOnLoop(id, attempt, "job cancelled", jobs_[id].allocation);
  return toProtoOnLoop(jobs_[id]);
}

StatusOr<v1::Job> Coordinator::holdOnLoop(const state::Job& found, bool hold, bool by_admin) {
  const std::string id = found.id;
  if (found.state != JobState::kPending)
    return Status::failedPrecondition("job " + id + " is " + toString(found.state) + "; only a PENDING job can be " +
                                      (hold ? "held" : "released"));
  if (!hold && found.held_by_admin && !by_admin)
    return Status::permissionDenied("job " + id + " was held by an admin; only an admin releases it");
  if (found.held != hold || (hold && by_admin && !found.held_by_admin)) {
    if (Health h = health(); !h.ok) return Status::unavailable((hold ? "hold" : "release") + std::string(" refused: ") + h.message);
    state::Job& job = jobs_[id];
    job.held = hold;
    job.held_by_admin = hold && (by_admin || job.held_by_admin);
    putJobOnLoop(job);
    pending_reason_.erase(id);
    schedule_wanted_ = true;
    spdlog::info("job {} {}", id, hold ? "held" : "released");
  }
  return toProtoOnLoop(jobs_[id]);
}

StatusOr<v1::Job> Coordinator::requeueOnLoop(const state::Job& found) {
  const std::string id = found.id;
  if (!isLive(found.state)) {
    return Status::failedPrecondition(
        "job " + id + " is " + toString(found.state) + "; only a SCHEDULED, STARTING or RUNNING job is requeued" +
        (state::isTerminal(found.state) ? " (submit it again)" : " (it is already in the queue)"));
  }
  if (Health h = health(); !h.ok) return Status::unavailable("requeue refused: " + h.message);
  const int attempt = runtime_.count(id) ? runtime_[id].attempt : attemptOf(found);
  const auto allocation = found.allocation;  // the requeue clears it; the stops need it
  Status st = recordTransitionOnLoop(id, JobState::kPending, "requeued by user", std::nullopt,
                                     /*counts_as_restart=*/false);
  if (!st) return st;
  stopJobEverywhereOnLoop(id, attempt, "job requeued", allocation);
  return toProtoOnLoop(jobs_[id]);
}

void Coordinator::jobCallOnLoop(const std::string& id, Done<v1::Job> done,
                                std::function<StatusOr<v1::Job>(const state::Job&)> fn) {
  withJobOnLoop(id, [this, done, fn](StatusOr<state::Job> job) {
    if (!job) return done(job.status());
    auto result = std::make_shared<StatusOr<v1::Job>>(fn(*job));
    actor_->reply([done, result] { done(std::move(*result)); }, result->isOk());
  });
}

void Coordinator::cancel(const std::string& id, int signal, Done<v1::Job> done) {
  post([this, id, signal, done = std::move(done)] {
    jobCallOnLoop(id, done, [this, signal](const state::Job& job) { return cancelOnLoop(job, signal); });
  });
}

void Coordinator::hold(const std::string& id, bool hold_it, bool by_admin, Done<v1::Job> done) {
  post([this, id, hold_it, by_admin, done = std::move(done)] {
    jobCallOnLoop(id, done,
                  [this, hold_it, by_admin](const state::Job& job) { return holdOnLoop(job, hold_it, by_admin); });
  });
}

void Coordinator::requeue(const std::string& id, Done<v1::Job> done) {
  post([this, id, done = std::move(done)] {
    jobCallOnLoop(id, done, [this](const state::Job& job) { return requeueOnLoop(job); });
  });
}

std::vector<v1::Node> Coordinator::listNodesOnLoop() {
  std::vector<const NodeEntry*> sorted;
  for (const auto& [name, entry] : nodes_) sorted.push_back(&entry);
  std::sort(sorted.begin(), sorted.end(), [](const NodeEntry* a, const NodeEntry* b) {
    return placement::naturalLess(a->record.name, b->record.name);
  });
  const auto usage = usageOnLoop();
  std::vector<v1::Node> out;
  out.reserve(sorted.size());
  for (const NodeEntry* n : sorted) {
    auto u = usage.find(n->record.name);
    out.push_back(nodeToProtoOnLoop(*n, u != usage.end() ? u->second : NodeUsage{}));
  }
  return out;
}

void Coordinator::listNodes(Done<std::vector<v1::Node>> done) {
  post([this, done = std::move(done)] { done(listNodesOnLoop()); });
}

StatusOr<v1::Node> Coordinator::drainOnLoop(const std::string& name, bool drain, const std::string& reason) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return state::nodeNotFound(name);
  if (reason.size() > state::kMaxDrainReasonBytes || state::findControlCharacter(reason) != std::string::npos)
    return Status::invalidArgument("drain reason: at most " + std::to_string(state::kMaxDrainReasonBytes) +
                                   " bytes and no control characters");
  NodeEntry& node = it->second;
  // A DOWN node stays DOWN until its agent is back; the drain is kept for then.
  state::NodeRecord want = node.record;
  want.drained = drain;
  want.drain_reason = drain ? reason : "";
  if (want.state != state::NodeState::kDown)
    want.state = drain ? state::NodeState::kDraining : state::NodeState::kUp;
  if (want != node.record) {
    if (Health h = health(); !h.ok) return Status::unavailable("drain refused: " + h.message);
    node.record = want;
    putNodeOnLoop(want);
    spdlog::info("node {} is now {}{}", name, toString(want.state),
                 want.state == state::NodeState::kDown
                     ? (drain ? ", drained for when it is back" : ", undrained")
                     : "");
    schedule_wanted_ = true;
  }
  auto usage = usageOnLoop();
  return nodeToProtoOnLoop(node, usage[name]);
}

void Coordinator::drain(const std::string& name, bool drain_it, const std::string& reason, Done<v1::Node> done) {
  post([this, name, drain_it, reason, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::Node>>(drainOnLoop(name, drain_it, reason));
    actor_->reply([done, result] { done(std::move(*result)); }, result->isOk());
  });
}

StatusOr<v1::Node> Coordinator::removeNodeOnLoop(const std::string& name) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return state::nodeNotFound(name);
  NodeEntry& node = it->second;
  if (node.record.state != state::NodeState::kDown || node.link) {
    return Status::failedPrecondition(
        "node " + name + " is " + toString(node.record.state) +
        (node.link ? " with its agent connected" : "") +
        "; only a DOWN node is removed (stop its agent, wait for DOWN, or drain it)");
  }
  auto usage = usageOnLoop();
  if (!usage[name].jobs.empty()) {
    return Status::failedPrecondition(
        "node " + name + " still has live jobs placed on it: " + usage[name].jobs[0] +
        (usage[name].jobs.size() > 1 ? " and more" : "") + "; cancel them first");
  }
  if (Health h = health(); !h.ok) return Status::unavailable("remove refused: " + h.message);
  v1::Node out = nodeToProtoOnLoop(node, usage[name]);
  nodes_.erase(it);
  ++node_epoch_;
  state::Write w;
  w.kind = state::Write::Kind::kDeleteNode;
  w.name = name;
  actor_->put(std::move(w));
  spdlog::info("node {} removed", name);
  return out;
}

void Coordinator::removeNode(const std::string& name, Done<v1::Node> done) {
  post([this, name, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::Node>>(removeNodeOnLoop(name));
    actor_->reply([done, result] { done(std::move(*result)); }, result->isOk());
  });
}

std::string Coordinator::layoutOfOnLoop(const state::Job& job, placement::RingLayout* layout) const {
  // The layout the ranks were given: derived from the allocation as at placement (then its `why` says how),
  // unless that no longer matches the recorded topology (an override, or labels changed since).
  const placement::Cluster cluster = snapshotOnLoop(false);
  const placement::Allocation allocation = toPlacement(job.allocation);
  std::string err = placement::buildRingLayout(allocation, cluster, job.spec.topology_override, layout);
  if (err.empty() && layout->topology() != job.topology) {
    err = placement::buildRingLayout(allocation, cluster, job.topology, layout);
    layout->why = "as recorded at placement (" + job.topology + "); the nodes' labels have changed since";
  }
  return err;
}

void Coordinator::readLogOnLoop(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done) {
  constexpr int kDefaultChunk = 256 << 10, kMaxChunk = 1 << 20;
  auto it = jobs_.find(request.id());
  if (it == jobs_.end()) {
    // Ended long ago (or unknown): look it up, then come back here with the job in hand.
    return withJobOnLoop(request.id(), [this, request, done](StatusOr<state::Job> job) {
      if (!job) return done(job.status());
      if (jobs_.count(job->id) == 0 &&
          jobs_.size() < options_.max_finished_in_memory + runtime_.size() + 1024) {
        jobs_[job->id] =
            *job;  // briefly back in memory, to read its logs; it leaves again with the next eviction
        finished_.push_back({job->id, 0, 0});
      }
      if (jobs_.count(job->id) == 0) return done(Status::unavailable("too many jobs in memory; try again"));
      readLogOnLoop(request, done);
    });
  }
  const state::Job& job = it->second;
  const int latest = attemptOf(job);
  if (latest == 0 || job.allocation.empty()) {
    return done(Status::failedPrecondition(
        state::isTerminal(job.state)
            ? "job " + job.id + " ended " + toString(job.state) + " before it was launched, so it has no logs"
            : "job " + job.id + " is " + toString(job.state) + " and has not been launched, so it has no logs yet"));
  }
  const int attempt = request.attempt() == 0 ? latest : request.attempt();
  if (attempt < 0 || attempt > latest) {
    return done(
        Status::invalidArgument("job " + job.id + " has launch attempts 1.." + std::to_string(latest)));
  }
  placement::RingLayout layout;
  std::string err = layoutOfOnLoop(job, &layout);
  if (!err.empty())
    return done(Status::internal("job " + job.id + ": cannot rebuild its ring layout: " + err));
  if (request.rank() < 0 || request.rank() >= layout.size()) {
    return done(
        Status::invalidArgument("job " + job.id + " has ranks 0.." + std::to_string(layout.size() - 1)));
  }
  const std::string node = layout.ranks[request.rank()].node;
  auto n = nodes_.find(node);
  const std::string where = "rank " + std::to_string(request.rank()) + "'s log (attempt " +
                            std::to_string(attempt) + ") is on node " + node;
  if (n == nodes_.end() || !n->second.link) {
    return done(Status::unavailable(where +
                                    ", whose agent is not connected; read it there under the agent's "
                                    "data directory: logs/" +
                                    job.id + "/attempt-" + std::to_string(attempt) + "/rank-" +
                                    std::to_string(request.rank()) + ".log"));
  }
  if (Health h = health(); !h.ok) return done(Status::unavailable("log reads wait until " + h.message));
  v1::ReadLog read;
  read.set_job_id(job.id);
  read.set_attempt(attempt);
  read.set_rank(request.rank());
  read.set_offset(std::max<int64_t>(0, request.offset()));
  read.set_max_bytes(request.max_bytes() <= 0 ? kDefaultChunk : std::min(request.max_bytes(), kMaxChunk));
  StatusOr<v1::Command> cmd = logs_->start(node, where, std::move(read), done);
  if (!cmd) return done(cmd.status());
  sendOnLoop(node, *cmd);
}

void Coordinator::readLog(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done) {
  post([this, request, done = std::move(done)] { readLogOnLoop(request, done); });
}

Status Coordinator::logDataOnLoop(const std::string& node, const std::string& session,
                                  const v1::LogData& data) {
  Status error;
  NodeEntry* entry = checkSessionOnLoop(node, session, &error);
  if (!entry) return error;
  entry->last_seen_ms = now_ms_();
  logs_->answer(node, data, [this](const std::string& job_id) {
    auto job = jobs_.find(job_id);
    return job == jobs_.end() || state::isTerminal(job->second.state);
  });
  return Status::ok();
}

void Coordinator::logData(const std::string& node, const std::string& session, const v1::LogData& data,
                          StatusDone done) {
  post([this, node, session, data, done = std::move(done)] { done(logDataOnLoop(node, session, data)); });
}

MetricsSnapshot Coordinator::metricsOnLoop() {
  MetricsSnapshot m = counters_;
  const int64_t now = now_ms_();
  for (const char* s : {"UP", "DOWN", "DRAINING"}) m.nodes_by_state[s] = 0;
  for (state::JobState s : state::kAllJobStates) m.jobs_by_state[toString(s)] = 0;
  const auto usage = usageOnLoop();
  for (const auto& [name, node] : nodes_) {
    m.nodes_by_state[toString(node.record.state)]++;
    if (node.record.state == state::NodeState::kDown) continue;
    m.gpus_total += static_cast<int>(node.record.gpus.size());
    auto u = usage.find(name);
    if (u != usage.end()) m.gpus_allocated += static_cast<int>(u->second.gpus.size());
    m.heartbeat_lag_max_s = std::max(m.heartbeat_lag_max_s, (now - node.last_seen_ms) / 1000.0);
  }
  for (const auto& [id, job] : jobs_) m.jobs_by_state[toString(job.state)]++;
  m.store_healthy = health().ok;
  m.store_backlog = actor_->backlog();
  m.jobs_in_memory = jobs_.size();
  for (const auto& [id, job] : jobs_) {
    if (!isLive(job.state) || m.jobs.size() >= MetricsSnapshot::kMaxJobFigures) continue;
    m.jobs.push_back(telemetry_.figures(id, requestOf(job.id, job.spec).gpuCount(), wall_ms_()));
  }
  return m;
}

void Coordinator::metrics(std::function<void(MetricsSnapshot)> done) {
  post([this, done = std::move(done)] { done(metricsOnLoop()); });
}

void Coordinator::jobSeries(const std::string& id, Done<JobSeries> done) {
  post([this, id, done = std::move(done)] { done(telemetry_.jobSeries(id)); });
}

void Coordinator::clusterSeries(Done<ClusterSeries> done) {
  post([this, done = std::move(done)] { done(telemetry_.clusterSeries()); });
}

StatusOr<v1::RingLayout> Coordinator::ringOnLoop(const state::Job& job) {
  const std::string& id = job.id;
  if (job.allocation.empty()) {
    std::string why =
        job.state == JobState::kPending && pending_reason_.count(id) ? ": " + pending_reason_[id] : "";
    return Status::failedPrecondition("job " + id + " is " + toString(job.state) +
                                      " and has not been placed, so it has no ring layout yet" + why);
  }
  placement::RingLayout layout;
  std::string err = layoutOfOnLoop(job, &layout);
  if (!err.empty()) return Status::internal("job " + id + ": cannot rebuild its ring layout: " + err);
  v1::RingLayout out;
  toProto(layout, &out);
  out.set_job_id(id);
  return out;
}

void Coordinator::ring(const std::string& id, Done<v1::RingLayout> done) {
  post([this, id, done = std::move(done)] {
    withJobOnLoop(id, [this, done](StatusOr<state::Job> job) {
      if (!job) return done(job.status());
      done(ringOnLoop(*job));
    });
  });
}

v1::Job Coordinator::toProtoOnLoop(const state::Job& job) const {
  v1::Job out = jobToProto(job);
  if (job.state == JobState::kPending && (job.held || !job.waiting_for.empty())) {
    out.set_reason(notYetOnLoop(job, {}));  // as it is now, not as at the last pass
  } else if (job.state == JobState::kPending) {
    auto it = pending_reason_.find(job.id);
    out.set_reason(it != pending_reason_.end() ? it->second : "waiting for the next scheduling pass");
  }
  return out;
}

v1::Node Coordinator::nodeToProtoOnLoop(const NodeEntry& node, const NodeUsage& usage) const {
  v1::Node out;
  out.set_name(node.record.name);
  out.set_address(node.record.address);
  out.set_state(toString(node.record.state));
  out.set_drained(node.record.drained);
  out.set_drain_reason(node.record.drain_reason);
  for (const auto& g : node.record.gpus) {
    v1::Gpu* p = out.add_gpus();
    p->set_index(g.index);
    p->set_uuid(g.uuid);
    p->set_model(g.model);
    p->set_memory_bytes(g.memory_bytes);
  }
  for (int g : usage.gpus) out.add_gpus_used(g);
  for (int c : node.record.cpus) out.add_cpus(c);
  for (int c : usage.cpus) out.add_cpus_used(c);
  out.set_memory_bytes(node.record.memory_bytes);
  out.set_memory_used_bytes(usage.memory_bytes);
  out.set_confinement(node.confinement);
  out.set_warning(node.warning);
  for (const auto& [k, v] : node.record.labels) (*out.mutable_labels())[k] = v;
  out.set_last_heartbeat_ms(node.record.last_heartbeat_ms);
  out.set_connected(node.link != nullptr);
  for (const auto& id : usage.jobs) out.add_jobs(id);
  for (const auto& nic : node.nics) *out.add_nics() = nic;
  return out;
}

}  // namespace ddl::coordinator
