// The pieces of ddl's security without a network: the PKI (common/pki), the user registry and join tokens
// (coordinator/auth/users), the PKI directory tools (auth/pki_dir) and the access rules (auth/access).
#include <gtest/gtest.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>

#include "auth/access.h"
#include "auth/pki_dir.h"
#include "auth/users.h"
#include "common/pki.h"
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
  auto users = auth::UserRegistry::open(options.dir + "/users.json");
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

TEST(UserRegistry, TokensAreHashedPersistedRotatedAndRemoved) {
  TempDir dir;
  const std::string path = dir / "users.json";
  auto users = auth::UserRegistry::open(path);
  ASSERT_TRUE(users);
  auto alice = (*users)->add("alice", Role::kUser, false);
  ASSERT_TRUE(alice);
  EXPECT_EQ(alice->rfind("ddl_", 0), 0u);
  EXPECT_FALSE((*users)->add("alice", Role::kUser, false));      // exists
  EXPECT_FALSE((*users)->add("Alice", Role::kUser, false));      // not an account name
  EXPECT_FALSE((*users)->add("bob", Role::kUser, /*rotate=*/true));  // nothing to rotate
  std::string error;
  const std::string file = *pki::readFile(path, &error);
  EXPECT_EQ(file.find(*alice), std::string::npos) << "the token itself is stored";
  EXPECT_EQ(modeOf(path), 0600u);

  auto reopened = auth::UserRegistry::open(path);
  ASSERT_TRUE(reopened);
  EXPECT_EQ((*reopened)->authenticate(*alice).value_or(Identity{}).name, "alice");
  EXPECT_FALSE((*reopened)->authenticate(*alice + "x"));
  EXPECT_FALSE((*reopened)->authenticate(""));
  auto rotated = (*reopened)->add("alice", Role::kAdmin, true);
  ASSERT_TRUE(rotated);
  EXPECT_FALSE((*reopened)->authenticate(*alice));
  EXPECT_EQ((*reopened)->authenticate(*rotated)->role, Role::kAdmin);
  ASSERT_TRUE((*reopened)->remove("alice"));
  EXPECT_FALSE((*reopened)->authenticate(*rotated));
  EXPECT_FALSE((*reopened)->remove("alice"));
}

TEST(UserRegistry, JoinTokensWorkOnceForTheirNodeOnly) {
  TempDir dir;
  int64_t now = 1'700'000'000;
  auto users = auth::UserRegistry::open(dir / "users.json", [&now] { return now; });
  ASSERT_TRUE(users);
  int64_t expires = 0;
  auto token = (*users)->createJoinToken("n5", 60, &expires);
  ASSERT_TRUE(token);
  EXPECT_EQ(expires, now + 60);
  EXPECT_EQ((*users)->redeemJoinToken(*token, "n6").code(), state::StatusCode::kPermissionDenied);
  EXPECT_TRUE((*users)->redeemJoinToken(*token, "n5"));
  EXPECT_EQ((*users)->redeemJoinToken(*token, "n5").code(), state::StatusCode::kUnauthenticated);
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

  EXPECT_EQ(access::identifyUser("", nullptr, false).status().code(), state::StatusCode::kUnauthenticated);
  EXPECT_EQ(access::identifyUser("", nullptr, true)->role, Role::kInsecure);
  EXPECT_EQ(access::checkNode("", "n1", false).code(), state::StatusCode::kUnauthenticated);
  EXPECT_EQ(access::checkNode("n1", "n2", false).code(), state::StatusCode::kPermissionDenied);
  EXPECT_TRUE(access::checkNode("n1", "n1", false));
  EXPECT_TRUE(access::checkNode("", "n2", true));
}

}  // namespace
}  // namespace ddl::coordinator
