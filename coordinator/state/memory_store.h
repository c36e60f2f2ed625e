// MemoryStore: the Store interface over plain maps, for tests of the layers above the store (scheduler,
// service, dashboard). Nothing survives the object. It refuses what SqliteStore refuses, with the same
// messages (the conformance tests in state_store_test run against both). Thread-safe: one mutex around
// everything; any thread may call.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "state/store.h"

namespace ddl::state {

class MemoryStore : public Store {
 public:
  Status applyBatch(const std::vector<Write>& batch) override;
  StatusOr<Job> getJob(const std::string& id) override;
  StatusOr<std::vector<NodeRecord>> listNodes() override;
  StatusOr<std::vector<Entry>> listEntries(const std::string& table) override;
  StatusOr<int64_t> lastJobNumber() override;
  StatusOr<std::vector<Job>> listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                          bool newest_first = false) override;
  StatusOr<int> purgeFinished(int64_t ended_before_ms, int limit) override;

 private:
  std::mutex mu_;
  int64_t next_id_ = 1;
  std::map<int64_t, Job> jobs_;  // By id number, so iteration is submit order.
  std::map<std::string, NodeRecord> nodes_;
  std::map<std::pair<std::string, std::string>, std::string> entries_;  // (table, key) -> value
};

}  // namespace ddl::state
