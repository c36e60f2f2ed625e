// Fuzzes what users and agents can send the coordinator: each input is a script of calls, every one a
// ddl.v1 request message (protobuf bytes, as gRPC would hand them over after decoding) fed to the Coordinator
// service object, plus dashboard requests (method and target) fed to the HTTP router. One coordinator lives
// across inputs, over a MemoryStore, with a fake agent link, so state built by earlier inputs is exercised.
//
// Input: records of [op byte][length byte][length bytes of payload]. Checks: nothing crashes, leaks or trips
// a sanitizer; every call answers (the synchronous forms wait for the answer).
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "http/http_server.h"
#include "service/blocking_coordinator.h"
#include "state/memory_store.h"

namespace {

using namespace ddl;

class NullLink : public coordinator::AgentLink {
 public:
  void send(const v1::Command&) override {}
  void close() override {}
};

struct World {
  World() {
    spdlog::set_level(spdlog::level::off);
    coordinator::CoordinatorOptions o;
    o.log_timeout_ms = 1;  // nobody answers log reads here
    o.max_finished_in_memory = 8;
    c = std::make_unique<coordinator::BlockingCoordinator>(store, o, [this] { return now; });
    (void)c->recover();
    v1::RegisterRequest r;
    r.set_node("n1");
    r.set_address("127.0.0.1");
    for (int i = 0; i < 4; ++i) r.add_gpus()->set_index(i);
    auto resp = c->registerAgent(r);
    if (resp) {
      session = resp->session();
      (void)c->attachAgent("n1", session, link);
    }
  }
  int64_t now = 1'000'000;
  state::MemoryStore store;
  std::unique_ptr<coordinator::BlockingCoordinator> c;
  std::shared_ptr<NullLink> link = std::make_shared<NullLink>();
  std::string session;
};

template <class M>
bool parse(const std::string& bytes, M* m) {
  return m->ParseFromString(bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static World* w = new World();  // one coordinator for the whole run, as a daemon has
  auto& c = *w->c;
  size_t pos = 0;
  for (int calls = 0; calls < 16 && pos + 2 <= size; ++calls) {
    const uint8_t op = data[pos];
    const size_t len = std::min<size_t>(data[pos + 1], size - pos - 2);
    const std::string payload(reinterpret_cast<const char*>(data + pos + 2), len);
    pos += 2 + len;
    switch (op % 18) {
      case 0: {
        v1::JobSpec spec;
        if (parse(payload, &spec)) (void)c.submit(spec);
        break;
      }
      case 1: {
        v1::ListJobsRequest req;
        if (parse(payload, &req)) (void)c.listJobs(req);
        break;
      }
      case 2:
        (void)c.getJob(payload);
        break;
      case 3:
        (void)c.cancel(payload);
        break;
      case 4:
        (void)c.drain(payload, len % 2 == 0);
        break;
      case 5:
        (void)c.ring(payload);
        break;
      case 6: {
        v1::GetLogsRequest req;
        if (parse(payload, &req)) (void)c.readLog(req);
        break;
      }
      case 7: {
        v1::Heartbeat hb;
        if (parse(payload, &hb)) (void)c.heartbeat("n1", w->session, hb);
        break;
      }
      case 8: {
        v1::RankStatus r;
        if (parse(payload, &r)) (void)c.rankEvent("n1", w->session, r);
        break;
      }
      case 9: {
        v1::RegisterRequest r;
        if (parse(payload, &r) && r.node() != "n1") (void)c.registerAgent(r);  // n1 keeps its session
        break;
      }
      case 10:
        w->now += len * 1000;
        c.tick();
        break;
      case 11:
        (void)c.removeNode(payload);
        break;
      case 12:
        (void)coordinator::http::handleRequest(c, len % 3 == 0 ? "POST" : "GET", payload);
        break;
      case 13:
        (void)coordinator::http::handleRequest(c, "GET", "/api/v1/jobs?" + payload);
        break;
      case 14: {
        v1::SubmitRequest req;
        // Arrays of at most "0-99" (100 jobs): the one coordinator lives for the whole run.
        if (parse(payload, &req) && req.array().size() <= 4) (void)c.submit(req);
        break;
      }
      case 15:
        (void)c.hold(payload, len % 2 == 0, len % 3 == 0);
        break;
      case 16:
        (void)c.requeue(payload);
        break;
      case 17:
        (void)c.cancel(payload, static_cast<int>(len % 70));
        break;
    }
  }
  return 0;
}
