// Collective algorithms with ranks as threads over LocalTransport: every algorithm, topology, type and op,
// in place and out of place, odd counts, and the failure paths (dead rank, abort, mismatch, timeout).
// Results are compared bit for bit against a reference computed in wide arithmetic, and across ranks.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "dtype.h"
#include "error.h"
#include "transport/local_transport.h"
#include "reduce.h"
#include "test_values.h"
#include "thread_ranks.h"

namespace ddl {
namespace {

using namespace std::chrono_literals;

// segment also sizes shared-memory rounds, so that small counts run many rounds there too.
Options makeOptions(int nranks, Algo algo, const std::string& topo = "", size_t segment = 0, int timeout_ms = 20000) {
  Options o;
  o.algo = algo;
  o.topology = parseTopology(topo, nranks);
  o.segment_bytes = segment;
  o.shm_round_bytes = segment;
  o.timeout_ms = timeout_ms;
  return o;
}

using test_util::expectAllOk;
using test_util::RankResult;
using test_util::runRanks;

// Ranks as threads on nodes of per_node consecutive ranks, which join their nodes' shared memory; per_node 0:
// no store, no shared memory (the transport alone).
std::vector<RankResult> runOnNodes(int nranks, int per_node, const Options& opts,
                                   const std::function<void(Comm&)>& body) {
  if (per_node == 0) return runRanks(nranks, opts, body);
  return runRanks(nranks, opts, body, test_util::nodesOf(nranks, per_node), makeMemoryStore());
}

using test_util::makeExpected;
using test_util::makeInput;

// Index of the first differing element, or -1.
long firstMismatch(const std::vector<char>& got, const std::vector<char>& want, size_t es) {
  if (got.size() != want.size()) return 0;
  if (std::memcmp(got.data(), want.data(), got.size()) == 0) return -1;
  for (size_t i = 0; i * es < got.size(); ++i)
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0) return static_cast<long>(i);
  return 0;
}

struct Case {
  ddlDataType_t type;
  ddlRedOp_t op;
};
std::vector<Case> allCases() {
  std::vector<Case> cases;
  for (int t = 0; t < ddlNumTypes; ++t)
    for (int o = 0; o < ddlNumOps; ++o) {
      const auto type = static_cast<ddlDataType_t>(t);
      const auto op = static_cast<ddlRedOp_t>(o);
      if (opTakesType(op, type)) cases.push_back({type, op});
    }
  return cases;
}
// For the big count: every type with sum and every op with int32 and (but the bitwise ones) float32.
std::vector<Case> bigCases() {
  std::vector<Case> cases;
  for (int t = 0; t < ddlNumTypes; ++t) cases.push_back({static_cast<ddlDataType_t>(t), ddlSum});
  for (int o = 1; o < ddlNumOps; ++o) {
    if (!isBitwiseOp(static_cast<ddlRedOp_t>(o))) cases.push_back({ddlFloat32, static_cast<ddlRedOp_t>(o)});
    cases.push_back({ddlInt32, static_cast<ddlRedOp_t>(o)});
  }
  return cases;
}

// Runs allreduce for each case and count, in place and out of place, and checks every rank's output.
void checkAllReduce(int nranks, const Options& opts, const std::vector<size_t>& counts,
                    const std::vector<Case>& cases, int per_node = 0, const std::string& path = "") {
  std::vector<std::string> failures(nranks);
  auto results = runOnNodes(nranks, per_node, opts, [&](Comm& c) {
    if (!path.empty() && c.intraNodePath() != path) {
      throw Error(ddlInternalError, "intra-node path " + c.intraNodePath() + ", expected " + path);
    }
    const int r = c.rank();
    for (size_t count : counts) {
      for (const Case& k : cases) {
        const size_t es = typeSize(k.type);
        const auto input = makeInput(k.type, k.op, r, count);
        const auto want = makeExpected(k.type, k.op, nranks, count);
        for (bool in_place : {false, true}) {
          std::vector<char> out(count * es, 0x5A);
          if (in_place) out = input;
          c.allReduce(in_place ? out.data() : input.data(), out.data(), count, k.type, k.op);
          long bad = firstMismatch(out, want, es);
          if (bad >= 0 && failures[r].empty()) {
            failures[r] = std::string(typeName(k.type)) + " " + opName(k.op) + " count " + std::to_string(count) +
                          (in_place ? " in place" : " out of place") + ": first wrong element " + std::to_string(bad);
          }
        }
      }
    }
  });
  expectAllOk(results);
  for (int r = 0; r < nranks; ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

struct AlgoParam {
  int nranks;
  Algo algo;
  std::string topology;
  int per_node = 0;  // ranks per node sharing memory; 0: none (see runOnNodes)
  std::string path;  // the intra-node path the communicator must take (Comm::intraNodePath); empty: any
};
void PrintTo(const AlgoParam& p, std::ostream* os) {
  *os << algoName(p.algo) << " on " << p.nranks << " ranks, topology '" << p.topology << "'";
  if (p.per_node) *os << ", " << p.per_node << " per node";
}
std::string paramName(const testing::TestParamInfo<AlgoParam>& info) {
  std::string t = info.param.topology.empty() ? "flat" : info.param.topology;
  std::string name = std::string(algoName(info.param.algo)) + "_" + std::to_string(info.param.nranks) + "ranks_" + t;
  if (info.param.per_node) name += "_" + std::to_string(info.param.per_node) + "pernode";
  return name;
}

class AllReduceTest : public testing::TestWithParam<AlgoParam> {};

TEST_P(AllReduceTest, EveryTypeAndOpSmallCounts) {
  const auto& p = GetParam();
  // A 16-byte segment makes even these counts run many pipelined segments.
  checkAllReduce(p.nranks, makeOptions(p.nranks, p.algo, p.topology, 16), {0, 1, 7, 300}, allCases(), p.per_node,
                 p.path);
}

TEST_P(AllReduceTest, LargeOddCount) {
  const auto& p = GetParam();
  checkAllReduce(p.nranks, makeOptions(p.nranks, p.algo, p.topology, 64 * 1024), {1000003}, bigCases(),
                 p.per_node, p.path);
}

std::vector<AlgoParam> algoParams() {
  std::vector<AlgoParam> ps;
  for (int n : {1, 2, 3, 4, 5, 7, 8}) {
    ps.push_back({n, Algo::kRing, "", 0, ""});
    ps.push_back({n, Algo::kRhd, "", 0, ""});
    ps.push_back({n, Algo::kAuto, "", 0, ""});
  }
  for (auto [n, topo] : std::vector<std::pair<int, std::string>>{
           {1, "1"}, {2, "2"}, {2, "1x2"}, {3, "3"}, {4, "2x2"}, {4, "4x1"}, {6, "2x3"}, {6, "3x2"},
           {8, "2x4"}, {8, "4x2"}, {8, "2x2x2"}, {7, "7"}}) {
    ps.push_back({n, Algo::kMdRing, topo, 0, ""});
  }
  ps.push_back({8, Algo::kAuto, "2x2x2", 0, ""});
  // Shared memory: every rank on one node (auto and forced), and nodes of 2, 3 and 4 under mdring, whose dim 0
  // (derived from the nodes, or given) runs over it.
  for (int n : {2, 3, 4, 5, 7, 8}) ps.push_back({n, Algo::kAuto, "", n, "shm"});
  ps.push_back({4, Algo::kShm, "", 4, "shm"});
  ps.push_back({1, Algo::kAuto, "", 1, "ucx"});  // alone on its node: nothing to share
  ps.push_back({4, Algo::kMdRing, "", 2, "shm+ucx"});
  ps.push_back({6, Algo::kMdRing, "", 3, "shm+ucx"});
  ps.push_back({8, Algo::kMdRing, "", 4, "shm+ucx"});
  ps.push_back({8, Algo::kMdRing, "2x2x2", 2, "shm+ucx"});
  ps.push_back({8, Algo::kAuto, "", 2, "shm+ucx"});
  ps.push_back({6, Algo::kMdRing, "2x3", 3, "ucx"});  // dim 0 is not the node: all over the transport
  return ps;
}

INSTANTIATE_TEST_SUITE_P(Algorithms, AllReduceTest, testing::ValuesIn(algoParams()), paramName);

// (ranks, ranks per node sharing memory: 0 none)
class CollectivesTest : public testing::TestWithParam<std::pair<int, int>> {};

TEST_P(CollectivesTest, BroadcastFromEveryRoot) {
  const int n = GetParam().first, per_node = GetParam().second;
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{20000}, size_t{1000003}}) {
    auto results = runOnNodes(n, per_node, makeOptions(n, Algo::kAuto, "", 4096), [&](Comm& c) {
      for (int root = 0; root < n; ++root) {
        std::vector<int32_t> src(count), dst(count, -1);
        for (size_t i = 0; i < count; ++i) src[i] = static_cast<int32_t>(i * 31 + root * 7 + c.rank());
        c.broadcast(src.data(), dst.data(), count, ddlInt32, root);
        for (size_t i = 0; i < count; ++i) {
          if (dst[i] != static_cast<int32_t>(i * 31 + root * 7 + root)) {
            throw Error(ddlInternalError, "root " + std::to_string(root) + " count " + std::to_string(count) +
                                              " element " + std::to_string(i) + " wrong");
          }
        }
        // In place on the root.
        std::vector<int32_t> buf(count, c.rank() == root ? 5 : 0);
        c.broadcast(buf.data(), buf.data(), count, ddlInt32, root);
        for (size_t i = 0; i < count; ++i)
          if (buf[i] != 5) throw Error(ddlInternalError, "in-place broadcast wrong");
      }
    });
    expectAllOk(results);
  }
}

// A broadcast's root waits for no one but a free buffer, so it runs ahead of a slow member by up to a buffer
// per broadcast; the slow member must still find the root's signature of the broadcast it is in (and then
// an allreduce must still line up).
TEST_P(CollectivesTest, ManyBroadcastsFromOneRootWhileAMemberLags) {
  const int n = GetParam().first, per_node = GetParam().second;
  if (n < 2) GTEST_SKIP() << "needs a member to lag behind the root";
  auto results = runOnNodes(n, per_node, makeOptions(n, Algo::kAuto, "", 4096), [&](Comm& c) {
    std::vector<int32_t> buf(7);
    for (int k = 0; k < 12; ++k) {
      if (c.rank() == n - 1 && k == 1) std::this_thread::sleep_for(300ms);
      for (auto& v : buf) v = c.rank() == 0 ? k : -1;
      c.broadcast(buf.data(), buf.data(), buf.size(), ddlInt32, 0);
      for (auto v : buf)
        if (v != k)
          throw Error(ddlInternalError, "broadcast " + std::to_string(k) + " got " + std::to_string(v));
    }
    std::vector<int32_t> sum(5, 1);
    c.allReduce(sum.data(), sum.data(), sum.size(), ddlInt32, ddlSum);
    if (sum[4] != n)
      throw Error(ddlInternalError, "allreduce after the broadcasts got " + std::to_string(sum[4]));
  });
  expectAllOk(results);
}

TEST_P(CollectivesTest, AllGatherAndReduceScatter) {
  const int n = GetParam().first, per_node = GetParam().second;
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{100003}}) {
    auto results = runOnNodes(n, per_node, makeOptions(n, Algo::kAuto, "", 4096), [&](Comm& c) {
      const int r = c.rank();
      // Allgather: out of place and in place (sendbuf = recvbuf + rank * count).
      std::vector<uint16_t> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = static_cast<uint16_t>(r * 1000 + i);
      std::vector<uint16_t> all(count * n, 0);
      c.allGather(mine.data(), all.data(), count, ddlFloat16);
      std::vector<uint16_t> all2(count * n, 0);
      std::memcpy(all2.data() + r * count, mine.data(), count * 2);
      c.allGather(all2.data() + r * count, all2.data(), count, ddlFloat16);
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i) {
          uint16_t want = static_cast<uint16_t>(q * 1000 + i);
          if (all[q * count + i] != want || all2[q * count + i] != want)
            throw Error(ddlInternalError, "allgather wrong at block " + std::to_string(q));
        }
      // Reduce-scatter: block q of rank r holds r + q + i; rank q receives the sum over r.
      for (ddlRedOp_t op : {ddlSum, ddlMax, ddlAvg}) {
        std::vector<int64_t> in(count * n), out(count, -7);
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i) in[q * count + i] = r + q + static_cast<int64_t>(i);
        c.reduceScatter(in.data(), out.data(), count, ddlInt64, op);
        for (size_t i = 0; i < count; ++i) {
          // This rank's block (q == r) summed over the n senders s: s + r + i.
          int64_t sum = 0;
          for (int q = 0; q < n; ++q) sum += q + r + static_cast<int64_t>(i);
          int64_t want = op == ddlSum ? sum : op == ddlMax ? (n - 1) + r + static_cast<int64_t>(i) : sum / n;
          if (out[i] != want)
            throw Error(ddlInternalError, std::string("reducescatter ") + opName(op) + " wrong at " + std::to_string(i));
        }
        // In place: recvbuf = sendbuf + rank * recvcount.
        std::vector<int64_t> io = in;
        c.reduceScatter(io.data(), io.data() + r * count, count, ddlInt64, ddlSum);
        for (size_t i = 0; i < count; ++i) {
          int64_t sum = 0;
          for (int q = 0; q < n; ++q) sum += q + r + static_cast<int64_t>(i);
          if (io[r * count + i] != sum) throw Error(ddlInternalError, "in-place reducescatter wrong");
        }
      }
      c.barrier();
    });
    expectAllOk(results);
  }
}

TEST_P(CollectivesTest, NonBlockingAllReduceKeepsCallOrder) {
  const int n = GetParam().first, per_node = GetParam().second;
  auto results = runOnNodes(n, per_node, makeOptions(n, Algo::kAuto), [&](Comm& c) {
    constexpr int kOps = 6;
    std::vector<std::vector<float>> bufs(kOps, std::vector<float>(5000));
    std::vector<std::shared_ptr<AsyncOp>> ops;
    for (int k = 0; k < kOps; ++k) {
      for (auto& v : bufs[k]) v = static_cast<float>(k + c.rank());
      ops.push_back(c.iallReduce(bufs[k].data(), bufs[k].data(), bufs[k].size(), ddlFloat32, ddlSum));
    }
    // A blocking call in between must wait for the queued ones and keep the order on the wire.
    std::vector<float> x(10, 1.0f);
    c.allReduce(x.data(), x.data(), x.size(), ddlFloat32, ddlSum);
    for (auto& op : ops) {
      for (int i = 0; i < 100000 && !op->done.load(); ++i) std::this_thread::sleep_for(100us);
      if (!op->done.load() || op->result != ddlSuccess) throw Error(ddlInternalError, "async op failed: " + op->error);
    }
    const float ranks_sum = static_cast<float>(n * (n - 1) / 2);
    for (int k = 0; k < kOps; ++k)
      for (float v : bufs[k])
        if (v != k * n + ranks_sum) throw Error(ddlInternalError, "async result wrong in op " + std::to_string(k));
    if (x[0] != n) throw Error(ddlInternalError, "blocking result wrong");
  });
  expectAllOk(results);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectivesTest,
                         testing::Values(std::pair{1, 0}, std::pair{2, 0}, std::pair{3, 0}, std::pair{4, 0},
                                         std::pair{5, 0}, std::pair{7, 0}, std::pair{8, 0}, std::pair{2, 2},
                                         std::pair{3, 3}, std::pair{4, 4}, std::pair{7, 7}, std::pair{4, 2}),
                         [](const auto& info) {
                           return std::to_string(info.param.first) + "ranks" +
                                  (info.param.second ? "_" + std::to_string(info.param.second) + "pernode" : "");
                         });

// ---- Failures: nothing hangs, every rank learns what went wrong. ----

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Failures, DeadRankFailsEveryOtherRankFast) {
  constexpr int n = 4;
  auto fabric = std::make_shared<LocalFabric>(n);
  const auto t0 = std::chrono::steady_clock::now();
  // A long timeout: the others must learn from the failure itself, not from their deadline.
  auto results = runRanks(n, makeOptions(n, Algo::kRing, "", 0, 30000), [&](Comm& c) {
    std::vector<float> buf(1 << 16, 1.0f);
    for (int it = 0; it < 3; ++it) c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlSum);
    if (c.rank() == 2) {
      fabric->kill(2, "killed by the test");
      return;
    }
    c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlSum);
  }, fabric);
  EXPECT_LT(secondsSince(t0), 10.0);
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(results[r].code, ddlRemoteError) << results[r].what;
    EXPECT_NE(results[r].what.find("rank 2"), std::string::npos) << results[r].what;
  }
}

TEST(Failures, AbortFromAnotherThreadUnblocksAndTellsPeers) {
  constexpr int n = 3;
  std::atomic<int> others_done{0};
  auto results = runRanks(n, makeOptions(n, Algo::kRing, "", 0, 30000), [&](Comm& c) {
    std::vector<double> buf(1000, 1.0);
    if (c.rank() == 1) {
      // Rank 1 joins only once ranks 0 and 2 have returned (bounded): rank 0 aborts after a while, rank 2 must
      // hear about it, and rank 1 then finds the communicator broken.
      for (int i = 0; i < 20000 && others_done.load() < 2; ++i) std::this_thread::sleep_for(1ms);
      c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat64, ddlSum);
      return;
    }
    struct Done {
      std::atomic<int>& n;
      ~Done() { ++n; }
    } done{others_done};
    std::thread watchdog;
    if (c.rank() == 0) {
      watchdog = std::thread([&c] {
        std::this_thread::sleep_for(200ms);
        c.abort();
      });
    }
    try {
      c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat64, ddlSum);
    } catch (...) {
      if (watchdog.joinable()) watchdog.join();
      throw;
    }
    if (watchdog.joinable()) watchdog.join();
  });
  EXPECT_EQ(results[0].code, ddlAborted) << results[0].what;
  EXPECT_EQ(results[2].code, ddlRemoteError) << results[2].what;
  EXPECT_NE(results[2].what.find("rank 0"), std::string::npos) << results[2].what;
  EXPECT_NE(results[1].code, ddlSuccess);
}

void expectMismatchDetected(const std::vector<RankResult>& results) {
  int invalid = 0;
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_NE(results[r].code, ddlSuccess) << "rank " << r;
    EXPECT_NE(results[r].code, ddlTimeout) << "rank " << r << " hung until its deadline: " << results[r].what;
    if (results[r].code == ddlInvalidArgument) {
      ++invalid;
      EXPECT_NE(results[r].what.find("mismatch"), std::string::npos) << results[r].what;
    }
  }
  EXPECT_GE(invalid, 1);
}

TEST(Failures, MismatchedCountsGiveAnErrorNotAHang) {
  for (Algo algo : {Algo::kRing, Algo::kRhd, Algo::kMdRing}) {
    auto results = runRanks(4, makeOptions(4, algo, algo == Algo::kMdRing ? "2x2" : "", 0, 20000), [&](Comm& c) {
      const size_t count = c.rank() == 1 ? 1001 : 1000;
      std::vector<float> buf(count, 1.0f);
      c.allReduce(buf.data(), buf.data(), count, ddlFloat32, ddlSum);
    });
    expectMismatchDetected(results);
  }
}

TEST(Failures, MismatchedTypesOfEqualSizeAreDetected) {
  auto results = runRanks(3, makeOptions(3, Algo::kRing, "", 0, 20000), [&](Comm& c) {
    std::vector<float> buf(999, 1.0f);
    c.allReduce(buf.data(), buf.data(), buf.size(), c.rank() == 2 ? ddlInt32 : ddlFloat32, ddlSum);
  });
  expectMismatchDetected(results);
}

TEST(Failures, MismatchedCollectivesAreDetected) {
  auto results = runRanks(2, makeOptions(2, Algo::kAuto, "", 0, 20000), [&](Comm& c) {
    std::vector<int32_t> buf(64, 1);
    if (c.rank() == 0) {
      c.allReduce(buf.data(), buf.data(), buf.size(), ddlInt32, ddlSum);
    } else {
      c.broadcast(buf.data(), buf.data(), buf.size(), ddlInt32, 0);
    }
  });
  expectMismatchDetected(results);
}

TEST(Failures, MissingRankTimesOutNamingThePeerAndStaysBroken) {
  std::atomic<bool> others_done{false};
  auto results = runRanks(2, makeOptions(2, Algo::kRing, "", 0, 300), [&](Comm& c) {
    if (c.rank() == 1) {
      for (int i = 0; i < 200 && !others_done.load(); ++i) std::this_thread::sleep_for(10ms);
      return;
    }
    std::vector<float> buf(100000, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    ddlResult_t first = ddlSuccess;
    try {
      c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlSum);
    } catch (const Error& e) {
      first = e.code();
      EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
    }
    EXPECT_EQ(first, ddlTimeout);
    EXPECT_GE(secondsSince(t0), 0.25);
    EXPECT_LT(secondsSince(t0), 5.0);
    EXPECT_EQ(c.asyncError(), ddlTimeout);
    others_done = true;
    // Broken for good: the next call fails at once with the same code.
    c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlSum);
  });
  EXPECT_EQ(results[0].code, ddlTimeout) << results[0].what;
  EXPECT_NE(results[0].what.find("unusable"), std::string::npos) << results[0].what;
}

// The same promises over shared memory, where waits are on counters in the segment, not on the transport.
TEST(ShmFailures, MismatchedCountsAndCollectivesGiveAnErrorNotAHang) {
  // 1000 and 1001 elements take one round each; 1000 and 9000 take different numbers of rounds.
  for (size_t other : {size_t{1001}, size_t{9000}}) {
    auto results = runOnNodes(4, 4, makeOptions(4, Algo::kAuto, "", 4096), [&](Comm& c) {
      const size_t count = c.rank() == 1 ? other : 1000;
      std::vector<float> buf(count, 1.0f);
      c.allReduce(buf.data(), buf.data(), count, ddlFloat32, ddlSum);
    });
    expectMismatchDetected(results);
  }
  auto results = runOnNodes(3, 3, makeOptions(3, Algo::kAuto), [&](Comm& c) {
    std::vector<int32_t> buf(300, 1);
    if (c.rank() == 2) {
      c.allGather(buf.data(), buf.data(), 100, ddlInt32);
    } else {
      c.allReduce(buf.data(), buf.data(), 300, ddlInt32, ddlSum);
    }
  });
  expectMismatchDetected(results);
  // A collective with no shared-memory form (broadcast, over the transport) against one over shared memory.
  results = runOnNodes(2, 2, makeOptions(2, Algo::kAuto), [&](Comm& c) {
    std::vector<int32_t> buf(64, 1);
    if (c.rank() == 0) {
      c.allReduce(buf.data(), buf.data(), buf.size(), ddlInt32, ddlSum);
    } else {
      c.broadcast(buf.data(), buf.data(), buf.size(), ddlInt32, 1);  // the root's send may complete: it can pass
    }
  });
  EXPECT_EQ(results[0].code, ddlInvalidArgument) << results[0].what;
  EXPECT_NE(results[0].what.find("mismatch"), std::string::npos) << results[0].what;
}

TEST(ShmFailures, AbortWakesEveryWaiterAndNamesTheRank) {
  constexpr int n = 3;
  std::atomic<bool> others_done{false};
  const auto t0 = std::chrono::steady_clock::now();
  auto results = runOnNodes(n, n, makeOptions(n, Algo::kAuto, "", 0, 30000), [&](Comm& c) {
    std::vector<float> buf(1 << 20, 1.0f);
    c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlSum);  // all in, once
    if (c.rank() == 1) {  // then rank 1 stays away until the others have returned (bounded)
      for (int i = 0; i < 20000 && !others_done.load(); ++i) std::this_thread::sleep_for(1ms);
      return;
    }
    std::thread watchdog;
    if (c.rank() == 0) {
      watchdog = std::thread([&c] {
        std::this_thread::sleep_for(200ms);
        c.abort();
      });
    }
    struct Join {
      std::thread& t;
      std::atomic<bool>& done;
      bool last;
      ~Join() {
        if (t.joinable()) t.join();
        if (last) done = true;
      }
    } join{watchdog, others_done, c.rank() == 2};
    c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlSum);
  });
  EXPECT_LT(secondsSince(t0), 10.0);
  EXPECT_EQ(results[0].code, ddlAborted) << results[0].what;
  EXPECT_EQ(results[2].code, ddlRemoteError) << results[2].what;
  EXPECT_NE(results[2].what.find("rank 0"), std::string::npos) << results[2].what;
}

TEST(ShmFailures, MissingRankTimesOutNamingThePeer) {
  std::atomic<bool> done{false};
  auto results = runOnNodes(2, 2, makeOptions(2, Algo::kAuto, "", 0, 300), [&](Comm& c) {
    if (c.rank() == 1) {
      for (int i = 0; i < 200 && !done.load(); ++i) std::this_thread::sleep_for(10ms);
      return;
    }
    std::vector<float> buf(100000, 1.0f);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlSum);
    } catch (...) {
      EXPECT_GE(secondsSince(t0), 0.25);
      EXPECT_LT(secondsSince(t0), 5.0);
      done = true;
      throw;
    }
  });
  EXPECT_EQ(results[0].code, ddlTimeout) << results[0].what;
  EXPECT_NE(results[0].what.find("waiting for rank 1"), std::string::npos) << results[0].what;
}

TEST(ShmFailures, ForcedShmAcrossNodesIsRefusedAndOffMeansTheTransport) {
  auto results = runOnNodes(4, 2, makeOptions(4, Algo::kShm), [&](Comm&) {});
  for (const auto& r : results) {
    EXPECT_EQ(r.code, ddlInvalidArgument) << r.what;
    EXPECT_NE(r.what.find("DDL_ALGO=shm needs every rank on one node"), std::string::npos) << r.what;
  }
  Options off = makeOptions(4, Algo::kAuto);
  off.shm = false;
  results = runOnNodes(4, 4, off, [&](Comm& c) {
    if (c.intraNodePath() != "ucx") throw Error(ddlInternalError, "DDL_SHM=off took " + c.intraNodePath());
  });
  expectAllOk(results);
}

// The node layout every rank derives from the table of node keys: the same on every rank, shared memory only
// where the node is exactly mdring's dim 0, and every rank still gets the right sums.
TEST(ShmLayout, IrregularNodesKeepEveryRankOnTheTransportAndRegularOnesGetAGrid) {
  struct Layout {
    std::vector<std::string> nodes;
    std::string path, topology;
  };
  for (const Layout& l : std::vector<Layout>{{{"a", "a", "b", "b", "b", "b"}, "ucx", "6"},
                                             {{"a", "b", "a", "b"}, "ucx", "4"},
                                             {{"a", "a", "b", "b", "a", "a"}, "ucx", "6"},
                                             {{"a", "a", "a", "b", "b", "b"}, "shm+ucx", "3x2"},
                                             {{"a", "b", "c"}, "ucx", "3"}}) {
    const int n = static_cast<int>(l.nodes.size());
    auto fabric = std::make_shared<LocalFabric>(n);
    fabric->setNodes(l.nodes);
    auto results = runRanks(n, makeOptions(n, Algo::kMdRing, "", 0, 20000), [&](Comm& c) {
      if (c.intraNodePath() != l.path || c.options().topology.str() != l.topology) {
        throw Error(ddlInternalError, "path " + c.intraNodePath() + " topology " + c.options().topology.str());
      }
      std::vector<int64_t> buf(100003, c.rank() + 1);
      c.allReduce(buf.data(), buf.data(), buf.size(), ddlInt64, ddlSum);
      for (int64_t v : buf)
        if (v != n * (n + 1) / 2) throw Error(ddlInternalError, "wrong sum " + std::to_string(v));
    }, fabric, makeMemoryStore());
    expectAllOk(results);
  }
}

// A segment that cannot be reserved (far more than /dev/shm holds) sends every rank to the transport, with the
// right results; DDL_ALGO=shm then fails at init saying why. A single rank with DDL_ALGO=shm has nothing to share.
TEST(ShmLayout, ASegmentThatCannotBeMadeFallsBackOrFailsClearly) {
  Options huge = makeOptions(4, Algo::kAuto);
  huge.shm_round_bytes = size_t{1} << 36;  // 4 ranks x 4 buffers x 64 GiB
  auto results = runOnNodes(4, 4, huge, [&](Comm& c) {
    if (c.intraNodePath() != "ucx") throw Error(ddlInternalError, "path " + c.intraNodePath());
    std::vector<int32_t> buf(1000, c.rank());
    c.allReduce(buf.data(), buf.data(), buf.size(), ddlInt32, ddlSum);
    if (buf[999] != 6) throw Error(ddlInternalError, "wrong sum");
  });
  expectAllOk(results);
  huge.algo = Algo::kShm;
  results = runOnNodes(4, 4, huge, [&](Comm&) {});
  for (const auto& r : results) {
    EXPECT_EQ(r.code, ddlInvalidArgument) << r.what;
    EXPECT_NE(r.what.find("DDL_ALGO=shm, but shared memory could not be set up"), std::string::npos) << r.what;
  }
  results = runOnNodes(1, 1, makeOptions(1, Algo::kShm), [&](Comm& c) {
    std::vector<float> in(100, 2.0f), out(100);
    c.allReduce(in.data(), out.data(), in.size(), ddlFloat32, ddlSum);
    if (out[99] != 2.0f) throw Error(ddlInternalError, "wrong copy");
  });
  expectAllOk(results);
}

// A creator killed before every member attached leaves its segment's name in /dev/shm; the node's next
// creator removes it. Names whose creator lives, or that belong to another PID namespace, stay.
TEST(ShmLayout, TheNextSegmentRemovesOneWhoseCreatorDied) {
  struct stat ns {};
  if (stat("/proc/self/ns/pid", &ns) != 0)
    GTEST_SKIP() << "no /proc/self/ns/pid: segment names carry no namespace";
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0) << std::strerror(errno);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  int hold[2];
  ASSERT_EQ(pipe(hold), 0);
  const pid_t living = fork();
  if (living == 0) {
    char c;
    close(hold[1]);
    while (read(hold[0], &c, 1) < 0 && errno == EINTR) {
    }
    _exit(0);
  }
  ASSERT_GT(living, 0) << std::strerror(errno);
  close(hold[0]);
  auto name = [](unsigned long long pid_ns, pid_t pid) {
    return "/ddl-" + std::to_string(pid_ns) + "-" + std::to_string(pid) + "-00000000deadbeef";
  };
  const unsigned long long mine = ns.st_ino;
  const std::string orphan = name(mine, dead), alive = name(mine, living), elsewhere = name(mine + 1, dead);
  for (const auto& n : {orphan, alive, elsewhere}) {
    const int fd = shm_open(n.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0) << n << ": " << std::strerror(errno);
    close(fd);
  }
  auto results = runOnNodes(2, 2, makeOptions(2, Algo::kShm), [&](Comm& c) {
    std::vector<int32_t> buf(100, c.rank() + 1);
    c.allReduce(buf.data(), buf.data(), buf.size(), ddlInt32, ddlSum);
    if (buf[99] != 3) throw Error(ddlInternalError, "wrong sum " + std::to_string(buf[99]));
  });
  expectAllOk(results);
  auto exists = [](const std::string& n) {
    const int fd = shm_open(n.c_str(), O_RDWR, 0600);
    if (fd >= 0) close(fd);
    return fd >= 0;
  };
  EXPECT_FALSE(exists(orphan)) << orphan << " outlived its dead creator";
  EXPECT_TRUE(exists(alive)) << alive << " was removed while its creator lives";
  EXPECT_TRUE(exists(elsewhere)) << elsewhere << " of another PID namespace was removed";
  for (const auto& n : {orphan, alive, elsewhere}) shm_unlink(n.c_str());
  close(hold[1]);
  waitpid(living, nullptr, 0);
}

TEST(Failures, BadArgumentsBreakNothing) {
  auto results = runRanks(2, makeOptions(2, Algo::kAuto), [&](Comm& c) {
    std::vector<float> buf(10, 1.0f);
    auto expectInvalid = [](const std::function<void()>& f, const char* needle) {
      try {
        f();
        ADD_FAILURE() << "no error for " << needle;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ddlInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    };
    expectInvalid([&] { c.allReduce(nullptr, buf.data(), 10, ddlFloat32, ddlSum); }, "sendbuff is NULL");
    expectInvalid([&] { c.allReduce(buf.data(), nullptr, 10, ddlFloat32, ddlSum); }, "recvbuff is NULL");
    expectInvalid([&] { c.allReduce(buf.data(), buf.data(), 10, static_cast<ddlDataType_t>(42), ddlSum); },
                  "unknown data type 42");
    expectInvalid([&] { c.allReduce(buf.data(), buf.data(), 10, ddlFloat32, static_cast<ddlRedOp_t>(-1)); },
                  "unknown reduction op -1");
    expectInvalid([&] { c.broadcast(buf.data(), buf.data(), 10, ddlFloat32, 5); }, "root 5");
    EXPECT_EQ(c.asyncError(), ddlSuccess);
    c.allReduce(buf.data(), buf.data(), 10, ddlFloat32, ddlSum);
    if (buf[0] != 2.0f) throw Error(ddlInternalError, "allreduce after bad arguments is wrong");
  });
  expectAllOk(results);
}

TEST(Selection, AutoPicksLatencyAlgorithmForSmallAndMdringForGrids) {
  Topology flat8 = parseTopology("", 8), flat7 = parseTopology("", 7), grid = parseTopology("2x4", 8);
  EXPECT_EQ(selectAllReduce(Algo::kAuto, flat8, 8, 64), Algo::kRhd);
  EXPECT_EQ(selectAllReduce(Algo::kAuto, grid, 8, 64 << 20), Algo::kMdRing);
  EXPECT_EQ(selectAllReduce(Algo::kAuto, flat8, 8, 64 << 20), Algo::kMdRing);  // factorised 2x2x2
  EXPECT_EQ(selectAllReduce(Algo::kAuto, flat7, 7, 64 << 20), Algo::kRing);    // prime: no grid
  EXPECT_EQ(selectAllReduce(Algo::kRing, grid, 8, 64), Algo::kRing);
}

TEST(Selection, FlatTopologiesAreFactorisedForMdring) {
  EXPECT_EQ(mdringGrid(parseTopology("", 8)).dims, (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(mdringGrid(parseTopology("", 12)).dims, (std::vector<int>{2, 2, 3}));
  EXPECT_EQ(mdringGrid(parseTopology("", 7)).dims, (std::vector<int>{7}));
  EXPECT_EQ(mdringGrid(parseTopology("", 1)).dims, (std::vector<int>{1}));
  EXPECT_EQ(mdringGrid(parseTopology("4x2", 8)).dims, (std::vector<int>{4, 2}));  // given grids are kept
  EXPECT_EQ(mdringGrid(parseTopology("1x8", 8)).dims, (std::vector<int>{2, 2, 2}));
}

}  // namespace
}  // namespace ddl
