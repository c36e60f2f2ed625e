// Staged allreduce: device buffers through pinned host memory, in a pipeline of chunks.
//
// The host collectives (ring, mdring, rhd) reduce with the CPU and hand their buffers to the transport, so a
// device buffer has to come to host memory and go back. Done naively that is a device-to-host copy of the
// whole message, the allreduce, and a host-to-device copy, one after the other. Here the message is cut into
// chunks (stagedChunkBytes: a quarter of the message, 512 KiB to 8 MiB) and each chunk is one host allreduce,
// in place on a pinned staging slot, so that three things overlap:
//
//     copy engine D2H:   [c+1][c+2]
//     CPU + wire:        [ allreduce c ]
//     copy engine H2D:   [c-1]
//
// Three slots of pinned memory rotate (chunk c uses slot c mod 3). Chunk c+2 is fetched into the slot of
// chunk c-1 as soon as chunk c-1's host-to-device copy has been queued: the fetch waits for that copy on the
// GPU (cudaStreamWaitEvent), not on the CPU, so the CPU goes straight on to allreduce chunk c, which it
// starts once that chunk's fetch has completed (cudaEventSynchronize). The two copy directions use separate
// streams, so on GPUs with two copy engines they run at once. The cost over the host allreduce alone is the
// first chunk's fetch and the last chunk's return, plus one collective's latency per chunk.
//
// A host sendbuff or recvbuff takes part directly: with a host sendbuff the chunk is reduced from it into the
// slot (the collectives work out of place), with a host recvbuff from the slot into it, and the copy on that
// side is skipped.
//
// Every rank must cut the message the same way, or their collectives would not match: the chunk size depends
// only on the message size. A rank that passes host buffers where the others pass device buffers runs one
// collective instead of several; below 512 KiB that is the same collective and works, above it the ranks'
// calls disagree, which the communicator detects and reports as a mismatch.
//
// Streams are created blocking (not cudaStreamNonBlocking), so the first copy also waits for work queued on
// the legacy default stream; data written on other streams must be complete when ddlAllReduce is called, as
// for any host API. When the call returns, recvbuff holds the result.
#include "staged_allreduce.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "device_reduce.h"
#include "dtype.h"
#include "env.h"
#include "error.h"

namespace ddl::cuda {
namespace {

constexpr int kSlots = 3;
constexpr size_t kMinChunkBytes = size_t{512} << 10;

std::string describe(cudaError_t e) {
  return std::string(cudaGetErrorString(e)) + " (" + cudaGetErrorName(e) + ")";
}

[[noreturn]] void cudaFail(cudaError_t e, const std::string& what) {
  cudaGetLastError();  // a non-sticky error must not resurface in the caller's next check
  fail(ddlCudaError, "device-buffer allreduce: " + what + " failed: " + describe(e));
}

#define DDL_CUDA_CHECK(call, what)                                      \
  do {                                                                  \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) cudaFail(e_, what); \
  } while (0)

// Makes dev current on this thread for the guard's lifetime.
class CurrentDevice {
 public:
  explicit CurrentDevice(int dev) {
    DDL_CUDA_CHECK(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != dev) DDL_CUDA_CHECK(cudaSetDevice(dev), "cudaSetDevice(" + std::to_string(dev) + ")");
  }
  ~CurrentDevice() {
    int now = -1;
    if (cudaGetDevice(&now) == cudaSuccess && now != prev_) cudaSetDevice(prev_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int prev_ = 0;
};

class StagedAllReduce final : public DeviceAllReduce {
 public:
  StagedAllReduce(int rank, bool transport_cuda, size_t max_chunk_bytes)
      : rank_(rank), transport_cuda_(transport_cuda), max_chunk_bytes_(max_chunk_bytes) {}

  ~StagedAllReduce() override { release(); }

  bool handles(const void* sendbuf, const void* recvbuf) override {
    return isDevicePointer(sendbuf) || isDevicePointer(recvbuf);
  }

  void allReduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                 const HostAllReduce& host) override {
    const int send_dev = deviceOf(sendbuf);
    const int recv_dev = deviceOf(recvbuf);
    DDL_ASSERT(count > 0 && (send_dev >= 0 || recv_dev >= 0));
    const size_t es = typeSize(type);
    const size_t bytes = count * es;
    // The chunk is a multiple of 64 bytes, so a whole number of elements of any type.
    const size_t chunk_elems = stagedChunkBytes(bytes, max_chunk_bytes_) / es;
    const size_t nchunks = (count + chunk_elems - 1) / chunk_elems;
    const size_t slot_bytes = (std::min(chunk_elems, count) * es + 63) / 64 * 64;
    const int dev = send_dev >= 0 ? send_dev : recv_dev;
    CurrentDevice current(dev);
    prepare(dev, slot_bytes);
    if (!reported_ && !getEnv("DDL_DEBUG").empty()) {
      std::fprintf(
          stderr,
          "ddl: rank %d: device buffers are staged through pinned host memory, %zu chunk(s) of up to %zu "
          "bytes (UCX %s CUDA memory; libddl does not send device memory directly yet)\n",
          rank_, nchunks, chunk_elems * es, transport_cuda_ ? "supports" : "was built without");
      reported_ = true;
    }

    const char* src_base = static_cast<const char*>(sendbuf);
    char* dst_base = static_cast<char*>(recvbuf);
    auto offset = [&](size_t c) { return c * chunk_elems * es; };
    auto length = [&](size_t c) { return std::min(chunk_elems, count - c * chunk_elems) * es; };
    auto slot = [&](size_t c) { return pinned_ + (c % kSlots) * slot_bytes; };
    auto where = [&](const char* op, size_t c) {
      return std::string(op) + " of chunk " + std::to_string(c + 1) + "/" + std::to_string(nchunks) + " (" +
             std::to_string(length(c)) + " bytes, " + typeName(type) + ", device " + std::to_string(dev) +
             ")";
    };
    // Device to host: chunk c into its slot, once the slot's previous chunk has gone back to the device.
    auto fetch = [&](size_t c) {
      const size_t k = c % kSlots;
      if (recv_dev >= 0 && c >= kSlots) {
        DDL_CUDA_CHECK(cudaStreamWaitEvent(d2h_, returned_[k], 0), where("cudaStreamWaitEvent", c));
      }
      DDL_CUDA_CHECK(cudaMemcpyAsync(slot(c), src_base + offset(c), length(c), cudaMemcpyDefault, d2h_),
                     where("cudaMemcpyAsync device to host", c));
      DDL_CUDA_CHECK(cudaEventRecord(fetched_[k], d2h_), where("cudaEventRecord", c));
    };

    try {
      if (send_dev >= 0) {
        for (size_t c = 0; c < std::min<size_t>(kSlots - 1, nchunks); ++c) fetch(c);
      }
      for (size_t c = 0; c < nchunks; ++c) {
        const size_t k = c % kSlots;
        if (send_dev >= 0) {
          DDL_CUDA_CHECK(cudaEventSynchronize(fetched_[k]), where("copy device to host", c));
          if (c + kSlots - 1 < nchunks) fetch(c + kSlots - 1);
        } else if (recv_dev >= 0 && c >= kSlots) {
          // The host writes this slot next: its previous chunk must have reached the device.
          DDL_CUDA_CHECK(cudaEventSynchronize(returned_[k]), where("copy host to device", c - kSlots));
        }
        const void* src = send_dev >= 0 ? static_cast<const void*>(slot(c)) : src_base + offset(c);
        void* dst = recv_dev >= 0 ? static_cast<void*>(slot(c)) : dst_base + offset(c);
        host(src, dst, length(c) / es);
        if (recv_dev >= 0) {
          DDL_CUDA_CHECK(cudaMemcpyAsync(dst_base + offset(c), slot(c), length(c), cudaMemcpyDefault, h2d_),
                         where("cudaMemcpyAsync host to device", c));
          DDL_CUDA_CHECK(cudaEventRecord(returned_[k], h2d_), where("cudaEventRecord", c));
        }
      }
      if (recv_dev >= 0) {
        DDL_CUDA_CHECK(cudaStreamSynchronize(h2d_), where("copy host to device", nchunks - 1));
      }
    } catch (...) {
      // No copy may still be running into the user's buffers or our slots once we return.
      if (d2h_) cudaStreamSynchronize(d2h_);
      if (h2d_) cudaStreamSynchronize(h2d_);
      cudaGetLastError();
      throw;
    }
  }

 private:
  // Streams and events on dev (the current device), and kSlots pinned slots of slot_bytes.
  void prepare(int dev, size_t slot_bytes) {
    if (device_ != dev) {
      release();
      device_ = dev;  // so that release() frees what a failure below leaves half made
      try {
        DDL_CUDA_CHECK(cudaStreamCreateWithFlags(&d2h_, cudaStreamDefault), "cudaStreamCreate");
        DDL_CUDA_CHECK(cudaStreamCreateWithFlags(&h2d_, cudaStreamDefault), "cudaStreamCreate");
        for (int k = 0; k < kSlots; ++k) {
          DDL_CUDA_CHECK(cudaEventCreateWithFlags(&fetched_[k], cudaEventDisableTiming), "cudaEventCreate");
          DDL_CUDA_CHECK(cudaEventCreateWithFlags(&returned_[k], cudaEventDisableTiming), "cudaEventCreate");
        }
      } catch (...) {
        release();  // back to device_ -1: the next call creates them all again
        throw;
      }
    }
    const size_t need = kSlots * slot_bytes;
    if (pinned_bytes_ < need) {
      if (pinned_) cudaFreeHost(pinned_);
      pinned_ = nullptr;
      pinned_bytes_ = 0;
      void* p = nullptr;
      DDL_CUDA_CHECK(cudaHostAlloc(&p, need, cudaHostAllocPortable),
                     "cudaHostAlloc of " + std::to_string(need) + " bytes of pinned staging memory");
      pinned_ = static_cast<char*>(p);
      pinned_bytes_ = need;
    }
  }

  // Frees everything, best effort (at process exit the runtime may be gone already).
  void release() {
    if (device_ < 0 && !pinned_) return;
    int prev = -1;
    const bool switched = device_ >= 0 && cudaGetDevice(&prev) == cudaSuccess && prev != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    for (cudaStream_t* s : {&d2h_, &h2d_}) {
      if (*s) {
        cudaStreamSynchronize(*s);
        cudaStreamDestroy(*s);
        *s = nullptr;
      }
    }
    for (int k = 0; k < kSlots; ++k) {
      if (fetched_[k]) cudaEventDestroy(fetched_[k]);
      if (returned_[k]) cudaEventDestroy(returned_[k]);
      fetched_[k] = returned_[k] = nullptr;
    }
    if (pinned_) cudaFreeHost(pinned_);
    pinned_ = nullptr;
    pinned_bytes_ = 0;
    if (switched) cudaSetDevice(prev);
    cudaGetLastError();
    device_ = -1;
  }

  const int rank_;
  const bool transport_cuda_;
  const size_t max_chunk_bytes_;
  bool reported_ = false;
  int device_ = -1;  // where the streams and events live; -1: not created
  cudaStream_t d2h_ = nullptr;
  cudaStream_t h2d_ = nullptr;
  cudaEvent_t fetched_[kSlots] = {};   // slot k's device-to-host copy done
  cudaEvent_t returned_[kSlots] = {};  // slot k's host-to-device copy done
  char* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
};

}  // namespace

size_t stagedChunkBytes(size_t bytes, size_t max_chunk_bytes) {
  const size_t max_chunk = std::max<size_t>(64, max_chunk_bytes / 64 * 64);
  const size_t quarter = ((bytes + 3) / 4 + 4095) / 4096 * 4096;  // at most four chunks
  return std::min(max_chunk, std::max(std::min(kMinChunkBytes, max_chunk), quarter));
}

std::unique_ptr<DeviceAllReduce> makeStagedAllReduce(int rank, bool transport_cuda, size_t max_chunk_bytes) {
  return std::make_unique<StagedAllReduce>(rank, transport_cuda, max_chunk_bytes);
}

}  // namespace ddl::cuda
