// The pieces of ddl's security without a network: the PKI (common/pki), the user registry and join tokens
// (coordinator/auth/users), the PKI directory tools (auth/pki_dir) and the access rules (auth/access).
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <map>

#include "auth/access.h"
#include "auth/pki_dir.h"
#include "auth/users.h"
#include "common/pki.h"
#include "state/memory_store.h"
#include "state/sqlite_store.h"
#include "temp_dir.h"

namespace ddl::coordinator {
namespace {

namespace fs = std::filesystem;
using auth::Identity;
using auth::Role;

using test_util::TempDir;

unsigned modeOf(const std::string& path) {
  struct stat st {};
  stat(path.c_str(), &st);
  return st.st_mode & 0777;
}

TEST(Pki, CertificatesChainToTheirCaAndExpire) {
  std::string error;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  auto ca_key = pki::newPrivateKey(&error);
  ASSERT_TRUE(ca_key) << error;
  auto ca = pki::makeCertificate({"test CA", {}, {}, pki::Usage::kCa}, *ca_key, "", "", now - 60, now + 3600, &error);
  ASSERT_TRUE(ca) << error;
  auto key = pki::newPrivateKey(&error);
  auto csr = pki::makeCsr(*key, "n7", &error);
  ASSERT_TRUE(csr) << error;
  EXPECT_EQ(pki::csrCommonName(*csr, &error).value_or(""), "n7");
  auto cert = pki::makeCertificate({"n7", {"n7"}, {}, pki::Usage::kClient}, *csr, *ca, *ca_key, now - 60, now + 60,
                                   &error);
  ASSERT_TRUE(cert) << error;
  auto info = pki::inspectCertificate(*cert, &error);
  ASSERT_TRUE(info) << error;
  EXPECT_EQ(info->common_name, "n7");
  EXPECT_EQ(info->dns_names, std::vector<std::string>{"n7"});
  EXPECT_EQ(info->issuer_common_name, "test CA");
  EXPECT_EQ(info->sha256.size(), 64u);
  EXPECT_TRUE(pki::verifyCertificate(*cert, *ca, now, &error)) << error;
  EXPECT_FALSE(pki::verifyCertificate(*cert, *ca, now + 3600, &error));
  EXPECT_EQ(error, "expired");

  // Another CA's certificate does not verify; a tampered request is refused.
  auto other_key = pki::newPrivateKey(&error);
  auto other = pki::makeCertificate({"other", {}, {}, pki::Usage::kCa}, *other_key, "", "", now - 60, now + 60, &error);
  EXPECT_FALSE(pki::verifyCertificate(*cert, *other, now, &error));
  std::string bad_csr = *csr;
  bad_csr[bad_csr.size() / 2] = bad_csr[bad_csr.size() / 2] == 'A' ? 'B' : 'A';
  EXPECT_FALSE(pki::csrCommonName(bad_csr, &error));
  // A CA key that is not the CA certificate's signs nothing.
  EXPECT_FALSE(pki::makeCertificate({"n8", {}, {}, pki::Usage::kClient}, *key, *ca, *other_key, now, now + 60, &error));
}

TEST(Pki, NamesAndHelpers) {
  EXPECT_EQ(pki::checkNodeName("gpu-node_1.rack2"), "");
  EXPECT_NE(pki::checkNodeName(""), "");
  EXPECT_NE(pki::checkNodeName("-x"), "");
  EXPECT_NE(pki::checkNodeName("a b"), "");
  EXPECT_NE(pki::checkNodeName("ddl-coordinator"), "");
  EXPECT_NE(pki::checkNodeName("DDL-Coordinator"), "");  // host names match without case
  EXPECT_NE(pki::checkNodeName("ddl-coordinator."), "");
  // Keys go only into directories of the caller's that nobody else may write to, never through a prepared name.
  TempDir dir;
  std::string error;
  EXPECT_TRUE(pki::makePrivateDir(dir / "keys", &error)) << error;
  EXPECT_EQ(modeOf(dir / "keys"), 0700u);
  EXPECT_TRUE(pki::makePrivateDir(dir / "keys", &error)) << error;  // it exists and is ours
  fs::create_directories(dir / "shared");
  chmod((dir / "shared").c_str(), 01777);
  EXPECT_FALSE(pki::makePrivateDir(dir / "shared", &error));
  EXPECT_NE(error.find("others may write"), std::string::npos) << error;
  fs::create_symlink("/nonexistent-target", dir / "keys/node.key.tmp");
  EXPECT_TRUE(pki::writeFile(dir / "keys/node.key", "secret", 0600, &error)) << error;
  EXPECT_FALSE(fs::exists("/nonexistent-target"));
  EXPECT_EQ(modeOf(dir / "keys/node.key"), 0600u);
  EXPECT_EQ(pki::sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_TRUE(pki::constantTimeEqual("abc", "abc"));
  EXPECT_FALSE(pki::constantTimeEqual("abc", "abd"));
  EXPECT_FALSE(pki::constantTimeEqual("abc", "ab"));
  EXPECT_NE(pki::randomHex(16), pki::randomHex(16));
}

TEST(PkiDir, InitMakesPrivateFilesAndNeverOverwritesACa) {
  TempDir dir;
  auth::InitPkiOptions options;
  options.dir = dir / "pki";
  auto token = auth::initPki(options);
  ASSERT_TRUE(token) << token.status().toString();
  for (const char* secret : {"ca.key", "coordinator.key", "users.json", "admin.token"}) {
    EXPECT_EQ(modeOf(options.dir + "/" + secret), 0600u) << secret;
  }
  std::string error;
  auto coordinator = pki::inspectCertificate(*pki::readFile(options.dir + "/coordinator.crt", &error), &error);
  ASSERT_TRUE(coordinator) << error;
  EXPECT_NE(std::find(coordinator->dns_names.begin(), coordinator->dns_names.end(), "ddl-coordinator"),
            coordinator->dns_names.end());
  auto users = auth::UserRegistry::readOnly(options.dir + "/users.json");
  ASSERT_TRUE(users);
  auto admin = (*users)->authenticate(*token);
  ASSERT_TRUE(admin);
  EXPECT_EQ(admin->name, "admin");
  EXPECT_EQ(admin->role, Role::kAdmin);
  // A second init-pki would replace the CA every node trusts: refused.
  auto again = auth::initPki(options);
  EXPECT_FALSE(again);
  EXPECT_NE(again.status().message().find("holds a CA already"), std::string::npos);
  // A node's files, and a renewed coordinator certificate from the same CA.
  ASSERT_TRUE(auth::issueNodeFiles(options.dir, "n1", 30, dir / "n1"));
  EXPECT_EQ(modeOf(dir / "n1/node.key"), 0600u);
  const std::string before = *pki::readFile(options.dir + "/coordinator.crt", &error);
  ASSERT_TRUE(auth::renewCoordinatorCert(options.dir, {"10.0.0.5"}, 30));
  const std::string after = *pki::readFile(options.dir + "/coordinator.crt", &error);
  EXPECT_NE(before, after);
  EXPECT_TRUE(pki::verifyCertificate(after, *pki::readFile(options.dir + "/ca.crt", &error),
                                     static_cast<int64_t>(std::time(nullptr)), &error));
  EXPECT_FALSE(auth::issueNodeFiles(options.dir, "ddl-coordinator", 30, dir / "x"));
}

// The one signing rule behind issue-node, ddlctl admin issue-node and Join.
TEST(PkiDir, NodeCertificatesNameTheNodeAndLastTheirDays) {
  std::string error;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  auto ca_key = pki::newPrivateKey(&error);
  auto ca = pki::makeCertificate({"test CA", {}, {}, pki::Usage::kCa}, *ca_key, "", "", now - 60,
                                 now + 86400 * 40, &error);
  ASSERT_TRUE(ca) << error;
  auto csr = pki::makeCsr(*pki::newPrivateKey(&error), "n7", &error);
  ASSERT_TRUE(csr) << error;
  auto cert = auth::signNodeCertificate("n7", *csr, *ca, *ca_key, 30, now);
  ASSERT_TRUE(cert) << cert.status().toString();
  EXPECT_EQ(cert->not_after_s, now + 30 * 86400);
  auto info = pki::inspectCertificate(cert->pem, &error);
  ASSERT_TRUE(info) << error;
  EXPECT_EQ(info->common_name, "n7");
  EXPECT_EQ(info->dns_names, std::vector<std::string>{"n7"});
  EXPECT_EQ(info->issuer_common_name, "test CA");
  EXPECT_EQ(info->not_before_s, now - 300);
  EXPECT_EQ(info->not_after_s, now + 30 * 86400);
  EXPECT_TRUE(pki::verifyCertificate(cert->pem, *ca, now, &error)) << error;

  EXPECT_EQ(auth::signNodeCertificate("ddl-coordinator", *csr, *ca, *ca_key, 30, now).status().code(),
            state::StatusCode::kInvalidArgument);
  EXPECT_FALSE(auth::signNodeCertificate("n7", *csr, *ca, *ca_key, 0, now));
  EXPECT_FALSE(auth::signNodeCertificate("n7", *csr, *ca, *ca_key, auth::kMaxNodeCertDays + 1, now));
  EXPECT_TRUE(auth::signNodeCertificate("n7", *csr, *ca, *ca_key, auth::kMaxNodeCertDays, now));
  EXPECT_FALSE(
      auth::signNodeCertificate("n7", *csr, *ca, *pki::newPrivateKey(&error), 30, now));  // not the CA's key
}

// Every byte of the SQLite state files of `dir` (the database and its WAL), to look for a secret in.
std::string stateBytes(const TempDir& dir) {
  std::string bytes, error;
  for (const char* f : {"state.db", "state.db-wal"}) bytes += pki::readFile(dir / f, &error).value_or("");
  return bytes;
}

std::unique_ptr<state::SqliteStore> openSqlite(const TempDir& dir) {
  state::SqliteStore::Options options;
  options.path = dir / "state.db";
  auto store = state::SqliteStore::open(options);
  EXPECT_TRUE(store) << store.status().toString();
  return store ? std::move(*store) : nullptr;
}

TEST(UserRegistry, TokensAreHashedStoredRotatedAndRemoved) {
  TempDir dir;
  auto store = openSqlite(dir);
  auto users = auth::UserRegistry::open(*store, dir / "users.json");
  ASSERT_TRUE(users) << users.status().toString();
  auto root = (*users)->add("ops", Role::kAdmin, false);
  auto alice = (*users)->add("alice", Role::kUser, false);
  ASSERT_TRUE(root && alice);
  EXPECT_EQ(alice->rfind("ddl_", 0), 0u);
  EXPECT_FALSE((*users)->add("alice", Role::kUser, false));      // exists
  EXPECT_FALSE((*users)->add("Alice", Role::kUser, false));      // not an account name
  EXPECT_FALSE((*users)->add("bob", Role::kUser, /*rotate=*/true));  // nothing to rotate
  EXPECT_EQ(stateBytes(dir).find(*alice), std::string::npos) << "the token itself is stored";
  EXPECT_NE(stateBytes(dir).find(pki::sha256Hex(*alice)), std::string::npos);

  // Another registry over the same file (a restarted coordinator) knows what was stored.
  users->reset();
  store = openSqlite(dir);
  auto reopened = auth::UserRegistry::open(*store, dir / "users.json");
  ASSERT_TRUE(reopened);
  EXPECT_EQ((*reopened)->authenticate(*alice).value_or(Identity{}).name, "alice");
  EXPECT_EQ((*reopened)->authenticate(*alice)->account, "root");
  EXPECT_FALSE((*reopened)->authenticate(*alice + "x"));
  EXPECT_FALSE((*reopened)->authenticate(""));
  auto rotated = (*reopened)->add("alice", Role::kAdmin, true);
  ASSERT_TRUE(rotated);
  EXPECT_FALSE((*reopened)->authenticate(*alice));
  EXPECT_EQ((*reopened)->authenticate(*rotated)->role, Role::kAdmin);
  ASSERT_TRUE((*reopened)->remove("alice"));
  EXPECT_FALSE((*reopened)->authenticate(*rotated));
  EXPECT_FALSE((*reopened)->remove("alice"));
  // The last admin stays: neither removed nor made a user.
  EXPECT_EQ((*reopened)->remove("ops").code(), state::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*reopened)->add("ops", Role::kUser, true).status().code(),
            state::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*reopened)->authenticate(*root)->role, Role::kAdmin);
  reopened->reset();
  store = openSqlite(dir);
  auto third = auth::UserRegistry::open(*store, dir / "users.json");
  ASSERT_TRUE(third);
  EXPECT_FALSE((*third)->authenticate(*rotated)) << "a removed user came back";
  EXPECT_EQ((*third)->size(), 1u);
}

// init-pki's users.json goes into the store once; later edits of the file are not read (users live in the
// store), and a user removed from the store does not come back from the file.
TEST(UserRegistry, UsersJsonIsImportedOnceIntoTheStore) {
  TempDir dir;
  const std::string file = dir / "users.json";
  auto admin = auth::addToUsersFile(file, "admin", Role::kAdmin);
  auto alice = auth::addToUsersFile(file, "alice", Role::kUser);
  ASSERT_TRUE(admin && alice);
  EXPECT_EQ(modeOf(file), 0600u);
  state::MemoryStore store;
  auto users = auth::UserRegistry::open(store, file);
  ASSERT_TRUE(users) << users.status().toString();
  EXPECT_EQ((*users)->authenticate(*alice).value_or(Identity{}).name, "alice");
  EXPECT_EQ(store.listEntries("users")->size(), 2u);
  EXPECT_EQ(store.listEntries("imports")->size(), 1u);
  ASSERT_TRUE((*users)->remove("alice"));
  auto bob = auth::addToUsersFile(file, "bob", Role::kUser);  // an edit after the import
  ASSERT_TRUE(bob);
  auto again = auth::UserRegistry::open(store, file);
  ASSERT_TRUE(again);
  EXPECT_FALSE((*again)->authenticate(*alice)) << "removed in the store, back from the file";
  EXPECT_FALSE((*again)->authenticate(*bob)) << "the file was read again";
  EXPECT_TRUE((*again)->authenticate(*admin));
  // A file that is not a users file is refused, naming it; no file imports nothing (and marks nothing).
  state::MemoryStore fresh;
  ASSERT_TRUE(pki::writeFile(dir / "bad.json", "{\"users\": 7}", 0600, nullptr));
  auto bad = auth::UserRegistry::open(fresh, dir / "bad.json");
  EXPECT_EQ(bad.status().code(), state::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("bad.json"), std::string::npos) << bad.status().message();
  ASSERT_TRUE(auth::UserRegistry::open(fresh, dir / "missing.json"));
  EXPECT_TRUE(fresh.listEntries("")->empty());
}

// A store that refuses every batch once told to: a change it refuses changes nothing in memory either.
class RefusingStore : public state::MemoryStore {
 public:
  state::Status applyBatch(const std::vector<state::Write>& batch) override {
    if (refuse) return state::Status::unavailable("the disk is full");
    return MemoryStore::applyBatch(batch);
  }
  bool refuse = false;
};

TEST(UserRegistry, AChangeTheStoreRefusesChangesNothing) {
  TempDir dir;
  RefusingStore store;
  auto users = auth::UserRegistry::open(store, dir / "users.json");
  ASSERT_TRUE(users);
  auto alice = (*users)->add("alice", Role::kUser, false);
  ASSERT_TRUE((*users)->add("ops", Role::kAdmin, false));
  ASSERT_TRUE(alice && (*users)->addAccount("physics", "", 2, false));
  store.refuse = true;
  EXPECT_EQ((*users)->add("bob", Role::kUser, false).status().code(), state::StatusCode::kUnavailable);
  EXPECT_FALSE((*users)->add("alice", Role::kUser, true));
  EXPECT_FALSE((*users)->remove("alice"));
  EXPECT_FALSE((*users)->addAccount("chem", "", 1, false));
  EXPECT_FALSE((*users)->removeAccount("physics"));
  int64_t expires = 0;
  EXPECT_FALSE((*users)->createJoinToken("n1", 60, &expires));
  EXPECT_TRUE((*users)->authenticate(*alice)) << "a rotation the store refused took the old token";
  EXPECT_EQ((*users)->size(), 2u);
  EXPECT_EQ((*users)->accounts().size(), 2u);
  store.refuse = false;
  auto token = (*users)->createJoinToken("n1", 60, &expires);
  ASSERT_TRUE(token);
  store.refuse = true;  // a join whose use cannot be recorded admits nobody, and the token stays good
  EXPECT_EQ((*users)->redeemJoinToken(*token, "n1").code(), state::StatusCode::kUnavailable);
  store.refuse = false;
  EXPECT_TRUE((*users)->redeemJoinToken(*token, "n1"));
}

// A user in several accounts (Slurm's associations): one default, others its jobs may name; every account it
// is in holds it (it cannot be removed under the user), and a second coordinator reads the same.
TEST(UserRegistry, AUserIsInSeveralAccountsWithOneDefault) {
  TempDir dir;
  state::MemoryStore store;
  auto users = auth::UserRegistry::open(store, dir / "users.json");
  ASSERT_TRUE(users);
  for (const char* a : {"physics", "chem", "ops"}) ASSERT_TRUE((*users)->addAccount(a, "", 1, false));
  auto token = (*users)->add("alice", Role::kUser, false, "physics");
  ASSERT_TRUE(token);
  auto who = (*users)->setUserAccounts("alice", {"chem", "ops"}, {}, "");
  ASSERT_TRUE(who);
  EXPECT_EQ(who->account, "physics");
  EXPECT_EQ(who->accounts, (std::vector<std::string>{"chem", "ops"}));
  EXPECT_TRUE(who->inAccount("chem") && who->inAccount("physics") && !who->inAccount("root"));
  EXPECT_EQ((*users)->authenticate(*token)->accounts, who->accounts);  // the token's identity follows
  // Refused: an unknown account, leaving the default, leaving one it is not in, an unknown user.
  EXPECT_EQ((*users)->setUserAccounts("alice", {"nowhere"}, {}, "").status().code(),
            state::StatusCode::kNotFound);
  auto refused = (*users)->setUserAccounts("alice", {}, {"physics"}, "");
  EXPECT_EQ(refused.status().code(), state::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("default"), std::string::npos) << refused.status().message();
  EXPECT_EQ((*users)->setUserAccounts("alice", {}, {"root"}, "").status().code(),
            state::StatusCode::kNotFound);
  EXPECT_EQ((*users)->setUserAccounts("bob", {"chem"}, {}, "").status().code(), state::StatusCode::kNotFound);
  EXPECT_EQ((*users)->authenticate(*token)->accounts, who->accounts);  // nothing changed by a refusal
  // A new default: the old one stays an account of hers; then she may leave it.
  who = (*users)->setUserAccounts("alice", {}, {}, "chem");
  ASSERT_TRUE(who);
  EXPECT_EQ(who->account, "chem");
  EXPECT_EQ(who->accounts, (std::vector<std::string>{"ops", "physics"}));
  // An account a user is in, by default or not, holds her.
  auto removed = (*users)->removeAccount("ops");
  EXPECT_EQ(removed.code(), state::StatusCode::kFailedPrecondition);
  EXPECT_NE(removed.message().find("user-accounts alice --remove ops"), std::string::npos)
      << removed.message();
  std::map<std::string, int> members;
  for (const auth::AccountInfo& a : (*users)->accounts()) members[a.name] = a.users;
  EXPECT_EQ(members, (std::map<std::string, int>{{"root", 0}, {"physics", 1}, {"chem", 1}, {"ops", 1}}));
  ASSERT_TRUE((*users)->setUserAccounts("alice", {}, {"ops"}, ""));
  ASSERT_TRUE((*users)->removeAccount("ops"));
  // As a second coordinator reads them from the store. Moving her (add-user --rotate --account) leaves the
  // old default.
  auto other = auth::UserRegistry::open(store, dir / "users.json");
  ASSERT_TRUE(other);
  auto rotated = (*other)->add("alice", Role::kUser, true, "physics");
  ASSERT_TRUE(rotated);
  auto moved = (*other)->authenticate(*rotated);
  ASSERT_TRUE(moved);
  EXPECT_EQ(moved->account, "physics");
  EXPECT_TRUE(moved->accounts.empty());  // a move: she left chem, and physics is her default, not another
}

// Accounts: a tree under root with shares; users in one account each; no cycles; only empty accounts go.
TEST(UserRegistry, AccountsFormATreeWithSharesAndHoldUsers) {
  TempDir dir;
  state::MemoryStore store;
  auto users = auth::UserRegistry::open(store, dir / "users.json");
  ASSERT_TRUE(users);
  ASSERT_TRUE((*users)->addAccount("science", "", 2, false));
  ASSERT_TRUE((*users)->addAccount("physics", "science", 3, false));
  ASSERT_TRUE((*users)->addAccount("ops", "root", 1, false));
  EXPECT_EQ((*users)->addAccount("physics", "", 1, false).code(), state::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*users)->addAccount("chem", "nowhere", 1, false).code(), state::StatusCode::kNotFound);
  EXPECT_EQ((*users)->addAccount("chem", "", 0, false).code(), state::StatusCode::kInvalidArgument);
  EXPECT_EQ((*users)->addAccount("chem", "", auth::UserRegistry::kMaxShare + 1, false).code(),
            state::StatusCode::kInvalidArgument);
  EXPECT_EQ((*users)->addAccount("Chem", "", 1, false).code(), state::StatusCode::kInvalidArgument);
  EXPECT_EQ((*users)->addAccount("root", "", 1, false).code(), state::StatusCode::kInvalidArgument);
  // No account may move under itself.
  EXPECT_EQ((*users)->addAccount("science", "physics", 0, true).code(), state::StatusCode::kInvalidArgument);
  EXPECT_EQ((*users)->addAccount("science", "science", 0, true).code(), state::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*users)->addAccount("physics", "", 5, true));     // the share changes, the parent stays
  ASSERT_TRUE((*users)->addAccount("physics", "ops", 0, true));  // the parent changes, the share stays
  EXPECT_EQ((*users)->addAccount("nobody", "", 1, true).code(), state::StatusCode::kNotFound);

  auto alice = (*users)->add("alice", Role::kUser, false, "physics");
  ASSERT_TRUE(alice);
  EXPECT_EQ((*users)->authenticate(*alice)->account, "physics");
  EXPECT_EQ((*users)->add("bob", Role::kUser, false, "nowhere").status().code(),
            state::StatusCode::kNotFound);
  auto rotated = (*users)->add("alice", Role::kUser, true);  // keeps its account
  ASSERT_TRUE(rotated);
  EXPECT_EQ((*users)->authenticate(*rotated)->account, "physics");

  auto removed = (*users)->removeAccount("ops");
  EXPECT_EQ(removed.code(), state::StatusCode::kFailedPrecondition);
  EXPECT_NE(removed.message().find("account physics"), std::string::npos) << removed.message();
  removed = (*users)->removeAccount("physics");
  EXPECT_NE(removed.message().find("user alice"), std::string::npos) << removed.message();
  EXPECT_EQ((*users)->removeAccount("root").code(), state::StatusCode::kInvalidArgument);

  // As a second coordinator reads them from the store.
  auto other = auth::UserRegistry::open(store, dir / "users.json");
  ASSERT_TRUE(other);
  std::vector<std::string> seen;
  for (const auth::AccountInfo& a : (*other)->accounts()) {
    seen.push_back(a.name + "<" + a.parent + ":" + std::to_string(a.share) + "/" + std::to_string(a.users));
  }
  EXPECT_EQ(seen,
            (std::vector<std::string>{"root<:1/0", "ops<root:1/0", "physics<ops:5/1", "science<root:2/0"}));
  ASSERT_TRUE((*other)->add("alice", Role::kUser, true, "science"));
  ASSERT_TRUE((*other)->removeAccount("physics"));
  EXPECT_FALSE((*other)->hasAccount("physics"));
  EXPECT_TRUE((*other)->hasAccount("root"));
}

// A standby's dashboard: a read-only registry starts from users.json and, once the store has imported it,
// takes the store's users instead (a user added since works, a removed one is out); a store that never
// imported the file, or one it cannot read, leaves what it had.
TEST(UserRegistry, AReadOnlyRegistryFollowsTheStore) {
  TempDir dir;
  const std::string file = dir / "users.json";
  auto admin = auth::addToUsersFile(file, "ops", Role::kAdmin);
  ASSERT_TRUE(admin);
  auto standby = auth::UserRegistry::readOnly(file);
  ASSERT_TRUE(standby);
  state::MemoryStore never_led;
  ASSERT_TRUE((*standby)->refreshFrom(never_led));
  EXPECT_TRUE((*standby)->authenticate(*admin));  // the file's users stay

  state::MemoryStore store;
  auto leader = auth::UserRegistry::open(store, file);
  ASSERT_TRUE(leader);
  auto alice = (*leader)->add("alice", Role::kUser, false);
  ASSERT_TRUE(alice);
  EXPECT_FALSE((*standby)->authenticate(*alice));
  ASSERT_TRUE((*standby)->refreshFrom(store));
  EXPECT_EQ((*standby)->authenticate(*alice)->name, "alice");
  EXPECT_TRUE((*standby)->authenticate(*admin));
  ASSERT_TRUE((*leader)->remove("alice"));
  ASSERT_TRUE((*standby)->refreshFrom(store));
  EXPECT_FALSE((*standby)->authenticate(*alice));
  EXPECT_EQ((*standby)->add("bob", Role::kUser, false).status().code(),
            state::StatusCode::kFailedPrecondition);
}

// A damaged entry stops the coordinator with the entry named and how to take it out; the scheduler hears of a
// removed user's limits.
TEST(UserRegistry, ADamagedEntryIsNamedAndARemovedUsersLimitsLeaveTheScheduler) {
  TempDir dir;
  state::MemoryStore damaged;
  ASSERT_TRUE(damaged.applyBatch({state::Write::putEntry({"accounts", "lab", "{\"share\": \"many\"}"})}));
  auto refused = auth::UserRegistry::open(damaged, dir / "users.json");
  EXPECT_EQ(refused.status().code(), state::StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find("accounts/lab"), std::string::npos) << refused.status().message();
  EXPECT_NE(refused.status().message().find("etcdctl del"), std::string::npos) << refused.status().message();

  state::MemoryStore store;
  auto users = auth::UserRegistry::open(store, dir / "users.json");
  ASSERT_TRUE(users);
  ASSERT_TRUE((*users)->add("ops", Role::kAdmin, false));
  ASSERT_TRUE((*users)->add("alice", Role::kUser, false));
  auth::UserRegistry::LimitChange four_gpus;
  four_gpus.gpus = 4;
  ASSERT_TRUE((*users)->setLimit("", "alice", four_gpus));
  // A GPU-hours budget per period: kept with the other limits, read back by another coordinator; a period
  // that is none of day, week, month is refused.
  auth::UserRegistry::LimitChange budget;
  budget.gpu_hours = 250.5;
  budget.period = "week";
  auto set = (*users)->setLimit("", "alice", budget);
  ASSERT_TRUE(set);
  EXPECT_EQ(set->gpus, 4);
  EXPECT_EQ(set->gpu_hours, 250.5);
  EXPECT_EQ(set->period, "week");
  EXPECT_EQ((*auth::UserRegistry::open(store, dir / "users.json"))->userLimits().at("alice"), *set);
  budget.period = "fortnight";
  EXPECT_EQ((*users)->setLimit("", "alice", budget).status().code(), state::StatusCode::kInvalidArgument);
  auth::UserRegistry::LimitChange period_alone;  // on an account without a budget: nothing to count
  period_alone.period = "day";
  ASSERT_TRUE((*users)->addAccount("lab", "", 1, false));
  EXPECT_EQ((*users)->setLimit("lab", "", period_alone).status().code(), state::StatusCode::kInvalidArgument);
  budget.period.reset();
  budget.gpu_hours = -1;
  EXPECT_EQ((*users)->setLimit("", "alice", budget).status().code(), state::StatusCode::kInvalidArgument);
  int heard = 0;
  (*users)->onAccountsChanged([&](const std::vector<auth::AccountInfo>&) { ++heard; });
  ASSERT_TRUE((*users)->remove("alice"));
  EXPECT_EQ(heard, 1);
  EXPECT_TRUE((*users)->userLimits().empty());
}

TEST(UserRegistry, JoinTokensWorkOnceForTheirNodeOnlyAndOutliveARestart) {
  TempDir dir;
  int64_t now = 1'700'000'000;
  state::MemoryStore store;
  auto users = auth::UserRegistry::open(store, dir / "users.json", [&now] { return now; });
  ASSERT_TRUE(users);
  int64_t expires = 0;
  auto token = (*users)->createJoinToken("n5", 60, &expires);
  ASSERT_TRUE(token);
  EXPECT_EQ(expires, now + 60);
  EXPECT_EQ((*users)->redeemJoinToken(*token, "n6").code(), state::StatusCode::kPermissionDenied);
  // A token made before a restart (or a failover) works after it, once.
  auto after = auth::UserRegistry::open(store, dir / "users.json", [&now] { return now; });
  ASSERT_TRUE(after);
  EXPECT_TRUE((*after)->redeemJoinToken(*token, "n5"));
  EXPECT_EQ((*after)->redeemJoinToken(*token, "n5").code(), state::StatusCode::kUnauthenticated);
  EXPECT_TRUE(store.listEntries("join_tokens")->empty());
  EXPECT_FALSE((*users)->createJoinToken("n5", 0, &expires));
  EXPECT_FALSE((*users)->createJoinToken("bad name", 60, &expires));
  // A token works through the second it expires at, and is gone (not merely refused) after it.
  auto last_second = (*users)->createJoinToken("n5", 60, &expires);
  auto too_late = (*users)->createJoinToken("n5", 60, &expires);
  ASSERT_TRUE(last_second && too_late);
  now += 60;
  EXPECT_TRUE((*users)->redeemJoinToken(*last_second, "n5"));
  now += 1;
  auto expired = (*users)->redeemJoinToken(*too_late, "n5");
  EXPECT_EQ(expired.code(), state::StatusCode::kUnauthenticated);
  EXPECT_NE(expired.message().find("expired"), std::string::npos) << expired.message();
  EXPECT_EQ((*users)->redeemJoinToken(*too_late, "n5").message(), "unknown or used join token");
  // Expired tokens leave the store when the next one is made.
  auto stale = (*users)->createJoinToken("n7", 1, &expires);
  ASSERT_TRUE(stale);
  now += 5;
  ASSERT_TRUE((*users)->createJoinToken("n8", 60, &expires));
  EXPECT_EQ(store.listEntries("join_tokens")->size(), 1u);
}

TEST(Access, RulesForUsersViewersNodesAndInsecure) {
  const Identity alice{"alice", Role::kUser, "token"}, bob{"bob", Role::kUser, "token"},
      vera{"vera", Role::kViewer, "token"}, admin{"root-admin", Role::kAdmin, "token"},
      anyone{"", Role::kInsecure, "insecure"};
  v1::Job job;
  job.set_id("j-1");
  job.mutable_spec()->set_user("alice");
  job.mutable_spec()->add_command("train.py");
  job.mutable_spec()->add_env("KEY=secret");
  EXPECT_TRUE(access::mayTouchJob(alice, job, "cancel"));
  EXPECT_EQ(access::mayTouchJob(bob, job, "cancel").code(), state::StatusCode::kPermissionDenied);
  EXPECT_FALSE(access::mayTouchJob(vera, job, "see"));
  EXPECT_TRUE(access::mayTouchJob(admin, job, "cancel"));
  EXPECT_TRUE(access::mayTouchJob(anyone, job, "cancel"));
  EXPECT_FALSE(access::maySubmit(vera));
  EXPECT_FALSE(access::mustBeAdmin(alice, "drain"));

  v1::Job seen = job;
  access::redactFor(bob, &seen);
  EXPECT_EQ(seen.spec().command_size(), 0);
  EXPECT_EQ(seen.spec().env_size(), 0);
  seen = job;
  access::redactFor(alice, &seen);
  EXPECT_EQ(seen.spec().env_size(), 1);

  v1::JobSpec claimed;
  claimed.set_user("alice");
  auto own = access::ownSpec(bob, claimed, false);
  ASSERT_TRUE(own);
  EXPECT_EQ(own->user(), "bob");  // the token's user, not the request's
  EXPECT_EQ(access::ownSpec(Identity{"root", Role::kUser, "token"}, claimed, false).status().code(),
            state::StatusCode::kPermissionDenied);
  EXPECT_TRUE(access::ownSpec(Identity{"root", Role::kUser, "token"}, claimed, true));
  EXPECT_EQ(access::ownSpec(anyone, claimed, false)->user(), "alice");  // insecure: as the request says
  // init-pki's built-in "admin" is no account on the nodes: its jobs would fail everywhere, so they are
  // refused at submit, naming what to do (unless this host has an account of that name).
  if (getpwnam("admin") == nullptr) {
    auto refused = access::ownSpec(Identity{"admin", Role::kAdmin, "token"}, claimed, false);
    EXPECT_EQ(refused.status().code(), state::StatusCode::kPermissionDenied);
    EXPECT_NE(refused.status().message().find("add-user"), std::string::npos) << refused.status().message();
  }
  EXPECT_TRUE(access::ownSpec(Identity{"ops", Role::kAdmin, "token"}, claimed, false));  // a named admin may
  // The account charged: the user's own; another only by an admin, and only one that exists.
  const Identity carol{"carol", Role::kUser, "token", "physics"}, ops{"ops", Role::kAdmin, "token", "root"};
  EXPECT_EQ(access::ownSpec(carol, claimed, false)->account(), "physics");
  EXPECT_EQ(access::ownSpec(anyone, claimed, false)->account(), "root");
  claimed.set_account("chem");
  auto charged = access::ownSpec(carol, claimed, false);
  EXPECT_EQ(charged.status().code(), state::StatusCode::kPermissionDenied);
  EXPECT_NE(charged.status().message().find("carol is in account physics"), std::string::npos)
      << charged.status().message();
  // A user in several accounts may charge any of them, and no other.
  Identity dora{"dora", Role::kUser, "token", "physics"};
  dora.accounts = {"chem"};
  EXPECT_EQ(access::ownSpec(dora, claimed, false)->account(), "chem");
  claimed.set_account("");
  EXPECT_EQ(access::ownSpec(dora, claimed, false)->account(), "physics");  // its default
  claimed.set_account("ops");
  charged = access::ownSpec(dora, claimed, false);
  EXPECT_EQ(charged.status().code(), state::StatusCode::kPermissionDenied);
  EXPECT_NE(charged.status().message().find("dora is in accounts physics, chem"), std::string::npos)
      << charged.status().message();
  claimed.set_account("chem");
  state::MemoryStore store;
  TempDir dir;
  auto users = auth::UserRegistry::open(store, dir / "users.json");
  ASSERT_TRUE(users && (*users)->addAccount("chem", "", 1, false));
  EXPECT_EQ(access::ownSpec(ops, claimed, false, users->get())->account(), "chem");
  claimed.set_account("nowhere");
  EXPECT_EQ(access::ownSpec(ops, claimed, false, users->get()).status().code(), state::StatusCode::kNotFound);

  EXPECT_EQ(access::identifyUser("", nullptr, false).status().code(), state::StatusCode::kUnauthenticated);
  EXPECT_EQ(access::identifyUser("", nullptr, true)->role, Role::kInsecure);
  EXPECT_EQ(access::checkNode("", "n1", false).code(), state::StatusCode::kUnauthenticated);
  EXPECT_EQ(access::checkNode("n1", "n2", false).code(), state::StatusCode::kPermissionDenied);
  EXPECT_TRUE(access::checkNode("n1", "n1", false));
  EXPECT_TRUE(access::checkNode("", "n2", true));
}

}  // namespace
}  // namespace ddl::coordinator
