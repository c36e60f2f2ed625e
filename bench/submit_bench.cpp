// submit_bench: what a user waits for on `ddlctl submit`, end to end through the coordinator: gRPC on
// 127.0.0.1, validation, the feasibility check against the cluster, and the durable SQLite insert
// (synchronous=FULL) that must finish before the answer. An in-process coordinator serves a registered
// cluster of --nodes nodes x 4 GPUs on 32 switches; clients submit 4x4-GPU jobs, so the first 250 start and the rest queue (each
// scheduling pass then weighs the whole queue, outside the lock that submits take). Prints the median and p99
// latency and submits per second for 1 and --threads client threads, and writes them as JSON with --json.
// A tool that prints figures, not a test.
//
//   submit-bench [--submits N] [--threads T] [--nodes N] [--dir DIR] [--json FILE]
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ddl/v1/ddl.grpc.pb.h"
#include "rpc/server.h"
#include "service/blocking_coordinator.h"
#include "state/sqlite_store.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using namespace ddl;

// Stands in for an agent's stream: the jobs really start (GPUs fill up, the queue grows behind them), the
// commands go nowhere.
class NullLink : public coordinator::AgentLink {
 public:
  void send(const v1::Command&) override {}
  void close() override {}
};

struct Result {
  int threads = 0, submits = 0;
  double median_us = 0, p99_us = 0, per_second = 0;
};

Result run(const std::string& address, int threads, int per_thread) {
  std::vector<std::vector<double>> lat(threads);
  std::vector<std::thread> pool;
  auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto stub = v1::UserService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
      v1::SubmitRequest req;
      v1::JobSpec* s = req.mutable_spec();
      s->set_user("bench");
      s->set_nodes(4);
      s->set_gpus_per_node(4);
      for (const char* a : {"python3", "train.py", "--arch=resnet50", "--epochs=90"}) s->add_command(a);
      s->add_env("OMP_NUM_THREADS=4");
      for (int i = 0; i < per_thread; ++i) {
        v1::SubmitResponse resp;
        grpc::ClientContext ctx;
        auto s0 = Clock::now();
        grpc::Status st = stub->Submit(&ctx, req, &resp);
        lat[t].push_back(std::chrono::duration<double, std::micro>(Clock::now() - s0).count());
        if (!st.ok()) {
          std::fprintf(stderr, "submit failed: %s\n", st.error_message().c_str());
          std::exit(1);
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  Result r;
  r.threads = threads;
  r.submits = static_cast<int>(all.size());
  r.median_us = all[all.size() / 2];
  r.p99_us = all[std::min(all.size() - 1, static_cast<size_t>(0.99 * (all.size() - 1) + 0.5))];
  r.per_second = r.submits / total_s;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int submits = 1000, threads = 4, nodes = 1000;
  std::string dir_arg, json_path;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--submits N] [--threads T] [--nodes N] [--dir DIR] [--json FILE]\n", argv[0]);
      return 2;
    }
    std::string v = argv[++i];
    if (a == "--submits") submits = std::atoi(v.c_str());
    else if (a == "--threads") threads = std::atoi(v.c_str());
    else if (a == "--nodes") nodes = std::atoi(v.c_str());
    else if (a == "--dir") dir_arg = v;
    else if (a == "--json") json_path = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (submits < threads || threads < 1 || nodes < 4) {
    std::fprintf(stderr, "need --submits >= --threads >= 1 and --nodes >= 4\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  std::string tmpl = ((dir_arg.empty() ? fs::temp_directory_path() : fs::path(dir_arg)) / "ddl-submit-bench-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    std::perror(tmpl.c_str());
    return 1;
  }
  state::SqliteStore::Options o;
  o.path = tmpl + "/state.db";
  auto store = state::SqliteStore::open(o);
  if (!store) {
    std::fprintf(stderr, "%s\n", store.status().toString().c_str());
    return 1;
  }
  coordinator::CoordinatorOptions options;
  options.heartbeat_grace_ms = 3600 * 1000;  // the fake nodes never heartbeat
  coordinator::BlockingCoordinator coord(**store, options);
  if (!coord.recover()) return 1;
  for (int n = 0; n < nodes; ++n) {
    v1::RegisterRequest req;
    req.set_node("n" + std::to_string(n));
    req.set_address("10.1." + std::to_string(n / 250) + "." + std::to_string(n % 250));
    for (int g = 0; g < 4; ++g) req.add_gpus()->set_index(g);
    (*req.mutable_labels())["switch"] = "s" + std::to_string(n % 32);
    auto resp = coord.registerAgent(req);
    if (!resp || !coord.attachAgent(req.node(), resp->session(), std::make_shared<NullLink>())) return 1;
  }
  coordinator::SecurityOptions security;
  security.insecure = true;  // loopback; measures the service, not TLS
  coordinator::RpcServer server(coord, security);
  std::string address;
  if (auto st = server.start("127.0.0.1:0", &address); !st) {
    std::fprintf(stderr, "%s\n", st.message().c_str());
    return 1;
  }
  coord.start();
  std::printf("# submit through gRPC to an in-process coordinator on %s: %d nodes x 4 GPUs, SQLite in %s\n",
              address.c_str(), nodes, tmpl.c_str());
  std::vector<Result> results = {run(address, 1, submits), run(address, threads, submits / threads)};
  std::printf("%-8s %8s %12s %12s %12s\n", "threads", "submits", "median_us", "p99_us", "submits/s");
  for (const auto& r : results) {
    std::printf("%-8d %8d %12.1f %12.1f %12.0f\n", r.threads, r.submits, r.median_us, r.p99_us, r.per_second);
  }
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << "{\"benchmark\":\"submit\",\"nodes\":" << nodes << ",\"results\":[";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      out << (i ? "," : "") << "{\"threads\":" << r.threads << ",\"submits\":" << r.submits
          << ",\"median_us\":" << r.median_us << ",\"p99_us\":" << r.p99_us << ",\"per_second\":" << r.per_second
          << "}";
    }
    out << "]}\n";
  }
  coord.stop();
  server.shutdown();
  fs::remove_all(tmpl);
  return 0;
}
