// A node's insides, as placement and ranks need them: for each GPU its PCI address, NUMA node and that node's
// CPUs, the GPUs it reaches over NVLink and peer to peer, its NVLink island and its nearest NIC; each NIC's
// NUMA node; and the NUMA node of each CPU the agent offers ranks. Read from NVML (inventory.cpp) and sysfs
// for real GPUs, or made up for virtual ones from a built-in description or a JSON file (--virtual-topology).
//
// Threads: pure functions over their arguments and the files they name.
#pragma once

#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"

namespace ddl::worker {

// The built-in virtual topologies, for --virtual-topology's help and its refusals: "s822lc, dgx-h100".
const char* builtinTopologies();

// Virtual GPUs and NICs from a built-in topology's name or a JSON file's path:
//   s822lc    IBM Power S822LC: 2 sockets, each with 2 P100s joined by NVLink and 1 InfiniBand NIC;
//   dgx-h100  8 H100s on NVSwitch (one NVLink island), GPUs 0-3 on NUMA node 0 and 4-7 on 1, 8 IB NICs;
//   a file    {"gpus": [{"model": "...", "memory": "16G", "numa": 0, "nvlink": [1], "nic": "mlx5_0"}, ...],
//              "nics": [{"name": "mlx5_0", "transport": "ib", "numa": 0}, ...]}
//             (every key but the lists optional; nvlink peers must name each other; a GPU's nic must be
//             listed).
// Virtual GPUs are named virtual-<node>-<index>; P2P reaches a GPU's NVLink peers. Islands are set. "" and
// *gpus / *nics filled, or why the topology cannot be used.
std::string loadVirtualTopology(const std::string& nameOrFile, const std::string& node,
                                std::vector<v1::Gpu>* gpus, std::vector<v1::Nic>* nics);

// The node's NICs from sysfs (`sys`, normally "/sys"): every InfiniBand device, and every network interface
// that is up but the loopback, with its speed where it reports one.
std::vector<v1::Nic> readNics(const std::string& sys);

// Each GPU's island: the lowest index among the GPUs NVLink joins it to, directly or through others (itself
// when it has no NVLink peer). Peers out of range are ignored.
void setIslands(std::vector<v1::Gpu>* gpus);

// For GPUs with a pci_bus_id: their NUMA node and that node's CPUs from sysfs (`sys`, normally "/sys"); each
// NIC's PCI address and NUMA node; and each GPU's nearest NIC: the one with the fewest PCI bridges between
// them, then one on the same NUMA node, then by name; an InfiniBand NIC with an ACTIVE port before one
// without, and before Ethernet. An InfiniBand NIC is named with its first ACTIVE port (else its first port)
// as UCX names devices ("mlx5_0:1").
void readPciPlacement(const std::string& sys, std::vector<v1::Gpu>* gpus, std::vector<v1::Nic>* nics);

// The NUMA node of each of `cpus`, from sysfs's node directories; empty when sysfs has none.
std::vector<int> cpuNumaFromSysfs(const std::string& sys, const std::vector<int>& cpus);

// For virtual GPUs: their NUMA nodes are made up, so the offered CPUs are split, in order, into as many equal
// runs as the GPUs name NUMA nodes (the lowest node first, the remainder to the last), and each GPU's cpus
// set to its node's run. The NUMA node of each of `cpus`; empty when no GPU has a NUMA node.
std::vector<int> splitCpusAmongNuma(const std::vector<int>& cpus, std::vector<v1::Gpu>* gpus);

// The NUMA nodes a rank's memory is bound to: those of its CPUs (`cpu_numa[i]` is the node of `offered[i]`),
// where each exists on this machine (made-up nodes of a virtual topology may not). Empty: not bound (no CPUs,
// or one whose node is unknown or absent).
std::vector<int> memoryNodesOf(const std::vector<int>& cpus, const std::vector<int>& offered,
                               const std::vector<int>& cpu_numa, const std::string& sys);

// Whether UCX may be told to use `device` (UCX_NET_DEVICES): an InfiniBand device's port as UCX names it
// ("mlx5_0:1") that exists on this machine and is ACTIVE. Never an Ethernet interface: UCX's TCP transport
// picks its own, and the nearest by PCI may be a management port or a bond's member with no address.
bool ucxDeviceReady(const std::string& sys, const std::string& device);

// The node's insides for a person (`ddl-agent --inventory`): one line per GPU and per NIC.
std::string describeTopology(const std::vector<v1::Gpu>& gpus, const std::vector<v1::Nic>& nics);

}  // namespace ddl::worker
