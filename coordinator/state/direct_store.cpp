// A Store used one change at a time (direct_store.h): create a job, move it, register a node, each a batch
// of one, for tests, benches and tools.
#include "state/direct_store.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace ddl::state {

Status applyInBatches(Store& store, std::vector<Write> writes) {
  const Store::BatchLimits limits = store.batchLimits();
  std::vector<Write> part;
  size_t bytes = 0;
  for (size_t i = 0; i <= writes.size(); ++i) {
    const size_t b = i < writes.size() ? store.writeBytes(writes[i]) : 0;
    if (!part.empty() &&
        (i == writes.size() || part.size() + 1 > limits.max_writes || bytes + b > limits.max_bytes)) {
      if (Status st = store.applyBatch(part); !st) return st;
      part.clear();
      bytes = 0;
    }
    if (i < writes.size()) {
      part.push_back(std::move(writes[i]));
      bytes += b;
    }
  }
  return Status::ok();
}

DirectStore::DirectStore(Store& store, std::function<int64_t()> now_ms)
    : store_(store), now_ms_(now_ms ? std::move(now_ms) : std::function<int64_t()>(systemNowMs)) {}

Status DirectStore::putJob(const Job& job, bool new_job) {
  Write w;
  w.kind = Write::Kind::kPutJob;
  w.job = job;
  w.new_job = new_job;
  return store_.applyBatch({std::move(w)});
}

Status DirectStore::putNode(const NodeRecord& node) {
  if (node.name.empty()) return Status::invalidArgument("node record has an empty name");
  Write w;
  w.kind = Write::Kind::kPutNode;
  w.node = node;
  return store_.applyBatch({std::move(w)});
}

StatusOr<Job> DirectStore::createJob(const JobSpec& spec) {
  if (Status st = validateJobSpec(spec); !st) return st;
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<int64_t> last = store_.lastJobNumber();
  if (!last) return last.status();
  Job job = newJob(formatJobId(*last + 1), spec, now_ms_());
  if (Status st = putJob(job, /*new_job=*/true); !st) return st;
  return job;
}

StatusOr<Job> DirectStore::transition(const std::string& id, JobState to, const std::string& reason,
                                      const std::optional<Failure>& failure) {
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<Job> job = store_.getJob(id);
  if (!job) return job.status();
  if (Status st = applyTransition(*job, to, reason, failure, now_ms_()); !st) return st;
  if (Status st = putJob(*job, /*new_job=*/false); !st) return st;
  return job;
}

Status DirectStore::setAllocation(const std::string& id, const std::vector<NodeAllocation>& allocation,
                                  const std::string& topology, int root_port) {
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<Job> job = store_.getJob(id);
  if (!job) return job.status();
  if (Status st = checkAllocationAllowed(*job); !st) return st;
  job->allocation = allocation;
  job->topology = topology;
  job->root_port = root_port;
  return putJob(*job, /*new_job=*/false);
}

StatusOr<std::vector<Job>> DirectStore::listJobs(const JobFilter& filter) {
  return store_.listJobsPage(filter, 0, std::numeric_limits<int>::max());
}

Status DirectStore::upsertNode(const NodeRecord& node) {
  std::lock_guard<std::mutex> lock(mu_);
  return putNode(node);
}

StatusOr<NodeRecord> DirectStore::getNode(const std::string& name) {
  StatusOr<std::vector<NodeRecord>> nodes = store_.listNodes();
  if (!nodes) return nodes.status();
  auto it = std::find_if(nodes->begin(), nodes->end(), [&](const NodeRecord& n) { return n.name == name; });
  if (it == nodes->end()) return nodeNotFound(name);
  return std::move(*it);
}

Status DirectStore::setNodeState(const std::string& name, NodeState state) {
  std::lock_guard<std::mutex> lock(mu_);
  StatusOr<NodeRecord> node = getNode(name);
  if (!node) return node.status();
  node->state = state;
  return putNode(*node);
}

}  // namespace ddl::state
