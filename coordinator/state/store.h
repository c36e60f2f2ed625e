// Store: the coordinator's durable state — jobs with their lifecycle, and the node registry.
//
// The coordinator keeps its working copy in memory and writes every change through a Store, so that after a
// restart (a crash or kill -9 included) every job and node comes back as it was. Implementations:
//  - SqliteStore (sqlite_store.h): the embedded default, one file in WAL mode;
//  - MemoryStore (memory_store.h): no persistence, for tests of higher layers;
//  - an etcd store for several coordinators is planned behind the same interface.
//
// Contract for every implementation:
//  - Thread-safe: any thread may call any method, concurrently. Each call is atomic: another caller sees
//    all of it or none of it.
//  - A call that returns OK has made its change durable (for SqliteStore: synced to disk) before
//    returning, so a submit may be acknowledged to the user as soon as createJob() returns.
//  - No exceptions cross the interface; errors are Status values whose message names the job or node.
//  - State rules live in job.h (allowedTransition / applyTransition), not in the implementations.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "state/job.h"
#include "common/status.h"

namespace ddl::state {

struct JobFilter {
  std::set<JobState> states;        // Empty: any state.
  std::optional<std::string> user;  // nullopt: any user.
  std::optional<std::string> name;  // nullopt: any name.
  int64_t since_ms = 0;             // 0: no bound; else submitted at or after (unix ms).
  int64_t until_ms = 0;             // 0: no bound; else submitted before (unix ms).
};

// One change in a batch (Store::applyBatch). Records are stored whole; a later write of the same key()
// replaces an earlier one that has not been applied yet, so a batch holds at most one write per job and node.
struct Write {
  enum class Kind { kPutJob, kPutNode, kDeleteNode };
  Kind kind = Kind::kPutJob;
  Job job;               // kPutJob: the job as it is now.
  bool new_job = false;  // kPutJob: the job's first write, so its spec (which never changes) is written too.
  NodeRecord node;       // kPutNode.
  std::string name;      // kDeleteNode: the node's name.

  std::string key() const {
    return kind == Kind::kPutJob ? "j:" + job.id : "n:" + (kind == Kind::kPutNode ? node.name : name);
  }
  // Folds a later write of the same key into this one.
  void supersede(Write later) {
    const bool was_new = kind == Kind::kPutJob && new_job;
    *this = std::move(later);
    if (kind == Kind::kPutJob) new_job = new_job || was_new;
  }
};

class Store {
 public:
  virtual ~Store() = default;

  // Validates spec, assigns a new id (never reused), records the job as PENDING with a submit transition, and
  // returns it once it is durable.
  virtual StatusOr<Job> createJob(const JobSpec& spec) = 0;

  virtual StatusOr<Job> getJob(const std::string& id) = 0;

  // Jobs matching the filter, in submit order (ascending id).
  virtual StatusOr<std::vector<Job>> listJobs(const JobFilter& filter = {}) = 0;

  // Atomically checks that the job's current state may move to `to` (applyTransition in job.h) and applies
  // it. Errors: NOT_FOUND for an unknown id; FAILED_PRECONDITION for an illegal move or an exhausted restart
  // budget (the job is unchanged); INVALID_ARGUMENT for failure info that does not belong to the move.
  // Returns the updated job.
  virtual StatusOr<Job> transition(const std::string& id, JobState to, const std::string& reason,
                                   const std::optional<Failure>& failure = std::nullopt) = 0;

  // Records where the job is placed and the ring layout it will use. Allowed while PENDING or SCHEDULED (set
  // it before moving to SCHEDULED, so a crash in between leaves a PENDING job that is simply placed again);
  // FAILED_PRECONDITION otherwise. Replaces any previous allocation.
  virtual Status setAllocation(const std::string& id, const std::vector<NodeAllocation>& allocation,
                               const std::string& topology, int root_port) = 0;

  // Inserts or replaces the whole record for node.name.
  virtual Status upsertNode(const NodeRecord& node) = 0;
  virtual StatusOr<NodeRecord> getNode(const std::string& name) = 0;
  // All nodes, by name.
  virtual StatusOr<std::vector<NodeRecord>> listNodes() = 0;
  virtual Status setNodeState(const std::string& name, NodeState state) = 0;

  // ---- What the coordinator's event loop uses: it keeps the state itself and stores it in batches. ----

  // Applies every write in one transaction: all of them become durable, or none (the error says why).
  virtual Status applyBatch(const std::vector<Write>& batch) = 0;
  // The highest job number ever stored (0 for none); never goes down, not even when old jobs are purged.
  virtual StatusOr<int64_t> lastJobNumber() = 0;
  // At most `limit` jobs matching the filter whose number is above `after_number`, in ascending order; or,
  // with newest_first, the newest ones below `after_number` (0: from the newest), in descending order.
  virtual StatusOr<std::vector<Job>> listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                                  bool newest_first = false) = 0;
  // Removes at most `limit` jobs that ended (SUCCEEDED, FAILED, CANCELLED) before ended_before_ms; returns
  // how many it removed.
  virtual StatusOr<int> purgeFinished(int64_t ended_before_ms, int limit) = 0;
};

// When a job ended (its last transition), or 0 while it is not final.
inline int64_t endedAtMs(const Job& job) {
  return isTerminal(job.state) && !job.transitions.empty() ? job.transitions.back().at_ms : 0;
}

// The system clock as unix milliseconds: the default clock of the stores.
inline int64_t systemNowMs() { return unixNowMs(); }

// Shared by the implementations so their messages match.
inline Status jobNotFound(const std::string& id) {
  return Status::notFound("job " + id + " not found; list jobs to see the ids that exist");
}
inline Status nodeNotFound(const std::string& name) {
  return Status::notFound("node " + name + " not found; it has never registered");
}
inline Status checkAllocationAllowed(const Job& job) {
  if (job.state == JobState::kPending || job.state == JobState::kScheduled) return Status::ok();
  return Status::failedPrecondition("job " + job.id + ": cannot set an allocation while " +
                                    toString(job.state) + "; only a PENDING or SCHEDULED job is placed");
}
inline bool matches(const JobFilter& filter, const Job& job) {
  return (filter.states.empty() || filter.states.count(job.state) > 0) &&
         (!filter.user || *filter.user == job.spec.user) && (!filter.name || *filter.name == job.spec.name) &&
         (filter.since_ms == 0 || job.submit_ms >= filter.since_ms) &&
         (filter.until_ms == 0 || job.submit_ms < filter.until_ms);
}

}  // namespace ddl::state
