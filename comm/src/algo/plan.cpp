// planAllReduce (plan.h): the allreduce's path, from the communicator's shape, the size and the buffers.
#include "algo/plan.h"

namespace ddl {

const char* pathName(AllReducePath p) {
  switch (p) {
    case AllReducePath::kHost:
      return "host";
    case AllReducePath::kIpc:
      return "ipc";
    case AllReducePath::kIpcAcrossNodes:
      return "ipc+staged";
    case AllReducePath::kStaged:
      return "staged";
    case AllReducePath::kNodeKernel:
      return "node-kernel";
    case AllReducePath::kNodeKernelAcrossNodes:
      return "node-kernel+wire";
    case AllReducePath::kHostPaced:
      return "host-paced";
  }
  return "invalid";
}

const char* deviceSchemeName(DeviceScheme s) {
  switch (s) {
    case DeviceScheme::kAuto:
      return "auto";
    case DeviceScheme::kKernel:
      return "kernel";
    case DeviceScheme::kHost:
      return "host";
  }
  return "invalid";
}

const char* intraNodePathName(const AllReduceShape& s) {
  return s.shm_all ? "shm" : s.shm_dim0 ? "shm+ucx" : "ucx";
}

bool shmServes(const AllReduceShape& s) {
  return s.shm_all && (s.forced_algo == Algo::kAuto || s.forced_algo == Algo::kShm);
}

namespace {
// Where the node kernel would serve, whatever its setup's outcome.
bool oneNodeFits(const AllReduceShape& s) { return shmServes(s) && s.nranks > 1; }
bool acrossFits(const AllReduceShape& s) {
  return s.shm_dim0 && s.dims_above_node == 1 && s.nranks > 1 &&
         (s.forced_algo == Algo::kAuto || s.forced_algo == Algo::kMdRing);
}
}  // namespace

bool nodeKernelServes(const AllReduceShape& s) { return oneNodeFits(s) && s.node_kernel != Setup::kOff; }

bool nodeKernelAcrossServes(const AllReduceShape& s) { return acrossFits(s) && s.node_kernel != Setup::kOff; }

size_t nodeOneShotBytes(int nranks) {
  if (nranks <= 2) return size_t{512} << 10;
  if (nranks <= 4) return size_t{256} << 10;
  return size_t{128} << 10;
}

namespace {

AllReduceChoice hostAlgo(const AllReduceShape& s, size_t bytes) {
  if (shmServes(s)) return AllReduceChoice{Algo::kShm, 0};
  // DDL_ALGO=shm where there is nothing to share (a single rank; a communicator built without a store).
  if (s.forced_algo == Algo::kShm) return AllReduceChoice{Algo::kRing, selectSegmentBytes(s.forced_segment)};
  return chooseAllReduce(s.forced_algo, s.forced_segment, s.tune, s.topology, s.has_grid, s.nranks, bytes);
}

AllReducePlan devicePlan(const AllReduceShape& s, size_t bytes) {
  AllReducePlan p;
  p.algo = hostAlgo(s, bytes);
  if (s.ipc != Setup::kOff && shmServes(s)) {
    p.path = AllReducePath::kIpc;
  } else if (s.ipc != Setup::kOff && s.shm_dim0 &&
             (s.forced_algo == Algo::kAuto || s.forced_algo == Algo::kMdRing)) {
    p.path = AllReducePath::kIpcAcrossNodes;
  } else {
    p.path = AllReducePath::kStaged;
    return p;
  }
  p.setup = s.ipc == Setup::kUntried;
  return p;
}

}  // namespace

AllReducePlan planAllReduce(const AllReduceShape& s, size_t bytes, Buffers buffers) {
  switch (buffers) {
    case Buffers::kHost: {
      AllReducePlan p;
      p.algo = hostAlgo(s, bytes);
      return p;
    }
    case Buffers::kDevice:
      return devicePlan(s, bytes);
    case Buffers::kDeviceOnStream:
      break;
  }
  const StreamPlan on_stream = planOnStream(s, CollKind::kAllReduce, bytes, true);
  if (on_stream.path != AllReducePath::kHostPaced) {
    AllReducePlan p;
    p.path = on_stream.path;
    p.one_shot = on_stream.one_shot;
    p.setup = on_stream.setup;
    return p;
  }
  AllReducePlan p = devicePlan(s, bytes);
  p.host_paced = p.path;
  p.path = AllReducePath::kHostPaced;
  p.setup = false;  // the host-blocking call sets its own path up when it runs
  return p;
}

StreamPlan planOnStream(const AllReduceShape& s, CollKind coll, size_t bytes, bool on_kernel_device) {
  StreamPlan p;
  // Where the node kernel would serve once set up (nodeKernelServes and nodeKernelAcrossServes ask the
  // setup's outcome too).
  const bool one_node = oneNodeFits(s), across = acrossFits(s);
  const bool allreduce = coll == CollKind::kAllReduce;
  if (!one_node && !across) {
    // With the node's segment shared as the kernel needs, only DDL_ALGO can have sent the calls elsewhere.
    const bool shape_fits = s.shm_all || (s.shm_dim0 && s.dims_above_node == 1);
    p.why = s.nranks == 1 ? HostPacedWhy::kSingleRank
            : shape_fits  ? HostPacedWhy::kAlgoForced
                          : HostPacedWhy::kNoSharedNode;
    return p;
  }
  if (one_node || allreduce)
    p.path = one_node ? AllReducePath::kNodeKernel : AllReducePath::kNodeKernelAcrossNodes;
  if (!one_node && !allreduce) p.why = HostPacedWhy::kAcrossOnlyAllReduce;
  p.one_shot = one_node && allreduce && bytes <= nodeOneShotBytes(s.nranks);
  p.blocks = s.node_blocks;
  if (s.node_kernel == Setup::kUntried) {
    p.setup = true;  // every stream-ordered collective sets the kernel up, so that the scheme is known after
    return p;
  }
  if (s.node_kernel == Setup::kOff) {
    p.path = AllReducePath::kHostPaced;
    p.why = HostPacedWhy::kSetupFailed;
  } else if (p.path != AllReducePath::kHostPaced && !on_kernel_device) {
    p.path = AllReducePath::kHostPaced;
    p.why = HostPacedWhy::kOtherDevice;
  }
  if (p.path == AllReducePath::kHostPaced) p.one_shot = false;
  return p;
}

}  // namespace ddl
