// The Coordinator's own part (the class: coordinator.h): its lifecycle and recovery, job transitions and
// dependencies, the scheduling pass, the launch and the commands to agents. The agents' side is agents.cpp,
// the users' user_calls.cpp.
#include "service/coordinator.h"

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
#include "common/utc_day.h"
#include "placement/placement.h"
#include "placement/preemption.h"
#include "service/actor.h"
#include "service/convert.h"
#include "service/coordinator_internal.h"
#include "service/launch_plan.h"
#include "service/log_relay.h"

namespace ddl::coordinator {

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
  actor_ = std::make_unique<Actor>(store_, co, [this] { committedOnLoop(); });
  registry_ = std::make_unique<NodeRegistry>(
      *actor_,
      NodeRegistry::Options{.heartbeat_grace_ms = options_.heartbeat_grace_ms,
                            .heartbeat_interval_ms = options_.heartbeat_interval_ms,
                            .port_first = options_.port_first,
                            .port_last = options_.port_last,
                            .max_nodes = options_.max_nodes},
      now_ms_, wall_ms_);
  // A node lost: its jobs' ranks are lost with it (failed, or requeued), and its GPUs are free again.
  registry_->onNodeLost([this](const std::string& node, const std::string& reason) {
    loseNodeJobsOnLoop(node, reason);
    schedule_wanted_ = true;
  });
  logs_ = std::make_unique<LogRelay>(actor_->io(), options_.log_timeout_ms, CoordinatorOptions::kMaxLogReads);
  shares_ = std::make_unique<ShareKeeper>(*actor_, options_.shares);
  usage_book_ = std::make_unique<UsageBook>(*actor_, options_.accounting);
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

StoreHealth Coordinator::health() const { return actor_->health(); }

void Coordinator::putJobOnLoop(const state::Job& job, bool new_job, std::vector<state::Write> with) {
  state::Write w;
  w.kind = state::Write::Kind::kPutJob;
  w.job = job;
  w.new_job = new_job;
  if (!with.empty()) {
    size_t bytes = actor_->bytesOf(w);
    for (const state::Write& e : with) bytes += actor_->bytesOf(e);
    actor_->reserve(with.size() + 1, bytes);  // false: more than one transaction holds; the job goes first
  }
  actor_->put(std::move(w));
  for (state::Write& e : with) actor_->put(std::move(e));
}

void Coordinator::committedOnLoop() {
  evictFinishedOnLoop();
  const uint64_t durable = actor_->committedBatch();
  for (auto it = unstored_submits_.begin(); it != unstored_submits_.end();) {
    if (it->second > durable) {
      ++it;
      continue;
    }
    it = unstored_submits_.erase(it);
    schedule_wanted_ = true;  // placeable from now on
  }
}

void Coordinator::dropRequestIdOnLoop(const state::Job& job, bool forget) {
  if (job.spec.request_id.empty()) return;
  auto r = request_ids_.find({job.spec.user, job.spec.request_id});
  const int64_t n = state::jobIdNumber(job.id).value_or(0);
  if (r == request_ids_.end() || n < r->second.first || n > r->second.last) return;
  if (forget || --r->second.in_memory <= 0) request_ids_.erase(r);
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
      dropRequestIdOnLoop(it->second, /*forget=*/false);
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
  auto nodes = store_.listNodes();
  if (!nodes) return nodes.status();
  if (Status st = shares_->loadOnLoop(store_, wall_ms_()); !st) return st;
  if (Status st = usage_book_->loadOnLoop(store_); !st) return st;
  registry_->loadOnLoop(*nodes);
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
  for (const auto& [id, job] : jobs_) {  // a submit repeated across a restart finds its jobs
    if (job.spec.request_id.empty()) continue;
    const int64_t n = state::jobIdNumber(id).value_or(0);
    const int64_t first = state::jobIdNumber(job.spec.array_id.empty() ? id : job.spec.array_id).value_or(n);
    Submitted& made = request_ids_[{job.spec.user, job.spec.request_id}];
    if (made.in_memory > 0 && made.first != first) {
      if (first < made.first) continue;  // an id used again after its jobs left memory: the newer wins
      made = {};
    }
    made.first = first;
    made.last = std::max(made.last, n);
    ++made.in_memory;
  }
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
               live->size(), recent->size(), registry_->all().size(), last_job_number_);
  return Status::ok();
}

void Coordinator::start() {
  post([this] {
    if (stopping_) return;
    actor_->startTicker(options_.tick_ms, [this] {
      housekeepingOnLoop();
      schedulePassOnLoop();
      growElasticOnLoop();
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
        chargeUsageOnLoop();
        shares_->saveOnLoop(wall_ms_());  // a clean stop loses no usage (a crash: at most save_interval_ms)
        registry_->closeAllOnLoop();
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
    growElasticOnLoop();
    evictFinishedOnLoop();
    return true;
  });
}

void Coordinator::housekeepingOnLoop() {
  const int64_t now = now_ms_();
  registry_->checkHeartbeatsOnLoop(now);
  sweepLostJobsOnLoop();
  enforceTimeLimitsOnLoop();
  enforcePreemptionsOnLoop();
  chargeUsageOnLoop();
  if (const int64_t wall = wall_ms_(); telemetry_.clusterDue(wall)) {  // the dashboard's cluster plot
    const MetricsSnapshot m = metricsOnLoop();
    telemetry_.recordCluster(wall, m.gpus_allocated, m.gpus_total, m.jobs_by_state,
                             [this](const std::string& id) {
                               auto job = jobs_.find(id);
                               return job != jobs_.end() && isLive(job->second.state);
                             });
  }
  if (registry_->endRecoveryOnLoop(now)) schedule_wanted_ = true;
  // A new UTC day may begin a GPU-hours limit's period: the jobs its budget held back may start now.
  if (const int64_t day = utcDayOf(wall_ms_()); day != limits_day_) {
    limits_day_ = day;
    schedule_wanted_ = true;
  }
}

std::vector<ShareKeeper::Holder> Coordinator::holdersOnLoop() const {
  std::vector<ShareKeeper::Holder> holders;
  for (const auto& [id, rt] : runtime_) {  // the launched jobs: they hold their GPUs until they end
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !isLive(it->second.state)) continue;
    ShareKeeper::Holder h{it->second.spec.account, it->second.spec.user, 0, it->second.spec.qos};
    h.placed_ms = latestAttemptReached(it->second, JobState::kScheduled);
    h.elastic_gpu_s = it->second.elastic_gpu_s;
    for (const auto& a : it->second.allocation) {
      h.gpus += static_cast<int>(a.gpus.size());
      h.cpus += static_cast<int>(a.cpus.size());
      h.memory_bytes += a.memory_bytes;
    }
    holders.push_back(std::move(h));
  }
  return holders;
}

void Coordinator::spentOnLoop(placement::LimitTracker& limits,
                              const std::vector<ShareKeeper::Holder>& holders) const {
  const std::vector<placement::Period> periods = limits.periods();
  if (periods.empty()) return;
  const int64_t now = wall_ms_();
  limits.setToday(utcDayOf(now));
  for (placement::Period period : periods) {
    const int64_t first_day = placement::periodStart(period, utcDayOf(now));
    for (const auto& [who, gpu_s] : usage_book_->gpuSecondsSinceOnLoop(first_day)) {
      limits.spent(period, who.first, who.second, gpu_s);
    }
    // The launched jobs' attempts so far (their rollups are written when they end).
    const int64_t from_ms = first_day * 86400000LL;
    for (const ShareKeeper::Holder& h : holders) {
      const int64_t held_ms = h.placed_ms > 0 ? now - std::max(h.placed_ms, from_ms) : 0;
      // An elastic job's changes are counted from its placement: whole where that is in the period.
      const double changes = h.placed_ms >= from_ms ? h.elastic_gpu_s : 0;
      if (held_ms > 0)
        limits.spent(period, h.account, h.user, std::max(0.0, h.gpus * held_ms / 1000.0 + changes));
    }
  }
}

void Coordinator::chargeUsageOnLoop() {
  // Every tick comes here; the launched jobs are gathered only when a charge is due (once a second).
  const int64_t now = wall_ms_();
  if (!shares_->chargeDue(now)) return;
  const std::vector<ShareKeeper::Holder> holders = holdersOnLoop();
  const double seconds = shares_->chargeOnLoop(now, holders);
  for (const ShareKeeper::Holder& h : holders) usage_book_->chargeOnLoop(h.account, h.gpus * seconds);
  usage_book_->trimOnLoop(now);
}

void Coordinator::setAccounts(placement::ShareTree tree) {
  post([this, tree = std::move(tree)]() mutable {
    shares_->setTreeOnLoop(std::move(tree));
    schedule_wanted_ = true;
  });
}

void Coordinator::signalRanksOnLoop(const state::Job& job, int signal, int64_t preempt_deadline_ms) {
  v1::Command cmd;
  v1::SignalJob* sig = cmd.mutable_signal();
  sig->set_job_id(job.id);
  sig->set_attempt(runtime_.count(job.id) ? runtime_[job.id].attempt : attemptOf(job));
  sig->set_signal(signal);
  sig->set_preempt_deadline_ms(preempt_deadline_ms);
  for (const auto& a : job.allocation) registry_->sendOnLoop(a.node, cmd);
  spdlog::info("job {}: {} sent to its ranks", job.id, signalName(signal));
}

void Coordinator::enforceTimeLimitsOnLoop() {
  const int64_t now = wall_ms_();
  std::vector<std::string> over;
  for (auto& [id, rt] : runtime_) {  // the launched jobs only
    auto it = jobs_.find(id);
    if (it == jobs_.end() || it->second.state != JobState::kRunning || it->second.spec.time_limit_s <= 0) continue;
    const state::JobSpec& spec = it->second.spec;
    const int64_t started = latestAttemptReached(it->second, JobState::kRunning);
    if (started <= 0) continue;
    if (now - started >= spec.time_limit_s * 1000) {
      over.push_back(id);
    } else if (spec.warn_signal > 0 && !rt.warned &&
               now - started >= (spec.time_limit_s - spec.warn_before_s) * 1000) {
      rt.warned = true;  // once per attempt (a coordinator restart in the window may send it again)
      signalRanksOnLoop(it->second, spec.warn_signal);
    }
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
  std::vector<state::Write> usage;  // the ended attempt's rollups, stored with the move
  if (state::endsAttempt(from, job.state))
    usage = usage_book_->bookOnLoop(job.spec.account, job.spec.user, job.attempts.back(), job.state);
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
  putJobOnLoop(found->second, false, std::move(usage));
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

std::string Coordinator::notYetCode(const state::Job& job) {
  if (job.held_by_admin) return "JobHeldAdmin";
  if (job.held) return "JobHeldUser";
  if (!job.waiting_for.empty()) return "Dependency";
  return "JobArrayTaskLimit";
}

int Coordinator::attemptOf(const state::Job& job) { return state::launchAttempts(job); }

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
    if (unstored_submits_.count(id)) {
      pending_reason_[id] = {"Submitting", "its submit is being stored"};
      continue;
    }
    if (std::string why = notYetOnLoop(job, array_slots); !why.empty()) {
      pending_reason_[id] = {notYetCode(job), why};
      continue;
    }
    if (!job.spec.array_id.empty()) ++array_slots[job.spec.array_id];
    queue.push_back(requestOf(id, job.spec));
    queue.back().submitMs = job.submit_ms;
  }
  if (queue.empty()) return;
  if (registry_->recoveringOnLoop(now)) {
    for (const auto& r : queue) {
      pending_reason_[r.id].code = "Recovering";
      pending_reason_[r.id].text = "coordinator restarted; waiting up to " +
                                   secondsText(registry_->recoveryLeftMs(now)) + " for agents to reconnect";
    }
    return;
  }
  placement::Cluster cluster = snapshotOnLoop(true);
  shares_->prioritizeOnLoop(queue, wall_ms_());
  if (!favored_.empty()) {
    const bool waits =
        std::any_of(queue.begin(), queue.end(), [this](const auto& r) { return r.id == favored_; });
    if (waits && wall_ms_() < favored_until_ms_)
      placement::favor(queue, favored_);
    else
      favored_.clear();
  }
  placement::LimitTracker limits(shares_->tree());
  const std::vector<ShareKeeper::Holder> holders = holdersOnLoop();
  for (const ShareKeeper::Holder& h : holders) limits.hold(h.account, h.user, h.gpus, h.qos);
  spentOnLoop(limits, holders);
  placement::ScheduleResult result = placement::schedule(cluster, queue, &limits);
  // The GPUs in use, once for the pass (not once per decision: that was quadratic at thousands of jobs),
  // with each start added as it is applied.
  auto usage = usageOnLoop();
  for (const auto& d : result.decisions) {
    auto it = jobs_.find(d.jobId);
    if (it == jobs_.end() || it->second.state != JobState::kPending) continue;  // cancelled meanwhile
    const state::Job& job = it->second;
    if (d.action == placement::Decision::Action::kPending) {
      pending_reason_[d.jobId] = {d.code, d.reason};
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
      pending_reason_[d.jobId] = {"JobArrayTaskLimit",
                                  why};  // its array reached its limit earlier in this pass
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
      pending_reason_[d.jobId] = {"StoreError",
                                  "the coordinator could not record its placement: " + st.message()};
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
  preemptForWaitingOnLoop(result, queue);
}

void Coordinator::buildRuntimeOnLoop(const state::Job& job, const placement::RingLayout& layout) {
  JobRuntime& rt = runtime_[job.id];
  rt = JobRuntime{};
  rt.attempt = attemptOf(job);
  rt.root_node = layout.ranks.empty() ? "" : layout.ranks[0].node;
  for (const auto& slot : layout.ranks) rt.rank_node[slot.rank] = slot.node;
  if (state::isElastic(job.spec) && job.state == JobState::kRunning) {
    // Recovered: its ranks as kept (launch slots, joiners too), less those that it went on without.
    std::map<int, std::string> kept;
    for (const state::RankResult& r : job.ranks)
      if (r.attempt == rt.attempt) kept[r.rank] = r.node;
    if (!kept.empty()) rt.rank_node = std::move(kept);
    if (auto zero = rt.rank_node.find(0); zero != rt.rank_node.end())
      rt.root_node = zero->second;  // not sorted
    // A GPU the job holds is its latest slot's there (a joiner may have taken a lost rank's GPU).
    std::map<std::pair<std::string, int>, int> holder;
    for (const state::RankResult& r : job.ranks)
      if (r.attempt == rt.attempt) holder[{r.node, r.gpu}] = std::max(holder[{r.node, r.gpu}], r.rank);
    for (const state::RankResult& r : job.ranks) {
      const bool placed = std::any_of(job.allocation.begin(), job.allocation.end(), [&](const auto& a) {
        return a.node == r.node && std::find(a.gpus.begin(), a.gpus.end(), r.gpu) != a.gpus.end();
      });
      if (r.attempt == rt.attempt && (!placed || holder[{r.node, r.gpu}] != r.rank)) rt.gone.insert(r.rank);
    }
  }
  // The port recorded at placement; jobs placed before it was recorded (state schema 3) derive it again.
  rt.port = job.root_port > 0 ? job.root_port : pickPortOnLoop(rt.root_node, job.id);
}

void Coordinator::launchOnLoop(const std::string& id, const placement::Allocation& allocation,
                               const placement::RingLayout& layout) {
  const state::Job& job = jobs_[id];
  buildRuntimeOnLoop(job, layout);
  const JobRuntime& rt = runtime_[id];
  const NodeRegistry::Node* root = registry_->find(rt.root_node);
  const std::string root_addr = root ? root->record.address : "";

  // One secret per launch: every rank of this attempt holds it, no other process does (it travels in
  // StartRanks over the agents' TLS streams and lives in the ranks' environments, readable only by the job's
  // user).
  const std::string secret = newJobSecret();
  if (state::isElastic(job.spec)) runtime_[id].secret = secret;  // its joiners get it too
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
  for (const auto& [node, cmd] : commands) registry_->sendOnLoop(node, cmd);
}

int Coordinator::pickPortOnLoop(const std::string& node, const std::string& job) const {
  const NodeRegistry::Node* n = registry_->find(node);
  int first = n && n->port_first ? n->port_first : options_.port_first;
  int last = n && n->port_last ? n->port_last : options_.port_last;
  return rootPort(job, first, last, [&](int port) {
    return std::any_of(runtime_.begin(), runtime_.end(), [&](const auto& kv) {
      return kv.first != job && kv.second.root_node == node && kv.second.port == port;
    });
  });
}

v1::Command Coordinator::stopCommand(const std::string& id, int attempt, const std::string& reason,
                                     int grace_ms) const {
  v1::Command cmd;
  v1::StopJob* stop = cmd.mutable_stop();
  stop->set_job_id(id);
  stop->set_attempt(attempt);
  stop->set_grace_ms(static_cast<int32_t>(grace_ms >= 0 ? grace_ms : options_.stop_grace_ms));
  stop->set_reason(reason);
  return cmd;
}

void Coordinator::stopJobEverywhereOnLoop(const std::string& id, int attempt, const std::string& reason,
                                          const std::vector<state::NodeAllocation>& allocation,
                                          int grace_ms) {
  const v1::Command cmd = stopCommand(id, attempt, reason, grace_ms);
  for (const auto& a : allocation) registry_->sendOnLoop(a.node, cmd);
}

void Coordinator::failJobOnLoop(const std::string& id, const std::string& reason,
                                std::optional<state::Failure> failure) {
  state::Job& job = jobs_[id];
  if (!isLive(job.state)) return;
  if (!job.preempted_by.empty()) {
    endPreemptionOnLoop(id, reason, -1);  // being preempted: whatever ends it now is the preemption's end
    return;
  }
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
  const JobRuntime& r = rt->second;
  const size_t nranks = r.rank_node.size() - r.gone.size();  // an elastic job's lost ranks count no more
  if (jobs_[id].state == JobState::kStarting && r.allMembers([](const v1::RankStatus&) { return true; })) {
    Status st =
        recordTransitionOnLoop(id, JobState::kRunning, "all " + std::to_string(nranks) + " ranks started");
    if (!st) spdlog::error("job {}: {}", id, st.toString());
  }
  if (jobs_[id].state != JobState::kRunning || !r.allMembers(exitedCleanly)) return;
  const int attempt = r.attempt;
  Status st = recordTransitionOnLoop(id, JobState::kSucceeded,
                                     "all " + std::to_string(nranks) + " ranks exited with code 0");
  if (!st) spdlog::error("job {}: {}", id, st.toString());
  // Releases the exited ranks on the agents.
  stopJobEverywhereOnLoop(id, attempt, "job succeeded", jobs_[id].allocation);
}

// ---- Preemption
// ---------------------------------------------------------------------------------------------

bool Coordinator::allRanksExitedOnLoop(const std::string& id) const {
  auto rt = runtime_.find(id);
  if (rt == runtime_.end()) return false;
  return rt->second.allMembers([](const v1::RankStatus& r) { return r.state() == v1::RankStatus::EXITED; });
}

void Coordinator::preemptForWaitingOnLoop(const placement::ScheduleResult& result,
                                          const std::vector<placement::JobRequest>& queue) {
  const placement::ShareTree& tree = shares_->tree();
  // One preemption at a time: the job it is for waits, Preempting, until its victims are gone. A preemption
  // whose job no longer waits (cancelled, held, started) holds no other back; its victims still stop.
  std::map<std::string, std::vector<std::string>> in_flight;  // preemptor -> victims
  int64_t deadline = 0;
  for (const auto& [id, rt] : runtime_) {
    const state::Job& job = jobs_[id];
    auto by = jobs_.find(job.preempted_by);
    if (job.preempted_by.empty() || by == jobs_.end() || by->second.state != JobState::kPending ||
        by->second.held)
      continue;
    in_flight[job.preempted_by].push_back(id);
    deadline = std::max(deadline, job.preempt_deadline_ms);
  }
  // What the job waits for, as `ddlctl list` says it.
  auto preempting = [this](const std::vector<std::string>& victims, int64_t until_ms) {
    std::string names;
    for (const std::string& v : victims) names += (names.empty() ? "" : ", ") + v;
    return Waiting{"Preempting", "preempting " + names + ": " +
                                     (victims.size() == 1 ? "it stops" : "they stop") + " within " +
                                     secondsText(std::max<int64_t>(0, until_ms - wall_ms_())) +
                                     " (the grace of its QoS), then this job starts"};
  };
  for (const auto& [by, victims] : in_flight) pending_reason_[by] = preempting(victims, deadline);
  // A coordinator that took over (or restarted) during a preemption favors its job too (a QoS preemptor ranks
  // first anyway).
  if (favored_.empty() && !in_flight.empty()) favorOnLoop(in_flight.begin()->first, deadline);
  // A new one only after a pass that started nothing (the cluster is then the one the pass saw), and only
  // where some QoS may preempt or the accounts' shares may.
  if (!in_flight.empty() || !result.started().empty() ||
      (!tree.share_preemption && std::none_of(tree.qos.begin(), tree.qos.end(),
                                              [](const auto& q) { return !q.second.preempt.empty(); })))
    return;
  // The cluster as the live jobs hold it: GPUs that the ranks of ended or requeued attempts hold while they
  // stop (a preemption's victims among them) are free in moments, no reason to preempt more.
  const placement::Cluster live = snapshotOnLoop(true, /*stopping_ranks=*/false);
  // What may be preempted: RUNNING (not starting) jobs. What each account holds: every launched job, the
  // starting ones too, but not victims still stopping (of a preemptor since cancelled or held): they are as
  // good as gone. Accounts as the jobs give them ("" is root's: the balance charges them as prioritize does).
  std::vector<placement::Preemptible> running;
  std::map<std::string, int> held;
  for (const auto& [id, rt] : runtime_) {
    const state::Job& job = jobs_[id];
    if (!isLive(job.state) || !job.preempted_by.empty()) continue;
    placement::Allocation allocation = toPlacement(job.allocation);
    held[job.spec.account] += allocation.totalGpus();
    if (job.state == JobState::kRunning)
      running.push_back({id, std::move(allocation), 0, latestAttemptReached(job, JobState::kScheduled),
                         job.spec.qos, job.spec.account});
  }
  const placement::Preemption plan = placement::planPreemption(tree, live, queue, result, running, &held);
  if (plan.victims.empty()) return;
  const int64_t now = wall_ms_();
  int64_t until = now;
  for (const std::string& v : plan.victims) {
    preemptOnLoop(v, plan.jobId, now, plan.forShare);
    until = std::max(until, jobs_[v].preempt_deadline_ms);
  }
  pending_reason_[plan.jobId] = preempting(plan.victims, until);
  if (plan.forShare) favorOnLoop(plan.jobId, until);
}

void Coordinator::favorOnLoop(const std::string& id, int64_t deadline_ms) {
  // Until its victims' ranks have surely stopped (killed at their deadline, then the stop grace) and a
  // minute more.
  favored_ = id;
  favored_until_ms_ = deadline_ms + options_.stop_grace_ms + 60000;
}

void Coordinator::preemptOnLoop(const std::string& id, const std::string& by, int64_t now_ms,
                                bool for_share) {
  state::Job& job = jobs_[id];
  const placement::Qos* qos = shares_->tree().findQos(job.spec.qos);
  const int64_t grace_s = qos ? qos->grace_s : placement::Qos{}.grace_s;
  job.preempted_by = by;
  job.preempt_deadline_ms = now_ms + grace_s * 1000;
  putJobOnLoop(job);  // before the signal goes: a coordinator restarted meanwhile still requeues it
  const state::JobSpec& spec = jobs_.count(by) ? jobs_[by].spec : state::JobSpec{};
  const std::string why =
      for_share ? "account " + (spec.account.empty() ? placement::kRootAccount : spec.account) + "'s share"
                : "QoS " + placement::qosName(spec.qos);
  spdlog::info("job {}: preempted for job {} ({}): its ranks are killed in {} s unless they exit", id, by,
               why, grace_s);
  signalRanksOnLoop(job, job.spec.warn_signal > 0 ? job.spec.warn_signal : SIGTERM, job.preempt_deadline_ms);
  ++counters_.preemptions_total;
}

void Coordinator::endPreemptionOnLoop(const std::string& id, const std::string& why, int grace_ms) {
  if (!isLive(jobs_[id].state)) return;
  auto rt = runtime_.find(id);  // none for a job that recovery could not rebuild
  const std::string by = jobs_[id].preempted_by;
  const int attempt = rt != runtime_.end() ? rt->second.attempt : attemptOf(jobs_[id]);
  const auto allocation = jobs_[id].allocation;  // the requeue clears it; the stops need it
  Status st = recordTransitionOnLoop(id, JobState::kPending, "preempted for job " + by + " (" + why + ")",
                                     std::nullopt, /*counts_as_restart=*/false);
  if (!st) spdlog::error("job {}: {}", id, st.toString());
  stopJobEverywhereOnLoop(id, attempt, "job preempted", allocation, grace_ms);
}

void Coordinator::enforcePreemptionsOnLoop() {
  const int64_t now = wall_ms_();
  std::vector<std::string> due;
  for (const auto& [id, rt] : runtime_) {  // every launched job has one (recovery ends a preemption without)
    const state::Job& job = jobs_[id];
    if (!job.preempted_by.empty() && now >= job.preempt_deadline_ms) due.push_back(id);
  }
  for (const std::string& id : due) endPreemptionOnLoop(id, "its grace ran out; its ranks were killed", 0);
}

}  // namespace ddl::coordinator
