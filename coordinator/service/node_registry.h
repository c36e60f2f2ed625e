// NodeRegistry: the coordinator's nodes and their agents' sessions, one room on the coordinator's loop (Ray's
// GcsNodeManager). It owns every node's record (written through the Actor), the agent's registration and
// stream (AgentLink), the commands waiting for a stream, the last heartbeat, the agent's warning and what the
// agent last reported running; it checks registrations (a second live agent for a node is refused), marks a
// node DOWN past the heartbeat grace, and keeps the recovery window after a coordinator restart. It knows no
// job: the job side (the Coordinator) reconciles the ranks an agent reports and hears through onNodeLost()
// when a node goes DOWN; it asks the registry for nodes and sends agents commands through sendOnLoop().
//
// Threads: the coordinator's loop only (the methods that change state assert it through the Actor; the reads
// rely on their callers, which are on the loop). Node pointers it hands out are valid for the rest of the
// turn.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "ddl/v1/ddl.pb.h"
#include "state/job.h"

namespace ddl::coordinator {

class Actor;
using state::Status;
using state::StatusOr;

// The way down to one connected agent. The rpc layer implements it over the Connect stream.
class AgentLink {
 public:
  virtual ~AgentLink() = default;
  // Queues a command; must not block. Commands reach the agent in the order they were sent.
  virtual void send(const v1::Command& command) = 0;
  // Ends the stream (the node registered again on another stream, or the coordinator stops).
  virtual void close() = 0;
};

// A rank as an agent reports it: its job, launch attempt and rank.
struct RankKey {
  std::string job;
  int attempt = 0;
  int rank = 0;
  auto operator<=>(const RankKey&) const = default;
};

// What the job side holds on a node: GPUs, CPUs and memory of live jobs and of ranks still running there,
// and the live jobs placed there (for listings and snapshots).
struct NodeUsage {
  std::set<int> gpus;
  std::set<int> cpus;
  int64_t memory_bytes = 0;
  std::vector<std::string> jobs;
};

class NodeRegistry {
 public:
  struct Options {
    int64_t heartbeat_grace_ms = 10000;
    int64_t heartbeat_interval_ms = 1000;
    int port_first = 29500;  // for agents that give no port range
    int port_last = 29999;
    size_t max_nodes = 100000;  // nodes known (UP, DOWN or DRAINING): a new one beyond is refused
  };
  struct Node {
    state::NodeRecord record;
    std::vector<v1::Nic> nics;
    std::string confinement;  // RegisterRequest.confinement, in memory only (each registration sends it)
    std::string warning;      // the last Heartbeat.warning, in memory only
    int port_first = 0;
    int port_last = 0;
    std::string session;          // the current registration; "" before the first one
    std::string instance;         // its agent's RegisterRequest.instance
    std::string registered_from;  // that agent's address (for the refusal of a second agent)
    int64_t registered_ms = 0;    // when (monotonic), and whether its stream attached since
    bool attached = false;
    std::shared_ptr<AgentLink> link;          // null while no stream is attached
    int64_t last_seen_ms = 0;                 // in memory only: heartbeats are not written to the store
    std::map<RankKey, v1::RankStatus> ranks;  // what the agent last reported, any attempt
    std::vector<v1::Command> outbox;          // commands queued while no stream is attached (kMaxOutbox)
  };
  // A node went DOWN (its agent silent past the grace): its jobs' ranks are lost. Called during the turn,
  // while the registry walks its nodes: the listener must not add or remove nodes (it may send commands).
  using NodeLost = std::function<void(const std::string& node, const std::string& reason)>;

  static constexpr size_t kMaxOutbox = 10000;

  NodeRegistry(Actor& actor, Options options, std::function<int64_t()> now_ms,
               std::function<int64_t()> wall_ms);
  void onNodeLost(NodeLost listener) { node_lost_ = std::move(listener); }

  // ---- On the loop ----
  // The stored nodes at a coordinator's start, none connected: each that was UP gets a full grace to come
  // back, and new work waits (recoveringOnLoop) until every one did or the grace passed.
  void loadOnLoop(const std::vector<state::NodeRecord>& records);
  bool recoveringOnLoop(int64_t now) const { return recovery_until_ms_ != 0 && now < recovery_until_ms_; }
  int64_t recoveryLeftMs(int64_t now) const { return recovery_until_ms_ - now; }
  // Ends the recovery window once every node is back or its grace passed; true when it just ended.
  bool endRecoveryOnLoop(int64_t now);
  // An agent registers: checked (its name, GPUs, CPUs, ports; no second live agent for the node; a new node
  // only while fewer than max_nodes are known), its record
  // updated and stored (a DOWN node comes back UP, or DRAINING when drained), a new session; the node's
  // former stream closed, its queued commands and reported ranks dropped (the caller applies the new report).
  StatusOr<Node*> registerOnLoop(const v1::RegisterRequest& request);
  // The node of a current session that is not DOWN, or null with *error set.
  Node* sessionOnLoop(const std::string& node, const std::string& session, Status* error);
  // The agent's stream for a session: queued commands go out first.
  Status attachOnLoop(const std::string& node, const std::string& session, std::shared_ptr<AgentLink> link);
  // The stream that carried `link` ended (ignored when the agent has connected again since).
  void detachOnLoop(const std::string& node, const std::string& session,
                    const std::shared_ptr<AgentLink>& link);
  // A heartbeat or any other message of the node's agent: heard from now; a heartbeat's warning kept.
  void heardFromOnLoop(Node& node, const std::string* warning = nullptr);
  // Nodes silent past the grace go DOWN (stored), their streams closed and queued commands dropped; the
  // listener hears of each before its reported ranks are forgotten.
  void checkHeartbeatsOnLoop(int64_t now);
  // Sends `command` to the node's agent once this turn's changes are durable (queued while no stream is up,
  // at most kMaxOutbox). Nothing for a node it does not know.
  void sendOnLoop(const std::string& node, const v1::Command& command);
  // Drains (or undrains) a node: DRAINING, or the drain kept for when a DOWN node is back. `refuse` is why a
  // change cannot be made now ("" if it can: the coordinator's store is healthy).
  StatusOr<Node*> drainOnLoop(const std::string& name, bool drain, const std::string& reason,
                              const std::string& refuse);
  // A heartbeat's GPU faults: those not yet recorded (and newer than one an admin cleared on that GPU: an
  // older one is old news, and the agent is told of the clear again) are kept in the node's record (stored)
  // and returned, for the caller to fail the jobs on them.
  std::vector<std::pair<int, state::GpuFault>> gpuFaultsOnLoop(
      Node& node, const google::protobuf::RepeatedPtrField<v1::GpuFault>& faults);
  // An admin clears a GPU's fault: the record keeps it marked cleared (stored) and the agent is told.
  // `refuse` as for a drain.
  StatusOr<Node*> clearGpuFaultOnLoop(const std::string& name, int gpu, const std::string& refuse);
  // Forgets a DOWN node whose agent is gone; the caller checked that no live job is placed on it.
  Status removeOnLoop(const std::string& name);
  // The node is one a DOWN, disconnected agent left: what removeOnLoop requires, or why not.
  Status removableOnLoop(const std::string& name) const;
  // Closes every agent's stream (the coordinator stops).
  void closeAllOnLoop();
  v1::Node toProto(const Node& node, const NodeUsage& usage) const;

  Node* find(const std::string& name);
  const Node* find(const std::string& name) const;
  const std::map<std::string, Node>& all() const { return nodes_; }
  // Grows with every change of a node record (the job side rebuilds what it derived from the nodes).
  uint64_t epoch() const { return epoch_; }

 private:
  void putOnLoop(const state::NodeRecord& record);

  Actor& actor_;
  const Options options_;
  std::function<int64_t()> now_ms_;
  std::function<int64_t()> wall_ms_;
  NodeLost node_lost_;
  std::map<std::string, Node> nodes_;
  int64_t recovery_until_ms_ = 0;  // new work waits for reconnecting agents until then
  uint64_t session_counter_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace ddl::coordinator
