// What a node has to offer, as the agent reports it when it registers: GPUs from NVML (loaded at run time with
// dlopen, so the agent runs and builds on machines without the NVIDIA driver), or a configured number of
// virtual GPUs where NVML finds none; and the node's network interfaces from sysfs.
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
  int64_t memory_bytes = 0;   // the memory ranks may use in all
};

// NVML's GPUs; when there are none, `virtual_gpus` made-up ones named virtual-<node>-<i>. With force_virtual
// the virtual ones are used even where NVML finds GPUs (tests and demos on a GPU machine).
Inventory takeInventory(const std::string& node, int virtual_gpus, bool force_virtual);

// The CPUs and memory the node offers ranks: the agent's own affinity and MemTotal, or less where the
// operator says so (`cpus` a CPU list, `memory` a size; "" for all). "" and *inventory filled, or why the
// setting cannot be used (a CPU the agent may not run on, more memory than the machine has).
std::string offerCpusAndMemory(const std::string& cpus, const std::string& memory, Inventory* inventory,
                               const std::string& meminfo = "/proc/meminfo");

}  // namespace ddl::worker
