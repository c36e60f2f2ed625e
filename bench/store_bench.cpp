// store_bench: what durability costs in the coordinator's SQLite state store.
//
// Measures, against a fresh database in a temporary directory (or --dir):
//  - submit-to-acknowledge latency: the time a one-job batch (DirectStore::createJob) takes to return, which
//    is when a submit may be acknowledged (the row is committed and the WAL fsync'ed, synchronous=FULL);
//    median and p99;
//  - submits per second, from one thread and from --threads threads at once (calls are serialised inside the
//    store, so more threads mostly measure contention);
//  - list latency: DirectStore::listJobs() over --list-jobs jobs (all of them, and a state filter matching
//  100).
// The figures depend mostly on the disk's fsync latency; run it on the disk the coordinator will use. It is a
// tool that prints numbers, not a test: nothing here asserts on time.
//
//  - group commit: batches of --batch jobs in one applyBatch (what the coordinator does under load): the
//    batch's latency and jobs per second.
// With --etcd HOST:PORT[,HOST:PORT...] the same figures for EtcdStore over that etcd cluster (each part under
// a prefix of its own, /ddl-store-bench-PID-PART/, left there; the list part is skipped as slow by design:
// etcd has no index). Start a member with .cache/etcd/usr/bin/etcd (scripts/bootstrap unpacks it).
//
//   store_bench [--submits N] [--threads T] [--list-jobs N] [--batch N] [--dir DIR] [--etcd ENDPOINTS]
//               [--json FILE]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "state/direct_store.h"
#include "state/sqlite_store.h"
#ifdef DDL_HAVE_ETCD
#include "state/etcd_store.h"
#endif

namespace {

using ddl::state::DirectStore;
using ddl::state::JobSpec;
using ddl::state::SqliteStore;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

double usSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

JobSpec benchSpec(int i) {
  JobSpec s;
  s.name = "bench-" + std::to_string(i);
  s.user = i % 2 ? "alice" : "bob";
  s.nodes = 4;
  s.gpus_per_node = 4;
  s.total_gpus = 16;
  s.max_restarts = 1;
  s.env = {"OMP_NUM_THREADS=4", "NCCL_DEBUG=WARN", "DATA=/datasets/imagenet"};
  s.workdir = "/home/alice/resnet";
  s.command = {"python3", "train.py", "--arch=resnet50", "--epochs=90", "--batch-size=256"};
  return s;
}

struct SubmitResult {
  int threads = 0;
  int submits = 0;
  double median_us = 0, p99_us = 0, per_second = 0;
};

// `threads` threads each submit `per_thread` jobs; every call's latency is recorded.
SubmitResult benchSubmits(DirectStore& store, int threads, int per_thread) {
  std::vector<std::vector<double>> lat(threads);
  std::vector<std::thread> pool;
  auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      lat[t].reserve(per_thread);
      for (int i = 0; i < per_thread; ++i) {
        auto s = Clock::now();
        auto job = store.createJob(benchSpec(i));
        lat[t].push_back(usSince(s));
        if (!job.isOk()) {
          std::fprintf(stderr, "createJob failed: %s\n", job.status().toString().c_str());
          std::exit(1);
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  double total_s = usSince(t0) / 1e6;
  std::vector<double> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  SubmitResult r;
  r.threads = threads;
  r.submits = threads * per_thread;
  r.median_us = percentile(all, 0.5);
  r.p99_us = percentile(all, 0.99);
  r.per_second = r.submits / total_s;
  return r;
}

struct ListResult {
  std::string what;
  size_t jobs_returned = 0;
  double median_us = 0, p99_us = 0;
};

ListResult benchList(DirectStore& store, const std::string& what, const ddl::state::JobFilter& filter,
                     int reps) {
  std::vector<double> lat;
  ListResult r;
  r.what = what;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    auto jobs = store.listJobs(filter);
    lat.push_back(usSince(t0));
    if (!jobs.isOk()) {
      std::fprintf(stderr, "listJobs failed: %s\n", jobs.status().toString().c_str());
      std::exit(1);
    }
    r.jobs_returned = jobs->size();
  }
  r.median_us = percentile(lat, 0.5);
  r.p99_us = percentile(lat, 0.99);
  return r;
}

// A store driven one change at a time (DirectStore: each submit is a batch of one, committed, and for SQLite
// fsync'ed, before it returns, as the coordinator's group commit does for a batch).
struct BenchStore {
  std::unique_ptr<ddl::state::Store> backing;
  std::unique_ptr<DirectStore> calls;
  DirectStore* operator->() { return calls.get(); }
  DirectStore& operator*() { return *calls; }
};

// The store for one part of the run: a file of its own in `dir`, or a prefix of its own in etcd.
BenchStore openStore(const fs::path& dir, const std::string& part, const std::vector<std::string>& etcd) {
  BenchStore store;
  if (etcd.empty()) {
    SqliteStore::Options o;
    o.path = (dir / (part + ".db")).string();
    auto s = SqliteStore::open(o);
    if (!s.isOk()) {
      std::fprintf(stderr, "%s\n", s.status().toString().c_str());
      std::exit(1);
    }
    store.backing = std::move(s).value();
  } else {
#ifdef DDL_HAVE_ETCD
    ddl::state::EtcdStore::Options o;
    o.endpoints = etcd;
    o.prefix = "/ddl-store-bench-" + std::to_string(::getpid()) + "-" + part + "/";
    auto s = ddl::state::EtcdStore::open(o);
    if (!s.isOk()) {
      std::fprintf(stderr, "%s\n", s.status().toString().c_str());
      std::exit(1);
    }
    store.backing = std::move(s).value();
#endif
  }
  store.calls = std::make_unique<DirectStore>(*store.backing);
  return store;
}

struct BatchResult {
  int batch = 0;
  int batches = 0;
  double median_ms = 0, p99_ms = 0, jobs_per_second = 0;
  double requests_per_batch = 0;  // etcd: requests sent per batch (one transaction each; 0 on SQLite)
};

// `batches` batches of `per_batch` new jobs, each one applyBatch, as the coordinator's group commit writes
// them.
BatchResult benchBatches(
    DirectStore& store, int batches, int per_batch,
    const std::function<int64_t()>& requests = [] { return int64_t{0}; }) {
  std::vector<double> lat;
  int64_t next = store.lastJobNumber().value() + 1;
  const int64_t requests_before = requests();
  const auto t0 = Clock::now();
  for (int b = 0; b < batches; ++b) {
    std::vector<ddl::state::Write> batch;
    for (int i = 0; i < per_batch; ++i) {
      ddl::state::Write w;
      w.job = ddl::state::newJob(ddl::state::formatJobId(next++), benchSpec(i), 0);
      w.new_job = true;
      batch.push_back(std::move(w));
    }
    const auto s = Clock::now();
    if (auto st = store.applyBatch(batch); !st.isOk()) {
      std::fprintf(stderr, "applyBatch failed: %s\n", st.toString().c_str());
      std::exit(1);
    }
    lat.push_back(usSince(s) / 1000);
  }
  BatchResult r;
  r.batch = per_batch;
  r.batches = batches;
  r.median_ms = percentile(lat, 0.5);
  r.p99_ms = percentile(lat, 0.99);
  r.jobs_per_second = batches * per_batch / (usSince(t0) / 1e6);
  r.requests_per_batch = static_cast<double>(requests() - requests_before) / batches;
  return r;
}

// The listing figures over SQLite: list_jobs jobs, 100 of them SCHEDULED, read all and by state.
std::vector<ListResult> benchListing(const fs::path& dir, int list_jobs) {
  std::vector<ListResult> list_results;
  auto store = openStore(dir, "list", {});
  std::printf("# filling %d jobs for the list benchmark...\n", list_jobs);
  std::fflush(stdout);
  benchSubmits(*store, 1, list_jobs);
  for (int i = 1; i <= 100; ++i) {
    auto r = store->transition(ddl::state::formatJobId(i * (list_jobs / 100)),
                               ddl::state::JobState::kScheduled, "bench");
    if (!r.isOk()) {
      std::fprintf(stderr, "%s\n", r.status().toString().c_str());
      std::exit(1);
    }
  }
  list_results.push_back(benchList(*store, "all", {}, 20));
  list_results.push_back(benchList(*store, "state=SCHEDULED", {{ddl::state::JobState::kScheduled}, {}}, 50));
  return list_results;
}

// The figures as JSON in `path`; false (said on stderr) when it cannot be written.
bool writeJson(const std::string& path, bool on_etcd, const BatchResult& batched,
               const std::vector<SubmitResult>& submit_results, const std::vector<ListResult>& list_results,
               int list_jobs) {
  std::ofstream out(path);
  out << "{\n  \"store\": \"" << (on_etcd ? "etcd" : "sqlite") << "\""
      << (on_etcd ? "" : ", \"journal_mode\": \"wal\", \"synchronous\": \"full\"")
      << ",\n  \"batched\": {\"batch\": " << batched.batch << ", \"batches\": " << batched.batches
      << ", \"median_ms\": " << batched.median_ms << ", \"p99_ms\": " << batched.p99_ms
      << ", \"jobs_per_s\": " << batched.jobs_per_second
      << ", \"requests_per_batch\": " << batched.requests_per_batch << "},\n  \"submit\": [\n";
  for (size_t i = 0; i < submit_results.size(); ++i) {
    const auto& r = submit_results[i];
    out << "    {\"threads\": " << r.threads << ", \"submits\": " << r.submits
        << ", \"median_us\": " << r.median_us << ", \"p99_us\": " << r.p99_us
        << ", \"submits_per_s\": " << r.per_second << "}" << (i + 1 < submit_results.size() ? ",\n" : "\n");
  }
  out << "  ],\n  \"list\": [\n";
  for (size_t i = 0; i < list_results.size(); ++i) {
    const auto& r = list_results[i];
    out << "    {\"filter\": \"" << r.what << "\", \"total_jobs\": " << list_jobs
        << ", \"jobs_returned\": " << r.jobs_returned << ", \"median_us\": " << r.median_us
        << ", \"p99_us\": " << r.p99_us << "}" << (i + 1 < list_results.size() ? ",\n" : "\n");
  }
  out << "  ]\n}\n";
  if (!out) std::fprintf(stderr, "cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  int submits = 2000, threads = 4, list_jobs = 10000, batch = 100;
  std::string dir_arg, json_path;
  std::vector<std::string> etcd;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--submits")
      submits = std::atoi(next().c_str());
    else if (a == "--threads")
      threads = std::atoi(next().c_str());
    else if (a == "--list-jobs")
      list_jobs = std::atoi(next().c_str());
    else if (a == "--dir")
      dir_arg = next();
    else if (a == "--json")
      json_path = next();
    else if (a == "--batch")
      batch = std::atoi(next().c_str());
    else if (a == "--etcd") {
      std::string list = next();
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) etcd.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
#ifndef DDL_HAVE_ETCD
      std::fprintf(stderr, "--etcd: this build has no etcd client (scripts/bootstrap fetches it)\n");
      return 2;
#endif
    } else {
      std::fprintf(stderr,
                   "usage: %s [--submits N] [--threads T] [--list-jobs N] [--batch N] [--dir DIR] "
                   "[--etcd HOST:PORT[,...]] [--json FILE]\n",
                   argv[0]);
      return 2;
    }
  }
  if (submits < threads || threads < 1 || list_jobs < 100 || batch < 1) {
    std::fprintf(stderr, "need --submits >= --threads >= 1, --list-jobs >= 100 and --batch >= 1\n");
    return 2;
  }

  std::string tmpl =
      ((dir_arg.empty() ? fs::temp_directory_path() : fs::path(dir_arg)) / "ddl-store-bench-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    std::perror(tmpl.c_str());
    return 1;
  }
  const fs::path dir = tmpl;
  if (etcd.empty()) {
    std::printf("# SqliteStore benchmark in %s (WAL, synchronous=FULL)\n", dir.c_str());
  } else {
    std::printf("# EtcdStore benchmark against %s (prefixes /ddl-store-bench-%d-*/)\n", etcd.front().c_str(),
                static_cast<int>(::getpid()));
  }

  std::vector<SubmitResult> submit_results;
  {
    auto store = openStore(dir, "single", etcd);
    submit_results.push_back(benchSubmits(*store, 1, submits));
  }
  {
    auto store = openStore(dir, "multi", etcd);
    submit_results.push_back(benchSubmits(*store, threads, submits / threads));
  }
  std::printf("%-8s %8s %14s %14s %12s\n", "threads", "submits", "median_us", "p99_us", "submits/s");
  for (const auto& r : submit_results) {
    std::printf("%-8d %8d %14.1f %14.1f %12.0f\n", r.threads, r.submits, r.median_us, r.p99_us, r.per_second);
  }

  BatchResult batched;
  {
    auto store = openStore(dir, "batch", etcd);
    // Requests to etcd per batch: one transaction, meta/last_job raised inside it (the counter is read once,
    // by a first batch before the measured ones).
    std::function<int64_t()> requests = [] { return int64_t{0}; };
#ifdef DDL_HAVE_ETCD
    if (auto* e = dynamic_cast<ddl::state::EtcdStore*>(store.backing.get())) {
      requests = [e] { return e->requests(); };
      benchBatches(*store, 1, 1);
    }
#endif
    batched = benchBatches(*store, std::max(5, submits / batch), batch, requests);
  }
  std::printf("%-8s %8s %14s %14s %12s %14s\n", "batch", "batches", "median_ms", "p99_ms", "jobs/s",
              "requests/batch");
  std::printf("%-8d %8d %14.2f %14.2f %12.0f %14.2f\n", batched.batch, batched.batches, batched.median_ms,
              batched.p99_ms, batched.jobs_per_second, batched.requests_per_batch);

  const std::vector<ListResult> list_results =
      etcd.empty() ? benchListing(dir, list_jobs) : std::vector<ListResult>{};
  std::printf("%-16s %8s %14s %14s\n", "list", "jobs", "median_us", "p99_us");
  for (const auto& r : list_results) {
    std::printf("%-16s %8zu %14.1f %14.1f\n", r.what.c_str(), r.jobs_returned, r.median_us, r.p99_us);
  }

  std::error_code ec;
  fs::remove_all(dir, ec);

  if (!json_path.empty() &&
      !writeJson(json_path, !etcd.empty(), batched, submit_results, list_results, list_jobs))
    return 1;
  return 0;
}
