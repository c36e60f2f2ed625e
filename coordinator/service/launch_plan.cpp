// The launch plan of a placed job (launch_plan.h): each node's StartRanks, with every rank's environment,
// as pure functions.
#include "service/launch_plan.h"

#include <algorithm>

#include "common/rank_env.h"

namespace ddl::coordinator {
namespace {

// Adds the rank of `slot` to its node's StartRanks in `commands` (made on first use), with its environment:
// the user's variables, then ddl's own from `spec` (its rank, world and local numbers) and the target's, then
// `last` (a joiner's DDL_JOIN).
void addRank(std::map<std::string, v1::Command>& commands, const state::Job& job,
             const placement::Allocation& allocation, const placement::RankSlot& slot, RankEnvSpec spec,
             const LaunchTarget& target, std::vector<std::pair<std::string, std::string>> last = {}) {
  v1::StartRanks* start = commands[slot.node].mutable_start();
  if (start->job_id().empty()) {
    start->set_job_id(job.id);
    start->set_attempt(target.attempt);
    for (const auto& a : job.spec.command) start->add_command(a);
    start->set_workdir(job.spec.workdir);
    start->set_user(job.spec.user);
    start->set_allow_root(target.allow_root);
  }
  v1::RankLaunch* launch = start->add_ranks();
  launch->set_rank(slot.rank);
  launch->set_gpu(slot.gpu);
  launch->set_local_rank(slot.localRank);
  if (const placement::NodeAllocation* a = allocation.find(slot.node))
    for (int c : a->cpusOf(slot.gpu)) launch->add_cpus(c);
  launch->set_memory_bytes(job.spec.memory_per_rank_bytes);
  auto add = [&](const std::string& k, const std::string& v) {
    v1::EnvVar* e = launch->add_env();
    e->set_name(k);
    e->set_value(v);
  };
  // The user's variables first; ddl's own come after and win, so a stray RANK cannot break the job.
  for (const auto& kv : job.spec.env) {
    size_t eq = kv.find('=');
    add(kv.substr(0, eq), kv.substr(eq + 1));
  }
  spec.root_host = target.root_address;
  spec.root_port = target.port;
  spec.master_port = target.port + 1;  // ports are handed out in pairs (rootPort)
  spec.job_id = job.id;
  spec.attempt = target.attempt;
  spec.secret = target.secret;
  for (const auto& [k, v] : rankEnvironment(spec)) add(k, v);
  for (const auto& [k, v] : arrayEnvironment(job.spec.array_id, job.spec.array_index)) add(k, v);
  for (const auto& [k, v] : last) add(k, v);
}

}  // namespace

std::map<std::string, v1::Command> startCommands(const state::Job& job,
                                                 const placement::Allocation& allocation,
                                                 const placement::RingLayout& layout,
                                                 const LaunchTarget& target) {
  std::map<std::string, v1::Command> commands;
  for (const auto& slot : layout.ranks)
    addRank(commands, job, allocation, slot, placement::rankEnvSpec(layout, slot.rank), target);
  return commands;
}

std::map<std::string, v1::Command> joinCommands(const state::Job& job,
                                                const placement::Allocation& allocation,
                                                const std::vector<placement::RankSlot>& joiners,
                                                int world_size, const LaunchTarget& target) {
  std::map<std::string, v1::Command> commands;
  for (const auto& slot : joiners) {
    RankEnvSpec spec;
    spec.rank = slot.rank;
    spec.world_size = world_size;
    spec.local_rank = slot.localRank;
    spec.local_size = slot.localSize;
    addRank(commands, job, allocation, slot, spec, target, {{"DDL_JOIN", "1"}});
  }
  return commands;
}

std::vector<state::RankResult> placedRanks(const placement::RingLayout& layout, int attempt) {
  std::vector<state::RankResult> results;
  for (const auto& slot : layout.ranks) {
    state::RankResult r;
    r.rank = slot.rank;
    r.attempt = attempt;
    r.node = slot.node;
    r.gpu = slot.gpu;
    results.push_back(std::move(r));
  }
  std::sort(results.begin(), results.end(),
            [](const state::RankResult& a, const state::RankResult& b) { return a.rank < b.rank; });
  return results;
}

int rootPort(const std::string& job, int first, int last, const std::function<bool(int port)>& taken) {
  const int slots = std::max(1, (last - first + 1) / 2);
  const int start = static_cast<int>(state::jobIdNumber(job).value_or(0) % slots);
  for (int i = 0; i < slots; ++i) {
    const int port = first + 2 * ((start + i) % slots);
    if (!taken(port)) return port;
  }
  return first + 2 * start;  // every slot taken: more live jobs than ports; the store reports the clash
}

}  // namespace ddl::coordinator
