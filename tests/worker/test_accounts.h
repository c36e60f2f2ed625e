// Throwaway accounts for tests that run ranks as other users: real entries in the node's passwd and group
// files, made with groupadd/useradd and deleted with userdel/groupdel. Names are ddlt-PID-KIND, so that
// parallel test processes do not collide and the accounts of a test process that crashed (its pid is gone)
// can be recognised and deleted by the next one.
//
// Threads: call from the test's main thread (SetUpTestSuite / TearDownTestSuite).
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ddl::test {

// Runs a shell command; whether it exited 0.
inline bool shellOk(const std::string& command) {
  const int status = std::system(command.c_str());
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// "" when accounts can be made here; else why not, for GTEST_SKIP.
inline std::string accountsUnavailable() {
  if (geteuid() != 0) return "needs root: making test accounts (useradd) and switching to them do";
  for (const char* tool : {"useradd", "userdel", "groupadd", "groupdel"}) {
    bool found = false;
    for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
      found = found || access((std::string(dir) + tool).c_str(), X_OK) == 0;
    }
    if (!found) return std::string(tool) + " is missing (package passwd)";
  }
  return "";
}

// ddlt-PID-KIND for this process.
inline std::string testAccountName(char kind) {
  return "ddlt-" + std::to_string(getpid()) + "-" + std::string(1, kind);
}

// Deletes the ddlt-PID-* users and groups whose PID no longer runs: left by a test process that crashed.
// Never userdel --remove: a uid-0 alias's home is not its own.
inline void removeStaleTestAccounts() {
  for (const char* db : {"/etc/passwd", "/etc/group"}) {
    std::ifstream in(db);
    std::string line;
    while (std::getline(in, line)) {
      const std::string name = line.substr(0, line.find(':'));
      int pid = 0;
      char kind = 0, extra = 0;
      if (std::sscanf(name.c_str(), "ddlt-%d-%c%c", &pid, &kind, &extra) != 2 || pid <= 0) continue;
      if (kill(pid, 0) == 0 || errno != ESRCH) continue;
      shellOk(std::string(db) == "/etc/passwd" ? "userdel --force " + name + " 2>/dev/null"
                                               : "groupdel " + name + " 2>/dev/null");
    }
  }
}

}  // namespace ddl::test
