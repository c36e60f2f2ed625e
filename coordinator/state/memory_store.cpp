// MemoryStore: see memory_store.h.
#include "state/memory_store.h"

#include <algorithm>

#include <utility>

namespace ddl::state {

MemoryStore::MemoryStore(std::function<int64_t()> now_ms)
    : now_ms_(now_ms ? std::move(now_ms) : std::function<int64_t()>(systemNowMs)) {}

Job* MemoryStore::findLocked(const std::string& id) {
  std::optional<int64_t> n = jobIdNumber(id);
  if (!n) return nullptr;
  auto it = jobs_.find(*n);
  return it == jobs_.end() ? nullptr : &it->second;
}

StatusOr<Job> MemoryStore::createJob(const JobSpec& spec) {
  Status st = validateJobSpec(spec);
  if (!st) return st;
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = next_id_++;
  Job job;
  job.id = formatJobId(n);
  job.spec = spec;
  job.state = JobState::kPending;
  job.submit_ms = now_ms_();
  job.transitions.push_back(
      Transition{JobState::kPending, JobState::kPending, job.submit_ms, "submitted", {}});
  jobs_[n] = job;
  return job;
}

StatusOr<Job> MemoryStore::getJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = findLocked(id);
  if (!job) return jobNotFound(id);
  return *job;
}

StatusOr<std::vector<Job>> MemoryStore::listJobs(const JobFilter& filter) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Job> out;
  for (const auto& [n, job] : jobs_) {
    if (matches(filter, job)) out.push_back(job);
  }
  return out;
}

StatusOr<Job> MemoryStore::transition(const std::string& id, JobState to, const std::string& reason,
                                      const std::optional<Failure>& failure) {
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = findLocked(id);
  if (!job) return jobNotFound(id);
  Status st = applyTransition(*job, to, reason, failure, now_ms_());
  if (!st) return st;
  return *job;
}

Status MemoryStore::setAllocation(const std::string& id, const std::vector<NodeAllocation>& allocation,
                                  const std::string& topology, int root_port) {
  std::lock_guard<std::mutex> lock(mu_);
  Job* job = findLocked(id);
  if (!job) return jobNotFound(id);
  Status st = checkAllocationAllowed(*job);
  if (!st) return st;
  job->allocation = allocation;
  job->topology = topology;
  job->root_port = root_port;
  return Status::ok();
}

Status MemoryStore::upsertNode(const NodeRecord& node) {
  if (node.name.empty()) return Status::invalidArgument("node record has an empty name");
  std::lock_guard<std::mutex> lock(mu_);
  nodes_[node.name] = node;
  return Status::ok();
}

StatusOr<NodeRecord> MemoryStore::getNode(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return nodeNotFound(name);
  return it->second;
}

StatusOr<std::vector<NodeRecord>> MemoryStore::listNodes() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<NodeRecord> out;
  for (const auto& [name, node] : nodes_) out.push_back(node);
  return out;
}

Status MemoryStore::setNodeState(const std::string& name, NodeState state) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return nodeNotFound(name);
  it->second.state = state;
  return Status::ok();
}

Status MemoryStore::applyBatch(const std::vector<Write>& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Write& w : batch) {  // Checked first: all or nothing, as in SqliteStore.
    if (w.kind == Write::Kind::kPutJob) {
      if (!jobIdNumber(w.job.id)) return Status::invalidArgument("cannot store job '" + w.job.id + "': not a job id");
      if (!w.new_job && !jobs_.count(*jobIdNumber(w.job.id))) {
        return Status::internal("cannot update job " + w.job.id + ": it was never stored");
      }
    }
    if (w.kind == Write::Kind::kPutNode && w.node.name.empty()) {
      return Status::invalidArgument("node record has an empty name");
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
