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
// The pieces with no I/O are separate functions so they can be read and tested on their own: argument parsing
// (options.h), the hosts and each host's command (hosts.h, remote_hosts.h), and here the rank environment,
// line tagging and exit-status naming; run() is the process-owning event loop.
//
// Threads: everything here is called from the main thread. While it runs, run() owns the process's SIGCHLD,
// SIGINT, SIGTERM, SIGHUP and SIGPIPE handling (restored after); it waits only for the children it forks.
// Across machines it starts one more thread, which writes the keepalives to the hosts (remote_hosts.h).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "common/signals.h"
#include "hosts.h"
#include "options.h"

namespace ddl::launcher {

// Exit status when ddlrun itself fails after parsing (no free port, no fork or pipe), as in timeout(1).
constexpr int kLaunchFailureStatus = 125;
// A rank line longer than this is emitted in pieces, so one rank cannot make ddlrun buffer without bound.
constexpr size_t kMaxLineBytes = 64 * 1024;

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
