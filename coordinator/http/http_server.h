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
//   GET /login?token=T     sets the token cookie and redirects to / (for browsers, where tokens are needed)
// Anything else is 404; methods other than GET and HEAD are 405 with `Allow: GET, HEAD` (nothing here changes
// state); a bad request never takes the server down.
//
// Security (docs/dashboard.md). On a loopback address the server speaks plain HTTP and asks for nothing, as
// it always did. Anywhere else, or when the operator asks (HttpOptions::tls), it speaks HTTPS with the
// coordinator's own certificate and key from the PKI directory, re-read when the files change, and every path
// but /healthz needs the token of a registered user of any role: `Authorization: Bearer TOKEN` (ddlctl's
// tokens; Prometheus' `authorization` setting) or the cookie /login sets. Without one the answer is 401 and
// says how to get one. Readers who are neither admins nor the job's owner see jobs without command, env and
// workdir, and no logs (rpc/access.h's rules, as ListJobs applies them).
//
// Threads: start()/stop() from the owning thread. One acceptor thread; each connection is served on its own
// thread (at most kMaxConnections at once, keep-alive, every read and write bounded by a timeout).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "auth/users.h"
#include "service/coordinator.h"

namespace ddl::coordinator::http {

// The cookie /login sets: the token itself, HttpOnly, Secure, SameSite=Strict, for the browser's session.
inline constexpr const char* kTokenCookie = "ddl_token";

struct Request {
  std::string method = "GET";
  std::string target;         // "/api/v1/jobs?state=RUNNING"
  std::string authorization;  // the Authorization field; "" without one
  std::string cookie;         // the Cookie field
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers = {};  // more fields: Allow, Location, Set-Cookie...
};

// Who is served. Without require_token everyone sees everything (a loopback dashboard, as before tokens).
struct Access {
  bool require_token = false;
  const auth::UserRegistry* users = nullptr;  // not owned; checks the tokens when require_token
};

// Routing without sockets, for tests.
Response handleRequest(Coordinator& coordinator, const Request& request, const Access& access);
// The same for an open dashboard (no token needed).
Response handleRequest(Coordinator& coordinator, const std::string& method, const std::string& target);

struct HttpOptions {
  bool tls = false;   // HTTPS (and so tokens) on a loopback address too; always on elsewhere
  bool auth = false;  // tokens on a loopback address too, over plain HTTP (e.g. behind a proxy that adds TLS)
  std::string pki_dir;                        // coordinator.crt and coordinator.key, for HTTPS
  const auth::UserRegistry* users = nullptr;  // not owned, outlives the server; needed for tokens
  int timeout_ms = 30000;  // for a request's header (keep-alive idling included) and a response's write; a TLS
                           // handshake gets a third of it
};

// What a dashboard on `listen` (HOST:PORT) does with `options`: HTTPS off loopback or when asked, and tokens
// whenever it speaks HTTPS or when asked.
struct HttpMode {
  bool tls = false;
  bool auth = false;
};
HttpMode httpMode(const std::string& listen, const HttpOptions& options);

class HttpServer {
 public:
  static constexpr int kMaxConnections = 64;

  explicit HttpServer(Coordinator& coordinator, HttpOptions options = {});
  ~HttpServer();

  // Listens on HOST:PORT (port 0: any); `bound` gets the real address. Errors name the address; with HTTPS,
  // a certificate or key that cannot be loaded (or no users for tokens) is an error before anything listens.
  Status start(const std::string& listen, std::string* bound);
  void stop();
  // "https" or "http", as start() settled it.
  const char* scheme() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;  // shared with the connection threads, so a late one never outlives it
};

}  // namespace ddl::coordinator::http
