// ddlrun across machines, the launcher's side (remote_hosts.h): each host's command, the run's plan, and the
// keepalive thread.
#include "remote_hosts.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>

#include "common/host_port.h"

namespace ddl::launcher {

namespace {
// A network that drops without a word (no FIN) leaves ssh's connection open for hours: the launcher writes a
// byte to each host every kKeepaliveMs, and a host's ddlrun that has heard nothing for --host-silence-ms
// (30 s by default) stops its ranks. Its own output is dropped when it cannot be written for as long.
constexpr int kKeepaliveMs = 5000;
}  // namespace

std::vector<std::string> hostCommand(const Options& options, const HostPart& part, const std::string& root,
                                     int master_port, const std::string& remote_ddlrun,
                                     const std::string& wdir, const std::vector<std::string>& base_env) {
  std::vector<std::string> argv;
  std::istringstream words(options.rsh);
  for (std::string word; words >> word;) argv.push_back(word);
  argv.push_back(part.host);
  std::vector<std::string> remote = {
      remote_ddlrun,
      "--host-part",
      std::to_string(part.first_rank) + "," + std::to_string(options.np) + "," + std::to_string(master_port),
      "-np",
      std::to_string(part.ranks),
      "--root",
      root,
      "--grace-ms",
      std::to_string(options.grace_ms)};
  if (!options.topology.empty()) remote.insert(remote.end(), {"--topology", options.topology});
  if (!options.algo.empty()) remote.insert(remote.end(), {"--algo", options.algo});
  if (!options.timeout_ms.empty()) remote.insert(remote.end(), {"--timeout-ms", options.timeout_ms});
  if (!options.tag_output) remote.push_back("--no-tag-output");
  for (const std::string& entry : options.env) {
    if (entry.find('=') != std::string::npos) {
      remote.insert(remote.end(), {"-x", entry});
      continue;
    }
    // -x VAR: this machine's value goes to every host, as mpirun -x does.
    for (const std::string& have : base_env) {
      if (have.size() > entry.size() && have.compare(0, entry.size(), entry) == 0 &&
          have[entry.size()] == '=') {
        remote.insert(remote.end(), {"-x", have});
      }
    }
  }
  remote.push_back("--");
  remote.insert(remote.end(), options.command.begin(), options.command.end());
  std::string shell = "cd " + shellQuote(wdir) + " && exec";
  for (const std::string& word : remote) shell += " " + shellQuote(word);
  argv.push_back(shell);
  return argv;
}

std::string selfPath(const std::string& started_as, const std::string& cwd) {
  if (started_as.find('/') != std::string::npos) {
    // argv[0] is whatever the caller set: taken only when it names an executable file here.
    const std::string path = (std::filesystem::path(cwd) / started_as).string();  // an absolute one stays
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  return n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string("ddlrun");
}

RemoteRun planRemoteRun(const Options& options) {
  RemoteRun run;
  run.parts = planHosts(options.hosts, options.np);
  char cwd[4096];
  run.cwd = getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "/";
  run.remote_ddlrun =
      !options.remote_path.empty() ? options.remote_path : selfPath(options.started_as, run.cwd);
  // Rank 0 binds the port on the first host, which ddlrun cannot probe from here: one from a range that
  // varies with the run, as torchrun's fixed 29500 would clash between runs; --root chooses another.
  const int port = 29400 + static_cast<int>(getpid() % 500);
  const std::string& first = run.parts.front().host;
  const bool v6 = first.find(':') != std::string::npos && first.front() != '[';
  run.root =
      options.root.empty() ? (v6 ? "[" + first + "]" : first) + ":" + std::to_string(port) : options.root;
  const StatusOr<HostPort> root = parseHostPort(run.root);
  run.master_port = root && root->port < 65535 ? root->port + 1 : root ? root->port - 1 : 0;
  return run;
}

void Keepalives::start(const std::vector<int>& fds) {
  for (int stdin_fd : fds) {
    const int fd = fcntl(stdin_fd, F_DUPFD_CLOEXEC, 3);  // closed by stop(), not by the launcher's beginStop
    if (fd >= 0) fds_.push_back(fd);
  }
  thread_ = std::thread([this] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);  // signals are the main thread's
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(kKeepaliveMs), [&] { return stop_; })) {
      for (int fd : fds_) {
        ssize_t ignored = write(fd, "\n", 1);  // non-blocking: a full pipe already says enough
        (void)ignored;
      }
    }
  });
}

void Keepalives::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (int fd : fds_) close(fd);
  fds_.clear();
}

}  // namespace ddl::launcher
