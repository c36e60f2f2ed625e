// The coordinator's nodes and their agents' sessions (node_registry.h): registration and its checks, the
// stream and its queued commands, heartbeats and the grace, drain and removal, the recovery window.
#include "service/node_registry.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cassert>

#include "common/resources.h"
#include "service/actor.h"
#include "service/convert.h"

namespace ddl::coordinator {
namespace {

bool isValidName(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  return std::all_of(name.begin(), name.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '-' || c == '_' || c == '.'; });
}

constexpr int kMaxNumaNode = 1023;
constexpr int kMaxNics = 64;

// What a registration asks for that it may not: "" or why.
Status checkRegistration(const v1::RegisterRequest& req) {
  if (!isValidName(req.node())) {
    return Status::invalidArgument("register: node name '" + req.node() +
                                   "' is empty or has characters other than letters, digits, '-', '_', '.'");
  }
  if (req.address().empty())
    return Status::invalidArgument("register: node " + req.node() + " gave no address");
  for (int i = 0; i < req.gpus_size(); ++i) {
    if (req.gpus(i).index() != i) {
      return Status::invalidArgument("register: node " + req.node() + ": GPU " + std::to_string(i) +
                                     " has index " + std::to_string(req.gpus(i).index()) +
                                     "; list GPUs by index 0..n-1");
    }
  }
  if (req.gpus_size() > state::kMaxGpusPerNode)
    return Status::invalidArgument("register: node " + req.node() + " reports " +
                                   std::to_string(req.gpus_size()) + " GPUs; at most " +
                                   std::to_string(state::kMaxGpusPerNode));
  for (const v1::Nic& n : req.nics()) {
    if (n.name().size() > 64 || n.transport().size() > 16 || n.pci_bus_id().size() > 64 ||
        (n.has_numa_node() && (n.numa_node() < 0 || n.numa_node() > kMaxNumaNode)))
      return Status::invalidArgument(
          "register: node " + req.node() + ": NIC " + state::quoteForMessage(n.name()) +
          ": a name and PCI address of at most 64 bytes, a transport of at most 16 "
          "and a NUMA node in 0-" +
          std::to_string(kMaxNumaNode) + " are expected");
  }
  for (const v1::Gpu& g : req.gpus()) {
    const std::string gpu = "register: node " + req.node() + ": GPU " + std::to_string(g.index());
    for (const auto* peers : {&g.nvlink_peers(), &g.p2p_peers()}) {
      std::vector<int> sorted(peers->begin(), peers->end());
      std::sort(sorted.begin(), sorted.end());
      if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
        return Status::invalidArgument(gpu + ": a peer is listed twice");
    }
    auto outOfRange = [&](int peer) { return peer < 0 || peer >= req.gpus_size() || peer == g.index(); };
    if (std::any_of(g.nvlink_peers().begin(), g.nvlink_peers().end(), outOfRange) ||
        std::any_of(g.p2p_peers().begin(), g.p2p_peers().end(), outOfRange) ||
        (g.has_island() && (g.island() < 0 || g.island() > g.index())))
      return Status::invalidArgument(gpu + ": its NVLink and P2P peers must be other GPUs of the node (0-" +
                                     std::to_string(req.gpus_size() - 1) +
                                     ") and its island the lowest GPU NVLink joins it to");
    if (g.has_numa_node() && (g.numa_node() < 0 || g.numa_node() > kMaxNumaNode))
      return Status::invalidArgument(gpu + ": NUMA node " + std::to_string(g.numa_node()) + " is not 0-" +
                                     std::to_string(kMaxNumaNode));
    if (g.pci_bus_id().size() > 64 || g.nic().size() > 64 || g.cpus().size() > 4096)
      return Status::invalidArgument(gpu +
                                     ": its PCI address and NIC may be at most 64 bytes, its CPU list 4096");
  }
  if (req.cpu_numa_size() != 0 && req.cpu_numa_size() != req.cpus_size())
    return Status::invalidArgument("register: node " + req.node() + ": " +
                                   std::to_string(req.cpu_numa_size()) + " NUMA nodes for " +
                                   std::to_string(req.cpus_size()) + " CPUs");
  for (int c : req.cpus()) {
    if (c < 0 || c > kMaxCpuId)
      return Status::invalidArgument("register: node " + req.node() + ": CPU ids must lie in 0-" +
                                     std::to_string(kMaxCpuId));
  }
  if (req.memory_bytes() < 0)
    return Status::invalidArgument("register: node " + req.node() + ": negative memory");
  return Status::ok();
}

}  // namespace

NodeRegistry::NodeRegistry(Actor& actor, Options options, std::function<int64_t()> now_ms,
                           std::function<int64_t()> wall_ms)
    : actor_(actor), options_(options), now_ms_(std::move(now_ms)), wall_ms_(std::move(wall_ms)) {}

void NodeRegistry::putOnLoop(const state::NodeRecord& record) {
  ++epoch_;
  state::Write w;
  w.kind = state::Write::Kind::kPutNode;
  w.node = record;
  actor_.put(std::move(w));
}

void NodeRegistry::loadOnLoop(const std::vector<state::NodeRecord>& records) {
  assert(actor_.onLoop());
  const int64_t now = now_ms_();
  for (const auto& record : records) {
    Node& node = nodes_[record.name];
    node.record = record;
    node.port_first = options_.port_first;
    node.port_last = options_.port_last;
    node.last_seen_ms = now;  // every node gets a full grace period to reconnect
    if (record.state != state::NodeState::kDown) recovery_until_ms_ = now + options_.heartbeat_grace_ms;
  }
  ++epoch_;  // what the job side derived from the nodes is stale
}

bool NodeRegistry::endRecoveryOnLoop(int64_t now) {
  if (recovery_until_ms_ == 0) return false;
  const bool all_back = std::all_of(nodes_.begin(), nodes_.end(), [](const auto& kv) {
    return kv.second.record.state == state::NodeState::kDown || kv.second.link != nullptr;
  });
  if (!all_back && now < recovery_until_ms_) return false;
  spdlog::info("recovery over: {}", all_back ? "every node reconnected" : "grace period passed");
  recovery_until_ms_ = 0;
  return true;
}

StatusOr<NodeRegistry::Node*> NodeRegistry::registerOnLoop(const v1::RegisterRequest& req) {
  assert(actor_.onLoop());
  if (Status st = checkRegistration(req); !st) return st;
  int first = req.port_first(), last = req.port_last();
  if (first == 0 && last == 0) {
    first = options_.port_first;
    last = options_.port_last;
  } else if (first < 1024 || last > 65535 || last <= first) {
    return Status::invalidArgument("register: node " + req.node() + ": port range " + std::to_string(first) +
                                   "-" + std::to_string(last) + " must lie in 1024-65535 and hold 2 ports");
  }
  const int64_t now = now_ms_();
  // Another live agent already holds this node (its stream is attached, or it registered moments ago and is
  // about to attach): a second ddl-agent with the same --node, a cloned machine or a copied certificate.
  // Refused, naming both, instead of the two taking turns. An agent that restarts is another instance too:
  // its predecessor's stream closed when it stopped or died, so it is let in at once.
  if (auto it = nodes_.find(req.node()); it != nodes_.end() && !req.instance().empty() &&
                                         !it->second.instance.empty() &&
                                         it->second.instance != req.instance()) {
    const Node& held = it->second;
    const int64_t silent = now - held.last_seen_ms;
    if (held.link || (!held.attached && now - held.registered_ms < 2 * options_.heartbeat_interval_ms)) {
      return Status::failedPrecondition(
          "register: node " + req.node() + " is held by another live ddl-agent (at " + held.registered_from +
          ", heard from " + secondsText(silent) + " ago); this one (at " + req.address() +
          ") is refused. Two agents claim one node name: give each machine its own --node and certificate, "
          "or stop one; a restarted agent is let in once its predecessor's connection is gone");
    }
  }
  if (nodes_.size() >= options_.max_nodes && nodes_.find(req.node()) == nodes_.end()) {
    return Status::failedPrecondition(
        "register: node " + req.node() + ": the coordinator knows " + std::to_string(nodes_.size()) +
        " nodes, its limit; forget nodes that are gone with 'ddlctl nodes remove NAME' (a DOWN node with no "
        "live job)");
  }
  // The CPUs in order, each with its NUMA node where the agent knows every one (-1 or beyond kMaxNumaNode:
  // unknown, and then none is kept: placement takes CPUs by id on that node).
  std::vector<std::pair<int, int>> cpuNuma;
  for (int i = 0; i < req.cpus_size(); ++i)
    cpuNuma.push_back({req.cpus(i), req.cpu_numa_size() ? req.cpu_numa(i) : -1});
  std::sort(cpuNuma.begin(), cpuNuma.end());
  cpuNuma.erase(std::unique(cpuNuma.begin(), cpuNuma.end(),
                            [](const auto& a, const auto& b) { return a.first == b.first; }),
                cpuNuma.end());
  std::vector<int> cpus, numas;
  for (auto [cpu, numa] : cpuNuma) {
    cpus.push_back(cpu);
    numas.push_back(numa);
  }
  if (std::any_of(numas.begin(), numas.end(), [](int n) { return n < 0 || n > kMaxNumaNode; })) numas.clear();
  Node& node = nodes_[req.node()];
  state::NodeRecord record = node.record;
  record.name = req.node();
  record.address = req.address();
  record.gpus.clear();
  for (const auto& g : req.gpus()) record.gpus.push_back(fromProto(g));
  // Faults stay with their GPU index whatever the agent now reports (its GPUs keep their indices, an
  // unreachable one included); only an admin clears one.
  record.labels = {req.labels().begin(), req.labels().end()};
  record.cpus = std::move(cpus);
  record.cpu_numa = std::move(numas);
  record.memory_bytes = req.memory_bytes();
  if (record.state == state::NodeState::kDown) {
    record.state = record.drained ? state::NodeState::kDraining : state::NodeState::kUp;
  }
  record.last_heartbeat_ms = wall_ms_();
  putOnLoop(record);
  if (node.link) node.link->close();
  node.link.reset();
  node.outbox.clear();  // commands for the old stream are lost with it; the job side reconciles
  node.record = record;
  // The first kMaxNics (a host with containers has a veth for each; they are only shown).
  node.nics.assign(req.nics().begin(), req.nics().begin() + std::min(req.nics_size(), kMaxNics));
  node.confinement = req.confinement().substr(0, 1024);
  node.port_first = first;
  node.port_last = last;
  node.last_seen_ms = now;
  node.session = req.node() + "-" + std::to_string(wall_ms_()) + "-" + std::to_string(++session_counter_);
  node.instance = req.instance();
  node.registered_from = req.address();
  node.registered_ms = now;
  node.attached = false;
  node.ranks.clear();
  return &node;
}

NodeRegistry::Node* NodeRegistry::sessionOnLoop(const std::string& node, const std::string& session,
                                                Status* error) {
  assert(actor_.onLoop());
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.session.empty()) {
    *error = Status::notFound("node " + node + " has not registered; call Register first");
    return nullptr;
  }
  if (it->second.session != session) {
    *error = Status::failedPrecondition("node " + node + ": session " + session +
                                        " is no longer current (the node registered again); register again");
    return nullptr;
  }
  if (it->second.record.state == state::NodeState::kDown) {
    *error = Status::failedPrecondition("node " + node + " was marked DOWN; register again");
    return nullptr;
  }
  return &it->second;
}

Status NodeRegistry::attachOnLoop(const std::string& node, const std::string& session,
                                  std::shared_ptr<AgentLink> link) {
  Status error;
  Node* entry = sessionOnLoop(node, session, &error);
  if (!entry) return error;
  if (entry->link && entry->link != link) entry->link->close();
  entry->link = std::move(link);
  entry->attached = true;
  entry->last_seen_ms = now_ms_();
  // Queued commands were durable when they were queued: they go out first, in order, ahead of newer ones that
  // still wait for the store.
  for (const auto& cmd : entry->outbox) entry->link->send(cmd);
  entry->outbox.clear();
  return Status::ok();
}

void NodeRegistry::detachOnLoop(const std::string& node, const std::string& session,
                                const std::shared_ptr<AgentLink>& link) {
  assert(actor_.onLoop());
  auto it = nodes_.find(node);
  if (it == nodes_.end() || it->second.session != session || it->second.link != link) return;
  it->second.link.reset();
  spdlog::info("node {}: agent stream closed; DOWN unless it is back within {}", node,
               secondsText(options_.heartbeat_grace_ms));
}

void NodeRegistry::heardFromOnLoop(Node& node, const std::string* warning) {
  node.last_seen_ms = now_ms_();
  if (!warning) return;
  node.record.last_heartbeat_ms = wall_ms_();
  // Kept bounded; compared as kept, so an over-long warning is logged once, not at every heartbeat.
  if (const std::string_view w = std::string_view(*warning).substr(0, 1024); w != node.warning) {
    if (!w.empty()) spdlog::warn("node {}: {}", node.record.name, w);
    node.warning.assign(w);
  }
}

void NodeRegistry::checkHeartbeatsOnLoop(int64_t now) {
  assert(actor_.onLoop());
  for (auto& [name, node] : nodes_) {
    if (node.record.state == state::NodeState::kDown) continue;
    if (now - node.last_seen_ms <= options_.heartbeat_grace_ms) continue;
    const std::string reason = "node_lost: node " + name + " sent no heartbeat for " +
                               secondsText(now - node.last_seen_ms) + " (grace " +
                               secondsText(options_.heartbeat_grace_ms) + ")";
    spdlog::warn("{}; marking it DOWN", reason);
    node.record.state = state::NodeState::kDown;
    putOnLoop(node.record);
    if (node.link) node.link->close();
    node.link.reset();
    node.outbox.clear();
    if (node_lost_) node_lost_(name, reason);
    node.ranks.clear();
  }
}

void NodeRegistry::sendOnLoop(const std::string& node, const v1::Command& command) {
  assert(actor_.onLoop());
  if (nodes_.find(node) == nodes_.end()) return;
  // Commands go out once what led to them is durable (a StartRanks never leaves before STARTING is stored).
  actor_.afterCommit([this, node, command] {
    auto it = nodes_.find(node);
    if (it == nodes_.end()) return;
    if (it->second.link) {
      it->second.link->send(command);
    } else if (it->second.outbox.size() < kMaxOutbox) {
      it->second.outbox.push_back(command);
    } else {
      spdlog::warn(
          "node {}: {} commands wait for its agent; dropping one (the agent reconciles when it is back)",
          node, kMaxOutbox);
    }
  });
}

StatusOr<NodeRegistry::Node*> NodeRegistry::drainOnLoop(const std::string& name, bool drain,
                                                        const std::string& reason,
                                                        const std::string& refuse) {
  assert(actor_.onLoop());
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return state::nodeNotFound(name);
  if (reason.size() > state::kMaxDrainReasonBytes || state::findControlCharacter(reason) != std::string::npos)
    return Status::invalidArgument("drain reason: at most " + std::to_string(state::kMaxDrainReasonBytes) +
                                   " bytes and no control characters");
  Node& node = it->second;
  // A DOWN node stays DOWN until its agent is back; the drain is kept for then.
  state::NodeRecord want = node.record;
  want.drained = drain;
  want.drain_reason = drain ? reason : "";
  if (want.state != state::NodeState::kDown)
    want.state = drain ? state::NodeState::kDraining : state::NodeState::kUp;
  if (want != node.record) {
    if (!refuse.empty()) return Status::unavailable("drain refused: " + refuse);
    node.record = want;
    putOnLoop(want);
    spdlog::info("node {} is now {}{}", name, toString(want.state),
                 want.state == state::NodeState::kDown
                     ? (drain ? ", drained for when it is back" : ", undrained")
                     : "");
  }
  return &node;
}

std::vector<std::pair<int, state::GpuFault>> NodeRegistry::gpuFaultsOnLoop(
    Node& node, const google::protobuf::RepeatedPtrField<v1::GpuFault>& faults) {
  assert(actor_.onLoop());
  std::vector<std::pair<int, state::GpuFault>> fresh;
  if (faults.empty()) return fresh;  // the common heartbeat: nothing copied
  state::NodeRecord want = node.record;
  for (const v1::GpuFault& f : faults) {
    const int gpu = f.gpu();
    if (gpu < 0 || gpu >= static_cast<int>(want.gpus.size())) continue;
    auto known = want.gpu_faults.find(gpu);
    if (known != want.gpu_faults.end() && !known->second.cleared) continue;  // reported already
    if (known != want.gpu_faults.end() && f.at_ms() <= known->second.at_ms) {
      // The fault an admin cleared, reported again before the agent heard of the clear (or the clear was
      // lost with a restart): not news; the agent is told again.
      v1::Command clear;
      clear.mutable_clear_gpu_fault()->set_gpu(gpu);
      sendOnLoop(want.name, clear);
      continue;
    }
    state::GpuFault fault{state::withoutControlCharacters(f.reason().substr(0, state::kMaxDrainReasonBytes)),
                          f.xid(), f.at_ms()};
    want.gpu_faults[gpu] = fault;
    fresh.emplace_back(gpu, fault);
    spdlog::error(
        "node {} GPU {}: {}; no job is placed on it until an admin clears it (ddlctl admin gpu-ok {} {})",
        want.name, gpu, fault.reason, want.name, gpu);
  }
  if (!fresh.empty()) {
    node.record = want;
    putOnLoop(want);
  }
  return fresh;
}

StatusOr<NodeRegistry::Node*> NodeRegistry::clearGpuFaultOnLoop(const std::string& name, int gpu,
                                                                const std::string& refuse) {
  assert(actor_.onLoop());
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return state::nodeNotFound(name);
  Node& node = it->second;
  auto fault = node.record.gpu_faults.find(gpu);
  if (fault == node.record.gpu_faults.end() || fault->second.cleared) {
    if (gpu < 0 || gpu >= static_cast<int>(node.record.gpus.size()))
      return Status::invalidArgument("node " + name + " has no GPU " + std::to_string(gpu) + " (it has " +
                                     std::to_string(node.record.gpus.size()) + ")");
    return Status::failedPrecondition("GPU " + std::to_string(gpu) + " of node " + name +
                                      " has no fault to clear");
  }
  if (!refuse.empty()) return Status::unavailable("gpu-ok refused: " + refuse);
  state::NodeRecord want = node.record;
  want.gpu_faults[gpu].cleared = true;
  node.record = want;
  putOnLoop(want);
  v1::Command clear;
  clear.mutable_clear_gpu_fault()->set_gpu(gpu);
  sendOnLoop(name, clear);
  spdlog::info("node {} GPU {}: cleared by an admin; jobs may be placed on it again", name, gpu);
  return &node;
}

Status NodeRegistry::removableOnLoop(const std::string& name) const {
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return state::nodeNotFound(name);
  const Node& node = it->second;
  if (node.record.state != state::NodeState::kDown || node.link) {
    return Status::failedPrecondition(
        "node " + name + " is " + toString(node.record.state) +
        (node.link ? " with its agent connected" : "") +
        "; only a DOWN node is removed (stop its agent, wait for DOWN, or drain it)");
  }
  return Status::ok();
}

Status NodeRegistry::removeOnLoop(const std::string& name) {
  assert(actor_.onLoop());
  if (Status st = removableOnLoop(name); !st) return st;
  nodes_.erase(name);
  ++epoch_;
  state::Write w;
  w.kind = state::Write::Kind::kDeleteNode;
  w.name = name;
  actor_.put(std::move(w));
  spdlog::info("node {} removed", name);
  return Status::ok();
}

void NodeRegistry::closeAllOnLoop() {
  for (auto& [name, node] : nodes_) {
    if (node.link) node.link->close();
    node.link.reset();
  }
}

NodeRegistry::Node* NodeRegistry::find(const std::string& name) {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

const NodeRegistry::Node* NodeRegistry::find(const std::string& name) const {
  auto it = nodes_.find(name);
  return it == nodes_.end() ? nullptr : &it->second;
}

v1::Node NodeRegistry::toProto(const Node& node, const NodeUsage& usage) const {
  v1::Node out;
  out.set_name(node.record.name);
  out.set_address(node.record.address);
  out.set_state(toString(node.record.state));
  out.set_drained(node.record.drained);
  out.set_drain_reason(node.record.drain_reason);
  for (const auto& g : node.record.gpus) coordinator::toProto(g, out.add_gpus());
  for (const auto& [gpu, f] : node.record.gpu_faults)
    if (!f.cleared) coordinator::toProto(gpu, f, out.add_gpu_faults());
  for (int g : usage.gpus) out.add_gpus_used(g);
  for (int c : node.record.cpus) out.add_cpus(c);
  for (int n : node.record.cpu_numa) out.add_cpu_numa(n);
  for (int c : usage.cpus) out.add_cpus_used(c);
  out.set_memory_bytes(node.record.memory_bytes);
  out.set_memory_used_bytes(usage.memory_bytes);
  out.set_confinement(node.confinement);
  out.set_warning(node.warning);
  for (const auto& [k, v] : node.record.labels) (*out.mutable_labels())[k] = v;
  out.set_last_heartbeat_ms(node.record.last_heartbeat_ms);
  out.set_connected(node.link != nullptr);
  for (const auto& id : usage.jobs) out.add_jobs(id);
  for (const auto& nic : node.nics) *out.add_nics() = nic;
  return out;
}

}  // namespace ddl::coordinator
