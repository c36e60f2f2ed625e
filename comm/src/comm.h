// Comm: one communicator, the object behind ddlComm_t.
//
// It validates arguments, picks the algorithm, runs each collective in a Session on its Channel, and keeps
// the communicator's error state: the first failure that involved peers (a timeout, a dead or aborting peer,
// a mismatch) breaks the communicator for good, is told to the peers, and is returned by every later call and
// by asyncError(). Argument errors caught before any message is sent break nothing.
//
// Threads: collectives are called by one user thread at a time. Non-blocking collectives run on the
// communicator's executor thread, in call order; a blocking call first waits for the queued ones, so the
// order on the wire is always the order of calls. Point-to-point operations (p2p.h) may be submitted from any
// thread, also while a collective runs; they move on inside whatever collective runs, else on the executor,
// which gives the transport back as soon as a collective wants it. abort() and asyncError() may be called
// from any thread.
//
// Device buffers (builds with CUDA): every blocking collective takes them, through the DevicePath
// (device_path.h): over CUDA IPC with the GPU reducing where all ranks share a node and shared memory; where
// the node is mdring's dim 0, the node's dim over IPC and this rank's block across the nodes through pinned
// memory; else staged through pinned host memory around the host collective. Point-to-point operations refuse
// them with an argument error. The stream-ordered collectives (the *OnStream calls) are enqueued on the
// caller's CUDA stream, and StreamCalls (device/stream_calls.h) runs each by one of three schemes, which
// streamScheme() names: "kernel" (the node kernel, every rank on one node), "kernel+wire" (an allreduce across
// nodes: the node kernel's reduce-scatter and allgather around each rank's block on the wire; planAllReduce
// calls it AllReducePath::kNodeKernelAcrossNodes, "node-kernel+wire") and "host" (host-paced: the blocking
// device collective once the stream's earlier work is done).
//
// Files: comm.cpp (bootstrap, the node's segment, argument checks, the blocking collectives, errors,
// teardown), comm_async.cpp (point-to-point, ddlIallReduce and the executor), device/stream_calls.cpp (what
// onStream hands over).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "algo/algo.h"
#include "algo/plan.h"
#include "async_op.h"
#include "ddl/ddl.h"
#include "device/device_path.h"
#include "device/stream_calls.h"
#include "device/stream_path.h"
#include "error.h"
#include "options.h"
#include "p2p.h"
#include "rendezvous/store.h"
#include "session.h"
#include "telemetry.h"
#include "transport/shm_node.h"
#include "transport/transport.h"

namespace ddl {


class Comm final : private StreamCalls::Owner {
 public:
  // The real thing: bootstraps through the TCP store at root ("host:port"; rank 0 serves it) and connects
  // every rank over UCX. Throws ddl::Error naming what failed (root unreachable, a rank missing, ...).
  static std::unique_ptr<Comm> create(int nranks, int rank, const std::string& root, const Options& options);
  // Bootstraps through a caller's store (ddlCommInitRankWithStore): no port of libddl's own.
  static std::unique_ptr<Comm> createWithStore(int nranks, int rank, const ddlStore_t& store, const Options& options);

  // Over a transport built elsewhere (tests use LocalTransport).
  Comm(std::unique_ptr<Transport> transport, const Options& options);
  ~Comm();

  // Finds the ranks that share this rank's node (Transport::nodeOf) and, where shared memory can serve them,
  // joins them in one segment announced through store: every rank must call it, right after construction.
  // Where no topology with two or more dims was given and the nodes hold equal, consecutive runs of ranks, the
  // topology becomes (ranks per node) x (nodes). Shared memory then serves every collective that has a
  // shared-memory form when all ranks share one node, and mdring's dim 0 when it is the node. The ranks agree
  // on the outcome (one small allreduce), so a rank that cannot map the segment sends everyone to UCX.
  void joinNode(Store& store, const Deadline& deadline);
  // "shm" (one node), "shm+ucx" (mdring's dim 0 over shared memory) or "ucx", for tools and tests.
  std::string intraNodePath() const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const Options& options() const { return options_; }

  void allReduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op);
  void broadcast(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, int root);
  void allGather(const void* sendbuf, void* recvbuf, size_t sendcount, ddlDataType_t type);
  void reduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, ddlDataType_t type, ddlRedOp_t op);
  void barrier();
  void reduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op, int root);
  void gather(const void* sendbuf, void* recvbuf, size_t sendcount, ddlDataType_t type, int root);
  void scatter(const void* sendbuf, void* recvbuf, size_t recvcount, ddlDataType_t type, int root);
  void allToAll(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type);
  void allToAllv(const void* sendbuf, const size_t* sendcounts, const size_t* sdispls, void* recvbuf,
                 const size_t* recvcounts, const size_t* rdispls, ddlDataType_t type);
  std::shared_ptr<AsyncOp> iallReduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                                      ddlRedOp_t op);

  // Stream-ordered collectives of device buffers (device/stream_path.h): enqueued on stream (a cudaStream_t;
  // null: the legacy default stream), they return at once. Failures found later break the communicator.
  void allReduceOnStream(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op,
                         void* stream);
  void reduceScatterOnStream(const void* sendbuf, void* recvbuf, size_t recvcount, ddlDataType_t type,
                             ddlRedOp_t op, void* stream);
  void allGatherOnStream(const void* sendbuf, void* recvbuf, size_t sendcount, ddlDataType_t type,
                         void* stream);
  void broadcastOnStream(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, int root,
                         void* stream);
  void reduceOnStream(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op,
                      int root, void* stream);
  // "kernel", "kernel+wire", "host" (host-paced) or "unset" (no stream-ordered collective yet), for tools
  // and tests. Any thread.
  std::string streamScheme() const;
  // ddlCommRegister and ddlCommDeregister (StreamCalls::registerBuffer, deregister): collectives.
  void* registerBuffer(void* buf, size_t bytes);
  void deregisterBuffer(void* handle);
  void registerGraphBuffers();  // ddlCommRegisterGraphBuffers
  bool streamCapturing(void* stream);  // ddlCommStreamCapturing

  // Point-to-point, any thread (see p2p.h). The i-forms return at once; the others wait for the operation
  // and throw its error.
  std::shared_ptr<AsyncOp> isend(const void* buf, size_t count, ddlDataType_t type, int peer);
  std::shared_ptr<AsyncOp> irecv(void* buf, size_t count, ddlDataType_t type, int peer);
  void send(const void* buf, size_t count, ddlDataType_t type, int peer);
  void recv(void* buf, size_t count, ddlDataType_t type, int peer);
  // Tagged (ddlIsendTagged, ddlIrecvTagged): matched by tag; a receive's peer may be DDL_ANY_SOURCE, and
  // *source (if not null) gets the sender's rank before the operation is done.
  std::shared_ptr<AsyncOp> isendTagged(const void* buf, size_t count, ddlDataType_t type, int peer, int tag);
  std::shared_ptr<AsyncOp> irecvTagged(void* buf, size_t count, ddlDataType_t type, int peer, int tag,
                                       int* source);

  // ddlCommShrink: the survivors (every rank but exclude's and the ones found gone) agree on who is gone
  // through the rendezvous store (rendezvous/agreement.h) and meet in a new communicator under a prefix of
  // the store, numbered in this one's order. Throws ddlRemoteError on a rank the others left out.
  std::unique_ptr<Comm> shrink(const std::vector<int>& exclude);
  // Made by shrink(): the parent's ranks left out, ascending; else empty.
  const std::vector<int>& excluded() const { return excluded_; }
  // ddlCommGrow, a collective: admits up to max_new (0: any number) of the processes waiting in join() and
  // meets them in a new communicator, where this one's ranks keep their numbers and the joiners follow in the
  // order they came. Null when none waits (every rank gets the same answer).
  std::unique_ptr<Comm> grow(int max_new);
  // ddlCommJoin: waits (up to the timeout) until a communicator meeting through root grows to admit this
  // process, and returns this process's rank of it. options' topology is not used: a grown communicator's is
  // its own.
  static std::unique_ptr<Comm> join(const std::shared_ptr<Store>& root, const Options& options);
  // The same through the TCP store at root ("host:port", rank 0's; with options' secret).
  static std::unique_ptr<Comm> join(const std::string& root, const Options& options);

  // Any thread. Blocked and later calls fail with ddlAborted; peers are told.
  void abort();
  // Any thread: ddlSuccess or the error that broke the communicator.
  ddlResult_t asyncError() const;

  // Waits for queued operations, then (unless broken) a barrier bounded by min(timeout, 10 s) so that no peer
  // is still reading our last messages, then tears the transport down. Errors are swallowed: best effort.
  void shutdown();

 private:
  static void checkRanks(int nranks, int rank);
  // "host:port" of a rendezvous store (DDL_ROOT) into its parts; throws ddlInvalidArgument when malformed or
  // the port is 0.
  static void parseRoot(const std::string& root, std::string* host, int* port);
  // Agrees on the communicator's shape through store, claims the rank (when claim: needs store.add) and
  // connects every rank over UCX. where names the rendezvous for messages.
  static std::unique_ptr<Comm> bootstrap(int nranks, int rank, Store& store, bool claim,
                                         const std::string& where, const Options& options,
                                         const Deadline& deadline);
  void run(CollKind kind, ddlDataType_t type, ddlRedOp_t op, size_t count, int root, int variant,
           const std::function<void(Session&)>& body) override;
  // Host or device buffers: the device path when device_ handles them, else allReduceNow.
  void allReduceAny(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op);
  void allReduceNow(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op);
  // Whether any of the buffers is device memory (never in builds without a device runtime).
  bool onDevice(std::initializer_list<const void*> bufs) const { return device_ && device_->handles(bufs); }
  // Runs a collective of device buffers: a failure outside run() (a device copy between chunks) breaks the
  // communicator and tells the peers as run() does; no device work is left running once it throws.
  void deviceCall(const std::function<void()>& body) override;
  // An allreduce's input as the GPU may read it over IPC: sendbuf where it is on the scratch's device (or in
  // place), else a copy of it queued into recvbuf (bytes long), which the allreduce then runs on in place.
  const void* ipcInput(NodeMemory& mem, const void* sendbuf, void* recvbuf, size_t bytes);
  // The node's IPC memory when all of bufs (null ones aside) are on its device, setting it up the first time
  // (every member offers its scratch and opens the others', and they agree: collectives); else null (IPC is
  // off, or the buffers are elsewhere): stage the call. The caller has decided that the node's IPC path may
  // serve (planAllReduce for allreduce; shmServes() for the others).
  NodeMemory* deviceNode(std::initializer_list<const void*> bufs);
  // The node's setup-and-agree protocol (device_path.h) over the node's segment, its collectives signed with
  // variant: the IPC scratch's setup and StreamCalls' (the node kernel, the registrations).
  NodeExchange nodeExchange(int variant) override;
  // Allreduce of device buffers over several nodes: the node's dim over IPC on the GPUs, the other dims on
  // this rank's block staged through pinned memory, back over IPC.
  void allReduceAcrossNodes(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                            ddlRedOp_t op, NodeMemory& mem);
  // A stream-ordered collective (the *OnStream calls), once its arguments are checked: streams_ runs it
  // (the node kernel, kernel+wire, or host-paced: host, the blocking device collective, on this thread once
  // the stream's earlier work is done), as the call's plan says; bufs the device buffers to check.
  void onStream(void* stream, const StreamCalls::Call& c, std::initializer_list<const void*> bufs,
                std::function<void()> host);
  // This rank leaves a collective its peers are in, or on their way to: out of step for good. Breaks the
  // communicator and tells them, unless e is an abort (which has told them).
  void breakAndTell(const Error& e) override;
  // Runs task on the executor after the queued ones (iallReduce).
  void enqueue(std::function<void()> task);
  // A failure the node kernel reported breaks the communicator.
  void noteGpuError();
  // The result a node kernel's failure (node::ErrorCode) breaks the communicator with.
  static ddlResult_t gpuResult(uint32_t code);
  // Throws ddlInvalidArgument when a buffer of a point-to-point operation is device memory.
  void refuseDevice(const void* sendbuf, const void* recvbuf) const;
  void checkType(const char* what, ddlDataType_t type) const;
  void checkOp(ddlRedOp_t op, ddlDataType_t type) const;  // after checkType
  void checkBuffers(const void* sendbuf, const void* recvbuf, size_t count) const;
  void checkRoot(int root) const;
  void checkPeer(int peer) const;
  // tag < 0: the sequenced (untagged) form.
  std::shared_ptr<AsyncOp> submitP2P(bool is_recv, void* buf, size_t count, ddlDataType_t type, int peer,
                                     int tag = -1, int* source = nullptr);
  // The executor's share of point-to-point progress, while no collective runs (see executorLoop).
  void driveP2P();
  // After a point-to-point failure, an abort or a failed collective: breaks the communicator (if not yet),
  // tells the peers and fails the pending point-to-point operations, each once. Holds op_mu_.
  void noteBrokenLocked();
  void startExecutorLocked();  // q_mu_ held
  // The op lock, announced so that the executor's point-to-point loop lets go of it at once.
  std::unique_lock<std::mutex> lockOp();
  DataSpec spec(ddlDataType_t type, ddlRedOp_t op, size_t bytes) const;
  void drainAsync() override;
  std::unique_ptr<Telemetry> telemetry_;  // null unless DDL_AGENT_SOCKET names a listening agent
  void executorLoop();
  void breakWith(ddlResult_t code, const std::string& why);
  // Throws the error that broke the communicator (brokenMessage), if one did.
  void failIfBroken() const;

  // Throws ddlInvalidArgument naming fn when this communicator has no store to meet others through.
  void requireStore(const char* fn) const;
  // Generation `generation` of a communicator meeting through root: bootstraps under root's "gen/<g>/".
  static std::unique_ptr<Comm> nextGeneration(int nranks, int rank, int generation, const Options& options,
                                              const std::shared_ptr<Store>& root,
                                              const std::shared_ptr<TcpStoreServer>& server,
                                              const char* where);
  // shrink(): whether peer is known dead, probing it (one message, sent once) so that a peer this rank never
  // talked to is found dead too.
  bool probeDead(int peer);

  void setTopology(const Topology& topology);
  // shape_ from the members it mirrors (topology, segment membership): after any of them changes.
  void refreshShape();
  // Whether the shared-memory forms serve collectives that DDL_ALGO does not send elsewhere.
  bool shmServes() const { return ddl::shmServes(shape_); }

  Options options_;
  int rank_, size_;
  std::unique_ptr<ShmNode> shm_;  // null: no shared memory (off, alone on the node, or it could not be mapped)
  bool shm_all_ = false;          // every rank is a member of shm_
  Topology mdring_grid_;  // what mdring runs on (see mdringGrid)
  std::string topology_str_;  // options_.topology.str(), for the tuning table's lookups
  bool has_grid_ = false;     // mdring_grid_ has two or more non-trivial dims
  // The rendezvous: rank 0's server (a shrunk communicator keeps its parent's) and this rank's client (a
  // caller's store too, for ddlCommShrink). Null in communicators over a transport built elsewhere (tests).
  std::shared_ptr<TcpStoreServer> store_server_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<Store> root_store_;  // the first generation's store_, where later generations meet
  int generation_ = 0;         // the store's number of this generation (comm_elastic.cpp); 0: the first
  int attempts_ = 0;           // shrinks of this communicator so far: each agrees under a prefix of its own
  std::vector<int> excluded_;  // made by ddlCommShrink: the parent's ranks left out, ascending
  std::vector<std::unique_ptr<Request>> probes_;  // shrink's probes of silent peers, one per peer at most
  std::unique_ptr<Channel> channel_;
  std::unique_ptr<DevicePath> device_;  // null without a device runtime (no CUDA, or no GPU)
  std::unique_ptr<StreamPath> stream_;  // with device_
  // What planAllReduce decides from; the one home of the IPC and node kernel setups' outcome (ipc,
  // node_kernel).
  AllReduceShape shape_;
  std::unique_ptr<StreamCalls> streams_;  // with device_: the stream-ordered calls' orchestration
  std::unique_ptr<PointToPoint> p2p_;         // goes before channel_, whose transport it uses

  std::mutex op_mu_;  // one collective at a time on the channel
  std::atomic<int> op_waiters_{0};  // callers waiting for op_mu_: the executor's p2p loop gives it up
  std::atomic<int> queued_{0};      // tasks in queue_, read by the executor's p2p loop without q_mu_
  int p2p_idle_ = 0;                // the executor's idle rounds in driveP2P

  mutable std::mutex err_mu_;
  std::atomic<ddlResult_t> broken_{ddlSuccess};
  std::string broken_why_;

  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::deque<std::function<void()>> queue_;
  int in_flight_ = 0;  // queued + running async ops
  bool stop_ = false;
  std::thread executor_;
};

}  // namespace ddl
