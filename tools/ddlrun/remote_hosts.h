// ddlrun across machines, the launcher's side: the command that starts each host's part over --rsh, the plan
// of the run (the hosts' parts, DDL_ROOT on the first host, ddlrun's path there), and the keepalives that
// tell the hosts' ddlruns the launcher is alive. The hosts' and slots' grammar is hosts.h's; launcher.cpp
// supervises each host's connection as it supervises a rank.
//
// Threads: hostCommand and planRemoteRun are the main thread's; Keepalives writes from a thread of its own.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "hosts.h"
#include "options.h"

namespace ddl::launcher {

// The command that starts one host's part of a run across machines: the --rsh words, the host, and one shell
// command (quoted for the host's shell) running remote_ddlrun with --host-part and the run's settings. The
// secret is not in it: it goes to the command's stdin. root is DDL_ROOT ("HOST:PORT"), wdir the directory the
// host's ranks start in.
std::vector<std::string> hostCommand(const Options& options, const HostPart& part, const std::string& root,
                                     int master_port, const std::string& remote_ddlrun,
                                     const std::string& wdir, const std::vector<std::string>& base_env);

// What the launcher starts across machines, worked out before the first host is started.
struct RemoteRun {
  std::vector<HostPart> parts;  // each host's ranks, in rank order
  std::string remote_ddlrun;    // ddlrun's path on the hosts: --remote-path, else selfPath()
  std::string cwd;              // the directory the hosts' ranks start in: this one
  std::string root;             // DDL_ROOT: --root, else the first host and a port from 29400-29899
  int master_port = 0;          // torch's MASTER_PORT: DDL_ROOT's port + 1 (- 1 at 65535)
};
RemoteRun planRemoteRun(const Options& options);
// The path this ddlrun was started by: started_as ("" or argv[0]) made absolute against cwd
// when it holds a '/' and names an executable file (a link or a wrapper stays as the user ran it: an
// emulator's wrapper runs the hosts' parts under the same emulator), else this process's executable, else
// "ddlrun" (found on the hosts' PATH).
std::string selfPath(const std::string& started_as, const std::string& cwd);

// The launcher's keepalives: a byte to each host every kKeepaliveMs (remote_hosts.cpp), from a thread of its
// own, so that a host's ddlrun, which stops its ranks after --host-silence-ms of silence, does not take a
// launcher busy writing its own output (a paused terminal, a pager) for a dead network.
class Keepalives {
 public:
  Keepalives() = default;
  Keepalives(const Keepalives&) = delete;
  Keepalives& operator=(const Keepalives&) = delete;
  ~Keepalives() { stop(); }

  // Starts writing to copies of fds (the hosts' stdin pipes, non-blocking), which stop() closes: the
  // launcher may close its own at any time.
  void start(const std::vector<int>& fds);
  // Stops the thread and closes the copies; nothing when not started.
  void stop();

 private:
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<int> fds_;
};

}  // namespace ddl::launcher
