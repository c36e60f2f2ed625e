// The coordinator's admin verbs (coordinator/auth/admin.h) without gRPC: users added, rotated, listed and
// removed; node certificates signed for the right name, for the right days, by the cluster CA, with a key
// that is theirs; join tokens that work once, for their node, until they expire. A real PKI directory
// (init-pki) in a temporary directory, and a clock the tests move.
#include "auth/admin.h"

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <memory>

#include "auth/pki_dir.h"
#include "auth/users.h"
#include "common/pki.h"
#include "state/memory_store.h"
#include "temp_dir.h"

namespace ddl::coordinator {
namespace {

using auth::Admin;
using state::StatusCode;

constexpr int kDefaultDays = 30;  // the coordinator's node_cert_days here

class AdminTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auth::InitPkiOptions options;
    options.dir = pki_;
    auto token = auth::initPki(options);
    ASSERT_TRUE(token) << token.status().toString();
    auto users = auth::UserRegistry::open(store_, pki_ + "/users.json", [this] { return now_; });
    ASSERT_TRUE(users) << users.status().toString();
    users_ = std::move(*users);
    admin_ = std::make_unique<Admin>(users_.get(), pki_, kDefaultDays, /*insecure=*/false,
                                     [this] { return now_; });
    std::string error;
    ca_pem_ = pki::readFile(pki_ + "/ca.crt", &error).value_or("");
    ASSERT_FALSE(ca_pem_.empty()) << error;
  }

  // What a joining node sends: its CSR (common name `cn`) for the node `node`.
  static v1::JoinRequest joinRequest(const std::string& node, const std::string& token,
                                     const std::string& cn) {
    std::string error;
    auto csr = pki::makeCsr(*pki::newPrivateKey(&error), cn, &error);
    EXPECT_TRUE(csr) << error;
    v1::JoinRequest request;
    request.set_node(node);
    request.set_token(token);
    request.set_csr_pem(csr.value_or(""));
    return request;
  }
  std::string joinToken(const std::string& node, int ttl_s = 0) {
    v1::CreateJoinTokenRequest request;
    request.set_node(node);
    request.set_ttl_s(ttl_s);
    auto made = admin_->createJoinToken(request);
    EXPECT_TRUE(made) << made.status().toString();
    return made ? made->token() : "";
  }
  // A certificate signed for `node` by this directory's CA, valid for `days` from now_ (5 minutes early).
  void expectNodeCertificate(const std::string& cert_pem, const std::string& node, int days) {
    std::string error;
    auto info = pki::inspectCertificate(cert_pem, &error);
    ASSERT_TRUE(info) << error;
    EXPECT_EQ(info->common_name, node);
    EXPECT_EQ(info->dns_names, std::vector<std::string>{node});
    EXPECT_EQ(info->issuer_common_name, "ddl cluster CA");
    EXPECT_EQ(info->not_before_s, now_ - 300);
    EXPECT_EQ(info->not_after_s, now_ + int64_t{days} * 86400);
    EXPECT_TRUE(pki::verifyCertificate(cert_pem, ca_pem_, now_, &error)) << error;
  }

  test_util::TempDir dir_;
  const std::string pki_ = dir_ / "pki";
  int64_t now_ = static_cast<int64_t>(std::time(nullptr));
  state::MemoryStore store_;
  std::unique_ptr<auth::UserRegistry> users_;
  std::unique_ptr<Admin> admin_;
  std::string ca_pem_;
};

v1::AddUserRequest addUser(const std::string& name, const std::string& role, bool rotate = false) {
  v1::AddUserRequest request;
  request.set_name(name);
  request.set_role(role);
  request.set_rotate(rotate);
  return request;
}
v1::RemoveUserRequest removeUser(const std::string& name) {
  v1::RemoveUserRequest request;
  request.set_name(name);
  return request;
}
std::vector<std::string> listed(const v1::ListUsersResponse& list) {
  std::vector<std::string> out;
  for (const auto& u : list.users()) out.push_back(u.name() + ":" + u.role() + ":" + u.via());
  return out;
}

TEST_F(AdminTest, UsersAreAddedRotatedListedAndRemoved) {
  auto alice = admin_->addUser(addUser("alice", ""));  // no role: a user
  ASSERT_TRUE(alice) << alice.status().toString();
  EXPECT_EQ(alice->name(), "alice");
  EXPECT_EQ(alice->role(), "user");
  EXPECT_EQ(alice->token().rfind("ddl_", 0), 0u);
  EXPECT_EQ(users_->authenticate(alice->token()).value_or(auth::Identity{}).name, "alice");
  auto bob = admin_->addUser(addUser("bob", "viewer"));
  ASSERT_TRUE(bob);
  EXPECT_EQ(bob->role(), "viewer");
  EXPECT_EQ(listed(admin_->listUsers().value()),
            (std::vector<std::string>{"admin:admin:token", "alice:user:token", "bob:viewer:token"}));

  // A second add is refused; a rotation replaces the token and the role, and the old token stops working.
  EXPECT_EQ(admin_->addUser(addUser("alice", "user")).status().code(), StatusCode::kFailedPrecondition);
  auto rotated = admin_->addUser(addUser("alice", "admin", /*rotate=*/true));
  ASSERT_TRUE(rotated) << rotated.status().toString();
  EXPECT_EQ(rotated->role(), "admin");
  EXPECT_NE(rotated->token(), alice->token());
  EXPECT_FALSE(users_->authenticate(alice->token()));
  EXPECT_EQ(users_->authenticate(rotated->token()).value_or(auth::Identity{}).role, auth::Role::kAdmin);
  EXPECT_EQ(admin_->addUser(addUser("carol", "user", /*rotate=*/true)).status().code(),
            StatusCode::kNotFound);

  // What was answered is in the store: a restarted coordinator knows the rotated token.
  auto reopened = auth::UserRegistry::open(store_, pki_ + "/users.json");
  ASSERT_TRUE(reopened);
  EXPECT_EQ((*reopened)->authenticate(rotated->token()).value_or(auth::Identity{}).name, "alice");

  ASSERT_TRUE(admin_->removeUser(removeUser("alice")));
  EXPECT_FALSE(users_->authenticate(rotated->token()));
  EXPECT_EQ(listed(admin_->listUsers().value()),
            (std::vector<std::string>{"admin:admin:token", "bob:viewer:token"}));
  auto again = admin_->removeUser(removeUser("alice"));
  EXPECT_EQ(again.code(), StatusCode::kNotFound);
  EXPECT_EQ(again.message(), "no user 'alice'");
}

TEST_F(AdminTest, BadUserNamesAndRolesAreRefused) {
  auto role = admin_->addUser(addUser("alice", "root"));
  EXPECT_EQ(role.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(role.status().message(), "role 'root' is not admin, user or viewer");
  for (const char* name : {"", "Alice", "1alice", "al ice", "alice/x", "a23456789012345678901234567890123"}) {
    auto made = admin_->addUser(addUser(name, "user"));
    EXPECT_EQ(made.status().code(), StatusCode::kInvalidArgument) << "'" << name << "'";
  }
  EXPECT_EQ(listed(admin_->listUsers().value()),
            std::vector<std::string>{"admin:admin:token"});  // nothing was added
}

TEST_F(AdminTest, NodeCertificatesAreSignedByTheCaForTheNodeAndItsDays) {
  v1::IssueNodeCertificateRequest request;
  request.set_node("gpu-07");  // days 0: the coordinator's default
  auto issued = admin_->issueNodeCertificate(request);
  ASSERT_TRUE(issued) << issued.status().toString();
  expectNodeCertificate(issued->certificate_pem(), "gpu-07", kDefaultDays);
  EXPECT_EQ(issued->not_after_ms(), (now_ + kDefaultDays * 86400) * 1000);
  EXPECT_EQ(issued->ca_pem(), ca_pem_);
  // The key is the certificate's: only then does a certificate signed "by" the pair come out.
  std::string error;
  auto probe = pki::makeCsr(*pki::newPrivateKey(&error), "probe", &error);
  EXPECT_TRUE(pki::makeCertificate({"probe", {}, {}, pki::Usage::kClient}, *probe, issued->certificate_pem(),
                                   issued->private_key_pem(), now_, now_ + 60, &error))
      << error;

  request.set_days(7);
  auto week = admin_->issueNodeCertificate(request);
  ASSERT_TRUE(week);
  expectNodeCertificate(week->certificate_pem(), "gpu-07", 7);
  request.set_days(auth::kMaxNodeCertDays);
  EXPECT_TRUE(admin_->issueNodeCertificate(request));
  request.set_days(auth::kMaxNodeCertDays + 1);
  auto too_long = admin_->issueNodeCertificate(request);
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(too_long.status().message(), "a node certificate is valid for at most 3650 days");

  request.set_days(0);
  for (const char* name : {"", "ddl-coordinator", "-n1", "n1.", "n 1"}) {
    request.set_node(name);
    EXPECT_EQ(admin_->issueNodeCertificate(request).status().code(), StatusCode::kInvalidArgument) << name;
  }
}

// issue-node on the CA's host and the coordinator's IssueNodeCertificate sign by the same rule.
TEST_F(AdminTest, TheCoordinatorAndIssueNodeMakeTheSameCertificate) {
  now_ = static_cast<int64_t>(std::time(nullptr));  // issueNodeFiles reads the real clock
  ASSERT_TRUE(auth::issueNodeFiles(pki_, "n1", kDefaultDays, dir_ / "n1"));
  std::string error;
  auto from_files = pki::inspectCertificate(*pki::readFile(dir_ / "n1/node.crt", &error), &error);
  v1::IssueNodeCertificateRequest request;
  request.set_node("n1");
  auto issued = admin_->issueNodeCertificate(request);
  ASSERT_TRUE(from_files && issued) << error << issued.status().toString();
  auto from_admin = pki::inspectCertificate(issued->certificate_pem(), &error);
  ASSERT_TRUE(from_admin) << error;
  EXPECT_EQ(from_admin->common_name, from_files->common_name);
  EXPECT_EQ(from_admin->dns_names, from_files->dns_names);
  EXPECT_EQ(from_admin->issuer_common_name, from_files->issuer_common_name);
  EXPECT_EQ(from_admin->not_after_s - from_admin->not_before_s,
            from_files->not_after_s - from_files->not_before_s);
}

TEST_F(AdminTest, JoinTokensWorkOnceForTheirNodeUntilTheyExpire) {
  v1::CreateJoinTokenRequest create;
  create.set_node("n2");  // ttl 0: an hour
  auto made = admin_->createJoinToken(create);
  ASSERT_TRUE(made) << made.status().toString();
  EXPECT_EQ(made->token().rfind("ddlj_", 0), 0u);
  EXPECT_EQ(made->expires_ms(), (now_ + 3600) * 1000);
  std::string error;
  EXPECT_EQ(made->ca_sha256(), pki::inspectCertificate(ca_pem_, &error)->sha256);
  create.set_ttl_s(7 * 86400 + 1);
  EXPECT_EQ(admin_->createJoinToken(create).status().code(), StatusCode::kInvalidArgument);
  create.set_ttl_s(60);
  create.set_node("ddl-coordinator");
  EXPECT_EQ(admin_->createJoinToken(create).status().code(), StatusCode::kInvalidArgument);

  // Without a token a node learns the CA only (to check against its pinned hash).
  auto ca_only = admin_->join(joinRequest("n2", "", "n2"));
  ASSERT_TRUE(ca_only) << ca_only.status().toString();
  EXPECT_EQ(ca_only->ca_pem(), ca_pem_);
  EXPECT_TRUE(ca_only->certificate_pem().empty());

  // A CSR for another name, or the token on another node, is refused and leaves the token usable.
  auto wrong_cn = admin_->join(joinRequest("n2", made->token(), "n9"));
  EXPECT_EQ(wrong_cn.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong_cn.status().message(), "the request's common name 'n9' is not the node 'n2'");
  EXPECT_EQ(admin_->join(joinRequest("n3", made->token(), "n3")).status().code(),
            StatusCode::kPermissionDenied);

  auto joined = admin_->join(joinRequest("n2", made->token(), "n2"));
  ASSERT_TRUE(joined) << joined.status().toString();
  EXPECT_EQ(joined->ca_pem(), ca_pem_);
  expectNodeCertificate(joined->certificate_pem(), "n2", kDefaultDays);
  EXPECT_EQ(joined->not_after_ms(), (now_ + kDefaultDays * 86400) * 1000);
  auto reused = admin_->join(joinRequest("n2", made->token(), "n2"));
  EXPECT_EQ(reused.status().code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(reused.status().message(), "unknown or used join token");

  // A 60 s token works through its 60th second and not one second after.
  const std::string last_second = joinToken("n4", 60);
  const std::string too_late = joinToken("n5", 60);
  now_ += 60;
  EXPECT_TRUE(admin_->join(joinRequest("n4", last_second, "n4")));
  now_ += 1;
  auto expired = admin_->join(joinRequest("n5", too_late, "n5"));
  EXPECT_EQ(expired.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(expired.status().message().find("has expired"), std::string::npos) << expired.status().message();
}

TEST_F(AdminTest, WithoutTheCaKeyNothingIsSignedAndInsecureHasNothingToJoin) {
  const std::string token = joinToken("n6");
  ASSERT_TRUE(std::filesystem::copy_file(pki_ + "/ca.key", dir_ / "ca.key.saved"));
  std::filesystem::remove(pki_ + "/ca.key");
  v1::IssueNodeCertificateRequest issue;
  issue.set_node("n6");
  auto issued = admin_->issueNodeCertificate(issue);
  EXPECT_EQ(issued.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(issued.status().message().rfind("this coordinator cannot issue certificates: ", 0), 0u)
      << issued.status().message();
  v1::CreateJoinTokenRequest create;
  create.set_node("n6");
  EXPECT_EQ(admin_->createJoinToken(create).status().code(), StatusCode::kFailedPrecondition);
  // The CA certificate is still served; a token made before the key went gets no certificate.
  EXPECT_TRUE(admin_->join(joinRequest("n6", "", "n6")));
  EXPECT_EQ(admin_->join(joinRequest("n6", token, "n6")).status().code(), StatusCode::kFailedPrecondition);
  // That refusal kept the token: once the key is back, the node joins with it.
  ASSERT_TRUE(std::filesystem::copy_file(dir_ / "ca.key.saved", pki_ + "/ca.key"));
  auto joined = admin_->join(joinRequest("n6", token, "n6"));
  EXPECT_TRUE(joined) << joined.status().toString();

  Admin insecure(users_.get(), pki_, kDefaultDays, /*insecure=*/true);
  auto join = insecure.join(joinRequest("n6", "", "n6"));
  EXPECT_EQ(join.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(join.status().message(), "this coordinator runs --insecure: there is no CA to join");
}

// Accounts through the admin verbs: made with a share under a parent, listed with their users, changed,
// removed once empty; a user is added into one and listed with it.
TEST_F(AdminTest, AccountsAreAddedListedChangedAndRemoved) {
  v1::AddAccountRequest science;
  science.set_name("science");
  science.set_share(3);
  auto made = admin_->addAccount(science);
  ASSERT_TRUE(made) << made.status().toString();
  EXPECT_EQ(made->parent(), "root");
  EXPECT_EQ(made->share(), 3);
  v1::AddAccountRequest physics;
  physics.set_name("physics");
  physics.set_parent("science");  // share 0: 1
  ASSERT_TRUE(admin_->addAccount(physics));
  v1::AddUserRequest alice = addUser("alice", "user");
  alice.set_account("physics");
  auto added = admin_->addUser(alice);
  ASSERT_TRUE(added) << added.status().toString();
  EXPECT_EQ(added->account(), "physics");
  alice.set_name("bob");
  alice.set_account("nowhere");
  EXPECT_EQ(admin_->addUser(alice).status().code(), StatusCode::kNotFound);

  auto list = admin_->listAccounts();
  ASSERT_TRUE(list);
  std::vector<std::string> seen;
  for (const auto& a : list->accounts()) {
    seen.push_back(a.name() + "<" + a.parent() + ":" + std::to_string(a.share()) + "/" +
                   std::to_string(a.users()));
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"root<:1/1", "physics<science:1/1", "science<root:3/0"}));
  bool listed_alice = false;
  const v1::ListUsersResponse users = admin_->listUsers().value();
  for (const auto& u : users.users()) listed_alice |= u.name() == "alice" && u.account() == "physics";
  EXPECT_TRUE(listed_alice);
  // alice joins science too; listed with both.
  v1::SetUserAccountsRequest join;
  join.set_name("alice");
  join.add_add("science");
  auto joined = admin_->setUserAccounts(join);
  ASSERT_TRUE(joined) << joined.status().toString();
  EXPECT_EQ(joined->account(), "physics");
  ASSERT_EQ(joined->accounts_size(), 1);
  EXPECT_EQ(joined->accounts(0), "science");
  int listed_accounts = -1;
  const v1::ListUsersResponse with_science = admin_->listUsers().value();
  for (const auto& u : with_science.users()) {
    if (u.name() == "alice") listed_accounts = u.accounts_size();
  }
  EXPECT_EQ(listed_accounts, 1);
  join.set_name("nobody");
  EXPECT_EQ(admin_->setUserAccounts(join).status().code(), StatusCode::kNotFound);
  v1::SetUserAccountsRequest leave;
  leave.set_name("alice");
  leave.add_remove("science");
  ASSERT_TRUE(admin_->setUserAccounts(leave));

  physics.set_update(true);
  physics.set_share(7);
  physics.clear_parent();
  auto changed = admin_->addAccount(physics);
  ASSERT_TRUE(changed);
  EXPECT_EQ(changed->share(), 7);
  EXPECT_EQ(changed->parent(), "science");
  v1::RemoveAccountRequest remove;
  remove.set_name("physics");
  EXPECT_EQ(admin_->removeAccount(remove).code(), StatusCode::kFailedPrecondition);  // alice is in it
  ASSERT_TRUE(admin_->removeUser(removeUser("alice")));
  ASSERT_TRUE(admin_->removeAccount(remove));
  EXPECT_EQ(admin_->listAccounts()->accounts_size(), 2);
}

// Issue 41, QoS: made, listed (normal first, always there), changed field by field, kept in the store (a
// registry opened again on it has them), and refused where it would break the tiers: preempting a QoS of the
// same or a higher priority, lowering one below a QoS it is preempted by, removing normal or a preempted one.
TEST_F(AdminTest, QosAreMadeChangedKeptAndTheirTiersHold) {
  auto listed = [&] {
    std::vector<std::string> out;
    const auto all = admin_->listQos();
    EXPECT_TRUE(all);
    for (const auto& q : all->qos()) {
      std::string preempts;
      for (const auto& p : q.preempt()) preempts += "," + p;
      out.push_back(q.name() + ":" + std::to_string(q.priority()) + preempts + "/" +
                    std::to_string(q.grace_s()));
    }
    return out;
  };
  EXPECT_EQ(listed(), (std::vector<std::string>{"normal:0/60"}));
  v1::AddQosRequest urgent;
  urgent.set_name("urgent");
  urgent.set_priority(100);
  urgent.add_preempt("normal");
  urgent.set_grace_s(30);
  urgent.set_gpus(8);
  urgent.add_accounts("nowhere");
  EXPECT_EQ(admin_->addQos(urgent).status().code(), StatusCode::kNotFound);  // no such account
  urgent.clear_accounts();
  EXPECT_EQ(admin_->addQos(urgent).status().code(), StatusCode::kInvalidArgument);  // preempts, names nobody
  urgent.add_accounts("root");
  auto made = admin_->addQos(urgent);
  ASSERT_TRUE(made) << made.status().toString();
  EXPECT_EQ(made->gpus(), 8);
  EXPECT_EQ(admin_->addQos(urgent).status().code(), StatusCode::kFailedPrecondition);  // exists

  v1::AddQosRequest scavenger;
  scavenger.set_name("scavenger");
  scavenger.set_priority(0);
  scavenger.add_preempt("normal");  // the same priority: refused
  EXPECT_EQ(admin_->addQos(scavenger).status().code(), StatusCode::kInvalidArgument);
  scavenger.clear_preempt();
  ASSERT_TRUE(admin_->addQos(scavenger));
  v1::AddQosRequest lower;  // normal may not rise to urgent's priority while urgent preempts it
  lower.set_name("normal");
  lower.set_update(true);
  lower.set_priority(100);
  EXPECT_EQ(admin_->addQos(lower).status().code(), StatusCode::kInvalidArgument);
  lower.set_priority(10);
  lower.set_grace_s(120);
  ASSERT_TRUE(admin_->addQos(lower));
  v1::AddQosRequest change;  // only what is given changes
  change.set_name("urgent");
  change.set_update(true);
  change.set_preempt_given(true);
  change.add_preempt("normal");
  change.add_preempt("scavenger");
  ASSERT_TRUE(admin_->addQos(change));
  EXPECT_EQ(listed(),
            (std::vector<std::string>{"normal:10/120", "scavenger:0/60", "urgent:100,normal,scavenger/30"}));

  // Kept: a registry opened again on the same store has them.
  auto again = auth::UserRegistry::open(store_, pki_ + "/users.json", [this] { return now_; });
  ASSERT_TRUE(again) << again.status().toString();
  std::vector<std::string> reread;
  for (const auto& q : (*again)->qosList()) reread.push_back(q.name + ":" + std::to_string(q.gpus));
  EXPECT_EQ(reread, (std::vector<std::string>{"normal:0", "scavenger:0", "urgent:8"}));

  v1::RemoveQosRequest remove;
  remove.set_name("normal");
  EXPECT_EQ(admin_->removeQos(remove).code(), StatusCode::kInvalidArgument);
  remove.set_name("scavenger");
  EXPECT_EQ(admin_->removeQos(remove).code(), StatusCode::kFailedPrecondition);  // urgent preempts it
  remove.set_name("urgent");
  ASSERT_TRUE(admin_->removeQos(remove));
  remove.set_name("scavenger");
  ASSERT_TRUE(admin_->removeQos(remove));
  EXPECT_EQ(listed(), (std::vector<std::string>{"normal:10/120"}));
  v1::AddQosRequest bad;
  bad.set_name("Urgent!");
  EXPECT_EQ(admin_->addQos(bad).status().code(), StatusCode::kInvalidArgument);
}

// An Admin without a user registry (the daemon always has one; a caller that has none): the verbs that need
// one refuse, they do not crash.
TEST_F(AdminTest, WithoutAUserRegistryTheUserAndTokenVerbsRefuse) {
  Admin none(nullptr, pki_, kDefaultDays, /*insecure=*/false, [this] { return now_; });
  v1::AddUserRequest add;
  add.set_name("bob");
  add.set_role("user");
  auto added = none.addUser(add);
  EXPECT_EQ(added.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(added.status().message().find("keeps no users"), std::string::npos) << added.status().message();
  v1::AddAccountRequest account;
  account.set_name("physics");
  EXPECT_EQ(none.addAccount(account).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.listAccounts().status().code(), StatusCode::kFailedPrecondition);
  v1::RemoveUserRequest remove;
  remove.set_name("bob");
  EXPECT_EQ(none.removeUser(remove).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.listUsers().status().code(), StatusCode::kFailedPrecondition);
  v1::CreateJoinTokenRequest create;
  create.set_node("n7");
  EXPECT_EQ(none.createJoinToken(create).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(none.join(joinRequest("n7", "ddlj_x", "n7")).status().code(), StatusCode::kFailedPrecondition);
  // What needs no registry still works: the CA for a joining node, and an admin's node certificate.
  EXPECT_TRUE(none.join(joinRequest("n7", "", "n7")));
  v1::IssueNodeCertificateRequest issue;
  issue.set_node("n7");
  EXPECT_TRUE(none.issueNodeCertificate(issue));
}

}  // namespace
}  // namespace ddl::coordinator
