// ddl-agent: one per GPU node. Reads its settings (worker/agent_config.h), takes the node's inventory, and
// serves the coordinator until SIGTERM or SIGINT (worker/agent.h).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <filesystem>
#include <thread>

#include "worker/agent.h"

#ifdef DDL_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

using namespace ddl::worker;

int main(int argc, char** argv) {
  CLI::App app{"ddl-agent: registers this node with ddl-coordinator and runs the ranks it is given"};
  std::string config_path, labels;
  std::optional<std::string> coordinator, node, address, data_dir, log_level, port_range;
  std::optional<int> virtual_gpus;
  bool force_virtual = false, stop_ranks_on_exit = false;
  app.add_option("--config", config_path, "JSON config file (e.g. /etc/ddl/agent.json)");
  app.add_option("--coordinator", coordinator, "ddl-coordinator's HOST:PORT (default 127.0.0.1:7070)");
  app.add_option("--node", node, "this node's name (default: the host name)");
  app.add_option("--address", address, "address other nodes reach this node's ranks at (default: the local "
                                       "address toward the coordinator)");
  app.add_option("--labels", labels, "node labels, e.g. rack=r1,switch=s1");
  app.add_option("--virtual-gpus", virtual_gpus, "GPUs to make up where NVML finds none (development, tests)");
  app.add_flag("--force-virtual", force_virtual, "use the virtual GPUs even where NVML finds real ones");
  app.add_option("--data-dir", data_dir, "directory for rank logs (default /var/lib/ddl/agent)");
  app.add_option("--port-range", port_range, "rendezvous ports for jobs rooted here, FIRST-LAST (default 29500-29999)");
  app.add_flag("--stop-ranks-on-exit", stop_ranks_on_exit,
               "stop this node's ranks when the agent exits (default: leave them running for the next agent to "
               "adopt)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error (default info)");
  CLI11_PARSE(app, argc, argv);

  AgentConfig config;
  auto fail = [](const std::string& message) {
    spdlog::critical("{}", message);
    return 1;
  };
  if (!config_path.empty()) {
    if (auto st = loadAgentConfig(config_path, &config); !st) return fail(st.message());
  }
  if (coordinator) config.coordinator = *coordinator;
  if (node) config.node = *node;
  if (address) config.address = *address;
  if (!labels.empty()) {
    if (auto st = parseLabels(labels, &config.labels); !st) return fail(st.message());
  }
  if (virtual_gpus) config.virtual_gpus = *virtual_gpus;
  if (force_virtual) config.force_virtual = true;
  if (stop_ranks_on_exit) config.stop_ranks_on_exit = true;
  if (data_dir) config.data_dir = *data_dir;
  if (log_level) config.log_level = *log_level;
  if (port_range) {
    if (std::sscanf(port_range->c_str(), "%d-%d", &config.port_first, &config.port_last) != 2) {
      return fail("--port-range '" + *port_range + "' is not FIRST-LAST (e.g. 29500-29999)");
    }
  }
  if (config.node.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    config.node = host;
  }
  if (auto st = validateAgentConfig(config); !st) return fail("bad setting: " + st.message());
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  std::error_code ec;
  std::filesystem::create_directories(config.data_dir + "/logs", ec);
  if (ec) return fail("cannot create " + config.data_dir + "/logs: " + ec.message());

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  Inventory inventory = takeInventory(config.node, config.virtual_gpus, config.force_virtual);
  if (inventory.gpus.empty()) {
    spdlog::warn("no GPU found ({}); give --virtual-gpus N to offer virtual ones", inventory.gpu_source);
  }
  Agent agent(config, inventory);
  spdlog::info("ddl-agent {} for coordinator {}, advertising {}", config.node, config.coordinator, agent.address());
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (config.stop_ranks_on_exit) {
      spdlog::info("{}: stopping (ranks get {} s to exit)", strsignal(sig), config.stop_grace_s);
    } else {
      spdlog::info("{}: stopping; ranks keep running for the next ddl-agent to adopt", strsignal(sig));
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
