// Comm (comm.h): the bootstrap and the node's segment, the checks of every call's arguments, the blocking
// collectives on host and device buffers (each planned by planAllReduce or shmServes, run in a Session by
// run()), the error state, abort and teardown. Its calls that return before they are done, and the executor,
// are in comm_async.cpp; the stream-ordered calls' orchestration is StreamCalls' (device/stream_calls.h).
#include "comm.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <map>

#include "algo/tune.h"
#include "dtype.h"
#include "error.h"
#include "reduce.h"
#include "transport/ucx_transport.h"

namespace ddl {

std::unique_ptr<Comm> Comm::create(int nranks, int rank, const std::string& root, const Options& options) {
  checkRanks(nranks, rank);
  std::string host;
  int port = 0;
  parseRoot(root, &host, &port);
  Deadline deadline(options.timeout_ms);

  std::unique_ptr<TcpStoreServer> server;
  if (rank == 0) server = startTcpStoreServer(host, port, options.secret);
  // Rank 0 too connects to the address the server listens on, the only one it listens on.
  std::unique_ptr<Store> store = connectTcpStore(host, port, deadline, options.secret);
  auto comm = bootstrap(nranks, rank, *store, true, "the communicator at " + root + " (check DDL_RANK)", options,
                        deadline);
  // Rank 0 serves the store until the communicator goes: peers may still be reading from it.
  comm->store_server_ = std::move(server);
  comm->store_ = std::move(store);
  comm->root_store_ = comm->store_;
  return comm;
}

std::unique_ptr<Comm> Comm::createWithStore(int nranks, int rank, const ddlStore_t& store, const Options& options) {
  checkRanks(nranks, rank);
  if (!store.set || !store.get) fail(ddlInvalidArgument, "the store needs its set and get functions");
  Deadline deadline(options.timeout_ms);
  std::shared_ptr<Store> s = makeCallbackStore(store);
  auto comm =
      bootstrap(nranks, rank, *s, store.add != nullptr, "the communicator's store", options, deadline);
  comm->store_ = std::move(s);  // for ddlCommShrink and ddlCommGrow
  comm->root_store_ = comm->store_;
  return comm;
}

void Comm::parseRoot(const std::string& root, std::string* host, int* port) {
  parseHostPort(root, host, port);
  if (*port == 0) fail(ddlInvalidArgument, "rendezvous address '" + root + "' needs a non-zero port");
}

void Comm::checkRanks(int nranks, int rank) {
  if (nranks < 1 || nranks > tag::kMaxRanks) {
    fail(ddlInvalidArgument, "nranks must be in [1, " + std::to_string(tag::kMaxRanks) + "], got " +
                                 std::to_string(nranks));
  }
  if (rank < 0 || rank >= nranks) {
    fail(ddlInvalidArgument, "rank must be in [0, " + std::to_string(nranks - 1) + "], got " + std::to_string(rank));
  }
}

std::unique_ptr<Comm> Comm::bootstrap(int nranks, int rank, Store& store, bool claim, const std::string& where,
                                      const Options& options, const Deadline& deadline) {
  // Every rank must agree on the shape of the communicator, and each rank number must be taken once.
  const std::string shape =
      "nranks=" + std::to_string(nranks) + " topology=" + options.topology.str() +
      " algo=" + algoName(options.algo) + " segment=" + std::to_string(options.segment_bytes) +
      " tune=" + (options.tune ? options.tune->digest() : std::string("built-in")) +
      " shm=" + (options.shm ? std::to_string(options.shm_round_bytes) : std::string("off")) +
      " device=" + deviceSchemeName(options.device_scheme) + "/" + std::to_string(options.node_slot_bytes) +
      " node-blocks=" + (options.node_blocks ? std::to_string(options.node_blocks) : std::string("auto"));
  if (claim && store.add("joined/" + std::to_string(rank), 1) != 1) {
    fail(ddlInvalidArgument, "two processes claim rank " + std::to_string(rank) + " of " + where);
  }
  if (rank == 0) {
    store.set("shape", shape);
  } else {
    std::string root_shape = store.get("shape", deadline);
    if (root_shape != shape) {
      fail(ddlInvalidArgument,
           "rank 0 created the communicator with " + root_shape + " but rank " + std::to_string(rank) +
               " has " + shape +
               " (DDL_WORLD_SIZE, DDL_TOPOLOGY, DDL_ALGO, DDL_SEGMENT_BYTES, DDL_SHM, "
               "DDL_SHM_ROUND_BYTES, DDL_DEVICE_SCHEME, DDL_NODE_SLOT_BYTES and DDL_NODE_BLOCKS must be "
               "the same on every rank, and DDL_TUNE_FILE must hold the same rules)");
    }
  }
  // Only share mode blocks on the wakeup fd for long; the others keep UCX as it was measured and tuned.
  auto transport = createUcxTransport(rank, nranks, store, deadline, options.wait == ddlWaitShare);
  auto comm = std::make_unique<Comm>(std::move(transport), options);
  comm->joinNode(store, deadline);
  return comm;
}

Comm::Comm(std::unique_ptr<Transport> transport, const Options& options)
    : options_(options), rank_(transport->rank()), size_(transport->size()) {
  if (options_.topology.dims.empty()) options_.topology.dims = {size_};
  DDL_ASSERT(options_.topology.size() == size_);
  setTopology(options_.topology);
  channel_ = std::make_unique<Channel>(std::move(transport), options_.timeout_ms, options_.wait);
  if (options_.timeout_from_config) {
    channel_->setTimeoutHint(
        "the program set this timeout: raise ddlConfig_t.timeoutMs, or with torch_ddl init_process_group's or "
        "new_group's timeout");
  }
  p2p_ = std::make_unique<PointToPoint>(*channel_);
  channel_->p2p = p2p_.get();
  telemetry_ = Telemetry::fromEnv(rank_, size_);
  if (auto rt = options_.device_runtime ? options_.device_runtime(rank_) : makeCudaRuntime()) {
    device_ = std::make_unique<DevicePath>(
        std::move(rt), rank_,
        options_.staged_chunk_bytes ? options_.staged_chunk_bytes : kMaxStagedChunkBytes);
    stream_ =
        std::make_unique<StreamPath>(device_->runtime(), rank_, options_.timeout_ms, options_.device_scheme,
                                     options_.node_slot_bytes, options_.node_blocks);
    StreamCalls::Owner& owner = *this;
    streams_ = std::make_unique<StreamCalls>(owner, *device_, *stream_, shape_, shm_, mdring_grid_, rank_);
  }
}

Comm::~Comm() { shutdown(); }

void Comm::setTopology(const Topology& topology) {
  options_.topology = topology;
  mdring_grid_ = mdringGrid(options_.topology);
  topology_str_ = options_.topology.str();
  has_grid_ = mdring_grid_.nontrivialDims() >= 2;
  refreshShape();
}

void Comm::refreshShape() {
  shape_.nranks = size_;
  shape_.shm_all = shm_ && shm_all_;
  shape_.shm_dim0 = shm_ && !shm_all_;
  shape_.forced_algo = options_.algo;
  shape_.forced_segment = options_.segment_bytes;
  shape_.tune = options_.tune.get();
  shape_.topology = topology_str_;
  shape_.has_grid = has_grid_;
  shape_.dims_above_node = 0;
  for (size_t k = 1; k < mdring_grid_.dims.size(); ++k) shape_.dims_above_node += mdring_grid_.dims[k] > 1;
}

namespace {
// A shared-memory round per member slot. 4 buffers of it per member: 2 MiB each with the default.
constexpr size_t kShmRoundBytes = 512 * 1024;
constexpr int kShmBuffers = 4;
}  // namespace

void Comm::joinNode(Store& store, const Deadline& deadline) {
  // Every rank computes the same layout from the same table of node keys.
  const Transport& t = channel_->transport();
  std::vector<std::string> node(size_);
  for (int r = 0; r < size_; ++r) node[r] = t.nodeOf(r);
  std::vector<int> mine;
  for (int r = 0; r < size_; ++r)
    if (!node[rank_].empty() && node[r] == node[rank_]) mine.push_back(r);
  const int n = static_cast<int>(mine.size());
  const bool one_node = n == size_;
  // Node-major: node k holds ranks k*n .. k*n+n-1, and every node n of them (checked on the whole table, so
  // that every rank reaches the same answer).
  bool regular = n > 1 && size_ % n == 0;
  for (int r = 0; regular && r < size_; ++r) {
    const int first = r / n * n;
    regular = !node[r].empty() && node[r] == node[first] && (first == 0 || node[first] != node[first - 1]);
  }
  if (regular) {
    std::map<std::string, int> count;
    for (const auto& k : node) regular = regular && ++count[k] <= n;
  }
  if (!one_node && regular && options_.topology.nontrivialDims() <= 1) setTopology(Topology{{n, size_ / n}});
  const bool dim0_is_node = !one_node && regular && options_.topology.dims[0] == n;
  if (options_.algo == Algo::kShm && !one_node) {
    fail(ddlInvalidArgument, "DDL_ALGO=shm needs every rank on one node, but " + channel_->peerName(rank_) +
                                 " shares its node with " + std::to_string(n) + " of the " + std::to_string(size_) +
                                 " ranks");
  }
  // A forced transport algorithm takes every collective to UCX: on one node all of them (DDL_ALGO=ring, rhd,
  // mdring); across nodes all but mdring, whose dim 0 is what the segment serves there.
  const bool forced_ucx = options_.algo != Algo::kAuto && options_.algo != Algo::kShm &&
                          (one_node || options_.algo != Algo::kMdRing);
  if (!options_.shm || n < 2 || forced_ucx || !(one_node || dim0_is_node)) return;

  std::string why;
  const size_t round = options_.shm_round_bytes ? options_.shm_round_bytes : kShmRoundBytes;
  try {
    shm_ = ShmNode::attach(store, mine, rank_, round, kShmBuffers, deadline, &why);
  } catch (const std::exception& e) {
    // Even then this rank takes part in the agreement below, so the others learn of it at once.
    why = e.what();
  }
  int32_t ok = shm_ != nullptr, all = 0;
  // Over UCX, whatever DDL_ALGO says: the segment is what is being agreed on.
  run(CollKind::kAllReduce, ddlInt32, ddlMin, 1, 0, static_cast<int>(Algo::kRhd), [&](Session& s) {
    rhdAllReduce(s, DataSpec{ddlInt32, ddlMin, sizeof(int32_t), selectSegmentBytes(0)}, &ok, &all, 1);
  });
  if (!all) {
    if (!ok) {
      std::fprintf(stderr, "ddl: %s: no shared memory with the ranks of its node (%s); collectives go through UCX\n",
                   channel_->peerName(rank_).c_str(), why.c_str());
    }
    shm_.reset();
    if (options_.algo == Algo::kShm) {
      fail(ddlInvalidArgument, "DDL_ALGO=shm, but shared memory could not be set up" +
                                   (ok ? std::string(" for another rank (its stderr says why)") : ": " + why));
    }
    return;
  }
  shm_->watchMembers();  // every member has attached (the agreement needed them all)
  // Waits as the channel's do (Channel::idle): ranks that outnumber the cores yield at once, ddlWaitShare polls
  // briefly and blocks, a rank with a core of its own spins first.
  if (channel_->oversubscribed() && options_.wait != ddlWaitSpin) {
    shm_->setWaitPolicy(0, 256);
  } else if (options_.wait == ddlWaitShare) {
    shm_->setWaitPolicy(2048, 0);
  } else {
    shm_->setWaitPolicy(1 << 17, 64);
  }
  shm_all_ = one_node;  // else shm_'s members are mdring's dim-0 ring
  refreshShape();
}

std::string Comm::intraNodePath() const { return intraNodePathName(shape_); }

void Comm::shutdown() {
  if (!channel_) return;
  drainAsync();
  {
    auto lk = lockOp();
    // Every member closes the others' IPC scratch before the barrier, so that none is freed while open.
    if (device_) {
      device_->ipcClosePeers();
      shape_.ipc = Setup::kOff;
      noteGpuError();
      if (broken_.load() != ddlSuccess) {
        stream_->abort();    // a kernel waiting for a failed peer ends now
        stream_->abandon();  // a peer's kernel may still write into this rank's region: never free it
      }
      stream_->closePeers();
    }
    bool met = size_ == 1;
    if (broken_.load() == ddlSuccess && p2p_->broken().first == ddlSuccess && size_ > 1) {
      // Peers may still be reading our last messages: meet them once more before the endpoints go. Point-to-
      // point operations still pending move on meanwhile (the peer's matching call may come before its own
      // destroy); what is left after is failed.
      try {
        Session s(*channel_, CollKind::kBarrier, ddlUint8, ddlSum, 0, 0, 0, std::min(options_.timeout_ms, 10000));
        ddl::barrier(s);
        met = true;
      } catch (const Error&) {
        // Best effort: a peer that left first is no reason to fail the teardown.
      }
    }
    // Without that meeting, a peer's node kernel may still read this rank's region (this rank's last
    // collective done, the peer's not yet): never free it.
    if (!met && stream_) stream_->abandon();
    p2p_->shutdown(ddlAborted, "the communicator was destroyed");
  }
  {
    std::lock_guard<std::mutex> lk(q_mu_);
    stop_ = true;
  }
  q_cv_.notify_all();
  if (executor_.joinable()) executor_.join();
  stream_.reset();
  device_.reset();
  p2p_.reset();
  channel_.reset();
  shm_.reset();
  store_.reset();
  root_store_.reset();
  store_server_.reset();
}

ddlResult_t Comm::asyncError() const {
  if (const ddlResult_t b = broken_.load(); b != ddlSuccess || !stream_) return b;
  return gpuResult(stream_->gpuError());
}

ddlResult_t Comm::gpuResult(uint32_t code) {
  switch (code) {
    case node::kNoError:
      return ddlSuccess;
    case node::kAborted:
      return ddlAborted;
    case node::kTimedOut:
      return ddlTimeout;
    case node::kMismatch:
    case node::kConcurrent:
      return ddlInvalidArgument;
    default:
      return ddlRemoteError;
  }
}

void Comm::noteGpuError() {
  if (!stream_) return;
  const uint32_t code = stream_->gpuError();
  if (code == node::kNoError) return;
  breakWith(gpuResult(code), stream_->describeGpuError());
}

void Comm::failIfBroken() const {
  if (ddlResult_t b = broken_.load(); b != ddlSuccess) {
    std::lock_guard<std::mutex> elk(err_mu_);
    fail(b, brokenMessage(broken_why_));
  }
}

void Comm::breakWith(ddlResult_t code, const std::string& why) {
  std::lock_guard<std::mutex> lk(err_mu_);
  if (broken_.load() != ddlSuccess) return;
  broken_why_ = why;
  broken_.store(code);
}

void Comm::abort() {
  channel_->aborted.store(true);
  breakWith(ddlAborted, "communicator aborted by ddlCommAbort");
  // If no collective is running, tell the peers now; otherwise the running one does when it sees the flag.
  std::unique_lock<std::mutex> lk(op_mu_, std::try_to_lock);
  if (lk.owns_lock()) channel_->notifyPeers("communicator aborted by ddlCommAbort");
  if (shm_) shm_->markFailed("communicator aborted by ddlCommAbort");  // any thread: wakes the node's waits
  // Kernels on the GPU stop waiting, and so do host-paced calls waiting for their streams.
  if (stream_) stream_->abort();
  // Pending point-to-point operations fail on the executor's next poll.
  { std::lock_guard<std::mutex> q(q_mu_); }
  q_cv_.notify_all();
  channel_->transport().wake();
}

std::unique_lock<std::mutex> Comm::lockOp() {
  ++op_waiters_;
  channel_->transport().wake();  // an executor blocked in an idle wait lets go at once
  std::unique_lock<std::mutex> lk(op_mu_);
  --op_waiters_;
  return lk;
}

void Comm::noteBrokenLocked() {
  // Twice per collective: two atomic loads while all is well.
  if (!p2p_->failed() && broken_.load() == ddlSuccess) return;
  if (p2p_->failed()) {
    auto [code, why] = p2p_->broken();
    breakWith(code, why);  // keeps an earlier reason (an abort)
  }
  std::string reason;
  {
    std::lock_guard<std::mutex> elk(err_mu_);
    reason = broken_why_;
  }
  // Once per communicator each: an abort that found the transport busy, or a p2p failure, reaches the peers;
  // what is still pending beside a failed collective fails now rather than at its own deadline.
  channel_->notifyPeers(reason);
  if (shm_) shm_->markFailed(reason);
  p2p_->shutdown(broken_.load(), "the communicator broke: " + reason);
}

void Comm::run(CollKind kind, ddlDataType_t type, ddlRedOp_t op, size_t count, int root, int variant,
               const std::function<void(Session&)>& body) {
  auto lk = lockOp();
  noteGpuError();
  noteBrokenLocked();
  failIfBroken();
  try {
    std::chrono::steady_clock::time_point t0;
    if (telemetry_) t0 = std::chrono::steady_clock::now();
    Session s(*channel_, kind, type, op, count, root, variant);
    body(s);
    if (telemetry_) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // The low bits name the algorithm; the device path's variants set high bits of their own.
      telemetry_->record(kind, count * typeSize(type), variant & 0x0F, seconds, s.dim_seconds);
    }
    noteBrokenLocked();  // one that failed during the collective
  } catch (const Error& e) {
    breakWith(e.code(), e.what());
    noteBrokenLocked();
    throw;
  }
}

void Comm::checkType(const char* what, ddlDataType_t type) const {
  if (!validType(type)) {
    fail(ddlInvalidArgument, std::string(what) + ": unknown data type " + std::to_string(static_cast<int>(type)) +
                                 " (valid: ddlInt8 .. ddlFloat64, 0.." + std::to_string(ddlNumTypes - 1) + ")");
  }
}

void Comm::checkOp(ddlRedOp_t op, ddlDataType_t type) const {
  if (!validOp(op)) {
    fail(ddlInvalidArgument, "unknown reduction op " + std::to_string(static_cast<int>(op)) +
                                 " (valid: ddlSum, ddlProd, ddlMin, ddlMax, ddlAvg, ddlBand, ddlBor, ddlBxor)");
  }
  if (!opTakesType(op, type)) {
    fail(ddlInvalidArgument, std::string("reduction op ") + opName(op) + " takes integer types only, not " +
                                 typeName(type));
  }
}

void Comm::checkBuffers(const void* sendbuf, const void* recvbuf, size_t count) const {
  if (count == 0) return;
  if (!sendbuf) fail(ddlInvalidArgument, "sendbuff is NULL");
  if (!recvbuf) fail(ddlInvalidArgument, "recvbuff is NULL");
}

DataSpec Comm::spec(ddlDataType_t type, ddlRedOp_t op, size_t bytes) const {
  return dataSpec(type, op, options_.segment_bytes);
}

void Comm::allReduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op) {
  checkType("datatype", type);
  checkOp(op, type);
  checkBuffers(sendbuf, recvbuf, count);
  checkedBytes(count, typeSize(type));
  drainAsync();
  allReduceAny(sendbuf, recvbuf, count, type, op);
}

namespace {
// The signature variants of a collective over the node's IPC memory and of its setup: a rank that passes a
// host recvbuff where the others pass device ones (or runs a host collective during their IPC setup) makes
// them all fail with a mismatch instead of waiting for the timeout.
constexpr int kDeviceVariant = 0x80 | static_cast<int>(Algo::kShm);
constexpr int kIpcSetupVariant = 0xC0;
constexpr int kDeviceAcrossVariant = 0xA0 | static_cast<int>(Algo::kMdRing);
}  // namespace

void Comm::deviceCall(const std::function<void()>& body) {
  DevicePath::KeepDevice keep(device_->runtime());
  try {
    body();
  } catch (const Error& e) {
    device_->runtime().drain();
    // A failure between the chunks' collectives (a CUDA call) happens outside run(), yet the peers are
    // already in, or on their way to, the next collective: break and tell them, as run() does.
    if (broken_.load() == ddlSuccess) {
      breakWith(e.code(), e.what());
      auto lk = lockOp();
      noteBrokenLocked();  // tells the peers, fails pending point-to-point operations
    }
    throw;
  }
}

NodeMemory* Comm::deviceNode(std::initializer_list<const void*> bufs) {
  if (shape_.ipc == Setup::kOff) return nullptr;
  int dev = -1;
  for (const void* b : bufs) {
    if (!b) continue;
    const int d = device_->runtime().deviceOf(b);
    if (d < 0 || (dev >= 0 && d != dev)) return nullptr;  // host memory, or two devices: staged
    dev = d;
  }
  if (dev < 0) return nullptr;
  if (shape_.ipc == Setup::kReady) return dev == device_->ipcDevice() ? &device_->ipcMemory() : nullptr;
  // The first device collective on the node: every member offers its scratch, opens the others', and they
  // agree; any member that cannot sends them all to the staged path, for good.
  const size_t round = options_.ipc_round_bytes ? options_.ipc_round_bytes : kIpcRoundBytes;
  std::string why;
  if (!device_->ipcSetup(dev, round, shm_->buffers(), nodeExchange(kIpcSetupVariant), &why)) {
    shape_.ipc = Setup::kOff;
    if (!getEnv("DDL_DEBUG").empty()) {
      std::fprintf(
          stderr,
          "ddl: rank %d: device buffers are staged through host memory: no CUDA IPC on this node: %s\n",
          rank_, why.c_str());
    }
    return nullptr;
  }
  shape_.ipc = Setup::kReady;
  if (!getEnv("DDL_DEBUG").empty()) {
    std::fprintf(
        stderr,
        "ddl: rank %d: device buffers move over %s IPC among the node's %d ranks, reduced on the GPU\n",
        rank_, device_->runtime().name(), shm_->size());
  }
  return &device_->ipcMemory();
}

NodeExchange Comm::nodeExchange(int variant) {
  NodeExchange ex;
  ex.members = shm_->size();
  ex.me = shm_->me();
  ex.allgather = [this, variant](std::vector<char>& all, size_t record_bytes) {
    const DataSpec d = spec(ddlUint8, ddlSum, all.size());
    run(CollKind::kAllGather, ddlUint8, ddlSum, record_bytes, 0, variant,
        [&](Session& s) { shmAllGather(s, *shm_, d, all.data(), all.size()); });
  };
  ex.agree = [this, variant](bool ok) {
    const int32_t mine = ok ? 1 : 0;
    int32_t all = 0;
    const DataSpec d = spec(ddlInt32, ddlMin, sizeof mine);
    // Every rank agrees, not only the node's: across nodes the flag goes round every rank.
    run(CollKind::kAllReduce, ddlInt32, ddlMin, 1, 0, variant, [&](Session& s) {
      if (shm_all_) {
        shmAllReduce(s, *shm_, d, &mine, &all, 1, 0);
      } else {
        ringAllReduce(s, d, &mine, &all, 1);
      }
    });
    return all == 1;
  };
  return ex;
}

void Comm::allReduceAny(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op) {
  if (count == 0 || !onDevice({sendbuf, recvbuf})) return allReduceNow(sendbuf, recvbuf, count, type, op);
  deviceCall([&] {
    const size_t bytes = count * typeSize(type);
    const AllReducePlan plan = planAllReduce(shape_, bytes, Buffers::kDevice);
    // Only recvbuff decides (as for every collective over IPC): a sendbuff elsewhere (host memory, another
    // device) is copied into recvbuff first and the allreduce runs in place. Where recvbuff is not on the
    // node's IPC device (or the setup fails), the call is staged.
    NodeMemory* mem = plan.path == AllReducePath::kIpc || plan.path == AllReducePath::kIpcAcrossNodes
                          ? deviceNode({recvbuf})
                          : nullptr;
    if (mem && plan.path == AllReducePath::kIpc) {
      const DataSpec d = spec(type, op, bytes);
      run(CollKind::kAllReduce, type, op, count, 0, kDeviceVariant, [&](Session& s) {
        const void* src = ipcInput(*mem, sendbuf, recvbuf, bytes);
        shmAllReduce(s, *shm_, d, src, recvbuf, count, op == ddlAvg ? size_ : 0, mem);
        mem->fence();
      });
      return;
    }
    if (mem) return allReduceAcrossNodes(sendbuf, recvbuf, count, type, op, *mem);
    device_->stagedAllReduce(sendbuf, recvbuf, count, type, [&](const void* src, void* dst, size_t n) {
      allReduceNow(src, dst, n, type, op);
    });
  });
}

const void* Comm::ipcInput(NodeMemory& mem, const void* sendbuf, void* recvbuf, size_t bytes) {
  if (sendbuf == recvbuf || device_->runtime().deviceOf(sendbuf) == device_->ipcDevice()) return sendbuf;
  mem.copy(recvbuf, sendbuf, bytes);  // queued before the collective's own work: the fence covers it
  return recvbuf;
}

void Comm::allReduceAcrossNodes(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                                ddlRedOp_t op, NodeMemory& mem) {
  const size_t es = typeSize(type), bytes = count * es;
  const DataSpec d = spec(type, op, bytes);
  const int members = shm_->size(), me = shm_->me();
  const size_t lo = blockBegin(count, members, me), n = blockCount(count, members, me);
  char* out = static_cast<char*>(recvbuf);
  run(CollKind::kAllReduce, type, op, count, 0, kDeviceAcrossVariant, [&](Session& s) {
    const void* src = ipcInput(mem, sendbuf, recvbuf, bytes);
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    // The node's reduce-scatter on the GPUs: this rank's block of the node's sum lands in its place in
    // recvbuff.
    shmReduceScatter(s, *shm_, d, src, out + lo * es, count, 0, &mem);
    mem.fence();
    const auto t1 = Clock::now();
    // Across nodes, the block alone through pinned memory (the wire needs host memory). The ranks that meet
    // across nodes (one dim-0 coordinate) hold equal blocks, so they cut them alike. With one dim above the
    // node (GPUs x nodes), the GPU folds what arrives (wireAllReduce). With more, mdring's levels keep the
    // slower links' bytes down and the CPU reduces, in the staged pipeline's chunks, so that copies down and
    // up overlap the wire; all the chunks are phases of this one collective: at most as many as the session's
    // phases allow.
    const int levels = shape_.dims_above_node;
    if (levels == 1) {
      const int k = dimAboveNode(mdring_grid_);
      const auto t = Clock::now();
      device_->wireAllReduce(s, groupAlong(mdring_grid_, rank_, k), out + lo * es, n, type, op,
                             op == ddlAvg ? size_ : 0);
      s.dim_seconds.assign(mdring_grid_.dims.size(), 0.0);
      s.dim_seconds[k] = std::chrono::duration<double>(Clock::now() - t).count();
    } else if (n == 0) {
      mdringAboveDim0(s, d, mdring_grid_, out + lo * es, lo, 0);
    } else {
      const size_t max_chunks = std::max<size_t>(1, (tag::kMaxPhases - 1) / (2 * std::max(levels, 1)));
      size_t done = 0;
      device_->stagedAllReduce(
          out + lo * es, out + lo * es, n, type,
          [&](const void*, void* chunk, size_t cn) {
            mdringAboveDim0(s, d, mdring_grid_, chunk, lo + done, cn);
            done += cn;
          },
          max_chunks);
    }
    // And back to every GPU of the node.
    const auto t2 = Clock::now();
    shmAllGather(s, *shm_, d, recvbuf, count, &mem);
    mem.fence();
    if (!s.dim_seconds.empty()) {  // the node's dim, for telemetry (mdringAboveDim0 timed the others)
      s.dim_seconds[0] += std::chrono::duration<double>(t1 - t0 + (Clock::now() - t2)).count();
    }
  });
}

void Comm::refuseDevice(const void* sendbuf, const void* recvbuf) const {
  if (onDevice({sendbuf, recvbuf})) {
    fail(ddlInvalidArgument,
         "a buffer is CUDA device memory: point-to-point operations take host buffers only in this version "
         "(copy "
         "the data to host memory first, or use a collective)");
  }
}

void Comm::allReduceNow(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op) {
  if (count == 0) return;
  const size_t bytes = count * typeSize(type);
  const AllReduceChoice choice = planAllReduce(shape_, bytes, Buffers::kHost).algo;
  const DataSpec d{type, op, typeSize(type), choice.segment_bytes};
  const Algo algo = choice.algo;
  run(CollKind::kAllReduce, type, op, count, 0, static_cast<int>(algo), [&](Session& s) {
    switch (algo) {
      case Algo::kRhd: rhdAllReduce(s, d, sendbuf, recvbuf, count); break;
      case Algo::kMdRing:
        mdringAllReduce(s, d, mdring_grid_, sendbuf, recvbuf, count, shm_all_ ? nullptr : shm_.get());
        break;
      case Algo::kShm: shmAllReduce(s, *shm_, d, sendbuf, recvbuf, count, op == ddlAvg ? size_ : 0); break;
      default: ringAllReduce(s, d, sendbuf, recvbuf, count); break;
    }
  });
}

void Comm::broadcast(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, int root) {
  checkType("datatype", type);
  checkRoot(root);
  if (count && !recvbuf) fail(ddlInvalidArgument, "recvbuff is NULL");
  if (count && rank_ == root && !sendbuf) fail(ddlInvalidArgument, "sendbuff is NULL on the root");
  const size_t bytes = checkedBytes(count, typeSize(type));
  drainAsync();
  if (count == 0) return;
  const DataSpec d = spec(type, ddlSum, bytes);
  const void* in = rank_ == root ? sendbuf : nullptr;
  auto over_shm = [&](const void* sb, void* rb, NodeMemory* mem, int variant) {
    run(CollKind::kBroadcast, type, ddlSum, count, root, variant, [&](Session& s) {
      if (rank_ == root && sb != rb) mem ? mem->copy(rb, sb, bytes) : void(std::memcpy(rb, sb, bytes));
      shmBroadcast(s, *shm_, d, sb, rb, count, root, mem);  // on one node, member index = rank
      if (mem) mem->fence();
    });
  };
  auto host = [&](const void* sb, void* rb) {
    if (shmServes()) return over_shm(sb, rb, nullptr, static_cast<int>(Algo::kShm));
    run(CollKind::kBroadcast, type, ddlSum, count, root, 0,
        [&](Session& s) { ddl::broadcast(s, d, sb, rb, count, root); });
  };
  if (!onDevice({in, recvbuf})) return host(in, recvbuf);
  deviceCall([&] {
    // Only recvbuff decides (the others cannot see the root's sendbuff); a host sendbuff is copied from.
    if (NodeMemory* mem = shmServes() ? deviceNode({recvbuf}) : nullptr)
      return over_shm(in, recvbuf, mem, kDeviceVariant);
    device_->stage({{in, bytes}}, {{recvbuf, bytes}}, [&](auto& i, auto& o) { host(i[0], o[0]); });
  });
}

void Comm::allGather(const void* sendbuf, void* recvbuf, size_t sendcount, ddlDataType_t type) {
  checkType("datatype", type);
  checkBuffers(sendbuf, recvbuf, sendcount);
  const size_t bytes = checkedBytes(sendcount, typeSize(type), size_);
  drainAsync();
  if (sendcount == 0) return;
  const DataSpec d = spec(type, ddlSum, bytes);
  auto over_shm = [&](const void* sb, void* rb, NodeMemory* mem, int variant) {
    run(CollKind::kAllGather, type, ddlSum, sendcount, 0, variant, [&](Session& s) {
      char* out = static_cast<char*>(rb);
      char* mine = out + static_cast<size_t>(rank_) * sendcount * d.elem;
      if (sb != mine)
        mem ? mem->copy(mine, sb, sendcount * d.elem) : void(std::memmove(mine, sb, sendcount * d.elem));
      shmAllGather(s, *shm_, d, out, sendcount * size_, mem);
      if (mem) mem->fence();
    });
  };
  auto host = [&](const void* sb, void* rb) {
    if (shmServes()) return over_shm(sb, rb, nullptr, static_cast<int>(Algo::kShm));
    run(CollKind::kAllGather, type, ddlSum, sendcount, 0, 0,
        [&](Session& s) { ringAllGather(s, d, sb, rb, sendcount); });
  };
  if (!onDevice({sendbuf, recvbuf})) return host(sendbuf, recvbuf);
  deviceCall([&] {
    // Only recvbuff decides: nothing is reduced, so a host sendbuff is simply copied from.
    if (NodeMemory* mem = shmServes() ? deviceNode({recvbuf}) : nullptr)
      return over_shm(sendbuf, recvbuf, mem, kDeviceVariant);
    device_->stage({{sendbuf, sendcount * d.elem}}, {{recvbuf, bytes}},
                   [&](auto& i, auto& o) { host(i[0], o[0]); });
  });
}

void Comm::reduceScatter(const void* sendbuf, void* recvbuf, size_t recvcount, ddlDataType_t type,
                         ddlRedOp_t op) {
  checkType("datatype", type);
  checkOp(op, type);
  checkBuffers(sendbuf, recvbuf, recvcount);
  const size_t bytes = checkedBytes(recvcount, typeSize(type), size_);
  drainAsync();
  if (recvcount == 0) return;
  const DataSpec d = spec(type, op, bytes);
  auto over_shm = [&](const void* sb, void* rb, NodeMemory* mem, int variant) {
    // Member r's block of recvcount * size elements is exactly rank r's share.
    run(CollKind::kReduceScatter, type, op, recvcount, 0, variant, [&](Session& s) {
      shmReduceScatter(s, *shm_, d, sb, rb, recvcount * size_, op == ddlAvg ? size_ : 0, mem);
      if (mem) mem->fence();
    });
  };
  auto host = [&](const void* sb, void* rb) {
    if (shmServes()) return over_shm(sb, rb, nullptr, static_cast<int>(Algo::kShm));
    run(CollKind::kReduceScatter, type, op, recvcount, 0, 0,
        [&](Session& s) { ringReduceScatter(s, d, sb, rb, recvcount); });
  };
  if (!onDevice({sendbuf, recvbuf})) return host(sendbuf, recvbuf);
  deviceCall([&] {
    if (NodeMemory* mem = shmServes() ? deviceNode({recvbuf}) : nullptr) {
      // The GPU reduces straight from sendbuff: one elsewhere (host memory, another device) is copied next to
      // the scratch first.
      if (device_->runtime().deviceOf(sendbuf) == device_->ipcDevice()) {
        return over_shm(sendbuf, recvbuf, mem, kDeviceVariant);
      }
      DevicePath::Temp in(device_->runtime(), bytes);
      mem->copy(in.get(), sendbuf, bytes);
      return over_shm(in.get(), recvbuf, mem, kDeviceVariant);
    }
    device_->stage({{sendbuf, bytes}}, {{recvbuf, recvcount * d.elem}},
                   [&](auto& i, auto& o) { host(i[0], o[0]); });
  });
}

void Comm::barrier() {
  drainAsync();
  run(CollKind::kBarrier, ddlUint8, ddlSum, 0, 0, 0, [&](Session& s) { ddl::barrier(s); });
}

void Comm::checkRoot(int root) const {
  if (root < 0 || root >= size_) {
    fail(ddlInvalidArgument, "root " + std::to_string(root) + " is not a rank of this communicator of " +
                                 std::to_string(size_));
  }
}

void Comm::reduce(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op,
                  int root) {
  checkType("datatype", type);
  checkOp(op, type);
  checkRoot(root);
  if (count && !sendbuf) fail(ddlInvalidArgument, "sendbuff is NULL");
  if (count && rank_ == root && !recvbuf) fail(ddlInvalidArgument, "recvbuff is NULL on the root");
  const size_t bytes = checkedBytes(count, typeSize(type));
  drainAsync();
  if (count == 0) return;
  const DataSpec d = spec(type, op, bytes);
  auto host = [&](const void* sb, void* rb) {
    run(CollKind::kReduce, type, op, count, root, 0,
        [&](Session& s) { reduceTo(s, d, sb, rb, count, root); });
  };
  void* out = rank_ == root ? recvbuf : nullptr;
  if (!onDevice({sendbuf, out})) return host(sendbuf, out);
  deviceCall([&] {
    device_->stage({{sendbuf, bytes}}, {{out, bytes}}, [&](auto& i, auto& o) { host(i[0], o[0]); });
  });
}

void Comm::gather(const void* sendbuf, void* recvbuf, size_t sendcount, ddlDataType_t type, int root) {
  checkType("datatype", type);
  checkRoot(root);
  if (sendcount && !sendbuf) fail(ddlInvalidArgument, "sendbuff is NULL");
  if (sendcount && rank_ == root && !recvbuf) fail(ddlInvalidArgument, "recvbuff is NULL on the root");
  const size_t bytes = checkedBytes(sendcount, typeSize(type), size_);
  drainAsync();
  if (sendcount == 0) return;
  const DataSpec d = spec(type, ddlSum, bytes);
  auto host = [&](const void* sb, void* rb) {
    run(CollKind::kGather, type, ddlSum, sendcount, root, 0,
        [&](Session& s) { ddl::gather(s, d, sb, rb, sendcount, root); });
  };
  void* out = rank_ == root ? recvbuf : nullptr;
  if (!onDevice({sendbuf, out})) return host(sendbuf, out);
  deviceCall([&] {
    device_->stage({{sendbuf, sendcount * d.elem}}, {{out, bytes}},
                   [&](auto& i, auto& o) { host(i[0], o[0]); });
  });
}

void Comm::scatter(const void* sendbuf, void* recvbuf, size_t recvcount, ddlDataType_t type, int root) {
  checkType("datatype", type);
  checkRoot(root);
  if (recvcount && !recvbuf) fail(ddlInvalidArgument, "recvbuff is NULL");
  if (recvcount && rank_ == root && !sendbuf) fail(ddlInvalidArgument, "sendbuff is NULL on the root");
  const size_t bytes = checkedBytes(recvcount, typeSize(type), size_);
  drainAsync();
  if (recvcount == 0) return;
  const DataSpec d = spec(type, ddlSum, bytes);
  auto host = [&](const void* sb, void* rb) {
    run(CollKind::kScatter, type, ddlSum, recvcount, root, 0,
        [&](Session& s) { ddl::scatter(s, d, sb, rb, recvcount, root); });
  };
  const void* in = rank_ == root ? sendbuf : nullptr;
  if (!onDevice({in, recvbuf})) return host(in, recvbuf);
  deviceCall([&] {
    device_->stage({{in, bytes}}, {{recvbuf, recvcount * d.elem}},
                   [&](auto& i, auto& o) { host(i[0], o[0]); });
  });
}

void Comm::allToAll(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type) {
  checkType("datatype", type);
  checkBuffers(sendbuf, recvbuf, count);
  const size_t bytes = checkedBytes(count, typeSize(type), size_);
  drainAsync();
  if (count == 0) return;
  std::vector<size_t> counts(size_, count), displs(size_);
  for (int r = 0; r < size_; ++r) displs[r] = static_cast<size_t>(r) * count;
  const DataSpec d = spec(type, ddlSum, bytes);
  auto host = [&](const void* sb, void* rb) {
    run(CollKind::kAllToAll, type, ddlSum, count, 0, 0, [&](Session& s) {
      ddl::allToAllv(s, d, sb, counts.data(), displs.data(), rb, counts.data(), displs.data());
    });
  };
  if (!onDevice({sendbuf, recvbuf})) return host(sendbuf, recvbuf);
  deviceCall([&] {
    device_->stage({{sendbuf, bytes}}, {{recvbuf, bytes}}, [&](auto& i, auto& o) { host(i[0], o[0]); });
  });
}

void Comm::allToAllv(const void* sendbuf, const size_t* sendcounts, const size_t* sdispls, void* recvbuf,
                     const size_t* recvcounts, const size_t* rdispls, ddlDataType_t type) {
  checkType("datatype", type);
  if (!sendcounts || !sdispls || !recvcounts || !rdispls) {
    fail(ddlInvalidArgument, "sendcounts, sdispls, recvcounts and rdispls must each hold one entry per rank");
  }
  const size_t es = typeSize(type);
  size_t send_total = 0, recv_total = 0;
  for (int r = 0; r < size_; ++r) {
    checkedBytes(sdispls[r], es);
    checkedBytes(rdispls[r], es);
    checkedBytes(sendcounts[r], es);
    checkedBytes(recvcounts[r], es);
    send_total += sendcounts[r];
    recv_total += recvcounts[r];
  }
  if (sendcounts[rank_] != recvcounts[rank_]) {
    fail(ddlInvalidArgument, "sendcounts[" + std::to_string(rank_) + "] = " + std::to_string(sendcounts[rank_]) +
                                 " but recvcounts[" + std::to_string(rank_) + "] = " +
                                 std::to_string(recvcounts[rank_]) + ": this rank's block to itself must agree");
  }
  if (send_total && !sendbuf) fail(ddlInvalidArgument, "sendbuff is NULL");
  if (recv_total && !recvbuf) fail(ddlInvalidArgument, "recvbuff is NULL");
  drainAsync();
  const DataSpec d = spec(type, ddlSum, (send_total + recv_total) * es);
  auto host = [&](const void* sb, void* rb) {
    // The counts differ from rank to rank: the signature holds the type alone, each message's length is
    // checked.
    run(CollKind::kAllToAllv, type, ddlSum, 0, 0, 0,
        [&](Session& s) { ddl::allToAllv(s, d, sb, sendcounts, sdispls, rb, recvcounts, rdispls); });
  };
  if (!(send_total || recv_total) || !onDevice({sendbuf, recvbuf})) return host(sendbuf, recvbuf);
  // What the counts and displacements reach of each buffer.
  size_t send_end = 0, recv_end = 0;
  for (int r = 0; r < size_; ++r) {
    if (sdispls[r] > SIZE_MAX - sendcounts[r] || rdispls[r] > SIZE_MAX - recvcounts[r]) {
      fail(ddlInvalidArgument, "a displacement plus its count overflows (rank " + std::to_string(r) + ")");
    }
    if (sendcounts[r]) send_end = std::max(send_end, sdispls[r] + sendcounts[r]);
    if (recvcounts[r]) recv_end = std::max(recv_end, rdispls[r] + recvcounts[r]);
  }
  deviceCall([&] {
    device_->stage({{sendbuf, checkedBytes(send_end, es)}}, {{recvbuf, checkedBytes(recv_end, es), true}},
                   [&](auto& i, auto& o) { host(i[0], o[0]); });
  });
}

// ---- Stream-ordered collectives (their orchestration: device/stream_calls.h) ----

std::string Comm::streamScheme() const { return streams_ ? streams_->scheme() : "unset"; }

void Comm::onStream(void* stream, const StreamCalls::Call& c, std::initializer_list<const void*> bufs,
                    std::function<void()> host) {
  if (!device_) {
    fail(ddlInvalidArgument,
         "stream-ordered collectives take CUDA device buffers, and this libddl has no GPU runtime (built "
         "without the CUDA Toolkit, or no GPU found): use the blocking calls (ddlAllReduce, ...) for host "
         "memory");
  }
  noteGpuError();
  failIfBroken();
  streams_->call(stream, c, bufs, host);
}

void* Comm::registerBuffer(void* buf, size_t bytes) {
  if (!device_) {
    fail(ddlInvalidArgument, "ddlCommRegister takes CUDA device buffers, and this libddl has no GPU runtime");
  }
  if (!buf || bytes == 0) fail(ddlInvalidArgument, "ddlCommRegister: a null buffer or a size of 0");
  noteGpuError();
  failIfBroken();
  return streams_->registerBuffer(buf, bytes);
}

void Comm::registerGraphBuffers() {
  if (!device_) return;  // nothing was captured
  noteGpuError();
  failIfBroken();
  streams_->registerGraphBuffers();
}

bool Comm::streamCapturing(void* stream) {
  if (!device_) return false;
  DeviceRuntime::RelaxedCapture relaxed(device_->runtime());
  return device_->runtime().capturing(stream);
}

void Comm::deregisterBuffer(void* handle) {
  if (!device_ || !handle)
    fail(ddlInvalidArgument, "ddlCommDeregister: not a registration of this communicator");
  noteGpuError();
  failIfBroken();
  streams_->deregister(handle);
}

void Comm::breakAndTell(const Error& e) {
  if (e.code() == ddlAborted) return;  // an abort has told the peers already
  breakWith(e.code(), e.what());
  auto lk = lockOp();
  noteBrokenLocked();
}

void Comm::allReduceOnStream(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type,
                             ddlRedOp_t op, void* stream) {
  checkType("datatype", type);
  checkOp(op, type);
  checkBuffers(sendbuf, recvbuf, count);
  checkedBytes(count, typeSize(type));
  onStream(stream, StreamCalls::describe(CollKind::kAllReduce, sendbuf, recvbuf, count, type, op, 0, size_),
           {sendbuf, recvbuf}, [=, this] { allReduce(sendbuf, recvbuf, count, type, op); });
}

void Comm::reduceScatterOnStream(const void* sendbuf, void* recvbuf, size_t recvcount, ddlDataType_t type,
                                 ddlRedOp_t op, void* stream) {
  checkType("datatype", type);
  checkOp(op, type);
  checkBuffers(sendbuf, recvbuf, recvcount);
  checkedBytes(recvcount, typeSize(type), size_);
  onStream(stream,
           StreamCalls::describe(CollKind::kReduceScatter, sendbuf, recvbuf, recvcount, type, op, 0, size_),
           {sendbuf, recvbuf}, [=, this] { reduceScatter(sendbuf, recvbuf, recvcount, type, op); });
}

void Comm::allGatherOnStream(const void* sendbuf, void* recvbuf, size_t sendcount, ddlDataType_t type,
                             void* stream) {
  checkType("datatype", type);
  checkBuffers(sendbuf, recvbuf, sendcount);
  checkedBytes(sendcount, typeSize(type), size_);
  onStream(stream,
           StreamCalls::describe(CollKind::kAllGather, sendbuf, recvbuf, sendcount, type, ddlSum, 0, 0),
           {sendbuf, recvbuf}, [=, this] { allGather(sendbuf, recvbuf, sendcount, type); });
}

void Comm::broadcastOnStream(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, int root,
                             void* stream) {
  checkType("datatype", type);
  checkRoot(root);
  if (count && !recvbuf) fail(ddlInvalidArgument, "recvbuff is NULL");
  if (count && rank_ == root && !sendbuf) fail(ddlInvalidArgument, "sendbuff is NULL on the root");
  checkedBytes(count, typeSize(type));
  const void* in = rank_ == root ? sendbuf : nullptr;
  onStream(stream, StreamCalls::describe(CollKind::kBroadcast, in, recvbuf, count, type, ddlSum, root, 0),
           {in, recvbuf}, [=, this] { broadcast(in, recvbuf, count, type, root); });
}

void Comm::reduceOnStream(const void* sendbuf, void* recvbuf, size_t count, ddlDataType_t type, ddlRedOp_t op,
                          int root, void* stream) {
  checkType("datatype", type);
  checkOp(op, type);
  checkRoot(root);
  if (count && !sendbuf) fail(ddlInvalidArgument, "sendbuff is NULL");
  if (count && rank_ == root && !recvbuf) fail(ddlInvalidArgument, "recvbuff is NULL on the root");
  checkedBytes(count, typeSize(type));
  void* out = rank_ == root ? recvbuf : nullptr;
  onStream(stream, StreamCalls::describe(CollKind::kReduce, sendbuf, out, count, type, op, root, size_),
           {sendbuf, out}, [=, this] { reduce(sendbuf, out, count, type, op, root); });
}

}  // namespace ddl
