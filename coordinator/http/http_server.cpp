#include "http/http_server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <list>
#include <nlohmann/json.hpp>

#include "ddl/messages.h"
#include "http/pages.h"
#include "service/convert.h"

namespace ddl::coordinator::http {

namespace beast = boost::beast;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

int httpStatus(const Status& st) {
  switch (st.code()) {
    case state::StatusCode::kNotFound: return 404;
    case state::StatusCode::kInvalidArgument: return 400;
    case state::StatusCode::kFailedPrecondition: return 409;
    case state::StatusCode::kUnavailable: return 503;
    default: return 500;
  }
}

// JSON text of `value`; a byte that is not UTF-8 (a path can hold any) becomes U+FFFD instead of an exception.
std::string dumpJson(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// A protobuf message as a JSON value, in the same mapping as the rest of /api/v1 (ddl::toJson).
nlohmann::json protoJson(const google::protobuf::Message& message) { return nlohmann::json::parse(toJson(message)); }

Response error(int status, const std::string& message) {
  return {status, "application/json", dumpJson({{"error", message}})};
}

std::string queryParam(const std::string& query, const std::string& key) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    std::string item = query.substr(pos, amp == std::string::npos ? std::string::npos : amp - pos);
    if (item.rfind(key + "=", 0) == 0) return item.substr(key.size() + 1);
    if (amp == std::string::npos) break;
    pos = amp + 1;
  }
  return "";
}

bool validJobId(const std::string& id) { return state::jobIdNumber(id).has_value(); }

// The last `bytes` of a rank's log, read through its agent; "" when it cannot be read now.
std::string logTail(Coordinator& c, const std::string& id, int rank, int64_t bytes) {
  v1::GetLogsRequest probe;
  probe.set_id(id);
  probe.set_rank(rank);
  probe.set_max_bytes(1);
  auto first = c.readLog(probe);
  if (!first) return "(log not available: " + first.status().message() + ")";
  v1::GetLogsRequest req = probe;
  req.set_offset(std::max<int64_t>(0, first->size() - bytes));
  req.set_max_bytes(static_cast<int32_t>(bytes));
  auto tail = c.readLog(req);
  return tail ? tail->data() : "";
}

}  // namespace

Response handleRequest(Coordinator& c, const std::string& method, const std::string& target) {
  if (method != "GET" && method != "HEAD") {
    Response r = error(405, "only GET and HEAD: the dashboard is read-only");
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  }
  const size_t q = target.find('?');
  const std::string path = target.substr(0, q);
  const std::string query = q == std::string::npos ? "" : target.substr(q + 1);
  if (path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};
  if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", renderMetrics(c.metrics())};
  if (path == "/" || path == "/index.html") return {200, "text/html; charset=utf-8", renderIndexPage()};
  if (path == "/api/v1/nodes") {
    v1::ListNodesResponse resp;
    for (auto& n : c.listNodes()) *resp.add_nodes() = std::move(n);
    return {200, "application/json", toJson(resp) + "\n"};
  }
  if (path == "/api/v1/jobs") {
    v1::ListJobsRequest req;
    const std::string state = queryParam(query, "state");
    if (!state.empty()) {
      v1::JobState s;
      if (!v1::JobState_Parse(state, &s) || s == v1::JOB_STATE_UNSPECIFIED) {
        return error(400, "unknown state '" + state + "' (PENDING, SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED)");
      }
      req.add_states(s);
    }
    req.set_user(queryParam(query, "user"));
    auto jobs = c.listJobs(req);
    if (!jobs) return error(httpStatus(jobs.status()), jobs.status().message());
    v1::ListJobsResponse resp;
    for (auto& j : *jobs) *resp.add_jobs() = std::move(j);
    return {200, "application/json", toJson(resp) + "\n"};
  }
  const bool api = path.rfind("/api/v1/jobs/", 0) == 0;
  if (api || path.rfind("/jobs/", 0) == 0) {
    const std::string id = path.substr(api ? 13 : 6);
    if (!validJobId(id)) return error(404, "no such page: " + path);
    auto job = c.getJob(id);
    if (!job) return error(httpStatus(job.status()), job.status().message());
    auto ring = c.ring(id);
    if (api) {
      const nlohmann::json body = {{"job", protoJson(*job)}, {"ring", ring ? protoJson(*ring) : nullptr}};
      return {200, "application/json", dumpJson(body)};
    }
    // Log tails: rank 0, the failing rank, and the slowest rank by its last collective.
    std::map<int, std::string> logs;
    if (ring) {
      std::set<int> ranks = {0};
      if (job->has_failure()) ranks.insert(job->failure().rank());
      if (const int slowest = slowestRank(*job); slowest >= 0) ranks.insert(slowest);
      for (int r : ranks) logs[r] = logTail(c, id, r, 4096);
    }
    const int64_t now = state::systemNowMs();
    return {200, "text/html; charset=utf-8", renderJobPage(*job, ring ? &*ring : nullptr, logs, now)};
  }
  return error(404, "no such page: " + path);
}

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  explicit Impl(Coordinator& c) : coordinator(c) {}

  Coordinator& coordinator;
  asio::io_context io;
  std::unique_ptr<tcp::acceptor> acceptor;
  std::thread accept_thread;
  std::mutex mu;
  std::condition_variable cv;
  std::list<std::shared_ptr<tcp::socket>> open;  // connections being served, to close them at stop()
  int active = 0;
  bool stopping = false;

  void acceptLoop() {
    while (true) {
      auto socket = std::make_shared<tcp::socket>(io);
      beast::error_code ec;
      acceptor->accept(*socket, ec);
      std::unique_lock<std::mutex> lock(mu);
      if (stopping) return;
      if (ec) continue;
      if (active >= kMaxConnections) {
        socket->close(ec);  // shed load rather than queue without bound
        continue;
      }
      ++active;
      auto it = open.insert(open.end(), socket);
      std::thread([self = shared_from_this(), socket, it] {
        self->serve(*socket);
        std::lock_guard<std::mutex> lock(self->mu);
        self->open.erase(it);
        --self->active;
        self->cv.notify_all();
      }).detach();
    }
  }

  void serve(tcp::socket& socket) {
    beast::error_code ec;
    // A silent client may hold a connection for 30 s at most.
    timeval tv{30, 0};
    setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    beast::flat_buffer buffer;
    for (int served = 0; served < 1000; ++served) {
      beast::http::request_parser<beast::http::empty_body> parser;
      parser.header_limit(16 * 1024);
      beast::http::read_header(socket, buffer, parser, ec);
      if (ec) return;  // closed, timed out, or malformed: drop the connection
      const auto& req = parser.get();
      // No route takes a body; one that was sent (a POST's) is not read, and the connection ends after the answer.
      const bool body_left = !parser.is_done();
      Response r;
      try {
        r = handleRequest(coordinator, std::string(req.method_string()), std::string(req.target()));
      } catch (const std::exception& e) {
        spdlog::error("http {} {}: {}", std::string(req.method_string()), std::string(req.target()), e.what());
        r = error(500, "internal error");
      }
      beast::http::response<beast::http::string_body> res{static_cast<beast::http::status>(r.status),
                                                          req.version()};
      res.set(beast::http::field::server, "ddl-coordinator");
      res.set(beast::http::field::content_type, r.content_type);
      res.set(beast::http::field::cache_control, "no-store");
      for (const auto& [name, value] : r.headers) res.set(name, value);
      res.keep_alive(req.keep_alive() && !body_left);
      if (req.method() != beast::http::verb::head) res.body() = std::move(r.body);
      res.prepare_payload();
      beast::http::write(socket, res, ec);
      if (ec || !res.keep_alive()) break;
    }
    socket.shutdown(tcp::socket::shutdown_both, ec);
  }
};

HttpServer::HttpServer(Coordinator& coordinator) : impl_(std::make_shared<Impl>(coordinator)) {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start(const std::string& listen, std::string* bound) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return Status::invalidArgument("http address '" + listen + "' is not HOST:PORT (e.g. 127.0.0.1:8080)");
  }
  std::string host = listen.substr(0, colon);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  beast::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) return Status::invalidArgument("http address '" + listen + "': '" + host + "' is not an IP address");
  int port = 0;
  try {
    port = std::stoi(listen.substr(colon + 1));
  } catch (...) {
    port = -1;
  }
  if (port < 0 || port > 65535) return Status::invalidArgument("http address '" + listen + "': bad port");
  auto acceptor = std::make_unique<tcp::acceptor>(impl_->io);
  tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::unavailable("cannot listen on " + listen + " for http: " + ec.message());
  const auto local = acceptor->local_endpoint();
  *bound = (local.address().is_v6() ? "[" + local.address().to_string() + "]" : local.address().to_string()) +
           ":" + std::to_string(local.port());
  impl_->acceptor = std::move(acceptor);
  impl_->accept_thread = std::thread([this] { impl_->acceptLoop(); });
  return Status::ok();
}

void HttpServer::stop() {
  if (!impl_ || !impl_->acceptor) return;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    beast::error_code ec;
    impl_->acceptor->cancel(ec);
    ::shutdown(impl_->acceptor->native_handle(), SHUT_RDWR);  // wakes the blocking accept()
    for (auto& s : impl_->open) s->shutdown(tcp::socket::shutdown_both, ec);
  }
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  std::unique_lock<std::mutex> lock(impl_->mu);
  // Connections end fast once their sockets are shut down; one stuck longer (a log read waiting on an agent)
  // keeps the Impl alive through its shared_ptr, so it can finish late without touching freed memory.
  impl_->cv.wait_for(lock, std::chrono::seconds(5), [&] { return impl_->active == 0; });
  impl_->acceptor.reset();
}

}  // namespace ddl::coordinator::http
