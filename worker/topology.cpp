// The node's insides (topology.h): virtual topologies, NVLink islands, and what sysfs says of PCI devices.
#include "worker/topology.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <tuple>

#include "common/resources.h"

namespace ddl::worker {

namespace fs = std::filesystem;

namespace {

constexpr int kMaxVirtualGpus = 64;
constexpr int kMaxVirtualNics = 64;
constexpr size_t kMaxTopologyFileBytes = 1 << 20;

// A built-in topology, written as a topology file would be.
const char* builtinText(const std::string& name) {
  if (name == "s822lc") {
    return R"({"gpus": [
      {"model": "Tesla P100-SXM2-16GB", "memory": "16G", "numa": 0, "nvlink": [1], "nic": "mlx5_0",
       "pci": "0002:01:00.0"},
      {"model": "Tesla P100-SXM2-16GB", "memory": "16G", "numa": 0, "nvlink": [0], "nic": "mlx5_0",
       "pci": "0003:01:00.0"},
      {"model": "Tesla P100-SXM2-16GB", "memory": "16G", "numa": 1, "nvlink": [3], "nic": "mlx5_1",
       "pci": "000a:01:00.0"},
      {"model": "Tesla P100-SXM2-16GB", "memory": "16G", "numa": 1, "nvlink": [2], "nic": "mlx5_1",
       "pci": "000b:01:00.0"}],
     "nics": [{"name": "mlx5_0", "transport": "ib", "numa": 0, "speed_mbps": 100000},
              {"name": "mlx5_1", "transport": "ib", "numa": 1, "speed_mbps": 100000}]})";
  }
  if (name == "dgx-h100") {
    return R"({"gpus": [
      {"numa": 0, "nvlink": [1,2,3,4,5,6,7], "nic": "mlx5_0", "pci": "0000:1b:00.0"},
      {"numa": 0, "nvlink": [0,2,3,4,5,6,7], "nic": "mlx5_1", "pci": "0000:43:00.0"},
      {"numa": 0, "nvlink": [0,1,3,4,5,6,7], "nic": "mlx5_2", "pci": "0000:52:00.0"},
      {"numa": 0, "nvlink": [0,1,2,4,5,6,7], "nic": "mlx5_3", "pci": "0000:61:00.0"},
      {"numa": 1, "nvlink": [0,1,2,3,5,6,7], "nic": "mlx5_4", "pci": "0000:9d:00.0"},
      {"numa": 1, "nvlink": [0,1,2,3,4,6,7], "nic": "mlx5_5", "pci": "0000:c3:00.0"},
      {"numa": 1, "nvlink": [0,1,2,3,4,5,7], "nic": "mlx5_6", "pci": "0000:d1:00.0"},
      {"numa": 1, "nvlink": [0,1,2,3,4,5,6], "nic": "mlx5_7", "pci": "0000:df:00.0"}],
     "model": "NVIDIA H100 80GB HBM3", "memory": "80G",
     "nics": [{"name": "mlx5_0", "numa": 0}, {"name": "mlx5_1", "numa": 0}, {"name": "mlx5_2", "numa": 0},
              {"name": "mlx5_3", "numa": 0}, {"name": "mlx5_4", "numa": 1}, {"name": "mlx5_5", "numa": 1},
              {"name": "mlx5_6", "numa": 1}, {"name": "mlx5_7", "numa": 1}],
     "transport": "ib", "speed_mbps": 400000})";
  }
  return nullptr;
}

using nlohmann::json;

// The topology in `doc` (a file's or a built-in's), or why it is wrong.
std::string parseTopology(const json& doc, const std::string& node, std::vector<v1::Gpu>* gpus,
                          std::vector<v1::Nic>* nics) {
  if (!doc.is_object()) return "it is not a JSON object";
  for (const auto& [key, value] : doc.items()) {
    if (key != "gpus" && key != "nics" && key != "model" && key != "memory" && key != "transport" &&
        key != "speed_mbps")
      return "unknown key '" + key + "' (the keys are gpus, nics, model, memory, transport, speed_mbps)";
  }
  auto gpuList = doc.find("gpus");
  if (gpuList == doc.end() || !gpuList->is_array() || gpuList->empty())
    return "'gpus' must be a list of at least one GPU";
  if (gpuList->size() > kMaxVirtualGpus) return "more than " + std::to_string(kMaxVirtualGpus) + " GPUs";
  const std::string defaultModel = doc.value("model", std::string("virtual"));
  const std::string defaultMemory = doc.value("memory", std::string());
  std::set<std::string> nicNames;
  if (auto list = doc.find("nics"); list != doc.end()) {
    if (!list->is_array() || list->size() > kMaxVirtualNics)
      return "'nics' must be a list of at most " + std::to_string(kMaxVirtualNics) + " NICs";
    for (const json& n : *list) {
      if (!n.is_object() || !n.contains("name") || !n["name"].is_string() ||
          n["name"].get<std::string>().empty())
        return "each NIC needs a \"name\"";
      v1::Nic nic;
      nic.set_name(n["name"].get<std::string>());
      nic.set_transport(n.value("transport", doc.value("transport", std::string("ib"))));
      nic.set_speed_mbps(n.value("speed_mbps", doc.value("speed_mbps", int64_t{0})));
      if (n.contains("numa")) {
        const int numa = n["numa"].get<int>();
        if (numa < 0 || numa > 1023)
          return "NIC " + nic.name() + ": numa " + std::to_string(numa) + " is not 0..1023";
        nic.set_numa_node(numa);
      }
      if (!nicNames.insert(nic.name()).second) return "NIC " + nic.name() + " is listed twice";
      nics->push_back(nic);
    }
  }
  const int count = static_cast<int>(gpuList->size());
  for (int i = 0; i < count; ++i) {
    const json& g = (*gpuList)[i];
    const std::string who = "GPU " + std::to_string(i);
    if (!g.is_object()) return who + " is not an object";
    for (const auto& [key, value] : g.items()) {
      if (key != "model" && key != "memory" && key != "numa" && key != "nvlink" && key != "nic" &&
          key != "pci")
        return who + ": unknown key '" + key + "' (the keys are model, memory, numa, nvlink, nic, pci)";
    }
    v1::Gpu gpu;
    gpu.set_index(i);
    gpu.set_uuid("virtual-" + node + "-" + std::to_string(i));
    gpu.set_model(g.value("model", defaultModel));
    if (const std::string memory = g.value("memory", defaultMemory); !memory.empty()) {
      int64_t bytes = 0;
      if (std::string why = parseByteSize(memory, &bytes); !why.empty()) return who + ": memory: " + why;
      gpu.set_memory_bytes(bytes);
    }
    if (g.contains("numa")) {
      const int numa = g["numa"].get<int>();
      if (numa < 0 || numa > 1023) return who + ": numa " + std::to_string(numa) + " is not 0..1023";
      gpu.set_numa_node(numa);
    }
    for (int peer : g.value("nvlink", std::vector<int>())) {
      if (peer < 0 || peer >= count || peer == i)
        return who + ": NVLink peer " + std::to_string(peer) + " is not another of the " +
               std::to_string(count) + " GPUs";
      gpu.add_nvlink_peers(peer);
      gpu.add_p2p_peers(peer);
    }
    gpu.set_nic(g.value("nic", std::string()));
    if (!gpu.nic().empty() && !nicNames.count(gpu.nic()))
      return who + ": its NIC " + gpu.nic() + " is not in 'nics'";
    gpu.set_pci_bus_id(g.value("pci", std::string()));
    gpus->push_back(gpu);
  }
  for (const v1::Gpu& g : *gpus) {
    for (int peer : g.nvlink_peers()) {
      const auto& back = (*gpus)[peer].nvlink_peers();
      if (std::find(back.begin(), back.end(), g.index()) == back.end())
        return "GPU " + std::to_string(g.index()) + " names GPU " + std::to_string(peer) +
               " as an NVLink peer, but GPU " + std::to_string(peer) + " does not name it";
    }
  }
  setIslands(gpus);
  return "";
}

std::string readLine(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

// The PCI device directory a sysfs link leads to, as path components ("devices", "pci0000:00", ...); empty
// when there is none.
std::vector<std::string> pciPath(const fs::path& link) {
  std::error_code ec;
  const fs::path real = fs::canonical(link, ec);
  if (ec) return {};
  std::vector<std::string> parts;
  for (const auto& part : real) parts.push_back(part.string());
  return parts;
}

// PCI bridges between two devices: the components of their paths past what they share.
size_t pciDistance(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  size_t common = 0;
  while (common < a.size() && common < b.size() && a[common] == b[common]) ++common;
  return (a.size() - common) + (b.size() - common);
}

// "00000000:3B:00.0" (NVML) -> "0000:3b:00.0" (sysfs: the domain in at least four digits, as a VMD
// domain "10000:..." needs five), or "" for what is no PCI address.
std::string sysfsBusId(const std::string& id) {
  unsigned int domain = 0, bus = 0, device = 0, function = 0;
  char end = 0;
  if (std::sscanf(id.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &end) != 4) return "";
  char out[32];
  std::snprintf(out, sizeof(out), "%04x:%02x:%02x.%x", domain, bus, device, function);
  return out;
}

int readNuma(const fs::path& device) {
  try {
    return std::stoi(readLine(device / "numa_node"));
  } catch (...) {
    return -1;
  }
}

// Whether port `port` of InfiniBand device `name` is ACTIVE ("4: ACTIVE" in its state file).
bool ibPortActive(const std::string& sys, const std::string& name, int port) {
  return readLine(fs::path(sys) / "class" / "infiniband" / name / "ports" / std::to_string(port) / "state")
             .find("ACTIVE") != std::string::npos;
}

}  // namespace

const char* builtinTopologies() { return "s822lc, dgx-h100"; }

std::vector<v1::Nic> readNics(const std::string& sys) {
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

std::string loadVirtualTopology(const std::string& nameOrFile, const std::string& node,
                                std::vector<v1::Gpu>* gpus, std::vector<v1::Nic>* nics) {
  gpus->clear();
  nics->clear();
  std::string text;
  if (const char* builtin = builtinText(nameOrFile)) {
    text = builtin;
  } else {
    std::ifstream in(nameOrFile, std::ios::binary);
    if (!in)
      return "virtual topology '" + nameOrFile + "' is neither a built-in one (" + builtinTopologies() +
             ") nor a file that can be read";
    std::ostringstream buf;
    buf << in.rdbuf();
    text = buf.str();
    if (text.size() > kMaxTopologyFileBytes) return "virtual topology file " + nameOrFile + " is over 1 MiB";
  }
  std::string why;
  try {
    why = parseTopology(json::parse(text), node, gpus, nics);
  } catch (const json::exception& e) {
    why = e.what();
  }
  if (!why.empty()) {
    gpus->clear();
    nics->clear();
    return "virtual topology " + nameOrFile + ": " + why;
  }
  return "";
}

void setIslands(std::vector<v1::Gpu>* gpus) {
  const int n = static_cast<int>(gpus->size());
  std::vector<int> island(n);
  for (int i = 0; i < n; ++i) island[i] = i;
  // Lowest-index labels spread along the links until nothing changes: at most n rounds.
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < n; ++i) {
      for (int peer : (*gpus)[i].nvlink_peers()) {
        if (peer < 0 || peer >= n) continue;
        const int low = std::min(island[i], island[peer]);
        if (island[i] != low || island[peer] != low) {
          island[i] = island[peer] = low;
          changed = true;
        }
      }
    }
  }
  for (int i = 0; i < n; ++i) (*gpus)[i].set_island(island[i]);
}

void readPciPlacement(const std::string& sys, std::vector<v1::Gpu>* gpus, std::vector<v1::Nic>* nics) {
  struct Candidate {
    std::vector<std::string> path;
    int numa;
    bool ib;
    bool active;         // an InfiniBand port that is ACTIVE (an Ethernet interface that is up)
    std::string device;  // as UCX names it
  };
  std::vector<Candidate> candidates;
  for (v1::Nic& nic : *nics) {
    const bool ib = nic.transport() != "tcp";
    const fs::path cls = fs::path(sys) / "class" / (ib ? "infiniband" : "net") / nic.name();
    std::vector<std::string> path = pciPath(cls / "device");
    if (path.empty()) continue;  // a virtual interface: no PCI device
    const int numa = readNuma(cls / "device");
    if (numa >= 0) nic.set_numa_node(numa);
    nic.set_pci_bus_id(sysfsBusId(path.back()));  // "" for a device that is not PCI (virtio0)
    std::string device = nic.name();
    bool active = !ib;  // nics() lists only the Ethernet interfaces that are up
    if (ib) {
      // Its first ACTIVE port, in number order (else its first port).
      std::set<int> ports;
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(cls / "ports", ec)) {
        try {
          ports.insert(std::stoi(e.path().filename().string()));
        } catch (...) {
          // not a port
        }
      }
      int port = ports.empty() ? 1 : *ports.begin();
      for (int p : ports) {
        if (ibPortActive(sys, nic.name(), p)) {
          port = p;
          active = true;
          break;
        }
      }
      device += ":" + std::to_string(port);
    }
    candidates.push_back({std::move(path), numa, ib, active, std::move(device)});
  }
  for (v1::Gpu& gpu : *gpus) {
    if (gpu.pci_bus_id().empty()) continue;
    gpu.set_pci_bus_id(sysfsBusId(gpu.pci_bus_id()));
    if (gpu.pci_bus_id().empty()) continue;  // NVML gave no address that sysfs would know
    const fs::path dev = fs::path(sys) / "bus" / "pci" / "devices" / gpu.pci_bus_id();
    const int numa = readNuma(dev);
    if (numa >= 0) gpu.set_numa_node(numa);
    if (std::string cpus = readLine(dev / "local_cpulist"); !cpus.empty()) gpu.set_cpus(cpus);
    const std::vector<std::string> path = pciPath(dev);
    const Candidate* best = nullptr;
    auto rank = [&](const Candidate& c) {
      return std::make_tuple(!c.active, !c.ib, path.empty() ? 0 : pciDistance(path, c.path), c.numa != numa,
                             c.device);
    };
    for (const Candidate& c : candidates)
      if (!best || rank(c) < rank(*best)) best = &c;
    if (best) gpu.set_nic(best->device);
  }
}

std::vector<int> cpuNumaFromSysfs(const std::string& sys, const std::vector<int>& cpus) {
  std::map<int, int> numaOf;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(sys) / "devices" / "system" / "node", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || name.size() > 9 ||
        !std::all_of(name.begin() + 4, name.end(),
                     [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      continue;
    std::vector<int> list;
    if (!parseCpuList(readLine(e.path() / "cpulist"), &list).empty()) continue;
    for (int c : list) numaOf[c] = std::stoi(name.substr(4));
  }
  if (numaOf.empty()) return {};
  std::vector<int> out;
  for (int c : cpus) {
    auto it = numaOf.find(c);
    out.push_back(it == numaOf.end() ? -1 : it->second);
  }
  return out;
}

std::vector<int> splitCpusAmongNuma(const std::vector<int>& cpus, std::vector<v1::Gpu>* gpus) {
  std::set<int> numas;
  for (const v1::Gpu& g : *gpus)
    if (g.has_numa_node()) numas.insert(g.numa_node());
  if (numas.empty()) return {};
  const size_t per = cpus.size() / numas.size();
  std::vector<int> out(cpus.size());
  std::map<int, std::vector<int>> run;
  size_t at = 0, k = 0;
  for (int numa : numas) {
    const size_t end = ++k == numas.size() ? cpus.size() : at + per;
    for (; at < end; ++at) {
      out[at] = numa;
      run[numa].push_back(cpus[at]);
    }
  }
  for (v1::Gpu& g : *gpus)
    if (g.has_numa_node()) g.set_cpus(formatCpuList(run[g.numa_node()]));
  return out;
}

std::vector<int> memoryNodesOf(const std::vector<int>& cpus, const std::vector<int>& offered,
                               const std::vector<int>& cpu_numa, const std::string& sys) {
  std::set<int> nodes;
  for (int c : cpus) {
    auto it = std::lower_bound(offered.begin(), offered.end(), c);
    if (it == offered.end() || *it != c) return {};
    const size_t i = static_cast<size_t>(it - offered.begin());
    if (i >= cpu_numa.size() || cpu_numa[i] < 0) return {};
    std::error_code ec;
    if (!fs::exists(fs::path(sys) / "devices" / "system" / "node" / ("node" + std::to_string(cpu_numa[i])),
                    ec))
      return {};
    nodes.insert(cpu_numa[i]);
  }
  return {nodes.begin(), nodes.end()};
}

bool ucxDeviceReady(const std::string& sys, const std::string& device) {
  const size_t colon = device.find(':');
  if (colon == std::string::npos || colon == 0) return false;  // not an RDMA device
  const std::string name = device.substr(0, colon);
  if (name.find('/') != std::string::npos || name == "." || name == "..") return false;
  try {
    return ibPortActive(sys, name, std::stoi(device.substr(colon + 1)));
  } catch (...) {
    return false;
  }
}

std::string describeTopology(const std::vector<v1::Gpu>& gpus, const std::vector<v1::Nic>& nics) {
  std::string out;
  auto list = [](const auto& ids) {
    std::string s;
    for (int i : ids) s += (s.empty() ? "" : ",") + std::to_string(i);
    return s.empty() ? std::string("-") : s;
  };
  for (const v1::Gpu& g : gpus) {
    out += "gpu " + std::to_string(g.index()) + ": " + g.model() +
           (g.memory_bytes() ? " " + formatBytes(g.memory_bytes()) : "") + ", uuid " + g.uuid() + ", pci " +
           (g.pci_bus_id().empty() ? "-" : g.pci_bus_id()) + ", numa " +
           (g.has_numa_node() ? std::to_string(g.numa_node()) : "-") + " (cpus " +
           (g.cpus().empty() ? "-" : g.cpus()) + "), nvlink " + list(g.nvlink_peers()) + ", island " +
           (g.has_island() ? std::to_string(g.island()) : "-") + ", p2p " + list(g.p2p_peers()) + ", nic " +
           (g.nic().empty() ? "-" : g.nic()) + "\n";
  }
  for (const v1::Nic& n : nics) {
    out += "nic " + n.name() + ": " + n.transport() +
           (n.speed_mbps() ? ", " + std::to_string(n.speed_mbps()) + " Mb/s" : "") + ", pci " +
           (n.pci_bus_id().empty() ? "-" : n.pci_bus_id()) + ", numa " +
           (n.has_numa_node() ? std::to_string(n.numa_node()) : "-") + "\n";
  }
  return out;
}

}  // namespace ddl::worker
