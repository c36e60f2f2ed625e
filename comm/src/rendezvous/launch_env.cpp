// launchEnvironment (launch_env.h): a rank's rank, world size and rendezvous address from whichever launcher
// started it (ddl, torchrun, Slurm, Open MPI or PMI), in the header's order.
#include "rendezvous/launch_env.h"

#include "common/host_port.h"
#include "env.h"
#include "error.h"

namespace ddl {

namespace {

constexpr int kMaxRanks = 1 << 15;

struct Pair {
  int rank;
  int size;
};

// Rank and size from two variables; nullopt-like {-1,-1} when neither is set; throws when one is missing or
// bad.
Pair rankAndSize(const std::function<std::string(const char*)>& get, const char* rank_var,
                 const char* size_var) {
  const std::string r = get(rank_var), n = get(size_var);
  if (r.empty() && n.empty()) return {-1, -1};
  if (r.empty() || n.empty()) {
    fail(ddlInvalidArgument, std::string(r.empty() ? rank_var : size_var) + " is not set but " +
                                 (r.empty() ? size_var : rank_var) + " is: set both, or neither");
  }
  const int size = static_cast<int>(parseInt(n, size_var, 1, kMaxRanks));
  const int rank = static_cast<int>(parseInt(r, rank_var, 0, size - 1));
  return {rank, size};
}

int portOf(const std::string& text, const char* what) {
  return static_cast<int>(parseInt(text, what, 1, 65535));
}

}  // namespace

std::string firstSlurmHost(const std::string& nodelist) {
  // The first entry: up to a ',' outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string entry = nodelist.substr(0, end);
  // Each "[01-04,07]" becomes its first number, zero padding kept: "rack[3,5]-gpu[2-4]" -> "rack3-gpu2".
  std::string host;
  for (size_t i = 0; i < entry.size();) {
    if (entry[i] == ']') return "";
    if (entry[i] != '[') {
      host += entry[i++];
      continue;
    }
    const size_t close = entry.find(']', i);
    if (close == std::string::npos || host.empty()) return "";
    std::string inside = entry.substr(i + 1, close - i - 1);
    inside = inside.substr(0, inside.find_first_of(",-"));
    if (inside.empty()) return "";
    host += inside;
    i = close + 1;
  }
  return host;
}

LaunchEnv launchEnvironment(const std::function<std::string(const char*)>& get) {
  LaunchEnv env;
  const std::string ddl_port = get("DDL_PORT");
  // 1. ddl's own launchers.
  if (Pair p = rankAndSize(get, "DDL_RANK", "DDL_WORLD_SIZE"); p.rank >= 0) {
    env = {p.rank, p.size, get("DDL_ROOT"), "ddl"};
    if (env.root.empty()) fail(ddlInvalidArgument, "DDL_RANK and DDL_WORLD_SIZE are set but DDL_ROOT is not");
    return env;
  }
  // 2. torchrun.
  if (Pair p = rankAndSize(get, "RANK", "WORLD_SIZE"); p.rank >= 0) {
    env = {p.rank, p.size, get("DDL_ROOT"), "torchrun"};
    if (env.root.empty()) {
      const std::string addr = get("MASTER_ADDR"), port = get("MASTER_PORT");
      if (addr.empty() || (port.empty() && ddl_port.empty())) {
        fail(ddlInvalidArgument,
             "RANK and WORLD_SIZE (torchrun's) are set but MASTER_ADDR and MASTER_PORT are not (or set "
             "DDL_ROOT)");
      }
      // torch's own store listens on MASTER_PORT: libddl's takes the next one unless DDL_PORT says.
      const int p_store = ddl_port.empty() ? portOf(port, "MASTER_PORT") + 1 : portOf(ddl_port, "DDL_PORT");
      if (p_store > 65535) fail(ddlInvalidArgument, "MASTER_PORT is 65535: set DDL_PORT for libddl's store");
      env.root = formatHostPort(addr, p_store);
    }
    return env;
  }
  // 3. Slurm.
  if (Pair p = rankAndSize(get, "SLURM_PROCID", "SLURM_NTASKS"); p.rank >= 0) {
    env = {p.rank, p.size, get("DDL_ROOT"), "slurm"};
    if (env.root.empty()) {
      const std::string nodelist =
          get("SLURM_JOB_NODELIST").empty() ? get("SLURM_NODELIST") : get("SLURM_JOB_NODELIST");
      const std::string host = firstSlurmHost(nodelist);
      if (host.empty()) {
        fail(ddlInvalidArgument, "SLURM_PROCID and SLURM_NTASKS are set but SLURM_JOB_NODELIST ('" +
                                     nodelist + "') names no first host (or set DDL_ROOT)");
      }
      int port = 0;
      if (!ddl_port.empty()) {
        port = portOf(ddl_port, "DDL_PORT");
      } else {
        const std::string job = get("SLURM_JOB_ID");
        const long long id = job.empty() ? 0 : parseInt(job, "SLURM_JOB_ID", 0, (1LL << 62));
        port = 29400 + static_cast<int>(id % 500);
      }
      env.root = formatHostPort(host, port);
    }
    return env;
  }
  // 4. MPI launchers: no host for rank 0 among their variables.
  for (const auto& [rank_var, size_var, name] :
       {std::tuple{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "open-mpi"},
        std::tuple{"PMI_RANK", "PMI_SIZE", "pmi"}}) {
    if (Pair p = rankAndSize(get, rank_var, size_var); p.rank >= 0) {
      env = {p.rank, p.size, get("DDL_ROOT"), name};
      if (env.root.empty() && !get("MASTER_ADDR").empty()) {
        const std::string port = ddl_port.empty() ? get("MASTER_PORT") : ddl_port;
        if (!port.empty())
          env.root = formatHostPort(get("MASTER_ADDR"), portOf(port, "DDL_PORT or MASTER_PORT"));
      }
      if (env.root.empty()) {
        fail(ddlInvalidArgument,
             std::string(rank_var) + " and " + size_var +
                 " are set, but an MPI launcher names no host for rank 0: pass DDL_ROOT=HOST:PORT "
                 "of rank 0's host to every rank (mpirun -x DDL_ROOT=node1:29500)");
      }
      return env;
    }
  }
  fail(ddlInvalidArgument,
       "no launcher's variables are set: ddlCommInitFromEnv reads DDL_RANK, DDL_WORLD_SIZE and DDL_ROOT "
       "(ddlrun, "
       "ddl-agent), or torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, or Slurm's SLURM_PROCID, "
       "SLURM_NTASKS and SLURM_JOB_NODELIST (srun), or OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/SIZE with "
       "DDL_ROOT "
       "(mpirun)");
}

}  // namespace ddl
