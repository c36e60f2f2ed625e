// ddl-agent's settings: defaults, then the JSON config file (--config /etc/ddl/agent.json), then flags. Unknown
// keys and wrong types are errors naming the key.
//
// Threads: plain values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"

namespace ddl::worker {

struct AgentConfig {
  std::string coordinator = "127.0.0.1:7070";  // HOST:PORT of ddl-coordinator; several sharing etcd: A,B,C
  std::string node;                            // "" = this host's name
  std::string address;     // where other nodes reach this one's ranks; "" = the local address toward the coordinator
  std::map<std::string, std::string> labels;   // rack=r1, switch=s1, ...
  int virtual_gpus = 0;     // GPUs to make up when NVML finds none
  // Or virtual GPUs laid out as a built-in kind of node ("s822lc", "dgx-h100") or a JSON file describes
  // (worker/topology.h): NUMA nodes, NVLink islands and NICs for placement to use without a GPU.
  std::string virtual_topology;
  bool force_virtual = false;  // use virtual GPUs even where NVML finds real ones
  std::string data_dir = "/var/lib/ddl/agent";  // rank logs live under DATA_DIR/logs
  // Rank logs of jobs with no rank left on this node are deleted once their newest write is this old (0: kept
  // forever), and the oldest go first while all logs together exceed log_max_mb (0: no bound). See
  // worker/log_retention.h.
  double log_retention_hours = 7 * 24;
  int64_t log_max_mb = 0;
  // Below this much free space on the logs' disk the agent warns that ranks' output is being cut
  // (worker/log_retention.h logDiskWarning); 0: never.
  int64_t log_disk_min_free_mb = 256;
  int port_first = 29500;   // rendezvous ports for jobs whose rank 0 runs here
  int port_last = 29999;
  double stop_grace_s = 10;  // SIGTERM -> SIGKILL for ranks when the agent itself stops them
  // What the agent does with its ranks when it exits: false (default) leaves them running, so an agent
  // restart or upgrade does not kill a training job (the next agent adopts them from DATA_DIR/ranks); true
  // stops them first, with stop_grace_s.
  bool stop_ranks_on_exit = false;
  std::string log_level = "info";
  // Security (docs/security.md): mutual TLS with PKI_DIR/ca.crt, node.crt and node.key (whose name must be this
  // node's); plaintext only with insecure, and only toward a loopback coordinator.
  std::string pki_dir = "/etc/ddl/pki";
  bool insecure = false;
  double tls_refresh_s = 60;  // how often the certificate files are re-read (rotation without a restart)
  // What ranks may use, for jobs that ask for CPUs or memory per rank: a CPU list ("2-31": keep 0-1 for the
  // system) and a size ("200G"); "" = the agent's affinity and MemTotal.
  std::string cpus;
  std::string memory;
  // Where ranks' cgroups live (worker/confinement.h): "" = the agent's own cgroup, "none" = no cgroups.
  std::string cgroup_root;
  // A rank's memory and its CPUs' NUMA node (the node of its GPU, where placement could give it CPUs there):
  // "prefer" allocates there first and elsewhere when it is full (set_mempolicy); "bind" allows that node
  // only (cpuset.mems, with a delegated cgroup: placement counts memory per node, not per NUMA node, so a
  // rank may then be OOM-killed with memory free on the other socket); "none" leaves the kernel's default.
  std::string numa_memory = "prefer";
  // Variables of the agent's own environment that ranks inherit besides common/rank_env.h's kAgentEnvAllowed
  // (names, or prefixes ending in '*': "SITE_SCRATCH", "SLURM_*"). Nothing else of it reaches a rank.
  std::vector<std::string> rank_env;
  // The site's health check (worker/gpu_health.h): a program (absolute path, no arguments) run at start and
  // every health_check_interval_s, each run at most health_check_timeout_s; a failure drains the node with
  // its last line as the reason until it passes again. "": none.
  std::string health_check_program;
  double health_check_interval_s = 300;
  double health_check_timeout_s = 60;
};

// Reads the JSON object in `path` over `config`. Keys: coordinator, node, address, labels (object of
// strings), virtual_gpus, virtual_topology, force_virtual, data_dir, log_retention_hours, log_max_mb,
// log_disk_min_free_mb, port_first, port_last, stop_grace_s, stop_ranks_on_exit, log_level, pki_dir,
// insecure, tls_refresh_s, cpus, memory, cgroup_root, rank_env (a list of strings), health_check_program,
// health_check_interval_s, health_check_timeout_s.
Status loadAgentConfig(const std::string& path, AgentConfig* config);
Status parseAgentConfig(const std::string& text, const std::string& origin, AgentConfig* config);
// "rack=r1,switch=s1" into labels.
Status parseLabels(const std::string& text, std::map<std::string, std::string>* labels);
Status validateAgentConfig(const AgentConfig& config);

}  // namespace ddl::worker
