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

#include "state/job.h"
#include "state/status.h"

namespace ddl::state {

struct JobFilter {
  std::set<JobState> states;        // Empty: any state.
  std::optional<std::string> user;  // nullopt: any user.
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
};

// The system clock as unix milliseconds: the default clock of the stores.
inline int64_t systemNowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

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
         (!filter.user || *filter.user == job.spec.user);
}

}  // namespace ddl::state
