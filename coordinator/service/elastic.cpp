// Elastic jobs (ddlctl submit --nodes MIN:MAX, --gpus MIN:MAX; state/job.h isElastic): a lost rank or node
// shrinks the job instead of failing or requeueing it while enough ranks are left, and free capacity grows it
// back with ranks that join the running ones. See coordinator.h for the whole object.
//
// The coordinator numbers a job's ranks by launch slot: the first launch's ranks 0..n-1, then each joiner the
// next number. A slot that is lost joins JobRuntime::gone and never counts again (its reports are recorded
// but change nothing); the program's own rank in its communicator is libddl's (survivors keep their order,
// joiners come after them). Rank 0 serves the job's rendezvous store (DDL_ROOT, MASTER_PORT), so losing it
// cannot be survived: the job fails or requeues as any other.
//
// A job placed by whole nodes (--nodes) stays whole nodes: losing one rank gives up its node's other ranks
// too (stopped with a StopJob naming them), and a grow adds whole nodes the job does not have yet. A job of
// --gpus loses and gains single ranks, anywhere.
//
// Every change is a RUNNING -> RUNNING transition (state::applyMembershipChange), with the lost rank's
// failure where one failed; the allocation follows the ranks, so placement, fair share and the attempt's
// GPU-seconds count only the GPUs held. At most kMaxMembershipChanges per attempt: past that a loss fails the
// job as usual, so a rank that fails at once forever cannot grow the job's history without end.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>

#include "placement/placement.h"
#include "service/convert.h"
#include "service/coordinator.h"
#include "service/coordinator_internal.h"
#include "service/launch_plan.h"

namespace ddl::coordinator {
namespace {

constexpr int kMaxMembershipChanges = 128;  // per attempt
// Grows stop at half the changes (each may be undone by a shrink) and at this many launch slots beyond MAX:
// the job's record keeps every slot's result.
constexpr int kMaxGrowChanges = kMaxMembershipChanges / 2;
constexpr int kMaxExtraSlots = 64;
constexpr int64_t kGrowRetryMs = 1000;          // between a short job's tries to grow
constexpr int64_t kMaxGrowBackoffMs = 300'000;  // after joiners lost again and again

int membershipChanges(const state::Job& job) {
  int n = 0;
  for (const state::Transition& t : job.transitions) {
    if (t.to == JobState::kScheduled) n = 0;  // the attempt's placement
    if (t.from == JobState::kRunning && t.to == JobState::kRunning) ++n;
  }
  return n;
}

// A node's share as GPU -> the CPUs its rank is confined to (placement's cpusOfGpu), in ascending GPU order,
// and back: the two edits below keep each GPU's CPUs with it.
std::map<int, std::vector<int>> cpusByGpu(const std::vector<int>& gpus, const std::vector<int>& cpus) {
  std::map<int, std::vector<int>> by_gpu;
  for (int g : gpus) by_gpu[g] = placement::cpusOfGpu(gpus, cpus, g);
  return by_gpu;
}
void setGpus(state::NodeAllocation& share, const std::map<int, std::vector<int>>& by_gpu) {
  share.gpus.clear();
  share.cpus.clear();
  for (const auto& [g, c] : by_gpu) {
    share.gpus.push_back(g);
    share.cpus.insert(share.cpus.end(), c.begin(), c.end());
  }
}

// `allocation` without one GPU of `node` (a lost rank's), its CPUs and memory with it.
void dropGpu(std::vector<state::NodeAllocation>& allocation, const std::string& node, int gpu,
             int64_t memory_per_rank) {
  auto it = std::find_if(allocation.begin(), allocation.end(), [&](const auto& a) { return a.node == node; });
  if (it == allocation.end()) return;
  std::map<int, std::vector<int>> by_gpu = cpusByGpu(it->gpus, it->cpus);
  if (by_gpu.erase(gpu) == 0) return;
  setGpus(*it, by_gpu);
  it->memory_bytes = std::max<int64_t>(0, it->memory_bytes - memory_per_rank);
  if (it->gpus.empty()) allocation.erase(it);
}

// `allocation` with a grow's share of one node.
void addGpus(std::vector<state::NodeAllocation>& allocation, const placement::NodeAllocation& more) {
  auto it =
      std::find_if(allocation.begin(), allocation.end(), [&](const auto& a) { return a.node == more.node; });
  if (it == allocation.end()) {
    allocation.push_back(state::NodeAllocation{more.node, more.gpus, more.cpus, more.memoryBytes});
    return;
  }
  std::map<int, std::vector<int>> by_gpu = cpusByGpu(it->gpus, it->cpus);
  by_gpu.merge(cpusByGpu(more.gpus, more.cpus));
  setGpus(*it, by_gpu);
  it->memory_bytes += more.memoryBytes;
}

}  // namespace

std::vector<int> Coordinator::JobRuntime::members() const {
  std::vector<int> out;
  for (const auto& [slot, node] : rank_node)
    if (!gone.count(slot)) out.push_back(slot);
  return out;
}

void Coordinator::loseRanksOnLoop(const std::string& id, const std::set<int>& lost, const std::string& why,
                                  const std::optional<state::Failure>& failure) {
  std::optional<std::string> elastic = shrinkOnLoop(id, lost, why, failure);
  if (elastic) failJobOnLoop(id, why + *elastic, failure);
}

std::optional<std::string> Coordinator::shrinkOnLoop(const std::string& id, std::set<int> lost,
                                                     const std::string& why,
                                                     const std::optional<state::Failure>& failure) {
  auto jt = jobs_.find(id);
  auto rt = runtime_.find(id);
  if (jt == jobs_.end() || !state::isElastic(jt->second.spec)) return "";
  state::Job& job = jt->second;
  if (rt != runtime_.end() && !lost.empty()) {
    std::erase_if(lost, [&](int slot) { return rt->second.gone.count(slot) > 0; });
    if (lost.empty()) return std::nullopt;  // all gone already (a stopped rank's end): nothing changes
  }
  if (job.state != JobState::kRunning || rt == runtime_.end() || !job.preempted_by.empty())
    return std::string(" (elastic, but ") + toString(job.state) +
           (job.preempted_by.empty() ? "" : " and being preempted") + ": not shrunk)";
  JobRuntime& r = rt->second;
  if (lost.empty())
    return std::string(
        " (elastic, but which of its ranks were lost is not known, so it cannot go on without them)");
  // Placed by whole nodes: the lost ranks' nodes leave the job whole.
  if (job.spec.min_nodes > 0) {
    std::set<std::string> nodes;
    for (int slot : lost) nodes.insert(r.rank_node.at(slot));
    for (int slot : r.members())
      if (nodes.count(r.rank_node.at(slot))) lost.insert(slot);
  }
  if (lost.count(0))
    return std::string(" (elastic, but rank 0") + (job.spec.min_nodes > 0 ? ", on the same node," : "") +
           " serves the job's rendezvous store: its loss ends the attempt)";
  const int left = static_cast<int>(r.members().size() - lost.size());
  const int least = state::minRanks(job.spec);
  if (left < least)
    return " (elastic: " + std::to_string(left) + " rank" + (left == 1 ? "" : "s") +
           " left, below its minimum of " + std::to_string(least) + ")";
  if (membershipChanges(job) >= kMaxMembershipChanges)
    return " (elastic, but this attempt already changed its ranks " + std::to_string(kMaxMembershipChanges) +
           " times)";

  std::vector<state::NodeAllocation> allocation = job.allocation;
  std::map<std::string, std::vector<int>> stop;  // node -> lost ranks that may still run there
  for (int slot : lost) {
    const std::string& node = r.rank_node.at(slot);
    auto result = std::find_if(job.ranks.begin(), job.ranks.end(),
                               [&](const state::RankResult& x) { return x.rank == slot; });
    if (result != job.ranks.end()) dropGpu(allocation, node, result->gpu, job.spec.memory_per_rank_bytes);
    auto reported = r.ranks.find(slot);
    if (reported == r.ranks.end() || reported->second.state() != v1::RankStatus::EXITED)
      stop[node].push_back(slot);
  }
  const std::string reason = why + "; going on without " + rankList({lost.begin(), lost.end()}) + ": " +
                             std::to_string(left) + " of " + std::to_string(state::maxRanks(job.spec)) +
                             " ranks (elastic, at least " + std::to_string(least) + ")";
  Status st = state::applyMembershipChange(job, std::move(allocation), reason, failure, wall_ms_());
  if (!st) {
    spdlog::error("job {}: {}", id, st.toString());
    return " (elastic, but the change could not be applied: " + st.message() + ")";
  }
  putJobOnLoop(job);
  spdlog::info("job {}: {}", id, reason);
  r.gone.insert(lost.begin(), lost.end());
  // A joiner lost (it could not start, or gave up waiting to be admitted: a program that never calls grow)
  // makes the next grow wait longer, doubling from a second up to five minutes; another loss, not at all.
  const bool joiners = std::all_of(lost.begin(), lost.end(), [&](int slot) { return r.joiners.count(slot); });
  r.grow_backoff_ms =
      joiners ? std::min<int64_t>(kMaxGrowBackoffMs, std::max<int64_t>(kGrowRetryMs, 2 * r.grow_backoff_ms))
              : 0;
  r.next_grow_ms = now_ms_() + r.grow_backoff_ms;
  for (const auto& [node, ranks] : stop) {
    v1::Command cmd = stopCommand(id, r.attempt, "the job went on without them: " + why);
    for (int slot : ranks) cmd.mutable_stop()->add_ranks(slot);
    registry_->sendOnLoop(node, cmd);
  }
  schedule_wanted_ = true;  // their GPUs are free
  maybeCompleteOnLoop(id);  // the others may all have ended already
  return std::nullopt;
}

void Coordinator::growElasticOnLoop() {
  const int64_t now = now_ms_();
  // The elastic jobs short of ranks whose time to try has come: running, all their ranks running (a job whose
  // ranks have begun to end is finishing, not short), within the caps. Usually none, and the rest is skipped.
  std::vector<std::string> due;
  for (const auto& kv : runtime_) {  // (no structured binding: clang 14 refuses one captured by a lambda)
    const std::string& id = kv.first;
    const JobRuntime& r = kv.second;
    auto jt = jobs_.find(id);
    if (jt == jobs_.end() || r.secret.empty() || now < r.next_grow_ms)
      continue;  // secret: elastic jobs' only
    const state::Job& job = jt->second;
    const int members = static_cast<int>(r.rank_node.size() - r.gone.size());
    const int first_slot = r.rank_node.empty() ? 0 : r.rank_node.rbegin()->first + 1;
    const int want = state::maxRanks(job.spec) - members;
    const bool ending = std::any_of(r.ranks.begin(), r.ranks.end(), [&](const auto& report) {
      return !r.gone.count(report.first) && report.second.state() == v1::RankStatus::EXITED;
    });
    if (job.state != JobState::kRunning || !job.preempted_by.empty() || want <= 0 || ending ||
        membershipChanges(job) >= kMaxGrowChanges ||
        first_slot + want > state::maxRanks(job.spec) + kMaxExtraSlots)
      continue;
    due.push_back(id);
  }
  if (due.empty() || registry_->recoveringOnLoop(now) || !favored_.empty()) return;
  // The queue first: no job grows while another waits for GPUs (or for a preemption to free them).
  for (const auto& [id, why] : pending_reason_) {
    if (why.code != "Resources" && why.code != "Priority" && why.code != "Preempting") continue;
    auto job = jobs_.find(id);
    if (job != jobs_.end() && job->second.state == JobState::kPending) return;
  }
  placement::LimitTracker limits(shares_->tree());
  const std::vector<ShareKeeper::Holder> holders = holdersOnLoop();
  for (const ShareKeeper::Holder& h : holders) limits.hold(h.account, h.user, h.gpus, h.qos);
  spentOnLoop(limits, holders);
  for (const std::string& id : due) {
    JobRuntime& r = runtime_.at(id);
    state::Job& job = jobs_.at(id);
    const int members = static_cast<int>(r.rank_node.size() - r.gone.size());
    const int want = state::maxRanks(job.spec) - members;
    r.next_grow_ms = now + std::max(kGrowRetryMs, r.grow_backoff_ms);
    placement::Cluster cluster = snapshotOnLoop(true);
    placement::JobRequest request = requestOf(id, job.spec);
    if (job.spec.min_nodes > 0) {
      request.nodes = want / std::max(1, job.spec.gpus_per_node);
      if (request.nodes <= 0) continue;
      // New nodes only: the job's own stay out of this placement.
      std::erase_if(cluster.nodes, [&](const placement::Node& n) {
        return std::any_of(job.allocation.begin(), job.allocation.end(),
                           [&](const state::NodeAllocation& a) { return a.node == n.name; });
      });
    } else {
      request.totalGpus = want;
    }
    std::string code;
    if (!limits.blocks(request, &code).empty()) continue;  // its account's, user's or QoS' limits
    placement::PlacementResult placed = placement::place(cluster, request);
    if (!placed.ok()) continue;
    // The joiners: the next launch slots, on the GPUs placed, numbered among the job's ranks on each node.
    std::vector<state::NodeAllocation> allocation = job.allocation;
    for (const auto& a : placed.allocation().nodes) addGpus(allocation, a);
    std::vector<placement::RankSlot> joiners;
    std::vector<int> slots;
    int slot = r.rank_node.rbegin()->first + 1;
    std::string where;
    for (const auto& a : placed.allocation().nodes) {
      // Local ranks after every one this attempt gave out on the node, so that none is given twice.
      const int before = static_cast<int>(std::count_if(r.rank_node.begin(), r.rank_node.end(),
                                                        [&](const auto& kv) { return kv.second == a.node; }));
      for (size_t i = 0; i < a.gpus.size(); ++i) {
        placement::RankSlot s;
        s.rank = slot++;
        s.node = a.node;
        s.gpu = a.gpus[i];
        s.localRank = before + static_cast<int>(i);
        s.localSize = before + static_cast<int>(a.gpus.size());
        joiners.push_back(s);
        slots.push_back(s.rank);
      }
      where += (where.empty() ? "" : " ") + a.node;
    }
    const int size = members + static_cast<int>(joiners.size());
    const std::string reason = "grown: " + rankList(slots) + " started on " + where +
                               " to join: " + std::to_string(size) + " of " +
                               std::to_string(state::maxRanks(job.spec)) + " ranks";
    Status st = state::applyMembershipChange(job, allocation, reason, std::nullopt, wall_ms_());
    if (!st) {
      spdlog::error("job {}: {}", id, st.toString());
      continue;
    }
    for (const auto& s : joiners) {
      r.rank_node[s.rank] = s.node;
      r.joiners.insert(s.rank);
      state::RankResult kept;
      kept.rank = s.rank;
      kept.attempt = r.attempt;
      kept.node = s.node;
      kept.gpu = s.gpu;
      job.ranks.push_back(std::move(kept));  // slots only grow: the list stays in rank order
    }
    putJobOnLoop(job);
    spdlog::info("job {}: {}", id, reason);
    const NodeRegistry::Node* root = registry_->find(r.root_node);
    const LaunchTarget target{r.attempt, root ? root->record.address : "", r.port, r.secret,
                              options_.allow_root_jobs};
    for (const auto& [node, cmd] : joinCommands(job, toPlacement(allocation), joiners, size, target))
      registry_->sendOnLoop(node, cmd);
  }
}

}  // namespace ddl::coordinator
