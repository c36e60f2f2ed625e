// The coordinator's gRPC face: AgentService and UserService from proto/ddl/v1/ddl.proto, each handler a thin
// translation onto Coordinator (service/coordinator.h), or onto auth::Admin (auth/admin.h) for the admin
// verbs and Join. Uses gRPC's synchronous server: every agent stream holds one server thread for reading and
// one writer thread for commands, which is plenty for hundreds of nodes; a callback-API server is the path
// beyond that.
//
// Security (docs/security.md): TLS with the cluster's certificates, every call's identity established and
// checked against auth/access.h's rules before it reaches Coordinator. Plaintext only with `insecure`, which
// start() accepts on a loopback address only.
//
// Threads: start() and shutdown() from one owning thread; handlers run on gRPC's threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "auth/admin.h"
#include "auth/users.h"
#include "service/coordinator.h"

namespace ddl::coordinator {

grpc::Status toGrpc(const Status& status);

struct SecurityOptions {
  bool insecure = false;        // plaintext, nobody authenticated: loopback only
  std::string pki_dir;          // ca.crt, coordinator.crt, coordinator.key; ca.key to issue node certificates
  auth::UserRegistry* users = nullptr;  // not owned; outlives the server
  bool allow_root_jobs = false;
  int node_cert_days = 365;     // validity of the node certificates the coordinator issues
  unsigned refresh_s = 60;      // how often certificate files are re-read
};

class RpcServer {
 public:
  RpcServer(Coordinator& coordinator, SecurityOptions security);
  ~RpcServer();

  // "" when PKI_DIR holds the coordinator's certificate, key and CA, usable together; else why not and how to
  // make them.
  static Status checkTlsFiles(const std::string& pki_dir);

  // Listens on HOST:PORT (PORT 0: the system picks one). On success `bound` is the address clients can
  // dial, with the real port. Errors name the address.
  Status start(const std::string& listen, std::string* bound);
  // Stops taking calls, ends every agent stream, and waits (up to deadline_ms) for calls in flight.
  void shutdown(int64_t deadline_ms = 2000);

 private:
  class AgentServiceImpl;
  class UserServiceImpl;

  Coordinator& coordinator_;
  const SecurityOptions security_;
  auth::Admin admin_;  // the admin verbs and Join, over security_'s registry and PKI directory
  std::unique_ptr<AgentServiceImpl> agent_service_;
  std::unique_ptr<UserServiceImpl> user_service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace ddl::coordinator
