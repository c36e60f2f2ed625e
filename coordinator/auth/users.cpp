// The user registry (users.h): users, accounts and join tokens as Store entries, a copy in memory for token
// checks, and users.json imported once.
#include "auth/users.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/pki.h"
#include "state/direct_store.h"

namespace ddl::coordinator::auth {

namespace {

constexpr const char* kUsersTable = "users";
constexpr const char* kAccountsTable = "accounts";
constexpr const char* kJoinTokensTable = "join_tokens";
constexpr const char* kQosTable = "qos";
constexpr const char* kNormalQos = "normal";
constexpr const char* kImportsTable = "imports";
constexpr const char* kUsersFileImport = "users.json";

using state::Write;

nlohmann::json limitsJson(const Limits& l) {
  nlohmann::json j = {{"gpus", l.gpus}, {"running", l.running}, {"pending", l.pending}};
  if (l.gpu_hours > 0) {
    j["gpu_hours"] = l.gpu_hours;
    j["period"] = l.period;
  }
  return j;
}

// The periods a GPU-hours limit counts over (placement/fair_share.h's Period).
bool knownPeriod(const std::string& name) { return name == "day" || name == "week" || name == "month"; }
bool goodLimits(const Limits& l) {
  return l.gpus >= 0 && l.running >= 0 && l.pending >= 0 && l.gpu_hours >= 0 && knownPeriod(l.period);
}

Limits limitsFromJson(const nlohmann::json& j) {
  Limits l;
  if (!j.is_object()) return l;
  l.gpus = j.value("gpus", 0);
  l.running = j.value("running", 0);
  l.pending = j.value("pending", 0);
  l.gpu_hours = j.value("gpu_hours", 0.0);
  l.period = j.value("period", std::string("month"));
  return l;
}

nlohmann::json userJson(const UserRegistry::User& u) {
  nlohmann::json j = {{"role", roleName(u.role)},
                      {"token_sha256", u.token_sha256},
                      {"created_s", u.created_s},
                      {"account", u.account}};
  if (u.limits != Limits{}) j["limits"] = limitsJson(u.limits);
  if (!u.accounts.empty()) j["accounts"] = u.accounts;
  return j;
}

nlohmann::json accountJson(const UserRegistry::Account& a) {
  nlohmann::json j = {{"parent", a.parent}, {"share", a.share}, {"created_s", a.created_s}};
  if (a.limits != Limits{}) j["limits"] = limitsJson(a.limits);
  return j;
}

nlohmann::json qosJson(const QosInfo& q) {
  return {{"priority", q.priority}, {"preempt", q.preempt},   {"grace_s", q.grace_s},
          {"gpus", q.gpus},         {"accounts", q.accounts}, {"created_s", q.created_s}};
}

// A user from its JSON (an entry's value or one of users.json's), or why it is not one.
StatusOr<UserRegistry::User> userFromJson(const std::string& name, const nlohmann::json& j) {
  UserRegistry::User u;
  try {
    auto role = parseUserRole(j.at("role").get<std::string>());
    u.token_sha256 = j.at("token_sha256").get<std::string>();
    u.created_s = j.value("created_s", int64_t{0});
    u.account = j.value("account", std::string(kRootAccount));
    if (auto l = j.find("limits"); l != j.end()) u.limits = limitsFromJson(*l);
    u.accounts = j.value("accounts", std::vector<std::string>{});
    const bool bad_accounts = u.accounts.size() > UserRegistry::kMaxAccountsPerUser ||
                              std::any_of(u.accounts.begin(), u.accounts.end(), [&](const std::string& a) {
                                return !checkAccountName(a).empty() || a == u.account;
                              });
    if (!role || u.token_sha256.size() != 64 || !checkUserName(name).empty() || u.account.empty() ||
        bad_accounts || !goodLimits(u.limits)) {
      return Status::dataLoss("bad record for user '" + name + "'");
    }
    u.role = *role;
  } catch (const nlohmann::json::exception& e) {
    return Status::dataLoss("bad record for user '" + name + "' (" + e.what() + ")");
  }
  return u;
}

// users.json's users by name; a missing file has none.
StatusOr<std::map<std::string, UserRegistry::User>> readUsersFile(const std::string& path,
                                                                  std::string* text) {
  std::map<std::string, UserRegistry::User> users;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return users;
  std::string error;
  auto read = pki::readFile(path, &error);
  if (!read) return Status::unavailable(error);
  if (text) *text = *read;
  try {
    const auto doc = nlohmann::json::parse(*read);
    for (const auto& j : doc.at("users")) {
      const std::string name = j.at("name").get<std::string>();
      auto user = userFromJson(name, j);
      if (!user) return Status::invalidArgument(path + ": " + user.status().message());
      if (users.size() >= UserRegistry::kMaxUsers)
        return Status::invalidArgument(path + ": more than 10000 users");
      users[name] = *user;
    }
  } catch (const nlohmann::json::exception& e) {
    return Status::invalidArgument(path + ": not a users file (" + std::string(e.what()) + ")");
  }
  return users;
}

// A new token and its hash.
StatusOr<std::pair<std::string, std::string>> newToken(const char* prefix) {
  const std::string secret = pki::randomHex(32);
  if (secret.empty()) return Status::internal("no random bytes for a token");
  const std::string token = prefix + secret;
  return std::make_pair(token, pki::sha256Hex(token));
}

// Why the coordinator cannot start with a damaged entry, and how to take it out.
std::string badEntry(const std::string& table, const std::string& key, const std::string& what) {
  return "the state store's entry " + table + "/" + key + " cannot be read (" + what +
         "); remove it (etcd: etcdctl del PREFIX" + table + "/" + key + "; SQLite, with the coordinator " +
         "stopped: sqlite3 DATA_DIR/state.db \"DELETE FROM entries WHERE tbl='" + table + "' AND key='" +
         key + "'\"), start the coordinator and make it again with ddlctl admin";
}

Status checkRole(Role role) {
  if (role == Role::kAdmin || role == Role::kUser || role == Role::kViewer) return Status::ok();
  return Status::invalidArgument("a user's role is admin, user or viewer");
}

}  // namespace

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

namespace {

// The name rules of users and accounts; `what` is "user" or "account".
std::string checkName(const std::string& what, const std::string& name) {
  const std::string article = what == "account" ? "an " : "a ";
  if (name.empty() || name.size() > 32) return article + what + " name has 1 to 32 characters";
  if (!(std::islower(static_cast<unsigned char>(name[0])) || name[0] == '_')) {
    return what + " name '" + name + "' must start with a lower-case letter or '_'";
  }
  for (char c : name) {
    if (!std::islower(static_cast<unsigned char>(c)) && !std::isdigit(static_cast<unsigned char>(c)) && c != '_' &&
        c != '-' && c != '.') {
      return what + " name '" + name + "' may hold only a-z, 0-9, '_', '-' and '.'" +
             (what == "user" ? " (it names an account on the nodes)" : "");
    }
  }
  return "";
}

}  // namespace

std::string checkUserName(const std::string& name) { return checkName("user", name); }
std::string checkAccountName(const std::string& name) { return checkName("account", name); }

// ---- Opening ----------------------------------------------------------------------------------------------

StatusOr<std::unique_ptr<UserRegistry>> UserRegistry::open(state::Store& store, const std::string& users_json,
                                                           std::function<int64_t()> now_s) {
  std::unique_ptr<UserRegistry> registry(new UserRegistry(&store, std::move(now_s)));
  if (Status st = registry->importOnce(users_json); !st) return st;
  if (Status st = registry->load(); !st) return st;
  return registry;
}

StatusOr<std::unique_ptr<UserRegistry>> UserRegistry::readOnly(const std::string& users_json) {
  std::unique_ptr<UserRegistry> registry(new UserRegistry(nullptr, unixNowS));
  auto users = readUsersFile(users_json, nullptr);
  if (!users) return users.status();
  registry->users_ = std::move(*users);
  for (const auto& [name, user] : registry->users_) registry->by_hash_[user.token_sha256] = name;
  return registry;
}

Status UserRegistry::refreshFrom(state::Store& store) {
  auto imports = store.listEntries(kImportsTable);
  if (!imports) return imports.status();
  if (std::none_of(imports->begin(), imports->end(),
                   [](const state::Entry& e) { return e.key == kUsersFileImport; })) {
    return Status::ok();  // no leader has imported users.json yet: the file is what there is
  }
  UserRegistry fresh(&store, now_s_);
  if (Status st = fresh.load(); !st) return st;
  std::lock_guard<std::mutex> lock(mu_);
  users_ = std::move(fresh.users_);
  by_hash_ = std::move(fresh.by_hash_);
  accounts_ = std::move(fresh.accounts_);
  join_tokens_ = std::move(fresh.join_tokens_);
  qos_ = std::move(fresh.qos_);
  return Status::ok();
}

Status UserRegistry::importOnce(const std::string& users_json) {
  auto imports = store_->listEntries(kImportsTable);
  if (!imports) return imports.status();
  for (const state::Entry& e : *imports) {
    if (e.key != kUsersFileImport) continue;
    // Imported before: the file is not read again, only compared, and one that cannot be read is no error.
    std::string error;
    const auto text = pki::readFile(users_json, &error);
    const auto marker = nlohmann::json::parse(e.value, nullptr, false);
    const auto sha256 = marker.is_object() ? marker.find("sha256") : marker.end();
    if (text && sha256 != marker.end() && *sha256 != pki::sha256Hex(*text)) {
      spdlog::warn(
          "{} has changed since it was imported; it is not read again: users live in the state store "
          "now (ddlctl admin add-user, remove-user, users)",
          users_json);
    }
    return Status::ok();
  }
  std::string text;
  auto users = readUsersFile(users_json, &text);
  if (!users) return users.status();
  if (text.empty()) return Status::ok();  // no file: nothing to import yet
  const std::string file_sha256 = pki::sha256Hex(text);
  std::vector<Write> writes;
  for (const auto& [name, user] : *users) {
    writes.push_back(Write::putEntry({kUsersTable, name, userJson(user).dump()}));
  }
  // The marker last: an import cut short is done again whole on the next open.
  const nlohmann::json marker = {{"sha256", file_sha256}, {"at_s", now_s_()}, {"users", users->size()}};
  writes.push_back(Write::putEntry({kImportsTable, kUsersFileImport, marker.dump()}));
  if (Status st = state::applyInBatches(*store_, std::move(writes)); !st) {
    return Status(st.code(), "importing " + users_json + " into the state store: " + st.message());
  }
  spdlog::info("imported {} users from {} into the state store; users are managed there from now on",
               users->size(), users_json);
  return Status::ok();
}

Status UserRegistry::load() {
  auto users = store_->listEntries(kUsersTable);
  auto accounts = users ? store_->listEntries(kAccountsTable) : users;
  auto tokens = accounts ? store_->listEntries(kJoinTokensTable) : accounts;
  auto qos = tokens ? store_->listEntries(kQosTable) : tokens;
  if (!qos) return qos.status();
  std::lock_guard<std::mutex> lock(mu_);
  return loadLocked(*users, *accounts, *tokens, *qos);
}

Status UserRegistry::loadLocked(const std::vector<state::Entry>& users,
                                const std::vector<state::Entry>& accounts,
                                const std::vector<state::Entry>& tokens,
                                const std::vector<state::Entry>& qos) {
  for (const state::Entry& e : qos) {
    const auto j = nlohmann::json::parse(e.value, nullptr, false);
    QosInfo q;
    q.name = e.key;
    try {
      if (!j.is_object() || !checkName("QoS", e.key).empty()) throw std::invalid_argument("not a QoS");
      q.priority = j.value("priority", int64_t{0});
      q.preempt = j.value("preempt", std::vector<std::string>{});
      q.grace_s = j.value("grace_s", int64_t{60});
      q.gpus = j.value("gpus", 0);
      q.accounts = j.value("accounts", std::vector<std::string>{});
      q.created_s = j.value("created_s", int64_t{0});
    } catch (const std::exception& x) {
      return Status::dataLoss(badEntry("qos", e.key, x.what()));
    }
    qos_[e.key] = q;
  }
  for (const state::Entry& e : users) {
    auto user = userFromJson(e.key, nlohmann::json::parse(e.value, nullptr, false));
    if (!user) return Status::dataLoss(badEntry("users", e.key, user.status().message()));
    users_[e.key] = *user;
    by_hash_[user->token_sha256] = e.key;
  }
  for (const state::Entry& e : accounts) {
    const auto j = nlohmann::json::parse(e.value, nullptr, false);
    Account a;
    try {
      if (j.is_object()) {
        a.parent = j.value("parent", std::string(kRootAccount));
        a.share = j.value("share", int64_t{1});
        a.created_s = j.value("created_s", int64_t{0});
        if (auto l = j.find("limits"); l != j.end()) a.limits = limitsFromJson(*l);
      }
    } catch (const nlohmann::json::exception& x) {
      return Status::dataLoss(badEntry("accounts", e.key, x.what()));
    }
    if (!j.is_object() || !checkAccountName(e.key).empty() || a.parent.empty() || a.share < 1 ||
        !goodLimits(a.limits)) {
      return Status::dataLoss(badEntry("accounts", e.key, "not an account"));
    }
    accounts_[e.key] = a;
  }
  for (const state::Entry& e : tokens) {
    const auto j = nlohmann::json::parse(e.value, nullptr, false);
    try {
      if (j.is_object())
        join_tokens_[e.key] = JoinToken{j.value("node", ""), j.value("expires_s", int64_t{0})};
    } catch (const nlohmann::json::exception&) {
      // a token that cannot be read admits nobody
    }
  }
  return Status::ok();
}

Status UserRegistry::commit(const std::vector<Write>& batch) {
  if (!store_) {
    return Status::failedPrecondition(
        "this coordinator is a standby: users, accounts and join tokens change "
        "on the leader");
  }
  return store_->applyBatch(batch);
}

// ---- Users ------------------------------------------------------------------------------------------------

std::optional<Identity> UserRegistry::authenticate(const std::string& token) const {
  if (token.empty()) return std::nullopt;
  const std::string hash = pki::sha256Hex(token);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return std::nullopt;
  // The map lookup compared hashes of a secret; that leaks nothing about the token itself.
  return identityOf(it->second, users_.at(it->second));
}

Identity UserRegistry::identityOf(const std::string& name, const User& user) {
  Identity who{name, user.role, "token", user.account};
  who.accounts = user.accounts;
  return who;
}

bool Identity::inAccount(const std::string& name) const {
  return name == (account.empty() ? std::string(kRootAccount) : account) ||
         std::find(accounts.begin(), accounts.end(), name) != accounts.end();
}

StatusOr<std::string> UserRegistry::add(const std::string& name, Role role, bool rotate,
                                        const std::string& account) {
  if (auto why = checkUserName(name); !why.empty()) return Status::invalidArgument(why);
  if (Status st = checkRole(role); !st) return st;
  auto token = newToken(kTokenPrefix);
  if (!token) return token.status();
  std::lock_guard<std::mutex> writing(write_mu_);  // the copy changes only under it: read freely
  auto it = users_.find(name);
  if (it != users_.end() && !rotate) {
    return Status::failedPrecondition("user '" + name + "' exists (give --rotate for a new token)");
  }
  if (it == users_.end() && rotate) return Status::notFound("no user '" + name + "' to rotate");
  if (it == users_.end() && users_.size() >= kMaxUsers) {
    return Status::failedPrecondition("the registry holds 10000 users already");
  }
  if (!account.empty()) {
    if (Status st = accountExists(account); !st) return st;
  }
  User user;
  if (it != users_.end()) {
    user = it->second;
    if (role != Role::kAdmin && lastAdmin(name)) {
      return Status::failedPrecondition("'" + name + "' is the last admin; it stays an admin");
    }
  } else {
    user.created_s = now_s_();
  }
  user.role = role;
  user.token_sha256 = token->second;
  if (!account.empty()) {
    user.account = account;  // moved: its other accounts stay, the new default is no longer among them
    user.accounts.erase(std::remove(user.accounts.begin(), user.accounts.end(), account),
                        user.accounts.end());
  }
  if (Status st = commit({Write::putEntry({kUsersTable, name, userJson(user).dump()})}); !st) return st;
  std::lock_guard<std::mutex> lock(mu_);
  if (it != users_.end()) by_hash_.erase(it->second.token_sha256);
  users_[name] = user;
  by_hash_[user.token_sha256] = name;
  return token->first;
}

Status UserRegistry::remove(const std::string& name) {
  std::lock_guard<std::mutex> writing(write_mu_);
  auto it = users_.find(name);
  if (it == users_.end()) return Status::notFound("no user '" + name + "'");
  if (lastAdmin(name)) {
    return Status::failedPrecondition("'" + name +
                                      "' is the last admin and cannot be removed (make another "
                                      "admin first)");
  }
  if (Status st = commit({Write::deleteEntry(kUsersTable, name)}); !st) return st;
  const bool had_limits = it->second.limits != Limits{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    by_hash_.erase(it->second.token_sha256);
    users_.erase(it);
  }
  if (had_limits && accounts_changed_) accounts_changed_(accounts());  // its limits leave the scheduler too
  return Status::ok();
}

Status UserRegistry::accountExists(const std::string& name) const {
  if (name == kRootAccount || accounts_.count(name)) return Status::ok();
  return Status::notFound("no account '" + name + "' (an admin makes one with 'ddlctl admin add-account " +
                          name + "')");
}

bool UserRegistry::lastAdmin(const std::string& name) const {
  auto it = users_.find(name);
  if (it == users_.end() || it->second.role != Role::kAdmin) return false;
  return std::count_if(users_.begin(), users_.end(),
                       [](const auto& u) { return u.second.role == Role::kAdmin; }) == 1;
}

std::vector<Identity> UserRegistry::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Identity> out;
  for (const auto& [name, user] : users_) out.push_back(identityOf(name, user));
  return out;
}

StatusOr<Identity> UserRegistry::setUserAccounts(const std::string& name, const std::vector<std::string>& add,
                                                 const std::vector<std::string>& remove,
                                                 const std::string& default_account) {
  std::lock_guard<std::mutex> writing(write_mu_);  // the copy changes only under it: read freely
  auto it = users_.find(name);
  if (it == users_.end()) return Status::notFound("no user '" + name + "'");
  User user = it->second;
  std::set<std::string> in(user.accounts.begin(), user.accounts.end());
  in.insert(user.account);
  for (const std::string& a : add) {
    if (Status st = accountExists(a); !st) return st;
    in.insert(a);
  }
  if (!default_account.empty()) {
    if (Status st = accountExists(default_account); !st) return st;
    in.insert(default_account);  // making it the default joins it
    user.account = default_account;
  }
  for (const std::string& a : remove) {
    if (a == user.account) {
      return Status::failedPrecondition("account " + a + " is " + name +
                                        "'s default; make another the default first (--default)");
    }
    if (!in.erase(a)) return Status::notFound("user '" + name + "' is not in account '" + a + "'");
  }
  in.erase(user.account);
  if (in.size() > kMaxAccountsPerUser) {
    return Status::failedPrecondition("a user is in at most " + std::to_string(kMaxAccountsPerUser + 1) +
                                      " accounts");
  }
  user.accounts.assign(in.begin(), in.end());
  if (Status st = commit({Write::putEntry({kUsersTable, name, userJson(user).dump()})}); !st) return st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    it->second = user;
  }
  if (accounts_changed_) accounts_changed_(accounts());  // the accounts' user counts changed
  return identityOf(name, user);
}

size_t UserRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return users_.size();
}

StatusOr<std::string> addToUsersFile(const std::string& users_json, const std::string& name, Role role) {
  if (auto why = checkUserName(name); !why.empty()) return Status::invalidArgument(why);
  if (Status st = checkRole(role); !st) return st;
  auto users = readUsersFile(users_json, nullptr);
  if (!users) return users.status();
  auto token = newToken(UserRegistry::kTokenPrefix);
  if (!token) return token.status();
  UserRegistry::User& user = (*users)[name];
  if (user.token_sha256.empty()) user.created_s = unixNowS();
  user.role = role;
  user.token_sha256 = token->second;
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [n, u] : *users) {
    nlohmann::json j = userJson(u);
    j["name"] = n;
    list.push_back(j);
  }
  std::string error;
  if (!pki::writeFile(users_json, nlohmann::json({{"users", list}}).dump(2) + "\n", 0600, &error)) {
    return Status::internal(error);
  }
  return token->first;
}

// ---- Accounts ---------------------------------------------------------------------------------------------

bool UserRegistry::within(const std::string& account, const std::string& ancestor) const {
  std::string at = account;
  for (size_t depth = 0; depth <= accounts_.size() + 1; ++depth) {  // bounded: a tree has no longer path
    if (at == ancestor) return true;
    auto it = accounts_.find(at);
    if (it == accounts_.end()) return false;  // root (or unknown): the top
    at = it->second.parent;
  }
  return false;
}

Status UserRegistry::addAccount(const std::string& name, const std::string& parent, int64_t share,
                                bool update) {
  if (auto why = checkAccountName(name); !why.empty()) return Status::invalidArgument(why);
  if (name == kRootAccount)
    return Status::invalidArgument("'root' is the top of the account tree and has no share");
  if (share < 0 || share > kMaxShare || (share == 0 && !update)) {
    return Status::invalidArgument("a share is 1 to " + std::to_string(kMaxShare));
  }
  std::lock_guard<std::mutex> writing(write_mu_);
  auto it = accounts_.find(name);
  if (it != accounts_.end() && !update) {
    return Status::failedPrecondition("account '" + name +
                                      "' exists (give --update to change its share or parent)");
  }
  if (it == accounts_.end() && update) return Status::notFound("no account '" + name + "' to update");
  if (it == accounts_.end() && accounts_.size() >= kMaxAccounts) {
    return Status::failedPrecondition("the registry holds 10000 accounts already");
  }
  Account account = it != accounts_.end() ? it->second : Account{kRootAccount, share, now_s_(), {}};
  if (share > 0) account.share = share;
  if (!parent.empty()) {
    if (parent != kRootAccount && !accounts_.count(parent)) {
      return Status::notFound("no parent account '" + parent + "'");
    }
    if (within(parent, name)) {
      return Status::invalidArgument("account '" + parent + "' lies under '" + name +
                                     "', so it cannot be its parent");
    }
    account.parent = parent;
  }
  if (Status st = commit({Write::putEntry({kAccountsTable, name, accountJson(account).dump()})}); !st)
    return st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    accounts_[name] = account;
  }
  if (accounts_changed_) accounts_changed_(accounts());
  return Status::ok();
}

Status UserRegistry::removeAccount(const std::string& name) {
  if (name == kRootAccount)
    return Status::invalidArgument("'root' is the top of the account tree and always exists");
  std::lock_guard<std::mutex> writing(write_mu_);
  if (!accounts_.count(name)) return Status::notFound("no account '" + name + "'");
  std::vector<std::string> holding;
  for (const auto& [n, a] : accounts_) {
    if (a.parent == name) holding.push_back("account " + n);
  }
  for (const auto& [n, u] : users_) {
    if (u.account == name) holding.push_back("user " + n);
    if (std::count(u.accounts.begin(), u.accounts.end(), name)) {
      holding.push_back("user " + n + " (not by default: 'ddlctl admin user-accounts " + n + " --remove " +
                        name + "')");
    }
  }
  for (const auto& [n, q] : qos_) {
    if (std::count(q.accounts.begin(), q.accounts.end(), name))
      holding.push_back("QoS " + n + ", which names it in --accounts");
  }
  if (!holding.empty()) {
    std::string some;
    for (size_t i = 0; i < holding.size() && i < 3; ++i) some += (i ? ", " : "") + holding[i];
    if (holding.size() > 3) some += " and " + std::to_string(holding.size() - 3) + " more";
    return Status::failedPrecondition("account '" + name + "' still holds " + some +
                                      "; move or remove them first");
  }
  if (Status st = commit({Write::deleteEntry(kAccountsTable, name)}); !st) return st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    accounts_.erase(name);
  }
  if (accounts_changed_) accounts_changed_(accounts());
  return Status::ok();
}

std::vector<AccountInfo> UserRegistry::accounts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int> users;
  for (const auto& [n, u] : users_) {
    ++users[u.account];
    for (const std::string& a : u.accounts) ++users[a];
  }
  std::vector<AccountInfo> out{{{}, kRootAccount, "", 1, users[kRootAccount], 0}};
  for (const auto& [n, a] : accounts_) out.push_back({a.limits, n, a.parent, a.share, users[n], a.created_s});
  return out;
}

StatusOr<Limits> UserRegistry::setLimit(const std::string& account, const std::string& user,
                                        const LimitChange& change) {
  if (account.empty() == user.empty()) return Status::invalidArgument("give one account or one user");
  for (const std::optional<int>* v : {&change.gpus, &change.running, &change.pending}) {
    if (*v && (**v < 0 || **v > 10000000))
      return Status::invalidArgument("a limit is 0 (none) to 10,000,000");
  }
  if (change.gpu_hours && !(*change.gpu_hours >= 0 && *change.gpu_hours <= 1e9)) {
    return Status::invalidArgument("a GPU-hours limit is 0 (none) to 1,000,000,000");
  }
  if (change.period && !knownPeriod(*change.period)) {
    return Status::invalidArgument("period '" + *change.period + "' is not day, week or month");
  }
  auto apply = [&](Limits l) {
    if (change.gpus) l.gpus = *change.gpus;
    if (change.running) l.running = *change.running;
    if (change.pending) l.pending = *change.pending;
    if (change.gpu_hours) l.gpu_hours = *change.gpu_hours;
    if (change.period) l.period = *change.period;
    if (l.gpu_hours == 0) l.period = Limits{}.period;  // no budget: nothing counts over a period
    return l;
  };
  auto periodAlone = [&](const Limits& l) -> Status {
    if (change.period && l.gpu_hours == 0 && !(change.gpu_hours && *change.gpu_hours == 0)) {
      return Status::invalidArgument("a period is what a GPU-hours budget counts over: give --gpu-hours too");
    }
    return Status::ok();
  };
  std::lock_guard<std::mutex> writing(write_mu_);
  Limits set;
  if (!account.empty()) {
    if (account == kRootAccount)
      return Status::invalidArgument("root holds the whole cluster; limit its accounts");
    auto it = accounts_.find(account);
    if (it == accounts_.end()) return Status::notFound("no account '" + account + "'");
    Account changed = it->second;
    changed.limits = set = apply(changed.limits);
    if (Status st = periodAlone(set); !st) return st;
    if (Status st = commit({Write::putEntry({kAccountsTable, account, accountJson(changed).dump()})}); !st)
      return st;
    std::lock_guard<std::mutex> lock(mu_);
    it->second = changed;
  } else {
    auto it = users_.find(user);
    if (it == users_.end()) return Status::notFound("no user '" + user + "'");
    User changed = it->second;
    changed.limits = set = apply(changed.limits);
    if (Status st = periodAlone(set); !st) return st;
    if (Status st = commit({Write::putEntry({kUsersTable, user, userJson(changed).dump()})}); !st) return st;
    std::lock_guard<std::mutex> lock(mu_);
    it->second = changed;
  }
  if (accounts_changed_) accounts_changed_(accounts());
  return set;
}

std::vector<QosInfo> UserRegistry::qosList() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<QosInfo> out;
  auto normal = qos_.find(kNormalQos);
  if (normal != qos_.end()) {
    out.push_back(normal->second);
  } else {
    out.push_back(QosInfo{});
    out.back().name = kNormalQos;
  }
  for (const auto& [name, q] : qos_) {
    if (name != kNormalQos) out.push_back(q);
  }
  return out;
}

StatusOr<QosInfo> UserRegistry::setQos(const std::string& name, const QosChange& change, bool update) {
  if (auto why = checkName("QoS", name); !why.empty()) return Status::invalidArgument(why);
  if (!store_) return Status::failedPrecondition("this registry is read-only");
  if (change.priority && (*change.priority < 0 || *change.priority > kMaxQosPriority))
    return Status::invalidArgument("a QoS priority is 0 to " + std::to_string(kMaxQosPriority));
  if (change.grace_s && (*change.grace_s < 0 || *change.grace_s > kMaxGraceS))
    return Status::invalidArgument("a grace time is 0 to " + std::to_string(kMaxGraceS) + " seconds");
  if (change.gpus && *change.gpus < 0) return Status::invalidArgument("a GPU limit is 0 (none) or more");
  std::lock_guard<std::mutex> writing(write_mu_);
  const std::vector<QosInfo> all = qosList();
  auto existing = std::find_if(all.begin(), all.end(), [&](const QosInfo& q) { return q.name == name; });
  if (existing != all.end() && !update && name != kNormalQos)
    return Status::failedPrecondition("QoS '" + name + "' exists (give --update to change it)");
  if (existing == all.end() && update) return Status::notFound("no QoS '" + name + "' to update");
  if (existing == all.end() && all.size() > kMaxQos)
    return Status::failedPrecondition("the registry holds " + std::to_string(kMaxQos) + " QoS already");
  QosInfo q = existing != all.end() ? *existing : QosInfo{};
  q.name = name;
  if (q.created_s == 0) q.created_s = now_s_();
  if (change.priority) q.priority = *change.priority;
  if (change.grace_s) q.grace_s = *change.grace_s;
  if (change.gpus) q.gpus = *change.gpus;
  if (change.preempt) q.preempt = *change.preempt;
  if (change.accounts) q.accounts = *change.accounts;
  std::sort(q.preempt.begin(), q.preempt.end());
  q.preempt.erase(std::unique(q.preempt.begin(), q.preempt.end()), q.preempt.end());
  for (const std::string& victim : q.preempt) {
    auto v = std::find_if(all.begin(), all.end(), [&](const QosInfo& o) { return o.name == victim; });
    if (v == all.end()) return Status::notFound("no QoS '" + victim + "' to preempt");
    if (victim == name || v->priority >= q.priority) {
      return Status::invalidArgument("QoS " + name + " (priority " + std::to_string(q.priority) +
                                     ") may preempt only QoS of a lower priority; " + victim + " has " +
                                     std::to_string(v->priority));
    }
  }
  // A QoS that preempts this one must stay above it.
  for (const QosInfo& o : all) {
    if (o.name != name && std::count(o.preempt.begin(), o.preempt.end(), name) && o.priority <= q.priority) {
      return Status::invalidArgument("QoS " + o.name + " (priority " + std::to_string(o.priority) +
                                     ") preempts " + name + ", whose priority must stay below it");
    }
  }
  for (const std::string& a : q.accounts) {
    if (a != kRootAccount && !accounts_.count(a)) return Status::notFound("no account '" + a + "'");
  }
  if (!q.preempt.empty() && q.accounts.empty()) {
    return Status::invalidArgument("QoS " + name +
                                   " preempts others, so it names the accounts that may use it (--accounts; "
                                   "root: every account)");
  }
  if (Status st = commit({Write::putEntry({kQosTable, name, qosJson(q).dump()})}); !st) return st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    qos_[name] = q;
  }
  if (accounts_changed_) accounts_changed_(accounts());
  return q;
}

Status UserRegistry::removeQos(const std::string& name) {
  if (name == kNormalQos)
    return Status::invalidArgument("QoS normal always exists (change it with --update)");
  std::lock_guard<std::mutex> writing(write_mu_);
  if (!qos_.count(name)) return Status::notFound("no QoS '" + name + "'");
  for (const auto& [other, q] : qos_) {
    if (std::count(q.preempt.begin(), q.preempt.end(), name))
      return Status::failedPrecondition("QoS " + other + " preempts " + name + "; change it first");
  }
  if (Status st = commit({Write::deleteEntry(kQosTable, name)}); !st) return st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    qos_.erase(name);
  }
  if (accounts_changed_) accounts_changed_(accounts());
  return Status::ok();
}

std::map<std::string, Limits> UserRegistry::userLimits() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, Limits> out;
  for (const auto& [n, u] : users_) {
    if (u.limits != Limits{}) out[n] = u.limits;
  }
  return out;
}

bool UserRegistry::hasAccount(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  return name == kRootAccount || accounts_.count(name) > 0;
}

// ---- Join tokens ------------------------------------------------------------------------------------------

StatusOr<std::string> UserRegistry::createJoinToken(const std::string& node, int64_t ttl_s, int64_t* expires_s) {
  if (auto why = pki::checkNodeName(node); !why.empty()) return Status::invalidArgument(why);
  if (ttl_s <= 0 || ttl_s > 7 * 86400) return Status::invalidArgument("a join token lives 1 s to 7 days");
  auto token = newToken(kJoinTokenPrefix);
  if (!token) return token.status();
  const int64_t now = now_s_();
  std::lock_guard<std::mutex> writing(write_mu_);
  std::vector<Write> batch;  // the expired ones go with it
  for (const auto& [hash, t] : join_tokens_) {
    if (t.expires_s < now) batch.push_back(Write::deleteEntry(kJoinTokensTable, hash));
  }
  if (join_tokens_.size() - batch.size() >= kMaxJoinTokens) {
    return Status::failedPrecondition(
        "1024 join tokens are live already; wait for some to be used or expire");
  }
  const JoinToken made{node, now + ttl_s};
  batch.push_back(Write::putEntry({kJoinTokensTable, token->second,
                                   nlohmann::json({{"node", node}, {"expires_s", made.expires_s}}).dump()}));
  if (Status st = commit(batch); !st) return st;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = join_tokens_.begin(); it != join_tokens_.end();) {
    it = it->second.expires_s < now ? join_tokens_.erase(it) : std::next(it);
  }
  join_tokens_[token->second] = made;
  *expires_s = made.expires_s;
  return token->first;
}

Status UserRegistry::redeemJoinToken(const std::string& token, const std::string& node) {
  const std::string hash = pki::sha256Hex(token);
  std::lock_guard<std::mutex> writing(write_mu_);
  auto it = join_tokens_.find(hash);
  if (it == join_tokens_.end()) return Status::unauthenticated("unknown or used join token");
  if (it->second.expires_s < now_s_()) {
    if (commit({Write::deleteEntry(kJoinTokensTable, hash)})) {
      std::lock_guard<std::mutex> lock(mu_);
      join_tokens_.erase(it);
    }
    return Status::unauthenticated("the join token has expired; make another with 'ddlctl admin join-token'");
  }
  if (it->second.node != node) {
    return Status::permissionDenied("the join token is for node '" + it->second.node + "', not '" + node + "'");
  }
  // Used up once that is durable: a token whose use was not recorded admits nobody now, but works again after
  // a failover, so it must not admit the node now either.
  if (Status st = commit({Write::deleteEntry(kJoinTokensTable, hash)}); !st) {
    return Status(st.code(), "cannot record the join token's use: " + st.message());
  }
  std::lock_guard<std::mutex> lock(mu_);
  join_tokens_.erase(it);
  return Status::ok();
}

}  // namespace ddl::coordinator::auth
