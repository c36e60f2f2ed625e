// Collectives on CUDA device buffers (comm/src/device/device_path.h over comm/cuda/cuda_runtime.cpp) with ranks as
// threads over LocalTransport: every type and op against the host path on the same data, many staged chunks
// with device, host and mixed buffers, messages large enough to pipeline, ddlIallReduce, the IPC path of one
// node with the GPU reducing, and the other collectives. device_path_test.cpp runs the same logic on an
// emulated GPU everywhere.
//
// Without a GPU the device tests skip with the reason; what runs everywhere checks that host buffers still
// take the host path untouched in a CUDA build, and how messages are cut into chunks.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "cuda_test_util.h"
#include "device/device_path.h"
#include "device_reduce.h"
#include "device/device_runtime.h"
#include "dtype.h"
#include "error.h"
#include "transport/local_transport.h"
#include "reduce.h"
#include "staged_placements.h"
#include "test_values.h"
#include "thread_ranks.h"

namespace ddl {
namespace {


using test_util::cudaOk;
using test_util::DeviceBuffer;

void toDevice(void* dst, const void* src, size_t bytes) {
  cudaOk(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device");
}
std::vector<char> fromDevice(const void* src, size_t bytes) {
  std::vector<char> v(bytes);
  cudaOk(cudaMemcpy(v.data(), src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  return v;
}

Options makeOptions(int nranks) {
  Options o;
  o.topology = parseTopology("", nranks);
  o.timeout_ms = 30000;
  return o;
}

using test_util::expectAllOk;
using test_util::RankResult;

// body(comm) on nranks threads, each with its own Comm over one LocalFabric.
std::vector<RankResult> runRanks(int nranks, const std::function<void(Comm&)>& body) {
  return test_util::runRanks(nranks, makeOptions(nranks), body);
}

using test_util::makeExpected;
using test_util::makeInput;

// ---- without a GPU ----

// In a CUDA build, with or without a GPU, host buffers never go near the device path.
TEST(CudaStaging, HostBuffersTakeTheHostPath) {
  std::vector<float> host(16);
  if (auto rt = makeCudaRuntime()) {
    DevicePath path(std::move(rt), 0);
    EXPECT_FALSE(path.handles({host.data(), host.data()}));
    EXPECT_FALSE(path.handles({nullptr, host.data()}));
  }
  constexpr int kRanks = 3;
  constexpr size_t kCount = 100003;
  expectAllOk(runRanks(kRanks, [&](Comm& comm) {
    for (ddlDataType_t t : {ddlFloat32, ddlBfloat16, ddlInt64}) {
      auto in = makeInput(t, ddlSum, comm.rank(), kCount);
      std::vector<char> out(in.size()), inplace = in;
      comm.allReduce(in.data(), out.data(), kCount, t, ddlSum);
      auto req = comm.iallReduce(inplace.data(), inplace.data(), kCount, t, ddlSum);
      req->done.wait(false);
      if (req->result != ddlSuccess) fail(req->result, req->error);
      const auto want = makeExpected(t, ddlSum, kRanks, kCount);
      if (out != want) fail(ddlInternalError, std::string("host allreduce of ") + typeName(t) + " is wrong");
      if (inplace != want)
        fail(ddlInternalError, std::string("host iallreduce of ") + typeName(t) + " is wrong");
    }
  }));
}

// ---- with a GPU ----

// Device buffers give exactly what the host path gives on the same data (one chunk: the same collective).
TEST(CudaAllReduce, EveryTypeAndOpMatchesTheHostPath) {
  SKIP_WITHOUT_GPU();
  constexpr int kRanks = 3;
  constexpr size_t kCount = 1001;
  expectAllOk(runRanks(kRanks, [&](Comm& comm) {
    for (int ti = 0; ti < ddlNumTypes; ++ti) {
      const auto t = static_cast<ddlDataType_t>(ti);
      const size_t bytes = kCount * typeSize(t);
      for (int oi = 0; oi < ddlNumOps; ++oi) {
        const auto op = static_cast<ddlRedOp_t>(oi);
        if (!opTakesType(op, t)) continue;
        const std::string what = std::string(typeName(t)) + " " + opName(op);
        std::mt19937_64 rng(comm.rank() * 100 + ti * 10 + oi);
        std::vector<char> in(bytes), want(bytes);
        for (auto& b : in) b = static_cast<char>(rng());  // any bits: the paths must agree anyway
        comm.allReduce(in.data(), want.data(), kCount, t, op);
        DeviceBuffer send(bytes), recv(bytes);
        toDevice(send.p, in.data(), bytes);
        comm.allReduce(send.p, recv.p, kCount, t, op);
        if (fromDevice(recv.p, bytes) != want)
          fail(ddlInternalError, what + ": device result differs from host");
        if (fromDevice(send.p, bytes) != in) fail(ddlInternalError, what + ": sendbuff changed");
        comm.allReduce(send.p, send.p, kCount, t, op);  // in place
        if (fromDevice(send.p, bytes) != want)
          fail(ddlInternalError, what + ": in-place device result differs");
      }
    }
  }));
}

// Many chunks (a 4 KiB chunk limit), partial last chunk, every placement of sendbuff and recvbuff.
TEST(CudaAllReduce, ManyChunksWithDeviceHostAndMixedBuffers) {
  SKIP_WITHOUT_GPU();
  for (int nranks : {2, 4}) {
    SCOPED_TRACE(std::to_string(nranks) + " ranks");
    expectAllOk(runRanks(nranks, [&](Comm& comm) {
      DevicePath staged(makeCudaRuntime(), comm.rank(), 4096);
      test_util::DeviceMemory mem;
      mem.alloc = [](size_t bytes) {
        void* p = nullptr;
        cudaOk(cudaMalloc(&p, bytes), "cudaMalloc");
        return p;
      };
      mem.free = [](void* p) { cudaFree(p); };
      mem.put = [](void* d, const void* h, size_t bytes) { toDevice(d, h, bytes); };
      mem.get = [](const void* d, size_t bytes) { return fromDevice(d, bytes); };
      test_util::checkStagedPlacements(comm, staged, mem);
    }));
  }
}

// Through Comm with its own chunking (12 MB: 4 chunks of 3 MiB), blocking and non-blocking, 4 ranks.
TEST(CudaAllReduce, LargeMessagesThroughTheCommunicator) {
  SKIP_WITHOUT_GPU();
  constexpr int kRanks = 4;
  constexpr size_t kCount = 3000007;
  expectAllOk(runRanks(kRanks, [&](Comm& comm) {
    const size_t bytes = kCount * 4;
    const auto in = makeInput(ddlFloat32, ddlSum, comm.rank(), kCount);
    const auto want = makeExpected(ddlFloat32, ddlSum, kRanks, kCount);
    DeviceBuffer a(bytes), b(bytes);
    toDevice(a.p, in.data(), bytes);
    toDevice(b.p, in.data(), bytes);
    comm.allReduce(a.p, a.p, kCount, ddlFloat32, ddlSum);
    if (fromDevice(a.p, bytes) != want) fail(ddlInternalError, "blocking, in place");
    // Two non-blocking ones in flight, then one with a host recvbuff.
    toDevice(a.p, in.data(), bytes);
    auto r1 = comm.iallReduce(a.p, a.p, kCount, ddlFloat32, ddlSum);
    auto r2 = comm.iallReduce(b.p, b.p, kCount, ddlFloat32, ddlSum);
    for (auto* r : {&r1, &r2}) {
      (*r)->done.wait(false);
      if ((*r)->result != ddlSuccess) fail((*r)->result, (*r)->error);
    }
    if (fromDevice(a.p, bytes) != want || fromDevice(b.p, bytes) != want)
      fail(ddlInternalError, "non-blocking");
    toDevice(a.p, in.data(), bytes);
    std::vector<char> out(bytes);
    comm.allReduce(a.p, out.data(), kCount, ddlFloat32, ddlSum);
    if (out != want) fail(ddlInternalError, "device to host");
  }));
}

// One node with shared memory: the IPC path, the GPU reducing, and a broadcast and an allgather over it.
TEST(CudaAllReduce, OneNodeOverIpc) {
  SKIP_WITHOUT_GPU();
  constexpr int kRanks = 2;
  constexpr size_t kCount = 3000007;
  Options o = makeOptions(kRanks);
  expectAllOk(test_util::runRanks(
      kRanks, o,
      [&](Comm& comm) {
        const size_t bytes = kCount * 4;
        const auto in = makeInput(ddlFloat32, ddlAvg, comm.rank(), kCount);
        const auto want = makeExpected(ddlFloat32, ddlAvg, kRanks, kCount);
        DeviceBuffer a(bytes), b(bytes * kRanks);
        toDevice(a.p, in.data(), bytes);
        comm.allReduce(a.p, a.p, kCount, ddlFloat32, ddlAvg);
        if (fromDevice(a.p, bytes) != want) fail(ddlInternalError, "allreduce over IPC");
        comm.broadcast(a.p, a.p, kCount, ddlFloat32, 1);
        if (fromDevice(a.p, bytes) != want) fail(ddlInternalError, "broadcast over IPC");
        toDevice(a.p, in.data(), bytes);
        comm.allGather(a.p, b.p, kCount, ddlFloat32);
        const auto all = fromDevice(b.p, bytes * kRanks);
        for (int r = 0; r < kRanks; ++r) {
          if (std::memcmp(all.data() + r * bytes, makeInput(ddlFloat32, ddlAvg, r, kCount).data(), bytes) !=
              0)
            fail(ddlInternalError, "allgather over IPC, block " + std::to_string(r));
        }
      },
      nullptr, makeMemoryStore()));
}

}  // namespace
}  // namespace ddl
