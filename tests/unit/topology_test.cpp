// Topology strings and option resolution: what users type in DDL_TOPOLOGY / DDL_ALGO and the errors they see.
#include "topology.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/topology_dims.h"
#include "env.h"
#include "options.h"
#include "error.h"
#include "topology_cases.h"

namespace ddl {
namespace {

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ddlInvalidArgument);
    return e.what();
  }
  return "";
}

TEST(Topology, ParsesDimsFastestFirst) {
  Topology t = parseTopology("4x8x2", 64);
  EXPECT_EQ(t.dims, (std::vector<int>{4, 8, 2}));
  EXPECT_EQ(t.str(), "4x8x2");
  EXPECT_EQ(t.size(), 64);
  EXPECT_EQ(t.nontrivialDims(), 3);
  // Rank 13 = 1 + 4 * 3: GPU 1 of node 3 under switch 0.
  EXPECT_EQ(t.coord(13, 0), 1);
  EXPECT_EQ(t.coord(13, 1), 3);
  EXPECT_EQ(t.coord(13, 2), 0);
  EXPECT_EQ(t.coord(45, 2), 1);
  EXPECT_EQ(t.stride(2), 32);
  EXPECT_EQ(parseTopology("2X2", 4).dims, (std::vector<int>{2, 2}));
}

TEST(Topology, EmptyIsFlat) {
  Topology t = parseTopology("", 5);
  EXPECT_EQ(t.dims, (std::vector<int>{5}));
  EXPECT_EQ(t.nontrivialDims(), 1);
  EXPECT_EQ(parseTopology("1x4x1", 4).nontrivialDims(), 1);
}

// Found by topology_fuzz (corpus/topology/zero_ranks): an empty topology for 0 ranks gave the dim {0}, a
// "topology" whose coordinates divide by zero. Fails without the check.
TEST(Topology, NoRanksIsRefused) {
  for (int n : {0, -1}) {
    std::string e = errorOf([&] { parseTopology("", n); });
    EXPECT_NE(e.find("at least 1"), std::string::npos) << n << ": " << e;
  }
}

TEST(Topology, ProductMismatchSaysBothNumbers) {
  std::string e = errorOf([] { parseTopology("2x3", 4); });
  EXPECT_NE(e.find("has 6 ranks"), std::string::npos) << e;
  EXPECT_NE(e.find("has 4"), std::string::npos) << e;
}

TEST(Topology, MalformedStringsAreRejected) {
  for (const char* bad : {"x", "2x", "x2", "2xx2", "0x4", "-2x2", "2x2.0", "two", "2 x 2", "99999999999"}) {
    std::string e = errorOf([&] { parseTopology(bad, 4); });
    EXPECT_NE(e.find("invalid topology"), std::string::npos) << bad << ": " << e;
  }
}

// libddl's side of the one grammar: the shared cases, and the grammar's own answers.
TEST(Topology, TheSharedCasesAsEveryCallerSeesThem) {
  for (const TopologyCase& c : kTopologyCases) {
    SCOPED_TRACE(std::string("'") + c.text + "' for " + std::to_string(c.ranks) + " ranks");
    bool took = true;
    try {
      ddl::parseTopology(c.text, c.ranks);
    } catch (const ddl::Error& e) {
      took = false;
      EXPECT_EQ(e.code(), ddlInvalidArgument);
    }
    EXPECT_EQ(took, c.ok);
    std::vector<int> dims;
    const std::string why = ddl::parseTopologyDims(c.text, &dims);
    if (c.ok) {
      EXPECT_EQ(why, "");
      EXPECT_EQ(ddl::topologyRanks(dims), c.ranks);
    }
  }
}

TEST(Topology, TheGrammarSaysWhy) {
  std::vector<int> dims = {7};
  EXPECT_EQ(ddl::parseTopologyDims("4xy", &dims), "'y' is not a positive integer");
  EXPECT_EQ(dims, std::vector<int>{7}) << "a refused text leaves dims alone";
  EXPECT_EQ(ddl::parseTopologyDims("", &dims), "'' is not a positive integer");
  EXPECT_EQ(ddl::parseTopologyDims("2x1048577", &dims), "dimension '1048577' is larger than 1048576");
  EXPECT_EQ(ddl::parseTopologyDims("99999999a", &dims), "'99999999a' is not a positive integer")
      << "a part with a letter is not a number, however large its digits";
  EXPECT_EQ(ddl::parseTopologyDims("1048576x1048576", &dims),
            "the dimensions multiply to more than 2^31 ranks");
  EXPECT_EQ(ddl::parseTopologyDims("1x1x1x1x1x1x1x1x1x1x1x1x1x1x1x1x1", &dims), "more than 16 dimensions");
  EXPECT_EQ(ddl::parseTopologyDims("4X2x3", &dims), "");
  EXPECT_EQ(dims, (std::vector<int>{4, 2, 3}));
  EXPECT_EQ(ddl::formatTopologyDims(dims), "4x2x3");
}

TEST(Options, ConfigWinsOverEnvironmentWhichWinsOverDefaults) {
  setenv("DDL_TIMEOUT_MS", "1234", 1);
  setenv("DDL_ALGO", "ring", 1);
  setenv("DDL_TOPOLOGY", "2x2", 1);
  Options o = resolveOptions(nullptr, 4);
  EXPECT_EQ(o.timeout_ms, 1234);
  EXPECT_EQ(o.algo, Algo::kRing);
  EXPECT_EQ(o.topology.str(), "2x2");
  ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
  cfg.timeoutMs = 99;
  cfg.algorithm = "rhd";
  cfg.topology = "4";
  o = resolveOptions(&cfg, 4);
  EXPECT_EQ(o.timeout_ms, 99);
  EXPECT_EQ(o.algo, Algo::kRhd);
  EXPECT_EQ(o.topology.str(), "4");
  unsetenv("DDL_TIMEOUT_MS");
  unsetenv("DDL_ALGO");
  unsetenv("DDL_TOPOLOGY");
  o = resolveOptions(nullptr, 3);
  EXPECT_EQ(o.timeout_ms, kDefaultTimeoutMs);
  EXPECT_EQ(o.algo, Algo::kAuto);
  EXPECT_EQ(o.topology.str(), "3");
}

TEST(Options, BadValuesNameTheVariable) {
  setenv("DDL_ALGO", "rign", 1);
  std::string e = errorOf([] { resolveOptions(nullptr, 2); });
  EXPECT_NE(e.find("DDL_ALGO: unknown algorithm 'rign'"), std::string::npos) << e;
  unsetenv("DDL_ALGO");
  {
    ddlConfig_t named = DDL_CONFIG_INITIALIZER;
    named.algorithm = "shmm";
    e = errorOf([&] { resolveOptions(&named, 2); });
    EXPECT_NE(e.find("ddlConfig_t.algorithm: unknown algorithm 'shmm'"), std::string::npos) << e;
  }
  setenv("DDL_TIMEOUT_MS", "soon", 1);
  e = errorOf([] { resolveOptions(nullptr, 2); });
  EXPECT_NE(e.find("DDL_TIMEOUT_MS"), std::string::npos) << e;
  unsetenv("DDL_TIMEOUT_MS");
  ddlConfig_t cfg{};  // not initialised with DDL_CONFIG_INITIALIZER
  e = errorOf([&] { resolveOptions(&cfg, 2); });
  EXPECT_NE(e.find("DDL_CONFIG_INITIALIZER"), std::string::npos) << e;
}

// Byte counts take K, M and G suffixes (as ddl-bench's sizes do) and say their range when out of it.
TEST(Options, ByteCountsTakeSuffixesAndSayTheirRange) {
  setenv("DDL_SHM_ROUND_BYTES", "64K", 1);
  setenv("DDL_SEGMENT_BYTES", "1M", 1);
  Options o = resolveOptions(nullptr, 2);
  EXPECT_EQ(o.shm_round_bytes, size_t{64} << 10);
  EXPECT_EQ(o.segment_bytes, size_t{1} << 20);
  setenv("DDL_SEGMENT_BYTES", "300", 1);
  EXPECT_EQ(resolveOptions(nullptr, 2).segment_bytes, 300u);
  for (const char* bad : {"1", "abc", "64KB", "K", "-4K", "65M", "99999999999999999999G"}) {
    setenv("DDL_SHM_ROUND_BYTES", bad, 1);
    std::string e = errorOf([] { resolveOptions(nullptr, 2); });
    EXPECT_NE(e.find("DDL_SHM_ROUND_BYTES must be a byte count from 4096 to 67108864"), std::string::npos)
        << bad << ": " << e;
  }
  unsetenv("DDL_SHM_ROUND_BYTES");
  unsetenv("DDL_SEGMENT_BYTES");
}

// The stream-ordered collectives' settings: a typo is named, a slot is rounded to 16 bytes.
TEST(Options, DeviceSchemeAndNodeSlot) {
  EXPECT_EQ(resolveOptions(nullptr, 2).device_scheme, DeviceScheme::kAuto);
  setenv("DDL_DEVICE_SCHEME", "host", 1);
  EXPECT_EQ(resolveOptions(nullptr, 2).device_scheme, DeviceScheme::kHost);
  setenv("DDL_DEVICE_SCHEME", "kernal", 1);
  std::string e = errorOf([] { resolveOptions(nullptr, 2); });
  EXPECT_NE(e.find("DDL_DEVICE_SCHEME must be auto, kernel or host, got 'kernal'"), std::string::npos) << e;
  unsetenv("DDL_DEVICE_SCHEME");
  setenv("DDL_NODE_SLOT_BYTES", "100007", 1);
  EXPECT_EQ(resolveOptions(nullptr, 2).node_slot_bytes, 100000u);
  setenv("DDL_NODE_SLOT_BYTES", "1K", 1);
  e = errorOf([] { resolveOptions(nullptr, 2); });
  EXPECT_NE(e.find("DDL_NODE_SLOT_BYTES"), std::string::npos) << e;
  unsetenv("DDL_NODE_SLOT_BYTES");
  EXPECT_EQ(resolveOptions(nullptr, 2).node_blocks, 0) << "chosen at the setup";
  setenv("DDL_NODE_BLOCKS", "24", 1);
  EXPECT_EQ(resolveOptions(nullptr, 2).node_blocks, 24);
  setenv("DDL_NODE_BLOCKS", "65", 1);
  e = errorOf([] { resolveOptions(nullptr, 2); });
  EXPECT_NE(e.find("DDL_NODE_BLOCKS must be an integer in [8, 64], got '65'"), std::string::npos) << e;
  unsetenv("DDL_NODE_BLOCKS");
}

TEST(Options, WaitModeFromConfigOrDdlWait) {
  EXPECT_EQ(resolveOptions(nullptr, 2).wait, ddlWaitAuto);
  setenv("DDL_WAIT", "share", 1);
  EXPECT_EQ(resolveOptions(nullptr, 2).wait, ddlWaitShare);
  ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
  cfg.waitMode = ddlWaitSpin;  // the config wins
  EXPECT_EQ(resolveOptions(&cfg, 2).wait, ddlWaitSpin);
  setenv("DDL_WAIT", "lazy", 1);
  std::string e = errorOf([] { resolveOptions(nullptr, 2); });
  EXPECT_NE(e.find("DDL_WAIT must be auto, spin or share, got 'lazy'"), std::string::npos) << e;
  unsetenv("DDL_WAIT");
  cfg.waitMode = 7;
  e = errorOf([&] { resolveOptions(&cfg, 2); });
  EXPECT_NE(e.find("waitMode 7"), std::string::npos) << e;
}

// A program compiled against the version-1 header passes the shorter struct: accepted, waitMode unread.
TEST(Options, VersionOneConfigIsStillAccepted) {
  struct V1 {
    size_t size;
    unsigned int version;
    int timeoutMs;
    const char* topology;
    const char* algorithm;
    size_t segmentBytes;
  };
  struct {
    V1 v1;
    int garbage;  // where a version-2 struct has waitMode
  } padded{{sizeof(V1), 1, 4321, nullptr, nullptr, 0}, 99};
  const auto* cfg = reinterpret_cast<const ddlConfig_t*>(&padded);
  Options o = resolveOptions(cfg, 2);
  EXPECT_EQ(o.timeout_ms, 4321);
  EXPECT_EQ(o.wait, ddlWaitAuto);
}

// The job's secret: ddlConfig_t.secret, else DDL_JOB_SECRET, else none; one too long is refused, unquoted.
TEST(Options, SecretFromConfigOrDdlJobSecret) {
  unsetenv("DDL_JOB_SECRET");
  EXPECT_EQ(resolveOptions(nullptr, 2).secret, "");
  setenv("DDL_JOB_SECRET", "from-env", 1);
  EXPECT_EQ(resolveOptions(nullptr, 2).secret, "from-env");
  ddlConfig_t cfg = DDL_CONFIG_INITIALIZER;
  EXPECT_EQ(resolveOptions(&cfg, 2).secret, "from-env");  // NULL: the environment's
  cfg.secret = "";
  EXPECT_EQ(resolveOptions(&cfg, 2).secret, "from-env");  // "" too
  cfg.secret = "from-config";
  EXPECT_EQ(resolveOptions(&cfg, 2).secret, "from-config");
  const std::string long_secret(4097, 's');
  cfg.secret = long_secret.c_str();
  std::string e = errorOf([&] { resolveOptions(&cfg, 2); });
  EXPECT_NE(e.find("ddlConfig_t.secret is 4097 bytes long"), std::string::npos) << e;
  EXPECT_EQ(e.find("ssss"), std::string::npos) << "the message must not show the secret: " << e;
  setenv("DDL_JOB_SECRET", long_secret.c_str(), 1);
  e = errorOf([] { resolveOptions(nullptr, 2); });
  EXPECT_NE(e.find("DDL_JOB_SECRET is 4097 bytes long"), std::string::npos) << e;
  setenv("DDL_JOB_SECRET", std::string(4096, 's').c_str(), 1);
  EXPECT_EQ(resolveOptions(nullptr, 2).secret.size(), 4096u);
  unsetenv("DDL_JOB_SECRET");
}

// A program compiled against the version-2 header passes a struct that ends at waitMode: secret is not read.
TEST(Options, VersionTwoConfigIsStillAccepted) {
  struct V2 {
    size_t size;
    unsigned int version;
    int timeoutMs;
    const char* topology;
    const char* algorithm;
    size_t segmentBytes;
    int waitMode;
  };
  struct {
    V2 v2;
    const char* garbage;  // where a version-3 struct has secret
  } padded{{sizeof(V2), 2, 4321, nullptr, nullptr, 0, ddlWaitSpin}, "not-the-secret"};
  setenv("DDL_JOB_SECRET", "from-env", 1);
  const auto* cfg = reinterpret_cast<const ddlConfig_t*>(&padded);
  Options o = resolveOptions(cfg, 2);
  EXPECT_EQ(o.timeout_ms, 4321);
  EXPECT_EQ(o.wait, ddlWaitSpin);
  EXPECT_EQ(o.secret, "from-env");
  unsetenv("DDL_JOB_SECRET");
}

}  // namespace
}  // namespace ddl
