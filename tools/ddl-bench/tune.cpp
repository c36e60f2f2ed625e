// ddl-bench --tune (tune.h): times every allreduce candidate at each size of the sweep, one communicator per
// candidate, and writes the winners as a tuning table's rules for this rank count and topology.
#include "tune.h"

#include "common/host_port.h"
#include "free_port.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

namespace ddlbench {
namespace {

constexpr int kExitUsage = 2;
constexpr int kExitDdlError = 3;
// A candidate that is at most this much slower than the previous size's winner keeps winning, so noise does not
// split the table into many rules that flip between near-equal settings.
constexpr double kStickiness = 1.03;

struct Candidate {
  const char* algo;
  size_t segment;  // 0: libddl's default
};

std::string human(size_t n) {
  for (auto [suffix, shift] : {std::pair{"G", 30}, {"M", 20}, {"K", 10}}) {
    if (n >= (size_t{1} << shift) && n % (size_t{1} << shift) == 0) return std::to_string(n >> shift) + suffix;
  }
  return std::to_string(n);
}

std::string describe(const Candidate& c) {
  return std::string(c.algo) + (c.segment ? "/" + human(c.segment) : std::string());
}

bool isPrime(int n) {
  if (n < 2) return false;
  for (int f = 2; f * f <= n; ++f) {
    if (n % f == 0) return false;
  }
  return true;
}

// Writes the rules for (nranks, topology) into path, keeping the rules it already holds for other rank counts
// and topologies.
bool writeTable(const std::string& path, int nranks, const std::string& topology,
                const std::vector<std::string>& rules, const std::string& header) {
  std::vector<std::string> kept;
  std::ifstream old(path);
  for (std::string line; std::getline(old, line);) {
    std::istringstream words(line);
    std::string kind, ranks, topo;
    words >> kind >> ranks >> topo;
    if (kind != "allreduce") continue;  // the version line, comments and blank lines are written afresh
    if (ranks == std::to_string(nranks) && topo == topology) continue;
    kept.push_back(line);
  }
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "ddl-bench: cannot write the tuning table %s: %s\n", tmp.c_str(), std::strerror(errno));
    return false;
  }
  std::fprintf(f, "ddl-tune 1\n%s", header.c_str());
  for (const auto& r : rules) std::fprintf(f, "%s\n", r.c_str());
  if (!kept.empty()) std::fprintf(f, "# kept from the previous %s\n", path.c_str());
  for (const auto& r : kept) std::fprintf(f, "%s\n", r.c_str());
  const bool ok = std::fclose(f) == 0 && std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) std::fprintf(stderr, "ddl-bench: cannot write the tuning table %s: %s\n", path.c_str(), std::strerror(errno));
  return ok;
}

// Prints every candidate's time at each size, the winner of each size starred, and returns the winners as
// rules: one per run of sizes with the same winner, the last one up to "inf". us[k][i]: candidate k, size i.
std::vector<std::string> chooseRules(const std::vector<Candidate>& candidates, const std::vector<size_t>& sizes,
                                     const std::vector<std::vector<double>>& us, int nranks,
                                     const std::string& topology, int iters) {
  // The winner per size, then runs of equal winners as rules.
  std::printf("# ddl-bench --tune  ranks %d  topology %s  iters %d  (time in us per allreduce; * = chosen)\n",
              nranks, topology.c_str(), iters);
  std::printf("%10s", "size");
  for (const auto& c : candidates) std::printf(" %12s", describe(c).c_str());
  std::printf("\n");
  std::vector<size_t> winner(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    size_t best = 0;
    for (size_t k = 1; k < candidates.size(); ++k) {
      if (us[k][i] < us[best][i]) best = k;
    }
    if (i > 0 && us[winner[i - 1]][i] <= us[best][i] * kStickiness) best = winner[i - 1];
    winner[i] = best;
    std::printf("%10s", human(sizes[i]).c_str());
    for (size_t k = 0; k < candidates.size(); ++k) std::printf(" %11.1f%c", us[k][i], k == best ? '*' : ' ');
    std::printf("\n");
  }
  std::vector<std::string> rules;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i + 1 < sizes.size() && winner[i + 1] == winner[i]) continue;
    const Candidate& c = candidates[winner[i]];
    const std::string limit = i + 1 == sizes.size() ? "inf" : human(sizes[i]);
    rules.push_back("allreduce " + std::to_string(nranks) + " " + topology + " " + limit + " " + c.algo + " " +
                    (c.segment ? human(c.segment) : "0"));
  }
  return rules;
}

// The comment above a table's rules: what measured them, where and when.
std::string tableHeader(int nranks, const std::string& topology, int iters) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  char when[64] = {};
  const std::time_t now = std::time(nullptr);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&now));
  const char* tls = std::getenv("UCX_TLS");
  return "# " + std::to_string(nranks) + " ranks, topology " + topology + ": ddl-bench --tune on " + host + " at " +
         when + ", UCX_TLS=" + (tls != nullptr ? tls : "(unset)") + ", " + std::to_string(iters) + " iters\n";
}

}  // namespace

double timeAllReduce(ddlComm_t comm, const std::string& who, const void* send, void* recv, size_t count,
                     ddlDataType_t type, ddlRedOp_t op, int warmup, int iters) {
  auto failed = [&](ddlResult_t r) {
    if (r == ddlSuccess) return false;
    std::fprintf(stderr, "ddl-bench: %s: %s\n", who.c_str(), ddlGetLastError(comm));
    return true;
  };
  if (failed(ddlBarrier(comm))) return -1;
  for (int i = 0; i < warmup; ++i) {
    if (failed(ddlAllReduce(send, recv, count, type, op, comm))) return -1;
  }
  if (failed(ddlBarrier(comm))) return -1;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    if (failed(ddlAllReduce(send, recv, count, type, op, comm))) return -1;
  }
  const auto end = std::chrono::steady_clock::now();
  double us = std::chrono::duration<double, std::micro>(end - start).count() / iters;
  if (failed(ddlAllReduce(&us, &us, 1, ddlFloat64, ddlMax, comm))) return -1;
  return us;
}

int runTune(const TuneOptions& o) {
  const char* size_s = std::getenv("DDL_WORLD_SIZE");
  const char* rank_s = std::getenv("DDL_RANK");
  const char* root_s = std::getenv("DDL_ROOT");
  if (size_s == nullptr || rank_s == nullptr || root_s == nullptr) {
    std::fprintf(stderr, "ddl-bench --tune: DDL_WORLD_SIZE, DDL_RANK and DDL_ROOT must be set (use ddlrun)\n");
    return kExitUsage;
  }
  const int nranks = std::atoi(size_s), rank = std::atoi(rank_s);
  const std::string root = root_s;
  const ddl::StatusOr<ddl::HostPort> root_address = ddl::parseHostPort(root, 1);
  const int port = root_address ? root_address->port : 0;
  if (nranks < 2 || port <= 0) {
    std::fprintf(stderr, "ddl-bench --tune: needs 2 or more ranks and DDL_ROOT as HOST:PORT (got %s ranks, %s)\n",
                 size_s, root_s);
    return kExitUsage;
  }
  // mdring has a grid unless the rank count is prime (libddl runs the flat ring then: see mdringGrid).
  const bool grid = !isPrime(nranks);
  // 16 KiB segments: on a slow link (1 Gbit/s, the 2x2 namespace hierarchy) mdring's network dims ran at the
  // link's rate with them and 1.2-2.5x slower with 64 KiB while those went through UCX's rendezvous (libddl
  // now sends them eager over TCP: docs/benchmarks.md); fast fabrics want larger ones.
  std::vector<Candidate> candidates = {{"rhd", 0}, {"ring", 16 << 10}, {"ring", 64 << 10}, {"ring", 256 << 10},
                                       {"ring", 1 << 20}};
  if (grid) {
    for (size_t seg : {size_t{16} << 10, size_t{64} << 10, size_t{256} << 10, size_t{1} << 20}) {
      candidates.push_back({"mdring", seg});
    }
  }
  std::vector<size_t> sizes;
  for (size_t size = o.sweep.min_bytes; size <= o.sweep.max_bytes;) {
    if (size / o.elem_size > 0) sizes.push_back(size);
    if (!bench_next_size(&o.sweep, &size)) break;
  }
  const size_t max_bytes = sizes.empty() ? o.elem_size : sizes.back();
  std::unique_ptr<unsigned char, decltype(&std::free)> buf(
      static_cast<unsigned char*>(std::aligned_alloc(4096, (max_bytes + 4095) / 4096 * 4096)), &std::free);
  if (!buf) {
    std::fprintf(stderr, "ddl-bench --tune: cannot allocate %zu bytes (lower -e)\n", max_bytes);
    return kExitDdlError;
  }
  std::memset(buf.get(), 0, (max_bytes + 4095) / 4096 * 4096);  // zeros: every op costs what it always does

  std::string topology;
  std::vector<std::vector<double>> us(candidates.size(), std::vector<double>(sizes.size(), 0));
  ddlComm_t comm = nullptr;  // the previous candidate's, until the next one is up
  for (size_t k = 0; k < candidates.size(); ++k) {
    std::string root_k = root;
    if (comm != nullptr) {
      // The first candidate meets at DDL_ROOT; each next one at a port rank 0 finds free on its host and
      // sends over the previous communicator, so no port beyond DDL_ROOT's is assumed free.
      std::string port_error;
      int32_t next = rank == 0 ? ddl::tools::findFreePort(INADDR_ANY, &port_error) : 0;
      const bool sent = ddlBroadcast(&next, &next, 1, ddlInt32, 0, comm) == ddlSuccess;
      if (!sent || next <= 0) {
        const std::string why = !sent ? ddlGetLastError(comm)
                                      : "rank 0 found no free TCP port for the next candidate: " + port_error;
        std::fprintf(stderr, "ddl-bench --tune: rank %d: %s\n", rank, why.c_str());
        ddlCommAbort(comm);
        return kExitDdlError;
      }
      ddlCommDestroy(comm);
      comm = nullptr;
      root_k = ddl::formatHostPort(root_address->host, next);
    }
    ddlConfig_t config = DDL_CONFIG_INITIALIZER;
    config.algorithm = candidates[k].algo;
    config.segmentBytes = candidates[k].segment;
    if (ddlCommInitRank(&comm, nranks, rank, root_k.c_str(), &config) != ddlSuccess) {
      std::fprintf(stderr, "ddl-bench --tune: rank %d: candidate %s at %s: %s\n", rank,
                   describe(candidates[k]).c_str(), root_k.c_str(), ddlGetLastError(nullptr));
      return kExitDdlError;
    }
    char topo[256] = {};
    ddlCommGetTopology(comm, topo, sizeof topo);
    topology = topo;
    for (size_t i = 0; i < sizes.size(); ++i) {
      us[k][i] = timeAllReduce(comm, "rank " + std::to_string(rank) + ": --tune candidate " + describe(candidates[k]),
                               buf.get(), buf.get(), sizes[i] / o.elem_size, o.type, o.op, o.sweep.warmup_iters,
                               o.sweep.iters);
      if (us[k][i] < 0) {
        ddlCommAbort(comm);
        return kExitDdlError;
      }
    }
  }
  if (comm != nullptr) ddlCommDestroy(comm);
  if (rank != 0) return 0;

  const std::vector<std::string> rules = chooseRules(candidates, sizes, us, nranks, topology, o.sweep.iters);
  const std::string header = tableHeader(nranks, topology, o.sweep.iters);
  if (!writeTable(o.path, nranks, topology, rules, header)) return kExitUsage;
  std::printf("# wrote %zu rules to %s (use it with DDL_TUNE_FILE=%s):\n", rules.size(), o.path.c_str(),
              o.path.c_str());
  for (const auto& r : rules) std::printf("%s\n", r.c_str());
  return 0;
}

}  // namespace ddlbench
