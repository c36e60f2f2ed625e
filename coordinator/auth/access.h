// Access rules of the coordinator's gRPC services: who a call comes from, and what that identity may do.
// Pure functions over an identity and the request or job (no gRPC), so every rule is unit-tested; the rpc
// server (server.cpp) only extracts the token or certificate name from the call and applies these.
//
//   call                              admin   user              viewer
//   Submit                            yes     yes (as itself)   no
//   GetJob, CancelJob, GetLogs        yes     own jobs only     no
//   ListJobs                          yes     yes; others' jobs without command, env, workdir
//   ListNodes, GetRing, WhoAmI        yes     yes               yes
//   DrainNode, ClearGpuFault, users,  yes     no                no
//   node certs
// Every UserService call needs a user's token; a node's certificate is no user (agents hold no token).
// AgentService Register and Connect need a node certificate, and only for that node's name.
//
// With --insecure (loopback only) nobody is authenticated: a call with a valid token is that user, any other
// call is "insecure" and may do everything, and the job's user is what the request says (the old behaviour,
// for development and unit tests).
//
// Threads: pure functions.
#pragma once

#include <string>

#include "auth/users.h"
#include "ddl/v1/ddl.pb.h"

namespace ddl::coordinator::access {

using auth::Identity;
using state::Status;
using state::StatusOr;

// The user behind a UserService call: its bearer token looked up in `users`. Errors are UNAUTHENTICATED,
// with a sentence saying where ddlctl takes its token from.
StatusOr<Identity> identifyUser(const std::string& token, const auth::UserRegistry* users, bool insecure);

// An agent's claim to be `claimed` (RegisterRequest.node, Hello.node) against the node name its verified
// certificate carries (`certificate_name`, "" without one).
Status checkNode(const std::string& certificate_name, const std::string& claimed, bool insecure);

// May `who` see the details of (GetJob), cancel or read the logs of `job`?
Status mayTouchJob(const Identity& who, const v1::Job& job, const char* verb);
Status maySubmit(const Identity& who);
Status mustBeAdmin(const Identity& who, const char* what);

// init-pki's default name for the first admin.
inline constexpr const char* kBuiltinAdmin = "admin";

// The spec as the coordinator records it: the user from the identity (the request's is ignored), root refused
// unless allow_root, the built-in admin refused where no account of that name exists (it would fail on every
// node). Insecure callers without a token keep the request's user. The account charged is the user's default
// (root for an anonymous caller) unless the spec names another it is in; only an admin may name any other,
// which must exist in `users` (when there is a registry).
StatusOr<v1::JobSpec> ownSpec(const Identity& who, v1::JobSpec spec, bool allow_root,
                              const auth::UserRegistry* users = nullptr);

// What a listing shows `who` of `job`: others' jobs lose command, env and workdir unless `who` is an admin.
void redactFor(const Identity& who, v1::Job* job);

}  // namespace ddl::coordinator::access
