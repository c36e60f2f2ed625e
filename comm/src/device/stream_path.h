// StreamPath: what stream-ordered device collectives (ddlAllReduceOnStream and the others) need beside a
// communicator's host machinery, for one rank. Comm owns one where it has a DeviceRuntime; StreamCalls
// (stream_calls.h) decides per call which scheme runs it and drives this.
//
// A stream-ordered collective is ordered on the caller's stream: the stream's later work sees the result. Three
// schemes carry it:
//
//  - The node kernel (device/node_kernel.h), where every rank is on one node and shares memory with the others
//    and each has a GPU of its own, or several share one GPU under the MPS daemon (then their kernels run at
//    once). One kernel per collective and rank on a stream of libddl's own, forked from the caller's stream
//    and joined back to it with events: the caller's collectives run in call order even when it uses several
//    streams, and the fork and join are captured into a CUDA graph like any stream work. Each rank's region
//    (node_kernel.h's layout) is allocated, exported over CUDA IPC and opened by every other member once, at
//    the first stream-ordered collective (setupNode: a host collective, so that one must not be captured).
//    No host takes part after that; the call returns at once.
//  - The node kernel around the wire (kernel+wire): an allreduce across nodes whose ranks share memory, the node
//    being mdring's dim 0 with one dim above it. The node kernel (set up on each node as above) reduce-scatters
//    into this rank's block; the host waits for it (waitForKernels), sends the block across the nodes with the
//    GPU folding what arrives (DevicePath::wireAllReduce), and launches the node kernel's allgather, which
//    spreads the result over the node while the call returns. A rank that fails before its allgather is on its
//    way poisons its flags (poisonFlags), so that its node's kernels waiting for it end. It cannot be captured.
//  - Host-paced, everywhere else (the other collectives across nodes, an allreduce with two or more dims above
//    the node, ranks on several nodes that do not share memory, no CUDA IPC, or ranks sharing one GPU without
//    MPS, whose kernels would take turns on the GPU and so could not wait for each other inside a kernel): the
//    call waits until the stream's earlier work is done (waitForStream, polling an event so that an abort
//    ends the wait) and runs the collective with the host-blocking device path (device_path.h) on the
//    caller's thread. It returns once the result is in place, so it overlaps nothing; it cannot be captured.
//    A version that held the stream on the GPU (a wait on a word of pinned memory) while the communicator's
//    thread ran the collective hung on an H200: a stream waiting on the GPU stalls a hardware queue, which
//    the collective's own copies may share.
//
// Failures found on the GPU (a timeout or an abort inside the kernel, or a peer's) land in the error word;
// Comm reads it (gpuError) and breaks the communicator. abort() sets the abort word, which every wait of the
// kernel polls, so work already on the GPU ends too.
//
// Threads: setupNode, launch and waitForStream on the thread calling the communicator's collectives; abort
// and gpuError on any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "algo/plan.h"
#include "ddl/ddl.h"
#include "device/device_path.h"
#include "device/device_runtime.h"
#include "device/node_kernel.h"
#include "env.h"

namespace ddl {

// A node kernel slot (node_kernel.h): 4 of them per rank, 32 MiB of device memory with the default.
constexpr size_t kNodeSlotBytes = size_t{8} << 20;
constexpr size_t kMinNodeSlotBytes = node::kUnitBytes * node::kMaxRanks * node::kMaxBlocks;  // 16 KiB
// The size of a rank's record in the node kernel's setup exchange.
constexpr size_t kNodeRecordBytes = 512;
// The registrations' table (node_kernel.h): 512 KiB of device memory per rank.
constexpr size_t kRegistrationTableBytes = size_t{node::kMaxRegistrations} * node::kMaxRanks * sizeof(char*);

// The node kernel's blocks (CTAs) for members whose GPUs keep capacity[m] of its CTAs resident at once and
// are shared by sharing[m] members (each member's GPU as it says): as many as each GPU keeps resident for
// every member on it, at most node::kMaxBlocks, the least over the members, since block b of every member
// meets block b of every other; forced (DDL_NODE_BLOCKS; 0: not forced) instead, where every GPU keeps that
// many resident for each member on it. 0 where the GPUs cannot (fewer than node::kMinBlocks, or than forced):
// ranks sharing a GPU wait for each other inside the kernel, so all their CTAs must be resident at once;
// *short_member (where given) then names the first member whose GPU cannot.
int nodeKernelBlocks(const std::vector<int>& capacity, const std::vector<int>& sharing, int forced,
                     int* short_member = nullptr);

class StreamPath {
 public:
  // forced_blocks: DDL_NODE_BLOCKS (nodeKernelBlocks); 0: chosen at the setup.
  StreamPath(DeviceRuntime& rt, int rank, int timeout_ms, DeviceScheme forced, size_t slot_bytes,
             int forced_blocks = 0);
  ~StreamPath();
  StreamPath(const StreamPath&) = delete;
  StreamPath& operator=(const StreamPath&) = delete;

  // Every member of the node, at its first stream-ordered collective on a device: decides the scheme and,
  // for the kernel, sets up the regions. Returns whether the node kernel serves the node; *why says why not.
  // Throws what the exchange throws (the communicator is then broken).
  bool setupNode(int dev, const NodeExchange& ex, std::string* why);
  int kernelDevice() const { return dev_; }
  // The node kernel's blocks, agreed at the setup (0 before it, or where it failed).
  int blocks() const { return blocks_; }
  bool ready() const { return ready_; }

  // Enqueues a collective of the node kernel on stream (on kernelDevice()). a's kind, counts, buffers, type,
  // op, root and divisor are the caller's; the rest comes from here. capturing: stream is being captured
  // into a CUDA graph (an allreduce then reserves rows for its buffers: graphRef).
  void launch(void* stream, node::Args a, bool capturing = false);

  // The host-paced scheme: returns once the work queued on stream (on dev) so far is done. Polls, so that an
  // abort ends the wait (then throws ddlAborted).
  void waitForStream(void* stream, int dev);
  // Returns once the node kernels launched so far are done (the allreduce across nodes waits for its node's
  // reduce-scatter before the block goes on the wire). Polls, as waitForStream.
  void waitForKernels();

  // After a failure that keeps this rank from launching a kernel its node's members launch (the allreduce
  // across nodes failed on the wire): writes kPoison into this rank's flags in every member's region, so
  // that their kernels waiting for it fail now (node::kPeerFailed) instead of at the timeout. At once from
  // the host, and again by a kernel (node::Kind::kPoison) on the node kernel's stream after this rank's
  // earlier kernels, which may still raise a flag over the first. Best effort.
  void poisonFlags() noexcept;

  // Any thread.
  void abort();
  // The kernel's failure (node::ErrorCode), kNoError while all is well.
  uint32_t gpuError() const;
  // What gpuError() means, for messages: a mismatch names both calls and the member.
  std::string describeGpuError() const;
  static std::string describeGpuError(uint32_t code);
  // A call's signature in words: "allreduce of 1024 float32 (sum)".
  static std::string describeCall(uint64_t signature);
  DeviceScheme forced() const { return forced_; }

  // ---- Registered buffers (ddlCommRegister; device/stream_registry.cpp) ----
  // A registration: this rank's buffer and, where the node kernel serves, its row of the table that holds
  // every member's buffer of it. Row -1: inert (the node kernel does not serve, so nothing reads in place).
  struct Registration {
    char* ptr = nullptr;
    size_t bytes = 0;
    int row = -1;
    std::vector<std::string> imports;  // the members' handles this rank opened for it (closed at removal)
    bool pending = false;              // a captured buffer's row, reserved, not yet shared (graphRef)
    uint64_t id = 0;  // its allocation's id when shared (DeviceRuntime::allocationId; 0: unknown)
  };
  // Every member, the same registrations in the same order (collectives over ex). Where the node kernel is
  // ready: every member shares its buffer's allocation over CUDA IPC and opens the others', and they agree;
  // a member that cannot (memory from cuMemCreate, as PyTorch's expandable segments; no IPC) makes it fail on
  // every member (null, *why says why). Elsewhere an inert registration. Throws what the exchange throws.
  Registration* addRegistration(char* ptr, size_t bytes, const NodeExchange& ex, std::string* why);
  // Every member, in the same order: waits for this rank's kernels, meets the others (ex.agree), closes what
  // it opened and frees the row. False where r is no registration of this communicator.
  bool removeRegistration(Registration* r, const NodeExchange& ex);
  // The reference (node_kernel.h) of [p, p + bytes) in a registration with a row; 0 where none holds it.
  uint64_t refOf(const void* p, size_t bytes) const;
  // ddlCommRegisterGraphBuffers, every member in the same order: shares the buffers of the allreduces
  // captured since the last call (graphRef's rows), each as addRegistration does. Returns how many could not
  // be (their rows stay empty: those calls are staged), *why the first reason.
  int registerGraphBuffers(const NodeExchange& ex, std::string* why);

  // Waits for the node kernel's stream (aborting it past the timeout) and closes the other members' regions:
  // every member, before the communicator's last barrier, so that no region is freed while open.
  void closePeers() noexcept;
  // closePeers, then frees this rank's region and the rest.
  void release() noexcept;
  // After a failure: release() leaves this rank's region, the peers' mappings, its stream and words as they
  // are (a peer's kernel may still write its poison into the region; about 32 MiB of device memory lost until
  // the process ends). closePeers abandons them too when its stream does not drain.
  void abandon() { abandoned_ = true; }

 private:
  // Fills in what a launch of a takes from here (members, regions, words, timeout, signature, and an
  // allreduce's registered buffers).
  void complete(node::Args& a, bool capturing);
  // A free row of the table, taken (-1: none left). Every member takes the same rows in the same order.
  int takeRow();
  // Shares reg's buffer into row on every member (the exchange: records, opening, the row, the agreement).
  // False on every member where any member could not, *why saying why; the row is left empty.
  bool share(Registration& reg, int row, const NodeExchange& ex, std::string* why);
  // A captured allreduce's buffer: a new row reserved for it (on every member alike, whatever it holds, so
  // that rows stay in step), and its reference: its registration's where it has one, else the new row's,
  // empty until registerGraphBuffers shares it (node::liveRef: the call is staged until then).
  uint64_t graphRef(char* p, size_t bytes);
  // The members' allocations this rank opened for registrations, by handle, counted: several registered
  // buffers may lie in one allocation, which CUDA opens once.
  char* openShared(const std::string& handle);
  void closeShared(const std::string& handle) noexcept;
  // At release: every registration's handles closed, the table freed.
  void dropRegistrations() noexcept;

  DeviceRuntime& rt_;
  const int rank_;
  const int timeout_ms_;
  const DeviceScheme forced_;
  const size_t slot_bytes_;
  const int forced_blocks_;
  int blocks_ = 0;
  bool ready_ = false;
  int dev_ = -1;
  int members_ = 0, me_ = 0;
  size_t region_bytes_ = 0;
  void* own_ = nullptr;         // this rank's region
  std::vector<char*> regions_;  // every member's, as this rank sees it
  void* stream_ = nullptr;      // the node kernel's
  void* fork_ = nullptr;        // events: the caller's stream to ours, and back
  void* join_ = nullptr;
  void* words_host_ = nullptr;  // Words (stream_path.cpp): abort, error, a mismatch's detail; pinned, mapped
  void* poison_ = nullptr;      // kMaxBlocks words of node::kPoison, pinned (poisonFlags' source)
  void* words_dev_ = nullptr;
  std::atomic<uint32_t*> abort_word_{nullptr};
  std::atomic<uint32_t*> error_word_{nullptr};
  std::atomic<bool> aborted_{false};
  bool abandoned_ = false;
  std::vector<std::unique_ptr<Registration>> registrations_;
  std::vector<bool> rows_;  // used rows of the table
  void* table_ = nullptr;   // kMaxRegistrations x kMaxRanks pointers, device memory
  std::map<std::string, std::pair<char*, int>> opened_;  // handle: mapping, registrations using it
};

}  // namespace ddl
