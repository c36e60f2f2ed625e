// The account a rank runs as, resolved on this node.
//
// The coordinator names the job's user (StartRanks.user, from the submitter's authenticated identity); what
// that name means is this node's business: its passwd and group databases (files, LDAP, SSSD through NSS)
// give the uid, the primary gid, the supplementary groups, HOME and the shell. lookupAccount() does that
// lookup and the node's one policy check: no rank runs as uid 0 (any account with uid 0, not only the one
// called root) unless the coordinator allows root jobs.
//
// The Supervisor (supervisor.h) switches a rank to an Account right before exec; launch_protocol.h holds the
// switch itself.
//
// Threads: plain values and a function that may be called from any thread (getpwnam_r, getgrouplist).
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace ddl::worker {

struct Account {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;              // The primary group.
  std::vector<gid_t> groups;  // Every group of the account, the primary one included (getgrouplist).
  std::string home;           // HOME
  std::string shell;          // SHELL; "" if the passwd entry has none.
};

// Most supplementary groups taken for one account; an account in more is refused rather than cut short.
// Linux's NGROUPS_MAX is 65536.
constexpr size_t kMaxGroups = 65536;

// Looks `name` up on this node (node: the node's name, for messages only). On failure returns nothing and
// sets *error to a sentence: "user 'bob' does not exist on node n1", "user 'root' is uid 0 and the
// coordinator does not allow root jobs (allow_root_jobs)", an empty name, or a lookup that failed (NSS
// unreachable, ...).
std::optional<Account> lookupAccount(const std::string& name, const std::string& node, bool allow_root,
                                     std::string* error);

// "user bob (uid 1001)": the account as messages name it.
std::string describeAccount(const Account& account);

// The name of the account with this uid, or "uid N" where the node has none.
std::string userName(uid_t uid);

}  // namespace ddl::worker
