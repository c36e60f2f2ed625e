#include "common/rank_env.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>

#include "common/host_port.h"

namespace ddl {

std::vector<std::pair<std::string, std::string>> rankEnvironment(const RankEnvSpec& spec) {
  std::vector<std::pair<std::string, std::string>> env = {
      {"DDL_RANK", std::to_string(spec.rank)},
      {"DDL_WORLD_SIZE", std::to_string(spec.world_size)},
      {"DDL_LOCAL_RANK", std::to_string(spec.local_rank)},
      {"DDL_LOCAL_SIZE", std::to_string(spec.local_size)},
      {"DDL_ROOT", formatHostPort(spec.root_host, spec.root_port)},
  };
  if (!spec.topology.empty()) env.emplace_back("DDL_TOPOLOGY", spec.topology);
  if (!spec.job_id.empty()) {
    env.emplace_back("DDL_JOB_ID", spec.job_id);
    env.emplace_back("DDL_JOB_ATTEMPT", std::to_string(spec.attempt));
  }
  if (!spec.secret.empty()) env.emplace_back("DDL_JOB_SECRET", spec.secret);
  env.insert(env.end(), {
                            {"RANK", std::to_string(spec.rank)},
                            {"WORLD_SIZE", std::to_string(spec.world_size)},
                            {"LOCAL_RANK", std::to_string(spec.local_rank)},
                            {"LOCAL_WORLD_SIZE", std::to_string(spec.local_size)},
                            {"MASTER_ADDR", spec.root_host},
                            {"MASTER_PORT", std::to_string(spec.master_port)},
                        });
  return env;
}

std::vector<std::pair<std::string, std::string>> arrayEnvironment(const std::string& array_id,
                                                                  int array_index) {
  if (array_id.empty()) return {};
  return {{"DDL_ARRAY_JOB_ID", array_id}, {"DDL_ARRAY_INDEX", std::to_string(array_index)}};
}

std::vector<std::pair<std::string, std::string>> nodeEnvironment(const RankNodeSpec& spec) {
  std::vector<std::pair<std::string, std::string>> env;
  if (!spec.gpu_uuid.empty()) env.emplace_back("CUDA_VISIBLE_DEVICES", spec.gpu_uuid);
  env.emplace_back("DDL_GPU", std::to_string(spec.gpu));
  if (!spec.agent_socket.empty()) env.emplace_back("DDL_AGENT_SOCKET", spec.agent_socket);
  if (!spec.preempt_deadline_file.empty())
    env.emplace_back("DDL_PREEMPT_DEADLINE_FILE", spec.preempt_deadline_file);
  if (!spec.net_device.empty()) {
    env.emplace_back("DDL_NET_DEVICE", spec.net_device);
    if (spec.set_ucx_net_devices) env.emplace_back("UCX_NET_DEVICES", spec.net_device);
  }
  return env;
}

RankAccountEnvironment accountEnvironment(const RankAccountSpec& spec) {
  RankAccountEnvironment env;
  if (!spec.shell.empty()) env.defaults.emplace_back("SHELL", spec.shell);
  env.identity = {{"HOME", spec.home}, {"USER", spec.name}, {"LOGNAME", spec.name}};
  return env;
}

std::vector<std::string> launchVariableNames() {
  // The names the functions above write, read from them, so this list cannot fall behind theirs.
  RankEnvSpec rank;
  rank.topology = "1";
  rank.job_id = "j-1";
  rank.secret = "s";
  RankNodeSpec node;
  node.gpu_uuid = "GPU-0";
  node.agent_socket = "s";
  node.preempt_deadline_file = "f";
  std::vector<std::string> names;
  for (const auto& env : {rankEnvironment(rank), nodeEnvironment(node), arrayEnvironment("j-1", 0)}) {
    for (const auto& kv : env) names.push_back(kv.first);
  }
  return names;
}

bool isRankVariable(std::string_view name) {
  if (name.substr(0, 4) == "DDL_") return true;
  const std::vector<std::string> names = launchVariableNames();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string agentEnvEntryProblem(std::string_view entry) {
  std::string_view name = entry;
  if (!name.empty() && name.back() == '*') name.remove_suffix(1);
  const bool ok =
      !name.empty() && !(name[0] >= '0' && name[0] <= '9') &&
      std::all_of(name.begin(), name.end(), [](char c) {
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
      });
  if (ok) return "";
  return "'" + std::string(entry) + "' is not a variable name, or a name's prefix followed by '*' (UCX_*)";
}

std::vector<std::string> inheritedEnvironment(const std::vector<std::string>& environ,
                                              const std::vector<std::string>& allowed,
                                              std::vector<std::string>* withheld) {
  auto listed = [&](std::string_view name) {
    return std::any_of(allowed.begin(), allowed.end(), [&](const std::string& entry) {
      if (!entry.empty() && entry.back() == '*')
        return name.substr(0, entry.size() - 1) == std::string_view(entry).substr(0, entry.size() - 1);
      return name == entry;
    });
  };
  std::vector<std::string> out;
  for (const std::string& e : environ) {
    const size_t eq = e.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    const std::string_view name = std::string_view(e).substr(0, eq);
    if (listed(name) && name != "DDL_TOKEN" && name != "DDL_TOKEN_FILE") {
      out.push_back(e);
    } else if (withheld) {
      withheld->emplace_back(name);
    }
  }
  return out;
}

std::string newJobSecret() {
  unsigned char bytes[32];
  size_t got = 0;
  for (int tries = 0; got < sizeof(bytes) && tries < 8; ++tries) {
    ssize_t n = getrandom(bytes + got, sizeof(bytes) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
    else if (errno != EINTR) break;
  }
  if (got < sizeof(bytes)) return "";
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * sizeof(bytes));
  for (unsigned char b : bytes) {
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

}  // namespace ddl
