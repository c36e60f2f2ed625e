// DevicePath: collectives on GPU device buffers, for one rank of a communicator (Comm owns one where it has a
// DeviceRuntime: builds with CUDA, or a test's emulation).
//
// Comm picks one of four ways for a call whose buffers are device memory:
//  - On one node whose ranks all share memory (Comm's shared-memory path): CUDA IPC. Each rank allocates a
//    device scratch of ShmNode::buffers() rounds and the other members of the node open it (ipcSetup,
//    over the node's NodeExchange). algo/shm.cpp's allreduce, reduce-scatter, allgather and broadcast then
//    run on it with the GPU copying and reducing (ipcMemory()): a member copies its input into its own
//    scratch, reduces its block reading the peers' scratch in place (over NVLink or PCIe peer to peer), and
//    copies finished blocks out. The data never leaves the GPUs; the node's ShmNode counters in host shared
//    memory pace the rounds, each published once the GPU work behind it has completed.
//  - Allreduce on several nodes whose ranks share memory (the node is mdring's dim 0): the node's
//    reduce-scatter and allgather over IPC as above, and in between only this rank's block crosses the
//    nodes: with wireAllReduce (the GPU folds what arrives) where one dim is above the node, else staged
//    around mdring's other dims (the CPU reduces). The stream-ordered allreduce there (kernel+wire:
//    stream_calls.h) runs the node kernel's reduce-scatter and allgather instead, around wireAllReduce.
//  - Allreduce otherwise: stagedAllReduce, a pipeline of chunks through pinned host memory, each chunk one
//    host allreduce, so that copies down, the wire and copies up overlap.
//  - The other collectives otherwise: stage(), whole messages through pinned host memory around the host
//    collective.
//
// Threads: called by the thread that runs the communicator's collectives, one call at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algo/algo.h"
#include "ddl/ddl.h"
#include "device/device_runtime.h"

namespace ddl {

class ShmNode;

// The largest pipeline chunk of stagedAllReduce: the pinned memory a rank keeps is three chunks.
constexpr size_t kMaxStagedChunkBytes = size_t{8} << 20;
// The staged chunk size for a message of bytes: a quarter of the message, so that even a few-MiB message has
// copies and wire overlapping, but at least 512 KiB (each chunk is one host collective and pays its latency)
// and at most max_chunk_bytes (rounded down to a multiple of 64 bytes, at least 64). A function of its
// arguments only: every rank cuts the message the same way, so every rank runs the same collectives.
size_t stagedChunkBytes(size_t bytes, size_t max_chunk_bytes = kMaxStagedChunkBytes);

// A round of the IPC path per member: 4 of them (ShmNode::buffers()) make 16 MiB of device memory per rank.
constexpr size_t kIpcRoundBytes = size_t{4} << 20;
// The size of a rank's record in the node's IPC exchange (ipcOffer).
constexpr size_t kIpcRecordBytes = 256;

// The node's setup-and-agree protocol, one for every setup of the device paths (the IPC scratch, the node
// kernel's regions, the registrations): allgather fills all (members x record bytes, this member's record at
// its place) on every member; agree returns whether every rank of the communicator said yes, and is also a
// meeting of them all. Comm makes it (Comm::nodeExchange), each setup with a signature variant of its own, so
// that a rank running anything else meanwhile makes them all fail with a mismatch instead of a hang.
struct NodeExchange {
  int members = 0;
  int me = 0;
  std::function<void(std::vector<char>& all, size_t record_bytes)> allgather;
  std::function<bool(bool ok)> agree;
};

class DevicePath {
 public:
  DevicePath(std::unique_ptr<DeviceRuntime> runtime, int rank, size_t max_chunk_bytes = kMaxStagedChunkBytes);
  ~DevicePath();
  DevicePath(const DevicePath&) = delete;
  DevicePath& operator=(const DevicePath&) = delete;

  DeviceRuntime& runtime() { return *rt_; }

  // Keeps the calling thread's current device across a call into the path: the runtime binds the device it
  // works on, and the application finds its own device current again afterwards.
  class KeepDevice {
   public:
    explicit KeepDevice(DeviceRuntime& rt) : rt_(rt), dev_(rt.current()) {}
    ~KeepDevice() { rt_.setCurrent(dev_); }
    KeepDevice(const KeepDevice&) = delete;
    KeepDevice& operator=(const KeepDevice&) = delete;

   private:
    DeviceRuntime& rt_;
    int dev_;
  };

  // Device memory for one call (an input copied next to the IPC scratch): waits for the queues, then frees.
  class Temp {
   public:
    Temp(DeviceRuntime& rt, size_t bytes) : rt_(rt), p_(rt.allocDevice(bytes)) {}
    ~Temp() {
      rt_.drain();
      rt_.freeDevice(p_);
    }
    Temp(const Temp&) = delete;
    Temp& operator=(const Temp&) = delete;
    void* get() const { return p_; }

   private:
    DeviceRuntime& rt_;
    void* p_;
  };
  // Whether any of the pointers is device memory (null ones are not).
  bool handles(std::initializer_list<const void*> ptrs);

  // The host collective on host memory: count elements from src into dst (src == dst: in place).
  using HostAllReduce = std::function<void(const void* src, void* dst, size_t count)>;
  // The whole allreduce (count > 0, a buffer on a device), through pinned host memory in chunks, at most
  // max_chunks of them (chunks grow past max_chunk_bytes to keep to it). Either buffer may be host memory.
  // host gets the chunks in order. Throws ddl::Error: ddlCudaError, or what host threw.
  void stagedAllReduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                       const HostAllReduce& host, size_t max_chunks = SIZE_MAX);

  // Allreduce of block (n elements on a device) among the members of g (two or more), which hold equal blocks
  // (one rank per node, the same block of each node's reduce-scatter), within s: only the bytes cross the
  // host, the GPU reduces what arrives. Chunk by chunk (stagedChunkBytes), through pinned memory: a direct
  // reduce-scatter (member j gets piece j of the chunk from every member and the GPU folds them, read from
  // pinned memory, into its own piece) and a direct allgather of the folded pieces: each piece is folded by
  // one member, so every member gets the same bits. A chunk's fold overlaps the next chunk's scatter; copies
  // overlap the wire. avg_divisor > 0 divides the folded pieces by it (ddlAvg). One phase of s, whether or
  // not this rank has data. Throws what s throws, or ddlCudaError.
  void wireAllReduce(Session& s, const Group& g, void* block, size_t n, ddlDataType_t type, ddlRedOp_t op,
                     int avg_divisor);

  // A buffer of a collective: p may be host or device memory, or null (a rank that passes none). partial: an
  // output the collective writes only parts of (alltoallv), so its copy starts as a copy of it.
  struct Span {
    const void* p;
    size_t bytes;
    bool partial = false;
  };
  // Runs body on host memory: device inputs are copied to pinned memory first, device outputs copied back
  // after. body gets one pointer per span, in order: the span's own where it is host memory or null, else its
  // pinned copy. An input inside an output (in place) maps into the output's copy.
  void stage(
      const std::vector<Span>& inputs, const std::vector<Span>& outputs,
      const std::function<void(const std::vector<const void*>& in, const std::vector<void*>& out)>& body);

  // The IPC path's setup, on every member of the node at its first device collective: each allocates its
  // scratch on dev (buffers rounds of round_bytes), offers it in the exchange, opens the others', and every
  // rank agrees. False (with *why) where any member could not: then every member has closed the others'
  // scratch before any freed its own, and the calls are staged. Throws what the exchange throws.
  bool ipcSetup(int dev, size_t round_bytes, int buffers, const NodeExchange& ex, std::string* why);
  // Closes the other members' scratch (before the communicator's last barrier, so that every member has
  // closed a scratch before its owner frees it).
  void ipcClosePeers() noexcept;
  // The device of the IPC scratch; -1 before ipcSetup.
  int ipcDevice() const { return ipc_dev_; }
  // The scratch as algo/shm.cpp's memory, for collectives on ipcDevice(). Binds it.
  NodeMemory& ipcMemory();

 private:
  class IpcMemory;
  // ipcSetup's steps. ipcOffer allocates the scratch and returns its record (kIpcRecordBytes bytes, saying
  // why not where the scratch could not be made); ipcAccept takes every member's record, in member order, and
  // opens the others' scratch; false (with *why) where any record or any opening failed. ipcRelease frees
  // what they made.
  std::string ipcOffer(int dev, size_t round_bytes, int buffers);
  bool ipcAccept(const std::vector<std::string>& records, int me, std::string* why);
  void ipcRelease() noexcept;
  char* pinned(size_t bytes);  // the staging pool, grown to at least bytes
  void releasePinned() noexcept;

  std::unique_ptr<DeviceRuntime> rt_;
  const int rank_;
  const size_t max_chunk_bytes_;
  bool reported_ = false;
  char* pinned_ = nullptr;
  size_t pinned_bytes_ = 0;
  std::vector<char*> retired_pinned_;  // outgrown buffers, freed by releasePinned (see pinned())
  int ipc_dev_ = -1;
  size_t ipc_round_bytes_ = 0;
  int ipc_buffers_ = 0;
  void* ipc_own_ = nullptr;       // this rank's scratch
  std::vector<char*> ipc_bases_;  // every member's scratch as this rank sees it
  std::unique_ptr<IpcMemory> ipc_mem_;
};

}  // namespace ddl
