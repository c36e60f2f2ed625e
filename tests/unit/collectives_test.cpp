// The rooted collectives (reduce, gather, scatter), all-to-all and point-to-point over ranks that are threads
// (LocalTransport): every type and op, odd counts, every root, in place and out of place, p2p ordering and
// its failures. The same calls over real processes and UCX are in tests/comm.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "dtype.h"
#include "error.h"
#include "transport/local_transport.h"
#include "test_values.h"
#include "thread_ranks.h"

namespace ddl {
namespace {

using namespace std::chrono_literals;
using test_util::expectAllOk;
using test_util::makeExpected;
using test_util::makeInput;
using test_util::runRanks;

Options makeOptions(int timeout_ms = 20000) {
  Options o;
  o.timeout_ms = timeout_ms;
  o.segment_bytes = 4096;  // many pipelined segments even at these sizes
  return o;
}

[[noreturn]] void wrong(const std::string& what) { throw Error(ddlInternalError, what); }

std::string caseName(ddlDataType_t t, ddlRedOp_t op, size_t count) {
  return std::string(typeName(t)) + " " + opName(op) + " count " + std::to_string(count);
}

class RootedTest : public testing::TestWithParam<int> {};

// Counts that take the tree (small) and the reduce-scatter + gather path (over 64 KiB), for every valid type
// and op, to every root; out of place and in place on the root; nothing is written on the other ranks.
TEST_P(RootedTest, ReduceEveryTypeAndOpToEveryRoot) {
  const int n = GetParam();
  auto results = runRanks(n, makeOptions(), [&](Comm& c) {
    const int r = c.rank();
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{300}, size_t{40001}}) {
      for (int ti = 0; ti < ddlNumTypes; ++ti) {
        for (int oi = 0; oi < ddlNumOps; ++oi) {
          const auto t = static_cast<ddlDataType_t>(ti);
          const auto op = static_cast<ddlRedOp_t>(oi);
          if (!opTakesType(op, t) || (count > 300 && t != ddlFloat32 && t != ddlInt64 && t != ddlBfloat16)) continue;
          const size_t es = typeSize(t);
          const auto input = makeInput(t, op, r, count);
          const auto want = makeExpected(t, op, n, count);
          for (int root = 0; root < n; ++root) {
            std::vector<char> out(count * es, 0x5A);
            c.reduce(input.data(), r == root ? out.data() : nullptr, count, t, op, root);
            if (r == root && out != want) wrong("reduce " + caseName(t, op, count) + " root " + std::to_string(root));
            std::vector<char> in_place = input;
            c.reduce(in_place.data(), r == root ? in_place.data() : nullptr, count, t, op, root);
            if (r == root && in_place != want) wrong("in-place reduce " + caseName(t, op, count));
            if (r != root && in_place != input) wrong("reduce wrote a non-root's input");
          }
        }
      }
    }
  });
  expectAllOk(results);
}

TEST_P(RootedTest, GatherAndScatterFromEveryRoot) {
  const int n = GetParam();
  auto results = runRanks(n, makeOptions(), [&](Comm& c) {
    const int r = c.rank();
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{100003}}) {
      for (int root = 0; root < n; ++root) {
        // Gather: rank q contributes q * 1000003 + i; out of place, then in place on the root.
        std::vector<int64_t> mine(count), all(count * n, -1);
        for (size_t i = 0; i < count; ++i) mine[i] = r * 1000003LL + static_cast<int64_t>(i);
        c.gather(mine.data(), r == root ? all.data() : nullptr, count, ddlInt64, root);
        std::vector<int64_t> all2(count * n, -1);
        std::copy(mine.begin(), mine.end(), all2.begin() + static_cast<long>(r * count));
        c.gather(r == root ? all2.data() + r * count : mine.data(), r == root ? all2.data() : nullptr, count,
                 ddlInt64, root);
        if (r == root) {
          for (int q = 0; q < n; ++q)
            for (size_t i = 0; i < count; ++i)
              if (all[q * count + i] != q * 1000003LL + static_cast<int64_t>(i) || all2[q * count + i] != all[q * count + i])
                wrong("gather root " + std::to_string(root) + " block " + std::to_string(q));
        }
        // Scatter: the root's block q holds root + q * 7 + i.
        std::vector<float> blocks(r == root ? count * n : 0), got(count, -1.0f);
        for (int q = 0; q < n && r == root; ++q)
          for (size_t i = 0; i < count; ++i) blocks[q * count + i] = static_cast<float>(root + q * 7 + (i % 1000));
        c.scatter(r == root ? blocks.data() : nullptr, got.data(), count, ddlFloat32, root);
        for (size_t i = 0; i < count; ++i)
          if (got[i] != static_cast<float>(root + r * 7 + (i % 1000))) wrong("scatter root " + std::to_string(root));
        if (r == root && count > 0) {
          c.scatter(blocks.data(), blocks.data() + r * count, count, ddlFloat32, root);  // in place
          if (blocks[r * count] != static_cast<float>(root + r * 7)) wrong("in-place scatter");
        } else if (count > 0) {
          c.scatter(nullptr, got.data(), count, ddlFloat32, root);
        }
      }
    }
  });
  expectAllOk(results);
}

// Rank r's block j holds r * 100 + j + i; rank j receives every rank's block j.
TEST_P(RootedTest, AllToAllOutOfPlaceAndInPlace) {
  const int n = GetParam();
  auto results = runRanks(n, makeOptions(), [&](Comm& c) {
    const int r = c.rank();
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{10001}}) {
      std::vector<int32_t> in(count * n), out(count * n, -1);
      for (int j = 0; j < n; ++j)
        for (size_t i = 0; i < count; ++i) in[j * count + i] = r * 100 + j + static_cast<int32_t>(i);
      std::vector<int32_t> same = in;
      c.allToAll(in.data(), out.data(), count, ddlInt32);
      c.allToAll(same.data(), same.data(), count, ddlInt32);
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i) {
          const int32_t want = q * 100 + r + static_cast<int32_t>(i);
          if (out[q * count + i] != want || same[q * count + i] != want) wrong("alltoall from rank " + std::to_string(q));
        }
    }
  });
  expectAllOk(results);
}

// Rank i sends (i + 2j) % 5 * 1000 elements to rank j (some zero, some large), packed in reverse order of
// peers in the input, so displacements are not the running sums.
TEST_P(RootedTest, AllToAllvWithUnevenCountsAndDisplacements) {
  const int n = GetParam();
  auto amount = [](int from, int to) { return static_cast<size_t>((from + 2 * to) % 5) * 1000; };
  auto results = runRanks(n, makeOptions(), [&](Comm& c) {
    const int r = c.rank();
    std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
    size_t off = 0;
    for (int j = n - 1; j >= 0; --j) {
      sc[j] = amount(r, j);
      sd[j] = off;
      off += sc[j];
    }
    std::vector<uint8_t> in(off);
    for (int j = 0; j < n; ++j)
      for (size_t i = 0; i < sc[j]; ++i) in[sd[j] + i] = static_cast<uint8_t>(r * 31 + j * 7 + i);
    size_t roff = 0;
    for (int j = 0; j < n; ++j) {
      rc[j] = amount(j, r);
      rd[j] = roff;
      roff += rc[j] + 3;  // gaps between the blocks stay untouched
    }
    std::vector<uint8_t> out(roff, 0xEE);
    c.allToAllv(in.data(), sc.data(), sd.data(), out.data(), rc.data(), rd.data(), ddlUint8);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < rc[j]; ++i)
        if (out[rd[j] + i] != static_cast<uint8_t>(j * 31 + r * 7 + i)) wrong("alltoallv from rank " + std::to_string(j));
      for (size_t g = 0; g < 3; ++g)
        if (out[rd[j] + rc[j] + g] != 0xEE) wrong("alltoallv wrote between blocks");
    }
  });
  expectAllOk(results);
}

INSTANTIATE_TEST_SUITE_P(Ranks, RootedTest, testing::Values(1, 2, 3, 4, 7, 8));

TEST(AllToAllv, CountsThatDisagreeAcrossRanksAreAMismatch) {
  auto results = runRanks(2, makeOptions(), [&](Comm& c) {
    std::vector<float> in(100), out(100);
    std::vector<size_t> sc{10, 10}, sd{0, 10}, rc{10, c.rank() == 0 ? size_t{12} : size_t{10}}, rd{0, 50};
    c.allToAllv(in.data(), sc.data(), sd.data(), out.data(), rc.data(), rd.data(), ddlFloat32);
    c.barrier();  // rank 1's own alltoallv may have finished: it learns here
  });
  EXPECT_EQ(results[0].code, ddlInvalidArgument) << results[0].what;
  EXPECT_NE(results[0].what.find("mismatch"), std::string::npos) << results[0].what;
  EXPECT_EQ(results[1].code, ddlRemoteError) << results[1].what;
}

TEST(RootedArguments, BadRootsAndNullBuffersBreakNothing) {
  auto results = runRanks(2, makeOptions(), [&](Comm& c) {
    float x[4] = {1, 2, 3, 4}, y[8] = {};
    auto expectInvalid = [&](auto&& call, const std::string& needle) {
      try {
        call();
      } catch (const Error& e) {
        if (e.code() != ddlInvalidArgument || std::string(e.what()).find(needle) == std::string::npos)
          wrong(std::string("unexpected error: ") + e.what());
        return;
      }
      wrong("no error for " + needle);
    };
    expectInvalid([&] { c.reduce(x, y, 4, ddlFloat32, ddlSum, 2); }, "root 2 is not a rank");
    expectInvalid([&] { c.gather(x, y, 4, ddlFloat32, -1); }, "root -1 is not a rank");
    expectInvalid([&] { c.reduce(x, nullptr, 4, ddlFloat32, ddlSum, c.rank()); }, "recvbuff is NULL on the root");
    expectInvalid([&] { c.scatter(nullptr, y, 4, ddlFloat32, c.rank()); }, "sendbuff is NULL on the root");
    expectInvalid([&] { c.reduce(x, y, 4, ddlFloat32, ddlBxor, 0); }, "takes integer types only");
    expectInvalid([&] { c.send(x, 4, ddlFloat32, c.rank()); }, "is not another rank");
    expectInvalid([&] { c.irecv(y, 4, ddlFloat32, 5); }, "is not another rank");
    // The communicator still works.
    c.allReduce(x, y, 4, ddlFloat32, ddlSum);
    if (y[3] != 8) wrong("allreduce after refused calls");
  });
  expectAllOk(results);
}

// ---- Point-to-point ----

// Each rank sends to its right neighbour and receives from its left, messages of many sizes (eager and
// rendezvous in LocalTransport), all posted at once: they match in order per pair.
TEST(PointToPoint, RingOfNonBlockingMessagesMatchesInOrder) {
  for (int n : {2, 3, 4}) {
    auto results = runRanks(n, makeOptions(), [&](Comm& c) {
      const int r = c.rank(), right = (r + 1) % n, left = (r + n - 1) % n;
      const std::vector<size_t> sizes{0, 1, 63, 64, 1000, 100003, 5};
      std::vector<std::vector<int32_t>> out(sizes.size()), in(sizes.size());
      std::vector<std::shared_ptr<AsyncOp>> ops;
      for (size_t k = 0; k < sizes.size(); ++k) {
        out[k].resize(sizes[k]);
        in[k].assign(sizes[k], -1);
        for (size_t i = 0; i < sizes[k]; ++i) out[k][i] = r * 1000 + static_cast<int32_t>(k * 10 + i % 7);
        ops.push_back(c.irecv(in[k].data(), sizes[k], ddlInt32, left));
        ops.push_back(c.isend(out[k].data(), sizes[k], ddlInt32, right));
      }
      for (auto& op : ops) {
        op->done.wait(false);
        if (op->result != ddlSuccess) wrong("p2p failed: " + op->error);
      }
      for (size_t k = 0; k < sizes.size(); ++k)
        for (size_t i = 0; i < sizes[k]; ++i)
          if (in[k][i] != left * 1000 + static_cast<int32_t>(k * 10 + i % 7)) wrong("message " + std::to_string(k));
    });
    expectAllOk(results);
  }
}

// A large send posted before a collective completes while the collective runs: rank 0 sends, then joins an
// allreduce; rank 1 joins the allreduce first and receives after. A send that waited for its receive before
// the collective could start would deadlock here.
TEST(PointToPoint, PendingSendMovesOnInsideCollectives) {
  auto results = runRanks(2, makeOptions(10000), [&](Comm& c) {
    std::vector<double> big(1 << 18, c.rank() + 0.5), sum(16, 1.0);
    if (c.rank() == 0) {
      auto op = c.isend(big.data(), big.size(), ddlFloat64, 1);
      c.allReduce(sum.data(), sum.data(), sum.size(), ddlFloat64, ddlSum);
      c.barrier();
      op->done.wait(false);
      if (op->result != ddlSuccess) wrong(op->error);
    } else {
      c.allReduce(sum.data(), sum.data(), sum.size(), ddlFloat64, ddlSum);
      c.barrier();
      std::vector<double> got(big.size());
      c.recv(got.data(), got.size(), ddlFloat64, 0);
      if (got.front() != 0.5 || got.back() != 0.5) wrong("received data");
    }
    if (sum[0] != 2.0) wrong("allreduce result");
  });
  expectAllOk(results);
}

// Blocking sends and receives from two threads of one rank while its main thread runs collectives.
TEST(PointToPoint, AnyThreadMaySendWhileCollectivesRun) {
  auto results = runRanks(2, makeOptions(), [&](Comm& c) {
    const int peer = 1 - c.rank();
    std::thread side([&] {
      for (int k = 0; k < 50; ++k) {
        int32_t v = c.rank() * 100 + k, got = -1;
        if (c.rank() == 0) {
          c.send(&v, 1, ddlInt32, peer);
          c.recv(&got, 1, ddlInt32, peer);
        } else {
          c.recv(&got, 1, ddlInt32, peer);
          c.send(&v, 1, ddlInt32, peer);
        }
        if (got != peer * 100 + k) throw Error(ddlInternalError, "p2p value " + std::to_string(got));
      }
    });
    std::vector<float> buf(1000, 1.0f);
    for (int k = 0; k < 50; ++k) c.allReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlMax);
    side.join();
  });
  expectAllOk(results);
}

TEST(PointToPoint, CountMismatchIsAnErrorNamingThePeer) {
  auto results = runRanks(2, makeOptions(), [&](Comm& c) {
    std::vector<float> buf(12);
    if (c.rank() == 0) {
      c.send(buf.data(), 10, ddlFloat32, 1);
    } else {
      c.recv(buf.data(), 12, ddlFloat32, 0);
    }
  });
  EXPECT_EQ(results[1].code, ddlInvalidArgument) << results[1].what;
  EXPECT_NE(results[1].what.find("point-to-point mismatch: rank 0"), std::string::npos) << results[1].what;
}

TEST(PointToPoint, ReceiveFromADeadRankFailsNamingIt) {
  auto fabric = std::make_shared<LocalFabric>(3);
  const auto t0 = std::chrono::steady_clock::now();
  auto results = runRanks(3, makeOptions(30000), [&](Comm& c) {
    float v = 0;
    if (c.rank() == 2) {
      fabric->kill(2, "killed by the test");
      return;
    }
    c.recv(&v, 1, ddlFloat32, 2);
  }, fabric);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  for (int r : {0, 1}) {
    EXPECT_EQ(results[r].code, ddlRemoteError) << results[r].what;
    EXPECT_NE(results[r].what.find("rank 2"), std::string::npos) << results[r].what;
  }
}

TEST(PointToPoint, UnmatchedReceiveTimesOutAndBreaksTheCommunicator) {
  std::vector<std::string> later(2);
  std::atomic<bool> timed_out{false};
  auto results = runRanks(2, makeOptions(500), [&](Comm& c) {
    float v = 0;
    if (c.rank() == 1) {
      try {
        c.recv(&v, 1, ddlFloat32, 0);  // rank 0 never sends
      } catch (const Error& e) {
        later[1] = e.what();
        timed_out = true;
        c.barrier();  // broken now: fails at once with the same story
      }
    } else {
      // Joins only after rank 1's receive gave up (bounded: 10 s), then must find out from rank 1.
      for (int i = 0; i < 10000 && !timed_out; ++i) std::this_thread::sleep_for(1ms);
      c.barrier();
    }
  });
  EXPECT_NE(later[1].find("timed out after 500 ms"), std::string::npos) << later[1];
  EXPECT_NE(later[1].find("receive of 1 float32 from rank 0"), std::string::npos) << later[1];
  EXPECT_NE(results[1].code, ddlSuccess);
  EXPECT_NE(results[1].what.find("unusable after an earlier error"), std::string::npos) << results[1].what;
  EXPECT_NE(results[0].code, ddlSuccess) << "rank 0 was not told";
}

TEST(PointToPoint, AbortFailsPendingReceives) {
  auto results = runRanks(2, makeOptions(30000), [&](Comm& c) {
    if (c.rank() == 1) return;
    float v = 0;
    auto op = c.irecv(&v, 1, ddlFloat32, 1);
    std::this_thread::sleep_for(100ms);
    c.abort();
    const auto t0 = std::chrono::steady_clock::now();
    op->done.wait(false);
    if (std::chrono::steady_clock::now() - t0 > 5s) wrong("abort took too long");
    if (op->result != ddlAborted) wrong("result " + std::to_string(op->result) + ": " + op->error);
  });
  expectAllOk(results);
}

TEST(PointToPoint, DestroyFailsWhatIsStillPending) {
  std::shared_ptr<AsyncOp> op;
  float v = 0;
  auto results = runRanks(2, makeOptions(30000), [&](Comm& c) {
    if (c.rank() == 0) op = c.irecv(&v, 1, ddlFloat32, 1);
    c.barrier();
    if (c.rank() == 0) c.shutdown();
  });
  expectAllOk(results);
  ASSERT_TRUE(op);
  ASSERT_TRUE(op->done.load());
  EXPECT_EQ(op->result, ddlAborted) << op->error;
  EXPECT_NE(op->error.find("destroyed"), std::string::npos) << op->error;
}

// ---- Tagged point-to-point ----

// Rank 0 sends two messages with tag 7, one with tag 5 and one with the largest tag, then an untagged one and
// one with tag 0; rank 1 posts its receives in another order. Each receive takes the first message of its
// tag (large and small, eager and rendezvous: the order within a tag holds), and untagged and tagged
// messages never match each other.
TEST(TaggedPointToPoint, ReceivesMatchByTagInSendOrderWithinATag) {
  auto results = runRanks(2, makeOptions(), [&](Comm& c) {
    std::vector<int32_t> big7(100003, 71), small7(3, 72), m5(5, 50), mmax(1, 99), untagged(2, 1), zero(2, 2);
    if (c.rank() == 0) {
      std::vector<std::shared_ptr<AsyncOp>> ops{
          c.isendTagged(big7.data(), big7.size(), ddlInt32, 1, 7),
          c.isendTagged(small7.data(), small7.size(), ddlInt32, 1, 7),
          c.isendTagged(m5.data(), m5.size(), ddlInt32, 1, 5),
          c.isendTagged(mmax.data(), mmax.size(), ddlInt32, 1, DDL_MAX_TAG),
          c.isend(untagged.data(), untagged.size(), ddlInt32, 1),
          c.isendTagged(zero.data(), zero.size(), ddlInt32, 1, 0)};
      for (auto& op : ops) {
        op->done.wait(false);
        if (op->result != ddlSuccess) wrong(op->error);
      }
      return;
    }
    std::vector<int32_t> got_max(1), got5(5), got_big(big7.size()), got_small(3), got_zero(2), got_untagged(2);
    int src_max = -1, src5 = -1, src_big = -1, src_small = -1, src_zero = -1;
    std::vector<std::shared_ptr<AsyncOp>> ops{
        c.irecvTagged(got_max.data(), 1, ddlInt32, 0, DDL_MAX_TAG, &src_max),
        c.irecvTagged(got_zero.data(), 2, ddlInt32, DDL_ANY_SOURCE, 0, &src_zero),
        c.irecv(got_untagged.data(), 2, ddlInt32, 0),
        c.irecvTagged(got5.data(), 5, ddlInt32, 0, 5, &src5),
        c.irecvTagged(got_big.data(), got_big.size(), ddlInt32, 0, 7, &src_big),
        c.irecvTagged(got_small.data(), 3, ddlInt32, DDL_ANY_SOURCE, 7, &src_small)};
    for (auto& op : ops) {
      op->done.wait(false);
      if (op->result != ddlSuccess) wrong(op->error);
    }
    if (got_max != mmax || got5 != m5 || got_big != big7 || got_small != small7) wrong("tagged data");
    if (got_zero != zero || got_untagged != untagged) wrong("tagged and untagged messages were mixed up");
    for (int src : {src_max, src5, src_big, src_small, src_zero})
      if (src != 0) wrong("source " + std::to_string(src));
  });
  expectAllOk(results);
}

// Every other rank sends rank 0 its rank with tag 3; rank 0 receives them all from any source and learns who
// sent each. Then rank 0 answers each sender, which receives from any source too.
TEST(TaggedPointToPoint, AnySourceReceivesReportTheSender) {
  for (int n : {2, 3, 4, 7}) {
    auto results = runRanks(n, makeOptions(), [&](Comm& c) {
      if (c.rank() != 0) {
        int32_t mine = c.rank() * 10, answer = -1;
        int from = -1;
        auto s = c.isendTagged(&mine, 1, ddlInt32, 0, 3);
        auto r = c.irecvTagged(&answer, 1, ddlInt32, DDL_ANY_SOURCE, 4, &from);
        for (auto* op : {&s, &r}) {
          (*op)->done.wait(false);
          if ((*op)->result != ddlSuccess) wrong((*op)->error);
        }
        if (from != 0 || answer != c.rank() + 1000) wrong("answer " + std::to_string(answer));
        return;
      }
      std::vector<int32_t> got(n - 1, -1);
      std::vector<int> from(n - 1, -1);
      std::vector<std::shared_ptr<AsyncOp>> ops;
      for (int k = 0; k < n - 1; ++k) ops.push_back(c.irecvTagged(&got[k], 1, ddlInt32, DDL_ANY_SOURCE, 3, &from[k]));
      std::vector<int> seen(n, 0);
      for (int k = 0; k < n - 1; ++k) {
        ops[k]->done.wait(false);
        if (ops[k]->result != ddlSuccess) wrong(ops[k]->error);
        if (from[k] < 1 || from[k] >= n || got[k] != from[k] * 10) wrong("message " + std::to_string(got[k]));
        ++seen[from[k]];
      }
      for (int r = 1; r < n; ++r)
        if (seen[r] != 1) wrong("rank " + std::to_string(r) + " seen " + std::to_string(seen[r]) + " times");
      std::vector<int32_t> answers(n);
      for (int r = 1; r < n; ++r) {
        answers[r] = r + 1000;
        auto op = c.isendTagged(&answers[r], 1, ddlInt32, r, 4);
        op->done.wait(false);
        if (op->result != ddlSuccess) wrong(op->error);
      }
    });
    expectAllOk(results);
  }
}

TEST(TaggedPointToPoint, BadTagsAndPeersAreRefusedAndBreakNothing) {
  auto results = runRanks(2, makeOptions(), [&](Comm& c) {
    int32_t v = c.rank();
    auto refused = [&](const char* what, auto&& call) {
      try {
        call();
      } catch (const Error& e) {
        if (e.code() != ddlInvalidArgument) wrong(std::string(what) + ": code " + std::to_string(e.code()));
        return;
      }
      wrong(std::string(what) + " was accepted");
    };
    refused("a negative tag", [&] { c.isendTagged(&v, 1, ddlInt32, 1 - c.rank(), -1); });
    refused("a send to any source", [&] { c.isendTagged(&v, 1, ddlInt32, DDL_ANY_SOURCE, 1); });
    refused("an untagged receive from any source", [&] { c.irecv(&v, 1, ddlInt32, DDL_ANY_SOURCE); });
    refused("a receive from this rank", [&] { c.irecvTagged(&v, 1, ddlInt32, c.rank(), 1, nullptr); });
    // Nothing broke: a tagged exchange and a collective still work.
    int32_t got = -1;
    auto r = c.irecvTagged(&got, 1, ddlInt32, 1 - c.rank(), 11, nullptr);
    auto s = c.isendTagged(&v, 1, ddlInt32, 1 - c.rank(), 11);
    for (auto* op : {&s, &r}) {
      (*op)->done.wait(false);
      if ((*op)->result != ddlSuccess) wrong((*op)->error);
    }
    if (got != 1 - c.rank()) wrong("value after refusals");
    c.barrier();
  });
  expectAllOk(results);
}

// A receive from any source that nobody answers ends with the timeout, naming what it waited for.
TEST(TaggedPointToPoint, UnansweredAnySourceReceiveTimesOut) {
  auto results = runRanks(3, makeOptions(500), [&](Comm& c) {
    if (c.rank() != 0) return;
    float v = 0;
    auto op = c.irecvTagged(&v, 1, ddlFloat32, DDL_ANY_SOURCE, 8, nullptr);
    const auto t0 = std::chrono::steady_clock::now();
    op->done.wait(false);
    if (std::chrono::steady_clock::now() - t0 > 10s) wrong("the timeout took too long");
    if (op->result != ddlTimeout) wrong("result " + std::to_string(op->result) + ": " + op->error);
    if (op->error.find("receive of 1 float32 from any rank with tag 8 timed out") == std::string::npos)
      wrong(op->error);
  });
  expectAllOk(results);
}

}  // namespace
}  // namespace ddl
