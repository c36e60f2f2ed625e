// The device path (comm/src/device/device_path.h) on an emulated GPU (fake_device.h), ranks as threads: every build
// runs these, GPU or not. The emulation's queues run only when waited for, so a missing wait in the path
// gives wrong results here.
//
// - staged allreduce: many chunks, every placement of sendbuff and recvbuff, types and ops, against the host
//   path;
// - one node with shared memory: the IPC path (each rank's scratch opened by the others, the GPU reducing)
// for
//   allreduce, broadcast, allgather and reduce-scatter; the other collectives staged;
// - ranks on separate nodes: everything staged, the CPU reducing;
// - a rank that cannot share its memory sends the node to the staged path; a device failure breaks the
//   communicator on every rank; point-to-point refuses device buffers.
#include "device/device_path.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm.h"
#include "dtype.h"
#include "error.h"
#include "fake_device.h"
#include "transport/local_transport.h"
#include "reduce.h"
#include "staged_placements.h"
#include "rendezvous/store.h"
#include "test_values.h"
#include "thread_ranks.h"

namespace ddl {
namespace {

using test_util::expectAllOk;
using test_util::FakeBuffer;
using test_util::FakeCounters;
using test_util::FakeDevices;
using test_util::FakeRuntime;
using test_util::makeExpected;
using test_util::makeInput;
using test_util::RankResult;

struct Fakes {
  std::shared_ptr<FakeCounters> counters = std::make_shared<FakeCounters>();
  std::vector<FakeRuntime*> runtimes;  // by rank, while the comms live
  int refuse_ipc_rank = -1;
  int refuse_alloc_rank = -1;
  size_t ipc_round_bytes = 0;     // 0: the default
  size_t staged_chunk_bytes = 0;  // 0: the default
};

Options makeOptions(int nranks, Fakes& setup, int timeout_ms = 30000) {
  Options o;
  o.topology = parseTopology("", nranks);
  o.timeout_ms = timeout_ms;
  setup.runtimes.assign(nranks, nullptr);
  o.ipc_round_bytes = setup.ipc_round_bytes;
  o.staged_chunk_bytes = setup.staged_chunk_bytes;
  o.device_runtime = [&setup](int rank) {
    test_util::Faults faults;
    faults.refuse_ipc = rank == setup.refuse_ipc_rank;
    faults.refuse_alloc = rank == setup.refuse_alloc_rank;
    auto rt = std::make_unique<FakeRuntime>(setup.counters, faults);
    setup.runtimes[rank] = rt.get();
    return rt;
  };
  return o;
}

// one_node: the ranks join one node (a store): shared memory, and the IPC path for device buffers.
std::vector<RankResult> runRanks(int nranks, Fakes& setup, bool one_node,
                                 const std::function<void(Comm&)>& body, int timeout_ms = 30000) {
  return test_util::runRanks(nranks, makeOptions(nranks, setup, timeout_ms), body, nullptr,
                             one_node ? makeMemoryStore() : nullptr);
}

void put(void* device, const std::vector<char>& host) { std::memcpy(device, host.data(), host.size()); }
std::vector<char> get(const void* device, size_t bytes) {
  std::vector<char> v(bytes);
  std::memcpy(v.data(), device, bytes);
  return v;
}
void expectSame(const std::vector<char>& got, const std::vector<char>& want, const std::string& what) {
  if (got != want) fail(ddlInternalError, what + ": the device result differs from the host one");
}

TEST(DevicePath, StagedChunkSizes) {
  EXPECT_EQ(stagedChunkBytes(100), size_t{512} << 10);  // one chunk: the message is smaller
  EXPECT_EQ(stagedChunkBytes(size_t{4} << 20), size_t{1} << 20);
  EXPECT_EQ(stagedChunkBytes(size_t{1} << 30), kMaxStagedChunkBytes);
  EXPECT_EQ(stagedChunkBytes((size_t{4} << 20) + 1), (size_t{1} << 20) + 4096);  // rounded up to pages
  EXPECT_EQ(stagedChunkBytes(size_t{1} << 30, 4096), size_t{4096});
  EXPECT_EQ(stagedChunkBytes(size_t{1} << 30, 1000), size_t{960});  // a multiple of 64
  EXPECT_EQ(stagedChunkBytes(size_t{1} << 30, 1), size_t{64});
  for (size_t bytes = 1; bytes < (size_t{64} << 20); bytes = bytes * 3 + 7) {
    EXPECT_EQ(stagedChunkBytes(bytes) % 64, 0u);
  }
}

// Many chunks (a 4 KiB chunk limit), a short last one, every placement of sendbuff and recvbuff.
TEST(DevicePath, StagedAllReduceManyChunksEveryPlacement) {
  for (int nranks : {2, 3}) {
    SCOPED_TRACE(std::to_string(nranks) + " ranks");
    Fakes setup;
    expectAllOk(runRanks(nranks, setup, false, [&](Comm& comm) {
      DevicePath path(std::make_unique<FakeRuntime>(setup.counters), comm.rank(), 4096);
      test_util::DeviceMemory mem;
      mem.alloc = [](size_t bytes) { return FakeDevices::get().alloc(bytes, 0); };
      mem.free = [](void* p) { FakeDevices::get().free(p); };
      mem.put = [](void* d, const void* h, size_t bytes) { std::memcpy(d, h, bytes); };
      mem.get = [](const void* d, size_t bytes) { return get(d, bytes); };
      test_util::checkStagedPlacements(comm, path, mem);
    }));
    EXPECT_EQ(setup.counters->reductions.load(), 0) << "the staged path reduces on the CPU";
  }
}

// Ranks on separate nodes: allreduce staged in chunks (3 MB: 4 of them), blocking and non-blocking.
TEST(DevicePath, AllReduceAcrossNodesIsStaged) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 750001;
  Fakes setup;
  expectAllOk(runRanks(kRanks, setup, false, [&](Comm& comm) {
    EXPECT_EQ(comm.intraNodePath(), "ucx");
    const size_t bytes = kCount * 4;
    const auto in = makeInput(ddlFloat32, ddlSum, comm.rank(), kCount);
    const auto want = makeExpected(ddlFloat32, ddlSum, kRanks, kCount);
    FakeBuffer a(bytes), b(bytes);
    put(a.p, in);
    comm.allReduce(a.p, a.p, kCount, ddlFloat32, ddlSum);
    expectSame(get(a.p, bytes), want, "blocking, in place");
    put(a.p, in);
    put(b.p, in);
    auto r1 = comm.iallReduce(a.p, a.p, kCount, ddlFloat32, ddlSum);
    auto r2 = comm.iallReduce(b.p, b.p, kCount, ddlFloat32, ddlSum);
    for (auto* r : {&r1, &r2}) {
      (*r)->done.wait(false);
      if ((*r)->result != ddlSuccess) fail((*r)->result, (*r)->error);
    }
    expectSame(get(a.p, bytes), want, "non-blocking a");
    expectSame(get(b.p, bytes), want, "non-blocking b");
  }));
  EXPECT_EQ(setup.counters->reductions.load(), 0);
  EXPECT_EQ(setup.counters->exports.load(), 0) << "no IPC across nodes";
}

// One node: the IPC path. Small messages (one shot), several rounds, in place, and the GPU does the reducing.
TEST(DevicePath, OneNodeAllReduceGoesOverIpcAndReducesOnTheDevice) {
  constexpr int kRanks = 4;
  Fakes setup;
  expectAllOk(runRanks(kRanks, setup, true, [&](Comm& comm) {
    EXPECT_EQ(comm.intraNodePath(), "shm");
    for (size_t count : {size_t{1000}, size_t{3000007}}) {
      for (ddlDataType_t t : {ddlFloat32, ddlInt32, ddlFloat16}) {
        for (ddlRedOp_t op : {ddlSum, ddlMax, ddlAvg}) {
          const size_t bytes = count * typeSize(t);
          const std::string what = std::to_string(count) + " " + typeName(t) + " " + opName(op);
          const auto in = makeInput(t, op, comm.rank(), count);
          const auto want = makeExpected(t, op, kRanks, count);
          FakeBuffer dsend(bytes), drecv(bytes);
          put(dsend.p, in);
          comm.allReduce(dsend.p, drecv.p, count, t, op);
          expectSame(get(drecv.p, bytes), want, what + ": out of place");
          expectSame(get(dsend.p, bytes), in, what + ": the input is left alone");
          comm.allReduce(dsend.p, dsend.p, count, t, op);
          expectSame(get(dsend.p, bytes), want, what + ": in place");
          if (count > 1000) break;  // the large one once per type
        }
      }
    }
  }));
  EXPECT_EQ(setup.counters->exports.load(), kRanks);
  EXPECT_EQ(setup.counters->imports.load(), kRanks * (kRanks - 1));
  EXPECT_GT(setup.counters->reductions.load(), 0) << "the IPC path reduces on the device";
  EXPECT_EQ(setup.counters->closes.load(), setup.counters->imports.load())
      << "every opened scratch is closed";
}

// Ranks as threads on nodes of per_node consecutive ranks, with shared memory per node; topology "" : the
// ranks per node x the nodes.
std::vector<RankResult> runOnNodes(int nranks, int per_node, Fakes& setup, const std::string& topology,
                                   const std::function<void(Comm&)>& body) {
  Options o = makeOptions(nranks, setup);
  o.topology = parseTopology(topology, nranks);
  return test_util::runRanks(nranks, o, body, test_util::nodesOf(nranks, per_node), makeMemoryStore());
}

// Allreduce of device buffers, checked: odd and tiny counts (ranks with empty blocks), three ops, out of
// place and in place; ranks listed in host_send pass a host sendbuff.
void checkAllReduces(Comm& comm, const std::vector<int>& host_send = {}) {
  const bool host = std::find(host_send.begin(), host_send.end(), comm.rank()) != host_send.end();
  for (size_t count : {size_t{2}, size_t{100003}}) {
    for (auto [t, op] :
         {std::pair{ddlFloat32, ddlSum}, std::pair{ddlInt32, ddlMax}, std::pair{ddlFloat32, ddlAvg}}) {
      const std::string what = std::to_string(count) + " " + typeName(t) + " " + opName(op);
      const size_t bytes = count * typeSize(t);
      const auto in = makeInput(t, op, comm.rank(), count);
      const auto want = makeExpected(t, op, comm.size(), count);
      FakeBuffer dsend(bytes), drecv(bytes);
      put(dsend.p, in);
      comm.allReduce(host ? static_cast<const void*>(in.data()) : dsend.p, drecv.p, count, t, op);
      expectSame(get(drecv.p, bytes), want, what + ": out of place");
      comm.allReduce(dsend.p, dsend.p, count, t, op);
      expectSame(get(dsend.p, bytes), want, what + ": in place");
    }
  }
}

// Several nodes: the node's ranks reduce over IPC on their GPUs, the blocks cross the nodes (one dim above
// the node: folded by the GPU; two: staged around mdring's levels), and come back over IPC. Two and three
// ranks per node; three dims; host sendbuffs.
TEST(DevicePath, AcrossNodesTheNodesDimRunsOverIpcOnTheGpus) {
  struct Layout {
    int nranks, per_node;
    std::string topology;
    std::vector<int> host_send;
  };
  for (const Layout& l : {Layout{4, 2, "", {}}, Layout{6, 3, "", {1, 4}}, Layout{8, 2, "2x2x2", {0, 5}}}) {
    SCOPED_TRACE(std::to_string(l.nranks) + " ranks, " + std::to_string(l.per_node) +
                 " per node, topology '" + l.topology + "'");
    Fakes setup;
    setup.ipc_round_bytes = size_t{64} << 10;
    expectAllOk(runOnNodes(l.nranks, l.per_node, setup, l.topology, [&](Comm& comm) {
      if (comm.intraNodePath() != "shm+ucx") fail(ddlInternalError, "path " + comm.intraNodePath());
      checkAllReduces(comm, l.host_send);
    }));
    EXPECT_EQ(setup.counters->exports.load(), l.nranks);
    EXPECT_GT(setup.counters->reductions.load(), 0) << "the node's dim reduces on the GPUs";
    if (l.topology.empty()) {
      EXPECT_GT(setup.counters->pinned_reductions.load(), 0) << "the GPU folds what crossed the wire";
    } else {
      EXPECT_EQ(setup.counters->pinned_reductions.load(), 0) << "mdring's levels, the CPU reducing";
    }
  }
}

// Across nodes the block crosses in chunks: with one dim above the node, wireAllReduce's (4 KiB: ~150 of
// them, the GPU folding what arrives); with two, the staged pipeline's, as many as one collective's phases
// allow (15), every chunk its own mdring phases.
TEST(DevicePath, AcrossNodesTheBlockCrossesInChunks) {
  for (const std::string topology : {"", "2x2x2"}) {
    const int nranks = topology.empty() ? 4 : 8;
    SCOPED_TRACE(std::to_string(nranks) + " ranks, topology '" + topology + "'");
    Fakes setup;
    setup.staged_chunk_bytes = 4096;
    expectAllOk(runOnNodes(nranks, 2, setup, topology, [&](Comm& comm) {
      constexpr size_t kCount = 300007;
      for (ddlRedOp_t op : {ddlSum, ddlAvg}) {
        FakeBuffer d(kCount * 4);
        put(d.p, makeInput(ddlFloat32, op, comm.rank(), kCount));
        comm.allReduce(d.p, d.p, kCount, ddlFloat32, op);
        expectSame(get(d.p, d.bytes), makeExpected(ddlFloat32, op, nranks, kCount), opName(op));
      }
    }));
  }
}

// One rank of the second node cannot share its memory (or allocate it): every node, not only that one, takes
// the staged path, and the results are right.
TEST(DevicePath, AcrossNodesOneRankWithoutIpcSendsEveryNodeToTheStagedPath) {
  for (bool alloc : {false, true}) {
    SCOPED_TRACE(alloc ? "no memory" : "no IPC");
    Fakes setup;
    (alloc ? setup.refuse_alloc_rank : setup.refuse_ipc_rank) = 3;
    const size_t live = FakeDevices::get().liveBlocks();
    expectAllOk(runOnNodes(4, 2, setup, "", [&](Comm& comm) { checkAllReduces(comm); }));
    EXPECT_EQ(setup.counters->reductions.load(), 0) << "staged everywhere: the CPU reduces";
    EXPECT_EQ(setup.counters->closes.load(), setup.counters->imports.load());
    EXPECT_EQ(FakeDevices::get().liveBlocks(), live);
  }
}

// The host reference of a collective, and the same call on device buffers, compared.
struct Case {
  std::string name;
  size_t in_bytes, out_bytes;
  // Runs the collective from in to out (either may be null where the rank passes none).
  std::function<void(Comm&, const void* in, void* out)> call;
  bool in_place_at_rank_block = false;  // allgather: in is out's own block
};

std::vector<Case> otherCollectives(int p, size_t n) {
  const size_t es = 4;
  std::vector<Case> cs;
  cs.push_back({"broadcast", n * es, n * es, [n](Comm& c, const void* i, void* o) {
                  c.broadcast(c.rank() == 1 ? i : nullptr, o, n, ddlFloat32, 1);
                }});
  cs.push_back({"allgather", n * es, n * es * p,
                [n](Comm& c, const void* i, void* o) { c.allGather(i, o, n, ddlFloat32); }});
  cs.push_back({"reducescatter", n * es * p, n * es,
                [n](Comm& c, const void* i, void* o) { c.reduceScatter(i, o, n, ddlFloat32, ddlSum); }});
  cs.push_back({"reduce", n * es, n * es, [n](Comm& c, const void* i, void* o) {
                  c.reduce(i, c.rank() == 2 % c.size() ? o : nullptr, n, ddlFloat32, ddlMax, 2 % c.size());
                }});
  cs.push_back({"gather", n * es, n * es * p, [n](Comm& c, const void* i, void* o) {
                  c.gather(i, c.rank() == 0 ? o : nullptr, n, ddlFloat32, 0);
                }});
  cs.push_back({"scatter", n * es * p, n * es, [n](Comm& c, const void* i, void* o) {
                  c.scatter(c.rank() == 0 ? i : nullptr, o, n, ddlFloat32, 0);
                }});
  cs.push_back({"alltoall", n * es * p, n * es * p,
                [n](Comm& c, const void* i, void* o) { c.allToAll(i, o, n, ddlFloat32); }});
  cs.push_back({"alltoallv", n * es * p, n * es * p, [n, p](Comm& c, const void* i, void* o) {
                  // Rank r sends r+1+k elements to k... within n each, at block offsets.
                  std::vector<size_t> sc(p), sd(p), rc(p), rd(p);
                  for (int k = 0; k < p; ++k) {
                    sc[k] = std::min(n, static_cast<size_t>(c.rank() + 1 + k));
                    sd[k] = k * n;
                    rc[k] = std::min(n, static_cast<size_t>(k + 1 + c.rank()));
                    rd[k] = k * n;
                  }
                  c.allToAllv(i, sc.data(), sd.data(), o, rc.data(), rd.data(), ddlFloat32);
                }});
  return cs;
}

void checkOtherCollectives(Comm& comm, size_t n) {
  for (const Case& c : otherCollectives(comm.size(), n)) {
    const auto in = makeInput(ddlFloat32, ddlSum, comm.rank(), c.in_bytes / 4);
    std::vector<char> want(c.out_bytes, 0);
    c.call(comm, in.data(), want.data());  // host buffers: the reference
    FakeBuffer din(c.in_bytes), dout(c.out_bytes);
    put(din.p, in);
    std::memset(dout.p, 0, c.out_bytes);
    c.call(comm, din.p, dout.p);
    expectSame(get(dout.p, c.out_bytes), want, c.name);
    expectSame(get(din.p, c.in_bytes), in, c.name + ": the input is left alone");
    // Device output, host input (and the reverse) in one call.
    std::memset(dout.p, 0, c.out_bytes);
    c.call(comm, in.data(), dout.p);
    expectSame(get(dout.p, c.out_bytes), want, c.name + " from host memory");
  }
  // In place: allgather with the rank's block inside recvbuff, allreduce's sibling broadcast at the root.
  const size_t p = comm.size();
  const auto mine = makeInput(ddlFloat32, ddlSum, comm.rank(), n);
  std::vector<char> want(n * 4 * p);
  comm.allGather(mine.data(), want.data(), n, ddlFloat32);
  FakeBuffer all(n * 4 * p);
  std::memset(all.p, 0, all.bytes);
  char* block = static_cast<char*>(all.p) + comm.rank() * n * 4;
  std::memcpy(block, mine.data(), n * 4);
  comm.allGather(block, all.p, n, ddlFloat32);
  expectSame(get(all.p, all.bytes), want, "allgather in place");
}

TEST(DevicePath, OtherCollectivesAcrossNodesAreStaged) {
  Fakes setup;
  expectAllOk(runRanks(3, setup, false, [&](Comm& comm) { checkOtherCollectives(comm, 70001); }));
  EXPECT_EQ(setup.counters->reductions.load(), 0);
}

TEST(DevicePath, OtherCollectivesOnOneNode) {
  Fakes setup;
  expectAllOk(runRanks(4, setup, true, [&](Comm& comm) {
    checkOtherCollectives(comm, 5);        // one round
    checkOtherCollectives(comm, 1500001);  // several rounds of the 4 MiB IPC scratch
  }));
  EXPECT_EQ(setup.counters->exports.load(), 4);
  EXPECT_GT(setup.counters->reductions.load(), 0) << "reduce-scatter over IPC reduces on the device";
}

// A member that cannot export its scratch, or allocate it (no abort): the node agrees on the staged path,
// does not try again, frees everything, and the results are right.
TEST(DevicePath, AMemberWithoutIpcOrMemorySendsTheNodeToTheStagedPath) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 100003;
  for (bool alloc : {false, true}) {
    SCOPED_TRACE(alloc ? "no memory" : "no IPC");
    Fakes setup;
    (alloc ? setup.refuse_alloc_rank : setup.refuse_ipc_rank) = 1;
    const size_t live = FakeDevices::get().liveBlocks();
    expectAllOk(runRanks(kRanks, setup, true, [&](Comm& comm) {
      const auto in = makeInput(ddlFloat32, ddlSum, comm.rank(), kCount);
      const auto want = makeExpected(ddlFloat32, ddlSum, kRanks, kCount);
      FakeBuffer d(kCount * 4);
      for (int i = 0; i < 2; ++i) {  // the second call does not try again
        put(d.p, in);
        comm.allReduce(d.p, d.p, kCount, ddlFloat32, ddlSum);
        expectSame(get(d.p, d.bytes), want, "allreduce");
      }
    }));
    EXPECT_EQ(setup.counters->exports.load(), kRanks - 1);
    EXPECT_EQ(setup.counters->reductions.load(), 0) << "staged: the CPU reduces";
    EXPECT_EQ(setup.counters->closes.load(), setup.counters->imports.load());
    EXPECT_EQ(FakeDevices::get().liveBlocks(), live) << "scratch and pinned memory are freed";
  }
}

// More rounds than the scratch has buffers (64 KiB rounds): a buffer is reused only once every member has
// read it, so a member that published "consumed" before its GPU finished reading would get overwritten data
// here.
TEST(DevicePath, IpcRoundsReuseTheScratchOnlyOnceEveryReaderIsDone) {
  constexpr int kRanks = 4;
  constexpr size_t kCount = 100003;  // allreduce: 7 rounds of 4096 floats per block; the others 7 to 25
  Fakes setup;
  setup.ipc_round_bytes = size_t{64} << 10;
  expectAllOk(runRanks(kRanks, setup, true, [&](Comm& comm) {
    const size_t bytes = kCount * 4;
    const auto in = makeInput(ddlFloat32, ddlSum, comm.rank(), kCount);
    FakeBuffer a(bytes), b(bytes * kRanks);
    put(a.p, in);
    comm.allReduce(a.p, a.p, kCount, ddlFloat32, ddlSum);
    expectSame(get(a.p, bytes), makeExpected(ddlFloat32, ddlSum, kRanks, kCount), "allreduce");
    put(a.p, in);
    comm.broadcast(a.p, a.p, kCount, ddlFloat32, 2);
    expectSame(get(a.p, bytes), makeInput(ddlFloat32, ddlSum, 2, kCount), "broadcast");
    put(a.p, in);
    comm.allGather(a.p, b.p, kCount, ddlFloat32);
    for (int r = 0; r < kRanks; ++r) {
      expectSame(get(static_cast<char*>(b.p) + r * bytes, bytes), makeInput(ddlFloat32, ddlSum, r, kCount),
                 "allgather block " + std::to_string(r));
    }
    const auto big = makeInput(ddlFloat32, ddlSum, comm.rank(), kCount * kRanks);
    put(b.p, big);
    comm.reduceScatter(b.p, a.p, kCount, ddlFloat32, ddlSum);
    const auto all = makeExpected(ddlFloat32, ddlSum, kRanks, kCount * kRanks);
    expectSame(get(a.p, bytes),
               std::vector<char>(all.begin() + comm.rank() * bytes, all.begin() + (comm.rank() + 1) * bytes),
               "reducescatter");
  }));
  EXPECT_GT(setup.counters->reductions.load(), 0);
}

// On one node only recvbuff decides: a host sendbuff on some ranks and a device one on others still all go
// over IPC (allreduce copies it into recvbuff, reduce-scatter next to the scratch), with right results; and
// the application's current device is as it was after every call.
TEST(DevicePath, OnOneNodeASendbuffAnywhereWorksAndTheCurrentDeviceIsKept) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 50001;
  Fakes setup;
  setup.ipc_round_bytes = size_t{64} << 10;
  expectAllOk(runRanks(kRanks, setup, true, [&](Comm& comm) {
    FakeRuntime::threadDevice() = 7;  // the application's own device
    const size_t bytes = kCount * 4;
    const auto in = makeInput(ddlFloat32, ddlMax, comm.rank(), kCount);
    FakeBuffer dsend(bytes), drecv(bytes), dbig(bytes * kRanks);
    put(dsend.p, in);
    const void* send = comm.rank() == 1 ? static_cast<const void*>(in.data()) : dsend.p;
    comm.allReduce(send, drecv.p, kCount, ddlFloat32, ddlMax);
    expectSame(get(drecv.p, bytes), makeExpected(ddlFloat32, ddlMax, kRanks, kCount), "allreduce");
    expectSame(get(dsend.p, bytes), in, "allreduce leaves a device sendbuff alone");
    if (FakeRuntime::threadDevice() != 7) fail(ddlInternalError, "allreduce left another device current");
    const auto big = makeInput(ddlFloat32, ddlSum, comm.rank(), kCount * kRanks);
    put(dbig.p, big);
    const void* bsend = comm.rank() == 0 ? static_cast<const void*>(big.data()) : dbig.p;
    comm.reduceScatter(bsend, drecv.p, kCount, ddlFloat32, ddlSum);
    const auto all = makeExpected(ddlFloat32, ddlSum, kRanks, kCount * kRanks);
    expectSame(get(drecv.p, bytes),
               std::vector<char>(all.begin() + comm.rank() * bytes, all.begin() + (comm.rank() + 1) * bytes),
               "reducescatter");
    if (FakeRuntime::threadDevice() != 7) fail(ddlInternalError, "reducescatter left another device current");
  }));
  EXPECT_EQ(setup.counters->exports.load(), kRanks) << "one IPC setup for all";
}

// The first device call on one node, with one rank passing host buffers: the others' IPC setup and its host
// collective disagree, and every rank hears of it at once (a mismatch), not after the timeout.
TEST(DevicePath, HostBuffersOnOneRankDuringTheIpcSetupFailEveryRankAtOnce) {
  constexpr int kRanks = 3;
  Fakes setup;
  const auto t0 = std::chrono::steady_clock::now();
  auto results = runRanks(
      kRanks, setup, true,
      [&](Comm& comm) {
        FakeBuffer d(4096);
        std::vector<float> h(1024, 1.0f);
        void* buf = comm.rank() == 0 ? static_cast<void*>(h.data()) : d.p;
        comm.allReduce(buf, buf, 1024, ddlFloat32, ddlSum);
      },
      20000);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
      << "someone waited for the timeout";
  bool mismatch = false;
  for (const auto& r : results) {
    EXPECT_NE(r.code, ddlSuccess);
    EXPECT_NE(r.code, ddlTimeout) << r.what;
    if (r.what.find("collective mismatch") != std::string::npos) mismatch = true;
  }
  EXPECT_TRUE(mismatch) << results[0].what;
}

// A device failure between chunks: that rank reports ddlCudaError, the others hear of it, nobody waits for
// the timeout, and the communicator stays broken.
TEST(DevicePath, ADeviceFailureBreaksTheCommunicatorOnEveryRank) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 750001;  // 4 chunks
  Fakes setup;
  const auto t0 = std::chrono::steady_clock::now();
  auto results = runRanks(
      kRanks, setup, false,
      [&](Comm& comm) {
        FakeBuffer d(kCount * 4);
        if (comm.rank() == 1) setup.runtimes[1]->failAt(3);  // the third chunk's copy down
        comm.allReduce(d.p, d.p, kCount, ddlFloat32, ddlSum);
      },
      20000);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15))
      << "the peers waited for the timeout";
  EXPECT_EQ(results[1].code, ddlCudaError) << results[1].what;
  EXPECT_NE(results[1].what.find("injected failure"), std::string::npos) << results[1].what;
  for (int r : {0, 2}) EXPECT_EQ(results[r].code, ddlRemoteError) << "rank " << r << ": " << results[r].what;
}

// Host buffers on one rank where the others pass device buffers, once the IPC path is up: a mismatch, not a
// hang or a wrong result.
TEST(DevicePath, HostBuffersWhereTheOthersUseIpcAreAMismatch) {
  constexpr int kRanks = 2;
  Fakes setup;
  auto results = runRanks(
      kRanks, setup, true,
      [&](Comm& comm) {
        FakeBuffer d(4096);
        std::vector<float> h(1024, 1.0f);
        comm.allReduce(d.p, d.p, 1024, ddlFloat32, ddlSum);  // sets the IPC path up
        if (comm.rank() == 0) {
          comm.allReduce(h.data(), h.data(), 1024, ddlFloat32, ddlSum);
        } else {
          comm.allReduce(d.p, d.p, 1024, ddlFloat32, ddlSum);
        }
      },
      10000);
  bool mismatch = false;
  for (const auto& r : results) {
    EXPECT_NE(r.code, ddlSuccess);
    if (r.what.find("collective mismatch") != std::string::npos) mismatch = true;
  }
  EXPECT_TRUE(mismatch) << results[0].what << " / " << results[1].what;
}

TEST(DevicePath, PointToPointRefusesDeviceBuffers) {
  Fakes setup;
  auto results = runRanks(2, setup, false, [&](Comm& comm) {
    FakeBuffer d(64);
    if (comm.rank() == 0) comm.send(d.p, 16, ddlFloat32, 1);
  });
  EXPECT_EQ(results[0].code, ddlInvalidArgument);
  EXPECT_NE(results[0].what.find("point-to-point operations take host buffers only"), std::string::npos)
      << results[0].what;
}

}  // namespace
}  // namespace ddl
