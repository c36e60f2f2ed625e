// usage_bench: what the accounting rollups (coordinator/service/usage_book.h) cost a coordinator at their
// bound. Fills a fresh SQLite store with --rollups daily rollups (usage_daily entries: --days days of --pairs
// (account, user) pairs), then measures recovery (BlockingCoordinator::recover, which reads every rollup
// back) against the same store without them, and `ddlctl usage`'s queries over them: a week per user, the
// whole retention per account, and the dashboard's 30 days per account and day. A tool that prints figures
// (and JSON with --json), not a test.
//
//   usage-bench [--days N] [--pairs N] [--dir DIR] [--json FILE]
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "service/blocking_coordinator.h"
#include "state/sqlite_store.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;
using namespace ddl;

double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A coordinator recovered over the store at `path`: the time recover() took, in ms.
double recoverMs(const std::string& path, std::unique_ptr<coordinator::BlockingCoordinator>* out) {
  state::SqliteStore::Options o;
  o.path = path;
  auto store = state::SqliteStore::open(o);
  if (!store) {
    std::fprintf(stderr, "%s\n", store.status().toString().c_str());
    std::exit(1);
  }
  static std::vector<std::unique_ptr<state::SqliteStore>> stores;  // outlive their coordinators
  stores.push_back(std::move(*store));
  coordinator::CoordinatorOptions options;
  options.accounting.retention_days = 36500;  // the figures are in the past: keep them all
  auto c = std::make_unique<coordinator::BlockingCoordinator>(*stores.back(), options);
  const auto t0 = Clock::now();
  if (!c->recover()) std::exit(1);
  const double ms = msSince(t0);
  if (out != nullptr) *out = std::move(c);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  int days = 400, pairs = 500;
  std::string dir_arg, json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "usage: %s [--days N] [--pairs N] [--dir DIR] [--json FILE]\n", argv[0]);
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--days")
      days = std::atoi(v.c_str());
    else if (a == "--pairs")
      pairs = std::atoi(v.c_str());
    else if (a == "--dir")
      dir_arg = v;
    else if (a == "--json")
      json_path = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (days < 7 || pairs < 1) {
    std::fprintf(stderr, "need --days >= 7 and --pairs >= 1\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::warn);
  std::string tmpl =
      ((dir_arg.empty() ? fs::temp_directory_path() : fs::path(dir_arg)) / "ddl-usage-bench-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    std::perror(tmpl.c_str());
    return 1;
  }
  const std::string empty_path = tmpl + "/empty.db", full_path = tmpl + "/full.db";
  std::unique_ptr<coordinator::BlockingCoordinator> c;
  const double empty_ms = recoverMs(empty_path, nullptr);

  // The rollups as the coordinator writes them, a thousand entries a batch, ending today.
  const int64_t today = utcDayOf(state::systemNowMs());
  {
    state::SqliteStore::Options o;
    o.path = full_path;
    auto store = state::SqliteStore::open(o);
    if (!store) return 1;
    std::vector<state::Write> batch;
    const auto t0 = Clock::now();
    for (int d = 0; d < days; ++d) {
      for (int p = 0; p < pairs; ++p) {
        const nlohmann::json value = {{"gpu_s", 3600.0 * (1 + p % 8)},
                                      {"cpu_s", 7200.0},
                                      {"attempts", 3},
                                      {"jobs", 2},
                                      {"failed", 0},
                                      {"requeued", 1},
                                      {"max_rss_bytes", 1 << 30}};
        batch.push_back(state::Write::putEntry(
            {"usage_daily",
             utcDayText(today - d) + ":acct" + std::to_string(p % 100) + ":user" + std::to_string(p),
             value.dump()}));
        if (batch.size() == 1000) {
          if (auto st = (*store)->applyBatch(batch); !st) {
            std::fprintf(stderr, "%s\n", st.toString().c_str());
            return 1;
          }
          batch.clear();
        }
      }
    }
    if (!batch.empty() && !(*store)->applyBatch(batch)) return 1;
    std::printf("# %d rollups (%d days x %d account-user pairs) written in %.1f s, SQLite in %s\n",
                days * pairs, days, pairs, msSince(t0) / 1000, tmpl.c_str());
  }
  const double full_ms = recoverMs(full_path, &c);

  struct Query {
    const char* what;
    int days;
    bool by_account, daily;
  };
  const Query queries[] = {{"7 days by user", 7, false, false},
                           {"all days by account", days, true, false},
                           {"30 days by account and day", 30, true, true}};
  nlohmann::json out = {{"benchmark", "usage"},
                        {"rollups", days * pairs},
                        {"recover_empty_ms", empty_ms},
                        {"recover_with_rollups_ms", full_ms},
                        {"queries", nlohmann::json::array()}};
  std::printf("%-28s %10s\n%-28s %10.1f\n%-28s %10.1f\n", "recover", "ms", "without rollups", empty_ms,
              "with them", full_ms);
  std::printf("%-28s %8s %10s %10s\n", "query", "rows", "median_ms", "max_ms");
  for (const Query& q : queries) {
    v1::GetUsageRequest req;
    req.set_since_ms(state::systemNowMs() - (q.days - 1) * 86400000LL);
    req.set_by_account(q.by_account);
    req.set_daily(q.daily);
    std::vector<double> ms;
    int rows = 0;
    for (int i = 0; i < 11; ++i) {
      const auto t0 = Clock::now();
      auto r = c->usage(req);
      ms.push_back(msSince(t0));
      if (!r) return 1;
      rows = r->rows_size();
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-28s %8d %10.2f %10.2f\n", q.what, rows, ms[ms.size() / 2], ms.back());
    out["queries"].push_back(
        {{"query", q.what}, {"rows", rows}, {"median_ms", ms[ms.size() / 2]}, {"max_ms", ms.back()}});
  }
  c.reset();
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  fs::remove_all(tmpl);
  return 0;
}
