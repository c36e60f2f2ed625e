// Stream-ordered device collectives (device/stream_path.h, node_kernel.h) on the emulated GPU
// (fake_device.h), ranks as threads: every build runs these, GPU or not. The emulation's streams run only
// when waited for, so a collective that does not order itself on the caller's stream gives wrong results
// here, and the node kernel's algorithm (the same code the CUDA kernel runs) meets its peers through real
// flags.
//
// - the node kernel: every collective, types and ops, one-shot and two-shot, many chunks, in place, many
//   calls in a row (rising epochs, alternating slots), against the host path's expected values;
// - the call returns before the result exists: the stream's later work sees it;
// - the scheme: ranks that share a GPU as processes without MPS, or on several nodes, are host-paced (and
//   still correct); with MPS, the kernel; DDL_DEVICE_SCHEME forces either;
// - capture: allowed on the kernel after a first call (the graph replayed), refused on the first call and
//   when host-paced;
// - failures: an abort ends a kernel waiting for a peer that never comes, a peer that never comes times out,
//   both break the communicator (ddlCommGetAsyncError); bad buffers are argument errors that break nothing;
// - misuse fails every rank rather than corrupting: calls that differ (named in the message), a graph
//   replayed beside an unordered call, a forced kernel where it would spin; a failed replay is raised by the
//   next call; a poison is not undone by the rank's own earlier kernel.
#include "device/stream_path.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "algo/plan.h"
#include "comm.h"
#include "device/node_kernel.h"
#include "dtype.h"
#include "error.h"
#include "fake_device.h"
#include "node_rig.h"
#include "rendezvous/store.h"
#include "test_values.h"
#include "thread_ranks.h"

namespace ddl {
namespace {

using test_util::expectAllOk;
using test_util::FakeBuffer;
using test_util::FakeCounters;
using test_util::FakeRuntime;
using test_util::FakeStream;
using test_util::makeExpected;
using test_util::makeInput;
using test_util::RankResult;
using test_util::runRanks;
using Rig = test_util::NodeRig;

void put(void* d, const std::vector<char>& h) { std::memcpy(d, h.data(), h.size()); }
std::vector<char> get(const void* d, size_t bytes) {
  std::vector<char> v(bytes);
  std::memcpy(v.data(), d, bytes);
  return v;
}
void expectSame(const std::vector<char>& got, const std::vector<char>& want, const std::string& what) {
  if (got != want) fail(ddlInternalError, what + ": the result differs from the expected one");
}

// Every stream-ordered collective once, checked, on the caller's stream.
void everyCollective(Comm& comm, ddlDataType_t type, ddlRedOp_t op, size_t count) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = typeSize(type), bytes = count * es;
  FakeStream stream;
  const std::string tag = std::string(typeName(type)) + "/" + opName(op) + " x" + std::to_string(count);
  {  // allreduce, out of place and in place
    FakeBuffer a(bytes), b(bytes);
    put(a.p, makeInput(type, op, r, count));
    comm.allReduceOnStream(a.p, b.p, count, type, op, &stream);
    comm.allReduceOnStream(a.p, a.p, count, type, op, &stream);
    stream.sync();
    expectSame(get(b.p, bytes), makeExpected(type, op, n, count), "allreduce " + tag);
    expectSame(get(a.p, bytes), makeExpected(type, op, n, count), "allreduce in place " + tag);
  }
  {  // reduce-scatter: count elements per rank
    FakeBuffer in(bytes * n), out(bytes);
    put(in.p, makeInput(type, op, r, count * n));
    comm.reduceScatterOnStream(in.p, out.p, count, type, op, &stream);
    stream.sync();
    auto want = makeExpected(type, op, n, count * n);
    expectSame(get(out.p, bytes), std::vector<char>(want.begin() + r * bytes, want.begin() + (r + 1) * bytes),
               "reduce-scatter " + tag);
  }
  {  // allgather, in place
    FakeBuffer all(bytes * n);
    put(static_cast<char*>(all.p) + r * bytes, makeInput(type, ddlSum, r, count));
    comm.allGatherOnStream(static_cast<char*>(all.p) + r * bytes, all.p, count, type, &stream);
    stream.sync();
    std::vector<char> want;
    for (int s = 0; s < n; ++s) {
      auto v = makeInput(type, ddlSum, s, count);
      want.insert(want.end(), v.begin(), v.end());
    }
    expectSame(get(all.p, bytes * n), want, "allgather " + tag);
  }
  {  // broadcast and reduce from the last rank
    const int root = n - 1;
    FakeBuffer a(bytes), b(bytes);
    put(a.p, makeInput(type, op, r, count));
    comm.broadcastOnStream(a.p, b.p, count, type, root, &stream);
    comm.reduceOnStream(a.p, a.p, count, type, op, root, &stream);
    stream.sync();
    expectSame(get(b.p, bytes), makeInput(type, op, root, count), "broadcast " + tag);
    expectSame(get(a.p, bytes), r == root ? makeExpected(type, op, n, count) : makeInput(type, op, r, count),
               "reduce " + tag);
  }
}

TEST(StreamPath, NodeKernelEveryCollective) {
  for (int nranks : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(nranks) + " ranks");
    Rig setup;
    expectAllOk(runRanks(nranks, setup, true, [&](Comm& comm) {
      // 1: one element; 1000: one-shot; 300001: two-shot (float32: 1.2 MB), odd counts throughout.
      everyCollective(comm, ddlFloat32, ddlSum, 1);
      EXPECT_EQ(comm.streamScheme(), "kernel");
      everyCollective(comm, ddlFloat32, ddlAvg, 1000);
      everyCollective(comm, ddlFloat32, ddlSum, 300001);
      everyCollective(comm, ddlInt32, ddlMax, 999);
      everyCollective(comm, ddlBfloat16, ddlMin, 77);
    }));
    EXPECT_GT(setup.counters->node_kernels.load(), 0);
    EXPECT_EQ(setup.counters->host_calls.load(), 0) << "no host in the node kernel's path";
  }
}

// The CTAs are chosen at the setup from what each GPU keeps resident and the ranks sharing it: every
// collective is right with any count (here odd ones, with chunks of odd lengths), and DDL_NODE_BLOCKS forces
// one the GPUs hold.
TEST(StreamPath, TheBlocksFollowTheGpusRoomAndEveryCollectiveIsRightWithAnyCount) {
  struct Case {
    int capacity, forced, want;
  };
  for (const Case& c : {Case{33, 0, 11}, Case{1 << 20, 0, node::kMaxBlocks}, Case{1 << 20, 13, 13}}) {
    SCOPED_TRACE("capacity " + std::to_string(c.capacity) + ", forced " + std::to_string(c.forced));
    Rig setup;  // 3 ranks share the emulated GPU
    setup.capacity = c.capacity;
    setup.node_blocks = c.forced;
    setup.slot_bytes = kMinNodeSlotBytes;
    expectAllOk(runRanks(3, setup, true, [&](Comm& comm) {
      everyCollective(comm, ddlFloat32, ddlSum, 1);
      everyCollective(comm, ddlFloat64, ddlAvg, 1001);
      everyCollective(comm, ddlInt32, ddlMax, 40009);
      EXPECT_EQ(comm.streamScheme(), "kernel");
    }));
    EXPECT_EQ(setup.counters->blocks.load(), c.want);
    EXPECT_EQ(setup.counters->host_calls.load(), 0);
  }
  Rig too_many;  // 3 ranks x 13 forced blocks do not fit 33 resident CTAs
  too_many.capacity = 33;
  too_many.node_blocks = 13;
  expectAllOk(runRanks(3, too_many, true, [&](Comm& comm) {
    everyCollective(comm, ddlFloat32, ddlSum, 1001);
    EXPECT_EQ(comm.streamScheme(), "host");
  }));
}

TEST(NodeKernel, BlocksFromEachGpusResidentCtasAndTheRanksSharingIt) {
  // A GPU of its own binds nothing below kMaxBlocks; shared ones give each rank its part, the least decides.
  EXPECT_EQ(nodeKernelBlocks({264, 264}, {1, 1}, 0), node::kMaxBlocks);
  EXPECT_EQ(nodeKernelBlocks({264, 264}, {2, 2}, 0), node::kMaxBlocks);
  EXPECT_EQ(nodeKernelBlocks({264, 264, 264, 264, 264, 264, 264, 264}, {8, 8, 8, 8, 8, 8, 8, 8}, 0), 33);
  EXPECT_EQ(nodeKernelBlocks({40, 264}, {1, 1}, 0), 40) << "a small GPU of its own: what it keeps resident";
  EXPECT_EQ(nodeKernelBlocks({0, 264}, {1, 1}, 0), node::kMaxBlocks) << "a GPU that cannot say binds nothing";
  EXPECT_EQ(nodeKernelBlocks({264, 264, 100}, {2, 2, 1}, 0), node::kMaxBlocks);
  EXPECT_EQ(nodeKernelBlocks({60, 60, 60}, {3, 3, 3}, 0), 20);
  EXPECT_EQ(nodeKernelBlocks({23, 23, 23}, {3, 3, 3}, 0), 0) << "fewer than kMinBlocks each: no kernel";
  EXPECT_EQ(nodeKernelBlocks({60, 60, 60}, {3, 3, 3}, 16), 16);
  EXPECT_EQ(nodeKernelBlocks({60, 60, 60}, {3, 3, 3}, 21), 0) << "a forced count the GPU cannot hold";
  int short_member = -1;
  EXPECT_EQ(nodeKernelBlocks({264, 264, 14, 14}, {1, 1, 2, 2}, 0, &short_member), 0);
  EXPECT_EQ(short_member, 2) << "the first member whose GPU cannot hold them";
  EXPECT_EQ(nodeKernelBlocks({10, 10}, {1, 1}, 48), 48) << "GPUs of their own take any forced count";
}

TEST(StreamPath, NodeKernelTypesOpsAndManyChunks) {
  Rig setup;
  setup.slot_bytes = kMinNodeSlotBytes;  // 256-byte sub-slots: several chunks per block, both slots
  expectAllOk(runRanks(3, setup, true, [&](Comm& comm) {
    for (int t = 0; t < ddlNumTypes; ++t) {
      for (int o = 0; o < ddlNumOps; ++o) {
        const auto type = static_cast<ddlDataType_t>(t);
        const auto op = static_cast<ddlRedOp_t>(o);
        if (!opTakesType(op, type)) continue;
        everyCollective(comm, type, op, 4099);
      }
    }
  }));
}

// Two-shot allreduces of many chunks per block, then collectives of other kinds and chunk lengths in a row:
// each block keeps to its own sub-slot whatever the kind, and its rounds and epochs carry over.
TEST(StreamPath, TwoShotManyChunksThenOtherKinds) {
  Rig setup;
  setup.slot_bytes = 64 << 10;  // 2 KiB sub-slots
  expectAllOk(runRanks(3, setup, true, [&](Comm& comm) {
    for (int i = 0; i < 2; ++i) {
      everyCollective(comm, ddlFloat32, ddlSum, 300001);  // two-shot: about 19 chunks per block
      everyCollective(comm, ddlFloat64, ddlMax, 1234);
    }
  }));
}

TEST(StreamPath, CallReturnsBeforeTheResultAndTheStreamSeesIt) {
  Rig setup;
  expectAllOk(runRanks(2, setup, true, [&](Comm& comm) {
    constexpr size_t kCount = 5000;
    FakeBuffer a(kCount * 4), b(kCount * 4);
    put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), kCount));
    FakeStream stream;
    comm.allReduceOnStream(a.p, b.p, kCount, ddlFloat32, ddlSum, &stream);  // sets the kernel up
    stream.sync();
    std::memset(b.p, 0, kCount * 4);
    comm.allReduceOnStream(a.p, b.p, kCount, ddlFloat32, ddlSum, &stream);
    // The call returned with nothing run (the emulated stream runs when driven; a real one may be anywhere).
    EXPECT_EQ(get(b.p, kCount * 4), std::vector<char>(kCount * 4, 0));
    // The stream's later work (a copy here) sees the result.
    FakeBuffer c(kCount * 4);
    stream.push([&] { std::memcpy(c.p, b.p, kCount * 4); });
    stream.sync();
    expectSame(get(c.p, kCount * 4), makeExpected(ddlFloat32, ddlSum, 2, kCount), "after the stream");
  }));
}

TEST(StreamPath, SharedGpuWithoutMpsIsHostPacedWithMpsTheKernel) {
  for (bool mps : {false, true}) {
    SCOPED_TRACE(mps ? "MPS" : "no MPS");
    Rig setup;
    setup.processes = true;  // one emulated GPU, ranks as processes of their own
    setup.mps = mps;
    expectAllOk(runRanks(3, setup, true, [&](Comm& comm) {
      everyCollective(comm, ddlFloat32, ddlSum, 1001);
      everyCollective(comm, ddlInt64, ddlProd, 300001);
      EXPECT_EQ(comm.streamScheme(), mps ? "kernel" : "host");
    }));
    if (mps) {
      EXPECT_EQ(setup.counters->host_calls.load(), 0);
    } else {
      EXPECT_EQ(setup.counters->node_kernels.load(), 0);
      EXPECT_GT(setup.counters->host_calls.load(), 0);
    }
  }
}

// Ranks sharing a GPU whose resident CTAs cannot hold all of theirs would wait for CTAs never scheduled.
TEST(StreamPath, ASharedGpuTooSmallForEveryRanksBlocksIsHostPaced) {
  Rig setup;
  setup.capacity = 3 * node::kMinBlocks - 1;  // not the fewest blocks for each of 3 ranks
  expectAllOk(runRanks(3, setup, true, [&](Comm& comm) {
    everyCollective(comm, ddlFloat32, ddlSum, 1001);
    EXPECT_EQ(comm.streamScheme(), "host");
  }));
  Rig enough;
  enough.capacity = 3 * node::kMinBlocks;
  expectAllOk(runRanks(3, enough, true, [&](Comm& comm) {
    everyCollective(comm, ddlFloat32, ddlSum, 1001);
    EXPECT_EQ(comm.streamScheme(), "kernel");
  }));
}

TEST(StreamPath, ForcedSchemes) {
  for (auto scheme : {DeviceScheme::kHost, DeviceScheme::kKernel}) {
    Rig setup;
    setup.scheme = scheme;
    expectAllOk(runRanks(2, setup, true, [&](Comm& comm) {
      everyCollective(comm, ddlFloat64, ddlMax, 4097);
      EXPECT_EQ(comm.streamScheme(), scheme == DeviceScheme::kHost ? "host" : "kernel");
    }));
  }
}

// DDL_DEVICE_SCHEME=kernel means the node kernel or an error. It never lifts the refusals that keep a kernel
// from spinning forever: ranks sharing a GPU as processes without MPS (their kernels take turns, so a kernel
// waiting for a peer's would wait for the timeout), and a GPU whose resident CTAs cannot hold every sharing
// rank's blocks.
TEST(StreamPath, AForcedKernelNeverSpinsWhereItCannotServe) {
  for (bool processes : {true, false}) {
    SCOPED_TRACE(processes ? "processes without MPS" : "too few resident CTAs");
    Rig setup;
    setup.scheme = DeviceScheme::kKernel;
    setup.processes = processes;
    if (!processes) setup.capacity = node::kMinBlocks;
    expectAllOk(runRanks(2, setup, true, [&](Comm& comm) {
      FakeStream stream;
      FakeBuffer a(4096);
      try {
        comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
        ADD_FAILURE() << "a forced kernel was taken where it cannot serve";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ddlInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("DDL_DEVICE_SCHEME=kernel"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(processes ? "without the MPS daemon" : "resident CTAs"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_EQ(comm.asyncError(), ddlSuccess) << "a refusal breaks nothing";
      std::vector<float> h(4, 1.0f);
      comm.allReduce(h.data(), h.data(), 4, ddlFloat32, ddlSum);
      EXPECT_EQ(h[0], 2.0f);
    }));
    EXPECT_EQ(setup.counters->node_kernels.load(), 0);
    EXPECT_EQ(setup.counters->host_calls.load(), 0);
  }
}

TEST(StreamPath, SeveralNodesAreHostPaced) {
  Rig setup;
  expectAllOk(runRanks(3, setup, false, [&](Comm& comm) {
    everyCollective(comm, ddlFloat32, ddlSum, 3001);
    EXPECT_EQ(comm.streamScheme(), "host");
  }));
  EXPECT_EQ(setup.counters->node_kernels.load(), 0);
}

// Several nodes whose ranks share memory (the node is mdring's dim 0): a stream-ordered allreduce runs the
// node kernel's reduce-scatter and allgather on each node, and in between each rank's block crosses the
// nodes with the emulated GPU folding what arrives. Uneven blocks (counts that the node's ranks do not
// divide; ranks with empty blocks), three ops, in place; the other collectives are host-paced and right.
TEST(StreamPath, AcrossNodesTheNodeKernelRunsAndTheGpuFoldsWhatArrives) {
  struct Layout {
    int nranks, per_node;
  };
  for (const Layout& l : {Layout{4, 2}, Layout{6, 3}, Layout{8, 4}}) {
    SCOPED_TRACE(std::to_string(l.nranks) + " ranks, " + std::to_string(l.per_node) + " per node");
    Rig setup;
    setup.per_node = l.per_node;
    expectAllOk(runRanks(l.nranks, setup, false, [&](Comm& comm) {
      if (comm.intraNodePath() != "shm+ucx") fail(ddlInternalError, "path " + comm.intraNodePath());
      FakeStream stream;
      {  // The first stream-ordered call, a broadcast (host-paced across nodes), sets the kernel up.
        FakeBuffer a(4096);
        put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), 1024));
        comm.broadcastOnStream(a.p, a.p, 1024, ddlFloat32, 0, &stream);
        stream.sync();
        expectSame(get(a.p, 4096), makeInput(ddlFloat32, ddlSum, 0, 1024), "broadcast");
        EXPECT_EQ(comm.streamScheme(), "kernel+wire");
      }
      const int folds = setup.runtimes[comm.rank()]->pinnedReductions();
      for (size_t count : {size_t{1}, size_t{2}, size_t{3001}, size_t{100003}}) {
        for (auto [t, op] :
             {std::pair{ddlFloat32, ddlSum}, std::pair{ddlInt32, ddlMax}, std::pair{ddlFloat32, ddlAvg}}) {
          const std::string what = std::to_string(count) + " " + typeName(t) + " " + opName(op);
          const size_t bytes = count * typeSize(t);
          FakeBuffer a(bytes), b(bytes);
          put(a.p, makeInput(t, op, comm.rank(), count));
          comm.allReduceOnStream(a.p, b.p, count, t, op, &stream);
          comm.allReduceOnStream(a.p, a.p, count, t, op, &stream);
          stream.sync();
          expectSame(get(b.p, bytes), makeExpected(t, op, l.nranks, count), what + ": out of place");
          expectSame(get(a.p, bytes), makeExpected(t, op, l.nranks, count), what + ": in place");
        }
      }
      EXPECT_GT(setup.runtimes[comm.rank()]->pinnedReductions(), folds)
          << "this rank's GPU folds what crossed the wire";
      everyCollective(comm, ddlFloat32, ddlSum, 1001);
    }));
    EXPECT_GT(setup.counters->node_kernels.load(), 0);
    EXPECT_EQ(setup.counters->exports.load(), l.nranks) << "the node kernel's regions, and no IPC scratch";
  }
}

// With racks above the nodes (2 ranks per node x 2 x 2), mdring's levels keep the slower links' bytes down:
// the stream-ordered allreduce is host-paced (the blocking path: the node over IPC, the CPU across levels).
TEST(StreamPath, AcrossNodesWithTwoLevelsAboveTheNodeIsHostPaced) {
  Rig setup;
  setup.per_node = 2;
  setup.topology = "2x2x2";
  expectAllOk(runRanks(8, setup, false, [&](Comm& comm) {
    everyCollective(comm, ddlFloat32, ddlAvg, 3001);
    EXPECT_EQ(comm.streamScheme(), "host");
  }));
  EXPECT_EQ(setup.counters->node_kernels.load(), 0);
  EXPECT_EQ(setup.counters->pinned_reductions.load(), 0);
}

// A non-blocking device allreduce still running when a stream-ordered one across nodes comes: the latter
// waits for it (both use the wire and the device queues), and both are right.
TEST(StreamPath, AcrossNodesAfterANonBlockingAllReduce) {
  Rig setup;
  setup.per_node = 2;
  expectAllOk(runRanks(4, setup, false, [&](Comm& comm) {
    constexpr size_t kCount = 200003;
    FakeStream stream;
    FakeBuffer a(kCount * 4), b(kCount * 4);
    for (int i = 0; i < 3; ++i) {
      put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), kCount));
      put(b.p, makeInput(ddlFloat32, ddlMax, comm.rank(), kCount));
      auto pending = comm.iallReduce(b.p, b.p, kCount, ddlFloat32, ddlMax);
      comm.allReduceOnStream(a.p, a.p, kCount, ddlFloat32, ddlSum, &stream);
      pending->done.wait(false);
      if (pending->result != ddlSuccess) fail(pending->result, pending->error);
      stream.sync();
      expectSame(get(a.p, a.bytes), makeExpected(ddlFloat32, ddlSum, 4, kCount), "stream-ordered");
      expectSame(get(b.p, b.bytes), makeExpected(ddlFloat32, ddlMax, 4, kCount), "non-blocking");
    }
  }));
}

// The block crosses in many chunks (4 KiB: the pipeline's slots and events turn over many times), and the
// input the caller's stream writes (queued, not yet run) is what the node kernel reads.
TEST(StreamPath, AcrossNodesTheBlockCrossesInChunksAfterTheStreamsEarlierWork) {
  Rig setup;
  setup.per_node = 2;
  setup.staged_chunk_bytes = 4096;
  expectAllOk(runRanks(6, setup, false, [&](Comm& comm) {
    constexpr size_t kCount = 300007;
    FakeStream stream;
    for (ddlRedOp_t op : {ddlSum, ddlAvg}) {
      FakeBuffer d(kCount * 4);
      const auto in = makeInput(ddlFloat32, op, comm.rank(), kCount);
      stream.push([&] { put(d.p, in); });
      comm.allReduceOnStream(d.p, d.p, kCount, ddlFloat32, op, &stream);
      stream.sync();
      expectSame(get(d.p, d.bytes), makeExpected(ddlFloat32, op, 6, kCount), opName(op));
    }
  }));
}

// A rank of the second node cannot export its memory: no node runs the kernel (the agreement spans the
// nodes), every stream-ordered call is host-paced, and the results are right. And a call under capture
// across nodes is refused (the host takes part), breaking nothing.
TEST(StreamPath, AcrossNodesAFailedSetupAnywhereIsHostPacedEverywhereAndCaptureIsRefused) {
  Rig refused;
  refused.per_node = 2;
  refused.refuse_ipc = {3};
  expectAllOk(runRanks(4, refused, false, [&](Comm& comm) {
    everyCollective(comm, ddlFloat32, ddlSum, 3001);
    EXPECT_EQ(comm.streamScheme(), "host");
  }));
  EXPECT_EQ(refused.counters->node_kernels.load(), 0);

  Rig setup;
  setup.per_node = 2;
  expectAllOk(runRanks(4, setup, false, [&](Comm& comm) {
    FakeRuntime& rt = *setup.runtimes[comm.rank()];
    FakeStream stream;
    FakeBuffer a(4096);
    put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), 1024));
    comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
    stream.sync();
    rt.beginCapture(&stream);
    try {
      comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
      ADD_FAILURE() << "a call across nodes under capture was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ddlInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("across nodes"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(rt.endCapture().empty());
    EXPECT_EQ(comm.asyncError(), ddlSuccess) << "an argument error breaks nothing";
    expectSame(get(a.p, 4096), makeExpected(ddlFloat32, ddlSum, 4, 1024), "before the capture");
  }));
}

// A CUDA failure in one rank's part on the wire (the copies and the fold of its block): that rank fails with
// ddlCudaError, its partner across the nodes with a remote error naming it, and the other two with a remote
// error too, long before the timeout: either the report reaches them inside the wire's collective, or their
// node's allgather kernel, waiting for a failed rank that never launches its own, finds that rank's flags
// poisoned (StreamPath::poisonFlags).
TEST(StreamPath, AcrossNodesAFailureOnTheWireBreaksEveryRankAndNothingHangs) {
  Rig setup;
  setup.per_node = 2;
  setup.timeout_ms = 1500;
  setup.staged_chunk_bytes = 4096;
  constexpr size_t kCount = 100003;
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = runRanks(4, setup, false, [&](Comm& comm) {
    FakeStream stream;
    FakeBuffer d(kCount * 4);
    put(d.p, makeInput(ddlFloat32, ddlSum, comm.rank(), kCount));
    comm.allReduceOnStream(d.p, d.p, kCount, ddlFloat32, ddlSum, &stream);  // sets the kernel up
    stream.sync();
    if (comm.rank() == 2) setup.runtimes[2]->failAt(6);  // past the node kernel's launch, on the wire
    comm.allReduceOnStream(d.p, d.p, kCount, ddlFloat32, ddlSum, &stream);
    // Ranks 1 and 3 meet each other on the wire, not rank 2: were they through before its report came, their
    // node's allgather kernel fails on the failed ranks' poisoned flags.
    stream.sync();
    if (const ddlResult_t e = comm.asyncError(); e != ddlSuccess) fail(e, "after the stream");
    fail(ddlInternalError, "the failure went unnoticed");
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20))
      << "a rank waited past the timeout";
  EXPECT_EQ(results[2].code, ddlCudaError) << results[2].what;
  EXPECT_NE(results[2].what.find("injected failure"), std::string::npos) << results[2].what;
  EXPECT_EQ(results[0].code, ddlRemoteError) << results[0].what;
  EXPECT_NE(results[0].what.find("rank 2"), std::string::npos) << results[0].what;
  for (int r : {1, 3}) EXPECT_EQ(results[r].code, ddlRemoteError) << "rank " << r << ": " << results[r].what;
}

// One rank fails at its last step on the wire (its last copy up), after every byte has crossed: its partner
// across the nodes completes, but its node's other rank, whose allgather kernel waits for it, fails at once
// on its poisoned flags (a remote error), not at the timeout.
TEST(StreamPath, AcrossNodesALateFailurePoisonsTheFlagsItsNodeWaitsFor) {
  Rig setup;
  setup.per_node = 2;
  setup.timeout_ms = 20000;
  constexpr size_t kCount = 100003;
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = runRanks(4, setup, false, [&](Comm& comm) {
    FakeStream stream;
    FakeBuffer d(kCount * 4);
    FakeRuntime& rt = *setup.runtimes[comm.rank()];
    comm.allReduceOnStream(d.p, d.p, kCount, ddlFloat32, ddlSum, &stream);  // sets the kernel up
    stream.sync();
    const int before = rt.queuedOps();
    comm.allReduceOnStream(d.p, d.p, kCount, ddlFloat32, ddlSum, &stream);
    stream.sync();
    // The call's operations: the reduce-scatter's launch, the wire's copies and folds, the allgather's
    // launch.
    const int per_call = rt.queuedOps() - before;
    comm.barrier();
    if (comm.rank() == 2) rt.failAt(per_call - 1);
    comm.allReduceOnStream(d.p, d.p, kCount, ddlFloat32, ddlSum, &stream);
    stream.sync();
    if (const ddlResult_t e = comm.asyncError(); e != ddlSuccess) fail(e, "after the stream");
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15))
      << "a rank waited for the timeout";
  EXPECT_EQ(results[2].code, ddlCudaError) << results[2].what;
  EXPECT_EQ(results[3].code, ddlRemoteError) << results[3].what;
  for (int r : {0, 1}) {  // the other node's allgather completes; the report may reach them on the wire
    EXPECT_TRUE(results[r].code == ddlSuccess || results[r].code == ddlRemoteError) << results[r].what;
  }
}

// Host-paced, the call itself waits for the stream's earlier work (the write of its input, queued and not yet
// run) before the collective reads the buffer, and returns with the result in place; a blocking host
// collective after it runs after it on the wire.
TEST(StreamPath, HostPacedWaitsForTheStreamAndKeepsOrderWithBlockingCalls) {
  Rig setup;
  setup.scheme = DeviceScheme::kHost;
  expectAllOk(runRanks(2, setup, true, [&](Comm& comm) {
    constexpr size_t kCount = 3000;
    FakeStream stream;
    FakeBuffer a(kCount * 4), b(kCount * 4);
    put(a.p, makeInput(ddlInt32, ddlSum, comm.rank(), kCount));
    comm.allReduceOnStream(a.p, a.p, kCount, ddlInt32, ddlSum, &stream);  // the first call sets up
    std::vector<int32_t> h(4, comm.rank() + 1), out(4);
    comm.allReduce(h.data(), out.data(), 4, ddlInt32, ddlSum);
    EXPECT_EQ(out[0], 3);
    expectSame(get(a.p, kCount * 4), makeExpected(ddlInt32, ddlSum, 2, kCount), "host-paced in place");

    const std::vector<char> input = makeInput(ddlFloat32, ddlSum, comm.rank(), kCount);
    std::memset(a.p, 0, kCount * 4);
    stream.push([&] { std::memcpy(a.p, input.data(), input.size()); });
    comm.allReduceOnStream(a.p, b.p, kCount, ddlFloat32, ddlSum, &stream);
    expectSame(get(b.p, kCount * 4), makeExpected(ddlFloat32, ddlSum, 2, kCount), "host-paced");
    EXPECT_EQ(comm.streamScheme(), "host");
  }));
  EXPECT_GT(setup.counters->host_calls.load(), 0);
}

TEST(StreamPath, CaptureNeedsAFirstCallAndTheKernel) {
  for (bool host : {false, true}) {
    Rig setup;
    setup.scheme = host ? DeviceScheme::kHost : DeviceScheme::kAuto;
    expectAllOk(runRanks(2, setup, true, [&](Comm& comm) {
      FakeRuntime& rt = *setup.runtimes[comm.rank()];
      FakeStream stream;
      FakeBuffer a(4096);
      rt.beginCapture(&stream);
      try {
        comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
        ADD_FAILURE() << "a first call under capture was taken";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ddlInvalidArgument);
        EXPECT_NE(std::string(e.what()).find("warm-up"), std::string::npos) << e.what();
      }
      EXPECT_EQ(comm.asyncError(), ddlSuccess) << "an argument error breaks nothing";
      EXPECT_TRUE(rt.endCapture().empty());
      put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), 1024));
      comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
      stream.sync();
      rt.beginCapture(&stream);
      put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), 1024));
      if (host) {
        try {
          comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
          ADD_FAILURE() << "a host-paced call under capture was taken";
        } catch (const Error& e) {
          EXPECT_EQ(e.code(), ddlInvalidArgument);
          EXPECT_NE(std::string(e.what()).find("captured"), std::string::npos) << e.what();
        }
      } else {
        const int strict = setup.counters->strict_capture_queries.load();
        comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
        EXPECT_EQ(setup.counters->strict_capture_queries.load(), strict)
            << "the call asked the runtime questions in a mode that could invalidate the capture";
        EXPECT_EQ(FakeRuntime::threadCaptureMode(), 0) << "the caller's capture mode was not given back";
        const FakeRuntime::FakeGraph graph = rt.endCapture();
        stream.sync();
        expectSame(get(a.p, 4096), makeInput(ddlFloat32, ddlSum, comm.rank(), 1024), "captured, not run");
        FakeRuntime::replay(graph, &stream);
        stream.sync();
        expectSame(get(a.p, 4096), makeExpected(ddlFloat32, ddlSum, 2, 1024), "captured, replayed");
      }
      rt.endCapture();
    }));
  }
}

// Every rank must make the same calls in the same order. Where they do not, the node kernel's meeting finds
// it: every rank fails with ddlInvalidArgument naming both calls, long before the timeout, instead of reading
// a slot's stale bytes (counts that differ but fill as many chunks) or pairing one rank's extra call with the
// others' next one.
TEST(StreamPath, MismatchedCallsFailEveryRankNamingBothCalls) {
  struct Case {
    const char* name;
    std::function<void(Comm&, FakeStream&, void*)> calls;
    std::string says[2];  // in each rank's message
  };
  const Case cases[] = {
      {"counts",
       [](Comm& c, FakeStream& s, void* a) {
         c.allReduceOnStream(a, a, c.rank() == 0 ? 1024 : 1000, ddlFloat32, ddlSum, &s);
       },
       {"member 1 of the node called allreduce of 1000 float32 (sum) where this rank called allreduce of "
        "1024 "
        "float32 (sum)",
        "member 0 of the node called allreduce of 1024 float32 (sum) where this rank called allreduce of "
        "1000 "
        "float32 (sum)"}},
      {"an extra call",
       [](Comm& c, FakeStream& s, void* a) {
         if (c.rank() == 0) c.allReduceOnStream(a, a, 1024, ddlFloat32, ddlSum, &s);
         c.broadcastOnStream(a, a, 256, ddlFloat32, 0, &s);
       },
       {"member 1 of the node called broadcast of 256 float32 from member 0 where this rank called allreduce "
        "of "
        "1024 float32 (sum)",
        "member 0 of the node called allreduce of 1024 float32 (sum) where this rank called broadcast of 256 "
        "float32 from member 0"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Rig setup;
    setup.timeout_ms = 20000;
    const auto t0 = std::chrono::steady_clock::now();
    const auto results = runRanks(2, setup, true, [&](Comm& comm) {
      FakeStream stream;
      FakeBuffer a(4096);
      comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);  // the setup, matched
      stream.sync();
      c.calls(comm, stream, a.p);
      stream.sync();
      EXPECT_EQ(comm.asyncError(), ddlInvalidArgument);
      std::vector<float> h(4);
      comm.allReduce(h.data(), h.data(), 4, ddlFloat32, ddlSum);
    });
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15))
        << "a rank waited for the timeout";
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(results[r].code, ddlInvalidArgument) << results[r].what;
      EXPECT_NE(results[r].what.find(c.says[r]), std::string::npos) << results[r].what;
    }
  }
}

// One allreduce of count float32 sums from in to out, captured on g into a graph after an uncaptured one on s
// (the first stream-ordered call sets the node kernel up, which a capture cannot do).
FakeRuntime::FakeGraph captureAllReduce(Comm& comm, FakeRuntime& rt, FakeStream& s, FakeStream& g,
                                        const void* in, void* out, size_t count) {
  comm.allReduceOnStream(in, out, count, ddlFloat32, ddlSum, &s);
  s.sync();
  rt.beginCapture(&g);
  comm.allReduceOnStream(in, out, count, ddlFloat32, ddlSum, &g);
  return rt.endCapture();
}

// A CUDA graph replayed on one stream while a call on another stream, not ordered after it, runs too: two
// kernels of one rank would share its counters and slots. The second to start fails with a message saying
// so, and every rank fails rather than computing with what the other kernel wrote.
TEST(StreamPath, AGraphReplayedBesideAnUnorderedCallFailsInsteadOfSharingItsCounters) {
  Rig setup;
  setup.timeout_ms = 20000;
  std::atomic<bool> rank0_done{false};
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = runRanks(2, setup, true, [&](Comm& comm) {
    FakeRuntime& rt = *setup.runtimes[comm.rank()];
    FakeStream s, g;
    FakeBuffer a(4096), b(4096);
    const FakeRuntime::FakeGraph graph = captureAllReduce(comm, rt, s, g, a.p, a.p, 1024);
    ASSERT_FALSE(graph.empty());
    if (comm.rank() == 1) {  // it never replays: rank 0's kernels wait for it
      for (int i = 0; i < 12000 && !rank0_done.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    FakeRuntime::replay(graph, &g);
    std::thread replayer([&] { g.sync(); });  // the replay's kernel waits for rank 1 in its meeting
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    comm.allReduceOnStream(b.p, b.p, 1024, ddlFloat32, ddlSum, &s);  // not ordered after the replay
    s.sync();
    replayer.join();
    rank0_done.store(true);
    EXPECT_EQ(comm.asyncError(), ddlInvalidArgument);
    std::vector<float> h(4);
    comm.allReduce(h.data(), h.data(), 4, ddlFloat32, ddlSum);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15))
      << "a kernel waited for the timeout";
  EXPECT_EQ(results[0].code, ddlInvalidArgument) << results[0].what;
  EXPECT_NE(results[0].what.find("ran at once"), std::string::npos) << results[0].what;
  EXPECT_EQ(results[1].code, ddlSuccess) << results[1].what;
}

// A kernel that fails inside a replayed graph (here: a peer that never replays it) is not silent: the next
// stream-ordered call and the next blocking call raise it, and the replays after it fail at once instead of
// waiting for the timeout again.
TEST(StreamPath, AFailedReplayIsRaisedByTheNextCall) {
  Rig setup;
  setup.timeout_ms = 300;
  std::atomic<bool> rank0_done{false};
  const auto results = runRanks(2, setup, true, [&](Comm& comm) {
    FakeRuntime& rt = *setup.runtimes[comm.rank()];
    FakeStream s, g;
    FakeBuffer a(4096);
    const FakeRuntime::FakeGraph graph = captureAllReduce(comm, rt, s, g, a.p, a.p, 1024);
    if (comm.rank() == 1) {
      for (int i = 0; i < 12000 && !rank0_done.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      return;
    }
    FakeRuntime::replay(graph, &g);
    g.sync();  // times out inside the kernel
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) FakeRuntime::replay(graph, &g);
    g.sync();
    EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::milliseconds(250))
        << "a replay after the failure waited for the timeout again";
    rank0_done.store(true);
    try {
      comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &s);
      ADD_FAILURE() << "the next stream-ordered call was taken after a failed replay";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ddlTimeout);
      EXPECT_NE(std::string(e.what()).find("stream-ordered"), std::string::npos) << e.what();
    }
    std::vector<float> h(4);
    comm.allReduce(h.data(), h.data(), 4, ddlFloat32, ddlSum);
  });
  EXPECT_EQ(results[0].code, ddlTimeout) << results[0].what;
  EXPECT_EQ(results[1].code, ddlSuccess) << results[1].what;
}

// A rank whose launch fails poisons its flags so that its node's kernels waiting for it end now. Its own
// earlier kernel, still on its way, raises its flag after that poison: the poison comes again after it, on
// its stream, so that a peer's next kernel still fails at once instead of at the timeout. A collective of 4
// floats has work (and one meeting) in block 0 only.
TEST(StreamPath, APoisonComesAfterTheRanksOwnEarlierKernel) {
  Rig setup;
  setup.timeout_ms = 20000;
  std::atomic<bool> poisoned{false};
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = runRanks(2, setup, true, [&](Comm& comm) {
    FakeRuntime& rt = *setup.runtimes[comm.rank()];
    FakeStream s;
    FakeBuffer a(64), b(64);
    comm.allReduceOnStream(a.p, a.p, 4, ddlFloat32, ddlSum, &s);  // the setup
    s.sync();
    comm.barrier();
    if (comm.rank() == 1) {
      comm.allReduceOnStream(a.p, a.p, 4, ddlFloat32, ddlSum, &s);  // on its way, not run yet
      rt.failAt(1);
      try {
        comm.allReduceOnStream(b.p, b.p, 4, ddlFloat32, ddlSum, &s);  // its launch fails: poison
        ADD_FAILURE() << "the failed launch was not reported";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ddlCudaError);
      }
      std::thread earlier([&] { s.sync(); });  // the earlier kernel raises its flag over the poison
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      poisoned.store(true);
      earlier.join();
      return;
    }
    for (int i = 0; i < 12000 && !poisoned.load(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    comm.allReduceOnStream(a.p, a.p, 4, ddlFloat32, ddlSum, &s);  // meets rank 1's earlier kernel
    comm.allReduceOnStream(b.p, b.p, 4, ddlFloat32, ddlSum, &s);  // rank 1 never launched its own
    s.sync();
    if (const ddlResult_t e = comm.asyncError(); e != ddlSuccess) fail(e, "after the stream");
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15))
      << "rank 0 waited for the timeout";
  EXPECT_EQ(results[0].code, ddlRemoteError) << results[0].what;
  EXPECT_EQ(results[1].code, ddlSuccess) << results[1].what;
}

TEST(StreamPath, BadBuffersAreArgumentErrors) {
  Rig setup;
  expectAllOk(runRanks(2, setup, true, [&](Comm& comm) {
    FakeStream stream;
    std::vector<float> host(16);
    FakeBuffer other(64, 1);  // another device than the stream's (0)
    FakeBuffer a(64);
    auto expectRefused = [&](const std::function<void()>& call, const char* says) {
      try {
        call();
        ADD_FAILURE() << "taken: " << says;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ddlInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      }
    };
    expectRefused([&] { comm.allReduceOnStream(host.data(), host.data(), 16, ddlFloat32, ddlSum, &stream); },
                  "host memory");
    expectRefused([&] { comm.allReduceOnStream(other.p, a.p, 16, ddlFloat32, ddlSum, &stream); }, "device 1");
    expectRefused([&] { comm.allReduceOnStream(a.p, a.p, 16, ddlFloat32, ddlBand, &stream); }, "integer");
    EXPECT_EQ(comm.asyncError(), ddlSuccess);
    // Still usable.
    put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), 16));
    comm.allReduceOnStream(a.p, a.p, 16, ddlFloat32, ddlSum, &stream);
    stream.sync();
    expectSame(get(a.p, 64), makeExpected(ddlFloat32, ddlSum, 2, 16), "after refusals");
  }));
}

// Without a GPU runtime (a CPU-only build, or no GPU): a clear argument error, and the host path still works.
TEST(StreamPath, WithoutAGpuRuntimeTheCallSaysSo) {
  Options o;
  o.topology = parseTopology("", 2);
  o.timeout_ms = 30000;
  o.device_runtime = [](int) { return std::unique_ptr<DeviceRuntime>(); };
  expectAllOk(test_util::runRanks(2, o, [&](Comm& comm) {
    std::vector<float> h(8, 1.0f);
    try {
      comm.allReduceOnStream(h.data(), h.data(), 8, ddlFloat32, ddlSum, nullptr);
      ADD_FAILURE() << "taken without a GPU runtime";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ddlInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("no GPU runtime"), std::string::npos) << e.what();
    }
    comm.allReduce(h.data(), h.data(), 8, ddlFloat32, ddlSum);
    EXPECT_EQ(h[0], 2.0f);
  }));
}

// Both ranks make a first stream-ordered allreduce (the setup); then rank 1 makes no more calls and waits
// (60 s at most) while rank 0 runs second(comm, stream, buffer of 1024 floats): its kernel waits inside the
// GPU for a rank that never comes.
std::vector<RankResult> withAbsentPeer(Rig& setup,
                                       const std::function<void(Comm&, FakeStream&, FakeBuffer&)>& second) {
  std::atomic<bool> rank0_done{false};
  return runRanks(2, setup, true, [&](Comm& comm) {
    FakeStream stream;
    FakeBuffer a(4096);
    comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
    stream.sync();
    if (comm.rank() == 1) {
      for (int i = 0; i < 12000 && !rank0_done.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return;
    }
    second(comm, stream, a);
    rank0_done.store(true);
  });
}

TEST(StreamPath, AbortEndsAKernelWaitingForAPeer) {
  Rig setup;
  const auto results = withAbsentPeer(setup, [](Comm& comm, FakeStream& stream, FakeBuffer& a) {
    comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comm.abort();
    });
    const auto t0 = std::chrono::steady_clock::now();
    stream.sync();  // runs the kernel, which waits for rank 1 until the abort
    aborter.join();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
    EXPECT_EQ(comm.asyncError(), ddlAborted);
    try {
      comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
      ADD_FAILURE() << "an aborted communicator took a call";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ddlAborted);
    }
  });
  EXPECT_EQ(results[0].code, ddlSuccess) << results[0].what;
  EXPECT_EQ(results[1].code, ddlSuccess) << results[1].what;
}

TEST(StreamPath, APeerThatNeverComesTimesOutAndBreaksTheCommunicator) {
  Rig setup;
  setup.timeout_ms = 300;
  const auto results = withAbsentPeer(setup, [](Comm& comm, FakeStream& stream, FakeBuffer& a) {
    comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
    stream.sync();
    EXPECT_EQ(comm.asyncError(), ddlTimeout);
    try {
      std::vector<float> h(4);
      comm.allReduce(h.data(), h.data(), 4, ddlFloat32, ddlSum);
      ADD_FAILURE() << "a broken communicator took a blocking call";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ddlTimeout);
      EXPECT_NE(std::string(e.what()).find("stream-ordered"), std::string::npos) << e.what();
    }
  });
  EXPECT_EQ(results[0].code, ddlSuccess) << results[0].what;
}

// The float32 sum two ranks get when rank r's input is makeInput(r + i): makeInput(i) + makeInput(i + 1).
std::vector<char> twoRanksSum(int i, size_t count) {
  std::vector<char> want = makeInput(ddlFloat32, ddlSum, i, count);
  const std::vector<char> other = makeInput(ddlFloat32, ddlSum, i + 1, count);
  for (size_t k = 0; k < count; ++k) {
    float x, y;
    std::memcpy(&x, &want[k * 4], 4);
    std::memcpy(&y, &other[k * 4], 4);
    x += y;
    std::memcpy(&want[k * 4], &x, 4);
  }
  return want;
}

// Registered buffers (ddlCommRegister): an allreduce whose buffers every member registered reads and writes
// them in place. The kernel copies nothing (HostNodeExec counts copies: the staged path's copy-in is one),
// and the result is the host path's, one-shot and two-shot, in place and out of place, with ddlAvg.
TEST(StreamPath, RegisteredBuffersAllReduceInPlaceWithoutCopies) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    Rig setup;
    expectAllOk(runRanks(n, setup, true, [&](Comm& comm) {
      FakeStream stream;
      constexpr size_t kMax = 300001;  // float64: two-shot, many chunks' worth of the staged path
      FakeBuffer a(kMax * 8 + 64), b(kMax * 8);
      void* ha = comm.registerBuffer(a.p, a.bytes);
      void* hb = comm.registerBuffer(b.p, b.bytes);
      struct Call {
        ddlDataType_t type;
        ddlRedOp_t op;
        size_t count;
        bool in_place;
      };
      for (const Call& c : {Call{ddlFloat32, ddlSum, 1001, false}, Call{ddlFloat32, ddlSum, 4096, true},
                            Call{ddlFloat64, ddlAvg, kMax, false}, Call{ddlInt32, ddlMax, 200003, true},
                            Call{ddlBfloat16, ddlSum, 77, true}}) {
        const std::string tag =
            std::string(typeName(c.type)) + "/" + opName(c.op) + " x" + std::to_string(c.count);
        const size_t bytes = c.count * typeSize(c.type);
        char* in = static_cast<char*>(a.p) + 16;  // inside the registration, not at its start
        put(in, makeInput(c.type, c.op, comm.rank(), c.count));
        comm.barrier();
        const int copies = setup.counters->kernel_copies.load(), zero = setup.counters->zero_copy.load();
        comm.barrier();
        comm.allReduceOnStream(in, c.in_place ? in : b.p, c.count, c.type, c.op, &stream);
        stream.sync();
        expectSame(get(c.in_place ? in : b.p, bytes), makeExpected(c.type, c.op, comm.size(), c.count), tag);
        comm.barrier();
        EXPECT_EQ(setup.counters->kernel_copies.load(), copies) << tag << ": the kernel copied";
        EXPECT_GT(setup.counters->zero_copy.load(), zero) << tag;
      }
      // A deregistration returns once every member has closed its mapping of the buffer (each closes its n -
      // 1 mappings of the others' buffers), so that the caller may free it.
      comm.barrier();
      const int closes = setup.counters->closes.load();
      comm.barrier();
      comm.deregisterBuffer(hb);
      EXPECT_GE(setup.counters->closes.load() - closes, n * (n - 1)) << "a peer still mapped the buffer";
      comm.deregisterBuffer(ha);
      EXPECT_EQ(comm.streamScheme(), "kernel");
    }));
  }
}

// Where one member's buffers are not registered, every member takes the staged path (one more meeting at the
// first chunk), and the result is right; after a deregistration, so are the calls on that buffer; a handle
// that is no registration is an argument error.
TEST(StreamPath, MixedRegistrationIsStagedAndRight) {
  Rig setup;
  expectAllOk(runRanks(3, setup, true, [&](Comm& comm) {
    FakeStream stream;
    constexpr size_t kCount = 100003;
    FakeBuffer reg(kCount * 4), other(kCount * 4);
    void* h = comm.registerBuffer(reg.p, reg.bytes);
    for (int round = 0; round < 2; ++round) {
      void* buf = comm.rank() == 1 && round == 0 ? other.p : reg.p;  // rank 1 unregistered at first
      for (size_t count : {size_t{1000}, kCount}) {
        put(buf, makeInput(ddlFloat32, ddlSum, comm.rank(), count));
        comm.barrier();
        const int copies = setup.counters->kernel_copies.load();
        comm.barrier();
        comm.allReduceOnStream(buf, buf, count, ddlFloat32, ddlSum, &stream);
        stream.sync();
        expectSame(get(buf, count * 4), makeExpected(ddlFloat32, ddlSum, 3, count),
                   "mixed " + std::to_string(count));
        comm.barrier();
        if (round == 0) {
          EXPECT_GT(setup.counters->kernel_copies.load(), copies) << "a mixed call was not staged";
        }
      }
    }
    comm.deregisterBuffer(h);
    put(reg.p, makeInput(ddlFloat32, ddlSum, comm.rank(), 1000));
    comm.barrier();
    const int copies = setup.counters->kernel_copies.load();
    comm.barrier();
    comm.allReduceOnStream(reg.p, reg.p, 1000, ddlFloat32, ddlSum, &stream);
    stream.sync();
    expectSame(get(reg.p, 4000), makeExpected(ddlFloat32, ddlSum, 3, 1000), "after deregistering");
    comm.barrier();
    EXPECT_GT(setup.counters->kernel_copies.load(), copies);
    try {
      comm.deregisterBuffer(h);
      ADD_FAILURE() << "a handle deregistered twice was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ddlInvalidArgument);
    }
  }));
}

// A registered buffer whose allocation a rank frees and makes again at the same address (ddlCommRegister's
// contract says deregister first): the peers mapped the old allocation, so that rank's calls on it are staged
// (its allocation's id changed) rather than read in place, and right; every rank's, since one is staged.
TEST(StreamPath, AnAllocationFreedAndMadeAgainAtTheSameAddressIsStaged) {
  Rig setup;
  expectAllOk(runRanks(2, setup, true, [&](Comm& comm) {
    FakeStream stream;
    constexpr size_t kCount = 20000;
    FakeBuffer a(kCount * 4);
    void* h = comm.registerBuffer(a.p, a.bytes);
    for (int round = 0; round < 2; ++round) {
      if (round == 1 && comm.rank() == 1) test_util::FakeDevices::get().renew(a.p);
      put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), kCount));
      comm.barrier();
      const int copies = setup.counters->kernel_copies.load();
      comm.barrier();
      comm.allReduceOnStream(a.p, a.p, kCount, ddlFloat32, ddlSum, &stream);
      stream.sync();
      expectSame(get(a.p, kCount * 4), makeExpected(ddlFloat32, ddlSum, 2, kCount),
                 "round " + std::to_string(round));
      comm.barrier();
      if (round == 0) {
        EXPECT_EQ(setup.counters->kernel_copies.load(), copies) << "a registered call copied";
      } else {
        EXPECT_GT(setup.counters->kernel_copies.load(), copies) << "a renewed allocation was read in place";
      }
    }
    comm.deregisterBuffer(h);
  }));
}

// A member whose buffer cannot be shared over CUDA IPC (memory from cuMemCreate, as PyTorch's expandable
// segments) makes the registration fail on every rank, naming it; nothing breaks, the buffer keeps working
// staged, and a later registration of shareable memory works.
TEST(StreamPath, ARegistrationThatCannotBeSharedFailsEverywhereAndLosesNothing) {
  Rig setup;
  setup.refuse_foreign_ipc = {1};
  const auto results = runRanks(2, setup, true, [&](Comm& comm) {
    FakeStream stream;
    FakeBuffer a(4096);
    try {
      comm.registerBuffer(a.p, a.bytes);
      ADD_FAILURE() << "a buffer that cannot be shared was registered";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ddlInvalidArgument);
      const std::string want = comm.rank() == 1 ? "cannot be shared over CUDA IPC" : "member 1";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    EXPECT_EQ(comm.asyncError(), ddlSuccess);
    put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), 1024));
    comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, &stream);
    stream.sync();
    expectSame(get(a.p, 4096), makeExpected(ddlFloat32, ddlSum, 2, 1024), "unregistered");
  });
  expectAllOk(results);
}

// A registered call captured into a graph and replayed, its input rewritten between replays: zero-copy every
// time, right every time.
TEST(StreamPath, RegisteredCallsReplayFromAGraph) {
  Rig setup;
  expectAllOk(runRanks(2, setup, true, [&](Comm& comm) {
    FakeRuntime& rt = *setup.runtimes[comm.rank()];
    FakeStream s;
    constexpr size_t kCount = 50000;
    FakeBuffer a(kCount * 4);
    void* h = comm.registerBuffer(a.p, a.bytes);
    const FakeRuntime::FakeGraph graph = captureAllReduce(comm, rt, s, s, a.p, a.p, kCount);
    const int copies = setup.counters->kernel_copies.load();
    for (int i = 0; i < 20; ++i) {
      put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank() + i, kCount));
      comm.barrier();
      FakeRuntime::replay(graph, &s);
      s.sync();
      expectSame(get(a.p, kCount * 4), twoRanksSum(i, kCount), "replay " + std::to_string(i));
      comm.barrier();
    }
    EXPECT_EQ(setup.counters->kernel_copies.load(), copies);
    comm.deregisterBuffer(h);
  }));
}

// Buffers of a graph registered after its capture (vLLM's way): the replays are staged, and right, until
// ddlCommRegisterGraphBuffers, zero-copy after it. Rank 1's output is registered already and rank 0's is
// not: rows are reserved alike on every rank anyway, so they stay in step.
TEST(StreamPath, GraphBuffersRegisteredAfterTheCapture) {
  Rig setup;
  expectAllOk(runRanks(2, setup, true, [&](Comm& comm) {
    FakeRuntime& rt = *setup.runtimes[comm.rank()];
    FakeStream s;
    constexpr size_t kCount = 30000;
    FakeBuffer in(kCount * 4), out(kCount * 4), other(64);
    void* h = comm.registerBuffer(comm.rank() == 1 ? out.p : other.p, comm.rank() == 1 ? out.bytes : 64);
    const FakeRuntime::FakeGraph graph = captureAllReduce(comm, rt, s, s, in.p, out.p, kCount);
    auto replay = [&](int i, bool zero) {
      put(in.p, makeInput(ddlFloat32, ddlSum, comm.rank() + i, kCount));
      comm.barrier();
      const int copies = setup.counters->kernel_copies.load();
      comm.barrier();
      FakeRuntime::replay(graph, &s);
      s.sync();
      comm.barrier();
      if (zero) {
        EXPECT_EQ(setup.counters->kernel_copies.load(), copies) << "replay " << i << " copied";
      } else {
        EXPECT_GT(setup.counters->kernel_copies.load(), copies) << "replay " << i << " before registering";
      }
      expectSame(get(out.p, kCount * 4), twoRanksSum(i, kCount), "replay " + std::to_string(i));
    };
    replay(0, false);
    comm.registerGraphBuffers();
    for (int i = 1; i < 4; ++i) replay(i, true);
    comm.deregisterBuffer(h);
  }));
}

// The algorithm alone, on the host: shares cover every element once, in whole units, and chunks fit a slot.
TEST(NodeKernel, SharesAndChunks) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{1000}, size_t{123457}}) {
    for (int g : {1, 3, 32}) {
      size_t covered = 0, prev_hi = 0;
      for (int i = 0; i < g; ++i) {
        size_t lo, hi;
        node::share(n, g, i, 4, &lo, &hi);
        EXPECT_EQ(lo, prev_hi);
        EXPECT_TRUE(lo % 4 == 0 || lo == n);
        covered += hi - lo;
        prev_hi = hi;
      }
      EXPECT_EQ(covered, n);
    }
  }
  for (int blocks : {node::kMinBlocks, 11, node::kMaxBlocks}) {
    SCOPED_TRACE(std::to_string(blocks) + " blocks");
    node::Args a{};
    a.kind = node::Kind::kReduceScatter;
    a.nranks = 3;
    a.blocks = blocks;
    a.elem = 2;
    a.slot_bytes = kMinNodeSlotBytes;
    a.sub_slot_bytes = node::subSlotBytesOf(a.slot_bytes, blocks);
    EXPECT_GT(node::chunkElems(a), 0u);
    EXPECT_LE(node::chunkElems(a) * 3 * 2, node::subSlotBytes(a));
    EXPECT_LE(node::subSlotBytes(a) * blocks, a.slot_bytes) << "the sub-slots stay inside the slot";
    for (size_t count : {size_t{0}, size_t{7}, size_t{1000}, size_t{123457}}) {  // the blocks' shares tile it
      a.count = count;
      a.block_units = node::blockUnitsOf(count, a.elem, blocks);
      size_t prev_hi = 0;
      for (int b = 0; b < blocks; ++b) {
        size_t lo, hi;
        node::blockShare(a, b, &lo, &hi);
        EXPECT_EQ(lo, prev_hi);
        EXPECT_TRUE(lo % 8 == 0 || lo == count) << "whole 16-byte units";
        prev_hi = hi;
      }
      EXPECT_EQ(prev_hi, count);
    }
    EXPECT_EQ(node::chunkElems(a) % 8, 0u);
    a.nranks = node::kMaxRanks;
    a.elem = 8;
    EXPECT_GT(node::chunkElems(a), 0u) << "the smallest slot still holds a unit from every member";
  }
  EXPECT_EQ(nodeOneShotBytes(2), size_t{512} << 10);
  EXPECT_GE(nodeOneShotBytes(2), nodeOneShotBytes(8));
}

}  // namespace
}  // namespace ddl
