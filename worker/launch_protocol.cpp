#include "launch_protocol.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>

namespace ddl::worker::launch {

int execFirst(const char* const* candidates, size_t count, const char* const* argv, const char* const* envp) {
  int err = ENOENT;
  bool denied = false;
  for (size_t i = 0; i < count; ++i) {
    execve(candidates[i], const_cast<char* const*>(argv), const_cast<char* const*>(envp));
    err = errno;
    if (err == EACCES) {
      denied = true;
    } else if (err != ENOENT && err != ENOTDIR) {
      break;
    }
  }
  if (denied && (err == ENOENT || err == ENOTDIR)) err = EACCES;
  return err;
}

int exitCodeFor(int stage, int err) {
  if (stage == kStageExec && err != ENOENT && err != ENOTDIR) return 126;
  return 127;
}

std::string formatExitRecord(std::optional<int> exit_code, std::optional<int> signal) {
  if (signal) return "signal " + std::to_string(*signal) + "\n";
  return "exit " + std::to_string(exit_code.value_or(255)) + "\n";
}

bool parseExitRecord(const std::string& text, std::optional<int>* exit_code, std::optional<int>* signal) {
  char kind[8] = {0};
  int value = -1;
  char extra = 0;
  if (std::sscanf(text.c_str(), "%7s %d %c", kind, &value, &extra) != 2 || value < 0) return false;
  const std::string k = kind;
  if (k == "exit" && value <= 255) {
    *exit_code = value;
    signal->reset();
    return true;
  }
  if (k == "signal" && value > 0 && value < 128) {
    *signal = value;
    exit_code->reset();
    return true;
  }
  return false;
}

}  // namespace ddl::worker::launch
