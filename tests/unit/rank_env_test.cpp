// common/rank_env: the variables every rank gets, from ddlrun and from the coordinator alike.
#include "common/rank_env.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/host_port.h"

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

// The variables added beside rankEnvironment's: a job of an array's (the coordinator) and the node's (the
// agent), so that every variable a rank gets is named in common/rank_env.
TEST(RankEnv, ArrayAndNodeVariables) {
  EXPECT_TRUE(arrayEnvironment("", 3).empty()) << "a job outside an array gets no array variables";
  using Env = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(arrayEnvironment("j-000040", 3),
            (Env{{"DDL_ARRAY_JOB_ID", "j-000040"}, {"DDL_ARRAY_INDEX", "3"}}));
  RankNodeSpec node;
  node.gpu = 2;
  EXPECT_EQ(nodeEnvironment(node), (Env{{"DDL_GPU", "2"}})) << "virtual GPUs: no CUDA_VISIBLE_DEVICES";
  node.gpu_uuid = "GPU-8c1b";
  node.agent_socket = "/run/ddl/telemetry.sock";
  EXPECT_EQ(nodeEnvironment(node), (Env{{"CUDA_VISIBLE_DEVICES", "GPU-8c1b"},
                                        {"DDL_GPU", "2"},
                                        {"DDL_AGENT_SOCKET", "/run/ddl/telemetry.sock"}}));
}

// The account a rank runs as: SHELL is a default (the job may pick another), HOME, USER and LOGNAME its
// identity (applied after the job's env, so the job cannot claim another).
TEST(RankEnv, AccountVariables) {
  using Env = std::vector<std::pair<std::string, std::string>>;
  RankAccountSpec account;
  account.name = "alice";
  account.home = "/home/alice";
  RankAccountEnvironment env = accountEnvironment(account);
  EXPECT_TRUE(env.defaults.empty()) << "an account without a shell leaves SHELL alone";
  EXPECT_EQ(env.identity, (Env{{"HOME", "/home/alice"}, {"USER", "alice"}, {"LOGNAME", "alice"}}));
  account.shell = "/bin/zsh";
  env = accountEnvironment(account);
  EXPECT_EQ(env.defaults, (Env{{"SHELL", "/bin/zsh"}}));
  EXPECT_EQ(env.identity, (Env{{"HOME", "/home/alice"}, {"USER", "alice"}, {"LOGNAME", "alice"}}));
}

}  // namespace
// What ddl sets itself, which a copied shell environment must not carry into a rank (ddlctl --export ALL).
TEST(RankEnv, RankVariablesAreTheOnesDdlSets) {
  for (const char* name : {"DDL_RANK", "DDL_ROOT", "DDL_JOB_SECRET", "DDL_GPU", "DDL_ARRAY_INDEX",
                           "DDL_ANYTHING", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                           "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"}) {
    EXPECT_TRUE(isRankVariable(name)) << name;
  }
  for (const char* name : {"PATH", "HOME", "USER", "SHELL", "LOGNAME", "CUDA_DEVICE_ORDER", "NCCL_DEBUG",
                           "ddl_rank", "RANKS", "", "DDL"}) {
    EXPECT_FALSE(isRankVariable(name)) << name;
  }
}

}  // namespace ddl

namespace ddl {
namespace {

// ddl-agent's environment reaches its ranks through an allow-list (issue 39: an agent started from a shell
// with DDL_TOKEN exported passed it to every user's ranks).
TEST(RankEnv, RanksInheritOnlyWhatTheAgentsAllowListNames) {
  const std::vector<std::string> agent = {"PATH=/usr/bin",
                                          "LC_ALL=C.UTF-8",
                                          "UCX_TLS=rc,sm",
                                          "DDL_TUNE_FILE=/etc/t",
                                          "DDL_TOKEN=ddl_x",
                                          "DDL_TOKEN_FILE=/t",
                                          "AWS_SECRET_KEY=k",
                                          "SITE_SCRATCH=/scr",
                                          "SLURM_JOB_ID=7",
                                          "https_proxy=http://p",
                                          "=odd",
                                          "NOEQUALS"};
  std::vector<std::string> withheld;
  EXPECT_EQ(inheritedEnvironment(agent, kAgentEnvAllowed, &withheld),
            (std::vector<std::string>{"PATH=/usr/bin", "LC_ALL=C.UTF-8", "UCX_TLS=rc,sm",
                                      "DDL_TUNE_FILE=/etc/t", "https_proxy=http://p"}));
  EXPECT_EQ(withheld, (std::vector<std::string>{"DDL_TOKEN", "DDL_TOKEN_FILE", "AWS_SECRET_KEY",
                                                "SITE_SCRATCH", "SLURM_JOB_ID"}));
  std::vector<std::string> more = kAgentEnvAllowed;
  more.insert(more.end(),
              {"SITE_SCRATCH", "SLURM_*", "DDL_*"});  // an operator's additions; credentials never
  EXPECT_EQ(
      inheritedEnvironment(agent, more),
      (std::vector<std::string>{"PATH=/usr/bin", "LC_ALL=C.UTF-8", "UCX_TLS=rc,sm", "DDL_TUNE_FILE=/etc/t",
                                "SITE_SCRATCH=/scr", "SLURM_JOB_ID=7", "https_proxy=http://p"}));
  EXPECT_EQ(agentEnvEntryProblem("SLURM_*"), "");
  EXPECT_EQ(agentEnvEntryProblem("HTTPS_PROXY"), "");
  for (const char* bad : {"", "*", "A-B", "1X", "A*B", "A B"})
    EXPECT_NE(agentEnvEntryProblem(bad), "") << bad;
}

// Every libddl setting README's table names reaches the ranks from the agent (an operator sets them for every
// rank of a node in /etc/default/ddl-agent), but those a rank's launch sets itself: one list, kept with
// README's.
TEST(RankEnv, EveryLibddlSettingInReadmePassesFromTheAgent) {
  std::ifstream in(std::string(DDL_SOURCE_DIR) + "/README.md");
  ASSERT_TRUE(in) << "cannot read README.md";
  const std::regex setting("^\\| `(DDL_[A-Z_]+)");
  std::set<std::string> names;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, setting)) names.insert(m[1]);
  }
  ASSERT_GE(names.size(), 8u) << "README's settings table was not found";
  // What a rank's launch sets itself (DDL_TOPOLOGY, DDL_AGENT_SOCKET, DDL_JOB_SECRET...) overrides the
  // agent's.
  const std::vector<std::string> launch = launchVariableNames();
  const std::set<std::string> launched(launch.begin(), launch.end());
  for (const std::string& name : names) {
    if (launched.count(name)) continue;
    EXPECT_EQ(inheritedEnvironment({name + "=x"}, kAgentEnvAllowed).size(), 1u)
        << name << " is a libddl setting in README that ranks would not get from the agent";
  }
}

}  // namespace
}  // namespace ddl
