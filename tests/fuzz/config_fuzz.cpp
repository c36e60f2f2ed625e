// Fuzzes both daemons' settings files (coordinator/daemon/config.h, worker/agent_config.h): the JSON text an
// operator writes, read through common/json_config. The first byte picks the daemon ("a" the agent, else the
// coordinator); the rest is the file.
//
// Checks: nothing crashes; a refused file leaves the settings exactly as they were (a bad file changes
// nothing); what is accepted passes or fails validation with a message, never an exception.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "daemon/config.h"
#include "worker/agent_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] != 'a') {  // "a": the agent's file; anything else: the coordinator's
    ddl::coordinator::DaemonConfig config, before;
    auto st = ddl::coordinator::parseConfig(text, "fuzz.json", &config);
    if (!st && (config.listen != before.listen || config.data_dir != before.data_dir ||
                config.port_first != before.port_first ||
                config.history_retention_days != before.history_retention_days)) {
      std::fprintf(stderr, "config_fuzz: a refused coordinator file changed the settings\n");
      std::abort();
    }
    if (st) (void)ddl::coordinator::validateConfig(config);
  } else {
    ddl::worker::AgentConfig config, before;
    auto st = ddl::worker::parseAgentConfig(text, "fuzz.json", &config);
    if (!st && (config.coordinator != before.coordinator || config.data_dir != before.data_dir)) {
      std::fprintf(stderr, "config_fuzz: a refused agent file changed the settings\n");
      std::abort();
    }
    if (st) (void)ddl::worker::validateAgentConfig(config);
  }
  return 0;
}
