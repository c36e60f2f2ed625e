// The dashboard's routes and pages without sockets (handleRequest over a Coordinator with fake agent links),
// and the real HttpServer on 127.0.0.1 (port chosen at run time) for status codes and a malformed request.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "http/http_server.h"
#include "http/pages.h"
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
    coordinator = std::make_unique<Coordinator>(store, o);
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
    job = coordinator->submit(spec)->id();
    coordinator->tick();
  }
  state::MemoryStore store;
  std::unique_ptr<Coordinator> coordinator;
  std::string job;
};

TEST_F(HttpTest, MetricsReflectTheCluster) {
  Response r = handleRequest(*coordinator, "GET", "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.content_type.find("version=0.0.4"), std::string::npos);
  for (const char* line : {"ddl_nodes{state=\"UP\"} 2\n", "ddl_nodes{state=\"DOWN\"} 0\n", "ddl_gpus 4\n",
                           "ddl_gpus_allocated 4\n", "ddl_jobs{state=\"STARTING\"} 1\n", "ddl_jobs_submitted_total 1\n",
                           "ddl_scheduling_latency_seconds_count 1\n",
                           "ddl_scheduling_latency_seconds_bucket{le=\"+Inf\"} 1\n", "# TYPE ddl_jobs_failed_total counter\n"}) {
    EXPECT_NE(r.body.find(line), std::string::npos) << line << " missing in\n" << r.body;
  }
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
  EXPECT_EQ(body["error"].get<std::string>(),
            "unknown state '" + state + "' (PENDING, SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED)");
  r = handleRequest(*coordinator, "GET", "/api/v1/\"x\\\xff");
  ASSERT_EQ(r.status, 404);
  ASSERT_NO_THROW(body = nlohmann::json::parse(r.body)) << r.body;
  EXPECT_EQ(body["error"].get<std::string>().rfind("no such page: /api/v1/\"x\\", 0), 0u) << r.body;
  auto one = nlohmann::json::parse(handleRequest(*coordinator, "GET", "/api/v1/jobs/" + job).body);
  EXPECT_EQ(one["job"]["spec"]["name"], "bench<script>");
  EXPECT_TRUE(one["ring"].is_object());
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
  for (int i = 0; i < 64 && reply.size() < sizeof(buf); ++i) {  // until the server closes or 5 s pass
    const ssize_t n = read(fd, buf, sizeof(buf) - reply.size());
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
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
  const int port = std::stoi(bound.substr(bound.rfind(':') + 1));
  EXPECT_EQ(rawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
  EXPECT_EQ(rawRequest(port, "GET /missing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
            "HTTP/1.1 404 Not Found");
  EXPECT_EQ(rawRequest(port, "\x01\x02 garbage\r\n\r\n"), "");  // dropped, no crash
  EXPECT_EQ(rawRequest(port, "GET /" + std::string(20000, 'a') + " HTTP/1.1\r\n\r\n"), "");  // header too large
  EXPECT_EQ(rawRequest(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"), "HTTP/1.1 200 OK");
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

}  // namespace
}  // namespace ddl::coordinator::http
