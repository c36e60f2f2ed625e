// common/rank_env: the variables every rank gets, from ddlrun and from the coordinator alike.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/host_port.h"
#include "common/rank_env.h"

namespace ddl {
namespace {

TEST(RankEnv, LibddlsAndTorchsRendezvousGetTheirOwnPorts) {
  RankEnvSpec spec;
  spec.rank = 5;
  spec.world_size = 8;
  spec.local_rank = 1;
  spec.local_size = 2;
  spec.topology = "2x4";
  spec.root_host = "10.0.0.1";
  spec.root_port = 40000;
  spec.master_port = 40001;
  spec.job_id = "j-000007";
  spec.attempt = 2;
  spec.secret = "00ff";
  const auto env = rankEnvironment(spec);
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m.size(), env.size()) << "a variable appears twice";
  EXPECT_EQ(m["DDL_RANK"], "5");
  EXPECT_EQ(m["DDL_WORLD_SIZE"], "8");
  EXPECT_EQ(m["DDL_LOCAL_RANK"], "1");
  EXPECT_EQ(m["DDL_LOCAL_SIZE"], "2");
  EXPECT_EQ(m["DDL_TOPOLOGY"], "2x4");
  EXPECT_EQ(m["DDL_ROOT"], "10.0.0.1:40000");
  EXPECT_EQ(m["DDL_JOB_ID"], "j-000007");
  EXPECT_EQ(m["DDL_JOB_ATTEMPT"], "2");
  EXPECT_EQ(m["DDL_JOB_SECRET"], "00ff");
  EXPECT_EQ(m["RANK"], "5");
  EXPECT_EQ(m["WORLD_SIZE"], "8");
  EXPECT_EQ(m["LOCAL_RANK"], "1");
  EXPECT_EQ(m["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(m["MASTER_ADDR"], "10.0.0.1");
  EXPECT_EQ(m["MASTER_PORT"], "40001");
}

TEST(RankEnv, OptionalVariablesAreLeftOutAndIpv6IsBracketed) {
  RankEnvSpec spec;
  spec.root_host = "fd00::1";
  spec.root_port = 29500;
  spec.master_port = 29501;
  const auto env = rankEnvironment(spec);
  std::map<std::string, std::string> m(env.begin(), env.end());
  EXPECT_EQ(m.count("DDL_TOPOLOGY"), 0u);
  EXPECT_EQ(m.count("DDL_JOB_ID"), 0u);
  EXPECT_EQ(m.count("DDL_JOB_SECRET"), 0u);
  EXPECT_EQ(m["DDL_ROOT"], "[fd00::1]:29500");
  EXPECT_EQ(m["MASTER_ADDR"], "fd00::1");  // what torch's env:// takes
  EXPECT_EQ(formatHostPort("[fd00::1]", 1), "[fd00::1]:1");
  EXPECT_EQ(formatHostPort("node7", 1), "node7:1");
}

TEST(RankEnv, JobSecretsAreFreshAndHex) {
  const std::string a = newJobSecret(), b = newJobSecret();
  ASSERT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace ddl
