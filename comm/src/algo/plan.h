// planAllReduce: how an allreduce runs, decided in one place. A pure function of what the communicator knows
// of itself (AllReduceShape), the message's size and where its buffers are: Comm asks it for every allreduce,
// host, device or stream-ordered, and acts on the answer; tests ask it without a communicator.
//
// The paths, in the order they are preferred:
//  - host buffers: the host algorithm (chooseAllReduce below: DDL_ALGO, the tuning table, or the node's
//    shared-memory segment where every rank is in it);
//  - device buffers, host-blocking (device/device_path.h): over CUDA IPC on one node; the node's dim over IPC
//    and the rest staged where the node is mdring's dim 0; else staged through pinned memory around the host
//    algorithm;
//  - device buffers on a stream (device/stream_path.h): the node kernel where every rank is on one node and
//    shares its segment, one-shot up to nodeOneShotBytes, two-shot above; where the node is mdring's dim 0
//    across several nodes, the node kernel's reduce-scatter and allgather around each rank's block crossing
//    the wire, folded by the GPU (DevicePath::wireAllReduce); else host-paced, running the host-blocking
//    device path on the calling thread once the stream's earlier work is done.
// A path with a setup (the IPC scratch, the node kernel's regions) is planned while its setup has not been
// tried (`setup`); Comm then runs the setup, and a failed one (Setup::kOff) makes the next plan choose the
// next path. Checks that need the buffers themselves (on which device they are) stay with Comm.
#pragma once

#include <cstddef>
#include <string>

#include "algo/algo.h"

namespace ddl {

class TuneTable;

enum class Setup { kUntried, kReady, kOff };

// How stream-ordered device collectives of one node meet (DDL_DEVICE_SCHEME): kAuto chooses the node kernel
// where every rank has a GPU of its own or MPS shares one, else the host-paced path; kKernel means the node
// kernel or an error, kHost the host-paced path.
enum class DeviceScheme { kAuto, kKernel, kHost };
const char* deviceSchemeName(DeviceScheme s);

enum class Buffers { kHost, kDevice, kDeviceOnStream };

struct AllReduceShape {
  int nranks = 1;
  bool shm_all = false;   // every rank is a member of this node's shared-memory segment
  bool shm_dim0 = false;  // the segment holds the node, mdring's dim 0 across several nodes
  Algo forced_algo = Algo::kAuto;
  size_t forced_segment = 0;
  const TuneTable* tune = nullptr;
  std::string topology;                 // Topology::str()
  bool has_grid = false;                // mdringGrid(topology) has two or more non-trivial dims
  int dims_above_node = 0;              // shm_dim0: the non-trivial dims of mdring's grid above dim 0
  Setup ipc = Setup::kUntried;          // the host-blocking device path's IPC scratch
  Setup node_kernel = Setup::kUntried;  // the stream-ordered node kernel's regions
  int node_blocks = 0;                  // kReady: the node kernel's CTAs, agreed at its setup
};

enum class AllReducePath {
  kHost,                   // `algo` on host buffers
  kIpc,                    // device, one node: algo/shm.cpp over CUDA IPC, the GPU reducing
  kIpcAcrossNodes,         // device, the node is dim 0: the node's dim over IPC, the other dims staged
  kStaged,                 // device elsewhere: `algo` on chunks staged through pinned memory
  kNodeKernel,             // on a stream, one node: one kernel per rank
  kNodeKernelAcrossNodes,  // on a stream, the node is dim 0: node kernels around the block on the wire
  kHostPaced,  // on a stream elsewhere: `host_paced` (a host-blocking device path) after the stream
};
const char* pathName(AllReducePath p);

struct AllReducePlan {
  AllReducePath path = AllReducePath::kHost;
  AllReduceChoice algo{Algo::kRing, 0};  // the host algorithm: kHost, kStaged (and kHostPaced's staged path)
  bool one_shot = false;                 // kNodeKernel: every rank reduces the whole message
  bool setup = false;                    // the path's setup has not been tried yet
  AllReducePath host_paced = AllReducePath::kStaged;  // kHostPaced: the path it runs
};

AllReducePlan planAllReduce(const AllReduceShape& shape, size_t bytes, Buffers buffers);

// Why a stream-ordered collective is host-paced (StreamPlan::why).
enum class HostPacedWhy {
  kNone,                 // it is not
  kSingleRank,           // a communicator of one rank
  kNoSharedNode,         // the ranks are on several nodes (the node not mdring's dim 0), or share no memory
  kAlgoForced,           // DDL_ALGO sends the node's collectives elsewhere
  kSetupFailed,          // the node kernel's setup failed on some rank (its message says why)
  kOtherDevice,          // the stream's device is not the one the node kernel was set up on
  kAcrossOnlyAllReduce,  // across nodes only allreduce runs the node kernel
};

// A stream-ordered collective's plan: everything its launch reads, decided once per call (NCCL's
// topoGetAlgoInfo: decide, store, the launch only reads it).
struct StreamPlan {
  AllReducePath path = AllReducePath::kHostPaced;  // kNodeKernel, kNodeKernelAcrossNodes or kHostPaced
  bool one_shot = false;  // an allreduce on kNodeKernel: every member reduces the whole message (one meeting)
  int blocks = 0;         // the node kernel's CTAs (AllReduceShape::node_blocks)
  // The node kernel's setup has not been tried and the call may take it: run the setup (every rank, at its
  // first stream-ordered collective of any kind), then plan again. path says where the call would go.
  bool setup = false;
  HostPacedWhy why = HostPacedWhy::kNone;  // kHostPaced: why
};

// The plan of stream-ordered collective coll of bytes (allreduce: the message; the others: unused) on a
// stream of the device the node kernel was set up on (on_kernel_device) or another.
StreamPlan planOnStream(const AllReduceShape& shape, CollKind coll, size_t bytes, bool on_kernel_device);

// How ranks of one node reach each other: "shm" (every rank in the node's segment), "shm+ucx" (the segment
// holds mdring's dim 0, UCX the rest) or "ucx" (ddlCommGetIntraNodePath).
const char* intraNodePathName(const AllReduceShape& shape);

// Whether the node's shared-memory forms serve collectives that DDL_ALGO does not send elsewhere.
bool shmServes(const AllReduceShape& shape);
// Whether stream-ordered collectives (all of them, not only allreduce) may run the node kernel.
bool nodeKernelServes(const AllReduceShape& shape);
// Whether a stream-ordered allreduce on several nodes may run the node kernel on each
// (kNodeKernelAcrossNodes): the node is mdring's dim 0 with one dim above it (GPUs x nodes; with racks above,
// mdring's levels keep the slower links' bytes down, host-paced), and DDL_ALGO leaves it to mdring. The other
// stream-ordered collectives across nodes are host-paced.
bool nodeKernelAcrossServes(const AllReduceShape& shape);
// Up to this many bytes the node kernel's allreduce is one-shot (every rank reads every rank's whole message:
// one barrier), above it two-shot (each rank reduces its slice: two barriers, each byte read once).
size_t nodeOneShotBytes(int nranks);

}  // namespace ddl
