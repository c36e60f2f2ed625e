// Resolves a communicator's settings from ddlConfig_t, then the DDL_* environment, then built-in defaults.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "ddl/ddl.h"
#include "topology.h"

namespace ddl {

// kShm: every rank on one node, over the node's shared memory (algo/shm.cpp).
enum class Algo { kAuto, kRing, kMdRing, kRhd, kShm };

class DeviceRuntime;
const char* algoName(Algo a);

constexpr int kDefaultTimeoutMs = 300000;

class TuneTable;

// How stream-ordered device collectives of one node meet (device/stream_path.h): kAuto chooses the node
// kernel where every rank has a GPU of its own or MPS shares one, else the host-paced path; the others force
// one.
enum class DeviceScheme { kAuto, kKernel, kHost };
const char* deviceSchemeName(DeviceScheme s);

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
};

// Throws ddlInvalidArgument naming the bad field or variable and its value.
Options resolveOptions(const ddlConfig_t* config, int nranks);
Algo parseAlgo(const std::string& name);  // throws ddlInvalidArgument listing the valid names

// Environment helpers: the value, or empty when unset.
std::string getEnv(const char* name);
// Parses a decimal integer in [lo, hi]; throws ddlInvalidArgument naming what and the text.
long long parseInt(const std::string& text, const char* what, long long lo, long long hi);
// A byte count, optionally with a K, M or G suffix (powers of 1024), in [lo, hi]; throws ddlInvalidArgument
// naming what.
long long parseByteCount(const std::string& text, const char* what, long long lo, long long hi);

}  // namespace ddl
