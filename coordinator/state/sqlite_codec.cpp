// How SqliteStore writes the parts of a record that are not plain columns: see sqlite_codec.h.
#include "state/sqlite_codec.h"

#include <charconv>
#include <nlohmann/json.hpp>
#include <utility>

#include "state/json_fields.h"

namespace ddl::state::sqlite_codec {

std::string encodeIndices(const std::vector<int>& gpus) {
  std::string out;
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(gpus[i]);
  }
  return out;
}

std::optional<std::vector<int>> decodeIndices(const std::string& text) {
  std::vector<int> out;
  if (text.empty()) return out;
  const char* p = text.data();
  const char* end = p + text.size();
  while (true) {
    int v = 0;
    auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc()) return std::nullopt;
    out.push_back(v);
    if (next == end) return out;
    if (*next != ',') return std::nullopt;
    p = next + 1;
  }
}

std::string encodeGpuTopology(const GpuInfo& g) {
  nlohmann::json j = nlohmann::json::object();
  if (!g.pci_bus_id.empty()) j["pci"] = g.pci_bus_id;
  if (g.numa_node >= 0) j["numa"] = g.numa_node;
  if (g.island >= 0) j["island"] = g.island;
  if (!g.nvlink_peers.empty()) j["nvlink"] = g.nvlink_peers;
  if (!g.p2p_peers.empty()) j["p2p"] = g.p2p_peers;
  if (!g.nic.empty()) j["nic"] = g.nic;
  if (!g.cpus.empty()) j["cpus"] = g.cpus;
  return j.empty() ? "" : j.dump();
}

void decodeGpuTopology(const std::string& text, GpuInfo& g) {
  if (text.empty()) return;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    std::fprintf(stderr, "ddl state: GPU %s: its topology is not a JSON object; read as unknown\n",
                 g.uuid.c_str());
    return;
  }
  g.pci_bus_id = json_fields::field(j, "pci", std::string());
  g.numa_node = json_fields::field(j, "numa", -1);
  g.island = json_fields::field(j, "island", -1);
  g.nvlink_peers = json_fields::list<int>(j, "nvlink");
  g.p2p_peers = json_fields::list<int>(j, "p2p");
  g.nic = json_fields::field(j, "nic", std::string());
  g.cpus = json_fields::field(j, "cpus", std::string());
}

std::string encodeGpuFaults(const std::map<int, GpuFault>& faults) {
  if (faults.empty()) return "";
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [gpu, f] : faults)
    list.push_back(
        {{"gpu", gpu}, {"reason", f.reason}, {"xid", f.xid}, {"at_ms", f.at_ms}, {"cleared", f.cleared}});
  return list.dump();
}

std::map<int, GpuFault> decodeGpuFaults(const std::string& text) {
  std::map<int, GpuFault> out;
  if (text.empty()) return out;
  nlohmann::json list = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!list.is_array()) {
    std::fprintf(stderr, "ddl state: a node's GPU faults are not a JSON list; read as none\n");
    return out;
  }
  for (const nlohmann::json& f : list) {
    const int gpu = f.is_object() ? json_fields::field(f, "gpu", -1) : -1;
    if (gpu < 0 || gpu >= kMaxGpusPerNode) continue;  // damaged: a fault of no GPU
    out[gpu] = GpuFault{json_fields::field(f, "reason", std::string()), json_fields::field(f, "xid", 0),
                        json_fields::field<int64_t>(f, "at_ms", 0), json_fields::field(f, "cleared", false)};
  }
  return out;
}

std::string encodeExtra(const Job& job) {
  nlohmann::json j = nlohmann::json::object();
  const JobSpec& s = job.spec;
  if (s.time_limit_s) j["time_limit_s"] = s.time_limit_s;
  if (!s.qos.empty()) j["qos"] = s.qos;
  if (s.warn_signal) {
    j["warn_signal"] = s.warn_signal;
    j["warn_before_s"] = s.warn_before_s;
  }
  if (!s.after_ok.empty()) j["after_ok"] = s.after_ok;
  if (!s.after_any.empty()) j["after_any"] = s.after_any;
  if (s.hold) j["hold"] = true;
  if (!s.array_id.empty()) {
    j["array_id"] = s.array_id;
    j["array_index"] = s.array_index;
    j["array_max_running"] = s.array_max_running;
  }
  if (s.cpus_per_rank) j["cpus_per_rank"] = s.cpus_per_rank;
  if (s.memory_per_rank_bytes) j["memory_per_rank_bytes"] = s.memory_per_rank_bytes;
  if (!s.request_id.empty()) j["request_id"] = s.request_id;
  if (!s.account.empty()) j["account"] = s.account;
  if (s.min_nodes) j["min_nodes"] = s.min_nodes;
  if (s.min_gpus) j["min_gpus"] = s.min_gpus;
  if (job.elastic_gpu_s != 0) j["elastic_gpu_s"] = job.elastic_gpu_s;
  if (job.held) j["held"] = true;
  if (job.held_by_admin) j["held_by_admin"] = true;
  if (!job.preempted_by.empty()) {
    j["preempted_by"] = job.preempted_by;
    j["preempt_deadline_ms"] = job.preempt_deadline_ms;
  }
  if (!job.waiting_for.empty()) j["waiting_for"] = job.waiting_for;
  if (!job.ranks.empty()) {
    nlohmann::json ranks = nlohmann::json::array();
    for (const RankResult& r : job.ranks) {
      const RankFigures& f = r.figures;
      nlohmann::json o = {{"rank", r.rank},
                          {"attempt", r.attempt},
                          {"node", r.node},
                          {"gpu", r.gpu},
                          {"pid", r.pid},
                          {"program_pid", r.program_pid},
                          {"exited", r.exited},
                          {"started_ms", r.started_ms},
                          {"exited_ms", r.exited_ms},
                          {"collectives", f.collectives},
                          {"bytes", f.bytes},
                          {"seconds", f.seconds},
                          {"updated_ms", f.updated_ms}};
      if (r.exit_code) o["exit_code"] = *r.exit_code;
      if (r.signal) o["signal"] = *r.signal;
      if (!r.error.empty()) o["error"] = r.error;
      if (!f.last_op.empty()) o["last_op"] = f.last_op;
      if (f.last_bytes) o["last_bytes"] = f.last_bytes;
      if (f.last_us != 0) o["last_us"] = f.last_us;
      if (!f.last_algo.empty()) o["last_algo"] = f.last_algo;
      if (!f.dims_us.empty()) o["dims_us"] = f.dims_us;
      if (f.world_size) o["world_size"] = f.world_size;
      if (r.cpu_s != 0) o["cpu_s"] = r.cpu_s;
      if (r.max_rss_bytes) o["max_rss_bytes"] = r.max_rss_bytes;
      ranks.push_back(std::move(o));
    }
    j["ranks"] = std::move(ranks);
  }
  if (!job.attempts.empty()) {
    nlohmann::json attempts = nlohmann::json::array();
    for (const AttemptUsage& u : job.attempts) {
      attempts.push_back({{"attempt", u.attempt},
                          {"start_ms", u.start_ms},
                          {"end_ms", u.end_ms},
                          {"gpus", u.gpus},
                          {"gpu_s", u.gpu_s},
                          {"cpu_s", u.cpu_s},
                          {"max_rss_bytes", u.max_rss_bytes},
                          {"end", u.end}});
    }
    j["attempts"] = std::move(attempts);
  }
  // Replace, not throw, on bytes that are not UTF-8 (an agent's error text): the record must be storable.
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

using json_fields::field;

void decodeExtra(const std::string& text, Job& job) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    std::fprintf(stderr, "ddl state: job %s: its extra record is not a JSON object; read as empty\n",
                 job.id.c_str());
    return;
  }
  JobSpec& s = job.spec;
  s.time_limit_s = field<int64_t>(j, "time_limit_s", 0);
  s.warn_signal = field(j, "warn_signal", 0);
  s.warn_before_s = field<int64_t>(j, "warn_before_s", 0);
  s.qos = field(j, "qos", std::string());
  s.after_ok = json_fields::list<std::string>(j, "after_ok");
  s.after_any = json_fields::list<std::string>(j, "after_any");
  s.hold = field(j, "hold", false);
  s.array_id = field(j, "array_id", std::string());
  s.array_index = field(j, "array_index", 0);
  s.array_max_running = field(j, "array_max_running", 0);
  s.cpus_per_rank = field(j, "cpus_per_rank", 0);
  s.memory_per_rank_bytes = field<int64_t>(j, "memory_per_rank_bytes", 0);
  s.request_id = field(j, "request_id", std::string());
  s.account = field(j, "account", std::string());
  s.min_nodes = field(j, "min_nodes", 0);
  s.min_gpus = field(j, "min_gpus", 0);
  job.elastic_gpu_s = field(j, "elastic_gpu_s", 0.0);
  job.held = field(j, "held", false);
  job.held_by_admin = field(j, "held_by_admin", false);
  job.preempted_by = field(j, "preempted_by", std::string());
  job.preempt_deadline_ms = field<int64_t>(j, "preempt_deadline_ms", 0);
  job.waiting_for = json_fields::list<std::string>(j, "waiting_for");
  if (auto attempts = j.find("attempts"); attempts != j.end() && attempts->is_array()) {
    for (const auto& o : *attempts) {
      if (!o.is_object() || job.attempts.size() >= kMaxAttemptsKept) continue;
      job.attempts.push_back(AttemptUsage{
          field(o, "attempt", 0), field<int64_t>(o, "start_ms", 0), field<int64_t>(o, "end_ms", 0),
          field(o, "gpus", 0), field(o, "gpu_s", 0.0), field(o, "cpu_s", 0.0),
          field<int64_t>(o, "max_rss_bytes", 0), field(o, "end", std::string())});
    }
  }
  auto ranks = j.find("ranks");
  if (ranks == j.end() || !ranks->is_array()) return;
  for (const auto& o : *ranks) {
    if (!o.is_object()) continue;
    RankResult r;
    r.rank = field(o, "rank", 0);
    r.attempt = field(o, "attempt", 0);
    r.node = field(o, "node", std::string());
    r.gpu = field(o, "gpu", 0);
    r.pid = field(o, "pid", 0);
    r.program_pid = field(o, "program_pid", 0);
    r.exited = field(o, "exited", false);
    if (o.contains("exit_code")) r.exit_code = field(o, "exit_code", 0);
    if (o.contains("signal")) r.signal = field(o, "signal", 0);
    r.started_ms = field<int64_t>(o, "started_ms", 0);
    r.exited_ms = field<int64_t>(o, "exited_ms", 0);
    r.error = field(o, "error", std::string());
    RankFigures& f = r.figures;
    f.collectives = field<int64_t>(o, "collectives", 0);
    f.bytes = field<int64_t>(o, "bytes", 0);
    f.seconds = field(o, "seconds", 0.0);
    f.last_op = field(o, "last_op", std::string());
    f.last_bytes = field<int64_t>(o, "last_bytes", 0);
    f.last_us = field(o, "last_us", 0.0);
    f.last_algo = field(o, "last_algo", std::string());
    if (auto d = o.find("dims_us"); d != o.end() && d->is_array()) {
      for (const auto& v : *d) {
        if (v.is_number() && f.dims_us.size() < kMaxRankDims) f.dims_us.push_back(v.get<double>());
      }
    }
    f.world_size = field(o, "world_size", 0);
    f.updated_ms = field<int64_t>(o, "updated_ms", 0);
    r.cpu_s = field(o, "cpu_s", 0.0);
    r.max_rss_bytes = field<int64_t>(o, "max_rss_bytes", 0);
    job.ranks.push_back(std::move(r));
  }
}

}  // namespace ddl::state::sqlite_codec
