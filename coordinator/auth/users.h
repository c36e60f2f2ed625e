// Who may call the coordinator: users with bearer tokens, and one-time join tokens for new nodes.
//
// Users live in a JSON file in the PKI directory (users.json, mode 0600): name, role and the SHA-256 of the
// token. The token itself is shown once, when it is made (ddl-coordinator init-pki for the first admin,
// ddlctl admin add-user after that), and never stored, so a copy of the file lets nobody in. Tokens are 32
// random bytes, so a plain SHA-256 is as good as a slow hash here.
//
// Roles: admin (everything: other users' jobs, drain, users, node certificates), user (submit; see, cancel
// and read the logs of their own jobs; list everyone's jobs without their commands and environments), viewer
// (read-only: listings and the dashboard).
//
// Join tokens (CreateJoinToken, AgentService.Join) are kept in memory only: each names one node, works once,
// and expires; a coordinator restart forgets them (make another). At most kMaxJoinTokens are live. Their
// expiry and the users' creation times come from the clock given to open() (tests drive it).
//
// Threads: every method may be called from any thread (one mutex).
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

namespace ddl::coordinator::auth {

using state::Status;
using state::StatusOr;

enum class Role { kAdmin, kUser, kViewer, kInsecure };
const char* roleName(Role role);
std::optional<Role> parseUserRole(const std::string& name);  // "admin", "user", "viewer"

// Who a call comes from, as the rpc layer established it.
struct Identity {
  std::string name;  // the user; "" for an anonymous caller of an --insecure coordinator
  Role role = Role::kViewer;
  std::string via;   // "token" or "insecure"

  bool isAdmin() const { return role == Role::kAdmin || role == Role::kInsecure; }
  bool isUser() const { return role == Role::kAdmin || role == Role::kUser || role == Role::kInsecure; }
};

class UserRegistry {
 public:
  static constexpr size_t kMaxUsers = 10000;
  static constexpr size_t kMaxJoinTokens = 1024;
  static constexpr const char* kTokenPrefix = "ddl_";
  static constexpr const char* kJoinTokenPrefix = "ddlj_";

  // Reads `path` (users.json); a missing file is an empty registry that add() creates. now_s: unix seconds.
  static StatusOr<std::unique_ptr<UserRegistry>> open(const std::string& path,
                                                      std::function<int64_t()> now_s = unixNowS);

  // The user holding `token`, or nullopt.
  std::optional<Identity> authenticate(const std::string& token) const;

  // Makes user `name` with `role` and returns the new token; with rotate, replaces an existing user's token
  // (and role). The file is rewritten before the answer, so a token that was returned survives a restart.
  StatusOr<std::string> add(const std::string& name, Role role, bool rotate);
  Status remove(const std::string& name);
  std::vector<Identity> list() const;
  size_t size() const;

  // A one-time token for node `node`, valid for ttl_s seconds.
  StatusOr<std::string> createJoinToken(const std::string& node, int64_t ttl_s, int64_t* expires_s);
  // Uses up `token` if it is live and names `node`; the reason otherwise.
  Status redeemJoinToken(const std::string& token, const std::string& node);

 private:
  UserRegistry(std::string path, std::function<int64_t()> now_s)
      : path_(std::move(path)), now_s_(std::move(now_s)) {}
  Status saveLocked() const;

  struct User {
    Role role;
    std::string token_sha256;
    int64_t created_s = 0;
  };
  struct JoinToken {
    std::string node;
    int64_t expires_s;
  };

  const std::string path_;
  const std::function<int64_t()> now_s_;
  mutable std::mutex mu_;
  std::map<std::string, User> users_;               // by name
  std::map<std::string, std::string> by_hash_;      // token SHA-256 -> name
  std::map<std::string, JoinToken> join_tokens_;    // token SHA-256 -> what it admits
};

// Name rules for users: 1..32 characters of [a-z0-9_-] starting with a letter or '_' (what useradd accepts by
// default), since ranks run as the account of that name. "" if fine, else why not.
std::string checkUserName(const std::string& name);

}  // namespace ddl::coordinator::auth
