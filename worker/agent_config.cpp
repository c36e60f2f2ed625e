// ddl-agent's settings file and its checks (agent_config.h).
#include "worker/agent_config.h"

#include <sstream>

#include "common/host_port.h"
#include "common/json_config.h"
#include "common/rank_env.h"
#include "common/resources.h"

namespace ddl::worker {

// The keys, in the order the unknown-key message lists them.
DDL_JSON_CONFIG(AgentConfig, coordinator, node, address, labels, virtual_gpus, virtual_topology,
                force_virtual, data_dir, log_retention_hours, log_max_mb, log_disk_min_free_mb, port_first,
                port_last, stop_grace_s, stop_ranks_on_exit, log_level, pki_dir, insecure, tls_refresh_s,
                cpus, memory, cgroup_root, rank_env, numa_memory, health_check_program,
                health_check_interval_s, health_check_timeout_s)

namespace {

const ConfigHints& hints() {
  static const ConfigHints kHints = {
      {"coordinator", "a string \"HOST:PORT\" (or several: \"HOST:PORT,HOST:PORT\")"},
      {"labels", "an object of strings ({\"rack\": \"r1\"})"},
      {"data_dir", "a string (a directory)"},
      {"log_retention_hours", "a number of hours"},
      {"log_max_mb", "an integer number of MiB"},
      {"log_disk_min_free_mb", "an integer number of MiB"},
      {"pki_dir", "a string (a directory)"},
      {"port_first", "an integer port"},
      {"port_last", "an integer port"},
      {"stop_grace_s", "a number of seconds"},
      {"tls_refresh_s", "a number of seconds"},
      {"cpus", "a string, a CPU list (\"2-31\")"},
      {"memory", "a string, a size (\"200G\")"},
      {"cgroup_root", "a string (a cgroup directory, or \"none\")"},
      {"rank_env", "a list of variable names or prefixes ([\"SITE_SCRATCH\", \"SLURM_*\"])"},
  };
  return kHints;
}

}  // namespace

Status parseAgentConfig(const std::string& text, const std::string& origin, AgentConfig* config) {
  return parseJsonConfig(text, origin, config, hints());
}

Status loadAgentConfig(const std::string& path, AgentConfig* config) { return loadJsonConfig(path, config, hints()); }

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
  for (const std::string& one : splitAddressList(c.coordinator)) {
    if (StatusOr<HostPort> coordinator = parseHostPort(one, 1); !coordinator) {
      return bad("coordinator '" + one + "' is not HOST:PORT: " + coordinator.status().message() +
                 " (e.g. 10.0.0.1:7070, or several: HOST:PORT,HOST:PORT)");
    }
  }
  if (c.virtual_gpus < 0 || c.virtual_gpus > 64) return bad("virtual_gpus must be 0..64");
  if (c.numa_memory != "prefer" && c.numa_memory != "bind" && c.numa_memory != "none")
    return bad("numa_memory must be prefer, bind or none (got '" + c.numa_memory + "')");
  if (!c.health_check_program.empty() && c.health_check_program.front() != '/')
    return bad("health_check_program must be an absolute path (got '" + c.health_check_program + "')");
  if (!(c.health_check_interval_s >= 1 && c.health_check_interval_s <= 86400))
    return bad("health_check_interval_s must be between 1 and 86400");
  if (!(c.health_check_timeout_s > 0 && c.health_check_timeout_s <= 3600))
    return bad("health_check_timeout_s must be more than 0 and at most 3600");
  if (c.virtual_gpus > 0 && !c.virtual_topology.empty())
    return bad("give virtual_gpus or virtual_topology, not both (the topology says how many GPUs)");
  if (c.port_first < 1024 || c.port_last > 65535 || c.port_last <= c.port_first) {
    return bad("port_first..port_last must lie in 1024..65535 and hold at least 2 ports");
  }
  if (c.data_dir.empty()) return bad("data_dir is empty");
  if (!(c.stop_grace_s >= 0)) return bad("stop_grace_s must be >= 0");
  if (!(c.log_retention_hours >= 0 && c.log_retention_hours <= 24 * 3650)) {
    return bad("log_retention_hours must be between 0 (keep forever) and 87600 (ten years)");
  }
  if (c.log_max_mb < 0) return bad("log_max_mb must be >= 0 (0: no bound)");
  if (c.log_disk_min_free_mb < 0 || c.log_disk_min_free_mb > (int64_t{1} << 30))
    return bad("log_disk_min_free_mb must be 0 (no warning) to 1073741824 (1 PiB)");
  if (c.pki_dir.empty() && !c.insecure) return bad("pki_dir is empty");
  if (!(c.tls_refresh_s >= 1 && c.tls_refresh_s <= 86400)) return bad("tls_refresh_s must be between 1 and 86400");
  std::vector<int> cpus;
  if (std::string why = parseCpuList(c.cpus, &cpus); !why.empty())
    return bad("cpus '" + c.cpus + "': " + why);
  for (const std::string& entry : c.rank_env) {
    if (std::string why = agentEnvEntryProblem(entry); !why.empty()) return bad("rank_env: " + why);
  }
  int64_t memory = 0;
  if (!c.memory.empty())
    if (std::string why = parseByteSize(c.memory, &memory); !why.empty())
      return bad("memory '" + c.memory + "': " + why);
  return Status::ok();
}

}  // namespace ddl::worker
