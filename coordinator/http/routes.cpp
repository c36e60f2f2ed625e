// The dashboard's routing (http_server.h): each path onto the DashboardBackend's calls and pages.h's
// renderings, the token check, and the backends (the Coordinator's, a standby's).
#include <spdlog/spdlog.h>

#include <cctype>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "auth/access.h"
#include "common/host_port.h"
#include "common/pki.h"
#include "common/utc_day.h"
#include "ddl/messages.h"
#include "http/http_server.h"
#include "http/pages.h"
#include "http/series_json.h"
#include "service/convert.h"

namespace ddl::coordinator::http {

namespace {

int httpStatus(const Status& st) {
  switch (st.code()) {
    case state::StatusCode::kNotFound:
      return 404;
    case state::StatusCode::kInvalidArgument:
      return 400;
    case state::StatusCode::kFailedPrecondition:
      return 409;
    case state::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

// JSON text of `value`; a byte that is not UTF-8 (a path can hold any) becomes U+FFFD instead of an
// exception.
std::string dumpJson(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

// A protobuf message as a JSON value, in the same mapping as the rest of /api/v1 (ddl::toJson). A message
// protobuf cannot print (a string field that is not UTF-8) throws, which the router answers with a 500.
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

// A query's count: decimal digits only, from lo to hi (at most 9 digits); nullopt otherwise.
std::optional<int> countIn(const std::string& text, int lo, int hi) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const int n = std::stoi(text);
  return n >= lo && n <= hi ? std::optional<int>(n) : std::nullopt;
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
    const std::optional<int> n = countIn(size, 1, 5000);
    if (!n) return "page_size='" + size + "' is not a number from 1 to 5000";
    req->set_page_size(*n);
  }
  req->set_page_token(percentDecode(queryParam(query, "page_token")));
  if (const std::string order = queryParam(query, "order"); !order.empty()) {
    if (order != "newest" && order != "oldest") return "order='" + order + "' is neither newest nor oldest";
    req->set_newest_first(order == "newest");
  }
  return "";
}

// The token of a request: `Authorization: Bearer TOKEN` (the scheme in any case), else the /login cookie.
// `from_header` says which, since a header with a bad token is refused rather than passed over for the
// cookie.
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
    "this dashboard needs the token of a ddl user (any role: viewer, user or admin): send 'Authorization: "
    "Bearer "
    "TOKEN', or open /login?token=TOKEN in a browser. An admin makes one with 'ddlctl admin add-user NAME "
    "--role "
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
  r.body =
      "<!doctype html><html><head><meta charset='utf-8'><title>ddl: token needed</title></head><body>"
      "<h1>ddl: token needed</h1><p>" +
      htmlEscape(message) +
      ".</p>"
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
    State(Respond r, std::string m, std::string p)
        : respond(std::move(r)), method(std::move(m)), path(std::move(p)) {}
    std::mutex mu;
    Respond respond;
    const std::string method, path;
  };
  std::shared_ptr<State> state_;
};

// The last `bytes` of a rank's log, read through its agent in two calls (its size, then the tail); `done`
// gets the text, or why it is not available.
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

// /jobs/ID once the job and its ring are in: the log tails of rank 0, the failing rank and the slowest rank,
// asked for at once; the page renders when the last one answers.
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
    const StoreHealth health = b.health();
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
    r.headers.emplace_back("Set-Cookie", std::string(kTokenCookie) + "=" + token +
                                             "; Path=/; HttpOnly; Secure; SameSite=Strict");
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
      return reply(
          unauthorized(path, std::string(from_header ? "the bearer token" : "the token of the cookie") +
                                 " is not valid (mistyped, rotated or removed?)"));
    }
    who = *found;
  }

  if (const StoreHealth health = b.health(); health.standby && path != "/metrics") {
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
        const StoreHealth health = b.health();
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
  if (path == "/" || path == "/index.html")
    return reply({200, "text/html; charset=utf-8", renderIndexPage()});
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
  if (path == "/api/v1/usage") {
    // GPU- and CPU-seconds per account and UTC day (ddlctl usage --by-account --daily) over the last `days`.
    const std::string days = queryParam(query, "days");
    const std::optional<int> n = days.empty() ? 30 : countIn(days, 1, 400);
    if (!n) return reply(error(400, "days='" + days + "' is not a number from 1 to 400"));
    v1::GetUsageRequest req;
    const int64_t today = utcDayOf(state::systemNowMs());  // today and the days before
    req.set_since_ms((today - (*n - 1)) * 86400000LL);
    req.set_until_ms((today + 1) * 86400000LL);
    req.set_account(percentDecode(queryParam(query, "account")));
    req.set_by_account(true);
    req.set_daily(true);
    return b.usage(req, [reply](StatusOr<v1::GetUsageResponse> usage) {
      reply.guard([&] {
        if (!usage) return reply(error(httpStatus(usage.status()), usage.status().message()));
        reply(json(200, protoJson(*usage)));
      });
    });
  }
  if (path.rfind("/api/v1/jobs/", 0) == 0 || path.rfind("/jobs/", 0) == 0)
    return routeJob(b, path, who, reply);
  reply(error(404, "no such page: " + path));
}

}  // namespace

void CoordinatorBackend::listJobs(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done) {
  c_.listJobs(request, std::move(done));
}
void CoordinatorBackend::listNodes(Done<std::vector<v1::Node>> done) { c_.listNodes(std::move(done)); }
void CoordinatorBackend::getJob(const std::string& id, Done<v1::Job> done) { c_.getJob(id, std::move(done)); }
void CoordinatorBackend::ring(const std::string& id, Done<v1::RingLayout> done) {
  c_.ring(id, std::move(done));
}
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
void DashboardBackend::usage(const v1::GetUsageRequest&, Done<v1::GetUsageResponse> done) {
  done(Status::unavailable("this dashboard keeps no usage"));
}
void CoordinatorBackend::usage(const v1::GetUsageRequest& request, Done<v1::GetUsageResponse> done) {
  c_.usage(request, std::move(done));
}
void CoordinatorBackend::metrics(Done<MetricsSnapshot> done) {
  c_.metrics([done = std::move(done)](MetricsSnapshot m) { done(std::move(m)); });
}
StoreHealth CoordinatorBackend::health() { return c_.health(); }

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
  m.state = StoreInfo{};
  m.state->store = store_;
  m.state->standby = true;
  done(std::move(m));
}
StoreHealth StandbyBackend::health() { return {false, status_(), true}; }
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
  handleRequest(*backend, request, access,
                [backend, answer](Response r) { answer->set_value(std::move(r)); });
  // Every coordinator call is bounded by its own timeouts; this one only keeps a broken one from hanging a
  // test.
  if (future.wait_for(std::chrono::minutes(1)) != std::future_status::ready) {
    return error(504, "the coordinator did not answer within a minute");
  }
  return future.get();
}

Response handleRequest(Coordinator& c, const std::string& method, const std::string& target) {
  return handleRequest(c, Request{method, target, "", ""}, Access{});
}

}  // namespace ddl::coordinator::http
