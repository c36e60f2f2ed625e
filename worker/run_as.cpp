// The account a rank runs as (run_as.h), resolved through NSS on this node.
#include "run_as.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace ddl::worker {
namespace {

// getpwnam_r's buffer: grown on ERANGE up to this (an entry is a few hundred bytes; NSS modules may want
// more).
constexpr size_t kMaxPasswdBuffer = size_t{1} << 20;

}  // namespace

std::optional<Account> lookupAccount(const std::string& name, const std::string& node, bool allow_root,
                                     std::string* error) {
  auto fail = [&](const std::string& why) {
    if (error != nullptr) *error = why;
    return std::nullopt;
  };
  if (error != nullptr) error->clear();
  const std::string who = "user '" + name + "'";
  if (name.empty()) return fail("the job names no user, and node " + node + " runs no rank without one");

  const long hint = sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(hint > 0 ? static_cast<size_t>(hint) : 16384);
  passwd entry{};
  passwd* found = nullptr;
  int rc;
  while ((rc = getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found)) == ERANGE &&
         buffer.size() < kMaxPasswdBuffer) {
    buffer.resize(buffer.size() * 2);
  }
  // ENOENT, ESRCH, EBADF and EPERM also mean "no such user" for some NSS modules (getpwnam_r(3)).
  if (found == nullptr && (rc == 0 || rc == ENOENT || rc == ESRCH || rc == EBADF || rc == EPERM)) {
    return fail(who + " does not exist on node " + node);
  }
  if (found == nullptr) {
    return fail("cannot look up " + who + " on node " + node + ": " + std::system_category().message(rc));
  }

  Account account;
  account.name = name;
  account.uid = entry.pw_uid;
  account.gid = entry.pw_gid;
  account.home = entry.pw_dir != nullptr ? entry.pw_dir : "";
  account.shell = entry.pw_shell != nullptr ? entry.pw_shell : "";
  if (account.uid == 0 && !allow_root) {
    return fail(who + " is uid 0 and the coordinator does not allow root jobs (allow_root_jobs)");
  }

  // getgrouplist says how many it needs when the array is too small; ask again with that, a few times at most
  // (a group database being edited meanwhile can change the count).
  int count = 64;
  for (int tries = 0; tries < 4; ++tries) {
    account.groups.resize(static_cast<size_t>(count));
    int n = count;
    if (getgrouplist(name.c_str(), account.gid, account.groups.data(), &n) >= 0) {
      account.groups.resize(static_cast<size_t>(std::max(n, 0)));
      return account;
    }
    if (static_cast<size_t>(n) > kMaxGroups) {
      return fail(who + " is in " + std::to_string(n) + " groups on node " + node + ", more than the " +
                  std::to_string(kMaxGroups) + " a process can have");
    }
    count = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(n, count * 2)), kMaxGroups));
  }
  return fail("cannot list the groups of " + who + " on node " + node + ": the count kept changing");
}

std::string describeAccount(const Account& account) {
  return "user " + account.name + " (uid " + std::to_string(account.uid) + ")";
}

std::string userName(uid_t uid) {
  std::vector<char> buffer(16384);
  passwd entry{};
  passwd* found = nullptr;
  while (getpwuid_r(uid, &entry, buffer.data(), buffer.size(), &found) == ERANGE &&
         buffer.size() < kMaxPasswdBuffer) {
    buffer.resize(buffer.size() * 2);
  }
  return found != nullptr ? std::string(entry.pw_name) : "uid " + std::to_string(uid);
}

}  // namespace ddl::worker
