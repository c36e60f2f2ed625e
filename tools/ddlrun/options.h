// ddlrun's command line: the Options it parses into, the checks of every value, and the --help text. Pure
// functions over the arguments (--hostfile reads its file); launcher.h runs what they describe.
#pragma once

#include <string>
#include <vector>

#include "hosts.h"

namespace ddl::launcher {

constexpr int kMaxRanks = 1024;
constexpr int kDefaultGraceMs = 5000;

// A parsed command line. Empty strings mean "not given".
struct Options {
  int np = 0;
  std::string topology;    // --topology, exported as DDL_TOPOLOGY
  std::string algo;        // --algo, exported as DDL_ALGO
  std::string timeout_ms;  // --timeout-ms (validated digits), exported as DDL_TIMEOUT_MS
  std::string root;        // --root HOST:PORT; empty: 127.0.0.1 and a free port
  bool tag_output = true;
  int grace_ms = kDefaultGraceMs;
  std::vector<std::string> env;      // -x VAR=VALUE, in order; a later one for the same VAR wins
  std::vector<std::string> command;  // PROGRAM ARGS...
  // Across machines: -H / --hostfile; empty: every rank on this machine.
  std::vector<HostSlots> hosts;
  // --rsh: how to run a command on a host. BatchMode: a host without a key fails at once instead of asking
  // for a password nobody can type (ssh reads it from the terminal, not from the stdin ddlrun gives it).
  // ServerAlive: ssh gives up on a host that stopped answering within 30 s instead of TCP's hours.
  std::string rsh = "ssh -o BatchMode=yes -o ServerAliveInterval=10 -o ServerAliveCountMax=3";
  std::string remote_path;  // --remote-path: ddlrun on the hosts; "": the path this ddlrun was started by
  // Not an option: argv[0], set by main(). With a '/' it is the path the hosts' part is started by (a wrapper
  // or link as the user ran it, e.g. an emulator's wrapper); without, the hosts get /proc/self/exe.
  std::string started_as;
  // Set by the launcher on each host's ddlrun (--host-part), not by people: this host's ranks are global
  // ranks rank_offset.. of world_size; the root, MASTER_PORT, working directory and (on stdin) the secret are
  // given.
  bool host_part = false;
  int rank_offset = 0;
  int world_size = 0;
  int master_port = 0;
  int launcher_silence_ms = 30000;   // --host-silence-ms: a host part stops its ranks after this much silence
  bool help = false;                 // --help: print usage() and exit 0, ignore the rest
  bool version = false;              // --version: print "ddlrun <version>" and exit 0, ignore the rest
};

struct ParseResult {
  Options options;
  std::string error;  // non-empty: one line saying what is wrong ("ddlrun: ..."); exit 2
  bool ok() const { return error.empty(); }
};

// Parses the arguments after argv[0].
ParseResult parseArgs(const std::vector<std::string>& args);

// The full --help text, and the one-line reminder printed after an argument error.
const char* usage();
const char* usageSynopsis();

// "" if topology ("AxBxC", positive integers) describes exactly np ranks, else the error line.
std::string checkTopology(const std::string& topology, int np);

}  // namespace ddl::launcher
