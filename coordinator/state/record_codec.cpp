// Whole records as MessagePack: see record_codec.h.
#include "state/record_codec.h"

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "state/json_fields.h"
#include "state/sqlite_codec.h"

namespace ddl::state::record_codec {
namespace {

using nlohmann::json;

constexpr int kVersion = 1;

json failureDoc(const Failure& f) {
  json o = {{"rank", f.rank}, {"host", f.host}};
  if (f.exit_code) o["exit_code"] = *f.exit_code;
  if (f.signal) o["signal"] = *f.signal;
  return o;
}

// Readers that give the default for a missing key or a value of the wrong type (json_fields.h).
int64_t num(const json& o, const char* key) { return json_fields::field<int64_t>(o, key, 0); }
std::string str(const json& o, const char* key) { return json_fields::field<std::string>(o, key, ""); }
std::map<std::string, std::string> stringMap(const json& o, const char* key) {
  std::map<std::string, std::string> out;
  auto it = o.find(key);
  if (it == o.end() || !it->is_object()) return out;
  for (const auto& [k, v] : it->items()) {
    if (v.is_string()) out[k] = v.get<std::string>();
  }
  return out;
}
std::optional<Failure> failureOf(const json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_object()) return std::nullopt;
  Failure f;
  f.rank = static_cast<int>(num(*it, "rank"));
  f.host = str(*it, "host");
  if (it->contains("exit_code")) f.exit_code = static_cast<int>(num(*it, "exit_code"));
  if (it->contains("signal")) f.signal = static_cast<int>(num(*it, "signal"));
  return f;
}

// The document of `bytes`, or DATA_LOSS naming `what` when it is not one of ours.
StatusOr<json> parse(const std::string& what, const std::string& bytes) {
  json doc = json::from_msgpack(bytes, /*strict=*/true, /*allow_exceptions=*/false);
  if (!doc.is_object() || num(doc, "v") != kVersion) {
    return Status::dataLoss(what + ": the stored value is not a version " + std::to_string(kVersion) +
                            " record");
  }
  return doc;
}

std::string pack(const json& doc) {
  std::vector<uint8_t> bytes = json::to_msgpack(doc);
  return std::string(bytes.begin(), bytes.end());
}

}  // namespace

std::string encodeJob(const Job& job) {
  const JobSpec& s = job.spec;
  json doc = {{"v", kVersion},
              {"name", s.name},
              {"user", s.user},
              {"nodes", s.nodes},
              {"gpus_per_node", s.gpus_per_node},
              {"total_gpus", s.total_gpus},
              {"topology_override", s.topology_override},
              {"priority", s.priority},
              {"max_restarts", s.max_restarts},
              {"env", s.env},
              {"workdir", s.workdir},
              {"command", s.command},
              {"labels", s.required_labels},
              {"state", toString(job.state)},
              {"restarts", job.restarts},
              {"submit_ms", job.submit_ms},
              {"topology", job.topology},
              {"root_port", job.root_port},
              {"end_ms", endedAtMs(job)},
              {"extra", sqlite_codec::encodeExtra(job)}};
  if (job.failure) doc["failure"] = failureDoc(*job.failure);
  json transitions = json::array();
  for (const Transition& t : job.transitions) {
    json o = {{"from", toString(t.from)}, {"to", toString(t.to)}, {"at_ms", t.at_ms}, {"reason", t.reason}};
    if (t.failure) o["failure"] = failureDoc(*t.failure);
    transitions.push_back(std::move(o));
  }
  doc["transitions"] = std::move(transitions);
  json allocation = json::array();
  for (const NodeAllocation& a : job.allocation) {
    allocation.push_back(
        {{"node", a.node}, {"gpus", a.gpus}, {"cpus", a.cpus}, {"memory_bytes", a.memory_bytes}});
  }
  doc["allocation"] = std::move(allocation);
  return pack(doc);
}

size_t jobBytesBound(const Job& job) {
  // Per field or element: its name (at most 24 bytes) and MessagePack's or JSON's framing (at most 16).
  constexpr size_t kField = 40;
  auto strings = [](const std::vector<std::string>& v, size_t times) {
    size_t n = 0;
    for (const std::string& s : v) n += times * s.size() + kField;
    return n;
  };
  const JobSpec& s = job.spec;
  size_t n = 40 * kField;  // the fixed fields, numbers at most 9 bytes each
  n += s.name.size() + s.user.size() + s.topology_override.size() + s.workdir.size() + job.topology.size();
  n += strings(s.env, 1) + strings(s.command, 1);
  for (const auto& [k, v] : s.required_labels) n += k.size() + v.size() + kField;
  // "extra" is a JSON document inside: its strings escaped at worst six bytes for one.
  n += strings(s.after_ok, 6) + strings(s.after_any, 6) + strings(job.waiting_for, 6);
  n += 6 * (s.array_id.size() + s.request_id.size() + s.account.size()) + 24 * kField;
  for (const RankResult& r : job.ranks) {
    // 24 fields of at most 39 bytes in JSON (a 13-byte key, a 24-byte number), the node's name (a node name
    // needs no escaping) and the free texts escaped at worst.
    n += 1000 + r.node.size() + 6 * (r.error.size() + r.figures.last_op.size() + r.figures.last_algo.size()) +
         r.figures.dims_us.size() * 32;
  }
  n += job.attempts.size() * 12 *
       kField;  // eight fields inside "extra" (escaped again), an end word of 9 bytes
  for (const Transition& t : job.transitions)
    n += 8 * kField + t.reason.size() + (t.failure ? t.failure->host.size() : 0);
  if (job.failure) n += 5 * kField + job.failure->host.size();
  for (const NodeAllocation& a : job.allocation)
    n += 5 * kField + a.node.size() + 9 * (a.gpus.size() + a.cpus.size());
  return n;
}

size_t nodeBytesBound(const NodeRecord& node) {
  constexpr size_t kField = 40;
  size_t n = 13 * kField + node.address.size() + node.drain_reason.size() + 9 * node.cpus.size() +
             9 * node.cpu_numa.size() + 6 * sqlite_codec::encodeGpuFaults(node.gpu_faults).size();
  for (const GpuInfo& g : node.gpus)
    n += 6 * kField + g.uuid.size() + g.model.size() + 6 * sqlite_codec::encodeGpuTopology(g).size();
  for (const auto& [k, v] : node.labels) n += k.size() + v.size() + kField;
  return n;
}

StatusOr<Job> decodeJob(const std::string& id, const std::string& bytes) {
  StatusOr<json> parsed = parse("job " + id, bytes);
  if (!parsed) return parsed.status();
  const json& doc = *parsed;
  Job job;
  job.id = id;
  JobSpec& s = job.spec;
  s.name = str(doc, "name");
  s.user = str(doc, "user");
  s.nodes = static_cast<int>(num(doc, "nodes"));
  s.gpus_per_node = static_cast<int>(num(doc, "gpus_per_node"));
  s.total_gpus = static_cast<int>(num(doc, "total_gpus"));
  s.topology_override = str(doc, "topology_override");
  s.priority = static_cast<int>(num(doc, "priority"));
  s.max_restarts = static_cast<int>(num(doc, "max_restarts"));
  s.env = json_fields::list<std::string>(doc, "env");
  s.workdir = str(doc, "workdir");
  s.command = json_fields::list<std::string>(doc, "command");
  s.required_labels = stringMap(doc, "labels");
  std::optional<JobState> state = parseJobState(str(doc, "state"));
  if (!state) return Status::dataLoss("job " + id + " has unknown state '" + str(doc, "state") + "'");
  job.state = *state;
  job.restarts = static_cast<int>(num(doc, "restarts"));
  job.submit_ms = num(doc, "submit_ms");
  job.failure = failureOf(doc, "failure");
  job.topology = str(doc, "topology");
  job.root_port = static_cast<int>(num(doc, "root_port"));
  if (auto it = doc.find("transitions"); it != doc.end() && it->is_array()) {
    for (const auto& o : *it) {
      std::optional<JobState> from = parseJobState(str(o, "from")), to = parseJobState(str(o, "to"));
      if (!from || !to) return Status::dataLoss("job " + id + " has a transition with an unknown state");
      job.transitions.push_back(
          Transition{*from, *to, num(o, "at_ms"), str(o, "reason"), failureOf(o, "failure")});
    }
  }
  if (auto it = doc.find("allocation"); it != doc.end() && it->is_array()) {
    for (const auto& o : *it) {
      job.allocation.push_back(NodeAllocation{str(o, "node"), json_fields::list<int>(o, "gpus"),
                                              json_fields::list<int>(o, "cpus"), num(o, "memory_bytes")});
    }
  }
  sqlite_codec::decodeExtra(str(doc, "extra"), job);
  return job;
}

std::string encodeNode(const NodeRecord& node) {
  json gpus = json::array();
  for (const GpuInfo& g : node.gpus) {
    json o = {{"index", g.index}, {"uuid", g.uuid}, {"model", g.model}, {"memory_bytes", g.memory_bytes}};
    if (std::string topology = sqlite_codec::encodeGpuTopology(g); !topology.empty())
      o["topology"] = topology;
    gpus.push_back(std::move(o));
  }
  return pack({{"v", kVersion},
               {"address", node.address},
               {"gpus", std::move(gpus)},
               {"labels", node.labels},
               {"state", toString(node.state)},
               {"drain_reason", node.drain_reason},
               {"drained", node.drained},
               {"last_heartbeat_ms", node.last_heartbeat_ms},
               {"cpus", node.cpus},
               {"cpu_numa", node.cpu_numa},
               {"gpu_faults", sqlite_codec::encodeGpuFaults(node.gpu_faults)},
               {"memory_bytes", node.memory_bytes}});
}

StatusOr<NodeRecord> decodeNode(const std::string& name, const std::string& bytes) {
  StatusOr<json> parsed = parse("node " + name, bytes);
  if (!parsed) return parsed.status();
  const json& doc = *parsed;
  NodeRecord n;
  n.name = name;
  n.address = str(doc, "address");
  if (auto it = doc.find("gpus"); it != doc.end() && it->is_array()) {
    for (const auto& o : *it) {
      GpuInfo g{static_cast<int>(num(o, "index")), str(o, "uuid"), str(o, "model"), num(o, "memory_bytes")};
      sqlite_codec::decodeGpuTopology(str(o, "topology"), g);
      n.gpus.push_back(std::move(g));
    }
  }
  n.labels = stringMap(doc, "labels");
  std::optional<NodeState> state = parseNodeState(str(doc, "state"));
  if (!state) return Status::dataLoss("node " + name + " has unknown state '" + str(doc, "state") + "'");
  n.state = *state;
  n.drain_reason = str(doc, "drain_reason");
  n.drained = json_fields::field<bool>(doc, "drained", false);
  n.last_heartbeat_ms = num(doc, "last_heartbeat_ms");
  n.cpus = json_fields::list<int>(doc, "cpus");
  n.cpu_numa = json_fields::list<int>(doc, "cpu_numa");
  if (n.cpu_numa.size() != n.cpus.size()) n.cpu_numa.clear();
  n.gpu_faults = sqlite_codec::decodeGpuFaults(str(doc, "gpu_faults"));
  n.memory_bytes = num(doc, "memory_bytes");
  return n;
}

}  // namespace ddl::state::record_codec
