// sched-sim: a shared cluster's queue through the scheduler's own policy (placement/sched_sim.h: prioritize()
// and schedule(), backfill included) in virtual time, FIFO beside fair-share on the same trace. Prints
// figures (and JSON with --json FILE); it asserts nothing.
//
// The trace is issue 41's scenario unless --trace FILE gives one: 2 nodes x 4 GPUs (--nodes, --gpus);
// accounts a and b with shares 2 and 1, each with a backlog larger than the cluster from t = 0 (jobs of 1, 2
// and 4 GPUs running 5 to 20 s); account c, share 1, arriving at half time with a backlog of its own;
// --minutes of virtual time (10). A trace file has one job per line: "SUBMIT_S ACCOUNT USER GPUS RUN_S", and
// the accounts' shares come from --share ACCOUNT=N (default 1 each, all under root).
//
// Figures per policy: GPU-seconds delivered per account and their ratio to the shares, utilisation, wait from
// submit to start (p50, p99), Jain's fairness index of delivered over share, and the first start of each
// account after its first submit. The third policy is fair-share with preemption: the latecomer's jobs (the
// built-in trace's account c, or --urgent ACCOUNT) ask for QoS urgent (priority 100), which may preempt
// normal, whose grace is --grace seconds (5); a victim goes back to the queue with the run time it had left.
// The figures add the preemptions. In the first two policies those jobs are normal. The fourth is fair-share
// preemption (fairshare_preemption in the coordinator's config): no QoS, a job of an account under its share
// preempts jobs of accounts over theirs (preemption.h's planPreemption).
//
// Usage: sched-sim [--minutes M] [--nodes N] [--gpus G] [--half-life-days D] [--trace FILE]
//                  [--share ACCOUNT=N]... [--urgent ACCOUNT] [--grace S] [--json FILE]
#include "placement/sched_sim.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

using namespace ddl::placement;

namespace {

struct Args {
  double minutes = 10;
  int nodes = 2, gpus = 4;
  double half_life_days = 7;
  std::string trace, json;
  std::map<std::string, int64_t> shares;
  std::string urgent;  // the account whose jobs are urgent with preemption; "" c for the built-in trace
  int64_t grace_s = 5;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "sched-sim: %s\nusage: sched-sim [--minutes M] [--nodes N] [--gpus G] [--half-life-days D] "
               "[--trace FILE] [--share ACCOUNT=N]... [--urgent ACCOUNT] [--grace S] [--json FILE]\n",
               why);
  std::exit(2);
}

Args parseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((flag + " needs a value").c_str());
      return argv[++i];
    };
    if (flag == "--minutes") {
      a.minutes = std::atof(value().c_str());
    } else if (flag == "--nodes") {
      a.nodes = std::atoi(value().c_str());
    } else if (flag == "--gpus") {
      a.gpus = std::atoi(value().c_str());
    } else if (flag == "--half-life-days") {
      a.half_life_days = std::atof(value().c_str());
    } else if (flag == "--trace") {
      a.trace = value();
    } else if (flag == "--urgent") {
      a.urgent = value();
    } else if (flag == "--grace") {
      a.grace_s = std::atoll(value().c_str());
      if (a.grace_s < 0) usage("--grace wants seconds, 0 or more");
    } else if (flag == "--json") {
      a.json = value();
    } else if (flag == "--share") {
      const std::string v = value();
      const size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0 || std::atoll(v.c_str() + eq + 1) < 1)
        usage("--share wants ACCOUNT=N");
      a.shares[v.substr(0, eq)] = std::atoll(v.c_str() + eq + 1);
    } else {
      usage(("unknown flag " + flag).c_str());
    }
  }
  if (a.minutes <= 0 || a.nodes < 1 || a.gpus < 1 || a.half_life_days <= 0) usage("give positive numbers");
  return a;
}

std::vector<SimJob> readTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) usage(("cannot read " + path + ": " + std::strerror(errno)).c_str());
  std::vector<SimJob> trace;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    double submit_s = 0, run_s = 0;
    SimJob job;
    if (!(words >> submit_s >> job.account >> job.user >> job.gpus >> run_s) || job.gpus < 1 || run_s <= 0) {
      usage((path + ":" + std::to_string(n) + ": want SUBMIT_S ACCOUNT USER GPUS RUN_S").c_str());
    }
    job.id = "t" + std::to_string(n);
    job.submit_ms = static_cast<int64_t>(submit_s * 1000);
    job.run_ms = static_cast<int64_t>(run_s * 1000);
    trace.push_back(job);
  }
  return trace;
}

int64_t percentile(std::vector<int64_t> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parseArgs(argc, argv);
  SimOptions options;
  for (int i = 0; i < args.nodes; ++i) {
    Node n;
    n.name = "n" + std::to_string(i + 1);
    n.gpus = args.gpus;
    n.used.assign(args.gpus, false);
    options.cluster.nodes.push_back(n);
  }
  options.end_ms = static_cast<int64_t>(args.minutes * 60000);
  options.half_life_s = args.half_life_days * 86400;
  std::vector<SimJob> trace;
  if (args.trace.empty()) {
    if (args.shares.empty()) args.shares = {{"a", 2}, {"b", 1}, {"c", 1}};
    const int count = static_cast<int>(args.minutes * 60 * args.nodes * args.gpus / 12) + 10;
    for (const auto& [account, user, jobs, at_ms] : {std::tuple{"a", "alice", count, int64_t{0}},
                                                     {"b", "bob", count, int64_t{0}},
                                                     {"c", "carl", count / 2, options.end_ms / 2}}) {
      for (SimJob& j : backlog(account, user, jobs, at_ms)) trace.push_back(std::move(j));
    }
  } else {
    trace = readTrace(args.trace);
  }
  std::map<std::string, int64_t> first_submit;
  for (const SimJob& j : trace) {
    auto [it, fresh] = first_submit.try_emplace(j.account, j.submit_ms);
    if (!fresh) it->second = std::min(it->second, j.submit_ms);
    args.shares.try_emplace(j.account, 1);
  }
  for (const auto& [account, share] : args.shares) options.tree.accounts[account] = {kRootAccount, share};

  std::printf("%d nodes x %d GPUs, %zu jobs, %.1f virtual minutes, usage half-life %.3g days\n", args.nodes,
              args.gpus, trace.size(), args.minutes, args.half_life_days);
  nlohmann::json json = {{"nodes", args.nodes},
                         {"gpus_per_node", args.gpus},
                         {"jobs", trace.size()},
                         {"minutes", args.minutes},
                         {"policies", nlohmann::json::array()}};
  double total_share = 0;
  for (const auto& [account, share] : args.shares) total_share += share;
  if (args.urgent.empty() && args.trace.empty()) args.urgent = "c";
  options.tree.qos["urgent"] = {100, {kNormalQos}, 60, 0, {}};
  options.tree.qos[kNormalQos].grace_s = args.grace_s;
  std::vector<SimJob> urgent_trace = trace;
  for (SimJob& j : urgent_trace) {
    if (j.account == args.urgent) j.qos = "urgent";
  }
  for (const char* policy : {"fifo", "fair-share", "fair-share+preemption", "fair-share+share-preemption"}) {
    const bool fair = std::string(policy) != "fifo", preempt = std::string(policy) == "fair-share+preemption";
    const bool by_share = std::string(policy) == "fair-share+share-preemption";
    options.fair_share = fair;
    options.preemption = preempt || by_share;
    options.tree.share_preemption = by_share;
    const SimResult r = simulate(preempt ? urgent_trace : trace, options);
    double delivered = 0;
    for (const auto& [account, gpu_s] : r.gpu_seconds) delivered += gpu_s;
    const double p50 = percentile(r.waits_ms, 0.5) / 1000.0, p99 = percentile(r.waits_ms, 0.99) / 1000.0;
    std::printf("\n%s: utilisation %.3f, wait p50 %.1f s, p99 %.1f s, Jain's index %.3f, %d started",
                fair ? policy : "FIFO", r.utilisation, p50, p99, r.jain, r.started);
    if (preempt)
      std::printf(", %d preemptions (%s's jobs urgent, normal's grace %lld s)", r.preemptions,
                  args.urgent.c_str(), static_cast<long long>(args.grace_s));
    if (by_share)
      std::printf(", %d preemptions (to even out the shares; normal's grace %lld s)", r.preemptions,
                  static_cast<long long>(args.grace_s));
    std::printf("\n");
    std::printf("  %-10s %6s %12s %10s %10s %16s\n", "ACCOUNT", "SHARE", "GPU-SECONDS", "PART", "OF SHARE",
                "FIRST START (s)");
    nlohmann::json accounts = nlohmann::json::array();
    for (const auto& [account, share] : args.shares) {
      auto got = r.gpu_seconds.find(account);
      const double gpu_s = got == r.gpu_seconds.end() ? 0 : got->second;
      const double part = delivered > 0 ? gpu_s / delivered : 0;
      auto started = r.first_start_ms.find(account);
      const double after_s =
          started == r.first_start_ms.end() ? -1 : (started->second - first_submit[account]) / 1000.0;
      std::printf("  %-10s %6lld %12.0f %10.3f %10.3f %16.1f\n", account.c_str(),
                  static_cast<long long>(share), gpu_s, part, part / (share / total_share), after_s);
      accounts.push_back(
          {{"account", account}, {"share", share}, {"gpu_seconds", gpu_s}, {"first_start_after_s", after_s}});
    }
    json["policies"].push_back({{"policy", policy},
                                {"preemptions", r.preemptions},
                                {"utilisation", r.utilisation},
                                {"wait_p50_s", p50},
                                {"wait_p99_s", p99},
                                {"jain", r.jain},
                                {"accounts", accounts}});
  }
  if (!args.json.empty()) {
    std::ofstream out(args.json);
    out << json.dump(2) << "\n";
    if (!out) {
      std::fprintf(stderr, "sched-sim: cannot write %s\n", args.json.c_str());
      return 1;
    }
  }
  return 0;
}
