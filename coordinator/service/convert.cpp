// Conversions between the coordinator's records (state/, placement/) and the ddl.v1 messages (convert.h).
#include "service/convert.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace ddl::coordinator {

// The two enums list the states in the same order; the proto's starts at 1 (0 is "unspecified").
v1::JobState toProto(state::JobState s) { return static_cast<v1::JobState>(static_cast<int>(s) + 1); }

std::optional<state::JobState> fromProto(v1::JobState s) {
  int v = static_cast<int>(s);
  if (v < v1::PENDING || v > v1::TIMEOUT) return std::nullopt;
  return static_cast<state::JobState>(v - 1);
}

state::JobSpec fromProto(const v1::JobSpec& spec) {
  state::JobSpec s;
  s.name = spec.name();
  s.user = spec.user();
  s.nodes = spec.nodes();
  s.gpus_per_node = spec.gpus_per_node();
  s.total_gpus = spec.total_gpus();
  s.topology_override = spec.topology();
  s.priority = spec.priority();
  s.max_restarts = spec.max_restarts();
  s.env.assign(spec.env().begin(), spec.env().end());
  s.workdir = spec.workdir();
  s.command.assign(spec.command().begin(), spec.command().end());
  s.required_labels.insert(spec.required_labels().begin(), spec.required_labels().end());
  s.time_limit_s = spec.time_limit_s();
  s.warn_signal = spec.warn_signal();
  s.warn_before_s = spec.warn_before_s();
  s.qos = spec.qos();
  s.after_ok.assign(spec.after_ok().begin(), spec.after_ok().end());
  s.after_any.assign(spec.after_any().begin(), spec.after_any().end());
  s.hold = spec.hold();
  s.array_id = spec.array_id();
  s.array_index = spec.array_index();
  s.array_max_running = spec.array_max_running();
  s.cpus_per_rank = spec.cpus_per_rank();
  s.memory_per_rank_bytes = spec.memory_per_rank_bytes();
  s.request_id = spec.request_id();
  s.account = spec.account();
  s.min_nodes = spec.min_nodes();
  s.min_gpus = spec.min_gpus();
  return s;
}

void toProto(const state::JobSpec& spec, v1::JobSpec* out) {
  out->set_name(spec.name);
  out->set_user(spec.user);
  out->set_nodes(spec.nodes);
  out->set_gpus_per_node(spec.gpus_per_node);
  out->set_total_gpus(spec.total_gpus);
  out->set_topology(spec.topology_override);
  out->set_priority(spec.priority);
  out->set_max_restarts(spec.max_restarts);
  for (const auto& e : spec.env) out->add_env(e);
  out->set_workdir(spec.workdir);
  for (const auto& a : spec.command) out->add_command(a);
  for (const auto& [k, v] : spec.required_labels) (*out->mutable_required_labels())[k] = v;
  out->set_time_limit_s(static_cast<int32_t>(spec.time_limit_s));
  out->set_warn_signal(spec.warn_signal);
  out->set_warn_before_s(static_cast<int32_t>(spec.warn_before_s));
  out->set_qos(spec.qos);
  for (const auto& d : spec.after_ok) out->add_after_ok(d);
  for (const auto& d : spec.after_any) out->add_after_any(d);
  out->set_hold(spec.hold);
  out->set_array_id(spec.array_id);
  out->set_array_index(spec.array_index);
  out->set_array_max_running(spec.array_max_running);
  out->set_cpus_per_rank(spec.cpus_per_rank);
  out->set_memory_per_rank_bytes(spec.memory_per_rank_bytes);
  out->set_request_id(spec.request_id);
  out->set_account(spec.account);
  out->set_min_nodes(spec.min_nodes);
  out->set_min_gpus(spec.min_gpus);
}

void toProto(const state::RankResult& r, v1::RankStatus* out) {
  out->set_rank(r.rank);
  out->set_attempt(r.attempt);
  out->set_node(r.node);
  out->set_gpu(r.gpu);
  out->set_pid(r.pid);
  out->set_program_pid(r.program_pid);
  out->set_state(r.exited ? v1::RankStatus::EXITED : v1::RankStatus::RUNNING);
  if (r.exit_code) out->set_exit_code(*r.exit_code);
  if (r.signal) out->set_signal(*r.signal);
  out->set_started_ms(r.started_ms);
  out->set_exited_ms(r.exited_ms);
  out->set_error(r.error);
  out->set_cpu_seconds(r.cpu_s);
  out->set_max_rss_bytes(r.max_rss_bytes);
  if (r.figures.updated_ms > 0 || r.figures.collectives > 0) {
    v1::RankProgress* p = out->mutable_progress();
    p->set_collectives(r.figures.collectives);
    p->set_bytes(r.figures.bytes);
    p->set_seconds(r.figures.seconds);
    p->set_last_op(r.figures.last_op);
    p->set_last_bytes(r.figures.last_bytes);
    p->set_last_us(r.figures.last_us);
    p->set_last_algo(r.figures.last_algo);
    for (double d : r.figures.dims_us) p->add_dims_us(d);
    p->set_world_size(r.figures.world_size);
    p->set_updated_ms(r.figures.updated_ms);
  }
}

state::RankResult rankResultOf(const v1::RankStatus& r, const std::string& node) {
  state::RankResult out;
  out.rank = r.rank();
  out.attempt = r.attempt();
  out.node = node;
  out.gpu = r.gpu();
  out.pid = r.pid();
  out.program_pid = r.program_pid();
  out.exited = r.state() == v1::RankStatus::EXITED;
  if (r.has_exit_code()) out.exit_code = r.exit_code();
  if (r.has_signal()) out.signal = r.signal();
  out.started_ms = r.started_ms();
  out.exited_ms = r.exited_ms();
  out.error = r.error();
  if (std::isfinite(r.cpu_seconds()) && r.cpu_seconds() > 0) out.cpu_s = r.cpu_seconds();
  out.max_rss_bytes = std::max<int64_t>(0, r.max_rss_bytes());
  if (r.has_progress()) {
    out.figures.collectives = r.progress().collectives();
    out.figures.bytes = r.progress().bytes();
    const auto finite = [](double v) { return std::isfinite(v) ? v : 0.0; };  // stored as JSON
    out.figures.seconds = finite(r.progress().seconds());
    out.figures.last_op = r.progress().last_op().substr(0, 64);
    out.figures.last_bytes = r.progress().last_bytes();
    out.figures.last_us = finite(r.progress().last_us());
    out.figures.last_algo = r.progress().last_algo().substr(0, 64);
    for (double d : r.progress().dims_us()) {
      if (out.figures.dims_us.size() >= state::kMaxRankDims) break;
      out.figures.dims_us.push_back(finite(d));
    }
    out.figures.world_size = r.progress().world_size();
    out.figures.updated_ms = r.progress().updated_ms();
  }
  return out;
}

void toProto(const state::Failure& failure, v1::Failure* out) {
  out->set_rank(failure.rank);
  out->set_host(failure.host);
  if (failure.exit_code) out->set_exit_code(*failure.exit_code);
  if (failure.signal) out->set_signal(*failure.signal);
}

std::vector<state::NodeAllocation> toState(const placement::Allocation& allocation) {
  std::vector<state::NodeAllocation> out;
  for (const auto& n : allocation.nodes) out.push_back({n.node, n.gpus, n.cpus, n.memoryBytes});
  return out;
}

placement::Allocation toPlacement(const std::vector<state::NodeAllocation>& allocation) {
  placement::Allocation out;
  for (const auto& n : allocation) out.nodes.push_back({n.node, n.gpus, n.cpus, n.memory_bytes});
  return out;
}

placement::JobRequest requestOf(const std::string& id, const state::JobSpec& spec) {
  placement::JobRequest r;
  r.id = id;
  r.priority = spec.priority;
  r.user = spec.user;
  r.account = spec.account;
  r.qos = spec.qos;
  r.submitSeq = id.empty() ? 0 : static_cast<uint64_t>(state::jobIdNumber(id).value_or(0));
  r.nodes = spec.nodes;
  r.gpusPerNode = spec.gpus_per_node;
  r.totalGpus = spec.total_gpus;
  r.requiredLabels = spec.required_labels;
  r.topology = spec.topology_override;
  r.cpusPerRank = spec.cpus_per_rank;
  r.memoryPerRank = spec.memory_per_rank_bytes;
  return r;
}

void toProto(const placement::RingLayout& layout, v1::RingLayout* out) {
  out->set_topology(layout.topology());
  for (int d : layout.dims) out->add_dims(d);
  out->set_overridden(layout.overridden);
  out->set_why(layout.why);
  for (const auto& slot : layout.ranks) {
    v1::RankSlot* s = out->add_ranks();
    s->set_rank(slot.rank);
    s->set_node(slot.node);
    s->set_gpu(slot.gpu);
    s->set_local_rank(slot.localRank);
    s->set_switch_name(slot.switchName);
    if (slot.island >= 0) s->set_island(slot.island);
  }
  out->set_text(placement::renderRingLayout(layout));
}

// When the latest attempt reached `state` (STARTING: launched; RUNNING: what a time limit counts from); 0 if
// it never did, or the job was requeued since.
int64_t latestAttemptReached(const state::Job& job, state::JobState state) {
  for (auto t = job.transitions.rbegin(); t != job.transitions.rend(); ++t) {
    if (t->to == state && t->from != state) return t->at_ms;  // not an elastic job's change of ranks
    if (t->to == state::JobState::kPending && t->from != state::JobState::kPending)
      return 0;  // requeued since
  }
  return 0;
}

std::shared_ptr<const placement::NodeTopology> topologyOf(const state::NodeRecord& record) {
  const bool islands = std::any_of(record.gpus.begin(), record.gpus.end(),
                                   [](const state::GpuInfo& g) { return g.island >= 0; });
  const bool numa = std::any_of(record.gpus.begin(), record.gpus.end(),
                                [](const state::GpuInfo& g) { return g.numa_node >= 0; });
  if (!islands && !numa) return nullptr;
  auto t = std::make_shared<placement::NodeTopology>();
  for (const state::GpuInfo& g : record.gpus) {
    if (islands) t->gpuIsland.push_back(g.island);
    if (numa) t->gpuNuma.push_back(g.numa_node);
  }
  t->cpuNuma = record.cpu_numa;
  return t;
}

state::GpuInfo fromProto(const v1::Gpu& g) {
  state::GpuInfo out{g.index(), g.uuid(), g.model(), g.memory_bytes()};
  out.pci_bus_id = g.pci_bus_id();
  out.numa_node = g.has_numa_node() ? g.numa_node() : -1;
  out.island = g.has_island() ? g.island() : -1;
  out.nvlink_peers.assign(g.nvlink_peers().begin(), g.nvlink_peers().end());
  out.p2p_peers.assign(g.p2p_peers().begin(), g.p2p_peers().end());
  out.nic = g.nic();
  out.cpus = g.cpus();
  return out;
}

void toProto(const state::GpuInfo& g, v1::Gpu* out) {
  out->set_index(g.index);
  out->set_uuid(g.uuid);
  out->set_model(g.model);
  out->set_memory_bytes(g.memory_bytes);
  out->set_pci_bus_id(g.pci_bus_id);
  if (g.numa_node >= 0) out->set_numa_node(g.numa_node);
  if (g.island >= 0) out->set_island(g.island);
  for (int p : g.nvlink_peers) out->add_nvlink_peers(p);
  for (int p : g.p2p_peers) out->add_p2p_peers(p);
  out->set_nic(g.nic);
  out->set_cpus(g.cpus);
}

void toProto(int gpu, const state::GpuFault& fault, v1::GpuFault* out) {
  out->set_gpu(gpu);
  out->set_reason(fault.reason);
  out->set_xid(fault.xid);
  out->set_at_ms(fault.at_ms);
}

placement::NodeState toPlacement(state::NodeState s) {
  switch (s) {
    case state::NodeState::kUp:
      return placement::NodeState::kUp;
    case state::NodeState::kDraining:
      return placement::NodeState::kDraining;
    case state::NodeState::kDown:
      return placement::NodeState::kDown;
  }
  return placement::NodeState::kDown;
}

// A job as users see it, from its record alone (the loop adds what only it knows: toProtoOnLoop).
v1::Job jobToProto(const state::Job& job) {
  v1::Job out;
  out.set_id(job.id);
  toProto(job.spec, out.mutable_spec());
  out.set_state(toProto(job.state));
  out.set_restarts(job.restarts);
  out.set_submit_ms(job.submit_ms);
  for (const auto& t : job.transitions) {
    v1::Transition* p = out.add_transitions();
    p->set_from(toProto(t.from));
    p->set_to(toProto(t.to));
    p->set_at_ms(t.at_ms);
    p->set_reason(t.reason);
    if (t.failure) toProto(*t.failure, p->mutable_failure());
  }
  if (job.failure) toProto(*job.failure, out.mutable_failure());
  for (const auto& a : job.allocation) {
    v1::NodeAllocation* p = out.add_allocation();
    p->set_node(a.node);
    for (int g : a.gpus) p->add_gpus(g);
    for (int c : a.cpus) p->add_cpus(c);
    p->set_memory_bytes(a.memory_bytes);
  }
  out.set_topology(job.topology);
  if (!job.transitions.empty()) out.set_reason(job.transitions.back().reason);
  out.set_gpus(requestOf(job.id, job.spec).gpuCount());
  out.set_held(job.held);
  out.set_held_by_admin(job.held_by_admin);
  out.set_start_ms(latestAttemptReached(job, state::JobState::kStarting));
  out.set_end_ms(state::endedAtMs(job));
  out.set_preempted_by(job.preempted_by);
  out.set_preempt_deadline_ms(job.preempt_deadline_ms);
  for (const state::AttemptUsage& u : job.attempts) {
    v1::AttemptUsage* a = out.add_attempts();
    a->set_attempt(u.attempt);
    a->set_start_ms(u.start_ms);
    a->set_end_ms(u.end_ms);
    a->set_gpus(u.gpus);
    a->set_gpu_seconds(u.gpu_s);
    a->set_cpu_seconds(u.cpu_s);
    a->set_max_rss_bytes(u.max_rss_bytes);
    a->set_end(u.end);
  }
  for (const auto& r : job.ranks) {
    if (r.pid == 0 && r.started_ms == 0 && !r.exited) continue;  // placed, never reported
    v1::RankStatus* rank = out.add_ranks();
    toProto(r, rank);
    rank->set_job_id(job.id);
  }
  return out;
}

std::string secondsText(int64_t ms) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", static_cast<double>(ms) / 1000.0);
  return buf;
}

}  // namespace ddl::coordinator
