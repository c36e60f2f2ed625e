// The node's inventory (inventory.h): GPUs through NVML loaded at run time, or virtual ones; NICs from sysfs.
#include "worker/inventory.h"

#include <dlfcn.h>
#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/resources.h"
#include "worker/topology.h"

namespace ddl::worker {

namespace {

// The few NVML entry points we use, declared here so no NVIDIA header is needed at build time. Signatures and
// constants are NVML's stable C ABI (nvml.h): opaque device handles, int return codes with 0 = success.
using NvmlDevice = void*;
struct NvmlMemory {
  unsigned long long total, free, used;
};
using InitFn = int (*)();
using CountFn = int (*)(unsigned int*);
using HandleFn = int (*)(unsigned int, NvmlDevice*);
using StringFn = int (*)(NvmlDevice, char*, unsigned int);
using MemoryFn = int (*)(NvmlDevice, NvmlMemory*);
struct NvmlPciInfo {  // nvmlPciInfo_t, as nvmlDeviceGetPciInfo_v3 fills it
  char busIdLegacy[16];
  unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};
using PciFn = int (*)(NvmlDevice, NvmlPciInfo*);
using P2pFn = int (*)(NvmlDevice, NvmlDevice, int, int*);  // nvmlDeviceGetP2PStatus
constexpr int kP2pRead = 0, kP2pNvlink = 2;                // nvmlGpuP2PCapsIndex_t; status 0 = OK
constexpr unsigned int kMaxGpus = 64;                      // what the coordinator takes of one node

std::vector<v1::Gpu> nvmlGpus(std::string* why) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    *why = "libnvidia-ml.so.1 not found";
    return {};
  }
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<InitFn>(dlsym(lib, "nvmlShutdown"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<HandleFn>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto name = reinterpret_cast<StringFn>(dlsym(lib, "nvmlDeviceGetName"));
  auto uuid = reinterpret_cast<StringFn>(dlsym(lib, "nvmlDeviceGetUUID"));
  auto memory = reinterpret_cast<MemoryFn>(dlsym(lib, "nvmlDeviceGetMemoryInfo"));
  // Topology: optional (a driver that lacks them still gives its GPUs).
  auto pci = reinterpret_cast<PciFn>(dlsym(lib, "nvmlDeviceGetPciInfo_v3"));
  auto p2p = reinterpret_cast<P2pFn>(dlsym(lib, "nvmlDeviceGetP2PStatus"));
  std::vector<v1::Gpu> gpus;
  std::vector<NvmlDevice> devices;
  if (!init || !shutdown || !count || !handle || !name || !uuid || !memory) {
    *why = "libnvidia-ml.so.1 lacks the expected functions";
  } else if (init() != 0) {
    *why = "nvmlInit failed (is the NVIDIA driver loaded?)";
  } else {
    unsigned int n = 0;
    if (count(&n) != 0) n = 0;
    for (unsigned int i = 0; i < n && i < kMaxGpus; ++i) {
      NvmlDevice dev = nullptr;
      char buf[96] = {0};
      v1::Gpu g;
      g.set_index(static_cast<int>(i));
      if (const int rc = handle(i, &dev); rc != 0) {
        // Kept in its place, so that the GPUs after it keep their indices (and their faults): GpuHealth
        // reports it faulted, and placement leaves it alone.
        g.set_model("unreachable (NVML error " + std::to_string(rc) + ")");
        g.set_uuid("unreachable-" + std::to_string(i));
        gpus.push_back(g);
        devices.push_back(nullptr);
        continue;
      }
      if (name(dev, buf, sizeof(buf)) == 0) g.set_model(buf);
      if (uuid(dev, buf, sizeof(buf)) == 0) g.set_uuid(buf);
      NvmlMemory mem{};
      if (memory(dev, &mem) == 0) g.set_memory_bytes(static_cast<int64_t>(mem.total));
      NvmlPciInfo info{};
      if (pci && pci(dev, &info) == 0) {
        info.busId[sizeof(info.busId) - 1] = 0;
        g.set_pci_bus_id(info.busId);
      }
      gpus.push_back(g);
      devices.push_back(dev);
    }
    for (size_t a = 0; p2p && a < gpus.size(); ++a) {
      for (size_t b = 0; b < gpus.size(); ++b) {
        int status = -1;
        if (a == b || !devices[a] || !devices[b]) continue;
        if (p2p(devices[a], devices[b], kP2pNvlink, &status) == 0 && status == 0)
          gpus[a].add_nvlink_peers(static_cast<int>(b));
        if (p2p(devices[a], devices[b], kP2pRead, &status) == 0 && status == 0)
          gpus[a].add_p2p_peers(static_cast<int>(b));
      }
    }
    shutdown();
    if (gpus.empty()) *why = "NVML found no GPU";
  }
  dlclose(lib);
  return gpus;
}

std::string readLine(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

std::vector<v1::Nic> nics(const std::string& sys) {
  std::vector<v1::Nic> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(sys + "/class/infiniband", ec)) {
    v1::Nic n;
    n.set_name(e.path().filename().string());
    n.set_transport("ib");
    out.push_back(n);
  }
  for (const auto& e : std::filesystem::directory_iterator(sys + "/class/net", ec)) {
    const std::string name = e.path().filename().string();
    if (name == "lo" || readLine(e.path() / "operstate") != "up") continue;
    v1::Nic n;
    n.set_name(name);
    n.set_transport("tcp");
    try {
      long speed = std::stol(readLine(e.path() / "speed"));
      if (speed > 0) n.set_speed_mbps(speed);
    } catch (...) {
      // virtual interfaces report no speed
    }
    out.push_back(n);
  }
  return out;
}

}  // namespace

std::string takeInventory(const std::string& node, const InventoryOptions& options, Inventory* out) {
  Inventory inv;
  inv.sys = options.sys;
  std::string why;
  if (!options.force_virtual) inv.gpus = nvmlGpus(&why);
  inv.nics = nics(inv.sys);
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
