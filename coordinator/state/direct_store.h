// DirectStore: a Store used one change at a time, for tests, benches and tools.
//
// The coordinator keeps its state in memory and writes it in batches (Store::applyBatch). Code that has no
// working copy of its own (the store's conformance tests, store_bench, load_bench's history) wants the older,
// simpler calls: create a job, move it, register a node. Each call here reads what it needs from the store,
// applies job.h's rules, and writes the result as a batch of one, so every Store implementation gets these
// calls without writing them.
//
// Threads: any thread may call. Calls on one DirectStore are serialised, so each is an atomic
// read-modify-write (two racing transitions of a job: one wins, the other sees the new state and is refused).
// Two DirectStores, or a DirectStore and a coordinator, on one store are not coordinated with each other.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "state/store.h"

namespace ddl::state {

// Applies `writes` in as few batches as the store's limits allow, in order, each one atomic; stops at the
// first that fails (the earlier ones stay applied). For copies and imports whose parts may land apart (a
// migration into an empty prefix, users.json's users), never for the coordinator's own changes.
Status applyInBatches(Store& store, std::vector<Write> writes);

class DirectStore {
 public:
  // now_ms stamps submits and transitions (unix ms); tests pass a fake. Default: the system clock.
  explicit DirectStore(Store& store, std::function<int64_t()> now_ms = nullptr);

  // Validates spec (validateJobSpec), gives it the next job number (lastJobNumber() + 1, never reused) and
  // stores it PENDING with a submit transition; returns it once it is durable.
  StatusOr<Job> createJob(const JobSpec& spec);
  // Checks that the job may move to `to` (applyTransition) and stores the move. Errors: NOT_FOUND for an
  // unknown id; FAILED_PRECONDITION for an illegal move or an exhausted restart budget; INVALID_ARGUMENT for
  // failure info that does not belong to the move. The job is unchanged on error. Returns the updated job.
  StatusOr<Job> transition(const std::string& id, JobState to, const std::string& reason,
                           const std::optional<Failure>& failure = std::nullopt);
  // Records where the job is placed and its ring layout, replacing any previous allocation. Only while
  // PENDING or SCHEDULED (checkAllocationAllowed); FAILED_PRECONDITION otherwise.
  Status setAllocation(const std::string& id, const std::vector<NodeAllocation>& allocation,
                       const std::string& topology, int root_port);
  // Every job matching the filter, in submit order.
  StatusOr<std::vector<Job>> listJobs(const JobFilter& filter = {});

  // Inserts or replaces the whole record for node.name (INVALID_ARGUMENT for an empty name).
  Status upsertNode(const NodeRecord& node);
  StatusOr<NodeRecord> getNode(const std::string& name);
  Status setNodeState(const std::string& name, NodeState state);

  // The store's own calls, passed through.
  StatusOr<Job> getJob(const std::string& id) { return store_.getJob(id); }
  StatusOr<std::vector<NodeRecord>> listNodes() { return store_.listNodes(); }
  Status applyBatch(const std::vector<Write>& batch) { return store_.applyBatch(batch); }
  StatusOr<int64_t> lastJobNumber() { return store_.lastJobNumber(); }
  StatusOr<std::vector<Job>> listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                          bool newest_first = false) {
    return store_.listJobsPage(filter, after_number, limit, newest_first);
  }
  StatusOr<int> purgeFinished(int64_t ended_before_ms, int limit) {
    return store_.purgeFinished(ended_before_ms, limit);
  }

  Store& store() { return store_; }

 private:
  Status putJob(const Job& job, bool new_job);
  Status putNode(const NodeRecord& node);

  Store& store_;
  std::function<int64_t()> now_ms_;
  std::mutex mu_;
};

}  // namespace ddl::state
