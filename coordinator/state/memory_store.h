// MemoryStore: the Store interface over plain maps, for tests of the layers above the store (scheduler,
// service, dashboard). Nothing survives the object. It follows the same rules and messages as SqliteStore
// because both use applyTransition() from job.h. Thread-safe: one mutex around everything; any thread may
// call.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "state/store.h"

namespace ddl::state {

class MemoryStore : public Store {
 public:
  // now_ms stamps submits and transitions (unix ms); tests pass a fake. Default: the system clock.
  explicit MemoryStore(std::function<int64_t()> now_ms = nullptr);

  StatusOr<Job> createJob(const JobSpec& spec) override;
  StatusOr<Job> getJob(const std::string& id) override;
  StatusOr<std::vector<Job>> listJobs(const JobFilter& filter = {}) override;
  StatusOr<Job> transition(const std::string& id, JobState to, const std::string& reason,
                           const std::optional<Failure>& failure = std::nullopt) override;
  Status setAllocation(const std::string& id, const std::vector<NodeAllocation>& allocation,
                       const std::string& topology, int root_port) override;
  Status upsertNode(const NodeRecord& node) override;
  StatusOr<NodeRecord> getNode(const std::string& name) override;
  StatusOr<std::vector<NodeRecord>> listNodes() override;
  Status setNodeState(const std::string& name, NodeState state) override;
  Status applyBatch(const std::vector<Write>& batch) override;
  StatusOr<int64_t> lastJobNumber() override;
  StatusOr<std::vector<Job>> listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                          bool newest_first = false) override;
  StatusOr<int> purgeFinished(int64_t ended_before_ms, int limit) override;

 private:
  Job* findLocked(const std::string& id);

  std::function<int64_t()> now_ms_;
  std::mutex mu_;
  int64_t next_id_ = 1;
  std::map<int64_t, Job> jobs_;  // By id number, so iteration is submit order.
  std::map<std::string, NodeRecord> nodes_;
};

}  // namespace ddl::state
