// A rank program for the multi-process tests: it links libddl.so like a user program, initialises from the
// DDL_* environment (ddlrun or the test's own launcher sets it), runs one scenario, and reports on stdout:
// "OK" lines on success, "ERROR <code> <message>" and exit status 3 on a ddl failure.
//
//   comm_worker all        every collective, several sizes and algorithms, and tagged point-to-point (any
//                          source too), results checked
//   comm_worker loop N     N allreduces of 1 MiB, printing "iter k" (the kill-a-rank test)
//   comm_worker p2ploop N  N rounds of 1 MiB sent to the right neighbour and received from the left, printing
//                          "iter k" (the kill-a-rank test for point-to-point)
//   comm_worker mismatch   rank 1 calls allreduce with a different count than the others
//   comm_worker elastic N  N allreduces of 256 Ki ones, 2 ms apart, each checked to sum to the communicator's
//                          size, printing "iter k size s"; when one fails (a rank was killed), ddlCommShrink
//                          and on with the survivors from the last iteration any of them finished, printing
//                          "shrunk from P to S in T ms excluded a,b" and "resumed at iter k";
//                          every 10th iteration ddlCommGrow admits whoever waits ("grew to S at iter k");
//                          with DDL_JOIN=1 the process joins (ddlCommInitFromEnv) and starts at rank 0's
//                          iteration
//   comm_worker grow-once FILE  prints "ready", waits (up to 60 s) until FILE exists, calls ddlCommGrow once
//   and
//                          prints "grow none" or "grew to S"
//   comm_worker device     allreduce of CUDA device buffers; exits 77 printing "SKIP <why>" where it cannot
//                          run (no GPU, or built without CUDA)
//   comm_worker env        one allreduce, then "OK env changes=N": how many times libddl.so called setenv,
//                          unsetenv, putenv or clearenv (this program interposes them; libddl must never
//                          change a host process's environment)
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ddl/ddl.h"

#ifdef DDL_WORKER_CUDA
#include <cuda_runtime_api.h>
#endif

// Calls into the environment-changing functions made from libddl.so. This executable's definitions come
// before libc's in symbol lookup, so libddl's calls land here; each is counted when the caller's address lies
// in libddl, then passed on to libc.
std::atomic<int> g_env_changes{0};

namespace {

void countIfFromLibddl(void* caller) {
  Dl_info info{};
  if (dladdr(caller, &info) != 0 && info.dli_fname != nullptr && std::strstr(info.dli_fname, "libddl.so")) {
    ++g_env_changes;
  }
}

template <class F>
F nextSymbol(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

}  // namespace

extern "C" {
int setenv(const char* name, const char* value, int overwrite) {
  countIfFromLibddl(__builtin_return_address(0));
  return nextSymbol<int (*)(const char*, const char*, int)>("setenv")(name, value, overwrite);
}
int unsetenv(const char* name) {
  countIfFromLibddl(__builtin_return_address(0));
  return nextSymbol<int (*)(const char*)>("unsetenv")(name);
}
int putenv(char* string) {
  countIfFromLibddl(__builtin_return_address(0));
  return nextSymbol<int (*)(char*)>("putenv")(string);
}
int clearenv() {
  countIfFromLibddl(__builtin_return_address(0));
  return nextSymbol<int (*)()>("clearenv")();
}
}

namespace {

int g_rank = -1;

[[noreturn]] void die(ddlComm_t comm, ddlResult_t r, const char* what) {
  std::printf("ERROR %d %s: %s\n", static_cast<int>(r), what, ddlGetLastError(comm));
  std::fflush(stdout);
  std::exit(3);
}

#define CHECK(comm, call)                       \
  do {                                          \
    ddlResult_t r_ = (call);                    \
    if (r_ != ddlSuccess) die(comm, r_, #call); \
  } while (0)

[[noreturn]] void wrong(const std::string& what) {
  std::printf("WRONG rank %d: %s\n", g_rank, what.c_str());
  std::fflush(stdout);
  std::exit(4);
}

// The elastic loop (usage above): the survivors of a killed rank shrink and go on.
void runElastic(ddlComm_t comm, int iters, bool joined) {
  std::vector<float> buf(1 << 18);
  int it = 0;
  auto fromRankZero = [&] {  // where rank 0 is: a joiner starts there
    int64_t step = it;
    CHECK(comm, ddlBroadcast(&step, &step, 1, ddlInt64, 0, comm));
    it = static_cast<int>(step);
  };
  if (joined) {
    fromRankZero();
    CHECK(comm, ddlCommUserRank(comm, &g_rank));
    std::printf("joined as rank %d at iter %d\n", g_rank, it);
  }
  const int first = it;  // a joiner has been admitted at this iteration's check already
  for (; it < iters; ++it) {
    ddlResult_t r = ddlSuccess;
    if (it > first && it % 10 == 0) {  // a grow is a collective: a rank lost in it is handled as in a step
      ddlComm_t grown = nullptr;
      r = ddlCommGrow(comm, 0, &grown);
      if (grown) {
        CHECK(comm, ddlCommDestroy(comm));
        comm = grown;
        fromRankZero();
        int size = 0;
        CHECK(comm, ddlCommCount(comm, &size));
        std::printf("grew to %d at iter %d\n", size, it);
      }
    }
    int n = 0;
    CHECK(comm, ddlCommCount(comm, &n));
    std::fill(buf.begin(), buf.end(), 1.0f);
    if (r == ddlSuccess) r = ddlAllReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlSum, comm);
    if (r != ddlSuccess) {
      std::printf("lost %d %s\n", static_cast<int>(r), ddlGetLastError(comm));
      std::fflush(stdout);
      const auto t0 = std::chrono::steady_clock::now();
      ddlComm_t survivors = nullptr;
      CHECK(comm, ddlCommShrink(comm, nullptr, 0, &survivors));
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      int gone[64], count = 0, size = 0;
      CHECK(survivors, ddlCommGetExcluded(survivors, gone, 64, &count));
      CHECK(survivors, ddlCommCount(survivors, &size));
      CHECK(survivors, ddlCommUserRank(survivors, &g_rank));
      std::string list;
      for (int i = 0; i < count && i < 64; ++i) list += (i ? "," : "") + std::to_string(gone[i]);
      std::printf("shrunk from %d to %d in %.1f ms excluded %s\n", n, size, ms, list.c_str());
      ddlCommDestroy(comm);
      comm = survivors;
      // The lost rank died inside the allreduce: some survivors may have finished it (and gone on to the
      // next), others not. Every one goes on after the last iteration any of them finished, so no iteration
      // is lost or repeated (a trainer would send the state of that iteration from a rank that has it to the
      // others).
      int64_t at = it, agreed = 0;
      CHECK(comm, ddlAllReduce(&at, &agreed, 1, ddlInt64, ddlMax, comm));
      std::printf("resumed at iter %lld (was at %d)\n", static_cast<long long>(agreed), it);
      it = static_cast<int>(agreed) - 1;
      continue;
    }
    for (float v : buf)
      if (v != static_cast<float>(n))
        wrong("elastic allreduce of " + std::to_string(n) + " ones gave " + std::to_string(v));
    std::printf("iter %d size %d\n", it, n);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::printf("OK elastic\n");
  std::fflush(stdout);
  CHECK(comm, ddlCommDestroy(comm));
  std::exit(0);
}

void runAll(ddlComm_t comm, int rank, int n) {
  for (size_t count : {size_t{1}, size_t{1000}, size_t{262147}, size_t{3000001}}) {
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i + rank) % 5);
    CHECK(comm, ddlAllReduce(in.data(), out.data(), count, ddlFloat32, ddlSum, comm));
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<float>((i + r) % 5);
      if (out[i] != want) wrong("allreduce count " + std::to_string(count) + " at " + std::to_string(i));
    }
    std::vector<int64_t> io(count);
    for (size_t i = 0; i < count; ++i) io[i] = static_cast<int64_t>(i) * (rank + 1);
    CHECK(comm, ddlAllReduce(io.data(), io.data(), count, ddlInt64, ddlMax, comm));
    for (size_t i = 0; i < count; ++i)
      if (io[i] != static_cast<int64_t>(i) * n) wrong("in-place max at " + std::to_string(i));

    std::vector<int32_t> b(count, rank == n - 1 ? 77 : 0);
    CHECK(comm, ddlBroadcast(b.data(), b.data(), count, ddlInt32, n - 1, comm));
    for (size_t i = 0; i < count; ++i)
      if (b[i] != 77) wrong("broadcast at " + std::to_string(i));

    std::vector<uint8_t> mine(count, static_cast<uint8_t>(rank + 1)), all(count * n);
    CHECK(comm, ddlAllGather(mine.data(), all.data(), count, ddlUint8, comm));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i)
        if (all[r * count + i] != r + 1) wrong("allgather block " + std::to_string(r));

    std::vector<double> rs_in(count * n, 1.5), rs_out(count);
    CHECK(comm, ddlReduceScatter(rs_in.data(), rs_out.data(), count, ddlFloat64, ddlSum, comm));
    for (size_t i = 0; i < count; ++i)
      if (rs_out[i] != 1.5 * n) wrong("reducescatter at " + std::to_string(i));
    CHECK(comm, ddlBarrier(comm));

    // Rooted collectives, each to the last rank.
    const int root = n - 1;
    std::vector<int32_t> rin(count), rout(rank == root ? count : 0);
    for (size_t i = 0; i < count; ++i) rin[i] = static_cast<int32_t>((i + rank) % 7);
    CHECK(comm, ddlReduce(rin.data(), rank == root ? rout.data() : nullptr, count, ddlInt32, ddlBxor, root, comm));
    for (size_t i = 0; i < rout.size(); ++i) {
      int32_t want = 0;
      for (int r = 0; r < n; ++r) want ^= static_cast<int32_t>((i + r) % 7);
      if (rout[i] != want) wrong("reduce bxor at " + std::to_string(i));
    }
    std::vector<uint8_t> gathered(rank == root ? count * n : 0);
    CHECK(comm, ddlGather(mine.data(), rank == root ? gathered.data() : nullptr, count, ddlUint8, root, comm));
    if (rank == root && gathered != all) wrong("gather differs from allgather");
    std::vector<uint8_t> scattered(count);
    CHECK(comm, ddlScatter(rank == root ? all.data() : nullptr, scattered.data(), count, ddlUint8, root, comm));
    if (scattered != mine) wrong("scatter of the allgather did not give back this rank's block");
    // All-to-all: block j of rank r is r * n + j.
    std::vector<int64_t> a2a_in(count * n), a2a_out(count * n);
    for (int j = 0; j < n; ++j) std::fill_n(a2a_in.begin() + j * count, count, rank * n + j);
    CHECK(comm, ddlAllToAll(a2a_in.data(), a2a_out.data(), count, ddlInt64, comm));
    for (int q = 0; q < n; ++q)
      if (count && (a2a_out[q * count] != q * n + rank || a2a_out[(q + 1) * count - 1] != q * n + rank))
        wrong("alltoall block from rank " + std::to_string(q));
    // Point-to-point around the ring, both directions at once.
    const int right = (rank + 1) % n, left = (rank + n - 1) % n;
    std::vector<float> to_right(count, static_cast<float>(rank)), from_left(count, -1.0f);
    ddlRequest_t sreq, rreq;
    CHECK(comm, ddlIrecv(from_left.data(), count, ddlFloat32, left, comm, &rreq));
    CHECK(comm, ddlIsend(to_right.data(), count, ddlFloat32, right, comm, &sreq));
    CHECK(comm, ddlWait(sreq));
    CHECK(comm, ddlWait(rreq));
    for (size_t i = 0; i < count; ++i)
      if (from_left[i] != static_cast<float>(left)) wrong("p2p from rank " + std::to_string(left));
  }
  // Tagged point-to-point over the real transport: every other rank sends rank 0 a large (rendezvous) then a
  // small message with tag 9 and one with tag 4; rank 0 takes the tag-4 messages first, from any source, then
  // each rank's two tag-9 messages in order (the large receive would refuse the small message).
  if (n > 1) {
    const size_t big = 1 << 18;
    if (rank != 0) {
      std::vector<int32_t> large(big, rank * 10 + 1), small(3, rank * 10 + 2), four(1, rank * 10 + 3);
      ddlRequest_t reqs[3];
      CHECK(comm, ddlIsendTagged(large.data(), big, ddlInt32, 0, 9, comm, &reqs[0]));
      CHECK(comm, ddlIsendTagged(small.data(), 3, ddlInt32, 0, 9, comm, &reqs[1]));
      CHECK(comm, ddlIsendTagged(four.data(), 1, ddlInt32, 0, 4, comm, &reqs[2]));
      for (auto* q : reqs) CHECK(comm, ddlWait(q));
    } else {
      std::vector<int> seen(n, 0);
      for (int k = 1; k < n; ++k) {
        int32_t v = -1;
        int from = -1;
        ddlRequest_t q;
        CHECK(comm, ddlIrecvTagged(&v, 1, ddlInt32, DDL_ANY_SOURCE, 4, comm, &from, &q));
        CHECK(comm, ddlWait(q));
        if (from < 1 || from >= n || v != from * 10 + 3) wrong("tag 4 from any source: " + std::to_string(v));
        ++seen[from];
      }
      for (int r = 1; r < n; ++r) {
        if (seen[r] != 1) wrong("any-source receives saw rank " + std::to_string(r) + " " + std::to_string(seen[r]));
        std::vector<int32_t> large(big, -1), small(3, -1);
        int from = -1;
        ddlRequest_t q[2];
        CHECK(comm, ddlIrecvTagged(large.data(), big, ddlInt32, r, 9, comm, &from, &q[0]));
        CHECK(comm, ddlIrecvTagged(small.data(), 3, ddlInt32, r, 9, comm, nullptr, &q[1]));
        CHECK(comm, ddlWait(q[0]));
        CHECK(comm, ddlWait(q[1]));
        if (from != r || large.back() != r * 10 + 1 || small[0] != r * 10 + 2) wrong("tag 9 order");
      }
    }
  }
  // Non-blocking, two in flight.
  std::vector<float> a(100000, 1.0f), b(100000, 2.0f);
  ddlRequest_t ra, rb;
  CHECK(comm, ddlIallReduce(a.data(), a.data(), a.size(), ddlFloat32, ddlSum, comm, &ra));
  CHECK(comm, ddlIallReduce(b.data(), b.data(), b.size(), ddlFloat32, ddlAvg, comm, &rb));
  CHECK(comm, ddlWait(ra));
  int done = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done && std::chrono::steady_clock::now() < until) {
    ddlResult_t r = ddlTest(rb, &done);
    if (r != ddlSuccess && r != ddlInProgress) die(comm, r, "ddlTest");
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  if (!done) wrong("ddlTest never finished");
  if (a[5] != n || b[5] != 2.0f) wrong("non-blocking results");
  char path[64] = {};
  CHECK(comm, ddlCommGetIntraNodePath(comm, path, sizeof path));
  std::printf("OK all rank %d of %d path %s\n", rank, n, path);
}

// Exits 77 with the reason when this process cannot run device buffers; called before the communicator exists,
// so every rank skips alike.
void requireDevice() {
#ifndef DDL_WORKER_CUDA
  std::printf("SKIP comm_worker was built without CUDA\n");
  std::exit(77);
#else
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("SKIP no CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found 0");
    std::exit(77);
  }
#endif
}

#ifdef DDL_WORKER_CUDA
#define CUDA_CHECK(call)                                                               \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) wrong(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

void runDevice(ddlComm_t comm, int rank, int n) {
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  CUDA_CHECK(cudaSetDevice(rank % devices));
  for (size_t count : {size_t{1000}, size_t{3000001}}) {
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i + rank) % 5);
    void* send = nullptr;
    void* recv = nullptr;
    CUDA_CHECK(cudaMalloc(&send, count * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&recv, count * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(send, in.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    // out holds every rank's sum, else the rank exits naming what.
    auto expectSum = [&](const std::string& what) {
      for (size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int r = 0; r < n; ++r) want += static_cast<float>((i + r) % 5);
        if (out[i] != want) wrong(what + " count " + std::to_string(count) + " at " + std::to_string(i));
      }
    };
    CHECK(comm, ddlAllReduce(send, recv, count, ddlFloat32, ddlSum, comm));
    CUDA_CHECK(cudaMemcpy(out.data(), recv, count * sizeof(float), cudaMemcpyDeviceToHost));
    expectSum("device allreduce");
    // Non-blocking, in place.
    ddlRequest_t req;
    CHECK(comm, ddlIallReduce(send, send, count, ddlFloat32, ddlMax, comm, &req));
    CHECK(comm, ddlWait(req));
    CUDA_CHECK(cudaMemcpy(out.data(), send, count * sizeof(float), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int r = 0; r < n; ++r) want = std::max(want, static_cast<float>((i + r) % 5));
      if (out[i] != want) wrong("device iallreduce max at " + std::to_string(i));
    }
    // Stream-ordered, in place, after work queued on the stream (the input's upload).
    cudaStream_t stream = nullptr;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaMemcpyAsync(send, in.data(), count * sizeof(float), cudaMemcpyHostToDevice, stream));
    CHECK(comm, ddlAllReduceOnStream(send, send, count, ddlFloat32, ddlSum, comm, stream));
    CUDA_CHECK(cudaMemcpyAsync(out.data(), send, count * sizeof(float), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaStreamDestroy(stream));
    expectSum("stream-ordered allreduce");
    CUDA_CHECK(cudaFree(send));
    CUDA_CHECK(cudaFree(recv));
  }
  char path[32] = {}, scheme[32] = {};
  CHECK(comm, ddlCommGetIntraNodePath(comm, path, sizeof(path)));
  CHECK(comm, ddlCommGetStreamScheme(comm, scheme, sizeof(scheme)));
  std::printf("OK device rank %d of %d path %s scheme %s\n", rank, n, path, scheme);
}
#else
void runDevice(ddlComm_t, int, int) {}
#endif

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: comm_worker all | loop N | p2ploop N | mismatch | device | env\n");
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "device") requireDevice();
  ddlComm_t comm = nullptr;
  ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
  ddlResult_t r = ddlCommInitFromEnv(&comm, &cfg);
  if (r != ddlSuccess) die(nullptr, r, "ddlCommInitFromEnv");
  int rank = 0, n = 0;
  CHECK(comm, ddlCommUserRank(comm, &rank));
  CHECK(comm, ddlCommCount(comm, &n));
  g_rank = rank;
  if (mode == "all") {
    runAll(comm, rank, n);
  } else if (mode == "loop") {
    const int iters = argc > 2 ? std::atoi(argv[2]) : 100;
    std::vector<float> buf(1 << 18, 1.0f);
    for (int it = 0; it < iters; ++it) {
      CHECK(comm, ddlAllReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlMax, comm));
      std::printf("iter %d\n", it);
      std::fflush(stdout);
    }
    std::printf("OK loop\n");
  } else if (mode == "p2ploop") {
    const int iters = argc > 2 ? std::atoi(argv[2]) : 100;
    std::vector<float> out(1 << 18, 1.0f), in(1 << 18);
    for (int it = 0; it < iters; ++it) {
      ddlRequest_t s, r;
      CHECK(comm, ddlIrecv(in.data(), in.size(), ddlFloat32, (rank + n - 1) % n, comm, &r));
      CHECK(comm, ddlIsend(out.data(), out.size(), ddlFloat32, (rank + 1) % n, comm, &s));
      CHECK(comm, ddlWait(s));
      CHECK(comm, ddlWait(r));
      std::printf("iter %d\n", it);
      std::fflush(stdout);
    }
    std::printf("OK p2ploop\n");
  } else if (mode == "device") {
    runDevice(comm, rank, n);
  } else if (mode == "env") {
    std::vector<float> buf(4096, 1.0f);
    CHECK(comm, ddlAllReduce(buf.data(), buf.data(), buf.size(), ddlFloat32, ddlSum, comm));
    std::printf("OK env changes=%d\n", g_env_changes.load());
  } else if (mode == "elastic") {
    const char* join = std::getenv("DDL_JOIN");
    runElastic(comm, argc > 2 ? std::atoi(argv[2]) : 100, join && std::string(join) == "1");
  } else if (mode == "grow-once") {
    std::printf("ready\n");
    std::fflush(stdout);
    // Until FILE exists (at most 60 s): the test says when.
    for (int i = 0; i < 6000 && argc > 2 && access(argv[2], F_OK) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ddlComm_t grown = nullptr;
    CHECK(comm, ddlCommGrow(comm, 0, &grown));
    int size = 0;
    if (grown) CHECK(grown, ddlCommCount(grown, &size));
    grown ? std::printf("grew to %d\n", size) : std::printf("grow none\n");
    if (grown) CHECK(grown, ddlCommDestroy(grown));
  } else if (mode == "mismatch") {
    const size_t count = rank == 1 ? 5000 : 4096;
    std::vector<float> buf(count, 1.0f);
    CHECK(comm, ddlAllReduce(buf.data(), buf.data(), count, ddlFloat32, ddlSum, comm));
    std::printf("OK mismatch (should not happen)\n");
  } else {
    std::fprintf(stderr, "comm_worker: unknown mode '%s'\n", mode.c_str());
    return 2;
  }
  std::fflush(stdout);
  CHECK(comm, ddlCommDestroy(comm));
  return 0;
}
