// ddlrun's command line (options.h): the usage text, each option's check, and parseArgs.
#include "options.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string_view>

#include "common/host_port.h"
#include "common/topology_dims.h"

namespace ddl::launcher {

namespace {

constexpr int kMaxGraceMs = 3600 * 1000;
constexpr long long kMaxTimeoutMs = 2147483647;  // ddlConfig_t::timeoutMs is an int

constexpr const char kUsageSynopsis[] =
    "usage: ddlrun -np N [--topology AxB...] [--algo A] [--timeout-ms T] [--root HOST:PORT]\n"
    "              [--tag-output|--no-tag-output] [--grace-ms MS] [-x VAR=VALUE]... -- PROGRAM [ARGS...]\n"
    "       ddlrun -H HOST:SLOTS,... | --hostfile FILE [-np N] [--rsh CMD] [options] -- PROGRAM [ARGS...]\n";

constexpr const char kUsage[] =
    "usage: ddlrun -np N [options] -- PROGRAM [ARGS...]\n"
    "\n"
    "Runs N ranks of PROGRAM on this machine as one ddl job. Rank r gets DDL_RANK=r, DDL_WORLD_SIZE=N,\n"
    "DDL_LOCAL_RANK=r, DDL_LOCAL_SIZE=N and DDL_ROOT=HOST:PORT (what ddlCommInitFromEnv reads), and the\n"
    "torchrun names RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. "
    "MASTER_PORT\n"
    "(torch.distributed's store) is another free port than DDL_ROOT's (libddl's), so a program may use "
    "both.\n"
    "Every rank also gets DDL_JOB_SECRET, made afresh for each run: libddl's rendezvous store at DDL_ROOT\n"
    "answers only processes that hold it.\n"
    "\n"
    "options:\n"
    "  -np N, -n N         number of ranks, 1 to 1024 (required on one machine; with hosts, default: every "
    "slot)\n"
    "  -H, --host LIST     run across machines: HOST:SLOTS,... (a host named again gets one more slot), as\n"
    "                      mpirun -H; ranks fill each host's slots in order. Every host runs ddlrun (see\n"
    "                      --remote-path) reached with --rsh, starts in this directory, and reaches the "
    "first\n"
    "                      host at the name given here: DDL_ROOT is FIRST_HOST:PORT, MASTER_PORT is PORT+1\n"
    "  --hostfile FILE     the hosts from a file: a line per host, HOST slots=N (Open MPI's form), HOST:N "
    "or\n"
    "                      HOST; # starts a comment\n"
    "  --rsh CMD           how to run a command on a host (default: ssh -o BatchMode=yes, with\n"
    "                      ServerAliveInterval=10 and ServerAliveCountMax=3); it gets HOST and one shell\n"
    "                      command, and must pass its stdin on (ssh does). A host whose launcher is silent "
    "for\n"
    "                      30 s (a network gone) stops its ranks\n"
    "  --remote-path PATH  ddlrun on the hosts (default: the path this ddlrun was started by, made "
    "absolute;\n"
    "                      when started by name from PATH, its own executable's path)\n"
    "  --topology AxB...   exported as DDL_TOPOLOGY; the dimensions must multiply to N\n"
    "  --algo NAME         exported as DDL_ALGO (auto, ring, mdring, rhd, shm)\n"
    "  --timeout-ms T      exported as DDL_TIMEOUT_MS\n"
    "  --root HOST:PORT    rendezvous address (DDL_ROOT); default 127.0.0.1 and a free port (with hosts:\n"
    "                      the first host and a port from 29400-29899)\n"
    "  -x VAR=VALUE        set VAR in every rank's environment; repeatable, the last one for a VAR wins\n"
    "                      (-x VAR alone is accepted: ranks inherit ddlrun's environment anyway)\n"
    "  --tag-output        prefix every output line with \"[rank] \" (the default)\n"
    "  --no-tag-output     pass output through unprefixed, still a whole line at a time\n"
    "  --grace-ms MS       when stopping ranks, wait MS after SIGTERM before SIGKILL (default 5000)\n"
    "  -h, --help          print this help\n"
    "  --version           print ddlrun's version\n"
    "Long options also take --option=VALUE.\n"
    "\n"
    "Each rank runs in its own process group. Its stdout and stderr go to ddlrun's stdout and\n"
    "stderr a whole line at a time. Rank 0 reads ddlrun's stdin unless that is a terminal; the other\n"
    "ranks read /dev/null.\n"
    "\n"
    "Exit status: 0 if every rank exits 0. When a rank exits non-zero or is killed, ddlrun sends\n"
    "SIGTERM to the other ranks' process groups, SIGKILL after the grace period, and exits with the\n"
    "first failing rank's status (128+S for signal S). SIGINT, SIGTERM or SIGHUP sent to ddlrun is\n"
    "forwarded to the ranks the same way and ddlrun exits 128+signal; a second one sends SIGKILL at\n"
    "once. 2: bad arguments; 125: ddlrun could not launch the ranks; 127: PROGRAM could not be executed.\n";

// Digits only, no sign, at most max; false for anything else.
bool parseBoundedInt(const std::string& text, long long max, long long* value) {
  if (text.empty() || text.size() > 12) return false;
  long long v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > max) return false;
  *value = v;
  return true;
}

bool isEnvName(std::string_view name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
  });
}

bool takesValue(const std::string& name) {
  static const char* const kValueOptions[] = {
      "-np", "-n", "--np",   "--topology", "--algo", "--root",        "--timeout-ms", "--grace-ms",
      "-x",  "-H", "--host", "--hostfile", "--rsh",  "--remote-path", "--host-part",  "--host-silence-ms"};
  return std::any_of(std::begin(kValueOptions), std::end(kValueOptions),
                     [&](const char* option) { return name == option; });
}

// Sets option `name` (one takesValue() accepts) from `value`; returns the error line or "".
std::string applyOption(const std::string& name, const std::string& value, Options* options) {
  long long number = 0;
  if (name == "-np" || name == "-n" || name == "--np") {
    if (!parseBoundedInt(value, kMaxRanks, &number) || number < 1) {
      return "ddlrun: -np must be an integer from 1 to " + std::to_string(kMaxRanks) + ", got '" + value +
             "'";
    }
    options->np = static_cast<int>(number);
  } else if (name == "--topology") {
    if (value.empty()) return checkTopology(value, kMaxRanks);  // the form error; the count is checked later
    options->topology = value;
  } else if (name == "--algo") {
    static const char* const kAlgos[] = {"auto", "ring", "mdring", "rhd", "shm"};
    if (std::find(std::begin(kAlgos), std::end(kAlgos), value) == std::end(kAlgos)) {
      return "ddlrun: --algo needs one of auto, ring, mdring, rhd, shm (got '" + value + "')";
    }
    options->algo = value;
  } else if (name == "--timeout-ms") {
    if (!parseBoundedInt(value, kMaxTimeoutMs, &number) || number < 1) {
      return "ddlrun: --timeout-ms must be a positive integer of milliseconds, got '" + value + "'";
    }
    options->timeout_ms = std::to_string(number);
  } else if (name == "--grace-ms") {
    if (!parseBoundedInt(value, kMaxGraceMs, &number)) {
      return "ddlrun: --grace-ms must be an integer from 0 to " + std::to_string(kMaxGraceMs) + ", got '" +
             value + "'";
    }
    options->grace_ms = static_cast<int>(number);
  } else if (name == "--root") {
    if (StatusOr<HostPort> root = parseHostPort(value, 1); !root) {
      return "ddlrun: --root must be HOST:PORT with a port from 1 to 65535, got '" + value +
             "': " + root.status().message();
    }
    options->root = value;
  } else if (name == "-x") {
    if (!isEnvName(std::string_view(value).substr(0, value.find('=')))) {
      return "ddlrun: -x needs VAR=VALUE with VAR a variable name, got '" + value + "'";
    }
    options->env.push_back(value);
  } else if (name == "-H" || name == "--host") {
    return parseHostList(value, &options->hosts);
  } else if (name == "--hostfile") {
    std::ifstream in(value);
    if (!in) return "ddlrun: cannot read the hostfile " + value + ": " + std::strerror(errno);
    std::stringstream text;
    text << in.rdbuf();
    return parseHostfile(text.str(), value, &options->hosts);
  } else if (name == "--rsh") {
    if (value.find_first_not_of(" \t") == std::string::npos)
      return "ddlrun: --rsh needs a command, as in --rsh ssh";
    options->rsh = value;
  } else if (name == "--remote-path") {
    if (value.empty()) return "ddlrun: --remote-path needs ddlrun's path on the hosts";
    options->remote_path = value;
  } else if (name == "--host-silence-ms") {  // the launcher's own option too (tests shorten it)
    if (!parseBoundedInt(value, 3600 * 1000, &number) || number < 100)
      return "ddlrun: --host-silence-ms must be 100 to 3600000, got '" + value + "'";
    options->launcher_silence_ms = static_cast<int>(number);
  } else if (name == "--host-part") {
    // OFFSET,WORLD,MASTER_PORT: written by the launcher (hostCommand), not by people.
    long long offset = 0, world = 0, port = 0;
    std::istringstream in(value);
    std::string a, b, c;
    if (!std::getline(in, a, ',') || !std::getline(in, b, ',') || !std::getline(in, c) ||
        !parseBoundedInt(a, kMaxRanks - 1, &offset) || !parseBoundedInt(b, kMaxRanks, &world) || world < 1 ||
        !parseBoundedInt(c, 65535, &port) || port < 1) {
      return "ddlrun: --host-part is OFFSET,WORLD,MASTER_PORT (the launcher's own option), got '" + value +
             "'";
    }
    options->host_part = true;
    options->rank_offset = static_cast<int>(offset);
    options->world_size = static_cast<int>(world);
    options->master_port = static_cast<int>(port);
  }
  return "";
}

ParseResult failure(std::string error) {
  ParseResult result;
  result.error = std::move(error);
  return result;
}

}  // namespace

ParseResult parseArgs(const std::vector<std::string>& args) {
  ParseResult result;
  Options& options = result.options;
  bool saw_separator = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      saw_separator = true;
      options.command.assign(args.begin() + i + 1, args.end());
      break;
    }
    if (arg == "-h" || arg == "--help") {
      options.help = true;
      return result;
    }
    if (arg == "--version") {
      options.version = true;
      return result;
    }
    std::string name = arg;
    std::optional<std::string> value;
    size_t equals = arg.find('=');
    if (arg.rfind("--", 0) == 0 && equals != std::string::npos) {
      name = arg.substr(0, equals);
      value = arg.substr(equals + 1);
    }
    if (name == "--tag-output" || name == "--no-tag-output") {
      if (value) return failure("ddlrun: option '" + name + "' takes no value; see ddlrun --help");
      options.tag_output = name == "--tag-output";
      continue;
    }
    if (!takesValue(name)) {
      if (arg.empty() || arg[0] != '-') {
        return failure("ddlrun: unexpected argument '" + arg +
                       "'; put '--' before the program to run: ddlrun -np N [options] -- PROGRAM [ARGS...]");
      }
      return failure("ddlrun: unknown option '" + name + "'; see ddlrun --help");
    }
    if (!value) {
      if (i + 1 >= args.size())
        return failure("ddlrun: option '" + name + "' needs a value; see ddlrun --help");
      value = args[++i];
    }
    std::string error = applyOption(name, *value, &options);
    if (!error.empty()) return failure(error);
  }
  if (!options.hosts.empty()) {
    if (options.host_part) return failure("ddlrun: --host-part runs one host's ranks; it takes no -H");
    const int slots = totalSlots(options.hosts);
    if (options.np == 0) options.np = std::min(slots, kMaxRanks);
    if (options.np > slots) {
      return failure("ddlrun: -np " + std::to_string(options.np) + " but the hosts have " +
                     std::to_string(slots) + (slots == 1 ? " slot" : " slots") +
                     "; give more with HOST:SLOTS (-H node1:4,node2:4)");
    }
  }
  if (options.np == 0) return failure("ddlrun: missing -np N, the number of ranks to launch (or -H hosts)");
  if (options.launcher_silence_ms != 30000 && !options.host_part)
    return failure("ddlrun: --host-silence-ms goes with --host-part (each host's own option)");
  if (options.host_part) {
    if (options.root.empty()) return failure("ddlrun: --host-part needs --root");
    if (options.rank_offset + options.np > options.world_size)
      return failure("ddlrun: --host-part's ranks go past its world size");
  }
  if (!saw_separator) return failure("ddlrun: missing '--' and the program to run after it");
  if (options.command.empty() || options.command[0].empty()) {
    return failure("ddlrun: missing the program to run after '--'");
  }
  if (!options.topology.empty()) {
    std::string error = checkTopology(options.topology, options.host_part ? options.world_size : options.np);
    if (!error.empty()) return failure(error);
  }
  return result;
}

const char* usage() { return kUsage; }
const char* usageSynopsis() { return kUsageSynopsis; }

std::string checkTopology(const std::string& topology, int np) {
  std::vector<int> dims;
  if (std::string why = parseTopologyDims(topology, &dims); !why.empty()) {
    return "ddlrun: --topology '" + topology + "' is not of the form AxBxC with positive integers (" + why +
           "; e.g. 2x4 for 8 ranks)";
  }
  if (const long long product = topologyRanks(dims); product != np) {
    return "ddlrun: --topology " + topology + " has " + std::to_string(product) + " ranks but -np is " +
           std::to_string(np);
  }
  return "";
}

}  // namespace ddl::launcher
