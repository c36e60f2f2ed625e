// The Store in memory (memory_store.h), for tests of the layers above it.
#include "state/memory_store.h"

#include <algorithm>
#include <optional>

namespace ddl::state {

StatusOr<Job> MemoryStore::getJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<int64_t> n = jobIdNumber(id);
  auto it = n ? jobs_.find(*n) : jobs_.end();
  if (it == jobs_.end()) return jobNotFound(id);
  return it->second;
}

StatusOr<std::vector<NodeRecord>> MemoryStore::listNodes() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeRecord> out;
  for (const auto& [name, node] : nodes_) out.push_back(node);
  return out;
}

StatusOr<std::vector<Entry>> MemoryStore::listEntries(const std::string& table) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Entry> out;
  for (auto it = entries_.lower_bound({table, ""}); it != entries_.end(); ++it) {
    if (!table.empty() && it->first.first != table) break;
    out.push_back(Entry{it->first.first, it->first.second, it->second});
  }
  return out;
}

Status MemoryStore::applyBatch(const std::vector<Write>& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Write& w : batch) {  // Checked first: all or nothing, as in SqliteStore.
    if (w.kind == Write::Kind::kPutJob) {
      if (!jobIdNumber(w.job.id)) return Status::invalidArgument("cannot store job '" + w.job.id + "': not a job id");
      if (w.new_job) {
        if (Status st = validateJobSpec(w.job.spec); !st) return st;
      } else if (!jobs_.count(*jobIdNumber(w.job.id))) {
        return Status::internal("cannot update job " + w.job.id + ": it was never stored");
      }
    }
    if (w.kind == Write::Kind::kPutNode && w.node.name.empty()) {
      return Status::invalidArgument("node record has an empty name");
    }
    if (w.kind == Write::Kind::kPutEntry || w.kind == Write::Kind::kDeleteEntry) {
      if (Status st = entryRefused(w.entry, w.kind == Write::Kind::kPutEntry); !st) return st;
    }
  }
  for (const Write& w : batch) {
    switch (w.kind) {
      case Write::Kind::kPutJob: {
        const int64_t n = *jobIdNumber(w.job.id);
        jobs_[n] = w.job;
        next_id_ = std::max(next_id_, n + 1);
        break;
      }
      case Write::Kind::kPutNode:
        nodes_[w.node.name] = w.node;
        break;
      case Write::Kind::kDeleteNode:
        nodes_.erase(w.name);
        break;
      case Write::Kind::kPutEntry:
        entries_[{w.entry.table, w.entry.key}] = w.entry.value;
        break;
      case Write::Kind::kDeleteEntry:
        entries_.erase({w.entry.table, w.entry.key});
        break;
    }
  }
  return Status::ok();
}

StatusOr<int64_t> MemoryStore::lastJobNumber() {
  std::lock_guard<std::mutex> lock(mu_);
  return next_id_ - 1;
}

StatusOr<std::vector<Job>> MemoryStore::listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                                     bool newest_first) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Job> out;
  if (newest_first) {
    auto it = after_number > 0 ? jobs_.lower_bound(after_number) : jobs_.end();
    while (it != jobs_.begin() && static_cast<int>(out.size()) < limit) {
      --it;
      if (matches(filter, it->second)) out.push_back(it->second);
    }
    std::reverse(out.begin(), out.end());
  } else {
    for (auto it = jobs_.upper_bound(after_number); it != jobs_.end() && static_cast<int>(out.size()) < limit; ++it) {
      if (matches(filter, it->second)) out.push_back(it->second);
    }
  }
  return out;
}

StatusOr<int> MemoryStore::purgeFinished(int64_t ended_before_ms, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  int removed = 0;
  for (auto it = jobs_.begin(); it != jobs_.end() && removed < limit;) {
    const int64_t ended = endedAtMs(it->second);
    if (ended > 0 && ended < ended_before_ms) {
      it = jobs_.erase(it);
      ++removed;
    } else {
      ++it;
    }
  }
  return removed;
}

}  // namespace ddl::state
