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
#include <csignal>
#include <cstring>
#include <future>
#include <limits>
#include <thread>

#include "common/clock.h"
#include "common/signals.h"
#include "placement/placement.h"
#include "service/convert.h"

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

std::string seconds(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", static_cast<double>(ms) / 1000.0);
  return buf;
}

std::string describeExit(const v1::RankStatus& r) {
  if (r.has_signal()) {
    const char* name = signalAbbrev(r.signal());
    return "was killed by signal " + (name ? std::string(name) : std::to_string(r.signal()));
  }
  return "exited with code " + std::to_string(r.exit_code());
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
  }
  out.set_topology(job.topology);
  if (!job.transitions.empty()) out.set_reason(job.transitions.back().reason);
  out.set_gpus(requestOf(job.id, job.spec).gpuCount());
  return out;
}

}  // namespace

// The loop: one io_context run by one thread, and the ticker's timer.
struct Coordinator::Loop {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  boost::asio::steady_timer ticker{io};
  bool ticking = false;
  std::thread thread;
  std::atomic<std::thread::id> id{};
};

struct Coordinator::LogWait {
  Done<v1::GetLogsResponse> done;
  v1::ReadLog read;
  std::string node;
  std::string where;
  boost::asio::steady_timer timer;
  explicit LogWait(boost::asio::io_context& io) : timer(io) {}
};

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
  loop_ = std::make_unique<Loop>();
  GroupCommitter::Options co;
  co.retry_max_ms = options_.store_retry_max_ms;
  co.retention_ms = options_.history_retention_ms;
  co.wall_ms = wall_ms_;
  committer_ = std::make_unique<GroupCommitter>(store_, co, [this](uint64_t seq, const Status& st) {
    // On the committer's thread: health now (so /healthz does not wait for a busy loop), the rest on the
    // loop.
    setHealth(st.isOk(), st.isOk() ? ""
                                   : "cannot store the coordinator's state: " + st.message() +
                                         "; retrying (new submits are refused until it works)");
    post([this, seq, st] { committedOnLoop(seq, st); });
  });
  reader_ = std::make_unique<StoreReader>();
  loop_->thread = std::thread([this] {
    loop_->id = std::this_thread::get_id();
    loop_->io.run();
  });
  // The loop's id is set before it runs anything; wait for it so onLoop() is right from here on.
  callSync<bool>([] { return true; });
}

Coordinator::~Coordinator() {
  stop();
  reader_->stop();
  loop_->work.reset();
  loop_->io.stop();
  if (loop_->thread.joinable()) loop_->thread.join();
}

bool Coordinator::onLoop() const { return std::this_thread::get_id() == loop_->id; }

void Coordinator::post(std::function<void()> fn) {
  boost::asio::post(loop_->io, [this, fn = std::move(fn)] {
    fn();
    flushOnLoop();
  });
}

namespace {
template <class T>
bool succeeded(const StatusOr<T>& r) {
  return r.isOk();
}
bool succeeded(const Status& s) { return s.isOk(); }
template <class R>
bool succeeded(const R&) {
  return true;
}
}  // namespace

template <class R>
R Coordinator::callSync(std::function<R()> fn, bool wait_for_commit) {
  assert(!onLoop() && "a synchronous Coordinator call from the loop would wait for itself");
  std::promise<R> promise;
  auto future = promise.get_future();
  post([&] {
    auto result = std::make_shared<R>(fn());
    if (!wait_for_commit) return promise.set_value(std::move(*result));
    replyOnLoop([&promise, result] { promise.set_value(std::move(*result)); }, succeeded(*result));
  });
  return future.get();
}

void Coordinator::afterCommitOnLoop(std::function<void()> effect) {
  assert(onLoop());
  turn_effects_.push_back(std::move(effect));
}

void Coordinator::replyOnLoop(std::function<void()> reply, bool ok) {
  assert(onLoop());
  // A refusal waits for nothing; a success only when everything it may report is already durable.
  if (!ok || (dirty_.empty() && committed_seq_ == issued_seq_)) {
    turn_replies_.push_back(std::move(reply));  // nothing to wait for: after this turn's commands, at once
  } else {
    afterCommitOnLoop(std::move(reply));
  }
}

void Coordinator::putJobOnLoop(const state::Job& job, bool new_job) {
  state::Write w;
  w.kind = state::Write::Kind::kPutJob;
  w.job = job;
  w.new_job = new_job;
  std::string key = w.key();
  auto it = dirty_.find(key);
  if (it == dirty_.end()) {
    dirty_.emplace(std::move(key), std::move(w));
  } else {
    it->second.supersede(std::move(w));
  }
}

void Coordinator::putNodeOnLoop(const state::NodeRecord& record) {
  ++node_epoch_;
  state::Write w;
  w.kind = state::Write::Kind::kPutNode;
  w.node = record;
  dirty_[w.key()] = std::move(w);
}

void Coordinator::flushOnLoop() {
  if (!dirty_.empty()) {
    std::vector<state::Write> batch;
    batch.reserve(dirty_.size());
    for (auto& [key, w] : dirty_) batch.push_back(std::move(w));
    dirty_.clear();
    committer_->write(++issued_seq_, std::move(batch));
  }
  for (auto& e : turn_effects_) effects_.emplace_back(issued_seq_, std::move(e));
  turn_effects_.clear();
  while (!effects_.empty() && effects_.front().first <= committed_seq_) {
    auto effect = std::move(effects_.front().second);
    effects_.pop_front();
    effect();
  }
  std::vector<std::function<void()>> replies;
  replies.swap(turn_replies_);
  for (auto& reply : replies) reply();
}

void Coordinator::committedOnLoop(uint64_t seq, const Status& st) {
  if (!st) {
    spdlog::error("storing state (batch {}): {}; retrying", seq, st.toString());
    return;
  }
  committed_seq_ = std::max(committed_seq_, seq);
  evictFinishedOnLoop();
  // flushOnLoop (after this turn) runs the effects that were waiting for it.
}

void Coordinator::setHealth(bool ok, const std::string& message) {
  std::lock_guard<std::mutex> lock(health_mu_);
  if (ok && !health_.ok) spdlog::info("storing state works again");
  health_.ok = ok;
  health_.message = message;
}

Coordinator::Health Coordinator::health() const {
  std::lock_guard<std::mutex> lock(health_mu_);
  return health_;
}

void Coordinator::evictFinishedOnLoop() {
  const int64_t now = wall_ms_();
  while (!finished_.empty()) {
    const Finished& f = finished_.front();
    const bool over = finished_.size() > options_.max_finished_in_memory ||
                      now - f.ended_ms > options_.finished_in_memory_ms;
    if (!over || f.seq > committed_seq_) break;
    auto it = jobs_.find(f.id);
    if (it != jobs_.end() && state::isTerminal(it->second.state)) {
      jobs_.erase(it);
      pending_reason_.erase(f.id);
    }
    finished_.pop_front();
  }
}

// The synchronous form of an asynchronous call: starts it and waits for its answer (never on the loop).
template <class T, class Start>
StatusOr<T> awaitAnswer(Start start) {
  std::promise<StatusOr<T>> promise;
  start([&](StatusOr<T> answer) { promise.set_value(std::move(answer)); });
  return promise.get_future().get();
}

// ---- Lifecycle
// ---------------------------------------------------------------------------------------------

Status Coordinator::recover() {
  return callSync<Status>([this] { return recoverOnLoop(); });
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
    if (loop_->ticking || stopping_) return;
    loop_->ticking = true;
    auto tick = std::make_shared<std::function<void()>>();
    *tick = [this, tick] {
      loop_->ticker.expires_after(std::chrono::milliseconds(options_.tick_ms));
      loop_->ticker.async_wait([this, tick](const boost::system::error_code& ec) {
        if (ec || stopping_) return;
        housekeepingOnLoop();
        schedulePassOnLoop();
        evictFinishedOnLoop();
        flushOnLoop();
        (*tick)();
      });
    };
    (*tick)();
  });
}

void Coordinator::closeAgents() {
  if (!loop_ || onLoop() || !loop_->thread.joinable() || loop_->io.stopped()) return;
  callSync<bool>(
      [this] {
        stopping_ = true;
        loop_->ticker.cancel();
        for (auto& [name, node] : nodes_) {
          if (node.link) node.link->close();
          node.link.reset();
        }
        for (auto& [rid, wait] : log_waits_) wait->timer.cancel();
        return true;
      },
      /*wait_for_commit=*/false);
}

void Coordinator::stop() {
  if (!loop_ || !committer_) return;
  closeAgents();
  committer_->stop();  // stores what is left
}

void Coordinator::tick() {
  callSync<bool>([this] {
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

bool Coordinator::recoveringOnLoop(int64_t now) const {
  return recovery_until_ms_ != 0 && now < recovery_until_ms_;
}

// ---- Jobs: transitions, scheduling, launch
// -----------------------------------------------------------------

Status Coordinator::recordTransitionOnLoop(const std::string& id, JobState to, const std::string& reason,
                                           const std::optional<state::Failure>& failure) {
  auto found = jobs_.find(id);
  if (found == jobs_.end()) return state::jobNotFound(id);
  state::Job job = found->second;
  const JobState from = job.state;
  Status applied = state::applyTransition(job, to, reason, failure, wall_ms_());
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
    finished_.push_back({id, issued_seq_ + 1, state::endedAtMs(found->second)});  // the batch this turn makes
  }
  if (!isLive(found->second.state)) runtime_.erase(id);
  if (found->second.state != JobState::kPending) pending_reason_.erase(id);
  schedule_wanted_ = true;
  return Status::ok();
}

int Coordinator::attemptOf(const state::Job& job) {
  return static_cast<int>(std::count_if(job.transitions.begin(), job.transitions.end(),
                                        [](const auto& t) { return t.to == JobState::kScheduled; }));
}

void Coordinator::schedulePassOnLoop() {
  if (!schedule_wanted_) return;
  schedule_wanted_ = false;
  const int64_t now = now_ms_();
  std::vector<placement::JobRequest> queue;
  for (const auto& [id, job] : jobs_) {
    if (job.state == JobState::kPending) queue.push_back(requestOf(id, job.spec));
  }
  if (queue.empty()) return;
  if (recoveringOnLoop(now)) {
    for (const auto& r : queue) {
      pending_reason_[r.id] = "coordinator restarted; waiting up to " + seconds(recovery_until_ms_ - now) +
                              " for agents to reconnect";
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
    launchOnLoop(d.jobId, d.allocation, layout);
    for (const auto& a : d.allocation.nodes) usage[a.node].gpus.insert(a.gpus.begin(), a.gpus.end());
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
  std::map<std::string, v1::Command> commands;  // by node
  for (const auto& slot : layout.ranks) {
    v1::Command& cmd = commands[slot.node];
    v1::StartRanks* start = cmd.mutable_start();
    if (start->job_id().empty()) {
      start->set_job_id(id);
      start->set_attempt(rt.attempt);
      for (const auto& a : job.spec.command) start->add_command(a);
      start->set_workdir(job.spec.workdir);
      start->set_user(job.spec.user);
      start->set_allow_root(options_.allow_root_jobs);
    }
    v1::RankLaunch* launch = start->add_ranks();
    launch->set_rank(slot.rank);
    launch->set_gpu(slot.gpu);
    launch->set_local_rank(slot.localRank);
    auto add = [&](const std::string& k, const std::string& v) {
      v1::EnvVar* e = launch->add_env();
      e->set_name(k);
      e->set_value(v);
    };
    // The user's variables first; ddl's own come after and win, so a stray RANK cannot break the job.
    for (const auto& kv : job.spec.env) {
      size_t eq = kv.find('=');
      add(kv.substr(0, eq), kv.substr(eq + 1));
    }
    RankEnvSpec spec = placement::rankEnvSpec(layout, slot.rank);
    spec.root_host = root_addr;
    spec.root_port = rt.port;
    spec.master_port = rt.port + 1;  // ports are handed out in pairs (pickPortOnLoop)
    spec.job_id = id;
    spec.attempt = rt.attempt;
    spec.secret = secret;
    for (const auto& [k, v] : rankEnvironment(spec)) add(k, v);
  }
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
  const int slots = std::max(1, (last - first + 1) / 2);
  // Start from a slot derived from the job id, so a restarted coordinator computes the same port for a job
  // that is still running, then skip slots that live jobs rooted on the same node hold.
  const int start = static_cast<int>(state::jobIdNumber(job).value_or(0) % slots);
  for (int i = 0; i < slots; ++i) {
    int port = first + 2 * ((start + i) % slots);
    bool taken = std::any_of(runtime_.begin(), runtime_.end(), [&](const auto& kv) {
      return kv.first != job && kv.second.root_node == node && kv.second.port == port;
    });
    if (!taken) return port;
  }
  return first + 2 * start;  // every slot taken: more live jobs than ports; the store reports the clash
}

void Coordinator::sendOnLoop(const std::string& node, const v1::Command& command) {
  if (nodes_.find(node) == nodes_.end()) return;
  // Commands go out once what led to them is durable (a StartRanks never leaves before STARTING is stored).
  afterCommitOnLoop([this, node, command] {
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
                               seconds(now - node.last_seen_ms) + " (grace " +
                               seconds(options_.heartbeat_grace_ms) + ")";
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

StatusOr<v1::RegisterResponse> Coordinator::registerAgent(const v1::RegisterRequest& req) {
  return callSync<StatusOr<v1::RegisterResponse>>([&] { return registerAgentOnLoop(req); });
}

void Coordinator::registerAgent(const v1::RegisterRequest& req,
                                std::function<void(StatusOr<v1::RegisterResponse>)> done) {
  post([this, req, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::RegisterResponse>>(registerAgentOnLoop(req));
    replyOnLoop([done, result] { done(std::move(*result)); }, result->isOk());
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
  int first = req.port_first(), last = req.port_last();
  if (first == 0 && last == 0) {
    first = options_.port_first;
    last = options_.port_last;
  } else if (first < 1024 || last > 65535 || last <= first) {
    return Status::invalidArgument("register: node " + req.node() + ": port range " + std::to_string(first) +
                                   "-" + std::to_string(last) + " must lie in 1024-65535 and hold 2 ports");
  }

  const int64_t now = now_ms_();
  NodeEntry& node = nodes_[req.node()];
  state::NodeRecord record = node.record;
  record.name = req.node();
  record.address = req.address();
  record.gpus.clear();
  for (const auto& g : req.gpus()) record.gpus.push_back({g.index(), g.uuid(), g.model(), g.memory_bytes()});
  record.labels = {req.labels().begin(), req.labels().end()};
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
  node.port_first = first;
  node.port_last = last;
  node.last_seen_ms = now;
  node.session = req.node() + "-" + std::to_string(wall_ms_()) + "-" + std::to_string(++session_counter_);
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

Status Coordinator::attachAgent(const std::string& node, const std::string& session,
                                std::shared_ptr<AgentLink> link) {
  return callSync<Status>([&] { return attachAgentOnLoop(node, session, link); });
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
                 seconds(options_.heartbeat_grace_ms));
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
    if (now.bytes() >= before.bytes() && now.seconds() >= before.seconds()) {
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

Status Coordinator::heartbeat(const std::string& node, const std::string& session, const v1::Heartbeat& hb) {
  return callSync<Status>([&] { return heartbeatOnLoop(node, session, hb); });
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

Status Coordinator::rankEvent(const std::string& node, const std::string& session, const v1::RankStatus& r) {
  return callSync<Status>([&] { return rankEventOnLoop(node, session, r); });
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
      u.jobs.push_back(id);
    }
  }
  for (const auto& [name, node] : nodes_) {
    for (const auto& [key, r] : node.ranks) {
      if (r.state() == v1::RankStatus::RUNNING) usage[name].gpus.insert(r.gpu());  // still dying after a stop
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
    auto u = usage.find(name);
    if (u != usage.end()) {
      for (int g : u->second.gpus) {
        if (g >= 0 && g < n.gpus) n.used[g] = true;
      }
    }
    cluster.nodes.push_back(std::move(n));
  }
  return cluster;
}

// ---- Users
// -------------------------------------------------------------------------------------------------

StatusOr<v1::Job> Coordinator::submitOnLoop(const v1::JobSpec& proto_spec) {
  state::JobSpec spec = fromProto(proto_spec);
  if (spec.user.empty()) spec.user = "unknown";
  Status st = state::validateJobSpec(spec);
  if (!st) return st;
  if (Health h = health(); !h.ok) return Status::unavailable("job refused: " + h.message);
  // Not stored yet, so no id: the message names the job by its name.
  // The nodes as "could this ever fit" sees them (GPU counts, labels, DOWN): rebuilt only when a node record
  // changed, not for every submit (2,000 nodes at 1,000 submits a second).
  if (feasibility_epoch_ != node_epoch_ || !feasibility_cluster_) {
    feasibility_cluster_ = std::make_unique<placement::Cluster>(snapshotOnLoop(false));
    feasibility_epoch_ = node_epoch_;
  }
  std::string never = placement::checkFeasible(*feasibility_cluster_,
                                               requestOf(spec.name.empty() ? "(unnamed)" : spec.name, spec));
  if (!never.empty()) return Status::invalidArgument("job refused: " + never);
  state::Job job;
  job.id = state::formatJobId(++last_job_number_);
  job.spec = spec;
  job.state = JobState::kPending;
  job.submit_ms = wall_ms_();
  job.transitions.push_back(
      state::Transition{JobState::kPending, JobState::kPending, job.submit_ms, "submitted", {}});
  jobs_[job.id] = job;
  putJobOnLoop(job, /*new_job=*/true);  // the answer waits for it: only a durable job is acknowledged
  ++counters_.jobs_submitted_total;
  spdlog::info("job {} submitted by {}: {}", job.id, spec.user, requestOf(job.id, spec).describe());
  schedule_wanted_ = true;
  return toProtoOnLoop(job);
}

StatusOr<v1::Job> Coordinator::submit(const v1::JobSpec& spec) {
  return callSync<StatusOr<v1::Job>>([&] { return submitOnLoop(spec); });
}

void Coordinator::submit(const v1::JobSpec& spec, Done<v1::Job> done) {
  post([this, spec, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::Job>>(submitOnLoop(spec));
    replyOnLoop([done, result] { done(std::move(*result)); }, result->isOk());
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

StatusOr<v1::Job> Coordinator::getJob(const std::string& id) {
  return awaitAnswer<v1::Job>([&](Done<v1::Job> done) { getJob(id, std::move(done)); });
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

StatusOr<v1::ListJobsResponse> Coordinator::listJobs(const v1::ListJobsRequest& request) {
  return awaitAnswer<v1::ListJobsResponse>(
      [&](Done<v1::ListJobsResponse> done) { listJobs(request, std::move(done)); });
}

void Coordinator::listJobs(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done) {
  post([this, request, done = std::move(done)] { listJobsOnLoop(request, done); });
}

StatusOr<v1::Job> Coordinator::cancelOnLoop(const state::Job& found) {
  const std::string id = found.id;
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

StatusOr<v1::Job> Coordinator::cancel(const std::string& id) {
  return awaitAnswer<v1::Job>([&](Done<v1::Job> done) { cancel(id, std::move(done)); });
}

void Coordinator::cancel(const std::string& id, Done<v1::Job> done) {
  post([this, id, done = std::move(done)] {
    withJobOnLoop(id, [this, done](StatusOr<state::Job> job) {
      if (!job) return done(job.status());
      auto result = std::make_shared<StatusOr<v1::Job>>(cancelOnLoop(*job));
      replyOnLoop([done, result] { done(std::move(*result)); }, result->isOk());
    });
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

std::vector<v1::Node> Coordinator::listNodes() {
  return callSync<std::vector<v1::Node>>([this] { return listNodesOnLoop(); }, false);
}

void Coordinator::listNodes(Done<std::vector<v1::Node>> done) {
  post([this, done = std::move(done)] { done(listNodesOnLoop()); });
}

StatusOr<v1::Node> Coordinator::drainOnLoop(const std::string& name, bool drain) {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return state::nodeNotFound(name);
  NodeEntry& node = it->second;
  // A DOWN node stays DOWN until its agent is back; the drain is kept for then.
  state::NodeRecord want = node.record;
  want.drained = drain;
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

StatusOr<v1::Node> Coordinator::drain(const std::string& name, bool drain_it) {
  return callSync<StatusOr<v1::Node>>([&] { return drainOnLoop(name, drain_it); });
}

void Coordinator::drain(const std::string& name, bool drain_it, Done<v1::Node> done) {
  post([this, name, drain_it, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::Node>>(drainOnLoop(name, drain_it));
    replyOnLoop([done, result] { done(std::move(*result)); }, result->isOk());
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
  dirty_[w.key()] = std::move(w);
  spdlog::info("node {} removed", name);
  return out;
}

StatusOr<v1::Node> Coordinator::removeNode(const std::string& name) {
  return callSync<StatusOr<v1::Node>>([&] { return removeNodeOnLoop(name); });
}

void Coordinator::removeNode(const std::string& name, Done<v1::Node> done) {
  post([this, name, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::Node>>(removeNodeOnLoop(name));
    replyOnLoop([done, result] { done(std::move(*result)); }, result->isOk());
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
    return done(Status::failedPrecondition("job " + job.id + " is " + toString(job.state) +
                                           " and has not been launched, so it has no logs yet"));
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
  if (log_waits_.size() >= CoordinatorOptions::kMaxLogReads) {
    return done(Status::unavailable("too many log reads wait for agents now; try again"));
  }
  const std::string rid = "log-" + std::to_string(++log_requests_);
  auto wait = std::make_shared<LogWait>(loop_->io);
  wait->done = std::move(done);
  wait->node = node;
  wait->where = where;
  v1::Command cmd;
  v1::ReadLog* read = cmd.mutable_read_log();
  read->set_request(rid);
  read->set_job_id(job.id);
  read->set_attempt(attempt);
  read->set_rank(request.rank());
  read->set_offset(std::max<int64_t>(0, request.offset()));
  read->set_max_bytes(request.max_bytes() <= 0 ? kDefaultChunk : std::min(request.max_bytes(), kMaxChunk));
  wait->read = *read;
  log_waits_[rid] = wait;
  sendOnLoop(node, cmd);
  wait->timer.expires_after(std::chrono::milliseconds(options_.log_timeout_ms));
  wait->timer.async_wait([this, rid](const boost::system::error_code&) {
    auto w = log_waits_.find(rid);
    if (w == log_waits_.end()) return;  // answered
    auto waiting = w->second;
    log_waits_.erase(w);
    waiting->done(Status::unavailable(waiting->where + ", which did not answer within " +
                                      seconds(options_.log_timeout_ms)));
  });
}

StatusOr<v1::GetLogsResponse> Coordinator::readLog(const v1::GetLogsRequest& request) {
  return awaitAnswer<v1::GetLogsResponse>(
      [&](Done<v1::GetLogsResponse> done) { readLog(request, std::move(done)); });
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
  auto it = log_waits_.find(data.request());
  if (it == log_waits_.end() || it->second->node != node) return Status::ok();  // the reader gave up already
  auto wait = it->second;
  log_waits_.erase(it);
  wait->timer.cancel();
  if (!data.error().empty())
    return wait->done(Status::notFound(wait->where + ": " + data.error())), Status::ok();
  v1::GetLogsResponse resp;
  resp.set_data(data.data());
  resp.set_next_offset(wait->read.offset() + static_cast<int64_t>(data.data().size()));
  resp.set_size(data.size());
  auto job = jobs_.find(wait->read.job_id());
  resp.set_job_ended(job == jobs_.end() || state::isTerminal(job->second.state));
  resp.set_attempt(wait->read.attempt());
  resp.set_node(node);
  wait->done(std::move(resp));
  return Status::ok();
}

Status Coordinator::logData(const std::string& node, const std::string& session, const v1::LogData& data) {
  return callSync<Status>([&] { return logDataOnLoop(node, session, data); }, false);
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
  m.store_backlog = committer_->backlog();
  m.jobs_in_memory = jobs_.size();
  for (const auto& [id, job] : jobs_) {
    if (!isLive(job.state) || m.jobs.size() >= MetricsSnapshot::kMaxJobFigures) continue;
    m.jobs.push_back(telemetry_.figures(id, requestOf(job.id, job.spec).gpuCount(), wall_ms_()));
  }
  return m;
}

MetricsSnapshot Coordinator::metrics() {
  return callSync<MetricsSnapshot>([this] { return metricsOnLoop(); }, false);
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

StatusOr<v1::RingLayout> Coordinator::ring(const std::string& id) {
  return awaitAnswer<v1::RingLayout>([&](Done<v1::RingLayout> done) { ring(id, std::move(done)); });
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
  if (job.state == JobState::kPending) {
    auto it = pending_reason_.find(job.id);
    out.set_reason(it != pending_reason_.end() ? it->second : "waiting for the next scheduling pass");
  }
  auto rt = runtime_.find(job.id);
  if (rt != runtime_.end()) {
    for (const auto& [rank, status] : rt->second.ranks) *out.add_ranks() = status;
  }
  return out;
}

v1::Node Coordinator::nodeToProtoOnLoop(const NodeEntry& node, const NodeUsage& usage) const {
  v1::Node out;
  out.set_name(node.record.name);
  out.set_address(node.record.address);
  out.set_state(toString(node.record.state));
  out.set_drained(node.record.drained);
  for (const auto& g : node.record.gpus) {
    v1::Gpu* p = out.add_gpus();
    p->set_index(g.index);
    p->set_uuid(g.uuid);
    p->set_model(g.model);
    p->set_memory_bytes(g.memory_bytes);
  }
  for (int g : usage.gpus) out.add_gpus_used(g);
  for (const auto& [k, v] : node.record.labels) (*out.mutable_labels())[k] = v;
  out.set_last_heartbeat_ms(node.record.last_heartbeat_ms);
  out.set_connected(node.link != nullptr);
  for (const auto& id : usage.jobs) out.add_jobs(id);
  for (const auto& nic : node.nics) *out.add_nics() = nic;
  return out;
}

}  // namespace ddl::coordinator
