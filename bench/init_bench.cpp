// init-bench: how long a communicator takes to start, at 64 to 512 ranks on one machine. The ranks are threads
// of this process, each with its own TcpStore client and UcxTransport (its own UCX context and worker), meeting
// through one TcpStoreServer on 127.0.0.1, as the ranks of a real job meet through rank 0's: the store traffic,
// the gather and the UCX set-up are the real ones; only the processes are threads. Threads start together;
// "init" is from the start until the last rank's transport is ready; "first allreduce" is one ring allreduce of
// one float after that (with lazy endpoints this is when the ring's endpoints are made). Median of --reps runs.
//
//   init-bench [--ranks 64,128,256,512] [--reps 3] [--tls sm] [--no-allreduce] [--json]
//   init-bench --store-only BYTES | --store-table BYTES   the store's part alone, records of BYTES: every rank
//                                                         gathers, or rank 0 gathers and publishes one table
//
// --tls sets UCX_TLS for this process (default: UCX's own choice). It uses only what both the bootstrap before
// the one-round gather and after it provide, so the same file measures either (docs/benchmarks.md).
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "env.h"
#include "error.h"
#include "rendezvous/store.h"
#include "transport/ucx_transport.h"

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0, Clock::time_point t) { return std::chrono::duration<double>(t - t0).count(); }

// Threads wait here until all have arrived (std::barrier without its C++20 library dependency).
class Latch {
 public:
  explicit Latch(int n) : left_(n) {}
  void arriveAndWait() {
    std::unique_lock<std::mutex> lock(mu_);
    if (--left_ == 0) {
      cv_.notify_all();
      return;
    }
    cv_.wait(lock, [&] { return left_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

struct Run {
  double init_s = 0;
  double allreduce_s = 0;
  std::string error;
};

// What the bootstrap's store traffic alone costs (no UCX): each rank sets a record of record_bytes and gathers
// all of them. table: rank 0 gathers, then publishes one table that the others get, instead of every rank
// gathering from the server (the two designs for the gather).
enum class StoreOnly { kNo, kGather, kTable };

void storeOnlyRank(int r, int n, ddl::Store& store, size_t record_bytes, StoreOnly how) {
  store.set("boot/" + std::to_string(r), std::string(record_bytes, static_cast<char>('a' + r % 26)));
  std::vector<std::string> keys;
  for (int i = 0; i < n; ++i) keys.push_back("boot/" + std::to_string(i));
  const ddl::Deadline deadline(300000);
  if (how == StoreOnly::kGather) {
    if (store.getMany(keys, deadline).size() != keys.size()) throw std::runtime_error("short gather");
  } else if (r == 0) {
    std::string table;
    for (const std::string& v : store.getMany(keys, deadline)) table += v;
    store.set("table", table);
  } else if (store.get("table", deadline).size() != record_bytes * n) {
    throw std::runtime_error("short table");
  }
}

Run runOnce(int n, bool allreduce, StoreOnly store_only = StoreOnly::kNo, size_t record_bytes = 0) {
  auto server = ddl::startTcpStoreServer("127.0.0.1", 0, "");
  const int port = server->port();
  Latch start(n + 1), ready(n);
  std::vector<Clock::time_point> ready_at(n), reduced_at(n);
  std::vector<std::string> errors(n);
  Clock::time_point t0;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      start.arriveAndWait();
      std::unique_ptr<ddl::Transport> transport;
      std::unique_ptr<ddl::Store> store;
      try {
        store = ddl::connectTcpStore("127.0.0.1", port, ddl::Deadline(300000), "");
        if (store_only != StoreOnly::kNo) {
          storeOnlyRank(r, n, *store, record_bytes, store_only);
        } else {
          transport = ddl::createUcxTransport(r, n, *store, ddl::Deadline(300000), false);
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      ready_at[r] = Clock::now();
      ready.arriveAndWait();  // the others' init stays out of the allreduce's time
      if (!transport || !allreduce) return;
      try {
        ddl::Options opts;
        opts.timeout_ms = 300000;
        opts.algo = ddl::Algo::kRing;
        ddl::Comm comm(std::move(transport), opts);
        float v = 1;
        comm.allReduce(&v, &v, 1, ddlFloat32, ddlSum);
        reduced_at[r] = Clock::now();
        if (v != static_cast<float>(n)) errors[r] = "wrong allreduce result " + std::to_string(v);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  t0 = Clock::now();
  start.arriveAndWait();
  for (auto& t : threads) t.join();
  Run run;
  for (int r = 0; r < n; ++r) {
    if (!errors[r].empty() && run.error.empty()) run.error = "rank " + std::to_string(r) + ": " + errors[r];
  }
  const Clock::time_point last_ready = *std::max_element(ready_at.begin(), ready_at.end());
  run.init_s = secondsSince(t0, last_ready);
  if (allreduce) run.allreduce_s = secondsSince(last_ready, *std::max_element(reduced_at.begin(), reduced_at.end()));
  return run;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

[[noreturn]] void usage(const std::string& why = "") {
  if (!why.empty()) std::fprintf(stderr, "init-bench: %s\n", why.c_str());
  std::fprintf(stderr,
               "usage: init-bench [--ranks 64,128,256,512] [--reps 3] [--tls UCX_TLS] [--no-allreduce] [--json]\n"
               "                  [--store-only BYTES | --store-table BYTES]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {64, 128, 256, 512};
  int reps = 3;
  bool json = false, allreduce = true;
  StoreOnly store_only = StoreOnly::kNo;
  size_t record_bytes = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    // libddl's parsers: a bad value is a ddl::Error naming the flag and its range.
    try {
      if (a == "--ranks") {
        sizes.clear();
        const std::string list = value();
        for (size_t p = 0; p <= list.size();) {
          size_t comma = list.find(',', p);
          if (comma == std::string::npos) comma = list.size();
          sizes.push_back(static_cast<int>(ddl::parseInt(list.substr(p, comma - p), "--ranks", 2, 4096)));
          p = comma + 1;
        }
      } else if (a == "--reps") {
        reps = static_cast<int>(ddl::parseInt(value(), "--reps", 1, 100));
      } else if (a == "--tls") {
        setenv("UCX_TLS", value().c_str(), 1);  // a tool's own process, before any UCX context exists
      } else if (a == "--store-only" || a == "--store-table") {
        // The store's part alone: records of this many bytes, gathered by every rank or through rank 0's table.
        store_only = a == "--store-only" ? StoreOnly::kGather : StoreOnly::kTable;
        record_bytes = static_cast<size_t>(ddl::parseByteCount(value(), a.c_str(), 1, 1 << 20));
        allreduce = false;
      } else if (a == "--no-allreduce") {
        allreduce = false;
      } else if (a == "--json") {
        json = true;
      } else {
        usage("unknown argument '" + a + "'");
      }
    } catch (const ddl::Error& e) {
      usage(e.what());
    }
  }
  // Hundreds of UCX workers in one process hold thousands of descriptors (sockets, shared-memory segments).
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  const char* tls = std::getenv("UCX_TLS");
  if (!json) {
    std::printf("# init-bench: thread ranks over TcpStore + UcxTransport, UCX_TLS=%s, median of %d\n",
                tls ? tls : "(default)", reps);
    std::printf("%8s %12s %16s %20s\n", "ranks", "init s", "per rank ms", "first allreduce s");
  } else {
    std::printf("[");
  }
  bool first = true, failed = false;
  for (int n : sizes) {
    std::vector<double> init, reduce;
    std::string error;
    for (int rep = 0; rep < reps && error.empty(); ++rep) {
      Run run = runOnce(n, allreduce, store_only, record_bytes);
      error = run.error;
      init.push_back(run.init_s);
      reduce.push_back(run.allreduce_s);
    }
    const double init_s = median(init), reduce_s = median(reduce);
    if (!error.empty()) failed = true;
    if (json) {
      std::printf("%s\n  {\"ranks\": %d, \"init_s\": %.6f, \"per_rank_ms\": %.4f, \"first_allreduce_s\": %.6f, "
                  "\"reps\": %zu%s%s%s}",
                  first ? "" : ",", n, init_s, 1000 * init_s / n, reduce_s, init.size(),
                  error.empty() ? "" : ", \"error\": \"", error.empty() ? "" : "see stderr", error.empty() ? "" : "\"");
    } else {
      std::printf("%8d %12.3f %16.3f %20.3f%s\n", n, init_s, 1000 * init_s / n, reduce_s,
                  error.empty() ? "" : "  FAILED (see stderr)");
    }
    if (!error.empty()) std::fprintf(stderr, "init-bench: %d ranks: %s\n", n, error.c_str());
    std::fflush(stdout);
    first = false;
  }
  if (json) std::printf("\n]\n");
  return failed ? 1 : 0;
}
