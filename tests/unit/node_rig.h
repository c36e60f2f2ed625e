// NodeRig: ranks as threads on the emulated GPU (fake_device.h) with what each test varies about the node
// (MPS, processes, the GPU's room, forced schemes and sizes, nodes, refused IPC), and runRanks over it.
// Shared by stream_path_test and hot_buffers_test.
#pragma once

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algo/plan.h"
#include "comm.h"
#include "fake_device.h"
#include "rendezvous/store.h"
#include "thread_ranks.h"

namespace ddl::test_util {

struct NodeRig {
  std::shared_ptr<FakeCounters> counters = std::make_shared<FakeCounters>();
  std::vector<FakeRuntime*> runtimes;  // each rank's, set by runRanks
  bool processes = false;              // each rank claims a process of its own
  bool mps = false;
  int capacity = 1 << 20;
  DeviceScheme scheme = DeviceScheme::kAuto;
  size_t slot_bytes = 0;
  int node_blocks = 0;  // DDL_NODE_BLOCKS
  int timeout_ms = 30000;
  int per_node = 0;                     // > 0: nodes of per_node consecutive ranks, with shared memory each
  std::string topology;                 // "": the ranks per node x the nodes
  size_t staged_chunk_bytes = 0;        // 0: the default
  std::vector<int> refuse_ipc;          // ranks whose exportMemory fails
  std::vector<int> refuse_foreign_ipc;  // ranks whose exportMemory fails for memory not of allocDevice
};

// one_node: the ranks join one node's shared memory (per_node > 0: nodes of that many).
inline std::vector<RankResult> runRanks(int nranks, NodeRig& setup, bool one_node,
                                        const std::function<void(Comm&)>& body) {
  Options o;
  o.topology = parseTopology(setup.topology, nranks);
  o.staged_chunk_bytes = setup.staged_chunk_bytes;
  o.timeout_ms = setup.timeout_ms;
  o.device_scheme = setup.scheme;
  o.node_slot_bytes = setup.slot_bytes;
  o.node_blocks = setup.node_blocks;
  setup.runtimes.assign(nranks, nullptr);
  o.device_runtime = [&setup](int rank) {
    Faults f;
    f.mps = setup.mps;
    f.pid = setup.processes ? 100000 + rank : 0;
    f.capacity = setup.capacity;
    f.refuse_ipc =
        std::find(setup.refuse_ipc.begin(), setup.refuse_ipc.end(), rank) != setup.refuse_ipc.end();
    f.refuse_foreign_ipc = std::find(setup.refuse_foreign_ipc.begin(), setup.refuse_foreign_ipc.end(),
                                     rank) != setup.refuse_foreign_ipc.end();
    auto rt = std::make_unique<FakeRuntime>(setup.counters, f);
    setup.runtimes[rank] = rt.get();
    return rt;
  };
  if (setup.per_node > 0)
    return runRanks(nranks, o, body, nodesOf(nranks, setup.per_node), makeMemoryStore());
  return runRanks(nranks, o, body, nullptr, one_node ? makeMemoryStore() : nullptr);
}

}  // namespace ddl::test_util
