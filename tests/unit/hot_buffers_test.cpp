// torch_ddl's HotBuffers (python/src/hot_buffers.h), torch-free, over libddl's communicator on the emulated
// GPU (fake_device.h), ranks as threads. A "storage" is a shared_ptr to a device buffer: the test holds it as
// DDP holds its buckets, and drops it as DDP does when it rebuilds them.
//
// - DDP's buckets, allreduced in place every step, become registered at a round and zero-copy (the node
//   kernel copies nothing); rebuilt buckets replace them at a later round, and the old ones are deregistered
//   and let go; every result is right throughout;
// - memory a member cannot share (as PyTorch's expandable segments) fails on every rank, stays staged and
//   right, is not offered again, and the group stops after kMaxRefusals refusals;
// - a round while a capture is under way changes nothing; the next one registers;
// - the rounds' calls; the candidates stay bounded, holding nothing.
#include "../../python/src/hot_buffers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "error.h"
#include "fake_device.h"
#include "node_rig.h"
#include "test_values.h"
#include "thread_ranks.h"

namespace ddl {
namespace {

using test_util::expectAllOk;
using test_util::FakeBuffer;
using test_util::FakeCounters;
using test_util::FakeStream;
using test_util::makeInput;
using torch_ddl::HotBufferOps;
using Rig = test_util::NodeRig;

struct BufferTraits {
  using Strong = std::shared_ptr<FakeBuffer>;
  using Weak = std::weak_ptr<FakeBuffer>;
  static Weak weak(const Strong& s) { return s; }
  static Strong lock(const Weak& w) { return w.lock(); }
  static const void* id(const Strong& s) { return s.get(); }
  static void* data(const Strong& s) { return s->p; }
  static size_t bytes(const Strong& s) { return s->bytes; }
  static bool othersHold(const Strong& s) { return s.use_count() > 1; }
};
using Hot = torch_ddl::HotBuffers<BufferTraits>;

// The rounds' collectives on the communicator, as torch_ddl makes them over the C API.
HotBufferOps opsOf(Comm& comm, int* adds = nullptr) {
  HotBufferOps o;
  o.max_all = [&comm](std::vector<int64_t>& v) {
    comm.allReduce(v.data(), v.data(), v.size(), ddlInt64, ddlMax);
  };
  o.add = [&comm, adds](void* p, size_t n, std::string* why) -> void* {
    if (adds) ++*adds;
    try {
      return comm.registerBuffer(p, n);
    } catch (const Error& e) {
      if (e.code() != ddlInvalidArgument) throw;
      *why = e.what();
      return nullptr;
    }
  };
  o.remove = [&comm](void* h) { comm.deregisterBuffer(h); };
  return o;
}

// Each rank's HotBuffers, made in its body and destroyed after the communicators, as a process group's
// outlives its communicator: registered buffers are let go only once nothing maps them.
struct Hots {
  explicit Hots(int n) : of_rank(static_cast<size_t>(n)) {}
  Hot& of(Comm& comm) {
    auto& h = of_rank[static_cast<size_t>(comm.rank())];
    h = std::make_unique<Hot>();
    return *h;
  }
  std::vector<std::unique_ptr<Hot>> of_rank;
};

// A model's gradient buckets: float32 element counts, the same on every rank.
std::vector<std::shared_ptr<FakeBuffer>> buckets(const std::vector<size_t>& counts) {
  std::vector<std::shared_ptr<FakeBuffer>> b;
  for (size_t c : counts) b.push_back(std::make_shared<FakeBuffer>(c * 4));
  return b;
}

// One training step: every bucket noted, then allreduced in place and checked. Returns whether the node
// kernel copied nothing in the step (every call zero-copy).
bool step(Comm& comm, Hot& hot, const HotBufferOps& ops, const std::vector<std::shared_ptr<FakeBuffer>>& bs,
          FakeCounters& counters, int seed) {
  FakeStream stream;
  comm.barrier();
  const int copies = counters.kernel_copies.load();
  comm.barrier();
  for (const auto& b : bs) {
    const size_t count = b->bytes / 4;
    const auto in = makeInput(ddlFloat32, ddlSum, comm.rank() + seed, count);
    std::memcpy(b->p, in.data(), in.size());
    hot.note(b, false, ops);
    comm.allReduceOnStream(b->p, b->p, count, ddlFloat32, ddlSum, &stream);
    stream.sync();
    std::vector<char> want(count * 4, 0), got(count * 4);
    std::memcpy(got.data(), b->p, got.size());
    // The sum over the ranks of makeInput(r + seed): each rank's input shifted by seed.
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < comm.size(); ++r) {
      const auto x = makeInput(ddlFloat32, ddlSum, r + seed, count);
      for (size_t i = 0; i < count; ++i) sum[i] += reinterpret_cast<const float*>(x.data())[i];
    }
    std::memcpy(want.data(), sum.data(), want.size());
    if (got != want) fail(ddlInternalError, "step " + std::to_string(seed) + ": a bucket's sum is wrong");
  }
  comm.barrier();
  const bool zero = counters.kernel_copies.load() == copies;
  comm.barrier();
  return zero;
}

TEST(HotBuffers, DdpsBucketsBecomeZeroCopyAndRebuiltOnesReplaceThem) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    Rig rig;
    Hots hots(n);
    expectAllOk(test_util::runRanks(n, rig, /*one_node=*/true, [&](Comm& comm) {
      Hot& hot = hots.of(comm);
      const HotBufferOps ops = opsOf(comm);
      int call = 0, seed = 0;
      // The first iteration's buckets, then the rebuilt ones (DDP rebuilds them after its first step).
      auto first = buckets({4000, 70001, 500});
      step(comm, hot, ops, first, *rig.counters, seed++);
      call += 3;
      std::weak_ptr<FakeBuffer> gone = first[0];
      first.clear();
      EXPECT_TRUE(gone.expired()) << "a candidate was held";
      auto built = buckets({30000, 65536, 1234});
      // Calls 4 to 15, staged (the third bucket at least): the round at call 8 registers the two used twice.
      for (; call < 15; call += 3) EXPECT_FALSE(step(comm, hot, ops, built, *rig.counters, seed++));
      EXPECT_EQ(hot.registered(), 2);
      step(comm, hot, ops, built, *rig.counters, seed++);  // calls 16 to 18: the round registers the third
      call += 3;
      EXPECT_EQ(hot.registered(), 3);
      for (int i = 0; i < 3; ++i, call += 3) {
        EXPECT_TRUE(step(comm, hot, ops, built, *rig.counters, seed++)) << "registered buckets were staged";
      }
      // DDP's buckets rebuilt again (a model changed): the round at call 32 lets the old ones go and
      // registers the two new ones used twice by then, the one at call 64 the third.
      std::vector<std::weak_ptr<FakeBuffer>> old(built.begin(), built.end());
      built = buckets({30000, 65536, 1234});
      for (; call < 36; call += 3) step(comm, hot, ops, built, *rig.counters, seed++);
      EXPECT_EQ(hot.registered(), 2);
      for (const auto& w : old) EXPECT_TRUE(w.expired()) << "a deregistered bucket was still held";
      for (; call < 66; call += 3) step(comm, hot, ops, built, *rig.counters, seed++);
      EXPECT_EQ(hot.registered(), 3);
      EXPECT_TRUE(step(comm, hot, ops, built, *rig.counters, seed++));
      EXPECT_EQ(hot.refusals(), 0) << hot.lastRefusal();
    }));
  }
}

TEST(HotBuffers, MemoryAMemberCannotShareStaysStagedAndIsNotOfferedAgain) {
  Rig rig;
  rig.refuse_foreign_ipc = {1};
  Hots hots(2);
  expectAllOk(test_util::runRanks(2, rig, /*one_node=*/true, [&](Comm& comm) {
    Hot& hot = hots.of(comm);
    int adds = 0;
    const HotBufferOps ops = opsOf(comm, &adds);
    auto bs = buckets({1000, 2000, 3000, 4000, 5000, 6000});
    for (int s = 0; s < 12; ++s) EXPECT_FALSE(step(comm, hot, ops, bs, *rig.counters, s));  // 72 calls
    EXPECT_EQ(hot.registered(), 0);
    EXPECT_EQ(hot.refusals(), Hot::kMaxRefusals);
    EXPECT_EQ(adds, Hot::kMaxRefusals) << "the group went on trying after its last refusal";
    const std::string want = comm.rank() == 1 ? "cannot be shared over CUDA IPC" : "member 1";
    EXPECT_NE(hot.lastRefusal().find(want), std::string::npos) << hot.lastRefusal();
    EXPECT_EQ(comm.asyncError(), ddlSuccess);
  }));
}

// Rank 1 captures a graph at every round up to call 16 (the buffer is hot from the round at call 2 on): those
// rounds register nothing, and their blocking exchange asks CUDA nothing a capture in the global mode could
// count as unsafe. The round at call 32 registers.
TEST(HotBuffers, ARoundDuringACaptureChangesNothingAndTheNextRegisters) {
  Rig rig;
  Hots hots(2);
  expectAllOk(test_util::runRanks(2, rig, /*one_node=*/true, [&](Comm& comm) {
    Hot& hot = hots.of(comm);
    const HotBufferOps ops = opsOf(comm);
    auto b = std::make_shared<FakeBuffer>(4096);
    FakeStream stream, graph;
    comm.allReduceOnStream(b->p, b->p, 1024, ddlFloat32, ddlSum, &stream);  // sets the node kernel up
    stream.sync();
    for (uint64_t call = 1; call <= 16; ++call) {
      const bool capture = Hot::roundAt(call) && comm.rank() == 1;
      if (capture) rig.runtimes[1]->beginCapture(&graph);
      EXPECT_EQ(comm.streamCapturing(&graph), capture);  // ddlCommStreamCapturing
      hot.note(b, comm.streamCapturing(&graph), ops);
      if (capture) rig.runtimes[1]->endCapture();
    }
    EXPECT_EQ(hot.registered(), 0) << "a round registered during a capture";
    EXPECT_EQ(rig.counters->strict_capture_queries.load(), 0);
    for (uint64_t call = 17; call <= 32; ++call) hot.note(b, false, ops);
    EXPECT_EQ(hot.registered(), 1);
  }));
}

// A registration that one rank's captured call used is kept on every rank, though no rank holds the storage
// any more: the graph may replay it (ddlCommDeregister's contract). Another storage is registered beside it.
TEST(HotBuffers, ARegistrationACapturedCallUsedIsNeverLetGo) {
  Rig rig;
  Hots hots(2);
  expectAllOk(test_util::runRanks(2, rig, /*one_node=*/true, [&](Comm& comm) {
    Hot& hot = hots.of(comm);
    const HotBufferOps ops = opsOf(comm);
    auto b = std::make_shared<FakeBuffer>(4096), c = std::make_shared<FakeBuffer>(4096);
    FakeStream stream;
    comm.allReduceOnStream(b->p, b->p, 1024, ddlFloat32, ddlSum, &stream);  // sets the node kernel up
    stream.sync();
    hot.note(b, false, ops);
    hot.note(b, false, ops);  // the round at call 2 registers it
    ASSERT_EQ(hot.registered(), 1);
    hot.note(b, /*capturing=*/comm.rank() == 1, ops);  // call 3: rank 1's is captured
    std::weak_ptr<FakeBuffer> gone = b;
    b.reset();                                                      // no rank holds it any more
    for (int call = 4; call <= 8; ++call) hot.note(c, false, ops);  // rounds at 4 and 8
    EXPECT_EQ(hot.registered(), 2) << "a registration a graph uses was let go";
    EXPECT_FALSE(gone.expired());
  }));
}

TEST(HotBuffers, RoundsComeAtPowersOfTwoThenEveryKEveryCalls) {
  std::vector<uint64_t> at;
  for (uint64_t c = 1; c <= 4096; ++c)
    if (Hot::roundAt(c)) at.push_back(c);
  EXPECT_EQ(at, (std::vector<uint64_t>{2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 3072, 4096}));
}

// One rank alone, its collectives the identity: many short-lived buffers leave the candidates bounded and
// held by nobody; the ones still used are registered, most used first, at most kPerRound a round.
TEST(HotBuffers, CandidatesStayBoundedAndHoldNothing) {
  HotBufferOps ops;
  std::vector<void*> added;
  ops.max_all = [](std::vector<int64_t>&) {};
  ops.add = [&added](void* p, size_t, std::string*) -> void* {
    added.push_back(p);
    return p;
  };
  ops.remove = [](void*) {};
  Hot hot;
  std::vector<std::shared_ptr<FakeBuffer>> kept;
  for (int i = 0; i < 10; ++i) kept.push_back(std::make_shared<FakeBuffer>(64));
  for (int call = 0; call < 200; ++call) {
    if (call % 2 == 0) {
      auto transient = std::make_shared<FakeBuffer>(64);
      std::weak_ptr<FakeBuffer> w = transient;
      hot.note(transient, false, ops);
      transient.reset();
      EXPECT_TRUE(w.expired());
    } else {
      hot.note(kept[static_cast<size_t>(call / 2) % kept.size()], false, ops);
    }
    EXPECT_LE(hot.candidates(), Hot::kMaxCandidates);
  }
  EXPECT_EQ(hot.registered(), 10);
  // A storage without memory (torch.empty(0)) is never a candidate: ddlCommRegister would refuse it on this
  // rank alone, before the others meet it.
  auto empty = std::make_shared<FakeBuffer>(0);
  const int candidates = hot.candidates();
  for (int call = 0; call < 40; ++call) hot.note(empty, false, ops);
  EXPECT_EQ(hot.candidates(), candidates);
  EXPECT_EQ(hot.registered(), 10);
  // Each once: the rounds at calls 32 and 64 registered them as they became hot (used twice).
  ASSERT_EQ(added.size(), 10u);
  std::sort(added.begin(), added.end());
  EXPECT_EQ(std::unique(added.begin(), added.end()), added.end());
}

}  // namespace
}  // namespace ddl
