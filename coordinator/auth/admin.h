// The coordinator's admin verbs as a plain object: users (UserService AddUser, RemoveUser, ListUsers,
// SetUserAccounts), accounts (AddAccount, RemoveAccount, ListAccounts), node certificates
// (IssueNodeCertificate) and join tokens (CreateJoinToken, and AgentService.Join, which trades one for a
// certificate). It takes and returns ddl.v1 messages and Status, over the UserRegistry and the PKI directory,
// with no gRPC, so every rule here is unit-tested (tests/unit/admin_test.cpp); rpc/server.cpp checks who
// calls (auth/access.h: these are admin-only, except Join, which its token authorises) and only translates.
//
// Certificates are signed by pki_dir.h's signNodeCertificate, as ddl-coordinator issue-node's are, with the
// CA from PKI_DIR (ca.crt, ca.key: a coordinator without ca.key refuses to issue certificates and join
// tokens).
//
// Threads: any, concurrently. The object holds only its settings; the registry has its own lock and the PKI
// files are read on each call (so a renewed CA is used at once).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "auth/pki_dir.h"
#include "auth/users.h"
#include "common/clock.h"
#include "ddl/v1/ddl.pb.h"

namespace ddl::coordinator::auth {

// An identity as the API gives it (WhoAmI, ListUsers, SetUserAccounts).
void toProto(const Identity& who, v1::Identity* out);

class Admin {
 public:
  // users: not owned, outlives this. The daemon always gives one; where it is null, the user, account and
  // join-token verbs refuse with FAILED_PRECONDITION.
  // node_cert_days: the validity of a certificate whose request says 0 days. now_s: unix seconds, for
  // certificates' validity.
  Admin(UserRegistry* users, std::string pki_dir, int node_cert_days, bool insecure,
        std::function<int64_t()> now_s = unixNowS);

  // A new user and its token, or (rotate) a new token and role for an existing one.
  StatusOr<v1::AddUserResponse> addUser(const v1::AddUserRequest& request);
  Status removeUser(const v1::RemoveUserRequest& request);
  StatusOr<v1::ListUsersResponse> listUsers() const;
  // The accounts a user is in and its default (users.h's setUserAccounts); the user as it is now.
  StatusOr<v1::Identity> setUserAccounts(const v1::SetUserAccountsRequest& request);
  // Accounts (users.h): make or (update) change one, remove an empty one, list them all.
  StatusOr<v1::Account> addAccount(const v1::AddAccountRequest& request);
  Status removeAccount(const v1::RemoveAccountRequest& request);
  StatusOr<v1::ListAccountsResponse> listAccounts() const;
  StatusOr<v1::Qos> addQos(const v1::AddQosRequest& request);
  Status removeQos(const v1::RemoveQosRequest& request);
  StatusOr<v1::ListQosResponse> listQos() const;
  // The limits of one account or one user (SetLimitRequest); the limits as they are now.
  StatusOr<v1::Limits> setLimit(const v1::SetLimitRequest& request);

  // A new key and its certificate for the node, made here and returned (with the CA) to the admin.
  StatusOr<v1::IssueNodeCertificateResponse> issueNodeCertificate(
      const v1::IssueNodeCertificateRequest& request);
  // A one-time token for a node to join with, and the CA certificate's hash for the node to pin.
  StatusOr<v1::CreateJoinTokenResponse> createJoinToken(const v1::CreateJoinTokenRequest& request);
  // Without a token: the CA certificate only (what a joining node checks against its pinned hash before it
  // sends its token). With one: uses the token up and signs the node's CSR, whose common name must be the
  // node.
  StatusOr<v1::JoinResponse> join(const v1::JoinRequest& request);

 private:
  // OK when there is a user registry, else why the verb cannot run.
  Status needUsers() const;
  // The CA's certificate and key, to sign node certificates with.
  Status readCa(std::string* cert, std::string* key) const;
  // A node's certificate for the key or CSR in public_key_source; days <= 0: node_cert_days_.
  StatusOr<NodeCertificate> signNode(const std::string& node, const std::string& public_key_source, int days,
                                     std::string* ca_pem) const;

  UserRegistry* const users_;
  const std::string pki_dir_;
  const int node_cert_days_;
  const bool insecure_;
  const std::function<int64_t()> now_s_;
};

}  // namespace ddl::coordinator::auth
