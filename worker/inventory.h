// What a node has to offer, as the agent reports it when it registers: GPUs from NVML (loaded at run time
// with dlopen, so the agent runs and builds on machines without the NVIDIA driver), or a configured number of
// virtual GPUs where NVML finds none, or a virtual topology's; the node's network interfaces from sysfs; and
// where each GPU, NIC and CPU sits in the node (topology.h).
//
// Threads: plain functions; call from one thread at a time (NVML init is not reentrant here).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"

namespace ddl::worker {

struct Inventory {
  std::vector<v1::Gpu> gpus;
  std::vector<v1::Nic> nics;
  bool virtual_gpus = false;  // the GPUs are made up (no NVML or no device)
  std::string gpu_source;     // one line for the log: "NVML: 4 GPUs" / "virtual: 2 (NVML: libnvidia-ml.so.1 not found)"
  std::vector<int> cpus;      // the CPU ids ranks may use, ascending
  std::vector<int> cpu_numa;  // the NUMA node of each of cpus; empty when unknown
  int64_t memory_bytes = 0;   // the memory ranks may use in all
  std::string topology;       // where the GPUs' topology came from: "NVML", a virtual topology's name, or ""
  std::string sys = "/sys";   // the sysfs it was read from
};

struct InventoryOptions {
  int virtual_gpus = 0;        // made up where NVML finds no GPU
  bool force_virtual = false;  // virtual GPUs even where NVML finds real ones
  std::string
      virtual_topology;      // virtual GPUs from a topology (topology.h) instead of virtual_gpus plain ones
  std::string sys = "/sys";  // sysfs (tests give their own tree)
};

// NVML's GPUs with their topology; when there are none (or with force_virtual), the virtual topology's GPUs,
// or `virtual_gpus` made-up ones named virtual-<node>-<i>. "" and *out filled, or why the virtual topology
// cannot be used.
std::string takeInventory(const std::string& node, const InventoryOptions& options, Inventory* out);

// The CPUs and memory the node offers ranks: the agent's own affinity and MemTotal, or less where the
// operator says so (`cpus` a CPU list, `memory` a size; "" for all). "" and *inventory filled, or why the
// setting cannot be used (a CPU the agent may not run on, more memory than the machine has). Then the CPUs'
// NUMA nodes: a virtual topology's split of them (topology.h), else sysfs's.
std::string offerCpusAndMemory(const std::string& cpus, const std::string& memory, Inventory* inventory,
                               const std::string& meminfo = "/proc/meminfo");

}  // namespace ddl::worker
