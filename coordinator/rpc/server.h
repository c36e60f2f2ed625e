// The coordinator's gRPC face: AgentService and UserService from proto/ddl/v1/ddl.proto, each handler a thin
// translation onto Coordinator (service/coordinator.h). Uses gRPC's synchronous server: every agent stream
// holds one server thread for reading and one writer thread for commands, which is plenty for hundreds of
// nodes; a callback-API server is the path beyond that.
//
// Threads: start() and shutdown() from one owning thread; handlers run on gRPC's threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "service/coordinator.h"

namespace ddl::coordinator {

grpc::Status toGrpc(const Status& status);

class RpcServer {
 public:
  explicit RpcServer(Coordinator& coordinator);
  ~RpcServer();

  // Listens on HOST:PORT (PORT 0: the system picks one). On success `bound` is the address clients can
  // dial, with the real port. Errors name the address.
  Status start(const std::string& listen, std::string* bound);
  // Stops taking calls, ends every agent stream, and waits (up to deadline_ms) for calls in flight.
  void shutdown(int64_t deadline_ms = 2000);

 private:
  class AgentServiceImpl;
  class UserServiceImpl;

  Coordinator& coordinator_;
  std::unique_ptr<AgentServiceImpl> agent_service_;
  std::unique_ptr<UserServiceImpl> user_service_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace ddl::coordinator
