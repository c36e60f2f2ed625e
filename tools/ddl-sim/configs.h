// ddl-sim's built-in clusters and networks, for `ddl-sim scale`. Every figure here is an assumption with its
// reason next to it; docs/scaling-model.md repeats them in one table.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "tools/ddl-sim/model.h"

namespace ddl::sim {

// A cluster for `scale`: the machine plus what it says about itself.
struct Config {
  Machine machine;
  std::string summary;  // one line: GPUs, links, assumptions
};

// "2017" (DDL's paper: 64 S822LC nodes, 4 P100 on NVLink 1.0, EDR per node) or "h100" (8 H100 on NVLink 4,
// NDR 400 Gb/s per GPU).
StatusOr<Config> builtinConfig(const std::string& name);

// A network whose fp32 gradients are allreduced once per step.
struct Network {
  std::string name;
  double params = 0;  // parameters; gradient bytes = 4 * params
};
StatusOr<Network> builtinNetwork(const std::string& name);

// Seconds of compute per training step (forward + backward) of `network` on one GPU of `config`, at the
// config's per-GPU batch (a built-in pair only).
StatusOr<double> defaultComputeSeconds(const std::string& config, const std::string& network);

}  // namespace ddl::sim
