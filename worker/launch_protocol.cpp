// What the supervisor and ddl-rank-shim share (launch_protocol.h): the report pipe's and the records'
// formats.
#include "launch_protocol.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ddl::worker::launch {
namespace {

// Where the plain calls take 16-bit ids (i386, 32-bit ARM), the kernel has 32-bit ones named *32.
#ifdef SYS_setgroups32
constexpr long kSysSetgroups = SYS_setgroups32;
constexpr long kSysSetgid = SYS_setgid32;
constexpr long kSysSetuid = SYS_setuid32;
#else
constexpr long kSysSetgroups = SYS_setgroups;
constexpr long kSysSetgid = SYS_setgid;
constexpr long kSysSetuid = SYS_setuid;
#endif

// More than Linux's NGROUPS_MAX is refused by setgroups anyway; this only bounds what the shim parses.
constexpr size_t kMaxIdentityGroups = 65536;

bool parseId(const std::string& text, unsigned long* out) {
  if (text.empty() || text.size() > 10 || text.find_first_not_of("0123456789") != std::string::npos) {
    return false;
  }
  *out = std::strtoul(text.c_str(), nullptr, 10);
  return *out < 0xffffffffUL;  // (uid_t)-1 means "unchanged" to the kernel: never a real id
}

}  // namespace

Failure switchUser(const Identity& identity) {
  if (syscall(kSysSetgroups, identity.group_count, identity.groups) != 0) return {kStageUser, errno};
  if (syscall(kSysSetgid, identity.gid) != 0) return {kStageUser, errno};
  if (syscall(kSysSetuid, identity.uid) != 0) return {kStageUser, errno};
  // As root, setuid and setgid set the real, effective and saved ids alike; anything else means they did not.
  uid_t ruid, euid, suid;
  gid_t rgid, egid, sgid;
  if (getresuid(&ruid, &euid, &suid) != 0 || getresgid(&rgid, &egid, &sgid) != 0) return {kStageUser, errno};
  if (ruid != identity.uid || euid != identity.uid || suid != identity.uid || rgid != identity.gid ||
      egid != identity.gid || sgid != identity.gid) {
    return {kStageUserKept, 0};
  }
  // Leaving uid 0 clears every capability, unless securebits (SECBIT_KEEP_CAPS, SECBIT_NO_SETUID_FIXUP) or a
  // user namespace say otherwise; whatever the reason, a rank that could become root again must not run.
  if (identity.uid != 0 && syscall(kSysSetuid, 0) == 0) return {kStageUserKept, 0};
  return {0, 0};
}

Failure execProgram(const Identity* identity, const char* workdir, const char* const* candidates,
                    size_t count, const char* const* argv, const char* const* envp) {
  if (identity != nullptr) {
    Failure failure = switchUser(*identity);
    if (failure.stage != 0) return failure;
  }
  if (workdir != nullptr && chdir(workdir) != 0) return {kStageChdir, errno};
  return {kStageExec, execFirst(candidates, count, argv, envp)};
}

std::string formatIdentity(uid_t uid, gid_t gid, const std::vector<gid_t>& groups) {
  std::string out = std::to_string(uid) + ":" + std::to_string(gid) + ":";
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i > 0) out += ",";
    out += std::to_string(groups[i]);
  }
  return out;
}

bool parseIdentity(const std::string& text, uid_t* uid, gid_t* gid, std::vector<gid_t>* groups) {
  const size_t first = text.find(':');
  const size_t second = first == std::string::npos ? first : text.find(':', first + 1);
  if (second == std::string::npos) return false;
  unsigned long u = 0, g = 0;
  if (!parseId(text.substr(0, first), &u) || !parseId(text.substr(first + 1, second - first - 1), &g)) {
    return false;
  }
  groups->clear();
  const std::string list = text.substr(second + 1);
  size_t begin = 0;
  while (begin < list.size()) {
    size_t end = list.find(',', begin);
    if (end == std::string::npos) end = list.size();
    unsigned long group = 0;
    if (!parseId(list.substr(begin, end - begin), &group) || groups->size() >= kMaxIdentityGroups) {
      return false;
    }
    groups->push_back(static_cast<gid_t>(group));
    begin = end + 1;
    if (end + 1 == list.size()) return false;  // a trailing comma
  }
  *uid = static_cast<uid_t>(u);
  *gid = static_cast<gid_t>(g);
  return true;
}

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

bool parseReport(const void* data, size_t size, Failure* failure, pid_t* program_pid) {
  if (size == 0) {
    *failure = Failure{0, 0};
    *program_pid = 0;
    return true;
  }
  if (size != sizeof(Failure)) return false;
  Failure record{};
  std::memcpy(&record, data, sizeof record);
  if (record.stage == kStageStarted) {
    if (record.err <= 0) return false;
    *failure = Failure{0, 0};
    *program_pid = static_cast<pid_t>(record.err);
    return true;
  }
  if ((record.stage < kStageSetup || record.stage > kStageUserKept) && record.stage != kStageConfine)
    return false;
  *failure = record;
  *program_pid = 0;
  return true;
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
