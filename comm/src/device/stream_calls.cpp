// StreamCalls (stream_calls.h): which scheme runs each stream-ordered collective, the node kernel's setup at
// the first one, its launches, and kernel+wire's allreduce across nodes.
#include "device/stream_calls.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "dtype.h"
#include "env.h"

namespace ddl {

namespace {
// The signature variant of kernel+wire's collective on the wire.
constexpr int kNodeKernelAcrossVariant = 0xE0 | static_cast<int>(Algo::kMdRing);
}  // namespace

StreamCalls::StreamCalls(Owner& owner, DevicePath& device, StreamPath& path, AllReduceShape& shape,
                         const std::unique_ptr<ShmNode>& shm, const Topology& grid, int rank)
    : owner_(owner), device_(device), path_(path), shape_(shape), shm_(shm), grid_(grid), rank_(rank) {}

StreamCalls::Call StreamCalls::describe(CollKind coll, const void* sendbuf, void* recvbuf, size_t count,
                                        ddlDataType_t type, ddlRedOp_t op, int root, int avg_divisor) {
  Call c{coll, node::Args{}};
  node::Args& a = c.args;
  a.send = sendbuf;
  a.recv = recvbuf;
  a.count = count;
  a.type = type;
  a.op = op;
  a.root = root;
  a.elem = typeSize(type);
  a.avg_divisor = op == ddlAvg ? avg_divisor : 0;
  return c;
}

DataSpec StreamCalls::spec(ddlDataType_t type, ddlRedOp_t op) const {
  return dataSpec(type, op, shape_.forced_segment);
}

void StreamCalls::setNodeKernel(Setup s) {
  shape_.node_kernel = s;
  scheme_.store(static_cast<int>(s));
}

std::string StreamCalls::scheme() const {
  switch (static_cast<Setup>(scheme_.load())) {
    case Setup::kReady:
      return shape_.shm_all ? "kernel" : "kernel+wire";
    case Setup::kOff:
      return "host";
    default:
      return "unset";
  }
}

void StreamCalls::setupNodeKernel(void* stream, int dev) {
  DeviceRuntime& rt = device_.runtime();
  if (rt.capturing(stream)) {
    fail(
        ddlInvalidArgument,
        "the first stream-ordered collective of a communicator sets up its GPU memory and cannot be captured "
        "into a CUDA graph: run one before capturing (a warm-up iteration)");
  }
  owner_.drainAsync();
  DevicePath::KeepDevice keep(rt);
  std::string why;
  const bool ready = path_.setupNode(dev, exchange(), &why);
  shape_.node_blocks = path_.blocks();
  setNodeKernel(ready ? Setup::kReady : Setup::kOff);
  if (shape_.node_kernel == Setup::kOff) setup_why_ = why;
  if (shape_.node_kernel == Setup::kReady && !shape_.shm_all && !getEnv("DDL_DEBUG").empty()) {
    std::fprintf(stderr,
                 "ddl: rank %d: stream-ordered allreduce across nodes: the node kernel's reduce-scatter and "
                 "allgather on each node, each rank's block over the network through pinned memory, folded "
                 "on the GPU; the other stream-ordered collectives across nodes are host-paced\n",
                 rank_);
  }
}

void* StreamCalls::registerBuffer(void* ptr, size_t bytes) {
  DeviceRuntime& rt = device_.runtime();
  const int dev = rt.deviceOf(ptr);
  if (dev < 0) fail(ddlInvalidArgument, "ddlCommRegister: the buffer is not device memory");
  // The first registration, like the first stream-ordered call, sets the node kernel up.
  if (planOnStream(shape_, CollKind::kAllReduce, bytes, true).setup) setupNodeKernel(nullptr, dev);
  owner_.drainAsync();
  DevicePath::KeepDevice keep(rt);
  // Another thread may be capturing a CUDA graph in the global mode (torch_ddl registers while the program
  // runs): the IPC calls and copies here are not part of it and must not invalidate it.
  DeviceRuntime::RelaxedCapture relaxed(rt);
  std::string why;
  StreamPath::Registration* r = nullptr;
  // The exchange is the node's: only where the node kernel is ready does a registration use it.
  const NodeExchange ex = path_.ready() ? exchange() : NodeExchange{};
  owner_.deviceCall([&] { r = path_.addRegistration(static_cast<char*>(ptr), bytes, ex, &why); });
  if (!r) fail(ddlInvalidArgument, "ddlCommRegister: " + why);
  return r;
}

void StreamCalls::registerGraphBuffers() {
  owner_.drainAsync();
  if (!path_.ready()) return;
  DevicePath::KeepDevice keep(device_.runtime());
  std::string why;
  int failed = 0;
  owner_.deviceCall([&] { failed = path_.registerGraphBuffers(exchange(), &why); });
  if (failed > 0) {
    fail(ddlInvalidArgument,
         "ddlCommRegisterGraphBuffers: " + std::to_string(failed) +
             " captured buffer(s) could not be shared, and their calls stay staged: " + why);
  }
}

void StreamCalls::deregister(void* handle) {
  owner_.drainAsync();
  DevicePath::KeepDevice keep(device_.runtime());
  DeviceRuntime::RelaxedCapture relaxed(device_.runtime());  // as registerBuffer
  bool found = false;
  const NodeExchange ex = path_.ready() ? exchange() : NodeExchange{};
  owner_.deviceCall(
      [&] { found = path_.removeRegistration(static_cast<StreamPath::Registration*>(handle), ex); });
  if (!found) fail(ddlInvalidArgument, "ddlCommDeregister: not a registration of this communicator");
}

int StreamCalls::streamDeviceOf(void* stream, std::initializer_list<const void*> bufs) {
  DeviceRuntime& rt = device_.runtime();
  // These questions must not invalidate a capture of the caller's (nor, in the global mode, another
  // thread's): CUDA may count them as unsafe outside the relaxed capture mode.
  DeviceRuntime::RelaxedCapture relaxed(rt);
  int dev = rt.streamDevice(stream);
  if (dev < 0) {  // a stream being captured: CUDA does not say its device, which must be the buffers'
    for (const void* b : bufs) {
      if (b && (dev = rt.deviceOf(b)) >= 0) break;
    }
  }
  for (const void* b : bufs) {
    if (!b) continue;
    const int d = rt.deviceOf(b);
    if (d < 0) {
      fail(
          ddlInvalidArgument,
          "a buffer of a stream-ordered collective is host memory: these take device buffers on the stream's "
          "device (the blocking calls, ddlAllReduce and the others, take host memory)");
    }
    if (d != dev) {
      fail(ddlInvalidArgument, "a buffer is on device " + std::to_string(d) + " but the stream on device " +
                                   std::to_string(dev) + ": a stream-ordered collective works on one device");
    }
  }
  return dev;
}

namespace {

node::Kind kindOf(CollKind coll, bool one_shot) {
  switch (coll) {
    case CollKind::kAllReduce:
      return one_shot ? node::Kind::kAllReduceOneShot : node::Kind::kAllReduceTwoShot;
    case CollKind::kReduceScatter:
      return node::Kind::kReduceScatter;
    case CollKind::kAllGather:
      return node::Kind::kAllGather;
    case CollKind::kBroadcast:
      return node::Kind::kBroadcast;
    case CollKind::kReduce:
      return node::Kind::kReduce;
    default:
      DDL_ASSERT(false);
      return node::Kind::kPoison;
  }
}

}  // namespace

void StreamCalls::call(void* stream, const Call& c, std::initializer_list<const void*> bufs,
                       const std::function<void()>& host) {
  const int dev = streamDeviceOf(stream, bufs);
  if (c.args.count == 0) return;
  const size_t bytes = c.args.count * c.args.elem;
  StreamPlan plan = planOnStream(shape_, c.coll, bytes, dev == path_.kernelDevice());
  if (plan.setup) {
    setupNodeKernel(stream, dev);
    plan = planOnStream(shape_, c.coll, bytes, dev == path_.kernelDevice());
  }
  node::Args a = c.args;
  a.kind = kindOf(c.coll, plan.one_shot);
  a.blocks = plan.blocks;
  switch (plan.path) {
    case AllReducePath::kNodeKernel:
      return launchNodeKernel(stream, a);
    case AllReducePath::kNodeKernelAcrossNodes:
      return allReduceAcross(stream, a);
    default:
      return hostPaced(stream, dev, plan.why, host);
  }
}

std::string StreamCalls::hostPacedWhy(HostPacedWhy why) const {
  switch (why) {
    case HostPacedWhy::kSingleRank:
      return "a single rank";
    case HostPacedWhy::kNoSharedNode:
      return "the ranks are on several nodes, or do not share memory (" +
             std::string(intraNodePathName(shape_)) + ")";
    case HostPacedWhy::kAlgoForced:
      return "DDL_ALGO=" + std::string(algoName(shape_.forced_algo)) +
             " sends the node's collectives elsewhere";
    case HostPacedWhy::kSetupFailed:
      return setup_why_;
    case HostPacedWhy::kOtherDevice:
      return "its device is not the one the node kernel was set up on";
    case HostPacedWhy::kAcrossOnlyAllReduce:
      return "across nodes only allreduce runs the node kernel";
    case HostPacedWhy::kNone:
      break;
  }
  return "";
}

void StreamCalls::hostPaced(void* stream, int dev, HostPacedWhy why_code, const std::function<void()>& host) {
  const std::string why = hostPacedWhy(why_code);
  if (why_code == HostPacedWhy::kSingleRank || why_code == HostPacedWhy::kNoSharedNode ||
      why_code == HostPacedWhy::kAlgoForced) {
    // The node kernel never serves this communicator: its scheme is known at the first call.
    if (shape_.node_kernel == Setup::kUntried) setNodeKernel(Setup::kOff);
    if (!told_host_paced_ && !getEnv("DDL_DEBUG").empty()) {
      std::fprintf(stderr, "ddl: rank %d: stream-ordered device collectives are host-paced: %s\n", rank_,
                   why.c_str());
    }
    told_host_paced_ = true;
  }
  if (path_.forced() == DeviceScheme::kKernel) {
    fail(ddlInvalidArgument,
         "DDL_DEVICE_SCHEME=kernel, but the node kernel cannot run this stream-ordered "
         "collective (" +
             why + "); unset it to let such calls be host-paced");
  }
  if (device_.runtime().capturing(stream)) {
    fail(ddlInvalidArgument, "this stream-ordered collective is host-paced (" + why +
                                 ") and cannot be captured into a CUDA graph");
  }
  // Host-paced: the call waits until the work queued on the stream so far is done, runs the host-blocking
  // collective, and returns once the result is in place, so that the stream's later work sees it. (Holding
  // the stream on the GPU while the communicator's thread ran the collective hung on an H200: a stream held
  // on the GPU stalls a hardware queue that the collective's own copies may share.)
  try {
    path_.waitForStream(stream, dev);
  } catch (const Error& e) {
    owner_.breakAndTell(e);  // the peers are in this collective already
    throw;
  }
  host();
}

void StreamCalls::launchNodeKernel(void* stream, const node::Args& args) {
  try {
    bool capturing = false;
    {
      DeviceRuntime::RelaxedCapture relaxed(device_.runtime());
      capturing = device_.runtime().capturing(stream);
    }
    path_.launch(stream, args, capturing);
  } catch (const Error& e) {
    // The peers' kernels of this collective are on their way and this rank's is not: out of step for good.
    // Its flags poisoned, they fail now rather than at the timeout.
    path_.poisonFlags();
    owner_.breakAndTell(e);
    throw;
  }
}

void StreamCalls::allReduceAcross(void* stream, const node::Args& a) {
  DeviceRuntime& rt = device_.runtime();
  if (rt.capturing(stream)) {
    fail(ddlInvalidArgument,
         "a stream-ordered allreduce across nodes cannot be captured into a CUDA graph (the host waits for "
         "the node's reduce-scatter and sends each rank's block over the network): run it outside the "
         "capture; on one node it can be captured");
  }
  // The wire's collective and the device queues come after the non-blocking calls before it.
  owner_.drainAsync();
  // The node's blocks: member m's is [m * per, (m + 1) * per) of the message, cut at its end; whole 16-byte
  // units, so that the kernel's vector loads stay aligned. The ranks that meet across nodes (one member of
  // each node, the same m) hold equal blocks.
  const int members = shm_->size(), m = shm_->me();
  const size_t es = a.elem, u = node::unitElems(es);
  const size_t per = ((a.count + members - 1) / members + u - 1) / u * u;
  const size_t lo = std::min(a.count, static_cast<size_t>(m) * per);
  const size_t n = std::min(per, a.count - lo);
  char* const block = static_cast<char*>(a.recv) + lo * es;
  node::Args rs = a;  // the node's sum (ddlAvg divides once, after the nodes' fold)
  rs.kind = node::Kind::kReduceScatter;
  rs.recv = block;
  rs.count = per;
  rs.total = a.count;
  rs.avg_divisor = 0;
  launchNodeKernel(stream, rs);
  const Group across = groupAlong(grid_, rank_, dimAboveNode(grid_));  // member m of every node
  try {
    try {
      path_.waitForKernels();
    } catch (const Error& e) {
      owner_.breakAndTell(e);
      throw;
    }
    // A failure of the reduce-scatter's kernel breaks the communicator in run(), which tells the peers.
    owner_.deviceCall([&] {
      owner_.run(CollKind::kAllReduce, a.type, a.op, a.count, 0, kNodeKernelAcrossVariant, [&](Session& s) {
        device_.wireAllReduce(s, across, block, n, a.type, a.op, a.op == ddlAvg ? shape_.nranks : 0);
      });
    });
  } catch (const Error&) {
    // This rank's allgather will never come: the node's kernels that wait for it fail now, not at the
    // timeout.
    path_.poisonFlags();
    throw;
  }
  node::Args ag = a;
  ag.kind = node::Kind::kAllGather;
  ag.send = block;
  ag.count = per;
  ag.total = a.count;
  launchNodeKernel(stream, ag);
}

}  // namespace ddl
