// The dashboard's routes and pages without sockets (handleRequest over a Coordinator with fake agent links),
// and the real HttpServer on 127.0.0.1 (port chosen at run time) for status codes and a malformed request.
// Its secured mode (HTTPS and tokens, what any address but loopback gets) is tested on 127.0.0.1 by asking for
// it, with a PKI made in a temporary directory; every client step has a deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "auth/pki_dir.h"
#include "auth/users.h"
#include "common/host_port.h"
#include "common/pki.h"
#include "daemon/config.h"
#include "http/http_server.h"
#include "http/pages.h"
#include "service/blocking_coordinator.h"
#include "state/memory_store.h"

namespace ddl::coordinator::http {
namespace {

class NullLink : public AgentLink {
 public:
  void send(const v1::Command& c) override {}
  void close() override {}
};

class HttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions o;
    o.log_timeout_ms = 50;  // the fake agents never answer log reads
    coordinator = std::make_unique<BlockingCoordinator>(store, o);
    ASSERT_TRUE(coordinator->recover());
    for (const char* name : {"n1", "n2"}) {
      v1::RegisterRequest req;
      req.set_node(name);
      req.set_address("10.0.0.1");
      for (int g = 0; g < 2; ++g) req.add_gpus()->set_index(g);
      (*req.mutable_labels())["switch"] = name == std::string("n1") ? "s1" : "s2";
      auto resp = coordinator->registerAgent(req);
      ASSERT_TRUE(resp);
      ASSERT_TRUE(coordinator->attachAgent(name, resp->session(), std::make_shared<NullLink>()));
    }
    v1::JobSpec spec;
    spec.set_name("bench<script>");
    spec.set_user("alice");
    spec.set_nodes(2);
    spec.set_gpus_per_node(2);
    spec.add_command("ddl-bench");
    spec.add_command("--secret-flag");
    spec.add_env("API_KEY=s3cret");
    spec.set_workdir("/home/alice/private-run");
    job = coordinator->submit(spec)->id();
    coordinator->tick();
  }
  state::MemoryStore store;
  std::unique_ptr<BlockingCoordinator> coordinator;
  std::string job;
};

TEST_F(HttpTest, MetricsReflectTheCluster) {
  Response r = handleRequest(*coordinator, "GET", "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.content_type.find("version=0.0.4"), std::string::npos);
  for (const char* line : {"ddl_nodes{state=\"UP\"} 2\n", "ddl_nodes{state=\"DOWN\"} 0\n", "ddl_gpus 4\n",
                           "ddl_gpus_allocated 4\n", "ddl_jobs{state=\"STARTING\"} 1\n", "ddl_jobs_submitted_total 1\n",
                           "ddl_scheduling_latency_seconds_count 1\n",
                           "ddl_scheduling_latency_seconds_bucket{le=\"+Inf\"} 1\n", "# TYPE ddl_jobs_failed_total counter\n",
                           "ddl_coordinator_store_healthy 1\n"}) {
    EXPECT_NE(r.body.find(line), std::string::npos) << line << " missing in\n" << r.body;
  }
  EXPECT_EQ(r.body.find("ddl_coordinator_leader_reign"), std::string::npos) << "no lead without a store_info";
}

// Issue 30: where the state lives and the lead, as the daemon's store_info says, in /metrics and
// /api/v1/state; nothing of it without one (the metrics above).
TEST(HttpStateTest, TheStoreAndTheLeadAreInMetricsAndTheApi) {
  state::MemoryStore store;
  CoordinatorOptions o;
  o.store_info = [] {
    StoreInfo s;
    s.store = "etcd a:2379,b:2379 (/ddl/)";
    s.reign = 944;
    s.lease_age_s = 0.5;
    s.lease_ttl_s = 3;
    return s;
  };
  BlockingCoordinator coordinator(store, o);
  ASSERT_TRUE(coordinator.recover());
  Response r = handleRequest(coordinator, "GET", "/metrics");
  for (const char* line :
       {"ddl_coordinator_store_info{store=\"etcd a:2379,b:2379 (/ddl/)\"} 1\n",
        "ddl_coordinator_leader_reign 944\n", "ddl_coordinator_etcd_lease_age_seconds 0.5\n",
        "ddl_coordinator_etcd_lease_seconds 3\n"}) {
    EXPECT_NE(r.body.find(line), std::string::npos) << line << " missing in\n" << r.body;
  }
  auto state = nlohmann::json::parse(handleRequest(coordinator, "GET", "/api/v1/state").body);
  EXPECT_EQ(state["store"], "etcd a:2379,b:2379 (/ddl/)");
  EXPECT_EQ(state["leader_reign"], 944);
  EXPECT_EQ(state["lease_s"], 3);
  EXPECT_EQ(state["store_healthy"], true);
}

TEST_F(HttpTest, ApiAnswersJson) {
  auto nodes = nlohmann::json::parse(handleRequest(*coordinator, "GET", "/api/v1/nodes").body);
  ASSERT_EQ(nodes["nodes"].size(), 2u);
  EXPECT_EQ(nodes["nodes"][0]["name"], "n1");
  auto jobs = nlohmann::json::parse(handleRequest(*coordinator, "GET", "/api/v1/jobs?state=STARTING").body);
  ASSERT_EQ(jobs["jobs"].size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(handleRequest(*coordinator, "GET", "/api/v1/jobs?state=RUNNING").body)["jobs"].size(),
            0u);
  auto one = nlohmann::json::parse(handleRequest(*coordinator, "GET", "/api/v1/jobs/" + job).body);
  EXPECT_EQ(one["job"]["id"], job);
  EXPECT_EQ(one["ring"]["topology"], "2x2");
  EXPECT_EQ(handleRequest(*coordinator, "GET", "/api/v1/jobs?state=NOPE").status, 400);
  // Usage per account and day (nothing has ended yet): the period asked for, 30 days by default.
  Response usage = handleRequest(*coordinator, "GET", "/api/v1/usage?days=7");
  ASSERT_EQ(usage.status, 200) << usage.body;
  auto period = nlohmann::json::parse(usage.body);
  EXPECT_EQ(period.value("rows", nlohmann::json::array()).size(), 0u);
  EXPECT_NE(period["first_day"], period["last_day"]);
  Response today = handleRequest(*coordinator, "GET", "/api/v1/usage?days=1");
  ASSERT_EQ(today.status, 200) << today.body;
  auto single = nlohmann::json::parse(today.body);
  EXPECT_EQ(single["first_day"], single["last_day"]);
  for (const char* bad : {"0", "401", "x", "-1", "1000000"}) {
    EXPECT_EQ(handleRequest(*coordinator, "GET", std::string("/api/v1/usage?days=") + bad).status, 400)
        << bad;
  }
}

TEST_F(HttpTest, JobPageDrawsTheRingAndEscapesUserText) {
  Response r = handleRequest(*coordinator, "GET", "/jobs/" + job);
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("<svg"), std::string::npos);
  EXPECT_NE(r.body.find("crosses switches"), std::string::npos);  // n1 and n2 are on different switches
  EXPECT_NE(r.body.find("inside a node"), std::string::npos);
  EXPECT_NE(r.body.find(">r3<"), std::string::npos);
  EXPECT_EQ(r.body.find("bench<script>"), std::string::npos);  // the job name is escaped
  EXPECT_NE(r.body.find("bench&lt;script&gt;"), std::string::npos);
}

TEST_F(HttpTest, BadUrlsAre404AndWritesAre405) {
  for (const char* path : {"/nope", "/jobs/", "/jobs/j-999999", "/jobs/../etc/passwd", "/api/v1/jobs/x", "/api/v2"}) {
    EXPECT_EQ(handleRequest(*coordinator, "GET", path).status, 404) << path;
  }
  for (const char* method : {"POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT", "TRACE"}) {
    for (const char* path : {"/", "/api/v1/jobs", "/api/v1/jobs/j-000001", "/metrics", "/healthz", "/login", "/x"}) {
      Response r = handleRequest(*coordinator, method, path);
      EXPECT_EQ(r.status, 405) << method << " " << path;
      ASSERT_EQ(r.headers.size(), 1u) << method << " " << path;
      EXPECT_EQ(r.headers[0], std::make_pair(std::string("Allow"), std::string("GET, HEAD")));
      EXPECT_TRUE(nlohmann::json::accept(r.body)) << r.body;
    }
  }
  EXPECT_EQ(handleRequest(*coordinator, "HEAD", "/healthz").status, 200);
  EXPECT_EQ(handleRequest(*coordinator, "GET", "/healthz").body, "ok\n");
}

// Error bodies are JSON built by a JSON library: a message holding quotes, '<', a backslash, a control character
// or a byte that is not UTF-8 parses back to exactly what was said (the old hand-made body HTML-escaped the
// quote and left the backslash raw, so it did not parse).
TEST_F(HttpTest, ErrorBodiesAreJsonThatRoundTrips) {
  const std::string state = "a\"b<c>\\d'e\tf";
  Response r = handleRequest(*coordinator, "GET", "/api/v1/jobs?state=" + state);
  ASSERT_EQ(r.status, 400);
  EXPECT_EQ(r.content_type, "application/json");
  nlohmann::json body;
  ASSERT_NO_THROW(body = nlohmann::json::parse(r.body)) << r.body;
  EXPECT_EQ(
      body["error"].get<std::string>(),
      "unknown state '" + state +
          "' (PENDING, SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED, TIMEOUT, in any case; "
          "several with commas)");
  r = handleRequest(*coordinator, "GET", "/api/v1/\"x\\\xff");
  ASSERT_EQ(r.status, 404);
  ASSERT_NO_THROW(body = nlohmann::json::parse(r.body)) << r.body;
  EXPECT_EQ(body["error"].get<std::string>().rfind("no such page: /api/v1/\"x\\", 0), 0u) << r.body;
  auto one = nlohmann::json::parse(handleRequest(*coordinator, "GET", "/api/v1/jobs/" + job).body);
  EXPECT_EQ(one["job"]["spec"]["name"], "bench<script>");
  EXPECT_TRUE(one["ring"].is_object());
}

// The dashboard's plots and per-job metrics: a coordinator with a fake wall clock, ranks reporting progress
// as agents forward it (each heartbeat carries every rank's cumulative counters).
class SeriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions o;
    o.log_timeout_ms = 50;
    // Liveness runs on the real monotonic clock (no node goes DOWN while the test moves the wall clock).
    coordinator = std::make_unique<BlockingCoordinator>(store, o, nullptr, [this] { return wall.load(); });
    ASSERT_TRUE(coordinator->recover());
    for (const char* name : {"n1", "n2"}) {
      v1::RegisterRequest req;
      req.set_node(name);
      req.set_address("10.0.0.1");
      for (int g = 0; g < 2; ++g) req.add_gpus()->set_index(g);
      auto resp = coordinator->registerAgent(req);
      ASSERT_TRUE(resp);
      sessions[name] = resp->session();
      ASSERT_TRUE(coordinator->attachAgent(name, resp->session(), std::make_shared<NullLink>()));
    }
    job = submit("bench");
    coordinator->tick();
    auto layout = coordinator->ring(job);
    ASSERT_TRUE(layout);
    for (const auto& slot : layout->ranks()) rank_node[slot.rank()] = slot.node();
  }
  std::string submit(const std::string& name) {
    v1::JobSpec spec;
    spec.set_name(name);
    spec.set_user("alice");
    spec.set_nodes(2);
    spec.set_gpus_per_node(2);
    spec.add_command("ddl-bench");
    auto submitted = coordinator->submit(spec);
    EXPECT_TRUE(submitted) << submitted.status().message();
    return submitted ? submitted->id() : "";
  }
  // Every node reports its ranks; rank r has moved bytes_per_s(r) * t bytes by now (t in seconds since 0).
  void report(double t, const std::function<double(int)>& bytes_per_s) {
    wall = static_cast<int64_t>(t * 1000) + 1000000;
    std::map<std::string, v1::Heartbeat> hb;
    for (const auto& [rank, node] : rank_node) {
      v1::RankStatus* r = hb[node].add_ranks();
      r->set_job_id(job);
      r->set_attempt(1);
      r->set_rank(rank);
      r->set_state(v1::RankStatus::RUNNING);
      r->mutable_progress()->set_bytes(static_cast<int64_t>(bytes_per_s(rank) * t));
      r->mutable_progress()->set_seconds(0.5 * t);
      r->mutable_progress()->set_collectives(static_cast<int64_t>(10 * t));
    }
    for (auto& [node, h] : hb) ASSERT_TRUE(coordinator->heartbeat(node, sessions[node], h));
  }
  std::atomic<int64_t> wall{1000000};
  state::MemoryStore store;
  std::unique_ptr<BlockingCoordinator> coordinator;
  std::map<std::string, std::string> sessions;
  std::map<int, std::string> rank_node;
  std::string job;
};

TEST_F(SeriesTest, JobSeriesHasEveryRankAndNamesTheSlowOne) {
  for (int i = 0; i <= 5; ++i) report(2.0 * i, [](int rank) { return rank == 3 ? 1e6 : 4e6; });
  Response r = handleRequest(*coordinator, "GET", "/api/v1/jobs/" + job + "/series");
  ASSERT_EQ(r.status, 200) << r.body;
  auto body = nlohmann::json::parse(r.body);
  EXPECT_EQ(body["job"], job);
  ASSERT_EQ(body["ranks"].size(), 4u);
  for (const auto& rank : body["ranks"]) {
    ASSERT_EQ(rank["t_ms"].size(), 5u) << rank;
    EXPECT_EQ(rank["bytes_per_s"][4].get<double>(), rank["rank"] == 3 ? 1e6 : 4e6) << rank;
    EXPECT_DOUBLE_EQ(rank["busy_fraction"][4].get<double>(), 0.5);
  }
  EXPECT_EQ(body["slow_rank"], 3);
  EXPECT_NE(body["slow_why"].get<std::string>().find("rank 3"), std::string::npos);
  EXPECT_EQ(handleRequest(*coordinator, "GET", "/api/v1/jobs/j-999999/series").status, 404);
  EXPECT_EQ(handleRequest(*coordinator, "GET", "/api/v1/jobs/x/series").status, 404);
  // Short ids, as ddlctl takes them.
  const std::string number = std::to_string(*state::jobIdNumber(job));
  EXPECT_EQ(handleRequest(*coordinator, "GET", "/api/v1/jobs/" + number + "/series").status, 200);
  EXPECT_EQ(handleRequest(*coordinator, "GET", "/api/v1/jobs/" + number).status, 200);
  EXPECT_EQ(handleRequest(*coordinator, "GET", "/jobs/" + number).status, 200);
  // The job page carries the charts' containers and the script that fetches the series.
  Response page = handleRequest(*coordinator, "GET", "/jobs/" + job);
  EXPECT_NE(page.body.find("id='chart-bw'"), std::string::npos);
  EXPECT_NE(page.body.find("id='chart-busy'"), std::string::npos);
  EXPECT_NE(page.body.find("'/series'"), std::string::npos);
  EXPECT_NE(page.body.find("data-live='1'"), std::string::npos);
}

TEST_F(SeriesTest, ClusterSeriesSamplesGpusAndJobsEveryFiveSeconds) {
  for (int i = 0; i < 4; ++i) {
    wall += 5000;
    coordinator->tick();
  }
  Response r = handleRequest(*coordinator, "GET", "/api/v1/cluster/series");
  ASSERT_EQ(r.status, 200) << r.body;
  auto body = nlohmann::json::parse(r.body);
  ASSERT_GE(body["t_ms"].size(), 4u);
  EXPECT_EQ(body["gpus_total"].back(), 4);
  EXPECT_EQ(body["gpus_used"].back(), 4);
  EXPECT_EQ(body["jobs"]["STARTING"].back(), 1);
  EXPECT_EQ(body["jobs"]["PENDING"].size(), body["t_ms"].size());
  const size_t before = body["t_ms"].size();
  coordinator->tick();  // no time passed: no new point
  EXPECT_EQ(
      nlohmann::json::parse(handleRequest(*coordinator, "GET", "/api/v1/cluster/series").body)["t_ms"].size(),
      before);
}

TEST_F(SeriesTest, MetricsCarryLiveJobsWithTheirIdOnly) {
  report(0, [](int) { return 1e6; });
  report(2, [](int) { return 1e6; });
  Response r = handleRequest(*coordinator, "GET", "/metrics");
  ASSERT_EQ(r.status, 200);
  for (const std::string line :
       {"ddl_job_collective_bytes_total{job=\"" + job + "\"} 8000000\n",
        "ddl_job_collective_seconds_total{job=\"" + job + "\"} 4\n", "ddl_job_gpus{job=\"" + job + "\"} 4\n",
        "ddl_job_ranks_reporting{job=\"" + job + "\"} 4\n",
        std::string("# TYPE ddl_job_collective_bytes_total counter\n")}) {
    EXPECT_NE(r.body.find(line), std::string::npos) << line << r.body;
  }
  // Capped at 500 placed jobs: 9 nodes of 64 GPUs more (a node registers at most 64) and 520 one-GPU jobs on
  // them give 500 lines per metric.
  for (int n = 0; n < 9; ++n) {
    v1::RegisterRequest big;
    big.set_node("big" + std::to_string(n));
    big.set_address("10.0.1." + std::to_string(n + 1));
    for (int g = 0; g < 64; ++g) big.add_gpus()->set_index(g);
    auto resp = coordinator->registerAgent(big);
    ASSERT_TRUE(resp) << resp.status().toString();
    ASSERT_TRUE(coordinator->attachAgent(big.node(), resp->session(), std::make_shared<NullLink>()));
  }
  for (int i = 0; i < 520; ++i) {
    v1::JobSpec spec;
    spec.set_name("small");
    spec.set_nodes(1);
    spec.set_gpus_per_node(1);
    spec.add_command("true");
    ASSERT_TRUE(coordinator->submit(spec));
  }
  coordinator->tick();
  r = handleRequest(*coordinator, "GET", "/metrics");
  ASSERT_NE(r.body.find("ddl_jobs{state=\"STARTING\"} 520"), std::string::npos) << r.body.substr(0, 2000);
  size_t gpus_lines = 0;
  for (size_t at = r.body.find("\nddl_job_gpus{"); at != std::string::npos;
       at = r.body.find("\nddl_job_gpus{", at + 1)) {
    ++gpus_lines;
  }
  EXPECT_EQ(gpus_lines, MetricsSnapshot::kMaxJobFigures);
  // An ended job leaves the per-job metrics.
  ASSERT_TRUE(coordinator->cancel(job));
  r = handleRequest(*coordinator, "GET", "/metrics");
  EXPECT_EQ(r.body.find("job=\"" + job + "\""), std::string::npos);
}

TEST_F(SeriesTest, JobsApiTakesStatesInAnyCaseAndFiltersAndPages) {
  const std::string other = submit("other");  // PENDING: the cluster is full
  ASSERT_TRUE(coordinator->cancel(other));
  auto list = [&](const std::string& query) {
    Response r = handleRequest(*coordinator, "GET", "/api/v1/jobs?" + query);
    EXPECT_EQ(r.status, 200) << query << ": " << r.body;
    std::vector<std::string> ids;
    auto body = nlohmann::json::parse(r.body, nullptr, false);
    if (body.is_discarded()) return std::make_pair(ids, std::string());
    for (const auto& j : body["jobs"]) ids.push_back(j["id"]);
    return std::make_pair(ids, body.value("next_page_token", std::string()));
  };
  EXPECT_EQ(list("state=cancelled").first, std::vector<std::string>{other});
  EXPECT_EQ(list("state=Starting").first, std::vector<std::string>{job});
  EXPECT_EQ(list("state=cancelled,starting").first.size(), 2u);
  EXPECT_EQ(list("name=other").first, std::vector<std::string>{other});
  EXPECT_EQ(list("user=alice").first.size(), 2u);
  EXPECT_EQ(list("user=bob").first.size(), 0u);
  EXPECT_EQ(list("since=1000000").first.size(), 2u);  // unix ms (the test's wall clock is at 1970)
  EXPECT_EQ(list("since=1h").first.size(), 0u);       // an age: submitted within the last hour
  EXPECT_EQ(list("until=1").first.size(), 0u);
  auto first = list("page_size=1");
  ASSERT_EQ(first.first, std::vector<std::string>{job});
  ASSERT_FALSE(first.second.empty());
  EXPECT_EQ(list("page_size=1&page_token=" + first.second).first, std::vector<std::string>{other});
  for (const char* bad :
       {"state=nope", "state=running,", "since=yesterday", "page_size=0", "page_size=9999"}) {
    EXPECT_EQ(handleRequest(*coordinator, "GET", std::string("/api/v1/jobs?") + bad).status, 400) << bad;
  }
}

TEST(Pages, HumanDurations) {
  EXPECT_EQ(humanDuration(350), "0.35s");
  EXPECT_EQ(humanDuration(45000), "45s");
  EXPECT_EQ(humanDuration(60882), "1m 00s");
  EXPECT_EQ(humanDuration(61000), "1m 01s");
  EXPECT_EQ(humanDuration(2 * 3600000 + 5 * 60000), "2h 05m");
  EXPECT_EQ(humanDuration(3 * 86400000LL + 4 * 3600000), "3d 04h");
  EXPECT_EQ(humanDuration(-5), "0.00s");
}

// A finished job's page: the rank processes from Job.ranks (exit code or signal, start and end, figures),
// human durations instead of milliseconds, user text escaped, logs that start at their end, no self-refresh.
TEST(Pages, FinishedJobShowsItsRankProcessesInHumanTerms) {
  v1::Job job;
  job.set_id("j-000007");
  job.set_state(v1::FAILED);
  job.set_submit_ms(1000000);
  job.set_start_ms(1005000);
  job.set_end_ms(1066000);
  job.mutable_spec()->set_name("train");
  auto* t = job.add_transitions();
  t->set_to(v1::FAILED);
  t->set_at_ms(1061000);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankStatus* r = job.add_ranks();
    r->set_rank(rank);
    r->set_node(rank == 0 ? "n<1>" : "n2");
    r->set_gpu(rank);
    r->set_pid(4100 + rank);
    r->set_program_pid(4200 + rank);
    r->set_state(v1::RankStatus::EXITED);
    r->set_started_ms(1005000);
    r->set_exited_ms(1066000);
    if (rank == 0) r->set_exit_code(3);
    if (rank == 1) r->set_signal(9);
    r->mutable_progress()->set_bytes(2500000000);
    r->mutable_progress()->set_seconds(12.5);
    r->mutable_progress()->set_collectives(400);
  }
  const std::string page = renderJobPage(job, nullptr, {{0, "line 1\nline <2>\n"}}, 1126000);
  for (const char* want :
       {"Rank processes", "exit 3", "SIGKILL", "n&lt;1&gt;", "4201", "+1m 01s", "1m 01s", "ran for",
        "2.50 GB", "12s", "class='log'", "data-live='0'", "line &lt;2&gt;", "scrollHeight", "1m 00s ago"}) {
    EXPECT_NE(page.find(want), std::string::npos) << want;
  }
  EXPECT_EQ(page.find("n<1>"), std::string::npos);
  EXPECT_EQ(page.find(" ms<"), std::string::npos);  // no raw milliseconds in cells
  job.clear_ranks();
  EXPECT_NE(renderJobPage(job, nullptr, {}, 1126000).find("no rank records were kept"), std::string::npos);
}

// Issue 41: per-account counters, one series per account (and per way an attempt ended), escaped.
TEST(Pages, MetricsCountUsagePerAccount) {
  MetricsSnapshot m;
  m.account_gpu_seconds = {{"lab", 7.5}, {"root", 2}};
  m.account_attempts = {{{"lab", "FAILED"}, 2}, {{"lab", "SUCCEEDED"}, 5}};
  const std::string text = renderMetrics(m, true);
  for (const char* line : {"# TYPE ddl_account_gpu_seconds_total counter\n",
                           "ddl_account_gpu_seconds_total{account=\"lab\"} 7.5\n",
                           "ddl_account_gpu_seconds_total{account=\"root\"} 2\n",
                           "ddl_account_attempts_total{account=\"lab\",end=\"FAILED\"} 2\n",
                           "ddl_account_attempts_total{account=\"lab\",end=\"SUCCEEDED\"} 5\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << " missing in\n" << text;
  }
}

TEST(Pages, IndexHasClusterChartsHistoryFiltersAndPaging) {
  const std::string page = renderIndexPage();
  for (const char* want : {"id=\"chart-gpus\"", "id=\"chart-jobs\"", "id=\"chart-usage\"",
                           "/api/v1/usage?days=30", "/api/v1/cluster/series", "name=\"state\"",
                           "name=\"user\"", "name=\"name\"", "page_token", "next page", "hdur(", ".sort("}) {
    EXPECT_NE(page.find(want), std::string::npos) << want;
  }
  EXPECT_EQ(page.find("http://"), std::string::npos);  // nothing fetched from elsewhere
  EXPECT_EQ(page.find("https://"), std::string::npos);
}

// A raw request to the real server; returns what it answered (up to 4 KiB) or "connect failed".
std::string rawReply(int port, const std::string& request) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return "connect failed";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)!write(fd, request.data(), request.size());
  std::string reply;
  char buf[4096];
  // Until one whole answer is in (its header and Content-Length bytes), the server closes, or 5 s pass.
  for (int i = 0; i < 64 && reply.size() < sizeof(buf); ++i) {
    const ssize_t n = read(fd, buf, sizeof(buf) - reply.size());
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
    const size_t head = reply.find("\r\n\r\n");
    const size_t length = reply.find("Content-Length: ");
    if (head != std::string::npos && length < head &&
        reply.size() >= head + 4 + std::stoul(reply.substr(length + 16))) {
      break;
    }
  }
  close(fd);
  return reply;
}

// The status line of rawReply.
std::string rawRequest(int port, const std::string& request) {
  const std::string reply = rawReply(port, request);
  return reply.substr(0, reply.find("\r\n"));
}

TEST_F(HttpTest, RealServerSurvivesGarbage) {
  HttpServer server(*coordinator);
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  const int port = parseHostPort(bound)->port;
  EXPECT_EQ(rawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
  EXPECT_EQ(rawRequest(port, "GET /missing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            "HTTP/1.1 404 Not Found");
  EXPECT_EQ(rawRequest(port, "\x01\x02 garbage\r\n\r\n"), "");  // dropped, no crash
  EXPECT_EQ(rawRequest(port, "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n"), "");  // header too large
  EXPECT_EQ(rawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
  // Every API path reaches the coordinator through the server's own backend (its deadline wrapper).
  for (const char* path : {"/api/v1/usage?days=2", "/api/v1/cluster/series", "/api/v1/nodes"}) {
    EXPECT_EQ(
        rawRequest(port, std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        "HTTP/1.1 200 OK")
        << path;
  }
  // Writes are 405 with Allow on the wire too; a body sent with one is not read, and the connection ends.
  const std::string post = rawReply(port, "POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"a\":1}");
  EXPECT_EQ(post.substr(0, post.find("\r\n")), "HTTP/1.1 405 Method Not Allowed") << post;
  EXPECT_NE(post.find("\r\nAllow: GET, HEAD\r\n"), std::string::npos) << post;
  EXPECT_NE(post.find("\r\nConnection: close\r\n"), std::string::npos) << post;
  EXPECT_EQ(rawRequest(port, "DELETE /api/v1/jobs/" + job + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            "HTTP/1.1 405 Method Not Allowed");
  EXPECT_FALSE(HttpServer(*coordinator).start("nonsense", &bound));
  coordinator->stop();
  server.stop();
}

// --- the secured dashboard: tokens, cookies, redaction, HTTPS ----------------------------------------------

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

// A cluster PKI in a temporary directory (init-pki's files) and a user of each role.
class SecureHttpTest : public HttpTest {
 protected:
  void SetUp() override {
    HttpTest::SetUp();
    char tmpl[] = "/tmp/ddl-http-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
    auth::InitPkiOptions init;
    init.dir = dir + "/pki";
    auto admin = auth::initPki(init);
    ASSERT_TRUE(admin) << admin.status().toString();
    admin_token = *admin;
    auto opened = auth::UserRegistry::open(user_store, init.dir + "/" + pki::kUsersFile);
    ASSERT_TRUE(opened);
    users = std::move(*opened);
    viewer_token = *users->add("val", auth::Role::kViewer, false);
    owner_token = *users->add("alice", auth::Role::kUser, false);
    other_token = *users->add("bob", auth::Role::kUser, false);
    std::string error;
    ca_pem = *pki::readFile(init.dir + "/" + pki::kCaCert, &error);
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  std::string pkiDir() const { return dir + "/pki"; }
  Access access() const { return {true, users.get()}; }
  Response get(const std::string& target, const std::string& authorization = "", const std::string& cookie = "") {
    return handleRequest(*coordinator, Request{"GET", target, authorization, cookie}, access());
  }
  std::string fileSha256(const char* file) {
    std::string error;
    auto pem = pki::readFile(pkiDir() + "/" + file, &error);
    auto info = pem ? pki::inspectCertificate(*pem, &error) : std::nullopt;
    return info ? info->sha256 : "(" + error + ")";
  }

  std::string dir;
  state::MemoryStore user_store;
  std::unique_ptr<auth::UserRegistry> users;
  std::string admin_token, viewer_token, owner_token, other_token, ca_pem;
};

std::string field(const Response& r, const std::string& name) {
  for (const auto& [n, v] : r.headers) {
    if (n == name) return v;
  }
  return "";
}

TEST_F(SecureHttpTest, EveryPathButHealthzNeedsAToken) {
  const std::string paths[] = {"/", "/index.html", "/metrics", "/api/v1/nodes", "/api/v1/jobs", "/api/v1/jobs/" + job,
                               "/jobs/" + job, "/nope"};
  for (const auto& path : paths) {
    for (const std::string& authorization : std::vector<std::string>{"", "Bearer ddl_0123456789abcdef", "Bearer " + viewer_token + "x",
                                             "Basic " + viewer_token, "Bearer ", "Bearer a\r\nX: y"}) {
      Response r = get(path, authorization);
      EXPECT_EQ(r.status, 401) << path << " with '" << authorization << "'";
      EXPECT_EQ(field(r, "WWW-Authenticate"), "Bearer realm=\"ddl\"");
      EXPECT_NE(r.body.find("/login?token="), std::string::npos) << r.body;
      if (path.rfind("/api/", 0) == 0 || path == "/metrics") {
        ASSERT_TRUE(nlohmann::json::accept(r.body)) << r.body;
        EXPECT_NE(nlohmann::json::parse(r.body)["error"].get<std::string>().find("ddlctl admin add-user"),
                  std::string::npos);
      } else {
        EXPECT_NE(r.body.find("<form action='/login'"), std::string::npos) << path;
      }
    }
    for (const auto& token : {viewer_token, owner_token, other_token, admin_token}) {
      EXPECT_EQ(get(path, "Bearer " + token).status, path == "/nope" ? 404 : 200) << path;
    }
    EXPECT_EQ(get(path, "bearer  " + viewer_token).status, path == "/nope" ? 404 : 200) << "the scheme in any case";
  }
  EXPECT_EQ(get("/healthz").status, 200);
  EXPECT_NE(get("/metrics", "Bearer " + viewer_token).body.find("ddl_gpus 4\n"), std::string::npos);
  // The open dashboard (loopback, nothing asked) needs nothing, as before.
  EXPECT_EQ(handleRequest(*coordinator, "GET", "/api/v1/jobs").status, 200);
}

TEST_F(SecureHttpTest, LoginSetsAStrictHttpOnlyCookieThatWorks) {
  Response r = get("/login?token=" + viewer_token);
  ASSERT_EQ(r.status, 303);
  EXPECT_EQ(field(r, "Location"), "/");
  EXPECT_EQ(field(r, "Set-Cookie"),
            std::string(kTokenCookie) + "=" + viewer_token + "; Path=/; HttpOnly; Secure; SameSite=Strict");
  for (const std::string& cookie : std::vector<std::string>{std::string(kTokenCookie) + "=" + viewer_token,
                                    "theme=dark; " + std::string(kTokenCookie) + "=" + viewer_token + "; x=1"}) {
    EXPECT_EQ(get("/", "", cookie).status, 200) << cookie;
    EXPECT_EQ(get("/api/v1/jobs", "", cookie).status, 200) << cookie;
  }
  EXPECT_EQ(get("/", "", std::string(kTokenCookie) + "=" + viewer_token + "0").status, 401);
  EXPECT_EQ(get("/", "", "x" + std::string(kTokenCookie) + "=" + viewer_token).status, 401);
  // A header with a bad token is refused even beside a good cookie.
  EXPECT_EQ(get("/", "Bearer nope", std::string(kTokenCookie) + "=" + viewer_token).status, 401);
  // A browser's form encodes the token; bad and missing tokens get no cookie.
  std::string encoded = viewer_token;
  encoded.replace(encoded.find('_'), 1, "%5F");
  EXPECT_EQ(field(get("/login?token=" + encoded), "Set-Cookie").rfind(std::string(kTokenCookie) + "=" + viewer_token + ";", 0),
            0u);
  for (const std::string& target : std::vector<std::string>{"/login", "/login?token=", "/login?token=ddl_00", "/login?token=" + viewer_token +
                                    "%0D%0ASet-Cookie:%20x=y"}) {
    Response bad = get(target);
    EXPECT_EQ(bad.status, 401) << target;
    EXPECT_EQ(field(bad, "Set-Cookie"), "") << target;
  }
  // An open dashboard has nothing to sign in to: back to / without a cookie.
  Response open = handleRequest(*coordinator, "GET", "/login?token=" + viewer_token);
  EXPECT_EQ(open.status, 303);
  EXPECT_EQ(field(open, "Set-Cookie"), "");
}

TEST_F(SecureHttpTest, OnlyOwnersAndAdminsSeeCommandsEnvWorkdirAndLogs) {
  struct Reader {
    std::string name;
    std::string token;
    bool sees;
  };
  const Reader readers[] = {{"viewer", viewer_token, false}, {"another user", other_token, false},
                            {"the owner", owner_token, true}, {"an admin", admin_token, true}};
  for (const auto& reader : readers) {
    SCOPED_TRACE(reader.name);
    const std::string bearer = "Bearer " + reader.token;
    auto list = nlohmann::json::parse(get("/api/v1/jobs", bearer).body);
    ASSERT_EQ(list["jobs"].size(), 1u);
    auto one = nlohmann::json::parse(get("/api/v1/jobs/" + job, bearer).body);
    for (const auto& spec : {list["jobs"][0]["spec"], one["job"]["spec"]}) {
      EXPECT_EQ(spec["user"], "alice");  // who runs it stays visible
      EXPECT_EQ(spec["command"].size(), reader.sees ? 2u : 0u) << spec;
      EXPECT_EQ(spec["env"].size(), reader.sees ? 1u : 0u) << spec;
      EXPECT_EQ(spec["workdir"], reader.sees ? "/home/alice/private-run" : "") << spec;
    }
    const std::string page = get("/jobs/" + job, bearer).body;
    EXPECT_EQ(page.find("--secret-flag") != std::string::npos, reader.sees);
    EXPECT_EQ(page.find("Log of rank 0") != std::string::npos, reader.sees);
    EXPECT_EQ(page.find("shown to the job's owner and admins only") != std::string::npos, !reader.sees);
    EXPECT_NE(page.find("<svg"), std::string::npos);  // the rest of the page is there for everyone
  }
  // The open dashboard shows everything, as before.
  auto open = nlohmann::json::parse(handleRequest(*coordinator, "GET", "/api/v1/jobs").body);
  EXPECT_EQ(open["jobs"][0]["spec"]["command"].size(), 2u);
}

// One HTTPS exchange as a client that trusts only the cluster CA and checks the name "ddl-coordinator", like
// ddlctl. Every step has a 5 s deadline.
struct HttpsAnswer {
  std::string error;  // "" when an answer came
  beast::http::response<beast::http::string_body> response;
  std::string certificate_sha256;  // of the certificate the server presented
};

HttpsAnswer httpsRequest(int port, const std::string& ca_pem, const std::string& target,
                         const std::string& authorization = "", const std::string& cookie = "",
                         beast::http::verb method = beast::http::verb::get) {
  HttpsAnswer answer;
  asio::io_context io;
  asio::ssl::context ctx(asio::ssl::context::tls_client);
  ctx.add_certificate_authority(asio::buffer(ca_pem));
  ctx.set_verify_mode(asio::ssl::verify_peer);
  asio::ssl::stream<tcp::socket> stream(io, ctx);
  stream.set_verify_callback(asio::ssl::host_name_verification(pki::kCoordinatorName));
  SSL_set_tlsext_host_name(stream.native_handle(), pki::kCoordinatorName);
  bool done = false;
  beast::error_code ec;
  auto step = [&](const char* what) {
    io.restart();
    io.run_for(std::chrono::seconds(5));
    if (!done) {
      beast::error_code ignored;
      stream.lowest_layer().close(ignored);
      io.restart();
      io.run();
      answer.error = std::string(what) + ": timed out";
      return false;
    }
    done = false;
    if (ec) answer.error = std::string(what) + ": " + ec.message();
    return !ec;
  };
  auto finish = [&](beast::error_code e, auto&&...) {
    ec = e;
    done = true;
  };
  stream.lowest_layer().async_connect({asio::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)},
                                      finish);
  if (!step("connect")) return answer;
  stream.async_handshake(asio::ssl::stream_base::client, finish);
  if (!step("handshake")) return answer;
  if (X509* peer = SSL_get_peer_certificate(stream.native_handle())) {
    unsigned char* der = nullptr;
    const int len = i2d_X509(peer, &der);
    answer.certificate_sha256 = pki::sha256Hex(std::string_view(reinterpret_cast<char*>(der), len));
    OPENSSL_free(der);
    X509_free(peer);
  }
  beast::http::request<beast::http::empty_body> req{method, target, 11};
  req.set(beast::http::field::host, "ddl-coordinator");
  if (!authorization.empty()) req.set(beast::http::field::authorization, authorization);
  if (!cookie.empty()) req.set(beast::http::field::cookie, cookie);
  req.keep_alive(false);
  beast::http::async_write(stream, req, finish);
  if (!step("write")) return answer;
  beast::flat_buffer buffer;
  beast::http::async_read(stream, buffer, answer.response, finish);
  step("read");
  return answer;
}

int portOf(const std::string& bound) { return parseHostPort(bound)->port; }

TEST_F(SecureHttpTest, HttpsWithTokensWhenAskedOnLoopback) {
  HttpServer server(*coordinator, {/*tls=*/true, /*auth=*/false, pkiDir(), users.get()});
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  EXPECT_STREQ(server.scheme(), "https");
  const int port = portOf(bound);

  HttpsAnswer a = httpsRequest(port, ca_pem, "/healthz");
  ASSERT_EQ(a.error, "");
  EXPECT_EQ(a.response.result_int(), 200);
  EXPECT_EQ(a.certificate_sha256, fileSha256(pki::kCoordinatorCert));  // the coordinator's own certificate
  EXPECT_EQ(httpsRequest(port, ca_pem, "/api/v1/jobs").response.result_int(), 401);
  EXPECT_EQ(httpsRequest(port, ca_pem, "/metrics", "Bearer ddl_wrong").response.result_int(), 401);
  a = httpsRequest(port, ca_pem, "/api/v1/jobs", "Bearer " + viewer_token);
  EXPECT_EQ(a.response.result_int(), 200);
  ASSERT_TRUE(nlohmann::json::accept(a.response.body())) << a.response.body();
  EXPECT_EQ(nlohmann::json::parse(a.response.body())["jobs"][0]["spec"]["command"].size(), 0u);  // a viewer's view
  // Prometheus: the bearer token on /metrics.
  a = httpsRequest(port, ca_pem, "/metrics", "Bearer " + viewer_token);
  EXPECT_EQ(a.response.result_int(), 200);
  EXPECT_NE(a.response.body().find("ddl_gpus 4\n"), std::string::npos);
  // A browser: /login, then the cookie.
  a = httpsRequest(port, ca_pem, "/login?token=" + viewer_token);
  ASSERT_EQ(a.response.result_int(), 303);
  const std::string set_cookie(a.response[beast::http::field::set_cookie]);
  EXPECT_NE(set_cookie.find("HttpOnly; Secure; SameSite=Strict"), std::string::npos);
  const std::string cookie = set_cookie.substr(0, set_cookie.find(';'));
  a = httpsRequest(port, ca_pem, "/", "", cookie);
  EXPECT_EQ(a.response.result_int(), 200);
  EXPECT_NE(a.response.body().find("ddl cluster"), std::string::npos);
  // Still read-only.
  a = httpsRequest(port, ca_pem, "/api/v1/jobs", "Bearer " + admin_token, "", beast::http::verb::post);
  EXPECT_EQ(a.response.result_int(), 405);
  EXPECT_EQ(a.response[beast::http::field::allow], "GET, HEAD");

  // Plain HTTP to the HTTPS port gets nothing but a pointer to https.
  const std::string plain = rawReply(port, "GET /api/v1/jobs HTTP/1.1\r\nHost: dash.example:" + std::to_string(port) +
                                               "\r\nAuthorization: Bearer " + viewer_token + "\r\n\r\n");
  EXPECT_EQ(plain.substr(0, plain.find("\r\n")), "HTTP/1.1 400 Bad Request") << plain;
  EXPECT_NE(plain.find("https://dash.example:" + std::to_string(port) + "/"), std::string::npos) << plain;
  const std::string no_host = rawReply(port, "GET / HTTP/1.0\r\n\r\n");
  EXPECT_NE(no_host.find("https://" + bound + "/"), std::string::npos) << no_host;
  EXPECT_EQ(plain.find("\"jobs\""), std::string::npos) << plain;
  EXPECT_EQ(rawReply(port, "\x01\x02 garbage\r\n\r\n"), "");
  // A client that does not trust the cluster CA does not get through.
  std::string error;
  auto other_key = pki::newPrivateKey(&error);
  auto other_ca = pki::makeCertificate({"another CA", {}, {}, pki::Usage::kCa}, *other_key, "", "", 0,
                                       4102444800, &error);
  ASSERT_TRUE(other_ca) << error;
  EXPECT_NE(httpsRequest(port, *other_ca, "/healthz").error.find("handshake"), std::string::npos);
  // The server still serves.
  EXPECT_EQ(httpsRequest(port, ca_pem, "/healthz").response.result_int(), 200);
  coordinator->stop();
  server.stop();
}

TEST_F(SecureHttpTest, RenewedCertificateReachesNewConnections) {
  HttpServer server(*coordinator, {/*tls=*/true, /*auth=*/false, pkiDir(), users.get()});
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  const int port = portOf(bound);
  const std::string first = fileSha256(pki::kCoordinatorCert);
  EXPECT_EQ(httpsRequest(port, ca_pem, "/healthz").certificate_sha256, first);

  // Half a renewal (a new key beside the old certificate) does not break new connections: the old pair stays.
  std::string error;
  auto stray_key = pki::newPrivateKey(&error);
  ASSERT_TRUE(pki::writeFile(pkiDir() + "/" + pki::kCoordinatorKey, *stray_key, 0600, &error)) << error;
  HttpsAnswer a = httpsRequest(port, ca_pem, "/healthz");
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(a.certificate_sha256, first);

  // renew-cert: the next connection gets the new certificate.
  ASSERT_TRUE(auth::renewCoordinatorCert(pkiDir(), {}, 30));
  const std::string second = fileSha256(pki::kCoordinatorCert);
  ASSERT_NE(second, first);
  a = httpsRequest(port, ca_pem, "/api/v1/nodes", "Bearer " + viewer_token);
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(a.response.result_int(), 200);
  EXPECT_EQ(a.certificate_sha256, second);
  coordinator->stop();
  server.stop();
}

TEST_F(SecureHttpTest, OffLoopbackMeansHttpsAndTokensAndNeedsTheCertificate) {
  for (const char* listen : {"0.0.0.0:7080", "10.0.0.1:7080", "[::]:7080", "192.168.1.5:0"}) {
    const HttpMode mode = httpMode(listen, {});
    EXPECT_TRUE(mode.tls && mode.auth) << listen;
  }
  for (const char* listen : {"127.0.0.1:7080", "127.0.0.2:0", "[::1]:7080"}) {
    const HttpMode mode = httpMode(listen, {});
    EXPECT_FALSE(mode.tls || mode.auth) << listen;
    EXPECT_TRUE(httpMode(listen, {true, false, "", nullptr}).auth) << "HTTPS always takes tokens";
    const HttpMode auth_only = httpMode(listen, {false, true, "", nullptr});
    EXPECT_TRUE(auth_only.auth && !auth_only.tls) << listen;
  }
  // Refused before anything listens: no certificate files, no users.
  std::string bound;
  const std::string empty = dir + "/empty";
  std::filesystem::create_directories(empty);
  Status st = HttpServer(*coordinator, {false, false, empty, users.get()}).start("0.0.0.0:0", &bound);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find(empty + "/coordinator.crt"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not a loopback address"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("127.0.0.1"), std::string::npos) << st.message();
  st = HttpServer(*coordinator, {false, false, pkiDir(), nullptr}).start("0.0.0.0:0", &bound);
  EXPECT_FALSE(st);
  EXPECT_NE(st.message().find("no users"), std::string::npos) << st.message();
  st = HttpServer(*coordinator, {true, false, empty, users.get()}).start("127.0.0.1:0", &bound);
  EXPECT_NE(st.message().find("http_tls"), std::string::npos) << st.message();
}

TEST_F(SecureHttpTest, TokensOverPlainHttpOnLoopbackWhenAsked) {
  HttpServer server(*coordinator, {/*tls=*/false, /*auth=*/true, pkiDir(), users.get()});
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  EXPECT_STREQ(server.scheme(), "http");
  const int port = portOf(bound);
  EXPECT_EQ(rawRequest(port, "GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 401 Unauthorized");
  EXPECT_EQ(rawRequest(port, "GET /api/v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + viewer_token +
                                 "\r\n\r\n"),
            "HTTP/1.1 200 OK");
  EXPECT_EQ(rawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
  coordinator->stop();
  server.stop();
}

// Connects, sends `prefix` (maybe nothing), and waits up to 5 s for the server to hang up; the milliseconds it
// took, or -1 if it did not.
int64_t msUntilHangUp(int port, const std::string& prefix) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const auto start = std::chrono::steady_clock::now();
  (void)!write(fd, prefix.data(), prefix.size());
  char buf[256];
  ssize_t n = 0;
  for (int i = 0; i < 16 && (n = read(fd, buf, sizeof(buf))) > 0; ++i) {
  }
  const bool hung_up = n == 0 || (n < 0 && errno == ECONNRESET);
  close(fd);
  if (!hung_up) return -1;
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
}

// A client that says nothing, or half a request, is dropped after the timeout, on HTTP and on HTTPS (before the
// handshake and after it); stop() does not wait for idle connections.
TEST_F(SecureHttpTest, SilentClientsAreDroppedAndStopDoesNotWaitForThem) {
  for (const bool tls : {false, true}) {
    SCOPED_TRACE(tls ? "https" : "http");
    HttpOptions options{tls, false, pkiDir(), users.get()};
    options.idle_timeout_ms = 600;
    options.request_timeout_ms = 600;
    HttpServer server(*coordinator, options);
    std::string bound;
    ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
    const int port = portOf(bound);
    for (const std::string& prefix : {std::string(), std::string("GET /healthz HTTP/1.1\r\nHost:")}) {
      const int64_t ms = msUntilHangUp(port, prefix);
      EXPECT_GE(ms, 100) << "'" << prefix << "'";
      EXPECT_LE(ms, 3000) << "'" << prefix << "'";
    }
  }
  HttpServer server(*coordinator, {true, false, pkiDir(), users.get()});  // the default 30 s
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  int idle = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(portOf(bound)));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(idle, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // accepted and waiting for a handshake
  const auto start = std::chrono::steady_clock::now();
  coordinator->stop();
  server.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  close(idle);
}

// --- the asynchronous server: deadlines, the connection cap, a coordinator that does not answer ----------------

// The real coordinator, except that log reads are never answered (an agent that went silent) and health() says
// what the test sets.
class SilentLogsBackend : public CoordinatorBackend {
 public:
  using CoordinatorBackend::CoordinatorBackend;
  void readLog(const v1::GetLogsRequest&, Done<v1::GetLogsResponse> done) override {
    std::lock_guard<std::mutex> lock(mu_);
    unanswered_.push_back(std::move(done));  // kept, never called
    cv_.notify_all();
  }
  StoreHealth health() override {
    std::lock_guard<std::mutex> lock(mu_);
    return health_;
  }
  void setHealth(StoreHealth h) {
    std::lock_guard<std::mutex> lock(mu_);
    health_ = std::move(h);
  }
  // Waits (up to 10 s) until `n` log reads are outstanding.
  bool waitReads(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(10), [&] { return unanswered_.size() >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Done<v1::GetLogsResponse>> unanswered_;
  StoreHealth health_;
};

int connectTo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server has closed `fd`, waiting up to `wait_ms` for it (what arrives meanwhile is read and dropped).
bool hungUp(int fd, int wait_ms) {
  pollfd p{fd, POLLIN, 0};
  for (int i = 0; i < 64; ++i) {
    if (poll(&p, 1, wait_ms) <= 0) return false;
    char buf[512];
    const ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    if (n < 0 && errno != EAGAIN) return true;
  }
  return false;
}

// The measured failure: 64 clients that send one header line every second kept /healthz and /metrics down (a
// thread each, and the 65th connection closed at once). Now a new connection evicts the oldest one that is only
// waiting for its request, so probes are answered while the slow clients keep dribbling.
TEST_F(HttpTest, SixtyFourSlowClientsDoNotStopHealthzAndMetrics) {
  HttpServer server(*coordinator);  // the defaults: 64 connections, 10 s per request header
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  const int port = std::stoi(bound.substr(bound.rfind(':') + 1));
  std::vector<int> slow;
  for (int i = 0; i < 64; ++i) {
    const int fd = connectTo(port);
    ASSERT_GE(fd, 0);
    const std::string start = "GET /healthz HTTP/1.1\r\n";
    ASSERT_EQ(send(fd, start.data(), start.size(), MSG_NOSIGNAL), static_cast<ssize_t>(start.size()));
    slow.push_back(fd);
  }
  std::atomic<bool> done{false};
  std::thread dribbler([&] {
    // One more header line on every slow connection each second, for at most 8 s.
    for (int round = 0; round < 8 && !done; ++round) {
      const std::string line = "X-Slow-" + std::to_string(round) + ": 1\r\n";
      for (int fd : slow) (void)send(fd, line.data(), line.size(), MSG_NOSIGNAL);
      for (int t = 0; t < 20 && !done; ++t) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(rawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK") << i;
    EXPECT_EQ(rawRequest(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK") << i;
  }
  done = true;
  dribbler.join();
  // The probes took the places of the oldest slow clients.
  EXPECT_TRUE(hungUp(slow.front(), 2000));
  for (int fd : slow) close(fd);
  coordinator->stop();
  server.stop();
}

// The header deadline counts from the request's first byte, not from the last one: a client that sends a
// header line every 100 ms, forever, is cut off once request_timeout_ms has passed.
TEST_F(HttpTest, AClientThatNeverFinishesItsHeaderIsCutOffAtTheDeadline) {
  HttpOptions options;
  options.request_timeout_ms = 500;
  HttpServer server(*coordinator, options);
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  const int fd = connectTo(std::stoi(bound.substr(bound.rfind(':') + 1)));
  ASSERT_GE(fd, 0);
  std::string line = "GET /healthz HTTP/1.1\r\n";
  bool cut = false;
  int lines = 0;
  for (; lines < 100 && !cut; ++lines) {  // 10 s at most
    if (send(fd, line.data(), line.size(), MSG_NOSIGNAL) < 0) {
      cut = true;
      break;
    }
    line = "X-Line-" + std::to_string(lines) + ": 1\r\n";
    cut = hungUp(fd, 100);
  }
  EXPECT_TRUE(cut) << "still open after " << lines << " header lines";
  EXPECT_GT(lines, 1);  // it was let in, and then cut off
  close(fd);
  coordinator->stop();
  server.stop();
}

// Past the cap, a new connection evicts the oldest one that is only waiting for a request.
TEST_F(HttpTest, PastTheCapTheOldestWaitingConnectionMakesRoom) {
  HttpOptions options;
  options.max_connections = 4;
  HttpServer server(*coordinator, options);
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  const int port = std::stoi(bound.substr(bound.rfind(':') + 1));
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(connectTo(port));  // accepted in this order, then silent
  EXPECT_EQ(rawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
  EXPECT_TRUE(hungUp(idle[0], 2000));  // the oldest made room
  for (int fd : idle) close(fd);
  coordinator->stop();
  server.stop();
}

// Past the cap with every connection busy (answers the coordinator still owes), a new one is answered 503 at
// once; nothing waits for the busy ones, and stop() does not either.
TEST_F(HttpTest, PastTheCapWithEveryConnectionBusyTheAnswerIs503) {
  SilentLogsBackend backend(*coordinator);
  HttpOptions options;
  options.max_connections = 2;
  options.backend_timeout_ms = 60000;
  HttpServer server(backend, options);
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  const int port = std::stoi(bound.substr(bound.rfind(':') + 1));
  std::vector<int> busy;
  for (int i = 0; i < 2; ++i) {
    busy.push_back(connectTo(port));
    const std::string req = "GET /jobs/" + job + " HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(send(busy.back(), req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
  }
  ASSERT_TRUE(backend.waitReads(2));  // both pages wait for a log
  const std::string reply = rawReply(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(reply.substr(0, reply.find("\r\n")), "HTTP/1.1 503 Service Unavailable") << reply;
  EXPECT_NE(reply.find("\"error\""), std::string::npos) << reply;
  const auto start = std::chrono::steady_clock::now();
  coordinator->stop();
  server.stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int fd : busy) close(fd);
}

// A job page whose agent never answers a log read: other requests are served meanwhile (nothing blocks the
// server's one thread), and the page renders once the coordinator call's deadline passes, the log marked not
// available.
TEST_F(HttpTest, AJobPageWaitingForALogDoesNotHoldUpOthersAndStillRenders) {
  SilentLogsBackend backend(*coordinator);
  for (const int deadline_ms : {60000, 300}) {
    SCOPED_TRACE(deadline_ms);
    HttpOptions options;
    options.backend_timeout_ms = deadline_ms;
    HttpServer server(backend, options);
    std::string bound;
    ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
    const int port = std::stoi(bound.substr(bound.rfind(':') + 1));
    if (deadline_ms > 1000) {
      const int page = connectTo(port);
      const std::string req = "GET /jobs/" + job + " HTTP/1.1\r\nHost: x\r\n\r\n";
      ASSERT_EQ(send(page, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
      ASSERT_TRUE(backend.waitReads(1));
      EXPECT_EQ(rawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
      EXPECT_EQ(rawRequest(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
      EXPECT_EQ(rawRequest(port, "GET /api/v1/jobs/" + job + " HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
      server.stop();  // does not wait for the page
      close(page);
      continue;
    }
    // The whole answer: the log section is past rawReply's first 4 KiB.
    const int fd = connectTo(port);
    const std::string req = "GET /jobs/" + job + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    ASSERT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string page;
    char buf[4096];
    ssize_t n = 0;
    for (int i = 0; i < 1024 && (n = read(fd, buf, sizeof(buf))) > 0; ++i) page.append(buf, static_cast<size_t>(n));
    close(fd);
    EXPECT_EQ(page.substr(0, page.find("\r\n")), "HTTP/1.1 200 OK") << page.substr(0, 300);
    EXPECT_NE(page.find("<svg"), std::string::npos);
    EXPECT_NE(page.find("Log of rank 0"), std::string::npos);
    EXPECT_NE(page.find("(log not available: the coordinator did not read the log within 300 ms)"),
              std::string::npos);
    server.stop();
  }
  coordinator->stop();
}

// /healthz fails, with the reason, while the coordinator cannot store its state; /metrics says so too.
TEST_F(HttpTest, HealthzAndMetricsReportAnUnhealthyStore) {
  SilentLogsBackend backend(*coordinator);
  backend.setHealth({false, "the store cannot write: disk full"});
  HttpServer server(backend);
  std::string bound;
  ASSERT_TRUE(server.start("127.0.0.1:0", &bound));
  const int port = std::stoi(bound.substr(bound.rfind(':') + 1));
  const std::string health = rawReply(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(health.substr(0, health.find("\r\n")), "HTTP/1.1 503 Service Unavailable") << health;
  EXPECT_NE(health.find("disk full"), std::string::npos) << health;
  const std::string metrics = rawReply(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_NE(metrics.find("ddl_coordinator_store_healthy 0\n"), std::string::npos) << metrics;
  backend.setHealth({true, ""});
  EXPECT_EQ(rawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
  coordinator->stop();
  server.stop();
}

// The daemon's keys for it: http_tls and http_auth are true/false, and a false one off loopback stops the start.
TEST(DashboardConfig, HttpTlsAndHttpAuthAreCheckedAgainstTheAddress) {
  auto parsed = [](const std::string& text) {
    DaemonConfig c;
    Status st = parseConfig(text, "test.json", &c);
    if (st) st = validateConfig(c);
    return std::make_pair(st, c);
  };
  auto [st, c] = parsed(R"({"http": "0.0.0.0:7080"})");
  EXPECT_TRUE(st) << st.message();
  EXPECT_FALSE(c.http_tls.has_value());
  std::tie(st, c) = parsed(R"({"http": "127.0.0.1:7080", "http_tls": true, "http_auth": true})");
  EXPECT_TRUE(st) << st.message();
  EXPECT_TRUE(c.http_tls.value() && c.http_auth.value());
  std::tie(st, c) = parsed(R"({"http_tls": false, "http_auth": false})");  // loopback by default: fine
  EXPECT_TRUE(st) << st.message();
  for (const char* text : {R"({"http": "0.0.0.0:7080", "http_tls": false})",
                           R"({"http": "10.0.0.1:7080", "http_auth": false})", R"({"http": "[::]:7080", "http_tls": false})"}) {
    std::tie(st, c) = parsed(text);
    EXPECT_FALSE(st) << text;
    EXPECT_NE(st.message().find("not a loopback address"), std::string::npos) << st.message();
  }
  std::tie(st, c) = parsed(R"({"http_tls": true, "http_auth": false})");
  EXPECT_NE(st.message().find("http_tls needs tokens"), std::string::npos) << st.message();
  std::tie(st, c) = parsed(R"({"http_tls": "yes"})");
  EXPECT_NE(st.message().find("key 'http_tls' must be true or false"), std::string::npos) << st.message();
  std::tie(st, c) = parsed(R"({"http_tsl": true})");
  EXPECT_NE(st.message().find("http_tls, http_auth,"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace ddl::coordinator::http
