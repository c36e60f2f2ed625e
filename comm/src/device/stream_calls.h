// StreamCalls: how a communicator runs its stream-ordered collectives (ddlAllReduceOnStream and the others),
// between Comm's checks of their arguments and the device work of StreamPath (stream_path.h) and DevicePath
// (device_path.h). Each call takes one of three schemes, decided once by its plan (planOnStream, algo/plan.h:
// the path, one-shot or two-shot, the CTAs, why it is host-paced), which the launch only reads:
//  - the node kernel, where every rank is on one node and shares its memory: one launch (StreamPath::launch)
//    on a stream of libddl's own, forked from the caller's; the call returns at once;
//  - kernel+wire (AllReducePath::kNodeKernelAcrossNodes), an allreduce across nodes whose ranks share memory,
//    the node being mdring's dim 0 with one dim above it: the node kernel's reduce-scatter into this rank's
//    block of the message, the block across the nodes with the GPU folding what arrives
//    (DevicePath::wireAllReduce), the node kernel's allgather; the call returns once the allgather is queued;
//  - host-paced elsewhere (and for the other collectives across nodes): the caller's thread waits for the
//    stream's earlier work, then runs the host-blocking device collective Comm hands in.
// The first stream-ordered call of any kind sets the node kernel up on every rank (a blocking exchange over
// the node's segment, agreed by every rank), so the scheme is known from then on. A rank that fails once its
// node's kernels are on their way breaks the communicator and poisons the flags those kernels wait on.
//
// What it needs of the communicator above it (running a collective in a Session, its queue of non-blocking
// calls, breaking it and telling the peers) comes through Owner, which Comm implements: device/ includes
// nothing above it.
//
// Threads: the thread calling the communicator's collectives, one call at a time; scheme() from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>

#include "algo/algo.h"
#include "algo/plan.h"
#include "ddl/ddl.h"
#include "device/device_path.h"
#include "device/node_kernel.h"
#include "device/stream_path.h"
#include "error.h"
#include "session.h"
#include "topology.h"
#include "transport/shm_node.h"

namespace ddl {

class StreamCalls {
 public:
  // The communicator, as StreamCalls uses it.
  class Owner {
   public:
    // Runs body as one collective in a Session under the communicator's lock; a failure breaks the
    // communicator and tells the peers.
    virtual void run(CollKind kind, ddlDataType_t type, ddlRedOp_t op, size_t count, int root, int variant,
                     const std::function<void(Session&)>& body) = 0;
    // Waits until the communicator's queued non-blocking calls are done.
    virtual void drainAsync() = 0;
    // Runs a collective of device buffers: a failure outside run() breaks the communicator and tells the
    // peers, and no device work is left running once it throws.
    virtual void deviceCall(const std::function<void()>& body) = 0;
    // This rank leaves a collective its peers are in, or on their way to: breaks the communicator and tells
    // them, unless e is an abort (which has told them).
    virtual void breakAndTell(const Error& e) = 0;
    // The node's setup-and-agree protocol, its collectives signed with variant.
    virtual NodeExchange nodeExchange(int variant) = 0;

   protected:
    ~Owner() = default;
  };

  // Every reference outlives this object (they are the communicator's). shape is the communicator's one
  // AllReduceShape, whose node_kernel this sets; shm the node's segment, set once the ranks joined it; grid
  // mdring's grid.
  StreamCalls(Owner& owner, DevicePath& device, StreamPath& path, AllReduceShape& shape,
              const std::unique_ptr<ShmNode>& shm, const Topology& grid, int rank);

  // A stream-ordered collective as Comm hands it in: which one (kAllReduce, kReduceScatter, kAllGather,
  // kBroadcast or kReduce) and the node kernel's arguments of it (buffers, count, type, op, root, and the
  // divisor of ddlAvg, 0 unless op is ddlAvg); the kernel's kind and CTAs come from the call's plan.
  struct Call {
    CollKind coll;
    node::Args args;
  };
  static Call describe(CollKind coll, const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                       ddlRedOp_t op, int root, int avg_divisor);

  // Runs one stream-ordered collective on stream as its plan says: the node kernel, kernel+wire for an
  // allreduce across nodes, else host (host-paced: waits for the stream, then runs host on this thread).
  // bufs are the device buffers to check (null ones aside). The caller has checked the arguments and that
  // the communicator is not broken.
  void call(void* stream, const Call& c, std::initializer_list<const void*> bufs,
            const std::function<void()>& host);

  // "kernel", "kernel+wire", "host" (host-paced) or "unset" (no stream-ordered collective yet). Any thread.
  std::string scheme() const;

  // ddlCommRegister and ddlCommDeregister: collectives of every rank, in the same order
  // (StreamPath::addRegistration, removeRegistration). The first sets the node kernel up, as the first
  // stream-ordered call does. Failures to share a buffer are argument errors on every rank.
  void* registerBuffer(void* ptr, size_t bytes);
  void deregister(void* handle);
  // ddlCommRegisterGraphBuffers (StreamPath::registerGraphBuffers): a collective.
  void registerGraphBuffers();

 private:
  // The device of the stream, checking that every buffer is device memory on it.
  int streamDeviceOf(void* stream, std::initializer_list<const void*> bufs);
  // The first stream-ordered collective that may run the node kernel: sets it up, or not, on every rank.
  void setupNodeKernel(void* stream, int dev);
  // The node's exchange for the node kernel's setup and the registrations (Owner::nodeExchange).
  NodeExchange exchange() { return owner_.nodeExchange(kSetupVariant); }
  // The signature variant of the node kernel's setup exchange.
  static constexpr int kSetupVariant = 0xD0;
  // Sets shape_.node_kernel and what scheme() reads.
  void setNodeKernel(Setup s);
  // The words of a host-paced call's reason.
  std::string hostPacedWhy(HostPacedWhy why) const;
  // A host-paced call: waits for the stream's earlier work, then runs host on this thread.
  void hostPaced(void* stream, int dev, HostPacedWhy why, const std::function<void()>& host);
  // Enqueues the node kernel; a failure to do so breaks the communicator.
  void launchNodeKernel(void* stream, const node::Args& args);
  // kernel+wire (the node kernel is ready on the stream's device): returns once the allgather is queued.
  void allReduceAcross(void* stream, const node::Args& a);
  DataSpec spec(ddlDataType_t type, ddlRedOp_t op) const;

  Owner& owner_;
  DevicePath& device_;
  StreamPath& path_;
  AllReduceShape& shape_;
  const std::unique_ptr<ShmNode>& shm_;
  const Topology& grid_;
  const int rank_;
  std::atomic<int> scheme_{static_cast<int>(Setup::kUntried)};  // shape_.node_kernel (setNodeKernel)
  std::string setup_why_;                                       // why the node kernel's setup failed
  bool told_host_paced_ = false;  // DDL_DEBUG said once why calls are host-paced
};

}  // namespace ddl
