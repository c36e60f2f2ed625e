// The access rules of the coordinator's gRPC services (access.h): identities from tokens and certificates,
// and what each may do.
#include "auth/access.h"

#include <pwd.h>

#include <vector>

namespace ddl::coordinator::access {

namespace {

// Whether this host knows the account `name` (getpwnam_r: calls come on several threads).
bool accountExists(const std::string& name) {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  return getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr;
}

}  // namespace

using auth::Role;

StatusOr<Identity> identifyUser(const std::string& token, const auth::UserRegistry* users, bool insecure) {
  if (!token.empty() && users) {
    if (auto who = users->authenticate(token)) return *who;
    if (!insecure) {
      return Status::unauthenticated("the token is not valid (mistyped, rotated or removed?); an admin makes a new "
                                     "one with 'ddlctl admin add-user NAME --rotate'");
    }
  }
  if (insecure) return Identity{"", Role::kInsecure, "insecure"};
  return Status::unauthenticated(
      "no token: ddlctl sends the token from --token-file, $DDL_TOKEN, $DDL_TOKEN_FILE or ~/.config/ddl/token (an admin makes one "
      "with 'ddlctl admin add-user NAME')");
}

Status checkNode(const std::string& certificate_name, const std::string& claimed, bool insecure) {
  if (insecure) return Status::ok();
  if (certificate_name.empty()) {
    return Status::unauthenticated("node '" + claimed +
                                   "' presented no client certificate from the cluster CA (give ddl-agent its "
                                   "node.crt and node.key: 'ddlctl admin issue-node " + claimed +
                                   "' or 'ddl-agent join')");
  }
  if (certificate_name != claimed) {
    return Status::permissionDenied("the certificate is node '" + certificate_name + "'s; it cannot speak for node '" +
                                    claimed + "'");
  }
  return Status::ok();
}

Status mayTouchJob(const Identity& who, const v1::Job& job, const char* verb) {
  if (who.isAdmin()) return Status::ok();
  if (who.role == Role::kUser && who.name == job.spec().user()) return Status::ok();
  return Status::permissionDenied("job " + job.id() + " belongs to " + job.spec().user() + "; " + who.name + " (" +
                                  auth::roleName(who.role) + ") may not " + verb + " it");
}

Status maySubmit(const Identity& who) {
  if (who.isUser()) return Status::ok();
  return Status::permissionDenied(who.name + " is a " + auth::roleName(who.role) + " and may not submit jobs");
}

Status mustBeAdmin(const Identity& who, const char* what) {
  if (who.isAdmin()) return Status::ok();
  return Status::permissionDenied(std::string(what) + " is for admins; " + who.name + " is a " +
                                  auth::roleName(who.role));
}

StatusOr<v1::JobSpec> ownSpec(const Identity& who, v1::JobSpec spec, bool allow_root,
                              const auth::UserRegistry* users) {
  if (who.role != Role::kInsecure || !who.name.empty()) spec.set_user(who.name);
  // The account charged: the user's default, or another it is in, or (an admin) any that exists.
  const std::string own = who.account.empty() ? auth::kRootAccount : who.account;
  if (spec.account().empty()) spec.set_account(own);
  if (!who.inAccount(spec.account())) {  // (the registry refuses to remove an account a user is in)
    if (!who.isAdmin()) {
      std::string in = own;
      for (const std::string& a : who.accounts) in += ", " + a;
      const std::string name = who.name.empty() ? std::string("NAME") : who.name;
      return Status::permissionDenied(
          (who.name.empty() ? std::string("this caller") : who.name) + " is in " +
          (who.accounts.empty() ? "account " : "accounts ") + in + " and may not charge account " +
          spec.account() + " (an admin adds a user to an account with 'ddlctl admin user-accounts " + name +
          " --add " + spec.account() + "')");
    }
    if (users && !users->hasAccount(spec.account())) {
      return Status::notFound("no account '" + spec.account() + "' (ddlctl accounts lists them)");
    }
  }
  if (spec.user() == "root" && !allow_root) {
    return Status::permissionDenied("jobs of root are refused: ranks never run as root unless the coordinator's "
                                    "config sets allow_root_jobs");
  }
  // init-pki's first admin is named "admin" unless told otherwise: an identity for running the cluster, not
  // an account its ranks could run as. Its jobs would be accepted and then fail on every node.
  if (spec.user() == kBuiltinAdmin && who.role == Role::kAdmin && !accountExists(kBuiltinAdmin)) {
    return Status::permissionDenied(
        "'admin' is the cluster's built-in administrator, not an account on its nodes, so its jobs cannot "
        "run: "
        "submit with a user's token ('ddlctl admin add-user NAME' makes one for the account NAME)");
  }
  return spec;
}

void redactFor(const Identity& who, v1::Job* job) {
  if (who.isAdmin() || (who.role == Role::kUser && who.name == job->spec().user())) return;
  job->mutable_spec()->clear_command();
  job->mutable_spec()->clear_env();
  job->mutable_spec()->clear_workdir();
  for (auto& rank : *job->mutable_ranks()) rank.clear_error();  // names the program and its paths
}

}  // namespace ddl::coordinator::access
