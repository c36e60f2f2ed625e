// The node's insides as the agent reads them (worker/topology.h, inventory.h): the built-in virtual
// topologies and topology files (and their mistakes), islands, a made-up sysfs tree for NUMA nodes, CPUs and
// the nearest NIC, memory binding, and `ddl-agent --inventory` against the fake NVML (fake_nvml.c) on that
// tree.
#include "worker/topology.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "worker/agent_config.h"
#include "worker/gpu_health.h"
#include "worker/inventory.h"

namespace ddl::worker {
namespace {

namespace fs = std::filesystem;

class Dir {
 public:
  Dir() {
    char tmpl[] = "/tmp/ddl-topology-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~Dir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& str() const { return path_; }

 private:
  std::string path_;
};

void write(const std::string& path, const std::string& text) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << text << "\n";
}

// A two-socket machine's sysfs: GPUs on buses 01 (socket 0) and 81 (socket 1), an InfiniBand NIC behind
// each socket's root port, an Ethernet NIC on socket 0, NUMA nodes 0 (CPUs 0-3) and 1 (4-7).
void makeSysfs(const Dir& d) {
  auto device = [&](const std::string& root, const std::string& port, const std::string& id, int numa,
                    const std::string& cpus) {
    const std::string dir = d / ("devices/" + root + "/" + port + "/" + id);
    write(dir + "/numa_node", std::to_string(numa));
    write(dir + "/local_cpulist", cpus);
    return dir;
  };
  const std::string g0 = device("pci0000:00", "0000:00:01.0", "0000:01:00.0", 0, "0-3");
  const std::string g1 = device("pci0000:80", "0000:80:01.0", "0000:81:00.0", 1, "4-7");
  const std::string ib0 = device("pci0000:00", "0000:00:01.0", "0000:02:00.0", 0, "0-3");
  const std::string ib1 = device("pci0000:80", "0000:80:01.0", "0000:82:00.0", 1, "4-7");
  const std::string eth = device("pci0000:00", "0000:00:03.0", "0000:05:00.0", 0, "0-3");
  fs::create_directories(d / "bus/pci/devices");
  fs::create_symlink(g0, d / "bus/pci/devices/0000:01:00.0");
  fs::create_symlink(g1, d / "bus/pci/devices/0000:81:00.0");
  for (auto [name, dev] : {std::pair{"mlx5_0", ib0}, std::pair{"mlx5_1", ib1}}) {
    write(d / ("class/infiniband/" + std::string(name) + "/ports/1/state"), "4: ACTIVE");
    fs::create_symlink(dev, d / ("class/infiniband/" + std::string(name) + "/device"));
  }
  write(d / "class/net/eth0/operstate", "up");
  fs::create_symlink(eth, d / "class/net/eth0/device");
  write(d / "devices/system/node/node0/cpulist", "0-3");
  write(d / "devices/system/node/node1/cpulist", "4-7");
}

TEST(Topology, TheS822lcHasTwoNvlinkPairsOnTwoSockets) {
  std::vector<v1::Gpu> gpus;
  std::vector<v1::Nic> nics;
  ASSERT_EQ(loadVirtualTopology("s822lc", "n1", &gpus, &nics), "");
  ASSERT_EQ(gpus.size(), 4u);
  ASSERT_EQ(nics.size(), 2u);
  EXPECT_EQ(gpus[1].uuid(), "virtual-n1-1");
  EXPECT_EQ(gpus[1].model(), "Tesla P100-SXM2-16GB");
  EXPECT_EQ(gpus[1].memory_bytes(), int64_t{16} << 30);
  std::vector<int> islands, numa;
  for (const v1::Gpu& g : gpus) {
    islands.push_back(g.island());
    numa.push_back(g.numa_node());
  }
  EXPECT_EQ(islands, (std::vector<int>{0, 0, 2, 2}));
  EXPECT_EQ(numa, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(gpus[3].nic(), "mlx5_1");
  EXPECT_EQ(nics[1].numa_node(), 1);
  EXPECT_EQ(nics[1].transport(), "ib");
}

TEST(Topology, TheDgxH100IsOneIslandOnTwoNumaNodes) {
  std::vector<v1::Gpu> gpus;
  std::vector<v1::Nic> nics;
  ASSERT_EQ(loadVirtualTopology("dgx-h100", "d1", &gpus, &nics), "");
  ASSERT_EQ(gpus.size(), 8u);
  ASSERT_EQ(nics.size(), 8u);
  for (const v1::Gpu& g : gpus) {
    EXPECT_EQ(g.island(), 0);
    EXPECT_EQ(g.nvlink_peers_size(), 7);
    EXPECT_EQ(g.numa_node(), g.index() / 4);
    EXPECT_EQ(g.nic(), "mlx5_" + std::to_string(g.index()));
    EXPECT_EQ(g.model(), "NVIDIA H100 80GB HBM3");
  }
  EXPECT_EQ(nics[7].speed_mbps(), 400000);
}

TEST(Topology, AFileGivesAnyOtherNodeAndItsMistakesAreNamed) {
  Dir d;
  write(d / "t.json", R"({"gpus": [{"numa": 0, "nvlink": [2]}, {"numa": 0}, {"numa": 0, "nvlink": [0]}],
                          "memory": "24G"})");
  std::vector<v1::Gpu> gpus;
  std::vector<v1::Nic> nics;
  ASSERT_EQ(loadVirtualTopology(d / "t.json", "n", &gpus, &nics), "");
  EXPECT_EQ(gpus[1].island(), 1);
  EXPECT_EQ(gpus[2].island(), 0);
  EXPECT_EQ(gpus[0].memory_bytes(), int64_t{24} << 30);

  auto refusal = [&](const std::string& text) {
    write(d / "bad.json", text);
    return loadVirtualTopology(d / "bad.json", "n", &gpus, &nics);
  };
  EXPECT_NE(refusal(R"({"gpus": [{"nvlink": [1]}, {}]})").find("GPU 1 does not name it"), std::string::npos);
  EXPECT_NE(refusal(R"({"gpus": [{"numa": 0, "nic": "mlx5_9"}]})").find("its NIC mlx5_9 is not in 'nics'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"gpus": [{"numa": 0, "links": [1]}]})").find("unknown key 'links'"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"gpus": []})").find("at least one GPU"), std::string::npos);
  EXPECT_NE(refusal(R"({"gpus": [{"nvlink": [0]}]})").find("not another of the 1 GPUs"), std::string::npos);
  EXPECT_NE(refusal("{not json").find("bad.json"), std::string::npos);
  EXPECT_TRUE(gpus.empty());  // nothing half-read is kept
  EXPECT_NE(
      loadVirtualTopology("s822LC", "n", &gpus, &nics).find("neither a built-in one (s822lc, dgx-h100)"),
      std::string::npos);
}

TEST(Topology, TheAgentRefusesVirtualGpusAndATopologyTogether) {
  AgentConfig c;
  c.node = "n1";
  c.virtual_gpus = 2;
  c.virtual_topology = "s822lc";
  EXPECT_NE(validateAgentConfig(c).message().find("not both"), std::string::npos);
}

TEST(Topology, SysfsGivesNumaNodesCpusAndTheNearestNic) {
  Dir d;
  makeSysfs(d);
  std::vector<v1::Gpu> gpus(2);
  gpus[0].set_pci_bus_id("00000000:01:00.0");  // as NVML writes it
  gpus[1].set_pci_bus_id("00000000:81:00.0");
  std::vector<v1::Nic> nics(3);
  nics[0].set_name("eth0");
  nics[0].set_transport("tcp");
  nics[1].set_name("mlx5_0");
  nics[1].set_transport("ib");
  nics[2].set_name("mlx5_1");
  nics[2].set_transport("ib");
  readPciPlacement(d.str(), &gpus, &nics);
  EXPECT_EQ(gpus[0].pci_bus_id(), "0000:01:00.0");
  EXPECT_EQ(gpus[0].numa_node(), 0);
  EXPECT_EQ(gpus[1].numa_node(), 1);
  EXPECT_EQ(gpus[1].cpus(), "4-7");
  // InfiniBand first, then the fewest bridges: each GPU gets the NIC behind its own root port.
  EXPECT_EQ(gpus[0].nic(), "mlx5_0:1");
  EXPECT_EQ(gpus[1].nic(), "mlx5_1:1");
  EXPECT_EQ(nics[2].numa_node(), 1);
  EXPECT_EQ(nics[0].pci_bus_id(), "0000:05:00.0");

  EXPECT_EQ(cpuNumaFromSysfs(d.str(), {0, 3, 4, 7, 9}), (std::vector<int>{0, 0, 1, 1, -1}));
  EXPECT_TRUE(cpuNumaFromSysfs(d / "nothing", {0, 1}).empty());
  // Memory is bound to the CPUs' nodes where each exists; a made-up node (2) or an unknown CPU binds nothing.
  EXPECT_EQ(memoryNodesOf({4, 5}, {0, 1, 4, 5}, {0, 0, 1, 1}, d.str()), (std::vector<int>{1}));
  EXPECT_EQ(memoryNodesOf({1, 4}, {0, 1, 4, 5}, {0, 0, 1, 1}, d.str()), (std::vector<int>{0, 1}));
  EXPECT_TRUE(memoryNodesOf({4}, {0, 4}, {0, 2}, d.str()).empty());
  EXPECT_TRUE(memoryNodesOf({6}, {0, 4}, {0, 1}, d.str()).empty());
  // UCX is told only of an InfiniBand port that is ACTIVE, never of an Ethernet interface.
  EXPECT_TRUE(ucxDeviceReady(d.str(), "mlx5_1:1"));
  EXPECT_FALSE(ucxDeviceReady(d.str(), "eth0"));
  EXPECT_FALSE(ucxDeviceReady(d.str(), "mlx5_7:1"));
  EXPECT_FALSE(ucxDeviceReady(d.str(), "../x:1"));
  // Socket 1's port goes DOWN: its GPU's nearest usable NIC is socket 0's.
  write(d / "class/infiniband/mlx5_1/ports/1/state", "1: DOWN");
  EXPECT_FALSE(ucxDeviceReady(d.str(), "mlx5_1:1"));
  gpus[1].clear_nic();
  readPciPlacement(d.str(), &gpus, &nics);
  EXPECT_EQ(gpus[1].nic(), "mlx5_0:1");
}

TEST(Topology, VirtualNumaNodesSplitTheOfferedCpus) {
  std::vector<v1::Gpu> gpus;
  std::vector<v1::Nic> nics;
  ASSERT_EQ(loadVirtualTopology("s822lc", "n1", &gpus, &nics), "");
  EXPECT_EQ(splitCpusAmongNuma({0, 1, 2, 3, 4}, &gpus), (std::vector<int>{0, 0, 1, 1, 1}));
  EXPECT_EQ(gpus[0].cpus(), "0-1");
  EXPECT_EQ(gpus[3].cpus(), "2-4");
  std::vector<v1::Gpu> plain(2);
  EXPECT_TRUE(splitCpusAmongNuma({0, 1}, &plain).empty());
}

TEST(Topology, TakeInventoryWithAVirtualTopology) {
  InventoryOptions options;
  options.virtual_topology = "s822lc";
  options.force_virtual = true;
  Inventory inv;
  ASSERT_EQ(takeInventory("n7", options, &inv), "");
  EXPECT_TRUE(inv.virtual_gpus);
  EXPECT_EQ(inv.gpus.size(), 4u);
  EXPECT_EQ(inv.topology, "s822lc");
  EXPECT_NE(inv.gpu_source.find("in topology s822lc (forced)"), std::string::npos) << inv.gpu_source;
  options.virtual_topology = "nope";
  EXPECT_NE(takeInventory("n7", options, &inv).find("nope"), std::string::npos);
}

// ddl-agent --inventory, reading "real" GPUs from the fake NVML and their places from the made-up sysfs.
TEST(Topology, TheAgentReadsNvmlAndSysfs) {
  Dir d;
  makeSysfs(d);
  const std::string command = std::string("env LD_LIBRARY_PATH=") + DDL_FAKE_NVML_DIR +
                              " DDL_FAKE_NVML='01,81;0-1' DDL_SYSFS_ROOT=" + d.str() + " " + DDL_AGENT_BIN +
                              " --inventory --node n1 2>&1";
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  EXPECT_EQ(pclose(p), 0) << out;
  EXPECT_NE(out.find("NVML: 2 GPUs; topology NVML"), std::string::npos) << out;
  EXPECT_NE(
      out.find("gpu 0: Fake P100-SXM2-16GB 16 GiB, uuid GPU-fake-0, pci 0000:01:00.0, numa 0 (cpus 0-3), "
               "nvlink 1, island 0, p2p 1, nic mlx5_0:1"),
      std::string::npos)
      << out;
  EXPECT_NE(
      out.find("gpu 1: Fake P100-SXM2-16GB 16 GiB, uuid GPU-fake-1, pci 0000:81:00.0, numa 1 (cpus 4-7), "
               "nvlink 0, island 0, p2p 0, nic mlx5_1:1"),
      std::string::npos)
      << out;
  EXPECT_NE(out.find("nic mlx5_1: ib, pci 0000:82:00.0, numa 1"), std::string::npos) << out;
  EXPECT_NE(out.find("health: every GPU ok"), std::string::npos) << out;
}

// The fake NVML's faults as `ddl-agent --inventory` reads them, through GpuHealth as the heartbeat does.
TEST(Topology, TheAgentSeesGpuFaults) {
  Dir d;
  write(d / "faults", "xid 1 13\nxid 1 79\necc 0 2\nremap 0\nslow 1 64\n");
  const std::string command = std::string("env LD_LIBRARY_PATH=") + DDL_FAKE_NVML_DIR +
                              " DDL_FAKE_NVML='01,02' DDL_FAKE_NVML_FAULTS=" + (d / "faults") + " " +
                              DDL_AGENT_BIN + " --inventory --node n1 2>&1";
  FILE* p = popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  EXPECT_EQ(pclose(p), 0) << out;
  // The ECC count it starts with is history (since the GPU's last reset); a pending remap is a fault.
  EXPECT_NE(out.find("gpu 0: FAULT: row remapping pending (the GPU needs a reset)"), std::string::npos)
      << out;
  EXPECT_NE(out.find("gpu 1: FAULT: Xid 79 (fallen off the bus)"), std::string::npos) << out;
  EXPECT_NE(out.find("Xid 13 (an error of the program using it"), std::string::npos) << out;  // logged only
  EXPECT_NE(out.find("GPU 1 slowed down (HW thermal slowdown)"), std::string::npos) << out;   // a warning
}

// GpuHealth in this process over the fake NVML (opened by its path): what raises a fault, what a clear does.
TEST(GpuHealth, FaultsAreRaisedClearedAndRaisedAgainWhileTheyLast) {
  Dir d;
  write(d / "faults", "ecc 0 1\n");  // history: from before the agent started
  setenv("DDL_FAKE_NVML", "01,02", 1);
  setenv("DDL_FAKE_NVML_FAULTS", (d / "faults").c_str(), 1);
  std::unique_ptr<GpuHealth> health =
      GpuHealth::open(2, std::string(DDL_FAKE_NVML_DIR) + "/libnvidia-ml.so.1");
  ASSERT_NE(health, nullptr);
  EXPECT_TRUE(health->poll(1).empty());
  write(d / "faults", "ecc 0 3\nremap 1\nxid 1 31\nslow 0 32\n");
  std::vector<v1::GpuFault> faults = health->poll(2);
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_EQ(faults[0].reason(), "3 uncorrectable ECC errors since its last reset");
  EXPECT_EQ(faults[0].at_ms(), 2);
  EXPECT_EQ(faults[1].reason(), "row remapping pending (the GPU needs a reset)");
  EXPECT_EQ(health->slowdown(), "GPU 0 slowed down (SW thermal slowdown)");
  EXPECT_EQ(health->faults().size(), 2u);
  // Cleared: the ECC count that did not rise stays cleared; the remap still pending comes back.
  health->clear(0);
  health->clear(1);
  faults = health->poll(3);
  ASSERT_EQ(faults.size(), 1u);
  EXPECT_EQ(faults[0].gpu(), 1);
  EXPECT_EQ(faults[0].at_ms(), 3);
  // Sticky: the first fault stands, and a lost GPU is one.
  write(d / "faults", "ecc 0 3\nlost 0\nxid 1 31\nxid 1 79\n");
  faults = health->poll(4);
  ASSERT_EQ(faults.size(), 2u);
  EXPECT_EQ(faults[0].reason(), "fallen off the bus (NVML reports the GPU lost)");
  EXPECT_EQ(faults[1].reason(), "row remapping pending (the GPU needs a reset)");
  EXPECT_EQ(health->slowdown(), "");
  unsetenv("DDL_FAKE_NVML");
  unsetenv("DDL_FAKE_NVML_FAULTS");
}

TEST(GpuHealth, OnlyXidsOfTheGpuAreFaults) {
  EXPECT_EQ(fatalXid(79), "fallen off the bus");
  EXPECT_EQ(fatalXid(48), "double-bit ECC error");
  EXPECT_EQ(fatalXid(13), "");  // a graphics engine exception: the program's
  EXPECT_EQ(fatalXid(31), "");  // a memory page fault: the program's
}

TEST(GpuHealth, AHealthCheckPassesFailsOrTimesOut) {
  Dir d;
  auto script = [&](const std::string& name, const std::string& body) {
    write(d / name, "#!/bin/sh\n" + body);
    fs::permissions(d / name, fs::perms::owner_all);
    return d / name;
  };
  EXPECT_EQ(runHealthCheck(script("ok.sh", "echo fine; exit 0"), 5), "");
  EXPECT_EQ(runHealthCheck(script("bad.sh", "echo checking; echo 'ib0: link down' >&2; exit 3"), 5),
            "exit 3: ib0: link down");
  EXPECT_EQ(runHealthCheck(script("slow.sh", "sleep 30"), 0.5), "no result within 0.5 s (killed)");
  EXPECT_NE(runHealthCheck(d / "missing.sh", 5).find("exit 127: cannot run"), std::string::npos);
  // Signals work in it even though the agent blocks SIGTERM (as ddl-agent's main does); a background child
  // left holding its output does not hold the result up, and is killed with the run.
  sigset_t term, before;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &before);
  EXPECT_EQ(
      runHealthCheck(script("term.sh", "sleep 30 & kill -TERM $!; wait $!; echo \"waited $?\"; exit 4"), 5),
      "exit 4: waited 143");
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  EXPECT_EQ(runHealthCheck(script("bg.sh", "sleep 30 & exit 0"), 5), "");
  HealthCheck check(script("bad2.sh", "echo nope; exit 1"), 3600, 5);
  for (int i = 0; i < 500 && !check.failure(); ++i) usleep(10 * 1000);
  EXPECT_EQ(check.failure().value_or("(none)"), "exit 1: nope");
}

}  // namespace
}  // namespace ddl::worker
