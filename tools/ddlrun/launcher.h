// ddlrun's launcher: runs N ranks of a program on this machine, the way mpirun or torchrun would on one node,
// or across machines (-H node1:4,node2:4, --hostfile): then it starts one ddlrun per host over ssh (--rsh),
// which runs that host's ranks as below, and supervises those as it would ranks. The job's secret travels on
// each ssh's stdin, never on a command line; a host's ddlrun stops its ranks when that stdin closes (the
// launcher stopped, or the connection died), so no rank outlives the launcher on any host.
//
// Each rank is a forked process in its own process group, with the DDL_* rendezvous variables that
// ddlCommInitFromEnv reads (and the torchrun names, so PyTorch-style programs work unchanged). Its stdout and
// stderr come back through pipes and are re-emitted whole line by whole line with a "[rank] " prefix, so the
// output of different ranks never mixes mid-line. The first rank to fail decides the exit status and takes
// the others down (SIGTERM to each rank's process group, SIGKILL after a grace period): a collective job in
// which one rank is gone cannot finish, and the survivors would otherwise sit in a collective until their
// timeout. Every wait is bounded once a stop has begun, so ddlrun itself never hangs on a rank.
//
// The pieces with no I/O (argument parsing, the rank environment, line tagging, exit-status naming) are
// separate functions so they can be read and tested on their own; run() is the process-owning event loop.
//
// Threads: everything here is called from the main thread. While it runs, run() owns the process's SIGCHLD,
// SIGINT, SIGTERM, SIGHUP and SIGPIPE handling (restored after); it waits only for the children it forks.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/signals.h"
#include "hosts.h"

namespace ddl::launcher {

constexpr int kMaxRanks = 1024;
constexpr int kDefaultGraceMs = 5000;
// Exit status when ddlrun itself fails after parsing (no free port, no fork or pipe), as in timeout(1).
constexpr int kLaunchFailureStatus = 125;
// A rank line longer than this is emitted in pieces, so one rank cannot make ddlrun buffer without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;

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
  std::string remote_path;  // --remote-path: ddlrun on the hosts; "": this ddlrun's own path
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

// The command that starts one host's part of a run across machines: the --rsh words, the host, and one shell
// command (quoted for the host's shell) running remote_ddlrun with --host-part and the run's settings. The
// secret is not in it: it goes to the command's stdin. root is DDL_ROOT ("HOST:PORT"), wdir the directory the
// host's ranks start in.
std::vector<std::string> hostCommand(const Options& options, const HostPart& part, const std::string& root,
                                     int master_port, const std::string& remote_ddlrun,
                                     const std::string& wdir, const std::vector<std::string>& base_env);

// The full --help text, and the one-line reminder printed after an argument error.
const char* usage();
const char* usageSynopsis();

// "" if topology ("AxBxC", positive integers) describes exactly np ranks, else the error line.
std::string checkTopology(const std::string& topology, int np);

// The environment of one rank: base_env (the "VAR=VALUE" entries ddlrun was started with) with the DDL_* and
// torchrun variables of `rank` (common/rank_env.h) and then each -x entry set over it. root is the resolved
// "HOST:PORT" of DDL_ROOT, master_port torch's MASTER_PORT, secret the run's DDL_JOB_SECRET (the same for
// every rank of a run, fresh for each run).
std::vector<std::string> rankEnvironment(const Options& options, int rank, const std::string& root,
                                         int master_port, const std::string& secret,
                                         const std::vector<std::string>& base_env);

// Turns the bytes a rank writes to one stream into whole lines, each with the rank's prefix, so that every
// write() ddlrun makes holds complete lines only. Without tagging the bytes pass unchanged (still held back
// until a newline, for the same reason). A line with more than max_line bytes is cut into pieces of max_line
// bytes (each tagged and ended with a newline when tagging), the same way however the reads split it.
class LineTagger {
 public:
  LineTagger(std::string prefix, bool tag, size_t max_line = kMaxLineBytes);
  // Takes bytes just read; returns what can be written now (possibly empty).
  std::string feed(std::string_view data);
  // At end of stream: the unterminated last line, if any; tagged, it is given a newline so the next line of
  // another rank starts on a line of its own.
  std::string finish();

 private:
  void appendLine(std::string& out, std::string_view line, bool add_newline) const;

  std::string prefix_;
  bool tag_;
  size_t max_line_;
  std::string pending_;
};

using ddl::signalName;  // common/signals.h: "SIGKILL" for 9, "signal 77" for what has no name
// What ddlrun exits with for a rank that ended with this waitpid status: its exit code, or 128 + signal.
int exitCodeOf(int wait_status);
// "exited with status 7" or "was killed by signal SIGKILL".
std::string describeExit(int wait_status);

// Launches options.np ranks of options.command and supervises them until all have ended and their output is
// drained. Returns ddlrun's exit status: 0 if every rank exited 0; else the first failing rank's exitCodeOf;
// 128 + sig if ddlrun was sent SIGINT/SIGTERM/SIGHUP first; kLaunchFailureStatus if it could not launch.
int run(const Options& options);

}  // namespace ddl::launcher
