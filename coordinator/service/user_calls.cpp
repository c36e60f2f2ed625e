// The Coordinator's users' side: submit, the job calls (cancel, hold, release, requeue), listings and their
// pages of history, nodes (drain, remove), logs, ring layouts, metrics and the plots, and the messages users
// see. See coordinator.h for the whole object; the other parts are in coordinator.cpp and agents.cpp.
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
  spec.request_id = request.request_id();  // set here, from the request, never from its spec
  Status st = state::validateJobSpec(spec);
  if (!st) return st;
  // A submit that repeats its request id (a retry after a lost answer) gets what the first one made.
  if (!spec.request_id.empty()) {
    if (auto r = request_ids_.find({spec.user, spec.request_id}); r != request_ids_.end())
      return existingSubmitOnLoop(r->second, spec);
  }
  ArraySpec array;
  if (!request.array().empty()) {
    if (std::string why = parseArraySpec(request.array(), &array); !why.empty()) {
      return Status::invalidArgument("array '" + state::quoteForMessage(request.array()) + "': " + why +
                                     " (" + kArrayForms + ")");
    }
  }
  if (StoreHealth h = health(); !h.ok) return Status::unavailable("job refused: " + h.message);
  // Dependencies: each must exist; one that already ended is met now (or can never be, for --after-ok).
  std::vector<std::string> waiting_for;
  for (const auto* deps : {&spec.after_ok, &spec.after_any}) {
    const bool needs_success = deps == &spec.after_ok;
    for (const std::string& dep : *deps) {
      auto number = state::jobIdNumber(dep);
      if (!number || *number > last_job_number_)
        return Status::notFound("dependency " + dep + " does not exist; list jobs to see the ids that exist");
      std::optional<JobState> dep_state;
      if (auto it = jobs_.find(dep); it != jobs_.end())
        dep_state = it->second.state;
      else if (auto k = known.find(dep); k != known.end())
        dep_state = k->second;
      else if (needs_success)
        return Status::notFound("dependency " + dep + " is no longer in the job history");
      else
        dep_state = JobState::kCancelled;  // left memory, so it ended; --after-any needs no more
      if (!state::isTerminal(*dep_state)) {
        if (std::find(waiting_for.begin(), waiting_for.end(), dep) == waiting_for.end())
          waiting_for.push_back(dep);
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
  if (feasibility_epoch_ != registry_->epoch() || !feasibility_cluster_) {
    feasibility_cluster_ = std::make_unique<placement::Cluster>(snapshotOnLoop(false));
    feasibility_epoch_ = registry_->epoch();
  }
  std::string never = placement::neverFits(*feasibility_cluster_,
                                           requestOf(spec.name.empty() ? "(unnamed)" : spec.name, spec));
  if (!never.empty()) return Status::invalidArgument("job refused: " + never);
  const size_t count = array.indices.empty() ? 1 : array.indices.size();
  if (Status within = withinLimitsOnLoop(spec, count); !within) return within;
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
  const int64_t now = wall_ms_();
  if (Status fits = fitsTheStoreOnLoop(spec, count, now); !fits) return fits;
  v1::SubmitResponse response;
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
    unstored_submits_[job.id] = actor_->nextBatch();
    if (i == 0) *response.mutable_job() = toProtoOnLoop(job);
  }
  if (!spec.request_id.empty()) {
    request_ids_[{spec.user, spec.request_id}] = {state::jobIdNumber(response.job().id()).value_or(0),
                                                  last_job_number_, static_cast<int>(count)};
  }
  spdlog::info("job {} submitted by {}: {}{}", response.job().id(), spec.user,
               requestOf(response.job().id(), spec).describe(),
               count > 1 ? " (an array of " + std::to_string(count) + " jobs)" : "");
  schedule_wanted_ = true;
  return response;
}

Status Coordinator::withinLimitsOnLoop(const state::JobSpec& spec, size_t count) const {
  const placement::ShareTree& tree = shares_->tree();
  const placement::JobRequest request = requestOf(spec.name.empty() ? "(unnamed)" : spec.name, spec);
  if (std::string qos = tree.qosProblem(request); !qos.empty()) {
    return Status::invalidArgument("job refused: " + qos + " (ddlctl qos lists them)");
  }
  if (std::string never = placement::LimitTracker(tree).never(request); !never.empty()) {
    return Status::invalidArgument("job refused: " + never);
  }
  // Pending limits: counted only where one is set (the queue is walked once for this submit).
  std::vector<std::pair<std::string, int>> limited;  // "user X" / "account A", its limit
  if (auto u = tree.users.find(spec.user); u != tree.users.end() && u->second.pending > 0) {
    limited.push_back({"user " + spec.user, u->second.pending});
  }
  const std::vector<std::string> chain = tree.chain(spec.account);
  for (const std::string& a : chain) {
    auto it = tree.accounts.find(a);
    if (it != tree.accounts.end() && it->second.limits.pending > 0)
      limited.push_back({"account " + a, it->second.limits.pending});
  }
  if (limited.empty()) return Status::ok();
  std::map<std::string, int> pending;
  for (const auto& [id, job] : jobs_) {
    if (job.state != JobState::kPending) continue;
    if (job.spec.user == spec.user) ++pending["user " + spec.user];
    for (const std::string& a : tree.chain(job.spec.account)) {
      if (std::find(chain.begin(), chain.end(), a) != chain.end()) ++pending["account " + a];
    }
  }
  for (const auto& [who, limit] : limited) {
    if (pending[who] + static_cast<int>(count) > limit) {
      return Status::failedPrecondition("job refused: " + who + " has " + std::to_string(pending[who]) +
                                        " jobs waiting, and may have at most " + std::to_string(limit) +
                                        " (ddlctl admin set-limit); wait for some to start");
    }
  }
  return Status::ok();
}

void Coordinator::submitAsyncOnLoop(const v1::SubmitRequest& request, Done<v1::SubmitResponse> done) {
  // An --after-ok dependency that left memory is read back first (a final job: did it succeed?).
  std::vector<std::string> unknown;
  for (const auto& dep : request.spec().after_ok()) {
    auto number = state::jobIdNumber(dep);
    if (number && *number <= last_job_number_ && !jobs_.count(dep) &&
        unknown.size() < state::kMaxDependencies)
      unknown.push_back(dep);
  }
  auto known = std::make_shared<std::map<std::string, JobState>>();
  auto finish = [this, request, done, known] {
    auto result = std::make_shared<StatusOr<v1::SubmitResponse>>(submitOnLoop(request, *known));
    if (!result->isOk()) return actor_->reply([done, result] { done(std::move(*result)); }, false);
    std::vector<std::string> ids((*result)->array_jobs().begin(), (*result)->array_jobs().end());
    if (ids.empty()) ids.push_back((*result)->job().id());
    // Jobs already durable (a repeated request id) are answered at once; new ones once stored, or, if the
    // store cannot take them, withdrawn and refused at once with its reason: never a job the caller was
    // told was refused, and never a caller left waiting behind a full disk.
    const bool stored = std::none_of(ids.begin(), ids.end(), [&](const std::string& id) {
      auto u = unstored_submits_.find(id);
      return u != unstored_submits_.end() && u->second > actor_->committedBatch();
    });
    if (stored) return actor_->replyNow([done, result] { done(std::move(*result)); });
    const bool made_here = !(*result)->existing();
    actor_->replyUnlessLost(
        [done, result] { done(std::move(*result)); },
        [this, done, ids, made_here](const Status& why) {
          if (made_here) withdrawSubmitOnLoop(ids, why);
          done(Status::unavailable("job refused: " + std::string(kCannotStoreState) + " (" + why.message() +
                                   "); nothing was submitted and nothing will run: submit again once it can "
                                   "(its /healthz says when)"));
        });
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

Status Coordinator::fitsTheStoreOnLoop(const state::JobSpec& spec, size_t count, int64_t now) {
  // A submit is stored whole in one transaction of the store (etcd takes 127 writes of 1 MiB in one unless
  // its operator raised --max-txn-ops and --max-request-bytes): an array that could never be is refused here,
  // and one that can starts a batch of its own when the current one could not take it.
  state::Write one;
  one.job = state::newJob(state::formatJobId(last_job_number_ + static_cast<int64_t>(count)), spec, now);
  one.new_job = true;
  const size_t each = actor_->bytesOf(one);
  const std::string how =
      "etcd's --max-txn-ops and --max-request-bytes, and the coordinator's etcd_max_txn_ops and "
      "etcd_max_txn_bytes, raise it";
  if (!actor_->reserve(count, each * count)) {
    return Status::invalidArgument("an array of " + std::to_string(count) + " jobs (" +
                                   std::to_string(each * count / 1024 + 1) +
                                   " KiB) is more than the coordinator's store takes in one transaction (" +
                                   how + "); submit it in smaller arrays");
  }
  // A job's record grows with its ranks once placed (their node, pids, ends and figures), and every write of
  // it is one transaction too.
  const int64_t gpus = spec.total_gpus > 0 ? spec.total_gpus : int64_t{spec.nodes} * spec.gpus_per_node;
  one.job.ranks.resize(static_cast<size_t>(std::clamp<int64_t>(gpus, 0, 1 << 20)));
  for (state::RankResult& r : one.job.ranks) r.node = std::string(64, 'n');
  if (!actor_->fitsOneBatch(1, actor_->bytesOf(one))) {
    return Status::invalidArgument("a job of " + std::to_string(gpus) +
                                   " ranks keeps a record larger than the coordinator's store takes in one "
                                   "transaction (" +
                                   how + ")");
  }
  return Status::ok();
}

StatusOr<v1::SubmitResponse> Coordinator::existingSubmitOnLoop(const Submitted& made,
                                                               const state::JobSpec& asked) const {
  // The first of its jobs still in memory (the entry lives while one is).
  const state::Job* found = nullptr;
  for (int64_t n = made.first; n <= made.last && !found; ++n) {
    if (auto it = jobs_.find(state::formatJobId(n)); it != jobs_.end()) found = &it->second;
  }
  if (!found) return Status::internal("request id " + asked.request_id + ": its jobs left memory");
  // The repeat must ask for what the first asked for (what the coordinator sets itself aside): a request id
  // used for two different jobs is a mistake to say, not to answer with the wrong job.
  state::JobSpec mine = found->spec, theirs = asked;
  for (state::JobSpec* s : {&mine, &theirs}) {
    s->array_id.clear();
    s->array_index = 0;
    s->array_max_running = 0;
  }
  if (mine != theirs) {
    return Status::failedPrecondition("request id " + asked.request_id + " already made " +
                                      state::formatJobId(made.first) +
                                      ", with another job spec; give this job a request id of its own");
  }
  v1::SubmitResponse response;
  *response.mutable_job() = toProtoOnLoop(*found);
  response.set_existing(true);
  if (!found->spec.array_id.empty()) {
    // An array's jobs have consecutive numbers, made in one turn; those that left memory are in the store.
    for (int64_t n = made.first; n <= made.last; ++n) response.add_array_jobs(state::formatJobId(n));
  }
  return response;
}

void Coordinator::withdrawSubmitOnLoop(const std::vector<std::string>& ids, const Status& why) {
  for (const std::string& id : ids) {
    unstored_submits_.erase(id);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    dropRequestIdOnLoop(it->second, /*forget=*/true);
    // Its record forgets the id too, so a restart does not bring it back for the caller's next try.
    it->second.spec.request_id.clear();
    if (state::isTerminal(it->second.state)) {  // cancelled meanwhile
      putJobOnLoop(it->second);
      continue;
    }
    // Never placed (unstored_submits_ keeps it out of placement), so nothing of it ran.
    Status st = recordTransitionOnLoop(
        id, JobState::kCancelled,
        "the submit was refused: the coordinator could not store it (" + why.message() + ")");
    if (!st) spdlog::error("withdrawing job {}: {}", id, st.toString());
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
  // The page's order (ascending job numbers, or descending with newest_first) and its bound: the previous
  // page's last number (0: none), which this page's numbers come after in that order.
  const bool newest = request.newest_first();
  int64_t bound = 0;
  if (!request.page_token().empty()) {
    auto n = state::jobIdNumber("j-" + request.page_token());
    if (!n)
      return done(Status::invalidArgument("list: page token '" + request.page_token() +
                                          "' is not one this coordinator gave; start again without it"));
    bound = *n;
  }
  auto beyond = [newest, bound](int64_t n) { return bound == 0 || (newest ? n < bound : n > bound); };
  auto before = [newest](int64_t a, int64_t b) { return newest ? a > b : a < b; };
  // Memory: every open job and the recent final ones, as they are now (newer than the store).
  std::vector<const state::Job*> mine;
  std::set<int64_t> in_memory;
  for (const auto& [id, job] : jobs_) {
    const int64_t n = state::jobIdNumber(id).value_or(0);
    if (!beyond(n)) continue;
    in_memory.insert(n);
    if (state::matches(filter, job)) mine.push_back(&job);
  }
  std::sort(mine.begin(), mine.end(), [&](const state::Job* a, const state::Job* b) {
    return before(state::jobIdNumber(a->id).value_or(0), state::jobIdNumber(b->id).value_or(0));
  });
  if (mine.size() > static_cast<size_t>(limit) + 1) mine.resize(limit + 1);
  std::vector<v1::Job> page;
  page.reserve(mine.size());
  for (const state::Job* job : mine) page.push_back(toProtoOnLoop(*job));
  auto finish = [limit, before](std::vector<v1::Job> jobs, Done<v1::ListJobsResponse> done) {
    std::sort(jobs.begin(), jobs.end(), [&](const v1::Job& a, const v1::Job& b) {
      return before(state::jobIdNumber(a.id()).value_or(0), state::jobIdNumber(b.id()).value_or(0));
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
  const bool queued = reader_->run([this, filter, bound, newest, limit, page = std::move(page),
                                    in_memory = std::move(in_memory), finish, done]() mutable {
    // limit + 1 stored jobs that memory does not hold (the ones it holds are skipped, not counted), or as
    // many as there are: each round starts beyond the last row of the one before, at most 64 rounds.
    int64_t from = bound;
    size_t taken = 0;
    for (int round = 0; round < 64 && taken < static_cast<size_t>(limit) + 1; ++round) {
      auto stored = store_.listJobsPage(filter, from, limit + 1, newest);
      if (!stored) return done(stored.status());
      for (const auto& job : *stored) {
        const int64_t n = state::jobIdNumber(job.id).value_or(0);
        from = newest ? (from == 0 ? n : std::min(from, n)) : std::max(from, n);
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
      return Status::invalidArgument("signal " + std::to_string(signal) +
                                     " is not a signal number (1 to 64)");
    if (found.state != JobState::kRunning)
      return Status::failedPrecondition("job " + id + " is " + toString(found.state) +
                                        "; only the ranks of a RUNNING job can be signalled");
    signalRanksOnLoop(found, signal);
    return toProtoOnLoop(found);
  }
  if (state::isTerminal(found.state)) {
    return Status::failedPrecondition("job " + id + " already ended " + toString(found.state) +
                                      "; nothing to cancel");
  }
  if (StoreHealth h = health(); !h.ok) return Status::unavailable("cancel refused: " + h.message);
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
    return Status::failedPrecondition("job " + id + " is " + toString(found.state) +
                                      "; only a PENDING job can be " + (hold ? "held" : "released"));
  if (!hold && found.held_by_admin && !by_admin)
    return Status::permissionDenied("job " + id + " was held by an admin; only an admin releases it");
  if (found.held != hold || (hold && by_admin && !found.held_by_admin)) {
    if (StoreHealth h = health(); !h.ok)
      return Status::unavailable((hold ? "hold" : "release") + std::string(" refused: ") + h.message);
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
        "job " + id + " is " + toString(found.state) +
        "; only a SCHEDULED, STARTING or RUNNING job is requeued" +
        (state::isTerminal(found.state) ? " (submit it again)" : " (it is already in the queue)"));
  }
  if (StoreHealth h = health(); !h.ok) return Status::unavailable("requeue refused: " + h.message);
  const int attempt = runtime_.count(id) ? runtime_[id].attempt : attemptOf(found);
  const auto allocation = found.allocation;  // the requeue clears it; the stops need it
  jobs_[id].preempted_by.clear();            // requeued by hand, not preempted
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
    jobCallOnLoop(id, done, [this, hold_it, by_admin](const state::Job& job) {
      return holdOnLoop(job, hold_it, by_admin);
    });
  });
}

void Coordinator::requeue(const std::string& id, Done<v1::Job> done) {
  post([this, id, done = std::move(done)] {
    jobCallOnLoop(id, done, [this](const state::Job& job) { return requeueOnLoop(job); });
  });
}

std::vector<v1::Node> Coordinator::listNodesOnLoop() {
  std::vector<const Node*> sorted;
  for (const auto& [name, node] : registry_->all()) sorted.push_back(&node);
  std::sort(sorted.begin(), sorted.end(), [](const Node* a, const Node* b) {
    return placement::naturalLess(a->record.name, b->record.name);
  });
  const auto usage = usageOnLoop();
  std::vector<v1::Node> out;
  out.reserve(sorted.size());
  for (const Node* n : sorted) {
    auto u = usage.find(n->record.name);
    out.push_back(registry_->toProto(*n, u != usage.end() ? u->second : NodeUsage{}));
  }
  return out;
}

void Coordinator::listNodes(Done<std::vector<v1::Node>> done) {
  post([this, done = std::move(done)] { done(listNodesOnLoop()); });
}

StatusOr<v1::Node> Coordinator::drainOnLoop(const std::string& name, bool drain, const std::string& reason) {
  const StoreHealth h = health();
  const uint64_t epoch = registry_->epoch();
  StatusOr<Node*> node = registry_->drainOnLoop(name, drain, reason, h.ok ? "" : h.message);
  if (!node) return node.status();
  if (registry_->epoch() != epoch) schedule_wanted_ = true;  // the record changed (a repeated drain does not)
  auto usage = usageOnLoop();
  return registry_->toProto(**node, usage[name]);
}

void Coordinator::drain(const std::string& name, bool drain_it, const std::string& reason,
                        Done<v1::Node> done) {
  // The health check's drains are known by their reason's prefix (agents.cpp nodeHealthOnLoop), so an
  // operator's may not take it: a passing check would end it.
  if (drain_it && reason.rfind(kHealthCheckDrain, 0) == 0) {
    return done(
        Status::invalidArgument("a drain reason may not start with '" + std::string(kHealthCheckDrain) +
                                "': the node's health check drains with it, and ends such drains when "
                                "it passes"));
  }

  post([this, name, drain_it, reason, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::Node>>(drainOnLoop(name, drain_it, reason));
    actor_->reply([done, result] { done(std::move(*result)); }, result->isOk());
  });
}

StatusOr<v1::Node> Coordinator::clearGpuFaultOnLoop(const std::string& name, int gpu) {
  const StoreHealth h = health();
  StatusOr<Node*> node = registry_->clearGpuFaultOnLoop(name, gpu, h.ok ? "" : h.message);
  if (!node) return node.status();
  schedule_wanted_ = true;
  auto usage = usageOnLoop();
  return registry_->toProto(**node, usage[name]);
}

void Coordinator::clearGpuFault(const std::string& name, int gpu, Done<v1::Node> done) {
  post([this, name, gpu, done = std::move(done)] {
    auto result = std::make_shared<StatusOr<v1::Node>>(clearGpuFaultOnLoop(name, gpu));
    actor_->reply([done, result] { done(std::move(*result)); }, result->isOk());
  });
}

StatusOr<v1::Node> Coordinator::removeNodeOnLoop(const std::string& name) {
  if (Status st = registry_->removableOnLoop(name); !st) return st;
  auto usage = usageOnLoop();
  if (!usage[name].jobs.empty()) {
    return Status::failedPrecondition(
        "node " + name + " still has live jobs placed on it: " + usage[name].jobs[0] +
        (usage[name].jobs.size() > 1 ? " and more" : "") + "; cancel them first");
  }
  if (StoreHealth h = health(); !h.ok) return Status::unavailable("remove refused: " + h.message);
  v1::Node out = registry_->toProto(*registry_->find(name), usage[name]);
  if (Status st = registry_->removeOnLoop(name); !st) return st;
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
    return done(Status::failedPrecondition(state::isTerminal(job.state)
                                               ? "job " + job.id + " ended " + toString(job.state) +
                                                     " before it was launched, so it has no logs"
                                               : "job " + job.id + " is " + toString(job.state) +
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
  const Node* n = registry_->find(node);
  const std::string where = "rank " + std::to_string(request.rank()) + "'s log (attempt " +
                            std::to_string(attempt) + ") is on node " + node;
  if (!n || !n->link) {
    return done(Status::unavailable(where +
                                    ", whose agent is not connected; read it there under the agent's "
                                    "data directory: logs/" +
                                    job.id + "/attempt-" + std::to_string(attempt) + "/rank-" +
                                    std::to_string(request.rank()) + ".log"));
  }
  if (StoreHealth h = health(); !h.ok) return done(Status::unavailable("log reads wait until " + h.message));
  v1::ReadLog read;
  read.set_job_id(job.id);
  read.set_attempt(attempt);
  read.set_rank(request.rank());
  read.set_offset(std::max<int64_t>(0, request.offset()));
  read.set_max_bytes(request.max_bytes() <= 0 ? kDefaultChunk : std::min(request.max_bytes(), kMaxChunk));
  StatusOr<v1::Command> cmd = logs_->start(node, where, std::move(read), done);
  if (!cmd) return done(cmd.status());
  registry_->sendOnLoop(node, *cmd);
}

void Coordinator::readLog(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done) {
  post([this, request, done = std::move(done)] { readLogOnLoop(request, done); });
}

Status Coordinator::logDataOnLoop(const std::string& node, const std::string& session,
                                  const v1::LogData& data) {
  Status error;
  Node* entry = registry_->sessionOnLoop(node, session, &error);
  if (!entry) return error;
  registry_->heardFromOnLoop(*entry);
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
  if (options_.store_info) m.state = options_.store_info();
  const int64_t now = now_ms_();
  for (const char* s : {"UP", "DOWN", "DRAINING"}) m.nodes_by_state[s] = 0;
  for (state::JobState s : state::kAllJobStates) m.jobs_by_state[toString(s)] = 0;
  const auto usage = usageOnLoop();
  for (const auto& [name, node] : registry_->all()) {
    m.nodes_by_state[toString(node.record.state)]++;
    if (node.record.state == state::NodeState::kDown) continue;
    m.gpus_total += static_cast<int>(node.record.gpus.size());
    auto u = usage.find(name);
    if (u != usage.end()) m.gpus_allocated += static_cast<int>(u->second.gpus.size());
    for (const auto& [gpu, fault] : node.record.gpu_faults)
      if (!fault.cleared) m.gpus_faulted.emplace_back(name, gpu);
    m.heartbeat_lag_max_s = std::max(m.heartbeat_lag_max_s, (now - node.last_seen_ms) / 1000.0);
  }
  for (const auto& [id, job] : jobs_) m.jobs_by_state[toString(job.state)]++;
  m.store_healthy = health().ok;
  m.store_backlog = actor_->backlog();
  m.jobs_in_memory = jobs_.size();
  m.account_gpu_seconds = usage_book_->liveGpuSeconds();
  m.account_attempts = usage_book_->attemptsEnded();
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
        job.state == JobState::kPending && pending_reason_.count(id) ? ": " + pending_reason_[id].text : "";
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

void Coordinator::shares(Done<v1::GetSharesResponse> done) {
  post([this, done = std::move(done)] {
    v1::GetSharesResponse out;
    out.set_half_life_s(options_.shares.half_life_s);
    for (const placement::ShareRow& row : shares_->sharesOnLoop(wall_ms_())) {
      v1::ShareRow* r = out.add_accounts();
      r->set_account(row.account);
      r->set_parent(row.parent);
      r->set_depth(row.depth);
      r->set_share(row.share);
      r->set_norm_share(row.norm_share);
      r->set_usage_gpu_s(row.usage);
      r->set_norm_usage(row.norm_usage);
      r->set_factor(row.factor);
    }
    done(std::move(out));
  });
}

void Coordinator::usage(const v1::GetUsageRequest& request, Done<v1::GetUsageResponse> done) {
  post([this, request, done = std::move(done)] {
    const int64_t now = wall_ms_();
    const int64_t until = request.until_ms() > 0 ? request.until_ms() : now;
    const int64_t since = request.since_ms() > 0 ? request.since_ms() : until - 7 * 86400000LL;
    if (until <= since) {
      return done(Status::invalidArgument("the period ends (" + utcDayText(utcDayOf(until)) +
                                          ") before it starts (" + utcDayText(utcDayOf(since)) + ")"));
    }
    UsageBook::Query q;
    q.first_day = utcDayOf(since);
    q.last_day = utcDayOf(until - 1);
    q.account = request.account();
    q.user = request.user();
    q.by_account = request.by_account();
    q.daily = request.daily();
    v1::GetUsageResponse out;
    out.set_first_day(utcDayText(q.first_day));
    out.set_last_day(utcDayText(q.last_day));
    out.set_first_day_kept(utcDayText(usage_book_->firstDayKept(now)));
    for (const UsageBook::Row& row : usage_book_->reportOnLoop(q)) {
      v1::UsageRow* r = out.add_rows();
      if (row.day >= 0) r->set_day(utcDayText(row.day));
      r->set_account(row.account);
      r->set_user(row.user);
      r->set_gpu_seconds(row.figures.gpu_s);
      r->set_cpu_seconds(row.figures.cpu_s);
      r->set_attempts(row.figures.attempts);
      r->set_jobs(row.figures.jobs);
      r->set_failed(row.figures.failed);
      r->set_requeued(row.figures.requeued);
      r->set_preempted(row.figures.preempted);
      r->set_max_rss_bytes(row.figures.max_rss_bytes);
    }
    done(std::move(out));
  });
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
    out.set_reason_code(notYetCode(job));
  } else if (job.state == JobState::kPending) {
    auto it = pending_reason_.find(job.id);
    out.set_reason(it != pending_reason_.end() ? it->second.text : "waiting for the next scheduling pass");
    if (it != pending_reason_.end()) out.set_reason_code(it->second.code);
  }
  return out;
}

}  // namespace ddl::coordinator
