#include "worker/agent_config.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

namespace ddl::worker {

using state::Status;

Status parseAgentConfig(const std::string& text, const std::string& origin, AgentConfig* c) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::invalidArgument(origin + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object()) return Status::invalidArgument(origin + ": must hold a JSON object");
  for (const auto& [key, value] : doc.items()) {
    try {
      if (key == "coordinator") c->coordinator = value.get<std::string>();
      else if (key == "node") c->node = value.get<std::string>();
      else if (key == "address") c->address = value.get<std::string>();
      else if (key == "labels") c->labels = value.get<std::map<std::string, std::string>>();
      else if (key == "virtual_gpus") c->virtual_gpus = value.get<int>();
      else if (key == "force_virtual") c->force_virtual = value.get<bool>();
      else if (key == "data_dir") c->data_dir = value.get<std::string>();
      else if (key == "log_retention_hours") c->log_retention_hours = value.get<double>();
      else if (key == "log_max_mb") c->log_max_mb = value.get<int64_t>();
      else if (key == "port_first") c->port_first = value.get<int>();
      else if (key == "port_last") c->port_last = value.get<int>();
      else if (key == "stop_grace_s") c->stop_grace_s = value.get<double>();
      else if (key == "stop_ranks_on_exit") c->stop_ranks_on_exit = value.get<bool>();
      else if (key == "log_level") c->log_level = value.get<std::string>();
      else if (key == "pki_dir") c->pki_dir = value.get<std::string>();
      else if (key == "insecure") c->insecure = value.get<bool>();
      else if (key == "tls_refresh_s") c->tls_refresh_s = value.get<double>();
      else {
        return Status::invalidArgument(origin + ": unknown key '" + key +
                                       "' (known: coordinator, node, address, labels, virtual_gpus, force_virtual, "
                                       "data_dir, log_retention_hours, log_max_mb, port_first, port_last, "
                                       "stop_grace_s, stop_ranks_on_exit, log_level, pki_dir, insecure, "
                                       "tls_refresh_s)");
      }
    } catch (const nlohmann::json::exception&) {
      return Status::invalidArgument(origin + ": key '" + key + "' has the wrong type: " + value.dump());
    }
  }
  return Status::ok();
}

Status loadAgentConfig(const std::string& path, AgentConfig* config) {
  std::ifstream in(path);
  if (!in) return Status::invalidArgument("cannot read config file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parseAgentConfig(text.str(), path, config);
}

Status parseLabels(const std::string& text, std::map<std::string, std::string>* labels) {
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Status::invalidArgument("label '" + item + "' is not KEY=VALUE (e.g. --labels rack=r1,switch=s1)");
    }
    (*labels)[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return Status::ok();
}

Status validateAgentConfig(const AgentConfig& c) {
  auto bad = [](const std::string& m) { return Status::invalidArgument(m); };
  if (c.coordinator.rfind(':') == std::string::npos) {
    return bad("coordinator '" + c.coordinator + "' is not HOST:PORT (e.g. 10.0.0.1:7070)");
  }
  if (c.virtual_gpus < 0 || c.virtual_gpus > 64) return bad("virtual_gpus must be 0..64");
  if (c.port_first < 1024 || c.port_last > 65535 || c.port_last <= c.port_first) {
    return bad("port_first..port_last must lie in 1024..65535 and hold at least 2 ports");
  }
  if (c.data_dir.empty()) return bad("data_dir is empty");
  if (!(c.stop_grace_s >= 0)) return bad("stop_grace_s must be >= 0");
  if (!(c.log_retention_hours >= 0 && c.log_retention_hours <= 24 * 3650)) {
    return bad("log_retention_hours must be between 0 (keep forever) and 87600 (ten years)");
  }
  if (c.log_max_mb < 0) return bad("log_max_mb must be >= 0 (0: no bound)");
  if (c.pki_dir.empty() && !c.insecure) return bad("pki_dir is empty");
  if (!(c.tls_refresh_s >= 1 && c.tls_refresh_s <= 86400)) return bad("tls_refresh_s must be between 1 and 86400");
  return Status::ok();
}

}  // namespace ddl::worker
