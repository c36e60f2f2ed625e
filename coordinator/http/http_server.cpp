// The dashboard's server (http_server.h): Boost.Beast on one io thread, HTTP or HTTPS, connections with
// their timeouts and bounds, each request handed to the routing (routes.cpp).
#include "http/http_server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/core/detect_ssl.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <future>
#include <list>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "auth/access.h"
#include "common/host_port.h"
#include "common/pki.h"
#include "ddl/messages.h"
#include "http/pages.h"
#include "http/series_json.h"
#include "http/server_certificate.h"
#include "service/convert.h"

namespace ddl::coordinator::http {

namespace beast = boost::beast;
namespace asio = boost::asio;
using tcp = asio::ip::tcp;

HttpMode httpMode(const std::string& listen, const HttpOptions& options) {
  HttpMode mode;
  mode.tls = options.tls || !isLoopback(listen);
  mode.auth = options.auth || mode.tls;
  return mode;
}


namespace {

// How long a TLS goodbye, or a 503 to a connection past the cap, may take.
constexpr auto kShortTimeout = std::chrono::seconds(1);
constexpr size_t kHeaderLimit = 16 * 1024;
constexpr int kRequestsPerConnection = 1000;

using Clock = std::chrono::steady_clock;

// A backend whose answers run on the io thread, each within a deadline: every call's `done` is posted to the
// io_context, and a call that has not answered when its timer fires gets UNAVAILABLE instead (its late answer
// is dropped). Calls are made on the io thread.
//
// Ownership: what a call's answer leads to (the route's continuation, and through it the connection) is owned by
// the call's timer, that is by the io_context; the callback handed to the inner backend holds it and the
// io_context only weakly. So a coordinator that answers late, or destroys an unanswered callback after the server
// is gone, touches nothing of the server's: no socket outlives its io_context.
class IoBackend : public DashboardBackend {
 public:
  IoBackend(DashboardBackend& inner, const std::shared_ptr<asio::io_context>& io, std::chrono::milliseconds timeout)
      : inner_(inner), io_(io), timeout_(timeout) {}

  void listJobs(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done) override {
    inner_.listJobs(request, bound(std::move(done), "list the jobs"));
  }
  void listNodes(Done<std::vector<v1::Node>> done) override {
    inner_.listNodes(bound(std::move(done), "list the nodes"));
  }
  void getJob(const std::string& id, Done<v1::Job> done) override {
    inner_.getJob(id, bound(std::move(done), "get the job"));
  }
  void ring(const std::string& id, Done<v1::RingLayout> done) override {
    inner_.ring(id, bound(std::move(done), "get the ring"));
  }
  void readLog(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done) override {
    inner_.readLog(request, bound(std::move(done), "read the log"));
  }
  void metrics(Done<MetricsSnapshot> done) override { inner_.metrics(bound(std::move(done), "read the metrics")); }
  void jobSeries(const std::string& id, Done<JobSeries> done) override {
    inner_.jobSeries(id, bound(std::move(done), "read the job's series"));
  }
  void clusterSeries(Done<ClusterSeries> done) override {
    inner_.clusterSeries(bound(std::move(done), "read the cluster's series"));
  }
  void usage(const v1::GetUsageRequest& request, Done<v1::GetUsageResponse> done) override {
    inner_.usage(request, bound(std::move(done), "read the usage"));
  }
  StoreHealth health() override { return inner_.health(); }

 private:
  template <class T>
  struct Pending {
    Done<T> done;  // empty once called
    std::weak_ptr<asio::steady_timer> timer;
  };

  template <class T>
  Done<T> bound(Done<T> done, const char* what) {
    auto pending = std::make_shared<Pending<T>>();
    pending->done = std::move(done);
    auto io = io_.lock();
    if (!io) return [](StatusOr<T>) {};  // stopped: nothing will run the answer
    auto timer = std::make_shared<asio::steady_timer>(*io, timeout_);
    pending->timer = timer;
    const int64_t ms = timeout_.count();
    // The timer's handler owns `pending` until the timer fires or is cancelled by the answer.
    timer->async_wait([timer, pending, what, ms](beast::error_code ec) {
      if (ec || !pending->done) return;
      auto d = std::move(pending->done);
      pending->done = nullptr;
      d(Status::unavailable(std::string("the coordinator did not ") + what + " within " + std::to_string(ms) +
                            " ms"));
    });
    return [weak_io = io_, weak = std::weak_ptr<Pending<T>>(pending)](StatusOr<T> result) {
      auto io = weak_io.lock();
      if (!io) return;
      asio::post(*io, [weak, result = std::move(result)]() mutable {
        auto pending = weak.lock();
        if (!pending || !pending->done) return;  // the deadline answered already
        auto d = std::move(pending->done);
        pending->done = nullptr;
        if (auto t = pending->timer.lock()) t->cancel();
        d(std::move(result));
      });
    };
  }

  DashboardBackend& inner_;
  std::weak_ptr<asio::io_context> io_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace

// Everything here but the constructor, start() and stop() runs on the io thread.
struct HttpServer::Impl {
  Impl(DashboardBackend& b, HttpOptions o)
      : options(std::move(o)), io(std::make_shared<asio::io_context>(1)),
        backend(b, io, std::chrono::milliseconds(std::max(1, options.backend_timeout_ms))) {}

  class Connection;

  const HttpOptions options;
  std::shared_ptr<asio::io_context> io;  // first: destroyed last
  IoBackend backend;
  HttpMode mode;
  Access access;
  std::unique_ptr<ServerCertificate> certificate;  // with mode.tls
  const std::chrono::milliseconds idle_timeout{std::max(1, options.idle_timeout_ms)};
  const std::chrono::milliseconds request_timeout{std::max(1, options.request_timeout_ms)};
  const std::chrono::milliseconds write_timeout{std::max(1, options.write_timeout_ms)};
  const size_t max_connections = static_cast<size_t>(std::max(1, options.max_connections));
  const int max_refusing = std::max(4, options.max_connections / 4);
  std::string bound;
  std::unique_ptr<tcp::acceptor> acceptor;
  asio::steady_timer accept_pause{*io};
  std::thread thread;
  // Open connections, oldest first (io thread only). Past max_connections, the oldest that is only waiting for
  // a request is closed to make room.
  std::list<std::weak_ptr<Connection>> open;
  int refusing = 0;  // connections being answered 503
  bool stopping = false;

  void acceptNext();
  void admit(tcp::socket socket);
  void refuse(tcp::socket socket);
  void stopFromLoop();
};

// One client connection: (TLS detection and handshake,) then requests until it closes, fails, times out, is
// evicted, or has served kRequestsPerConnection. Lives as long as an operation or an answer holds it; its
// destructor touches nothing but itself (it may run when the io_context is destroyed).
class HttpServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Impl& server, tcp::socket socket) : server_(server), tcp_(std::move(socket)) {}

  void start(std::list<std::weak_ptr<Connection>>::iterator where) {
    where_ = where;
    if (server_.mode.tls) return detectTls();
    readRequest();
  }

  // Whether it is only waiting for a request (idle, or its header or TLS handshake still coming): such a
  // connection may be evicted to make room.
  bool waiting() const { return waiting_ && !closed_; }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ignored;
    lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    lowest().close();
    server_.open.erase(where_);
  }

 private:
  beast::tcp_stream& lowest() { return tls_ ? beast::get_lowest_layer(*tls_) : tcp_; }

  template <class F>
  void withStream(F&& f) {
    if (tls_) {
      f(*tls_);
    } else {
      f(tcp_);
    }
  }

  void detectTls() {
    tcp_.expires_after(server_.request_timeout);
    beast::async_detect_ssl(tcp_, buffer_, [self = shared_from_this()](beast::error_code ec, bool is_tls) {
      if (ec || self->closed_) return self->close();
      if (!is_tls) return self->answerPlaintext();
      auto context = self->server_.certificate->context();
      if (!context) {
        spdlog::error("dashboard: cannot serve HTTPS: {}", context.status().message());
        return self->close();
      }
      self->context_ = *context;
      self->tls_.emplace(std::move(self->tcp_), *self->context_);
      self->tls_->async_handshake(asio::ssl::stream_base::server, self->buffer_.data(),
                                  [self](beast::error_code ec, size_t used) {
                                    if (ec || self->closed_) return self->close();
                                    self->buffer_.consume(used);
                                    self->readRequest();
                                  });
    });
  }

  // Waits up to idle_timeout for the request's first byte (unless it is already here), then gives its whole
  // header request_timeout from there.
  void readRequest() {
    waiting_ = true;
    if (closed_) return;
    if (served_ >= kRequestsPerConnection || server_.stopping) return goodbye();
    if (buffer_.size() > 0) return readHeader();
    lowest().expires_after(server_.idle_timeout);
    withStream([&](auto& stream) {
      stream.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
        if (ec || self->closed_) return self->close();
        self->buffer_.commit(n);
        self->readHeader();
      });
    });
  }

  void readHeader() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    lowest().expires_after(server_.request_timeout);
    withStream([&](auto& stream) {
      beast::http::async_read_header(stream, buffer_, *parser_,
                                     [self = shared_from_this()](beast::error_code ec, size_t) {
                                       // Closed, timed out, or malformed: drop the connection.
                                       if (ec || self->closed_) return self->close();
                                       self->route();
                                     });
    });
  }

  void route() {
    waiting_ = false;
    ++served_;
    lowest().expires_never();  // the answer is bounded by the backend's deadline; the write gets its own
    const auto& req = parser_->get();
    // No route takes a body: one that was sent (a POST's) is not read, and the connection ends after the answer.
    keep_alive_ = req.keep_alive() && parser_->is_done();
    version_ = req.version();
    head_ = req.method() == beast::http::verb::head;
    Request request{std::string(req.method_string()), std::string(req.target()),
                    std::string(req[beast::http::field::authorization]), std::string(req[beast::http::field::cookie])};
    // The answer comes on the io thread (IoBackend), inline or later.
    handleRequest(server_.backend, request, server_.access,
                  [self = shared_from_this()](Response r) { self->write(std::move(r)); });
  }

  void write(Response r) {
    if (closed_) return;
    auto res = std::make_shared<beast::http::response<beast::http::string_body>>(
        static_cast<beast::http::status>(r.status), version_);
    res->set(beast::http::field::server, "ddl-coordinator");
    res->set(beast::http::field::content_type, r.content_type);
    res->set(beast::http::field::cache_control, "no-store");
    for (const auto& [name, value] : r.headers) res->set(name, value);
    res->keep_alive(keep_alive_ && !server_.stopping);
    if (!head_) res->body() = std::move(r.body);
    res->prepare_payload();
    lowest().expires_after(server_.write_timeout);
    withStream([&](auto& stream) {
      beast::http::async_write(stream, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
        if (ec || self->closed_) return self->close();
        if (!res->keep_alive()) return self->goodbye();
        self->readRequest();
      });
    });
  }

  // A clean end: TLS says goodbye (briefly), then the socket closes.
  void goodbye() {
    if (!tls_) return close();
    lowest().expires_after(kShortTimeout);
    tls_->async_shutdown([self = shared_from_this()](beast::error_code) { self->close(); });
  }

  // Plain HTTP sent to the HTTPS port: one 400 that says where to go instead, then close.
  void answerPlaintext() {
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    tcp_.expires_after(server_.request_timeout);
    beast::http::async_read_header(tcp_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec || self->closed_) return self->close();
      // The address the client used (Host), where it looks like one; else the bound one.
      std::string host(self->parser_->get()[beast::http::field::host]);
      if (host.empty() || host.size() > 255 ||
          host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]") !=
              std::string::npos) {
        host = self->server_.bound;
      }
      self->waiting_ = false;
      self->keep_alive_ = false;
      self->version_ = self->parser_->get().version();
      self->write({400, "text/plain; charset=utf-8",
                   "this port speaks HTTPS only: https://" + host +
                       "/ (the coordinator's certificate, from the cluster CA)\n"});
    });
  }

  Impl& server_;  // outlives every handler that runs; not touched by the destructor
  beast::tcp_stream tcp_;  // moved into tls_ once a TLS client is detected
  std::shared_ptr<asio::ssl::context> context_;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls_;
  beast::flat_buffer buffer_;
  std::optional<beast::http::request_parser<beast::http::empty_body>> parser_;
  std::list<std::weak_ptr<Connection>>::iterator where_;
  bool waiting_ = true, closed_ = false, keep_alive_ = false, head_ = false;
  unsigned version_ = 11;
  int served_ = 0;
};

void HttpServer::Impl::acceptNext() {
  acceptor->async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (stopping) return;
    if (ec) {
      // Out of descriptors, most likely: pause briefly rather than spin.
      spdlog::warn("dashboard: accept failed: {}", ec.message());
      accept_pause.expires_after(std::chrono::milliseconds(100));
      accept_pause.async_wait([this](beast::error_code) {
        if (!stopping) acceptNext();
      });
      return;
    }
    admit(std::move(socket));
    acceptNext();
  });
}

void HttpServer::Impl::admit(tcp::socket socket) {
  if (open.size() >= max_connections) {
    // Make room by closing the oldest connection that is only waiting for a request: a slow or idle client
    // loses its place to a new one, never to nothing, and answers in progress are never cut.
    for (auto& weak : open) {
      auto c = weak.lock();
      if (c && c->waiting()) {
        c->close();  // erases it from `open`
        break;
      }
    }
  }
  if (open.size() >= max_connections) return refuse(std::move(socket));
  auto c = std::make_shared<Connection>(*this, std::move(socket));
  c->start(open.insert(open.end(), c));
}

// Every connection is busy answering: a plain HTTP client gets a 503 at once (the request is not read); a TLS
// one, or one past the few being refused, is closed.
void HttpServer::Impl::refuse(tcp::socket socket) {
  beast::error_code ignored;
  if (mode.tls || refusing >= max_refusing) {
    socket.close(ignored);
    return;
  }
  ++refusing;
  struct Refusal {
    explicit Refusal(tcp::socket s) : stream(std::move(s)) {}
    beast::tcp_stream stream;
    std::string text;
    char drain[512];
  };
  auto r = std::make_shared<Refusal>(std::move(socket));
  const std::string body =
      nlohmann::json{{"error", "the dashboard is serving " + std::to_string(max_connections) +
                                   " connections; try again"}}
          .dump() +
      "\n";
  r->text = "HTTP/1.1 503 Service Unavailable\r\nServer: ddl-coordinator\r\nContent-Type: application/json\r\n"
            "Retry-After: 1\r\nConnection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  r->stream.expires_after(kShortTimeout);
  asio::async_write(r->stream, asio::buffer(r->text), [this, r](beast::error_code ec, size_t) {
    // Then read what the client sent until it closes (or briefly), so the close does not reset the answer away.
    beast::error_code ignored;
    if (!ec) r->stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    auto finish = [this, r] {
      r->stream.close();
      --refusing;
    };
    if (ec) return finish();
    struct Drain {
      std::shared_ptr<Refusal> r;
      std::function<void()> finish;
      int left = 8;
      void operator()(beast::error_code ec = {}, size_t = 0) {
        if (ec || left-- == 0) return finish();
        r->stream.async_read_some(asio::buffer(r->drain), std::move(*this));
      }
    };
    Drain{r, finish}();
  });
}

void HttpServer::Impl::stopFromLoop() {
  stopping = true;
  beast::error_code ignored;
  acceptor->close(ignored);
  accept_pause.cancel();
  // Copies: close() erases from `open`.
  std::vector<std::shared_ptr<Connection>> all;
  for (auto& weak : open) {
    if (auto c = weak.lock()) all.push_back(std::move(c));
  }
  for (auto& c : all) c->close();
  // What is still pending (answers the coordinator owes, timers) is dropped with the io_context.
  io->stop();
}

HttpServer::HttpServer(Coordinator& coordinator, HttpOptions options)
    : own_backend_(std::make_unique<CoordinatorBackend>(coordinator)),
      impl_(std::make_shared<Impl>(*own_backend_, std::move(options))) {}

HttpServer::HttpServer(DashboardBackend& backend, HttpOptions options)
    : impl_(std::make_shared<Impl>(backend, std::move(options))) {}

HttpServer::~HttpServer() { stop(); }

const char* HttpServer::scheme() const { return impl_->mode.tls ? "https" : "http"; }

Status HttpServer::start(const std::string& listen, std::string* bound) {
  StatusOr<HostPort> parsed = parseHostPort(listen);
  if (!parsed) {
    return Status::invalidArgument("http address '" + listen + "' is not HOST:PORT: " + parsed.status().message() +
                                   " (e.g. 127.0.0.1:8080)");
  }
  const std::string& host = parsed->host;
  const int port = parsed->port;
  beast::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) return Status::invalidArgument("http address '" + listen + "': '" + host + "' is not an IP address");

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

  auto acceptor = std::make_unique<tcp::acceptor>(*impl.io);
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
  impl.acceptNext();
  impl.thread = std::thread([io = impl.io] {
    // Handlers catch what they can throw; anything else is a bug worth a loud log, and the loop goes on.
    for (;;) {
      try {
        io->run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("dashboard: {}", e.what());
      }
    }
  });
  return Status::ok();
}

void HttpServer::stop() {
  if (!impl_ || !impl_->acceptor || !impl_->thread.joinable()) return;
  asio::post(*impl_->io, [impl = impl_.get()] { impl->stopFromLoop(); });
  impl_->thread.join();
}

}  // namespace ddl::coordinator::http
