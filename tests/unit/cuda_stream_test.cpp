// Stream-ordered collectives on a real GPU (device/stream_path.h, comm/cuda/node_kernels.cu), ranks as
// threads of this process on one node (shared memory): threads share a CUDA context, so their kernels run at
// once and the node kernel serves them even on one GPU. stream_path_test.cpp runs the same logic on the
// emulated GPU everywhere; these skip with the reason where no GPU is.
//
// - every collective, several types and ops, one-shot, two-shot and many chunks, in place, on the kernel and
//   forced host-paced, against the host path's expected values;
// - across two emulated nodes (LocalFabric): the allreduce on the node kernel around the GPU's fold of what
//   crossed the wire;
// - a device allreduce captured in a CUDA graph replays correctly 1,000 times (inputs changed between
// replays),
//   and a two-shot one captured in global mode replays between eager calls;
// - many chunks per CTA with kinds and chunk lengths changing between collectives;
// - registered buffers: the zero-copy kernel one-shot and two-shot in place, and 1,000 registered replays;
// - an abort ends a kernel that waits on the GPU for a rank that never comes.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "cuda_test_util.h"
#include "dtype.h"
#include "error.h"
#include "rendezvous/store.h"
#include "test_values.h"
#include "thread_ranks.h"

namespace ddl {
namespace {

// Ranks as threads share one CUDA context and its hardware queues (8 by default): a stream of one rank that
// shares a queue with another rank's kernel waiting on the GPU for a peer would wait behind it. Across nodes
// a rank's copies and fold must finish before it launches the allgather its node's peers wait for, so give
// every stream here a queue of its own (read when the context is made, before any test runs).
const bool kOwnQueues = ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 0) == 0;

using test_util::expectAllOk;
using test_util::makeExpected;
using test_util::makeInput;

using test_util::cudaOk;
using test_util::DeviceBuffer;

struct Stream {
  Stream() { cudaOk(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { cudaStreamDestroy(s); }
  void sync() const { cudaOk(cudaStreamSynchronize(s), "cudaStreamSynchronize"); }
  cudaStream_t s = nullptr;
};

// One stream-ordered allreduce captured from st into a CUDA graph (mode: cudaStreamCaptureMode*), replayed on
// st by launch().
struct CapturedAllReduce {
  CapturedAllReduce(Comm& comm, const Stream& st, const void* in, void* out, size_t count,
                    cudaStreamCaptureMode mode)
      : stream(st.s) {
    // Ranks are threads here: in the global mode, another rank's unsafe call (a cudaMemcpy, a cudaMalloc)
    // during this capture would invalidate it, so the ranks capture between barriers.
    comm.barrier();
    cudaOk(cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture");
    comm.allReduceOnStream(in, out, count, ddlFloat32, ddlSum, stream);
    cudaOk(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaOk(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    comm.barrier();
  }
  ~CapturedAllReduce() {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
  }
  CapturedAllReduce(const CapturedAllReduce&) = delete;
  CapturedAllReduce& operator=(const CapturedAllReduce&) = delete;
  void launch() const { cudaOk(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); }
  // replays times: the input (count floats at in, as captured) changed before each, the output checked after.
  void replayChecked(const Comm& comm, void* in, const void* out, size_t count, int replays) const {
    std::vector<float> host(count), got(count);
    for (int it = 0; it < replays; ++it) {
      for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>((i + it) % 97 + comm.rank());
      cudaOk(cudaMemcpyAsync(in, host.data(), count * 4, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
      launch();
      cudaOk(cudaMemcpyAsync(got.data(), out, count * 4, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
      cudaOk(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      for (size_t i = 0; i < count; i += 251) {
        if (got[i] != static_cast<float>(2 * ((i + it) % 97) + 1))
          fail(ddlInternalError, "replay " + std::to_string(it) + " element " + std::to_string(i));
      }
    }
  }

  cudaStream_t stream;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

void put(void* d, const std::vector<char>& h, cudaStream_t s) {
  cudaOk(cudaMemcpyAsync(d, h.data(), h.size(), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync");
  cudaOk(cudaStreamSynchronize(s), "cudaStreamSynchronize");  // h is pageable and may go
}
std::vector<char> get(const void* d, size_t bytes) {
  std::vector<char> v(bytes);
  cudaOk(cudaMemcpy(v.data(), d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return v;
}
void expectSame(const std::vector<char>& got, const std::vector<char>& want, const std::string& what) {
  if (got != want) fail(ddlInternalError, what + ": the device result differs from the expected one");
}

// per_node > 0: the ranks on nodes of per_node consecutive ranks (each node its shared memory; the node is
// mdring's dim 0), all on GPU 0.
std::vector<test_util::RankResult> runRanks(int nranks, DeviceScheme scheme,
                                            const std::function<void(Comm&)>& body, size_t slot_bytes = 0,
                                            int per_node = 0) {
  Options o;
  o.topology = parseTopology("", nranks);
  o.timeout_ms = 30000;
  o.device_scheme = scheme;
  o.node_slot_bytes = slot_bytes;
  return test_util::runRanks(
      nranks, o,
      [&](Comm& comm) {
        cudaOk(cudaSetDevice(0), "cudaSetDevice");
        body(comm);
      },
      per_node > 0 ? test_util::nodesOf(nranks, per_node) : nullptr, makeMemoryStore());
}

void everyCollectiveOnce(Comm& comm, ddlDataType_t type, ddlRedOp_t op, size_t count);

// The ranks are threads of one process, so one rank's cudaMalloc or cudaFree (which may wait for the whole
// device) must never come while another rank's kernel waits on the GPU for it: every rank allocates, works
// and frees between host barriers (ranks in processes of their own have no such coupling).
void everyCollective(Comm& comm, ddlDataType_t type, ddlRedOp_t op, size_t count) {
  everyCollectiveOnce(comm, type, op, count);
  comm.barrier();  // no rank's next kernel waits for a rank still freeing
}

void everyCollectiveOnce(Comm& comm, ddlDataType_t type, ddlRedOp_t op, size_t count) {
  const int n = comm.size(), r = comm.rank();
  const size_t es = typeSize(type), bytes = count * es;
  Stream st;
  const std::string tag = std::string(typeName(type)) + "/" + opName(op) + " x" + std::to_string(count);
  DeviceBuffer a(bytes), b(bytes), many(bytes * n), out(bytes);
  comm.barrier();  // every rank has allocated
  put(a.p, makeInput(type, op, r, count), st.s);
  comm.allReduceOnStream(a.p, b.p, count, type, op, st.s);
  comm.allReduceOnStream(a.p, a.p, count, type, op, st.s);
  st.sync();
  expectSame(get(b.p, bytes), makeExpected(type, op, n, count), "allreduce " + tag);
  expectSame(get(a.p, bytes), makeExpected(type, op, n, count), "allreduce in place " + tag);

  put(many.p, makeInput(type, op, r, count * n), st.s);
  comm.reduceScatterOnStream(many.p, out.p, count, type, op, st.s);
  st.sync();
  const auto want = makeExpected(type, op, n, count * n);
  expectSame(get(out.p, bytes), std::vector<char>(want.begin() + r * bytes, want.begin() + (r + 1) * bytes),
             "reduce-scatter " + tag);

  put(a.p, makeInput(type, ddlSum, r, count), st.s);
  comm.allGatherOnStream(a.p, many.p, count, type, st.s);
  comm.broadcastOnStream(a.p, b.p, count, type, n - 1, st.s);
  st.sync();
  std::vector<char> all;
  for (int s = 0; s < n; ++s) {
    auto v = makeInput(type, ddlSum, s, count);
    all.insert(all.end(), v.begin(), v.end());
  }
  expectSame(get(many.p, bytes * n), all, "allgather " + tag);
  expectSame(get(b.p, bytes), makeInput(type, ddlSum, n - 1, count), "broadcast " + tag);

  put(a.p, makeInput(type, op, r, count), st.s);
  comm.reduceOnStream(a.p, b.p, count, type, op, 0, st.s);
  st.sync();
  if (r == 0) expectSame(get(b.p, bytes), makeExpected(type, op, n, count), "reduce " + tag);
  comm.barrier();  // every rank's kernels are done before any frees
}

TEST(CudaStream, EveryCollectiveOnTheNodeKernel) {
  SKIP_WITHOUT_GPU();
  for (int nranks : {2, 4}) {
    SCOPED_TRACE(std::to_string(nranks) + " ranks");
    expectAllOk(runRanks(nranks, DeviceScheme::kAuto, [&](Comm& comm) {
      everyCollective(comm, ddlFloat32, ddlSum, 1);
      if (comm.streamScheme() != "kernel") fail(ddlInternalError, "scheme " + comm.streamScheme());
      everyCollective(comm, ddlFloat32, ddlAvg, 1001);
      everyCollective(comm, ddlFloat16, ddlSum, 300001);
      everyCollective(comm, ddlBfloat16, ddlMax, 3000007);  // two-shot
      everyCollective(comm, ddlInt64, ddlProd, 77777);
      everyCollective(comm, ddlUint8, ddlBxor, 12345);
    }));
  }
}

// 64 KiB slots: 2 KiB per CTA, so every collective here runs many chunks per CTA, both slots, and kinds and
// chunk lengths change from one collective to the next.
TEST(CudaStream, ManyChunksPerBlockAndChangingKinds) {
  SKIP_WITHOUT_GPU();
  expectAllOk(runRanks(
      3, DeviceScheme::kAuto,
      [&](Comm& comm) {
        for (int i = 0; i < 3; ++i) {
          everyCollective(comm, ddlFloat32, ddlSum, 1000003);  // two-shot, about 16 chunks per CTA
          everyCollective(comm, ddlBfloat16, ddlAvg, 4097);
        }
      },
      size_t{64} << 10));
}

// Two nodes of two ranks: the allreduce runs the node kernel's reduce-scatter and allgather on each node and
// the GPU folds the blocks that crossed the nodes (read from pinned memory); the other collectives are
// host-paced. Uneven blocks (odd counts), 16-bit types, many wire chunks (24 MiB of float32).
TEST(CudaStream, AcrossNodesTheNodeKernelAndTheGpuFold) {
  SKIP_WITHOUT_GPU();
  expectAllOk(runRanks(
      4, DeviceScheme::kAuto,
      [&](Comm& comm) {
        everyCollective(comm, ddlFloat32, ddlSum, 1);
        if (comm.streamScheme() != "kernel+wire") fail(ddlInternalError, "scheme " + comm.streamScheme());
        everyCollective(comm, ddlFloat32, ddlAvg, 1001);
        everyCollective(comm, ddlFloat16, ddlSum, 300001);
        everyCollective(comm, ddlBfloat16, ddlMax, 3000007);
        everyCollective(comm, ddlInt64, ddlProd, 77777);
        everyCollective(comm, ddlFloat32, ddlSum, size_t{6} << 20);
      },
      0, 2));
}

TEST(CudaStream, EveryCollectiveHostPaced) {
  SKIP_WITHOUT_GPU();
  expectAllOk(runRanks(2, DeviceScheme::kHost, [&](Comm& comm) {
    everyCollective(comm, ddlFloat32, ddlSum, 1001);
    everyCollective(comm, ddlFloat64, ddlMin, 3000007);
    if (comm.streamScheme() != "host") fail(ddlInternalError, "scheme " + comm.streamScheme());
  }));
}

TEST(CudaStream, GraphReplaysAThousandTimes) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kCount = 4096;
  constexpr int kReplays = 1000;
  expectAllOk(runRanks(2, DeviceScheme::kAuto, [&](Comm& comm) {
    Stream st;
    DeviceBuffer in(kCount * 4), out(kCount * 4);
    comm.allReduceOnStream(in.p, out.p, kCount, ddlFloat32, ddlSum, st.s);  // the first call sets up
    st.sync();
    const CapturedAllReduce graph(comm, st, in.p, out.p, kCount, cudaStreamCaptureModeThreadLocal);
    graph.replayChecked(comm, in.p, out.p, kCount, kReplays);
  }));
}

// Registered buffers (ddlCommRegister): the zero-copy node kernel, one-shot out of place and two-shot in
// place (each rank writing its slice into every rank's output), then 1,000 replays of a captured registered
// call with the input changed between them.
TEST(CudaStream, RegisteredBuffersZeroCopy) {
  SKIP_WITHOUT_GPU();
  expectAllOk(runRanks(2, DeviceScheme::kAuto, [&](Comm& comm) {
    Stream st;
    constexpr size_t kBig = size_t{4} << 20;  // floats: two-shot
    DeviceBuffer a(kBig * 4), b(kBig * 4);
    void* ha = comm.registerBuffer(a.p, kBig * 4);
    void* hb = comm.registerBuffer(b.p, kBig * 4);
    put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), 4096), st.s);
    comm.allReduceOnStream(a.p, b.p, 4096, ddlFloat32, ddlSum, st.s);
    st.sync();
    expectSame(get(b.p, 4096 * 4), makeExpected(ddlFloat32, ddlSum, 2, 4096), "registered one-shot");
    put(a.p, makeInput(ddlFloat32, ddlSum, comm.rank(), kBig), st.s);
    comm.allReduceOnStream(a.p, a.p, kBig, ddlFloat32, ddlSum, st.s);
    st.sync();
    expectSame(get(a.p, kBig * 4), makeExpected(ddlFloat32, ddlSum, 2, kBig), "registered two-shot in place");
    constexpr size_t kCount = 16384;
    const CapturedAllReduce graph(comm, st, a.p, b.p, kCount, cudaStreamCaptureModeThreadLocal);
    graph.replayChecked(comm, a.p, b.p, kCount, 1000);
    comm.barrier();
    comm.deregisterBuffer(hb);
    comm.deregisterBuffer(ha);
  }));
}

// Global capture mode (torch.cuda.graph's default), a two-shot message of several chunks per CTA, and eager
// calls between the replays on the same stream: epochs and rounds carry over between graph and eager kernels.
TEST(CudaStream, GraphInGlobalModeBetweenEagerCalls) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kCount = 1 << 20;  // 4 MiB of float32: two-shot
  expectAllOk(runRanks(2, DeviceScheme::kAuto, [&](Comm& comm) {
    Stream st;
    DeviceBuffer in(kCount * 4), out(kCount * 4), eager(kCount * 4);
    comm.allReduceOnStream(in.p, out.p, kCount, ddlFloat32, ddlSum, st.s);
    st.sync();
    const CapturedAllReduce graph(comm, st, in.p, out.p, kCount, cudaStreamCaptureModeGlobal);
    std::vector<float> host(kCount), got(kCount);
    for (int it = 0; it < 20; ++it) {
      for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>((i * 7 + it) % 61 + comm.rank());
      cudaOk(cudaMemcpyAsync(in.p, host.data(), kCount * 4, cudaMemcpyHostToDevice, st.s), "cudaMemcpyAsync");
      graph.launch();
      comm.allReduceOnStream(in.p, eager.p, kCount, ddlFloat32, ddlSum, st.s);
      st.sync();
      for (void* p : {out.p, eager.p}) {
        cudaOk(cudaMemcpy(got.data(), p, kCount * 4, cudaMemcpyDeviceToHost), "cudaMemcpy");
        for (size_t i = 0; i < kCount; i += 4099) {
          const float want = static_cast<float>(2 * ((i * 7 + it) % 61) + 1);
          if (got[i] != want) {
            fail(ddlInternalError, "iteration " + std::to_string(it) + " element " + std::to_string(i));
          }
        }
      }
    }
  }));
}

TEST(CudaStream, AbortEndsAKernelWaitingOnTheGpu) {
  SKIP_WITHOUT_GPU();
  std::atomic<bool> rank0_done{false};
  const auto results = runRanks(2, DeviceScheme::kAuto, [&](Comm& comm) {
    Stream st;
    DeviceBuffer a(4096);
    comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, st.s);
    st.sync();
    if (comm.rank() == 1) {  // waits for rank 0 to finish, 60 s at most
      for (int i = 0; i < 12000 && !rank0_done.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      return;
    }
    comm.allReduceOnStream(a.p, a.p, 1024, ddlFloat32, ddlSum, st.s);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(cudaStreamQuery(st.s), cudaErrorNotReady) << "the kernel should still wait for rank 1";
    comm.abort();
    const auto t0 = std::chrono::steady_clock::now();
    st.sync();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
    EXPECT_EQ(comm.asyncError(), ddlAborted);
    rank0_done.store(true);
  });
  EXPECT_EQ(results[0].code, ddlSuccess) << results[0].what;
  EXPECT_EQ(results[1].code, ddlSuccess) << results[1].what;
}

}  // namespace
}  // namespace ddl
