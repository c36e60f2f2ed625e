// The user registry (users.h): users.json with token hashes, and the one-time join tokens in memory.
#include "auth/users.h"

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/pki.h"

namespace ddl::coordinator::auth {

const char* roleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kUser:
      return "user";
    case Role::kViewer:
      return "viewer";
    case Role::kInsecure:
      return "insecure";
  }
  return "?";
}

std::optional<Role> parseUserRole(const std::string& name) {
  if (name == "admin") return Role::kAdmin;
  if (name == "user" || name.empty()) return Role::kUser;
  if (name == "viewer") return Role::kViewer;
  return std::nullopt;
}

std::string checkUserName(const std::string& name) {
  if (name.empty() || name.size() > 32) return "a user name has 1 to 32 characters";
  if (!(std::islower(static_cast<unsigned char>(name[0])) || name[0] == '_')) {
    return "user name '" + name + "' must start with a lower-case letter or '_'";
  }
  for (char c : name) {
    if (!std::islower(static_cast<unsigned char>(c)) && !std::isdigit(static_cast<unsigned char>(c)) && c != '_' &&
        c != '-' && c != '.') {
      return "user name '" + name + "' may hold only a-z, 0-9, '_', '-' and '.' (it names an account on the nodes)";
    }
  }
  return "";
}

StatusOr<std::unique_ptr<UserRegistry>> UserRegistry::open(const std::string& path,
                                                           std::function<int64_t()> now_s) {
  std::unique_ptr<UserRegistry> registry(new UserRegistry(path, std::move(now_s)));
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return registry;
  std::string error;
  auto text = pki::readFile(path, &error);
  if (!text) return Status::unavailable(error);
  try {
    const auto doc = nlohmann::json::parse(*text);
    for (const auto& u : doc.at("users")) {
      const std::string name = u.at("name").get<std::string>();
      auto role = parseUserRole(u.at("role").get<std::string>());
      const std::string hash = u.at("token_sha256").get<std::string>();
      if (!checkUserName(name).empty() || !role || hash.size() != 64) {
        return Status::invalidArgument(path + ": bad entry for user '" + name + "'");
      }
      if (registry->users_.size() >= kMaxUsers) return Status::invalidArgument(path + ": more than 10000 users");
      registry->users_[name] = User{*role, hash, u.value("created_s", int64_t{0})};
      registry->by_hash_[hash] = name;
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::invalidArgument(path + ": not a users file (" + std::string(e.what()) + ")");
  }
  return registry;
}

std::optional<Identity> UserRegistry::authenticate(const std::string& token) const {
  if (token.empty()) return std::nullopt;
  const std::string hash = pki::sha256Hex(token);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  // The map lookup compared hashes of a secret; that leaks nothing about the token itself.
  return Identity{it->second, users_.at(it->second).role, "token"};
}

StatusOr<std::string> UserRegistry::add(const std::string& name, Role role, bool rotate) {
  if (auto why = checkUserName(name); !why.empty()) return Status::invalidArgument(why);
  if (role != Role::kAdmin && role != Role::kUser && role != Role::kViewer) {
    return Status::invalidArgument("a user's role is admin, user or viewer");
  }
  const std::string secret = pki::randomHex(32);
  if (secret.empty()) return Status::internal("no random bytes for a token");
  const std::string token = kTokenPrefix + secret;
  const std::string hash = pki::sha256Hex(token);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = users_.find(name);
  if (it != users_.end() && !rotate) {
    return Status::failedPrecondition("user '" + name + "' exists (give --rotate for a new token)");
  }
  if (it == users_.end() && rotate) return Status::notFound("no user '" + name + "' to rotate");
  if (it == users_.end() && users_.size() >= kMaxUsers) {
    return Status::failedPrecondition("the registry holds 10000 users already");
  }
  const auto saved_users = users_;
  const auto saved_hashes = by_hash_;
  if (it != users_.end()) by_hash_.erase(it->second.token_sha256);
  users_[name] = User{role, hash, now_s_()};
  by_hash_[hash] = name;
  if (Status st = saveLocked(); !st) {
    users_ = saved_users;  // what is in memory matches the file: a token that was not saved does not work
    by_hash_ = saved_hashes;
    return st;
  }
  return token;
}

Status UserRegistry::remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = users_.find(name);
  if (it == users_.end()) return Status::notFound("no user '" + name + "'");
  const User saved = it->second;
  by_hash_.erase(saved.token_sha256);
  users_.erase(it);
  if (Status st = saveLocked(); !st) {
    users_[name] = saved;
    by_hash_[saved.token_sha256] = name;
    return st;
  }
  return Status::ok();
}

std::vector<Identity> UserRegistry::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Identity> out;
  for (const auto& [name, user] : users_) out.push_back(Identity{name, user.role, "token"});
  return out;
}

size_t UserRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return users_.size();
}

Status UserRegistry::saveLocked() const {
  nlohmann::json users = nlohmann::json::array();
  for (const auto& [name, user] : users_) {
    users.push_back({{"name", name},
                     {"role", roleName(user.role)},
                     {"token_sha256", user.token_sha256},
                     {"created_s", user.created_s}});
  }
  nlohmann::json doc = {{"users", users}};
  std::string error;
  if (!pki::writeFile(path_, doc.dump(2) + "\n", 0600, &error)) return Status::internal(error);
  return Status::ok();
}

StatusOr<std::string> UserRegistry::createJoinToken(const std::string& node, int64_t ttl_s, int64_t* expires_s) {
  if (auto why = pki::checkNodeName(node); !why.empty()) return Status::invalidArgument(why);
  if (ttl_s <= 0 || ttl_s > 7 * 86400) return Status::invalidArgument("a join token lives 1 s to 7 days");
  const std::string secret = pki::randomHex(32);
  if (secret.empty()) return Status::internal("no random bytes for a token");
  const std::string token = kJoinTokenPrefix + secret;
  const int64_t now = now_s_();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = join_tokens_.begin(); it != join_tokens_.end();) {
    it = it->second.expires_s < now ? join_tokens_.erase(it) : std::next(it);
  }
  if (join_tokens_.size() >= kMaxJoinTokens) {
    return Status::failedPrecondition("1024 join tokens are live already; wait for some to be used or expire");
  }
  join_tokens_[pki::sha256Hex(token)] = JoinToken{node, now + ttl_s};
  *expires_s = now + ttl_s;
  return token;
}

Status UserRegistry::redeemJoinToken(const std::string& token, const std::string& node) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = join_tokens_.find(pki::sha256Hex(token));
  if (it == join_tokens_.end()) return Status::unauthenticated("unknown or used join token");
  if (it->second.expires_s < now_s_()) {
    join_tokens_.erase(it);
    return Status::unauthenticated("the join token has expired; make another with 'ddlctl admin join-token'");
  }
  if (it->second.node != node) {
    return Status::permissionDenied("the join token is for node '" + it->second.node + "', not '" + node + "'");
  }
  join_tokens_.erase(it);
  return Status::ok();
}

}  // namespace ddl::coordinator::auth
