// A communicator's settings (Options) and where they come from: resolveOptions reads ddlConfig_t, then the
// DDL_* environment, then built-in defaults. On the top floor of comm/src: it loads the tuning table
// (algo/tune.h) and checks the secret against the rendezvous store's bound (rendezvous/store.h).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "algo/plan.h"
#include "ddl/ddl.h"
#include "topology.h"

namespace ddl {

class DeviceRuntime;
class TuneTable;

constexpr int kDefaultTimeoutMs = 300000;

struct Options {
  int timeout_ms = kDefaultTimeoutMs;
  bool timeout_from_config = false;  // ddlConfig_t.timeoutMs set it (DDL_TIMEOUT_MS would not change it)
  ddlWaitMode_t wait = ddlWaitAuto;  // see ddlWaitMode_t
  Topology topology;
  Algo algo = Algo::kAuto;
  size_t segment_bytes = 0;  // 0: automatic
  std::shared_ptr<const TuneTable> tune;  // DDL_TUNE_FILE; null: the built-in table
  std::string secret;  // ddlConfig_t.secret or DDL_JOB_SECRET: the rendezvous store's key; empty: none
  bool shm = true;     // DDL_SHM: ranks that share a node use shared memory among themselves (shm_node.h)
  size_t shm_round_bytes = 0;  // DDL_SHM_ROUND_BYTES: a shared-memory round's size per member slot; 0: default
  // Makes the runtime of device buffers (device_path.h). Null: CUDA's, in builds with it. Tests give an
  // emulation.
  std::function<std::unique_ptr<DeviceRuntime>(int rank)> device_runtime;
  size_t ipc_round_bytes = 0;     // a round of the device path's IPC scratch (tests); 0: kIpcRoundBytes
  size_t staged_chunk_bytes = 0;  // the device path's largest staged chunk (tests); 0: kMaxStagedChunkBytes
  DeviceScheme device_scheme = DeviceScheme::kAuto;  // DDL_DEVICE_SCHEME
  size_t node_slot_bytes = 0;  // DDL_NODE_SLOT_BYTES: a slot of the node kernel's region; 0: kNodeSlotBytes
  int node_blocks = 0;  // DDL_NODE_BLOCKS: the node kernel's CTAs (stream_path.h nodeKernelBlocks); 0: chosen
};

// Throws ddlInvalidArgument naming the bad field or variable and its value. nranks 0: the topology is not
// read (a process joining a grown communicator, whose topology is the communicator's own).
Options resolveOptions(const ddlConfig_t* config, int nranks);

}  // namespace ddl
