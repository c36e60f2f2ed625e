// The coordinator's read-only HTTP face (Boost.Beast): the dashboard pages, the JSON API, /metrics for
// Prometheus and /healthz. Every handler reads through the Coordinator's public methods, like the gRPC
// handlers, so the pages show exactly what ddlctl shows.
//
//   GET /                  the cluster at a glance (refreshes itself)
//   GET /jobs/ID           one job: ranks by node and GPU, ring picture, log tails, failure on top
//   GET /api/v1/nodes      {"nodes": [Node...]}
//   GET /api/v1/jobs       {"jobs": [Job...]}          (?state=RUNNING&user=alice filter)
//   GET /api/v1/jobs/ID    {"job": Job, "ring": RingLayout}
//   GET /metrics           Prometheus text format
//   GET /healthz           "ok"
// Anything else is 404; methods other than GET and HEAD are 405 with `Allow: GET, HEAD` (nothing here changes
// state); a bad request never takes the server down.
//
// Threads: start()/stop() from the owning thread. One acceptor thread; each connection is served on its own
// thread (at most kMaxConnections at once, keep-alive, 30 s idle timeout).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "service/coordinator.h"

namespace ddl::coordinator::http {

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers = {};  // more fields: Allow, Location, Set-Cookie...
};

// Routing without sockets, for tests: method, target ("/api/v1/jobs?state=RUNNING") -> response.
Response handleRequest(Coordinator& coordinator, const std::string& method, const std::string& target);

class HttpServer {
 public:
  static constexpr int kMaxConnections = 64;

  explicit HttpServer(Coordinator& coordinator);
  ~HttpServer();

  // Listens on HOST:PORT (port 0: any); `bound` gets the real address. Errors name the address.
  Status start(const std::string& listen, std::string* bound);
  void stop();

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the connection threads, so a late one never outlives it
};

}  // namespace ddl::coordinator::http
