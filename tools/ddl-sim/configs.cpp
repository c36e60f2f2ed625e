#include "tools/ddl-sim/configs.h"

namespace ddl::sim {

StatusOr<Config> builtinConfig(const std::string& name) {
  Config c;
  Machine& m = c.machine;
  m.name = name;
  if (name == "2017") {
    // IBM S822LC for HPC ("Minsky"): 2 POWER8 sockets, each with 2 P100 (SXM2) on NVLink 1.0. GPU pairs on
    // one socket have 2 links of 20 GB/s per direction between them: 40 GB/s; a ring over all 4 also crosses
    // the sockets through the CPUs' NVLink (40 GB/s per GPU to its CPU) and the X bus, which the model does
    // not tell apart (it gives every intra-node hop 40 GB/s). One EDR InfiniBand port (100 Gb/s) per node,
    // shared by its 4 GPUs: 12.5 GB/s nominal, 12 GB/s taken as achievable. 8 nodes per switch (the 4x8x2
    // layout of the issue: 4 GPUs x 8 nodes x switches), full bisection between switches, one more hop of
    // latency. Latencies include a GPU copy's launch: 8 us within a node, 6 and 7 us between nodes (assumed).
    // Reduction on the GPU: P100 HBM2 732 GB/s, a sum reads two inputs and writes one: 150 GB/s of output
    // taken as achievable.
    m.ranks_per_node = 4;
    m.nodes_per_switch = 8;
    m.nics_per_node = 1;
    m.links[0] = {8e-6, 40e9};
    m.links[1] = {6e-6, 12e9};
    m.links[2] = {7e-6, 12e9};
    m.reduce_Bps = 150e9;
    c.summary =
        "2017: S822LC, 4 P100/node on NVLink 1.0 (40 GB/s), 1 EDR port/node (12 GB/s, shared by 4 GPUs), "
        "8 nodes/switch";
    return c;
  }
  if (name == "h100") {
    // DGX H100-like: 8 H100 SXM on NVLink 4 through NVSwitch, 450 GB/s per direction per GPU (nominal; NCCL
    // reaches about 360-370 GB/s of bus bandwidth in practice), one ConnectX-7 NDR port (400 Gb/s = 50 GB/s)
    // per GPU, so nothing is shared on the way out of a node. 32 nodes per leaf group (a DGX SuperPOD
    // scalable unit), full bisection above it. Latencies 3 us in a node, 5 and 6 us between nodes (assumed).
    // Reduction: HBM3 3.35 TB/s, 800 GB/s of output taken as achievable.
    m.ranks_per_node = 8;
    m.nodes_per_switch = 32;
    m.nics_per_node = 8;
    m.links[0] = {3e-6, 450e9};
    m.links[1] = {5e-6, 50e9};
    m.links[2] = {6e-6, 50e9};
    m.reduce_Bps = 800e9;
    c.summary =
        "h100: 8 H100/node on NVLink 4 (450 GB/s), 1 NDR 400G port per GPU (50 GB/s), 32 nodes/leaf group";
    return c;
  }
  return Status::invalidArgument("unknown config '" + name +
                                 "' (built in: 2017, h100; or --calibration FILE)");
}

StatusOr<Network> builtinNetwork(const std::string& name) {
  // Parameter counts of torchvision's models (resnet50: 25,557,032; resnet101: 44,549,160).
  if (name == "resnet50") return Network{name, 25.557e6};
  if (name == "resnet101") return Network{name, 44.549e6};
  return Status::invalidArgument("unknown network '" + name + "' (built in: resnet50, resnet101)");
}

StatusOr<double> defaultComputeSeconds(const std::string& config, const std::string& network) {
  // 2017: 32 images/GPU (DDL's paper) at ~200 img/s per P100 in fp32 (ResNet-50), ~115 img/s
  // (ResNet-101, 1.9x the FLOPs). h100: 256 images/GPU at ~3000 img/s per H100 in mixed precision
  // (ResNet-50), ~1700 img/s.
  if (config == "2017" && network == "resnet50") return 0.16;
  if (config == "2017" && network == "resnet101") return 0.28;
  if (config == "h100" && network == "resnet50") return 0.085;
  if (config == "h100" && network == "resnet101") return 0.15;
  return Status::invalidArgument("no default compute time for " + network + " on '" + config +
                                 "': give --compute-ms");
}

}  // namespace ddl::sim
