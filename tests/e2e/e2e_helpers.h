// Helpers shared by the end-to-end tests (cluster_test, chaos_test), which run real ddl-coordinator and
// ddl-agent processes on 127.0.0.1: start a program with its output in a log, read a file, find processes by
// a marker in their command line, wait for a condition with a bound, and GET a page over plain HTTP.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace ddl::e2e {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Starts argv[0] (a path) with stdout and stderr appended to `log`; returns its pid.
inline pid_t spawn(const std::vector<std::string>& argv, const fs::path& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

// Runs a program to its end (bounded by its own work: init-pki, issue-node, ddlctl); its exit status or -1.
inline int runToEnd(const std::vector<std::string>& argv, const fs::path& log) {
  pid_t pid = spawn(argv, log);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A file's bytes; "" for one that cannot be read. A /proc/PID file of a process that ends while it is read
// fails the read with ESRCH, which libstdc++'s filebuf throws ("basic_filebuf::underflow error reading the
// file: No such process"): that process is gone, and so is its command line.
inline std::string slurp(const fs::path& p) {
  try {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  } catch (const std::exception&) {
    return "";
  }
}

// The pids of processes whose command line contains `marker` (each test's ranks carry a unique one), leaving out
// the test program itself.
inline std::vector<pid_t> processesWithMarker(const std::string& marker) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit)) continue;
    std::string cmdline = slurp(e.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(marker) != std::string::npos && cmdline.find(program_invocation_short_name) == std::string::npos) {
      out.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return out;
}
inline bool processWithMarker(const std::string& marker) { return !processesWithMarker(marker).empty(); }

// Polls pred every 50 ms until it holds or timeout_ms passed; its last value.
template <typename Pred>
bool waitFor(Pred pred, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

// Stops a child: SIGCONT (it may be frozen), SIGTERM, then SIGKILL after 15 s (a clean stop is part of what
// the tests check, but nothing may hang); pid is -1 afterwards. Nothing for pid <= 0.
inline void stopProcess(pid_t& pid) {
  if (pid <= 0) return;
  kill(pid, SIGCONT);
  kill(pid, SIGTERM);
  int status = 0;
  if (!waitFor([&] { return waitpid(pid, &status, WNOHANG) == pid; }, 15000)) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  pid = -1;
}

// The job id a `ddlctl submit` prints first into `out` (a file it writes as it runs), within ms; "" if none.
inline std::string submittedId(const fs::path& out, int ms) {
  std::string id;
  waitFor(
      [&] {
        const std::string text = slurp(out);
        if (text.rfind("j-", 0) != 0 || text.find('\n') == std::string::npos) return false;
        id = text.substr(0, text.find('\n'));
        return true;
      },
      ms);
  return id;
}

// GET http://HOST:PORT`path` (an IPv4 loopback dashboard), with `token` as the bearer where given; the whole
// answer (status line, header and body), or "" when HOST:PORT is no such address or the answer could not be
// read within 5 s.
inline std::string httpGet(const std::string& host_port, const std::string& path,
                           const std::string& token = "") {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::atoi(host_port.c_str() + colon + 1)));
  if (inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &addr.sin_addr) != 1) return "";
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval limit{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: " + host_port +
                                "\r\nConnection: close\r\n" +
                                (token.empty() ? "" : "Authorization: Bearer " + token + "\r\n") + "\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      for (int i = 0; i < 4096; ++i) {  // at most 16 MiB
        const ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0) break;
        answer.append(buf, static_cast<size_t>(n));
      }
    }
  }
  close(fd);
  return answer;
}

}  // namespace ddl::e2e
