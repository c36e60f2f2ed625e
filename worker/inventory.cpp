// The node's inventory (inventory.h): GPUs through NVML loaded at run time, or virtual ones; NICs from sysfs.
#include "worker/inventory.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/resources.h"
#include "worker/nvml.h"
#include "worker/topology.h"

namespace ddl::worker {

namespace {

constexpr unsigned int kMaxGpus = 64;  // what the coordinator takes of one node

// NVML's GPUs with their PCI addresses and NVLink and P2P peers; none, with why, where NVML has none.
std::vector<v1::Gpu> nvmlGpus(std::string* why) {
  std::unique_ptr<nvml::Library> nv = nvml::Library::open("libnvidia-ml.so.1", why);
  if (!nv) return {};
  if (!nv->name || !nv->uuid || !nv->memory) {
    *why = "libnvidia-ml.so.1 lacks the expected functions";
    return {};
  }
  std::vector<v1::Gpu> gpus;
  std::vector<nvml::Device> devices;
  unsigned int n = 0;
  if (nv->count(&n) != 0) n = 0;
  for (unsigned int i = 0; i < n && i < kMaxGpus; ++i) {
    nvml::Device dev = nullptr;
    char buf[96] = {0};
    v1::Gpu g;
    g.set_index(static_cast<int>(i));
    if (const int rc = nv->handle(i, &dev); rc != 0) {
      // Kept in its place, so that the GPUs after it keep their indices (and their faults): GpuHealth
      // reports it faulted, and placement leaves it alone.
      g.set_model("unreachable (NVML error " + std::to_string(rc) + ")");
      g.set_uuid("unreachable-" + std::to_string(i));
      gpus.push_back(g);
      devices.push_back(nullptr);
      continue;
    }
    if (nv->name(dev, buf, sizeof(buf)) == 0) g.set_model(buf);
    if (nv->uuid(dev, buf, sizeof(buf)) == 0) g.set_uuid(buf);
    nvml::Memory mem{};
    if (nv->memory(dev, &mem) == 0) g.set_memory_bytes(static_cast<int64_t>(mem.total));
    nvml::PciInfo info{};
    if (nv->pci && nv->pci(dev, &info) == 0) {  // topology: optional, as the P2P status below
      info.busId[sizeof(info.busId) - 1] = 0;
      g.set_pci_bus_id(info.busId);
    }
    gpus.push_back(g);
    devices.push_back(dev);
  }
  for (size_t a = 0; nv->p2p && a < gpus.size(); ++a) {
    for (size_t b = 0; b < gpus.size(); ++b) {
      int status = -1;
      if (a == b || !devices[a] || !devices[b]) continue;
      if (nv->p2p(devices[a], devices[b], nvml::kP2pNvlink, &status) == 0 && status == 0)
        gpus[a].add_nvlink_peers(static_cast<int>(b));
      if (nv->p2p(devices[a], devices[b], nvml::kP2pRead, &status) == 0 && status == 0)
        gpus[a].add_p2p_peers(static_cast<int>(b));
    }
  }
  if (gpus.empty()) *why = "NVML found no GPU";
  return gpus;
}

}  // namespace

std::string takeInventory(const std::string& node, const InventoryOptions& options, Inventory* out) {
  Inventory inv;
  inv.sys = options.sys;
  std::string why;
  if (!options.force_virtual) inv.gpus = nvmlGpus(&why);
  inv.nics = readNics(inv.sys);
  if (!inv.gpus.empty()) {
    inv.gpu_source = "NVML: " + std::to_string(inv.gpus.size()) + " GPUs";
    inv.topology = "NVML";
    setIslands(&inv.gpus);
    readPciPlacement(inv.sys, &inv.gpus, &inv.nics);
  } else if (!options.virtual_topology.empty()) {
    inv.virtual_gpus = true;
    if (std::string bad = loadVirtualTopology(options.virtual_topology, node, &inv.gpus, &inv.nics);
        !bad.empty())
      return bad;
    inv.topology = options.virtual_topology;
    inv.gpu_source = "virtual: " + std::to_string(inv.gpus.size()) + " in topology " +
                     options.virtual_topology + (options.force_virtual ? " (forced)" : " (" + why + ")");
  } else {
    inv.virtual_gpus = true;
    for (int i = 0; i < options.virtual_gpus; ++i) {
      v1::Gpu g;
      g.set_index(i);
      g.set_uuid("virtual-" + node + "-" + std::to_string(i));
      g.set_model("virtual");
      inv.gpus.push_back(g);
    }
    inv.gpu_source = "virtual: " + std::to_string(options.virtual_gpus) +
                     (options.force_virtual ? " (forced)" : " (" + why + ")");
  }
  *out = std::move(inv);
  return "";
}

std::string offerCpusAndMemory(const std::string& cpus, const std::string& memory, Inventory* inventory,
                               const std::string& meminfo) {
  // The affinity, in a set grown until the kernel's CPU ids fit (more than CPU_SETSIZE, 1024, on big hosts).
  std::vector<int> allowed;
  for (int ids = CPU_SETSIZE; ids <= (kMaxCpuId + 1) && allowed.empty(); ids *= 2) {
    cpu_set_t* set = CPU_ALLOC(ids);
    if (set == nullptr) break;
    const size_t bytes = CPU_ALLOC_SIZE(ids);
    CPU_ZERO_S(bytes, set);
    const bool got = sched_getaffinity(0, bytes, set) == 0;
    if (got) {
      for (int c = 0; c < ids; ++c)
        if (CPU_ISSET_S(c, bytes, set)) allowed.push_back(c);
    }
    CPU_FREE(set);
    if (!got && errno != EINVAL) break;
  }
  if (cpus.empty()) {
    inventory->cpus = allowed;
  } else {
    std::vector<int> chosen;
    if (std::string why = parseCpuList(cpus, &chosen); !why.empty()) return "cpus '" + cpus + "': " + why;
    for (int c : chosen) {
      if (!std::binary_search(allowed.begin(), allowed.end(), c))
        return "cpus '" + cpus + "': CPU " + std::to_string(c) + " is not one the agent may run on (" +
               formatCpuList(allowed) + ")";
    }
    inventory->cpus = std::move(chosen);
  }
  int64_t total = 0;
  std::ifstream in(meminfo);
  std::string key;
  int64_t kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") total = kib * 1024;
    in.ignore(1 << 10, '\n');
  }
  if (memory.empty()) {
    inventory->memory_bytes = total;
  } else {
    int64_t bytes = 0;
    if (std::string why = parseByteSize(memory, &bytes); !why.empty())
      return "memory '" + memory + "': " + why;
    if (total > 0 && bytes > total)
      return "memory '" + memory + "' is more than the machine has (" + formatBytes(total) + ")";
    inventory->memory_bytes = bytes;
  }
  inventory->cpu_numa = inventory->virtual_gpus && !inventory->topology.empty()
                            ? splitCpusAmongNuma(inventory->cpus, &inventory->gpus)
                            : cpuNumaFromSysfs(inventory->sys, inventory->cpus);
  return "";
}

}  // namespace ddl::worker
