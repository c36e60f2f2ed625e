// Tuning tables (comm/src/algo/tune.h): the file format, its errors, rule lookup and how a table, the built-in
// one and forced settings combine into an allreduce's algorithm and segment size.
#include "algo/tune.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "algo/algo.h"
#include "algo/plan.h"
#include "error.h"
#include "topology.h"

namespace ddl {
namespace {

std::string errorOf(const std::string& text) {
  try {
    TuneTable::parse(text, "t.tune");
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ddlInvalidArgument);
    return e.what();
  }
  return "(no error)";
}

TEST(TuneTable, ParsesRulesAndFindsTheFirstMatch) {
  auto t = TuneTable::parse(
      "# written by hand\n"
      "ddl-tune 1   # version\n"
      "\n"
      "allreduce 4 2x2 2K rhd 0\n"
      "allreduce 4 2x2 inf mdring 1M   # large\n"
      "allreduce 3 * 65536 rhd 0\n"
      "allreduce * * inf ring 128K\n",
      "t.tune");
  ASSERT_EQ(t->rules().size(), 4u);
  EXPECT_EQ(t->find(4, "2x2", 8)->algo, Algo::kRhd);
  EXPECT_EQ(t->find(4, "2x2", 2048)->algo, Algo::kRhd);
  const TuneRule* big = t->find(4, "2x2", 2049);
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->algo, Algo::kMdRing);
  EXPECT_EQ(big->segment_bytes, size_t{1} << 20);
  EXPECT_EQ(t->find(3, "3", 65536)->algo, Algo::kRhd);
  EXPECT_EQ(t->find(3, "3", 65537)->algo, Algo::kRing);  // falls through to the catch-all
  EXPECT_EQ(t->find(4, "4", 8)->algo, Algo::kRing);      // another topology: not the 2x2 rules
  EXPECT_EQ(t->find(4, "4", 8)->segment_bytes, size_t{128} << 10);
  EXPECT_EQ(TuneTable::formatRule(t->rules()[1]), "allreduce 4 2x2 inf mdring 1M");
  EXPECT_EQ(TuneTable::formatRule(t->rules()[2]), "allreduce 3 * 64K rhd 0");
}

TEST(TuneTable, NoMatchingRuleFindsNothing) {
  auto t = TuneTable::parse("ddl-tune 1\nallreduce 2 2 1M ring 0\n", "t.tune");
  EXPECT_EQ(t->find(2, "2", (1 << 20) + 1), nullptr);
  EXPECT_EQ(t->find(4, "4", 8), nullptr);
}

TEST(TuneTable, FlatMatchesTopologiesWithoutAHierarchy) {
  auto t = TuneTable::parse("ddl-tune 1\nallreduce * flat inf ring 0\nallreduce * * inf mdring 64K\n", "t.tune");
  for (const char* flat : {"4", "8x1", "1x8", "1"}) EXPECT_EQ(t->find(8, flat, 8)->algo, Algo::kRing) << flat;
  for (const char* grid : {"2x2", "4x2", "2x1x4"}) EXPECT_EQ(t->find(8, grid, 8)->algo, Algo::kMdRing) << grid;
  EXPECT_EQ(TuneTable::formatRule(t->rules()[0]), "allreduce * flat inf ring 0");
}

TEST(TuneTable, DigestIgnoresCommentsAndSpacingButNotRules) {
  auto a = TuneTable::parse("ddl-tune 1\nallreduce 2 2 64K rhd 0\n", "a");
  auto b = TuneTable::parse("# other comment\nddl-tune  1\n  allreduce 2 2 65536  rhd 0 # same\n", "b");
  auto c = TuneTable::parse("ddl-tune 1\nallreduce 2 2 64K ring 0\n", "c");
  EXPECT_EQ(a->digest(), b->digest());
  EXPECT_NE(a->digest(), c->digest());
  EXPECT_EQ(a->digest().size(), 16u);
}

TEST(TuneTable, BadTablesAreRefusedNamingTheLine) {
  EXPECT_NE(errorOf("").find("t.tune: empty"), std::string::npos);
  EXPECT_NE(errorOf("allreduce * * inf ring 0\n").find("t.tune:1: expected 'ddl-tune 1' first"), std::string::npos);
  EXPECT_NE(errorOf("ddl-tune 2\n").find("version 2 is not supported"), std::string::npos);
  EXPECT_NE(errorOf("ddl-tune 1\nbroadcast * * inf ring 0\n").find("t.tune:2: unknown collective 'broadcast'"),
            std::string::npos);
  EXPECT_NE(errorOf("ddl-tune 1\nallreduce * * inf ring\n").find("t.tune:2: expected"), std::string::npos);
  EXPECT_NE(errorOf("ddl-tune 1\n\nallreduce * * inf fast 0\n").find("t.tune:3: ALGO 'fast' is not ring, mdring or rhd"), std::string::npos);
  EXPECT_NE(errorOf("ddl-tune 1\nallreduce * * inf auto 0\n").find("t.tune:2: ALGO 'auto' is not"), std::string::npos);
  EXPECT_NE(errorOf("ddl-tune 1\nallreduce * * 12Q ring 0\n").find("t.tune:2: MAX_BYTES '12Q'"), std::string::npos);
  EXPECT_NE(errorOf("ddl-tune 1\nallreduce * * inf ring inf\n").find("t.tune:2: SEGMENT 'inf'"), std::string::npos);
  EXPECT_NE(errorOf("ddl-tune 1\nallreduce * 2y2 inf ring 0\n").find("topology '2y2'"), std::string::npos);
  EXPECT_NE(errorOf("ddl-tune 1\nallreduce 0 * inf ring 0\n").find("t.tune:2: RANKS"), std::string::npos);
}

TEST(TuneTable, AMissingFileIsNamed) {
  try {
    TuneTable::load("/nonexistent/ddl.tune");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("DDL_TUNE_FILE /nonexistent/ddl.tune: cannot be read"), std::string::npos);
  }
}

std::string loadError(const std::string& path) {
  try {
    TuneTable::load(path);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ddlInvalidArgument);
    return e.what();
  }
  return "(no error)";
}

// Fails before the bounds: /dev/zero was read without end (the process ate memory until killed).
TEST(TuneTable, OnlyABoundedRegularFileIsRead) {
  std::string msg = loadError("/dev/zero");
  EXPECT_NE(msg.find("DDL_TUNE_FILE /dev/zero: is not a regular file"), std::string::npos) << msg;

  char dir[] = "/tmp/ddl_tune_testXXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string fifo = std::string(dir) + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  msg = loadError(fifo);  // opening a FIFO with no writer must not block
  EXPECT_NE(msg.find("is not a regular file"), std::string::npos) << msg;

  const std::string big = std::string(dir) + "/big.tune";
  {
    std::ofstream out(big);
    out << "ddl-tune 1\n";
    for (size_t n = 0; n <= kMaxTuneFileBytes / 32; ++n) out << "# padding padding padding paddin\n";
  }
  msg = loadError(big);
  EXPECT_NE(msg.find("DDL_TUNE_FILE " + big + ": is larger than 1024 KiB"), std::string::npos) << msg;

  const std::string good = std::string(dir) + "/good.tune";
  std::ofstream(good) << "ddl-tune 1\nallreduce * * inf ring 64K\n";
  EXPECT_EQ(TuneTable::load(good)->rules().size(), 1u);
  for (const std::string& f : {fifo, big, good}) ::unlink(f.c_str());
  ::rmdir(dir);
}

// Each fails before the validation: the rules were accepted.
TEST(TuneTable, InsaneRulesAreRefusedNamingTheLine) {
  auto expect = [](const std::string& rule, const std::string& what) {
    std::string msg = errorOf("ddl-tune 1\n" + rule + "\n");
    EXPECT_NE(msg.find("t.tune:2: "), std::string::npos) << rule << ": " << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << rule << ": " << msg;
  };
  expect("allreduce * * inf ring 1", "SEGMENT '1' is not a byte count from 1K to 1G");
  expect("allreduce * * inf ring 1023", "SEGMENT '1023'");
  expect("allreduce * * inf ring 2G", "SEGMENT '2G'");
  expect("allreduce * * 0 ring 0", "MAX_BYTES '0' is not a byte count above 0");
  expect("allreduce * x inf ring 0", "topology 'x' is not a topology: '' is not a positive integer");
  expect("allreduce * 2xx2 inf ring 0", "topology '2xx2'");
  expect("allreduce * 0x4 inf ring 0", "topology '0x4'");
  expect("allreduce * 2x inf ring 0", "topology '2x'");
  expect("allreduce * 99999999 inf ring 0", "topology '99999999'");
  expect("allreduce * 2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2x2 inf ring 0", "more than 16 dimensions");
  // The grammar takes these; a rule must be written as ddlCommGetTopology prints, or it would never match.
  expect("allreduce * 2X2 inf ring 0", "topology '2X2' is not written as ddlCommGetTopology prints it");
  expect("allreduce * 02x2 inf ring 0", "topology '02x2' is not written as ddlCommGetTopology prints it");
  expect("allreduce 4 2x3 inf ring 0", "topology '2x3' has 6 ranks but the rule is for 4");
  expect("allreduce * * inf ring 0 " + std::string(5000, ' '), "a rule takes at most 4096");
  // What stays valid: 1K segments, 0 (default), a topology for any rank count.
  EXPECT_EQ(TuneTable::parse("ddl-tune 1\nallreduce * 2x3 1 ring 1K\nallreduce 6 2x3 inf ring 0\n", "t")->rules().size(),
            2u);
}

TEST(TuneTable, RuleCountIsBounded) {
  std::string text = "ddl-tune 1\n";
  for (size_t i = 0; i <= kMaxTuneRules; ++i) text += "allreduce * * inf ring 0\n";
  EXPECT_NE(errorOf(text).find("more than 10000 rules"), std::string::npos);
}

// chooseAllReduce as a communicator calls it for a configured topology.
AllReduceChoice choose(Algo forced, size_t segment, const TuneTable* tune, const Topology& topo, int nranks,
                       size_t bytes) {
  return chooseAllReduce(forced, segment, tune, topo.str(), mdringGrid(topo).nontrivialDims() >= 2, nranks, bytes);
}

TEST(ChooseAllReduce, ForcedSettingsWinThenTheTableThenTheBuiltIn) {
  auto t = TuneTable::parse("ddl-tune 1\nallreduce 4 * 1K ring 64K\nallreduce 4 * 1M mdring 512K\n", "t");
  const Topology flat4 = parseTopology("", 4), flat5 = parseTopology("", 5);
  AllReduceChoice c = choose(Algo::kAuto, 0, t.get(), flat4, 4, 512);
  EXPECT_EQ(c.algo, Algo::kRing);
  EXPECT_EQ(c.segment_bytes, size_t{64} << 10);
  c = choose(Algo::kAuto, 0, t.get(), flat4, 4, 4096);
  EXPECT_EQ(c.algo, Algo::kMdRing);
  EXPECT_EQ(c.segment_bytes, size_t{512} << 10);
  // Forced algorithm: the rule's segment was measured for another algorithm, so the default applies.
  c = choose(Algo::kRhd, 0, t.get(), flat4, 4, 4096);
  EXPECT_EQ(c.algo, Algo::kRhd);
  EXPECT_EQ(c.segment_bytes, size_t{256} << 10);
  // Forced segment, algorithm from the table.
  c = choose(Algo::kAuto, 4096, t.get(), flat4, 4, 4096);
  EXPECT_EQ(c.algo, Algo::kMdRing);
  EXPECT_EQ(c.segment_bytes, 4096u);
  // Past the table's last rule: the built-in table (rhd up to 4K, then mdring on a grid).
  EXPECT_EQ(choose(Algo::kAuto, 0, t.get(), flat4, 4, 2 << 20).algo, Algo::kMdRing);
  // Another rank count: the built-in table; mdring on a prime count is the flat ring.
  EXPECT_EQ(choose(Algo::kAuto, 0, t.get(), flat5, 5, 8).algo, Algo::kRhd);
  EXPECT_EQ(choose(Algo::kAuto, 0, t.get(), flat5, 5, 2 << 20).algo, Algo::kRing);
  // No table at all is the built-in one; it has rules of its own for 2 and 3 ranks.
  EXPECT_EQ(choose(Algo::kAuto, 0, nullptr, flat4, 4, 8).algo, Algo::kRhd);
  c = choose(Algo::kAuto, 0, nullptr, flat4, 4, 8192);  // flat: the default segment
  EXPECT_EQ(c.algo, Algo::kMdRing);
  EXPECT_EQ(c.segment_bytes, size_t{256} << 10);
  c = choose(Algo::kAuto, 0, nullptr, parseTopology("2x2", 4), 4, 8192);  // a hierarchy: short segments
  EXPECT_EQ(c.algo, Algo::kMdRing);
  EXPECT_EQ(c.segment_bytes, size_t{64} << 10);
  const Topology flat2 = parseTopology("", 2);
  EXPECT_EQ(choose(Algo::kAuto, 0, nullptr, flat2, 2, 4 << 20).algo, Algo::kRhd);
  c = choose(Algo::kAuto, 0, nullptr, flat2, 2, 16 << 20);  // mdring has no grid at 2: the flat ring
  EXPECT_EQ(c.algo, Algo::kRing);
  EXPECT_EQ(c.segment_bytes, size_t{256} << 10);
  const Topology flat3 = parseTopology("", 3);
  EXPECT_EQ(choose(Algo::kAuto, 0, nullptr, flat3, 3, 100 << 10).algo, Algo::kRhd);
  c = choose(Algo::kAuto, 0, nullptr, flat3, 3, 1 << 20);
  EXPECT_EQ(c.algo, Algo::kRing);
  EXPECT_EQ(c.segment_bytes, size_t{64} << 10);
}

}  // namespace
}  // namespace ddl

// planAllReduce (algo/plan.h): the one place an allreduce's path is chosen.
namespace ddl {
namespace {

// 2 nodes x 4 ranks sharing memory on each, the node mdring's dim 0 with one dim above it.
AllReduceShape twoNodesOfFour() {
  AllReduceShape nodes;
  nodes.nranks = 8;
  nodes.shm_dim0 = true;
  nodes.topology = "4x2";
  nodes.has_grid = true;
  nodes.dims_above_node = 1;
  return nodes;
}

AllReduceShape oneNode(int n) {
  AllReduceShape s;
  s.nranks = n;
  s.shm_all = true;
  s.topology = std::to_string(n);
  return s;
}

TEST(PlanAllReduce, HostBuffersTakeTheHostAlgorithm) {
  EXPECT_EQ(planAllReduce(oneNode(4), 1 << 20, Buffers::kHost).algo.algo, Algo::kShm);
  AllReduceShape ring = oneNode(4);
  ring.forced_algo = Algo::kRing;
  ring.forced_segment = 4096;
  const AllReducePlan p = planAllReduce(ring, 1 << 20, Buffers::kHost);
  EXPECT_EQ(p.path, AllReducePath::kHost);
  EXPECT_EQ(p.algo.algo, Algo::kRing);
  EXPECT_EQ(p.algo.segment_bytes, 4096u);
  AllReduceShape lone;  // DDL_ALGO=shm with nothing to share: the ring
  lone.forced_algo = Algo::kShm;
  EXPECT_EQ(planAllReduce(lone, 64, Buffers::kHost).algo.algo, Algo::kRing);
}

TEST(PlanAllReduce, DeviceBuffersPreferIpcThenStaged) {
  AllReduceShape s = oneNode(2);
  AllReducePlan p = planAllReduce(s, 1 << 20, Buffers::kDevice);
  EXPECT_EQ(p.path, AllReducePath::kIpc);
  EXPECT_TRUE(p.setup);
  s.ipc = Setup::kReady;
  EXPECT_FALSE(planAllReduce(s, 1 << 20, Buffers::kDevice).setup);
  s.ipc = Setup::kOff;
  EXPECT_EQ(planAllReduce(s, 1 << 20, Buffers::kDevice).path, AllReducePath::kStaged);
  AllReduceShape nodes;  // 2 nodes x 2 ranks, the node is dim 0
  nodes.nranks = 4;
  nodes.shm_dim0 = true;
  nodes.topology = "2x2";
  nodes.has_grid = true;
  EXPECT_EQ(planAllReduce(nodes, 1 << 20, Buffers::kDevice).path, AllReducePath::kIpcAcrossNodes);
  nodes.forced_algo = Algo::kRing;  // a forced ring leaves mdring's node dim out
  EXPECT_EQ(planAllReduce(nodes, 1 << 20, Buffers::kDevice).path, AllReducePath::kStaged);
  AllReduceShape apart;  // one rank per node
  apart.nranks = 3;
  apart.topology = "3";
  EXPECT_EQ(planAllReduce(apart, 1 << 20, Buffers::kDevice).path, AllReducePath::kStaged);
}

TEST(PlanAllReduce, StreamOrderedTakesTheNodeKernelElseHostPaced) {
  AllReduceShape s = oneNode(2);
  AllReducePlan p = planAllReduce(s, 64 << 10, Buffers::kDeviceOnStream);
  EXPECT_EQ(p.path, AllReducePath::kNodeKernel);
  EXPECT_TRUE(p.one_shot);
  EXPECT_TRUE(p.setup);
  EXPECT_FALSE(planAllReduce(s, 64 << 20, Buffers::kDeviceOnStream).one_shot);
  EXPECT_TRUE(planAllReduce(oneNode(8), nodeOneShotBytes(8), Buffers::kDeviceOnStream).one_shot);
  EXPECT_FALSE(planAllReduce(oneNode(8), nodeOneShotBytes(8) + 1, Buffers::kDeviceOnStream).one_shot);
  s.node_kernel = Setup::kOff;  // e.g. ranks sharing a GPU without MPS
  p = planAllReduce(s, 64 << 10, Buffers::kDeviceOnStream);
  EXPECT_EQ(p.path, AllReducePath::kHostPaced);
  EXPECT_EQ(p.host_paced, AllReducePath::kIpc);
  AllReduceShape apart;
  apart.nranks = 2;
  apart.topology = "2";
  p = planAllReduce(apart, 64 << 10, Buffers::kDeviceOnStream);
  EXPECT_EQ(p.path, AllReducePath::kHostPaced);
  EXPECT_EQ(p.host_paced, AllReducePath::kStaged);
  EXPECT_FALSE(nodeKernelServes(oneNode(1))) << "a single rank has no peers to meet";
  EXPECT_STREQ(pathName(AllReducePath::kNodeKernel), "node-kernel");
}

TEST(PlanAllReduce, StreamOrderedAcrossNodesRunsTheNodeKernelAroundTheWire) {
  AllReduceShape nodes = twoNodesOfFour();
  AllReducePlan p = planAllReduce(nodes, 1 << 20, Buffers::kDeviceOnStream);
  EXPECT_EQ(p.path, AllReducePath::kNodeKernelAcrossNodes);
  EXPECT_TRUE(p.setup);
  EXPECT_FALSE(nodeKernelServes(nodes)) << "the other collectives across nodes are host-paced";
  nodes.node_kernel = Setup::kReady;
  EXPECT_FALSE(planAllReduce(nodes, 1 << 20, Buffers::kDeviceOnStream).setup);
  nodes.forced_algo = Algo::kMdRing;
  EXPECT_EQ(planAllReduce(nodes, 1 << 20, Buffers::kDeviceOnStream).path,
            AllReducePath::kNodeKernelAcrossNodes);
  nodes.forced_algo = Algo::kRing;  // a forced ring leaves the node out
  p = planAllReduce(nodes, 1 << 20, Buffers::kDeviceOnStream);
  EXPECT_EQ(p.path, AllReducePath::kHostPaced);
  EXPECT_EQ(p.host_paced, AllReducePath::kStaged);
  nodes.forced_algo = Algo::kAuto;
  nodes.dims_above_node = 2;  // racks above the nodes: mdring's levels, host-paced
  p = planAllReduce(nodes, 1 << 20, Buffers::kDeviceOnStream);
  EXPECT_EQ(p.path, AllReducePath::kHostPaced);
  EXPECT_EQ(p.host_paced, AllReducePath::kIpcAcrossNodes);
  nodes.dims_above_node = 1;
  nodes.node_kernel = Setup::kOff;  // a rank could not set it up
  p = planAllReduce(nodes, 1 << 20, Buffers::kDeviceOnStream);
  EXPECT_EQ(p.path, AllReducePath::kHostPaced);
  EXPECT_EQ(p.host_paced, AllReducePath::kIpcAcrossNodes);
  EXPECT_STREQ(pathName(AllReducePath::kNodeKernelAcrossNodes), "node-kernel+wire");
}

// Every stream-ordered collective is planned once, by planOnStream: the path, one-shot or two-shot, the CTAs
// and why a call is host-paced.
TEST(PlanOnStream, OneNodeEveryCollectiveTakesTheNodeKernelOnItsDevice) {
  AllReduceShape s = oneNode(4);
  StreamPlan p = planOnStream(s, CollKind::kReduceScatter, 1 << 20, false);
  EXPECT_TRUE(p.setup) << "the first call of any kind sets the kernel up, on any device";
  EXPECT_EQ(p.path, AllReducePath::kNodeKernel);
  s.node_kernel = Setup::kReady;
  s.node_blocks = 24;
  for (CollKind c : {CollKind::kAllReduce, CollKind::kReduceScatter, CollKind::kAllGather,
                     CollKind::kBroadcast, CollKind::kReduce}) {
    p = planOnStream(s, c, 64 << 10, true);
    EXPECT_EQ(p.path, AllReducePath::kNodeKernel);
    EXPECT_FALSE(p.setup);
    EXPECT_EQ(p.blocks, 24) << "the CTAs agreed at the setup";
    EXPECT_EQ(p.one_shot, c == CollKind::kAllReduce) << "only an allreduce is one-shot or two-shot";
    EXPECT_EQ(p.why, HostPacedWhy::kNone);
  }
  EXPECT_FALSE(planOnStream(s, CollKind::kAllReduce, nodeOneShotBytes(4) + 1, true).one_shot);
  p = planOnStream(s, CollKind::kAllReduce, 64 << 10, false);
  EXPECT_EQ(p.path, AllReducePath::kHostPaced);
  EXPECT_EQ(p.why, HostPacedWhy::kOtherDevice);
  EXPECT_FALSE(p.one_shot);
  s.node_kernel = Setup::kOff;
  p = planOnStream(s, CollKind::kAllGather, 64 << 10, true);
  EXPECT_EQ(p.path, AllReducePath::kHostPaced);
  EXPECT_EQ(p.why, HostPacedWhy::kSetupFailed);
  EXPECT_FALSE(p.setup) << "a failed setup is not tried again";
}

TEST(PlanOnStream, AcrossNodesOnlyAllReduceRunsTheKernelAndTheRestSayWhyNot) {
  AllReduceShape nodes = twoNodesOfFour();
  StreamPlan p = planOnStream(nodes, CollKind::kAllGather, 1 << 20, true);
  EXPECT_TRUE(p.setup) << "an allgather first still sets the kernel up for the allreduces after it";
  EXPECT_EQ(p.path, AllReducePath::kHostPaced);
  EXPECT_EQ(p.why, HostPacedWhy::kAcrossOnlyAllReduce);
  nodes.node_kernel = Setup::kReady;
  p = planOnStream(nodes, CollKind::kAllReduce, 1 << 20, true);
  EXPECT_EQ(p.path, AllReducePath::kNodeKernelAcrossNodes);
  EXPECT_FALSE(p.one_shot);
  EXPECT_EQ(planOnStream(nodes, CollKind::kBroadcast, 1 << 20, true).why, HostPacedWhy::kAcrossOnlyAllReduce);
  nodes.forced_algo = Algo::kRing;
  EXPECT_EQ(planOnStream(nodes, CollKind::kAllReduce, 1 << 20, true).why, HostPacedWhy::kAlgoForced);
  nodes.forced_algo = Algo::kAuto;
  nodes.dims_above_node = 2;
  EXPECT_EQ(planOnStream(nodes, CollKind::kAllReduce, 1 << 20, true).why, HostPacedWhy::kNoSharedNode);
  EXPECT_EQ(planOnStream(oneNode(1), CollKind::kAllReduce, 1 << 20, true).why, HostPacedWhy::kSingleRank);
  AllReduceShape ring = oneNode(4);
  ring.forced_algo = Algo::kRing;
  EXPECT_EQ(planOnStream(ring, CollKind::kAllReduce, 1 << 20, true).why, HostPacedWhy::kAlgoForced);
}

}  // namespace
}  // namespace ddl
