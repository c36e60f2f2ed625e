// Who may call the coordinator, and whom their jobs are charged to: users with bearer tokens, accounts in a
// tree with shares, and one-time join tokens for new nodes.
//
// All of it lives in the coordinator's Store as entries (state/store.h), so every coordinator that shares an
// etcd store sees the same users, and a restart or a failover keeps them:
//   users/<name>          role, the SHA-256 of the token, creation time, account, limits
//   accounts/<name>       parent, share, creation time, limits
//   qos/<name>            priority, the QoS it preempts, grace, GPU limit, accounts allowed, creation time
//   join_tokens/<sha256>  the node it admits, its expiry
//   imports/users.json    that users.json was imported, and the file's SHA-256 then
// The registry keeps a copy in memory, which every token check reads. A change is written to the store first
// and reaches the copy only once it is durable: a token that was returned works after a restart or a
// failover, and a user removed stays removed. The leader opens the registry when it takes the lead; a deposed
// leader ends at once (StateBackend), so the copy of the one that serves is never behind the store.
//
// users.json (mode 0600 in the PKI directory, written by ddl-coordinator init-pki with the first admin) is
// imported once: the first open() whose store has no imports/users.json copies its users in, the marker last.
// The file is not read after that (open() warns when it has changed since): users are managed with ddlctl
// admin. A standby's dashboard checks tokens against the file (readOnly()) until it can read the store the
// leader writes, and from then on against the store's users (refreshFrom(), every few seconds), so that a
// user added since works there and a removed one stays out.
//
// Tokens are 32 random bytes, shown once when made and never stored (only their SHA-256, which is as good as
// a slow hash for so long a secret), so a copy of the store or the file lets nobody in.
//
// Roles: admin (everything: other users' jobs, drain, users, accounts, node certificates), user (submit; see,
// cancel and read the logs of their own jobs; list everyone's jobs without their commands and environments),
// viewer (read-only: listings and the dashboard). At least one admin always remains.
//
// Accounts (Slurm's associations, reduced to a tree): "root" always exists, with no parent; every other
// account has a parent and a share (1 .. kMaxShare) of what its parent's subtree gets. Every user has a
// default account (root unless given), which its jobs are charged to, and may be in others too
// (setUserAccounts, as Slurm's associations), which its jobs may name (--account). An account with
// sub-accounts or users cannot be removed, and a parent cannot become its own descendant. Accounts and users
// may carry limits (GPUs, running and pending jobs, GPU-hours per UTC day, week or month; setLimit), which
// the scheduler enforces (placement/fair_share.h); every change to the accounts or to limits reaches it
// through onAccountsChanged.
//
// Join tokens (CreateJoinToken, AgentService.Join) each name one node, work once and expire.
//
// Limits: kMaxUsers, kMaxAccounts, kMaxJoinTokens live at once. Creation times and expiry come from the clock
// given to open() (tests drive it).
//
// Threads: every method may be called from any thread. Token checks take a short lock on the copy; changes
// are serialised by a second lock held across the store's write, so checks never wait for a disk or etcd.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "state/store.h"

namespace ddl::coordinator::auth {

using state::Status;
using state::StatusOr;

enum class Role { kAdmin, kUser, kViewer, kInsecure };
const char* roleName(Role role);
std::optional<Role> parseUserRole(const std::string& name);  // "admin", "user", "viewer"

inline constexpr const char* kRootAccount = "root";

// Who a call comes from, as the rpc layer established it.
struct Identity {
  Identity(std::string name = "", Role role = Role::kViewer, std::string via = "", std::string account = "")
      : name(std::move(name)), role(role), via(std::move(via)), account(std::move(account)) {}
  std::string name;  // the user; "" for an anonymous caller of an --insecure coordinator
  Role role = Role::kViewer;
  std::string via;      // "token" or "insecure"
  std::string account;  // the user's default account; "" for an anonymous caller
  std::vector<std::string> accounts;  // the other accounts it is in, by name

  // Whether this user's jobs may be charged to `name`: its default account or one of its others.
  bool inAccount(const std::string& name) const;
  bool isAdmin() const { return role == Role::kAdmin || role == Role::kInsecure; }
  bool isUser() const { return role == Role::kAdmin || role == Role::kUser || role == Role::kInsecure; }
};

// What an account (with its sub-accounts) or a user may hold at once; 0: no limit (the scheduler enforces
// them: placement/fair_share.h).
struct Limits {
  int gpus = 0;
  int running = 0;
  int pending = 0;
  double gpu_hours = 0;          // in each period
  std::string period = "month";  // day, week or month (UTC calendar)
  bool operator==(const Limits&) const = default;
};

struct AccountInfo {
  Limits limits;
  std::string name;
  std::string parent;  // "" for root
  int64_t share = 1;
  int users = 0;  // users in it, by default or not (not in its sub-accounts)
  int64_t created_s = 0;
};

// A quality of service as the registry keeps it (placement/fair_share.h's Qos says what each field does).
struct QosInfo {
  std::string name;
  int64_t priority = 0;
  std::vector<std::string> preempt;
  int64_t grace_s = 60;
  int gpus = 0;
  std::vector<std::string> accounts;
  int64_t created_s = 0;  // 0 for normal while it was never changed
  bool operator==(const QosInfo&) const = default;
};

class UserRegistry {
 public:
  static constexpr size_t kMaxUsers = 10000;
  static constexpr size_t kMaxAccounts = 10000;
  static constexpr size_t kMaxJoinTokens = 1024;
  static constexpr int64_t kMaxShare = 1000000;
  static constexpr const char* kTokenPrefix = "ddl_";
  static constexpr const char* kJoinTokenPrefix = "ddlj_";

  // Reads the users, accounts and join tokens from `store` (not owned; outlives the registry), first
  // importing users_json when the store has never imported it (a missing file imports nothing). now_s: unix
  // seconds.
  static StatusOr<std::unique_ptr<UserRegistry>> open(state::Store& store, const std::string& users_json,
                                                      std::function<int64_t()> now_s = unixNowS);
  // The users of users_json alone, for token checks where there is no store (a standby's dashboard); every
  // change is refused. A missing file is an empty registry.
  static StatusOr<std::unique_ptr<UserRegistry>> readOnly(const std::string& users_json);
  // A read-only registry takes the users, accounts, QoS and join tokens of `store` (read, never written) in
  // place of what it has, once the store has imported users.json (before that, a new cluster's, the file's
  // users stay). The copy changes only when the whole read succeeds.
  Status refreshFrom(state::Store& store);

  // The user holding `token`, or nullopt.
  std::optional<Identity> authenticate(const std::string& token) const;

  // Makes user `name` with `role` in `account` ("": root) and returns the new token; with rotate, gives an
  // existing user a new token and role (and account, unless "": it keeps its own).
  StatusOr<std::string> add(const std::string& name, Role role, bool rotate, const std::string& account = "");
  Status remove(const std::string& name);
  std::vector<Identity> list() const;
  size_t size() const;
  // The accounts user `name` is in: joins `add`, leaves `remove`, and makes `default_account` ("":
  // unchanged) its default (the old default stays one of its accounts). Leaving the default account is
  // refused; every account must exist. Returns the user as it is now.
  StatusOr<Identity> setUserAccounts(const std::string& name, const std::vector<std::string>& add,
                                     const std::vector<std::string>& remove,
                                     const std::string& default_account);
  static constexpr size_t kMaxAccountsPerUser = 64;

  // Makes account `name` under `parent` ("": root) with `share`; with update, changes an existing one's share
  // and (unless "") parent.
  Status addAccount(const std::string& name, const std::string& parent, int64_t share, bool update);
  Status removeAccount(const std::string& name);
  // Every account, root first, then by name.
  std::vector<AccountInfo> accounts() const;
  // Called with every account after each change to them (on the changing thread, once it is durable), so the
  // scheduler's copy follows. Set it before the registry is shared.
  void onAccountsChanged(std::function<void(const std::vector<AccountInfo>&)> listener) {
    accounts_changed_ = std::move(listener);
  }
  bool hasAccount(const std::string& name) const;
  // Sets the limits of account `account` or (with account "") user `user`; each field of `limits` that is
  // given replaces the old value (nullopt keeps it). The listener hears of it as of an account change.
  struct LimitChange {
    std::optional<int> gpus, running, pending;
    std::optional<double> gpu_hours;
    std::optional<std::string> period;
  };
  StatusOr<Limits> setLimit(const std::string& account, const std::string& user, const LimitChange& change);
  // The users that have limits, by name.
  std::map<std::string, Limits> userLimits() const;

  // Qualities of service: makes QoS `name` (fields not given take QosInfo's defaults) or, with update,
  // changes the fields given of an existing one (normal always exists). Each QoS it preempts must exist and
  // have a lower priority; its accounts must exist. The listener hears of it as of an account change.
  struct QosChange {
    std::optional<int64_t> priority, grace_s;
    std::optional<int> gpus;
    std::optional<std::vector<std::string>> preempt, accounts;
  };
  StatusOr<QosInfo> setQos(const std::string& name, const QosChange& change, bool update);
  // Refused for normal and for a QoS another one preempts.
  Status removeQos(const std::string& name);
  // Every QoS, normal first, then by name.
  std::vector<QosInfo> qosList() const;
  static constexpr size_t kMaxQos = 256;
  static constexpr int64_t kMaxQosPriority = 1000000;
  static constexpr int64_t kMaxGraceS = 7 * 86400;

  // A one-time token for node `node`, valid for ttl_s seconds.
  StatusOr<std::string> createJoinToken(const std::string& node, int64_t ttl_s, int64_t* expires_s);
  // Uses up `token` if it is live and names `node`; the reason otherwise.
  Status redeemJoinToken(const std::string& token, const std::string& node);

  struct User {
    Role role = Role::kUser;
    std::string token_sha256;
    int64_t created_s = 0;
    std::string account = kRootAccount;  // the default
    std::vector<std::string> accounts;   // the others, sorted, without the default
    Limits limits;
  };
  struct Account {
    std::string parent;
    int64_t share = 1;
    int64_t created_s = 0;
    Limits limits;
  };
  struct JoinToken {
    std::string node;
    int64_t expires_s = 0;
  };

 private:
  UserRegistry(state::Store* store, std::function<int64_t()> now_s)
      : store_(store), now_s_(std::move(now_s)) {}
  // Loads the store's entries into the copy.
  Status load();
  Status loadLocked(const std::vector<state::Entry>& users, const std::vector<state::Entry>& accounts,
                    const std::vector<state::Entry>& tokens, const std::vector<state::Entry>& qos);
  // Copies users_json's users into the store unless it has done so before.
  Status importOnce(const std::string& users_json);
  // Writes `batch` to the store (write_mu_ held); OK once it is durable.
  Status commit(const std::vector<state::Write>& batch);
  // OK when account `name` exists (root always does), else NOT_FOUND saying how to make it (write_mu_ held).
  Status accountExists(const std::string& name) const;
  // Whether `name` is the only admin (write_mu_ held).
  bool lastAdmin(const std::string& name) const;
  // Whether `account` is `ancestor` or lies below it (write_mu_ or mu_ held).
  bool within(const std::string& account, const std::string& ancestor) const;
  static Identity identityOf(const std::string& name, const User& user);

  state::Store* const store_;  // null: read-only
  const std::function<int64_t()> now_s_;
  std::mutex write_mu_;    // serialises changes, across the store's write
  mutable std::mutex mu_;  // guards the copy below; a change holds it only to apply what was stored
  std::map<std::string, User> users_;             // by name
  std::map<std::string, std::string> by_hash_;    // token SHA-256 -> name
  std::map<std::string, Account> accounts_;       // by name; root is not stored
  std::map<std::string, JoinToken> join_tokens_;  // token SHA-256 -> what it admits
  std::map<std::string, QosInfo> qos_;            // by name; normal only once it was changed
  std::function<void(const std::vector<AccountInfo>&)> accounts_changed_;
};

// users.json as init-pki writes it: adds (or, when it is there, gives a new token to) user `name` with `role`
// and returns the token. The coordinator imports the file once (UserRegistry::open).
StatusOr<std::string> addToUsersFile(const std::string& users_json, const std::string& name, Role role);

// Name rules for users: 1..32 characters of [a-z0-9_-.] starting with a letter or '_' (what useradd accepts
// by default), since ranks run as the account of that name. "" if fine, else why not. Accounts follow the
// same rules.
std::string checkUserName(const std::string& name);
std::string checkAccountName(const std::string& name);

}  // namespace ddl::coordinator::auth
