// ddl-agent: one per GPU node. Reads its settings (worker/agent_config.h), takes the node's inventory, and
// serves the coordinator over mutual TLS until SIGTERM or SIGINT (worker/agent.h). `ddl-agent join` gets the
// node's certificate with a one-time join token (worker/join.h).
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "common/flag_errors.h"
#include "common/host_port.h"
#include "common/pki.h"
#include "common/signals.h"
#include "common/version.h"
#include "worker/agent.h"
#include "worker/gpu_health.h"
#include "worker/join.h"
#include "worker/topology.h"

#ifdef DDL_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

using namespace ddl::worker;

namespace {

// One ddl-agent per data dir: it holds the rank states, the logs and agent.sock, which a second agent would
// adopt, interleave and unlink. An exclusive lock on DIR/agent.lock for the process's life (the kernel drops
// it when the process ends, however it ends); the file names the holder. "" when taken, else why not.
std::string lockDataDir(const std::string& dir) {
  const std::string path = dir + "/agent.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot open " + path + ": " + std::strerror(errno);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {};
    const ssize_t n = pread(fd, holder, sizeof(holder) - 1, 0);
    close(fd);
    if (err != EWOULDBLOCK) return "cannot lock " + path + ": " + std::strerror(err);
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    pid.erase(pid.find_last_not_of(" \n") + 1);
    return "another ddl-agent" + (pid.empty() ? std::string() : " (pid " + pid + ")") +
           " uses the data dir " + dir + ": stop it, or give this one a --data-dir of its own";
  }
  const std::string mine = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, mine.data(), mine.size(), 0) < 0) {
    spdlog::warn("cannot write the pid into {}: {}", path, std::strerror(errno));
  }
  return "";  // fd stays open: the lock lasts as long as this process
}

// The command line: each setting's flag, unset (or empty, or false) where not given, so that the settings
// file or the default stands; and `join`'s own.
struct Flags {
  std::string config_path, labels;
  std::optional<std::string> coordinator, node, address, data_dir, log_level, port_range;
  std::optional<int> virtual_gpus;
  std::optional<std::string> virtual_topology;
  bool inventory = false;
  std::optional<double> log_retention_hours;
  std::optional<int64_t> log_max_mb;
  bool force_virtual = false, stop_ranks_on_exit = false;
  std::optional<std::string> cpus, memory, cgroup_root;
  std::vector<std::string> rank_env;
  std::optional<std::string> pki_dir;
  bool insecure = false;
  JoinOptions join;
  std::string token_file;
};

// Declares ddl-agent's flags into *flags; returns the join subcommand.
CLI::App* declareFlags(CLI::App& app, Flags* flags) {
  Flags& f = *flags;
  app.add_option("--config", f.config_path, "JSON config file (e.g. /etc/ddl/agent.json)");
  app.add_option("--coordinator", f.coordinator,
                 "ddl-coordinator's HOST:PORT (default 127.0.0.1:7070), or several sharing an etcd store: "
                 "HOST:PORT,HOST:PORT");
  app.add_option("--node", f.node, "this node's name (default: the host name)");
  app.add_option("--address", f.address,
                 "address other nodes reach this node's ranks at (default: the local "
                 "address toward the coordinator)");
  app.add_option("--labels", f.labels, "node labels, e.g. rack=r1,switch=s1");
  app.add_option("--virtual-gpus", f.virtual_gpus,
                 "GPUs to make up where NVML finds none (development, tests)");
  app.add_option("--virtual-topology", f.virtual_topology,
                 std::string("virtual GPUs laid out as a node of this kind where NVML finds none: ") +
                     ddl::worker::builtinTopologies() + ", or a JSON file (docs/operations.md)")
      ->type_name("NAME|FILE");
  app.add_flag("--force-virtual", f.force_virtual, "use the virtual GPUs even where NVML finds real ones");
  app.add_flag(
      "--inventory", f.inventory,
      "print this node's GPUs (with their NUMA nodes, NVLink peers and nearest NICs), NICs and CPUs, "
      "then exit");
  app.add_option("--data-dir", f.data_dir, "directory for rank logs (default /var/lib/ddl/agent)");
  app.add_option("--log-retention-hours", f.log_retention_hours,
                 "delete a finished job's rank logs this long after their last write (default 168; 0: keep)");
  app.add_option("--log-max-mb", f.log_max_mb,
                 "delete the oldest finished jobs' rank logs while all exceed this "
                 "(default 0: no bound)");
  app.add_option("--port-range", f.port_range,
                 "rendezvous ports for jobs rooted here, FIRST-LAST (default 29500-29999)");
  app.add_flag(
      "--stop-ranks-on-exit", f.stop_ranks_on_exit,
      "stop this node's ranks when the agent exits (default: leave them running for the next agent to "
      "adopt)");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn or error (default info)");
  app.add_option("--cpus", f.cpus,
                 "the CPUs ranks may use, a list such as 2-31 (default: all the agent may run on)");
  app.add_option("--memory", f.memory, "the memory ranks may use in all, such as 200G (default: MemTotal)");
  app.add_option(
      "--cgroup-root", f.cgroup_root,
      "the cgroup v2 directory for ranks' cgroups (default: the agent's own, delegated by systemd); "
      "none: pin CPUs only");
  app.add_option("--rank-env", f.rank_env,
                 "more of the agent's environment for ranks, besides PATH, locale, UCX_*, CUDA_*, libddl's "
                 "settings...: names or prefixes, comma-separated (SITE_SCRATCH,SLURM_*)")
      ->delimiter(',');
  app.add_option("--pki-dir", f.pki_dir, "ca.crt, node.crt and node.key of this node (default /etc/ddl/pki)");
  app.add_flag("--insecure", f.insecure,
               "plaintext toward a coordinator on loopback run with --insecure "
               "(development only)");
  CLI::App* join_cmd = app.add_subcommand("join", "get this node's certificate with a one-time join token "
                                                  "(ddlctl admin join-token), then exit");
  join_cmd
      ->add_option("--token-file", f.token_file, "file holding the join token (never on the command line)")
      ->required();
  join_cmd->add_option("--ca-sha256", f.join.ca_sha256, "the cluster CA's SHA-256, printed with the token")
      ->required();
  app.set_version_flag("--version", std::string("ddl-agent ") + ddl::kVersion, "print the version and exit");
  app.require_subcommand(0, 1);
  return join_cmd;
}

int fail(const std::string& message) {
  spdlog::critical("{}", message);
  return 1;
}

// The settings: the file's (--config), then each flag given over it, and the host name for an unnamed node.
// "" when they could be read, else why not.
std::string loadSettings(const Flags& f, AgentConfig* config) {
  if (!f.config_path.empty()) {
    if (auto st = loadAgentConfig(f.config_path, config); !st) return st.message();
  }
  if (f.coordinator) config->coordinator = *f.coordinator;
  if (f.node) config->node = *f.node;
  if (f.address) config->address = *f.address;
  if (!f.labels.empty()) {
    if (auto st = parseLabels(f.labels, &config->labels); !st) return st.message();
  }
  if (f.virtual_gpus) config->virtual_gpus = *f.virtual_gpus;
  if (f.virtual_topology) config->virtual_topology = *f.virtual_topology;
  if (f.force_virtual) config->force_virtual = true;
  if (f.stop_ranks_on_exit) config->stop_ranks_on_exit = true;
  if (f.data_dir) config->data_dir = *f.data_dir;
  if (f.log_retention_hours) config->log_retention_hours = *f.log_retention_hours;
  if (f.log_max_mb) config->log_max_mb = *f.log_max_mb;
  if (f.log_level) config->log_level = *f.log_level;
  if (f.port_range) {
    if (std::sscanf(f.port_range->c_str(), "%d-%d", &config->port_first, &config->port_last) != 2) {
      return "--port-range '" + *f.port_range + "' is not FIRST-LAST (e.g. 29500-29999)";
    }
  }
  if (f.pki_dir) config->pki_dir = *f.pki_dir;
  if (f.insecure) config->insecure = true;
  if (f.cpus) config->cpus = *f.cpus;
  if (f.memory) config->memory = *f.memory;
  if (f.cgroup_root) config->cgroup_root = *f.cgroup_root;
  config->rank_env.insert(config->rank_env.end(), f.rank_env.begin(), f.rank_env.end());
  if (config->node.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    config->node = host;
  }
  return "";
}

// ddl-agent join: the node's certificate for a one-time token, then exit.
int runJoin(const Flags& f, const AgentConfig& config) {
  JoinOptions join = f.join;
  std::string error;
  auto token = ddl::pki::readFile(f.token_file, &error);
  if (!token) return fail(error);
  while (!token->empty() && std::isspace(static_cast<unsigned char>(token->back()))) token->pop_back();
  join.node = config.node;
  join.token = *token;
  join.pki_dir = config.pki_dir;
  // Several coordinators: the one that leads answers; the others do not listen.
  ddl::Status st;
  for (const std::string& coordinator : ddl::splitAddressList(config.coordinator)) {
    join.coordinator = coordinator;
    st = joinCluster(join);
    if (st || st.code() != ddl::StatusCode::kUnavailable) break;
  }
  if (!st) return fail("join: " + st.message());
  std::printf("node %s joined: its certificate and key are in %s; start ddl-agent\n", config.node.c_str(),
              config.pki_dir.c_str());
  return 0;
}

// The node's inventory as the settings shape it: GPUs, NICs, CPUs and memory and where they sit.
std::string inventoryOf(const AgentConfig& config, Inventory* inventory) {
  InventoryOptions options;
  options.virtual_gpus = config.virtual_gpus;
  options.force_virtual = config.force_virtual;
  options.virtual_topology = config.virtual_topology;
  if (const char* sys = std::getenv("DDL_SYSFS_ROOT"); sys && *sys) options.sys = sys;  // tests' own tree
  if (std::string why = takeInventory(config.node, options, inventory); !why.empty()) return why;
  return offerCpusAndMemory(config.cpus, config.memory, inventory);
}

// `ddl-agent --inventory`: what the agent would offer, for a person; 0, or 1 with why it cannot.
int printInventory(const AgentConfig& config) {
  Inventory inventory;
  if (std::string why = inventoryOf(config, &inventory); !why.empty()) return fail("bad setting: " + why);
  std::string cpus;
  for (size_t i = 0; i < inventory.cpus.size(); ++i) {
    cpus += (i ? " " : "") + std::to_string(inventory.cpus[i]);
    if (i < inventory.cpu_numa.size()) cpus += "@" + std::to_string(inventory.cpu_numa[i]);
  }
  std::printf("node %s: %s; topology %s\n%scpus (id@numa): %s\nmemory: %lld bytes\n", config.node.c_str(),
              inventory.gpu_source.c_str(),
              inventory.topology.empty() ? "unknown" : inventory.topology.c_str(),
              describeTopology(inventory.gpus, inventory.nics).c_str(), cpus.c_str(),
              static_cast<long long>(inventory.memory_bytes));
  // What NVML says of the GPUs' health now (real GPUs only): the faults the agent would report.
  if (!inventory.virtual_gpus) {
    std::unique_ptr<GpuHealth> health = GpuHealth::open(static_cast<int>(inventory.gpus.size()));
    std::vector<ddl::v1::GpuFault> faults;
    if (health) faults = health->poll(0);
    std::printf("health: %s\n", !health          ? "unknown (NVML cannot be opened to watch it)"
                                : faults.empty() ? "every GPU ok"
                                                 : "");
    for (const ddl::v1::GpuFault& f : faults)
      std::printf("  gpu %d: FAULT: %s\n", f.gpu(), f.reason().c_str());
    if (health && !health->slowdown().empty()) std::printf("  %s\n", health->slowdown().c_str());
  }
  return 0;
}

// The agent itself: checks the settings and the node's certificate, takes the data dir and the inventory,
// and serves the coordinator until SIGTERM or SIGINT.
int serve(const AgentConfig& config) {
  if (auto st = validateAgentConfig(config); !st) return fail("bad setting: " + st.message());
  if (config.insecure) {
    for (const std::string& coordinator : ddl::splitAddressList(config.coordinator)) {
      if (auto why = ddl::tls::checkInsecure(coordinator, "ddl-agent"); !why.empty()) return fail(why);
    }
    spdlog::warn("--insecure: plaintext toward the coordinator; this node is not authenticated");
  } else if (auto why = ddl::tls::checkFiles(tlsFiles(config),
                                             "make them with 'ddlctl admin issue-node " + config.node +
                                                 " --out DIR' or 'ddl-agent join' (docs/security.md)");
             !why.empty()) {
    return fail(why);
  }
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  std::error_code ec;
  std::filesystem::create_directories(config.data_dir + "/logs", ec);
  if (ec) return fail("cannot create " + config.data_dir + "/logs: " + ec.message());
  if (std::string why = lockDataDir(config.data_dir); !why.empty()) return fail(why);

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  Inventory inventory;
  if (std::string why = inventoryOf(config, &inventory); !why.empty()) return fail("bad setting: " + why);
  if (inventory.gpus.empty()) {
    spdlog::warn("no GPU found ({}); give --virtual-gpus N or --virtual-topology NAME to offer virtual ones",
                 inventory.gpu_source);
  }
  Agent agent(config, inventory);
  spdlog::info("ddl-agent {} for coordinator {}, advertising {}", config.node, config.coordinator, agent.address());
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (config.stop_ranks_on_exit) {
      spdlog::info("{}: stopping (ranks get {} s to exit)", ddl::signalName(sig), config.stop_grace_s);
    } else {
      spdlog::info("{}: stopping; ranks keep running for the next ddl-agent to adopt", ddl::signalName(sig));
    }
#ifdef DDL_HAVE_SYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
    agent.stop(static_cast<int>(config.stop_grace_s * 1000));
  });
#ifdef DDL_HAVE_SYSTEMD
  sd_notify(0, "READY=1");  // Type=notify unit (deploy/systemd/); a no-op outside systemd
#endif
  agent.run();
  waiter.join();
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddl-agent: registers this node with ddl-coordinator and runs the ranks it is given"};
  Flags flags;
  CLI::App* join_cmd = declareFlags(app, &flags);
  // Mistakes are said for a person, with the nearest real flag (common/flag_errors.h), as ddlctl does.
  if (const int parsed = ddl::parseFlags(app, argc, argv); parsed >= 0) return parsed;

  AgentConfig config;
  if (std::string why = loadSettings(flags, &config); !why.empty()) return fail(why);
  if (join_cmd->parsed()) return runJoin(flags, config);
  if (flags.inventory) {
    if (auto st = validateAgentConfig(config); !st) return fail("bad setting: " + st.message());
    return printInventory(config);
  }
  return serve(config);
}
