// The coordinator's read-only HTTP face (Boost.Beast): the dashboard pages, the JSON API, /metrics for
// Prometheus and /healthz. Every handler reads through the Coordinator's public methods, like the gRPC
// handlers, so the pages show exactly what ddlctl shows.
//
//   GET /                  the cluster at a glance (refreshes itself)
//   GET /jobs/ID           one job: ranks by node and GPU, ring picture, log tails, failure on top
//   GET /api/v1/nodes      {"nodes": [Node...]}
//   GET /api/v1/jobs       {"jobs": [Job...], "next_page_token": T}: a page in submit order (order=newest:
//                          newest first); filters state=failed,running (any case, comma-separated), user=,
//                          name=, since=/until= (unix ms, or an age such as 90s, 30m, 12h, 7d), page_size=
//                          (1..5000, default 500), page_token=
//   GET /api/v1/jobs/ID    {"job": Job, "ring": RingLayout}
//   GET /api/v1/jobs/ID/series    the job's per-rank throughput and time in collectives over time
//                                 (series_json.h)
//   GET /api/v1/cluster/series    GPUs in use and jobs by state over time
//   GET /metrics           Prometheus text format
//   GET /healthz           "ok", or 503 and why while the coordinator cannot store its state
//   GET /login?token=T     sets the token cookie and redirects to / (for browsers, where tokens are needed)
// A standby coordinator's server (StandbyBackend) serves /metrics (ddl_coordinator_leader 0) and answers 503,
// naming the leader, to everything else.
// Anything else is 404; methods other than GET and HEAD are 405 with `Allow: GET, HEAD` (nothing here changes
// state); a bad request never takes the server down.
//
// Security (docs/dashboard.md). On a loopback address the server speaks plain HTTP and asks for nothing, as
// it always did. Anywhere else, or when the operator asks (HttpOptions::tls), it speaks HTTPS with the
// coordinator's own certificate and key from the PKI directory, re-read when the files change, and every path
// but /healthz needs the token of a registered user of any role: `Authorization: Bearer TOKEN` (ddlctl's
// tokens; Prometheus' `authorization` setting) or the cookie /login sets. Without one the answer is 401 and
// says how to get one. Readers who are neither admins nor the job's owner see jobs without command, env and
// workdir, and no logs (auth/access.h's rules, as ListJobs applies them).
//
// Threads. The server runs on one Asio io_context served by one thread of its own (the "io thread"): it
// accepts, reads, routes, renders and writes for every connection, and nothing on it blocks. Each request's
// header must arrive whole within HttpOptions::request_timeout_ms of its first byte (a client that dribbles a
// line at a time is cut off then, not given a fresh wait per byte); a connection waits idle_timeout_ms for
// the next request; writes get write_timeout_ms. At most max_connections are open: a new one past that evicts
// the oldest connection that is only waiting for a request (idle, or still sending its header), so slow or
// idle clients can never lock out /healthz; when every connection is busy with a request, the new one is
// answered 503 (plain HTTP) or closed (HTTPS) at once. Coordinator calls are the asynchronous forms; their
// answers are posted back to the io thread, and each is bounded by backend_timeout_ms (a log read whose agent
// never answers leaves that log "not available" on the page, the page still renders). start()/stop() from the
// owning thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
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

// What the dashboard asks of the coordinator: the asynchronous forms of Coordinator's calls, behind a seam so
// tests can serve pages from a fake (one that never answers, above all). `done` is called at most once, on any
// thread, and must not block; health() never blocks.
class DashboardBackend {
 public:
  template <class T>
  using Done = Coordinator::Done<T>;
  virtual ~DashboardBackend() = default;
  virtual void listJobs(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done) = 0;
  virtual void listNodes(Done<std::vector<v1::Node>> done) = 0;
  virtual void getJob(const std::string& id, Done<v1::Job> done) = 0;
  virtual void ring(const std::string& id, Done<v1::RingLayout> done) = 0;
  virtual void readLog(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done) = 0;
  virtual void metrics(Done<MetricsSnapshot> done) = 0;
  // The plots' series; a backend without them answers UNAVAILABLE.
  virtual void jobSeries(const std::string& id, Done<JobSeries> done);
  virtual void clusterSeries(Done<ClusterSeries> done);
  // The usage rollups (Coordinator::usage); a backend without them answers UNAVAILABLE.
  virtual void usage(const v1::GetUsageRequest& request, Done<v1::GetUsageResponse> done);
  virtual StoreHealth health() = 0;
};

// The Coordinator as a DashboardBackend: its asynchronous forms, as they are.
class CoordinatorBackend : public DashboardBackend {
 public:
  explicit CoordinatorBackend(Coordinator& coordinator) : c_(coordinator) {}
  void listJobs(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done) override;
  void listNodes(Done<std::vector<v1::Node>> done) override;
  void getJob(const std::string& id, Done<v1::Job> done) override;
  void ring(const std::string& id, Done<v1::RingLayout> done) override;
  void readLog(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done) override;
  void metrics(Done<MetricsSnapshot> done) override;
  void jobSeries(const std::string& id, Done<JobSeries> done) override;
  void clusterSeries(Done<ClusterSeries> done) override;
  void usage(const v1::GetUsageRequest& request, Done<v1::GetUsageResponse> done) override;
  StoreHealth health() override;

 private:
  Coordinator& c_;
};

// A standby coordinator's dashboard (several coordinators on etcd, this one waiting to lead): /metrics says
// ddl_coordinator_leader 0, so Prometheus scrapes every coordinator, and /healthz and every other path answer
// 503 with `status` ("standby: HOST:PORT leads"). `status` is called on the io thread and must not block.
class StandbyBackend : public DashboardBackend {
 public:
  StandbyBackend(std::string store, std::function<std::string()> status)
      : store_(std::move(store)), status_(std::move(status)) {}
  void listJobs(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done) override;
  void listNodes(Done<std::vector<v1::Node>> done) override;
  void getJob(const std::string& id, Done<v1::Job> done) override;
  void ring(const std::string& id, Done<v1::RingLayout> done) override;
  void readLog(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done) override;
  void metrics(Done<MetricsSnapshot> done) override;
  StoreHealth health() override;

 private:
  Status unavailable() const;
  const std::string store_;
  const std::function<std::string()> status_;
};

using Respond = std::function<void(Response)>;

// Routing. `respond` is called exactly once, on whichever thread the backend's last answer came (inline when
// none was needed); the backend must outlive that call. A job page asks for its log tails all at once and
// renders when every one has answered (an error answer shows as "log not available").
void handleRequest(DashboardBackend& backend, const Request& request, const Access& access, Respond respond);

// Synchronous forms over a Coordinator, for tests and tools (they wait for the answer; never call them on a
// thread the answer needs).
Response handleRequest(Coordinator& coordinator, const Request& request, const Access& access);
// The same for an open dashboard (no token needed).
Response handleRequest(Coordinator& coordinator, const std::string& method, const std::string& target);

struct HttpOptions {
  bool tls = false;   // HTTPS (and so tokens) on a loopback address too; always on elsewhere
  bool auth = false;  // tokens on a loopback address too, over plain HTTP (e.g. behind a proxy that adds TLS)
  std::string pki_dir;                        // coordinator.crt and coordinator.key, for HTTPS
  const auth::UserRegistry* users = nullptr;  // not owned, outlives the server; needed for tokens
  int idle_timeout_ms = 30000;     // waiting for a request's first byte (a new or kept-alive connection)
  int request_timeout_ms = 10000;  // a whole request header from its first byte; a TLS handshake, too
  int write_timeout_ms = 10000;    // writing a response
  int backend_timeout_ms = 15000;  // one coordinator call (above its own log timeout, 5 s by default)
  int max_connections = 64;        // open at once (see the file comment for what happens past it)
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
  explicit HttpServer(Coordinator& coordinator, HttpOptions options = {});
  // Over any backend (tests' fakes); it must outlive the server.
  explicit HttpServer(DashboardBackend& backend, HttpOptions options = {});
  ~HttpServer();

  // Listens on HOST:PORT (port 0: any); `bound` gets the real address. Errors name the address; with HTTPS,
  // a certificate or key that cannot be loaded (or no users for tokens) is an error before anything listens.
  Status start(const std::string& listen, std::string* bound);
  void stop();
  // "https" or "http", as start() settled it.
  const char* scheme() const;

 private:
  struct Impl;
  std::unique_ptr<CoordinatorBackend> own_backend_;  // with the Coordinator constructor
  std::shared_ptr<Impl> impl_;
};

}  // namespace ddl::coordinator::http
