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

// A protobuf message as a JSON value, in the same mapping as the rest of /api/v1 (ddl::toJson). A message protobuf
// cannot print (a string field that is not UTF-8) throws, which the router answers with a 500.
nlohmann::json protoJson(const google::protobuf::Message& message) {
  nlohmann::json value = nlohmann::json::parse(toJson(message), nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) throw std::runtime_error("cannot print a " + message.GetTypeName() + " as JSON");
  return value;
}

Response json(int status, const nlohmann::json& body) { return {status, "application/json", dumpJson(body)}; }

Response error(int status, const std::string& message) { return json(status, {{"error", message}}); }

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


// %XX escapes decoded (what a browser's form sends; '+' is a space there); a malformed one is kept as it is.
std::string percentDecode(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += text[i] == '+' ? ' ' : text[i];
    }
  }
  return out;
}

// A time bound of the jobs API: unix ms, or an age before `now_ms` ("90s", "30m", "12h", "7d"). -1: neither.
int64_t timeBound(const std::string& text, int64_t now_ms) {
  if (text.empty() || text.size() > 19) return -1;
  size_t digits = text.find_first_not_of("0123456789");
  if (digits == 0) return -1;
  const int64_t n = std::stoll(text.substr(0, digits));
  if (digits == std::string::npos) return n;
  if (digits + 1 != text.size()) return -1;
  static const std::map<char, int64_t> kUnitMs = {{'s', 1000}, {'m', 60000}, {'h', 3600000}, {'d', 86400000}};
  auto unit = kUnitMs.find(text.back());
  if (unit == kUnitMs.end() || n > 100LL * 365 * 86400000 / unit->second) return -1;
  return now_ms - n * unit->second;
}

// The ListJobsRequest of /api/v1/jobs?QUERY; "" or why the query is refused (a 400). States are matched in
// any case and may be comma-separated ("failed,cancelled").
std::string listJobsRequest(const std::string& query, int64_t now_ms, v1::ListJobsRequest* req) {
  std::string states = percentDecode(queryParam(query, "state"));
  size_t pos = 0;
  while (!states.empty() && pos <= states.size()) {
    const size_t comma = std::min(states.find(',', pos), states.size());
    const std::string given = states.substr(pos, comma - pos);
    std::string name = given;
    pos = comma + 1;
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    v1::JobState s;
    if (!v1::JobState_Parse(name, &s) || s == v1::JOB_STATE_UNSPECIFIED) {
      std::string known;
      for (int i = v1::JobState_MIN + 1; i <= v1::JobState_MAX; ++i) {
        if (v1::JobState_IsValid(i)) known += (known.empty() ? "" : ", ") + v1::JobState_Name(i);
      }
      return "unknown state '" + given + "' (" + known + ", in any case; several with commas)";
    }
    if (req->states_size() < 16) req->add_states(s);
  }
  req->set_user(percentDecode(queryParam(query, "user")));
  req->set_name(percentDecode(queryParam(query, "name")));
  for (const char* key : {"since", "until"}) {
    const std::string text = percentDecode(queryParam(query, key));
    if (text.empty()) continue;
    const int64_t ms = timeBound(text, now_ms);
    if (ms < 0) {
      return std::string(key) + "='" + text +
             "' is neither unix milliseconds nor an age such as 90s, 30m, 12h, 7d";
    }
    std::string(key) == "since" ? req->set_since_ms(ms) : req->set_until_ms(ms);
  }
  if (const std::string size = queryParam(query, "page_size"); !size.empty()) {
    if (size.size() > 4 || size.find_first_not_of("0123456789") != std::string::npos || std::stoi(size) < 1 ||
        std::stoi(size) > 5000) {
      return "page_size='" + size + "' is not a number from 1 to 5000";
    }
    req->set_page_size(std::stoi(size));
  }
  req->set_page_token(percentDecode(queryParam(query, "page_token")));
  if (const std::string order = queryParam(query, "order"); !order.empty()) {
    if (order != "newest" && order != "oldest") return "order='" + order + "' is neither newest nor oldest";
    req->set_newest_first(order == "newest");
  }
  return "";
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

// One request's answer: `respond` once (later calls are ignored), and an exception from any step of the route
// (a continuation included) becomes a 500 instead of escaping onto a coordinator or io thread.
class Reply {
 public:
  Reply(Respond respond, const Request& request)
      : state_(std::make_shared<State>(std::move(respond), request.method,
                                       request.target.substr(0, request.target.find('?')))) {}

  void operator()(Response response) const {
    Respond respond;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      if (!state_->respond) return;
      respond = std::move(state_->respond);
      state_->respond = nullptr;
    }
    respond(std::move(response));
  }

  // Runs `step`, answering 500 when it throws.
  template <class F>
  void guard(F&& step) const {
    try {
      step();
    } catch (const std::exception& e) {
      // The path only: a query may hold a token (/login).
      spdlog::error("http {} {}: {}", state_->method, state_->path, e.what());
      (*this)(error(500, "internal error"));
    }
  }

 private:
  struct State {
    State(Respond r, std::string m, std::string p) : respond(std::move(r)), method(std::move(m)), path(std::move(p)) {}
    std::mutex mu;
    Respond respond;
    const std::string method, path;
  };
  std::shared_ptr<State> state_;
};

// The last `bytes` of a rank's log, read through its agent in two calls (its size, then the tail); `done` gets the
// text, or why it is not available.
void logTail(DashboardBackend& b, const std::string& id, int rank, int64_t bytes,
             std::function<void(std::string)> done) {
  v1::GetLogsRequest probe;
  probe.set_id(id);
  probe.set_rank(rank);
  probe.set_max_bytes(1);
  b.readLog(probe, [&b, probe, bytes, done = std::move(done)](StatusOr<v1::GetLogsResponse> first) mutable {
    if (!first) return done("(log not available: " + first.status().message() + ")");
    v1::GetLogsRequest req = probe;
    req.set_offset(std::max<int64_t>(0, first->size() - bytes));
    req.set_max_bytes(static_cast<int32_t>(bytes));
    b.readLog(req, [done = std::move(done)](StatusOr<v1::GetLogsResponse> tail) {
      done(tail ? tail->data() : "(log not available: " + tail.status().message() + ")");
    });
  });
}

// /jobs/ID once the job and its ring are in: the log tails of rank 0, the failing rank and the slowest rank, asked
// for at once; the page renders when the last one answers.
void renderJobPageWithLogs(DashboardBackend& b, v1::Job job, std::optional<v1::RingLayout> ring, bool hidden,
                           const Reply& reply) {
  std::set<int> ranks;
  if (ring && !hidden) {
    ranks.insert(0);
    if (job.has_failure()) ranks.insert(job.failure().rank());
    if (const int slowest = slowestRank(job); slowest >= 0) ranks.insert(slowest);
  }
  struct Gather {
    std::mutex mu;
    v1::Job job;
    std::optional<v1::RingLayout> ring;
    bool hidden = false;
    std::map<int, std::string> logs;
    size_t waiting = 0;
  };
  auto gather = std::make_shared<Gather>();
  gather->job = std::move(job);
  gather->ring = std::move(ring);
  gather->hidden = hidden;
  gather->waiting = ranks.size();
  auto render = [gather, reply] {
    reply.guard([&] {
      const v1::RingLayout* layout = gather->ring ? &*gather->ring : nullptr;
      reply({200, "text/html; charset=utf-8",
             renderJobPage(gather->job, layout, gather->logs, state::systemNowMs(), gather->hidden)});
    });
  };
  if (ranks.empty()) return render();
  const std::string id = gather->job.id();
  for (int r : ranks) {
    logTail(b, id, r, 4096, [gather, r, render](std::string text) {
      {
        std::lock_guard<std::mutex> lock(gather->mu);
        gather->logs[r] = std::move(text);
        if (--gather->waiting > 0) return;
      }
      render();
    });
  }
}

// /api/v1/jobs/ID/series: the job must exist (in memory or in the store); its series may be empty.
void routeJobSeries(DashboardBackend& b, const std::string& id, const Reply& reply) {
  b.getJob(id, [&b, id, reply](StatusOr<v1::Job> job) {
    reply.guard([&] {
      if (!job) return reply(error(httpStatus(job.status()), job.status().message()));
      b.jobSeries(id, [reply](StatusOr<JobSeries> series) {
        reply.guard([&] {
          if (!series) return reply(error(httpStatus(series.status()), series.status().message()));
          reply(json(200, jobSeriesJson(*series)));
        });
      });
    });
  });
}

void routeJob(DashboardBackend& b, const std::string& path, const auth::Identity& who, const Reply& reply) {
  const bool api = path.rfind("/api/v1/jobs/", 0) == 0;
  std::string id = path.substr(api ? 13 : 6);
  static const std::string kSeries = "/series";
  if (api && id.size() > kSeries.size() &&
      id.compare(id.size() - kSeries.size(), kSeries.size(), kSeries) == 0) {
    id.resize(id.size() - kSeries.size());
    auto canonical = state::canonicalJobId(id);  // "5" is j-000005, as for ddlctl
    if (!canonical) return reply(error(404, "no such page: " + path));
    return routeJobSeries(b, *canonical, reply);
  }
  auto canonical = state::canonicalJobId(id);
  if (!canonical) return reply(error(404, "no such page: " + path));
  id = *canonical;
  b.getJob(id, [&b, id, api, who, reply](StatusOr<v1::Job> job) {
    reply.guard([&] {
      if (!job) return reply(error(httpStatus(job.status()), job.status().message()));
      // Others' jobs lose command, env and workdir, and their logs are not read (GetLogs' rule).
      const bool hidden = !access::mayTouchJob(who, *job, "read the logs of").isOk();
      access::redactFor(who, &*job);
      b.ring(id, [&b, api, hidden, job = std::move(*job), reply](StatusOr<v1::RingLayout> ring) mutable {
        reply.guard([&] {
          if (api) {
            return reply(json(200, {{"job", protoJson(job)}, {"ring", ring ? protoJson(*ring) : nullptr}}));
          }
          std::optional<v1::RingLayout> layout;
          if (ring) layout = std::move(*ring);
          renderJobPageWithLogs(b, std::move(job), std::move(layout), hidden, reply);
        });
      });
    });
  });
}

void route(DashboardBackend& b, const Request& request, const Access& gate, const Reply& reply) {
  if (request.method != "GET" && request.method != "HEAD") {
    Response r = error(405, "only GET and HEAD: the dashboard is read-only");
    r.headers.emplace_back("Allow", "GET, HEAD");
    return reply(std::move(r));
  }
  const std::string& target = request.target;
  const size_t q = target.find('?');
  const std::string path = target.substr(0, q);
  const std::string query = q == std::string::npos ? "" : target.substr(q + 1);
  if (path == "/healthz") {
    const Coordinator::Health health = b.health();
    if (!health.ok) {
      return reply(
          {503, "text/plain; charset=utf-8", (health.standby ? "" : "unhealthy: ") + health.message + "\n"});
    }
    return reply({200, "text/plain; charset=utf-8", "ok\n"});
  }

  // Who asks: everyone sees everything on an open dashboard; elsewhere a registered user's token decides.
  auth::Identity who{"", auth::Role::kInsecure, "open dashboard"};
  if (path == "/login") {
    const std::string token = percentDecode(queryParam(query, "token"));
    Response r{303, "text/plain; charset=utf-8", "signed in; go to /\n", {{"Location", "/"}}};
    if (!gate.require_token) return reply(std::move(r));  // nothing to sign in to
    if (token.empty()) return reply(unauthorized(path, ""));
    if (!plausibleToken(token) || !gate.users || !gate.users->authenticate(token)) {
      return reply(unauthorized(path, "that token is not valid (mistyped, rotated or removed?)"));
    }
    r.headers.emplace_back("Set-Cookie",
                           std::string(kTokenCookie) + "=" + token + "; Path=/; HttpOnly; Secure; SameSite=Strict");
    return reply(std::move(r));
  }
  if (gate.require_token) {
    bool from_header = false;
    const std::string token = requestToken(request, &from_header);
    if (token.empty()) {
      return reply(unauthorized(path, from_header ? "the Authorization field is not 'Bearer TOKEN'" : ""));
    }
    std::optional<auth::Identity> found;
    if (plausibleToken(token) && gate.users) found = gate.users->authenticate(token);
    if (!found) {
      return reply(unauthorized(path, std::string(from_header ? "the bearer token" : "the token of the cookie") +
                                          " is not valid (mistyped, rotated or removed?)"));
    }
    who = *found;
  }

  if (const Coordinator::Health health = b.health(); health.standby && path != "/metrics") {
    return reply({503, "text/plain; charset=utf-8",
                  health.message +
                      ": the dashboard and the API are the leader's (this one serves /metrics and "
                      "/healthz, and takes over when the leader stops)\n"});
  }
  if (path == "/metrics") {
    return b.metrics([&b, reply](StatusOr<MetricsSnapshot> m) {
      reply.guard([&] {
        if (!m) return reply(error(httpStatus(m.status()), m.status().message()));
        reply({200, "text/plain; version=0.0.4; charset=utf-8", renderMetrics(*m, b.health().ok)});
      });
    });
  }
  if (path == "/api/v1/state") {
    return b.metrics([&b, reply](StatusOr<MetricsSnapshot> m) {
      reply.guard([&] {
        if (!m) return reply(error(httpStatus(m.status()), m.status().message()));
        const Coordinator::Health health = b.health();
        nlohmann::json state = {{"store_healthy", health.ok}, {"store_error", health.message}};
        if (m->state) {
          state["store"] = m->state->store;
          if (m->state->reign > 0) {
            state["leader_reign"] = m->state->reign;
            state["lease_age_s"] = m->state->lease_age_s;
            state["lease_s"] = m->state->lease_ttl_s;
          }
        }
        reply(json(200, state));
      });
    });
  }
  if (path == "/" || path == "/index.html") return reply({200, "text/html; charset=utf-8", renderIndexPage()});
  if (path == "/api/v1/nodes") {
    return b.listNodes([reply](StatusOr<std::vector<v1::Node>> nodes) {
      reply.guard([&] {
        if (!nodes) return reply(error(httpStatus(nodes.status()), nodes.status().message()));
        nlohmann::json list = nlohmann::json::array();
        for (const auto& n : *nodes) list.push_back(protoJson(n));
        reply(json(200, {{"nodes", std::move(list)}}));
      });
    });
  }
  if (path == "/api/v1/cluster/series") {
    return b.clusterSeries([reply](StatusOr<ClusterSeries> series) {
      reply.guard([&] {
        if (!series) return reply(error(httpStatus(series.status()), series.status().message()));
        reply(json(200, clusterSeriesJson(*series)));
      });
    });
  }
  if (path == "/api/v1/jobs") {
    v1::ListJobsRequest req;
    if (std::string why = listJobsRequest(query, state::systemNowMs(), &req); !why.empty()) {
      return reply(error(400, why));
    }
    return b.listJobs(req, [who, reply](StatusOr<v1::ListJobsResponse> jobs) {
      reply.guard([&] {
        if (!jobs) return reply(error(httpStatus(jobs.status()), jobs.status().message()));
        for (auto& j : *jobs->mutable_jobs()) access::redactFor(who, &j);
        reply(json(200, protoJson(*jobs)));
      });
    });
  }
  if (path.rfind("/api/v1/jobs/", 0) == 0 || path.rfind("/jobs/", 0) == 0) return routeJob(b, path, who, reply);
  reply(error(404, "no such page: " + path));
}

}  // namespace

void CoordinatorBackend::listJobs(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done) {
  c_.listJobs(request, std::move(done));
}
void CoordinatorBackend::listNodes(Done<std::vector<v1::Node>> done) { c_.listNodes(std::move(done)); }
void CoordinatorBackend::getJob(const std::string& id, Done<v1::Job> done) { c_.getJob(id, std::move(done)); }
void CoordinatorBackend::ring(const std::string& id, Done<v1::RingLayout> done) { c_.ring(id, std::move(done)); }
void CoordinatorBackend::readLog(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done) {
  c_.readLog(request, std::move(done));
}
void DashboardBackend::jobSeries(const std::string&, Done<JobSeries> done) {
  done(Status::unavailable("this dashboard keeps no series"));
}
void DashboardBackend::clusterSeries(Done<ClusterSeries> done) {
  done(Status::unavailable("this dashboard keeps no series"));
}
void CoordinatorBackend::jobSeries(const std::string& id, Done<JobSeries> done) {
  c_.jobSeries(id, std::move(done));
}
void CoordinatorBackend::clusterSeries(Done<ClusterSeries> done) { c_.clusterSeries(std::move(done)); }
void CoordinatorBackend::metrics(Done<MetricsSnapshot> done) {
  c_.metrics([done = std::move(done)](MetricsSnapshot m) { done(std::move(m)); });
}
Coordinator::Health CoordinatorBackend::health() { return c_.health(); }

void StandbyBackend::listJobs(const v1::ListJobsRequest&, Done<v1::ListJobsResponse> done) {
  done(unavailable());
}
void StandbyBackend::listNodes(Done<std::vector<v1::Node>> done) { done(unavailable()); }
void StandbyBackend::getJob(const std::string&, Done<v1::Job> done) { done(unavailable()); }
void StandbyBackend::ring(const std::string&, Done<v1::RingLayout> done) { done(unavailable()); }
void StandbyBackend::readLog(const v1::GetLogsRequest&, Done<v1::GetLogsResponse> done) {
  done(unavailable());
}
void StandbyBackend::metrics(Done<MetricsSnapshot> done) {
  MetricsSnapshot m;
  m.state = StateStatus{};
  m.state->store = store_;
  m.state->standby = true;
  done(std::move(m));
}
Coordinator::Health StandbyBackend::health() { return {false, status_(), true}; }
Status StandbyBackend::unavailable() const { return Status::unavailable(status_()); }

void handleRequest(DashboardBackend& backend, const Request& request, const Access& access, Respond respond) {
  const Reply reply(std::move(respond), request);
  reply.guard([&] { route(backend, request, access, reply); });
}

Response handleRequest(Coordinator& c, const Request& request, const Access& access) {
  // The adapter lives as long as the answer can still come (the continuations hold `respond`).
  auto backend = std::make_shared<CoordinatorBackend>(c);
  auto answer = std::make_shared<std::promise<Response>>();
  std::future<Response> future = answer->get_future();
  handleRequest(*backend, request, access, [backend, answer](Response r) { answer->set_value(std::move(r)); });
  // Every coordinator call is bounded by its own timeouts; this one only keeps a broken one from hanging a test.
  if (future.wait_for(std::chrono::minutes(1)) != std::future_status::ready) {
    return error(504, "the coordinator did not answer within a minute");
  }
  return future.get();
}

Response handleRequest(Coordinator& c, const std::string& method, const std::string& target) {
  return handleRequest(c, Request{method, target, "", ""}, Access{});
}

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
  Coordinator::Health health() override { return inner_.health(); }

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
  const std::string body = dumpJson(
      {{"error", "the dashboard is serving " + std::to_string(max_connections) + " connections; try again"}});
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
