// Which ranks share a node, in the sense that matters to libddl: they can map the same shared memory and are
// not separated by a network. Ranks publish their node key at bootstrap; equal keys mean one node.
//
// The key is the kernel's boot id plus the inodes of the caller's IPC, mount, network and PID namespaces: ranks
// of one machine in different containers, or in the network namespaces that tests use as hosts, get different
// keys, and so go over the network as real separate hosts would; ranks of one node can also watch each other's
// process ids. The host name alone is not enough (containers
// often share it, and two machines may be misconfigured with one name).
#pragma once

#include <string>

namespace ddl {

// This process's node key ("<boot id>/<ipc ns>/<mnt ns>/<net ns>/<pid ns>", then "/tag:<DDL_NODE_TAG>" where
// that is set); parts that cannot be read are left empty, so the key stays stable for the process's life.
// DDL_NODE_TAG: ranks of one machine with different tags count as different nodes (the paths across nodes,
// tested and measured on one machine); it cannot make ranks of two machines one node.
std::string localNodeKey();

}  // namespace ddl
