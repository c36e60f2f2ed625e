// The environment of one rank: the one place that says which variables a rank process gets, used by ddlrun
// (ranks on this machine), by ddl-coordinator (ranks of a job: rankEnvironment and arrayEnvironment) and by
// ddl-agent (what only the node knows: nodeEnvironment; the account a rank runs as: accountEnvironment).
//
// A rank gets libddl's DDL_* rendezvous variables (what ddlCommInitFromEnv reads) and the torchrun names that
// torch.distributed's env:// init reads, so existing training scripts run unchanged. Both rendezvous servers
// run on rank 0's host at once when a script uses torch.distributed and libddl directly, so they get two
// different ports: DDL_ROOT's for libddl's store and MASTER_PORT for torch's TCPStore. (torch_ddl itself
// needs neither port of libddl: its communicators meet through torch's own store.)
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ddl {

struct RankEnvSpec {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;  // among the ranks on this node
  int local_size = 1;
  std::string topology;    // DDL_TOPOLOGY ("2x4"); empty: not set (flat)
  std::string root_host;   // rank 0's host: DDL_ROOT's and MASTER_ADDR's
  int root_port = 0;       // DDL_ROOT's port: libddl's rendezvous store
  int master_port = 0;     // MASTER_PORT: torch's store; must differ from root_port
  std::string job_id;      // DDL_JOB_ID and DDL_JOB_ATTEMPT when non-empty (jobs of the coordinator)
  int attempt = 0;
  // DDL_JOB_SECRET when non-empty: the key that admits a process to the job's rendezvous store (libddl's
  // TcpStore answers only peers that prove they hold it). Made afresh for each launch, never on a command line.
  std::string secret;
};

// The variables of spec's rank, in a fixed order: DDL_RANK, DDL_WORLD_SIZE, DDL_LOCAL_RANK, DDL_LOCAL_SIZE,
// DDL_ROOT, DDL_TOPOLOGY (when set), DDL_JOB_ID and DDL_JOB_ATTEMPT (when set), DDL_JOB_SECRET (when set), then RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
std::vector<std::pair<std::string, std::string>> rankEnvironment(const RankEnvSpec& spec);

// A job of an array (ddlctl submit --array): DDL_ARRAY_JOB_ID and DDL_ARRAY_INDEX; nothing for another job
// (array_id empty).
std::vector<std::pair<std::string, std::string>> arrayEnvironment(const std::string& array_id,
                                                                  int array_index);

// What the rank's node adds: CUDA_VISIBLE_DEVICES (the GPU's UUID, where gpu_uuid is set: not the index,
// which CUDA_DEVICE_ORDER may renumber), DDL_GPU (the index the agent gave the rank) and DDL_AGENT_SOCKET
// (the agent's telemetry socket, where it listens) and DDL_PREEMPT_DEADLINE_FILE (where the agent writes
// the deadline of a preemption, unix seconds, before it signals the rank: torch_ddl.StopSignal reads it),
// DDL_NET_DEVICE (the NIC nearest the rank's GPU) and UCX_NET_DEVICES (the same, where the agent says so).
struct RankNodeSpec {
  int gpu = -1;
  std::string gpu_uuid;      // empty: CUDA_VISIBLE_DEVICES is not set (a node of virtual GPUs)
  std::string agent_socket;  // empty: not set
  std::string preempt_deadline_file;  // empty: not set
  std::string net_device;             // the NIC nearest the GPU, as UCX names it ("mlx5_0:1"); empty: not set
  bool set_ucx_net_devices = false;   // also as UCX_NET_DEVICES (the NIC exists and nobody chose another)
};
std::vector<std::pair<std::string, std::string>> nodeEnvironment(const RankNodeSpec& spec);

// What the account a rank runs as says of itself (ddl-agent running ranks as their users). SHELL, where the
// account has one, is a default that the job's env may override (a preference, not an identity: service
// accounts often have nologin); HOME, USER and LOGNAME are the account's whatever the job's env says (a
// program must be able to trust them to say who it runs as). The agent applies `defaults` before the job's
// env and `identity` after it.
struct RankAccountSpec {
  std::string name;
  std::string home;
  std::string shell;  // empty: SHELL is left as it is
};
struct RankAccountEnvironment {
  std::vector<std::pair<std::string, std::string>> defaults;  // SHELL (when set)
  std::vector<std::pair<std::string, std::string>> identity;  // HOME, USER, LOGNAME
};
RankAccountEnvironment accountEnvironment(const RankAccountSpec& spec);

// True for a variable ddl sets in a rank's environment itself: every DDL_* name, and the torchrun and CUDA
// names of rankEnvironment and nodeEnvironment (RANK ... MASTER_PORT, CUDA_VISIBLE_DEVICES). A copy of a
// submitter's shell (ddlctl submit --export ALL, say inside another job) must not carry them in. Not the
// account's variables: those are the agent's to set whatever a job's env says.
bool isRankVariable(std::string_view name);
// Every name rankEnvironment, nodeEnvironment and arrayEnvironment may write.
std::vector<std::string> launchVariableNames();

// What of ddl-agent's own environment its ranks inherit. The agent's environment is not the job's: it may
// hold its operator's credentials (DDL_TOKEN, a cloud key exported in the shell that started it). So a rank
// gets only the variables an allow-list names: kAgentEnvAllowed (the system's basics, the transports' and
// CUDA's settings, libddl's own settings such as DDL_TUNE_FILE, which operators set for every rank of a node
// in /etc/default/ddl-agent), and the operator's additions (agent.json rank_env, --rank-env). An entry is a
// name, or a prefix ending in '*'. ddlctl's credentials (DDL_TOKEN, DDL_TOKEN_FILE) never pass, whatever the
// list.
inline const std::vector<std::string> kAgentEnvAllowed = {
    "PATH", "LANG", "LANGUAGE", "LC_*", "TZ", "TMPDIR", "HOME", "USER", "LOGNAME", "SHELL", "LD_LIBRARY_PATH",
    "UCX_*", "CUDA_*", "NCCL_*", "NVIDIA_*", "OMP_NUM_THREADS", "SSL_CERT_FILE", "SSL_CERT_DIR",
    // A site's proxies, in both spellings programs read.
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
    // libddl's settings (README, "Settings": rank_env_test checks that every one there is here, but those a
    // rank's launch sets itself).
    "DDL_ALGO", "DDL_DEBUG", "DDL_DEVICE_SCHEME", "DDL_KEEPALIVE_MS", "DDL_NODE_BLOCKS",
    "DDL_NODE_SLOT_BYTES", "DDL_NODE_TAG", "DDL_SEGMENT_BYTES", "DDL_SHM", "DDL_SHM_ROUND_BYTES",
    "DDL_TIMEOUT_MS", "DDL_TUNE_FILE", "DDL_WAIT"};
// Why `entry` cannot be an allow-list entry (a variable name, or one's prefix then '*'), or "".
std::string agentEnvEntryProblem(std::string_view entry);
// The entries of `environ` ("NAME=value") that `allowed` lets through, in their order; with `withheld`, the
// names of the others (for the agent's log: names only, never values).
std::vector<std::string> inheritedEnvironment(const std::vector<std::string>& environ,
                                              const std::vector<std::string>& allowed,
                                              std::vector<std::string>* withheld = nullptr);

// A fresh job secret: 32 bytes from the system's random source, as 64 hex digits. Empty if the source fails.
std::string newJobSecret();

}  // namespace ddl
