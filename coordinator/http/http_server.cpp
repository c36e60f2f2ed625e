#include "http/http_server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detect_ssl.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <cctype>
#include <list>
#include <nlohmann/json.hpp>

#include "common/pki.h"
#include "ddl/messages.h"
#include "ddl/tls.h"
#include "http/pages.h"
#include "http/server_certificate.h"
#include "rpc/access.h"
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

// The token of a request: `Authorization: Bearer TOKEN` (the scheme in any case), else the /login cookie.
// `from_header` says which, since a header with a bad token is refused rather than passed over for the cookie.
std::string requestToken(const Request& req, bool* from_header) {
  *from_header = !req.authorization.empty();
  if (*from_header) {
    static const std::string kBearer = "bearer ";
    if (req.authorization.size() <= kBearer.size() ||
        !std::equal(kBearer.begin(), kBearer.end(), req.authorization.begin(),
                    [](char a, char b) { return a == std::tolower(static_cast<unsigned char>(b)); })) {
      return "";
    }
    const size_t start = req.authorization.find_first_not_of(' ', kBearer.size());
    return start == std::string::npos ? "" : req.authorization.substr(start);
  }
  const std::string name = std::string(kTokenCookie) + "=";
  size_t pos = 0;
  while (pos < req.cookie.size()) {
    const size_t end = std::min(req.cookie.find(';', pos), req.cookie.size());
    const size_t first = req.cookie.find_first_not_of(' ', pos);
    if (first < end && req.cookie.compare(first, name.size(), name) == 0) {
      return req.cookie.substr(first + name.size(), end - first - name.size());
    }
    pos = end + 1;
  }
  return "";
}

// Tokens are "ddl_" and hex; anything else (a CR or LF above all) never reaches a header or the registry.
bool plausibleToken(const std::string& token) {
  return !token.empty() && token.size() <= 256 &&
         token.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") ==
             std::string::npos;
}

const char* kHowToGetAToken =
    "this dashboard needs the token of a ddl user (any role: viewer, user or admin): send 'Authorization: Bearer "
    "TOKEN', or open /login?token=TOKEN in a browser. An admin makes one with 'ddlctl admin add-user NAME --role "
    "viewer' (ddlctl's own token works too)";

// 401: JSON for the API and /metrics, a short page with a token field for browsers.
Response unauthorized(const std::string& path, const std::string& why) {
  const std::string message = why.empty() ? kHowToGetAToken : why + "; " + kHowToGetAToken;
  Response r;
  r.status = 401;
  r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"ddl\"");
  if (path.rfind("/api/", 0) == 0 || path == "/metrics") {
    r.content_type = "application/json";
    r.body = dumpJson({{"error", message}});
    return r;
  }
  r.content_type = "text/html; charset=utf-8";
  r.body = "<!doctype html><html><head><meta charset='utf-8'><title>ddl: token needed</title></head><body>"
           "<h1>ddl: token needed</h1><p>" + htmlEscape(message) + ".</p>"
           "<form action='/login' method='get'><input type='password' name='token' size='70' "
           "placeholder='ddl_...' autofocus> <button>Sign in</button></form></body></html>\n";
  return r;
}

// %XX escapes decoded (what a browser's form sends); a malformed one is kept as it is.
std::string percentDecode(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

}  // namespace

Response handleRequest(Coordinator& c, const std::string& method, const std::string& target) {
  return handleRequest(c, Request{method, target, "", ""}, Access{});
}

Response handleRequest(Coordinator& c, const Request& request, const Access& gate) {
  if (request.method != "GET" && request.method != "HEAD") {
    Response r = error(405, "only GET and HEAD: the dashboard is read-only");
    r.headers.emplace_back("Allow", "GET, HEAD");
    return r;
  }
  const std::string& target = request.target;
  const size_t q = target.find('?');
  const std::string path = target.substr(0, q);
  const std::string query = q == std::string::npos ? "" : target.substr(q + 1);
  if (path == "/healthz") return {200, "text/plain; charset=utf-8", "ok\n"};

  // Who asks: everyone sees everything on an open dashboard; elsewhere a registered user's token decides.
  auth::Identity who{"", auth::Role::kInsecure, "open dashboard"};
  if (path == "/login") {
    const std::string token = percentDecode(queryParam(query, "token"));
    Response r{303, "text/plain; charset=utf-8", "signed in; go to /\n", {{"Location", "/"}}};
    if (!gate.require_token) return r;  // nothing to sign in to
    if (token.empty()) return unauthorized(path, "");
    if (!plausibleToken(token) || !gate.users || !gate.users->authenticate(token)) {
      return unauthorized(path, "that token is not valid (mistyped, rotated or removed?)");
    }
    r.headers.emplace_back("Set-Cookie",
                           std::string(kTokenCookie) + "=" + token + "; Path=/; HttpOnly; Secure; SameSite=Strict");
    return r;
  }
  if (gate.require_token) {
    bool from_header = false;
    const std::string token = requestToken(request, &from_header);
    if (token.empty()) {
      return unauthorized(path, from_header ? "the Authorization field is not 'Bearer TOKEN'" : "");
    }
    std::optional<auth::Identity> found;
    if (plausibleToken(token) && gate.users) found = gate.users->authenticate(token);
    if (!found) {
      return unauthorized(path, std::string(from_header ? "the bearer token" : "the token of the cookie") +
                                    " is not valid (mistyped, rotated or removed?)");
    }
    who = *found;
  }

  if (path == "/metrics") return {200, "text/plain; version=0.0.4; charset=utf-8", renderMetrics(c.metrics())};
  if (path == "/" || path == "/index.html") return {200, "text/html; charset=utf-8", renderIndexPage()};
  if (path == "/api/v1/nodes") {
    v1::ListNodesResponse resp;
    for (auto& n : c.listNodes()) *resp.add_nodes() = std::move(n);
    return {200, "application/json", toJson(resp) + "\n"};
  }
  if (path == "/api/v1/jobs") {
    v1::ListJobsRequest req;
    const std::string state = percentDecode(queryParam(query, "state"));
    if (!state.empty()) {
      v1::JobState s;
      if (!v1::JobState_Parse(state, &s) || s == v1::JOB_STATE_UNSPECIFIED) {
        return error(400, "unknown state '" + state + "' (PENDING, SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED)");
      }
      req.add_states(s);
    }
    req.set_user(percentDecode(queryParam(query, "user")));
    auto jobs = c.listJobs(req);
    if (!jobs) return error(httpStatus(jobs.status()), jobs.status().message());
    for (auto& j : *jobs->mutable_jobs()) access::redactFor(who, &j);
    return {200, "application/json", toJson(*jobs) + "\n"};
  }
  const bool api = path.rfind("/api/v1/jobs/", 0) == 0;
  if (api || path.rfind("/jobs/", 0) == 0) {
    const std::string id = path.substr(api ? 13 : 6);
    if (!validJobId(id)) return error(404, "no such page: " + path);
    auto job = c.getJob(id);
    if (!job) return error(httpStatus(job.status()), job.status().message());
    // Others' jobs lose command, env and workdir, and their logs are not read (GetLogs' rule).
    const bool hidden = !access::mayTouchJob(who, *job, "read the logs of").isOk();
    access::redactFor(who, &*job);
    auto ring = c.ring(id);
    if (api) {
      const nlohmann::json body = {{"job", protoJson(*job)}, {"ring", ring ? protoJson(*ring) : nullptr}};
      return {200, "application/json", dumpJson(body)};
    }
    // Log tails: rank 0, the failing rank, and the slowest rank by its last collective.
    std::map<int, std::string> logs;
    if (ring && !hidden) {
      std::set<int> ranks = {0};
      if (job->has_failure()) ranks.insert(job->failure().rank());
      if (const int slowest = slowestRank(*job); slowest >= 0) ranks.insert(slowest);
      for (int r : ranks) logs[r] = logTail(c, id, r, 4096);
    }
    const int64_t now = state::systemNowMs();
    return {200, "text/html; charset=utf-8", renderJobPage(*job, ring ? &*ring : nullptr, logs, now, hidden)};
  }
  return error(404, "no such page: " + path);
}

HttpMode httpMode(const std::string& listen, const HttpOptions& options) {
  HttpMode mode;
  mode.tls = options.tls || !tls::isLoopback(listen);
  mode.auth = options.auth || mode.tls;
  return mode;
}

namespace {

// How long a TLS goodbye may take (the other limits come from HttpOptions::timeout_ms).
constexpr auto kGoodbyeTimeout = std::chrono::seconds(1);

// One client connection, served on its own thread with its own io_context. Every read and write is an
// asynchronous operation run to completion with a deadline (runUntil): a blocking read would never time out,
// since asio waits again with poll() after SO_RCVTIMEO expires.
struct Connection {
  asio::io_context io;
  tcp::socket socket{io};

  // Runs the operation just started until it sets `done`, for at most `timeout`; past it, closes the socket,
  // which ends the operation with an error. False on timeout.
  bool runUntil(const bool& done, std::chrono::steady_clock::duration timeout) {
    io.restart();
    io.run_for(timeout);
    if (done) return true;
    beast::error_code ignored;
    socket.close(ignored);
    io.restart();
    io.run();  // the operation completes, aborted
    return false;
  }

  // From another thread (stop()): the close runs on this connection's thread at its next wait.
  void closeSoon() {
    asio::post(io, [this] {
      beast::error_code ignored;
      socket.shutdown(tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
    });
  }
};

}  // namespace

struct HttpServer::Impl : std::enable_shared_from_this<HttpServer::Impl> {
  Impl(Coordinator& c, HttpOptions o) : coordinator(c), options(std::move(o)) {}

  Coordinator& coordinator;
  const HttpOptions options;
  HttpMode mode;
  Access access;
  std::unique_ptr<ServerCertificate> certificate;  // with mode.tls
  // A request's header (keep-alive idling included) or a response's write; a TLS handshake.
  const std::chrono::milliseconds io_timeout{std::max(1, options.timeout_ms)};
  const std::chrono::milliseconds handshake_timeout{std::max(1, options.timeout_ms / 3)};
  std::string bound;
  asio::io_context io;  // the acceptor's
  std::unique_ptr<tcp::acceptor> acceptor;
  std::thread accept_thread;
  std::mutex mu;
  std::condition_variable cv;
  std::list<std::shared_ptr<Connection>> open;  // connections being served, to close them at stop()
  int active = 0;
  bool stopping = false;

  void acceptLoop() {
    while (true) {
      auto conn = std::make_shared<Connection>();
      beast::error_code ec;
      acceptor->accept(conn->socket, ec);
      std::unique_lock<std::mutex> lock(mu);
      if (stopping) return;
      if (ec) continue;
      if (active >= kMaxConnections) {
        conn->socket.close(ec);  // shed load rather than queue without bound
        continue;
      }
      ++active;
      auto it = open.insert(open.end(), conn);
      std::thread([self = shared_from_this(), conn, it] {
        self->serve(*conn);
        std::lock_guard<std::mutex> lock(self->mu);
        self->open.erase(it);
        --self->active;
        self->cv.notify_all();
      }).detach();
    }
  }

  bool isStopping() {
    std::lock_guard<std::mutex> lock(mu);
    return stopping;
  }

  void serve(Connection& conn) {
    beast::flat_buffer buffer;
    if (!mode.tls) {
      serveRequests(conn, conn.socket, buffer);
      beast::error_code ignored;
      conn.socket.shutdown(tcp::socket::shutdown_both, ignored);
      return;
    }
    bool done = false, is_tls = false;
    beast::error_code ec;
    beast::async_detect_ssl(conn.socket, buffer, [&](beast::error_code e, bool result) {
      ec = e;
      is_tls = result;
      done = true;
    });
    if (!conn.runUntil(done, handshake_timeout) || ec) return;
    if (!is_tls) return answerPlaintext(conn, buffer);
    auto context = certificate->context();
    if (!context) {
      spdlog::error("dashboard: cannot serve HTTPS: {}", context.status().message());
      return;
    }
    asio::ssl::stream<tcp::socket&> stream(conn.socket, **context);
    done = false;
    size_t used = 0;
    stream.async_handshake(asio::ssl::stream_base::server, buffer.data(), [&](beast::error_code e, size_t n) {
      ec = e;
      used = n;
      done = true;
    });
    if (!conn.runUntil(done, handshake_timeout) || ec) return;
    buffer.consume(used);
    if (serveRequests(conn, stream, buffer)) {
      done = false;
      stream.async_shutdown([&](beast::error_code) { done = true; });
      conn.runUntil(done, kGoodbyeTimeout);
    }
  }

  // Requests on one connection until it closes, fails, times out or has served 1000. True when it ended
  // cleanly (a goodbye is worth sending).
  template <typename Stream>
  bool serveRequests(Connection& conn, Stream& stream, beast::flat_buffer& buffer) {
    for (int served = 0; served < 1000; ++served) {
      if (isStopping()) return false;
      beast::http::request_parser<beast::http::empty_body> parser;
      parser.header_limit(16 * 1024);
      bool done = false;
      beast::error_code ec;
      beast::http::async_read_header(stream, buffer, parser, [&](beast::error_code e, size_t) {
        ec = e;
        done = true;
      });
      // Closed, timed out, or malformed: drop the connection.
      if (!conn.runUntil(done, io_timeout) || ec) return false;
      const auto& req = parser.get();
      // No route takes a body; one that was sent (a POST's) is not read, and the connection ends after the answer.
      const bool body_left = !parser.is_done();
      Request request{std::string(req.method_string()), std::string(req.target()),
                      std::string(req[beast::http::field::authorization]), std::string(req[beast::http::field::cookie])};
      Response r;
      try {
        r = handleRequest(coordinator, request, access);
      } catch (const std::exception& e) {
        // The path only: a query may hold a token (/login).
        spdlog::error("http {} {}: {}", request.method, request.target.substr(0, request.target.find('?')), e.what());
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
      done = false;
      beast::http::async_write(stream, res, [&](beast::error_code e, size_t) {
        ec = e;
        done = true;
      });
      if (!conn.runUntil(done, io_timeout) || ec) return false;
      if (!res.keep_alive()) return true;
    }
    return true;
  }

  // Plain HTTP sent to the HTTPS port: one 400 that says where to go instead, then close.
  void answerPlaintext(Connection& conn, beast::flat_buffer& buffer) {
    beast::http::request_parser<beast::http::empty_body> parser;
    parser.header_limit(16 * 1024);
    bool done = false;
    beast::error_code ec;
    beast::http::async_read_header(conn.socket, buffer, parser, [&](beast::error_code e, size_t) {
      ec = e;
      done = true;
    });
    if (!conn.runUntil(done, handshake_timeout) || ec) return;
    // The address the client used (Host), where it looks like one; else the bound one.
    std::string host(parser.get()[beast::http::field::host]);
    if (host.empty() || host.size() > 255 ||
        host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]") !=
            std::string::npos) {
      host = bound;
    }
    beast::http::response<beast::http::string_body> res{beast::http::status::bad_request, parser.get().version()};
    res.set(beast::http::field::server, "ddl-coordinator");
    res.set(beast::http::field::content_type, "text/plain; charset=utf-8");
    res.body() = "this port speaks HTTPS only: https://" + host + "/ (the coordinator's certificate, from the cluster CA)\n";
    res.keep_alive(false);
    res.prepare_payload();
    done = false;
    beast::http::async_write(conn.socket, res, [&](beast::error_code e, size_t) {
      ec = e;
      done = true;
    });
    conn.runUntil(done, io_timeout);
    conn.socket.shutdown(tcp::socket::shutdown_both, ec);
  }
};

HttpServer::HttpServer(Coordinator& coordinator, HttpOptions options)
    : impl_(std::make_shared<Impl>(coordinator, std::move(options))) {}

HttpServer::~HttpServer() { stop(); }

const char* HttpServer::scheme() const { return impl_->mode.tls ? "https" : "http"; }

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

  // Off loopback (or when asked): HTTPS and tokens, checked before anything listens.
  Impl& impl = *impl_;
  impl.mode = httpMode(listen, impl.options);
  const std::string why = address.is_loopback() ? " (http_tls is set)" : " (it is not a loopback address)";
  if (impl.mode.auth && !impl.options.users) {
    return Status::failedPrecondition("the dashboard on " + listen + " needs tokens" +
                                      (impl.mode.tls ? why : std::string(" (http_auth is set)")) +
                                      " but there are no users (" + impl.options.pki_dir + "/" + pki::kUsersFile +
                                      "; 'ddl-coordinator init-pki' makes the first admin)");
  }
  impl.access = {impl.mode.auth, impl.options.users};
  if (impl.mode.tls) {
    const std::string dir = impl.options.pki_dir.empty() ? "." : impl.options.pki_dir;
    impl.certificate = std::make_unique<ServerCertificate>(dir + "/" + pki::kCoordinatorCert,
                                                           dir + "/" + pki::kCoordinatorKey);
    if (auto context = impl.certificate->context(); !context) {
      return Status::failedPrecondition(
          "the dashboard on " + listen + " serves HTTPS" + why + " with the coordinator's certificate, but " +
          context.status().message() + "; make it with 'ddl-coordinator init-pki " + dir +
          "' (docs/security.md), or bind the dashboard to 127.0.0.1");
    }
  }

  auto acceptor = std::make_unique<tcp::acceptor>(impl.io);
  tcp::endpoint endpoint(address, static_cast<unsigned short>(port));
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::unavailable("cannot listen on " + listen + " for http: " + ec.message());
  const auto local = acceptor->local_endpoint();
  *bound = (local.address().is_v6() ? "[" + local.address().to_string() + "]" : local.address().to_string()) +
           ":" + std::to_string(local.port());
  impl.bound = *bound;
  impl.acceptor = std::move(acceptor);
  impl.accept_thread = std::thread([this] { impl_->acceptLoop(); });
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
    for (auto& c : impl_->open) c->closeSoon();
  }
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  std::unique_lock<std::mutex> lock(impl_->mu);
  // Connections end at their next wait once told to close; one busy longer (a log read waiting on an agent)
  // keeps the Impl alive through its shared_ptr, so it can finish late without touching freed memory.
  impl_->cv.wait_for(lock, std::chrono::seconds(5), [&] { return impl_->active == 0; });
  impl_->acceptor.reset();
}

}  // namespace ddl::coordinator::http
