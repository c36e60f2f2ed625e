// ddlCommInitFromEnv's launchers (rendezvous/launch_env.h): which variables decide, in which order, and the
// errors for incomplete sets, table-driven; and Slurm's hostlist.
#include "rendezvous/launch_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "error.h"

namespace ddl {
namespace {

using Env = std::map<std::string, std::string>;

LaunchEnv resolve(const Env& env) {
  return launchEnvironment([&](const char* name) {
    auto it = env.find(name);
    return it == env.end() ? std::string() : it->second;
  });
}

struct Case {
  const char* what;
  Env env;
  int rank, size;
  const char* root;
  const char* source;
};

TEST(LaunchEnv, EachLauncherGivesRankSizeAndRoot) {
  const Case cases[] = {
      {"ddlrun",
       {{"DDL_RANK", "1"}, {"DDL_WORLD_SIZE", "4"}, {"DDL_ROOT", "h0:29500"}},
       1,
       4,
       "h0:29500",
       "ddl"},
      {"ddlrun also sets torchrun's names: ddl's win",
       {{"DDL_RANK", "1"},
        {"DDL_WORLD_SIZE", "4"},
        {"DDL_ROOT", "h0:29500"},
        {"RANK", "3"},
        {"WORLD_SIZE", "8"},
        {"MASTER_ADDR", "x"},
        {"MASTER_PORT", "1"}},
       1,
       4,
       "h0:29500",
       "ddl"},
      {"torchrun: the port after torch's",
       {{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}},
       2,
       3,
       "10.0.0.1:29501",
       "torchrun"},
      {"torchrun with DDL_PORT",
       {{"RANK", "0"},
        {"WORLD_SIZE", "2"},
        {"MASTER_ADDR", "fd00::1"},
        {"MASTER_PORT", "29500"},
        {"DDL_PORT", "40000"}},
       0,
       2,
       "[fd00::1]:40000",
       "torchrun"},
      {"torchrun under srun: torchrun's rank is the rank",
       {{"RANK", "5"},
        {"WORLD_SIZE", "8"},
        {"MASTER_ADDR", "n1"},
        {"MASTER_PORT", "29500"},
        {"SLURM_PROCID", "1"},
        {"SLURM_NTASKS", "2"},
        {"SLURM_JOB_NODELIST", "n[1-2]"}},
       5,
       8,
       "n1:29501",
       "torchrun"},
      {"srun",
       {{"SLURM_PROCID", "3"},
        {"SLURM_NTASKS", "4"},
        {"SLURM_JOB_NODELIST", "gpu[07-10]"},
        {"SLURM_JOB_ID", "1234"}},
       3,
       4,
       "gpu07:29634",
       "slurm"},
      {"srun with DDL_ROOT",
       {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"DDL_ROOT", "login:1"}},
       0,
       2,
       "login:1",
       "slurm"},
      {"mpirun -x DDL_ROOT",
       {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"DDL_ROOT", "h0:29500"}},
       1,
       2,
       "h0:29500",
       "open-mpi"},
      {"hydra with MASTER_ADDR and DDL_PORT",
       {{"PMI_RANK", "0"}, {"PMI_SIZE", "2"}, {"MASTER_ADDR", "h0"}, {"DDL_PORT", "29999"}},
       0,
       2,
       "h0:29999",
       "pmi"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    LaunchEnv e = resolve(c.env);
    EXPECT_EQ(e.rank, c.rank);
    EXPECT_EQ(e.size, c.size);
    EXPECT_EQ(e.root, c.root);
    EXPECT_EQ(e.source, c.source);
  }
}

TEST(LaunchEnv, IncompleteOrBadVariablesAreNamed) {
  const std::pair<Env, const char*> cases[] = {
      {{}, "no launcher's variables are set"},
      {{{"DDL_RANK", "0"}, {"DDL_WORLD_SIZE", "2"}}, "DDL_ROOT is not"},
      {{{"DDL_RANK", "0"}}, "DDL_WORLD_SIZE is not set but DDL_RANK is"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "MASTER_ADDR and MASTER_PORT are not"},
      {{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}, "RANK"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "65535"}}, "DDL_PORT"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "n[1"}}, "names no first host"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}, "mpirun -x DDL_ROOT"},
      {{{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}}, "PMI_RANK"},
  };
  for (const auto& [env, needle] : cases) {
    SCOPED_TRACE(needle);
    try {
      resolve(env);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ddlInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  }
}

TEST(LaunchEnv, SlurmHostlistsFirstHost) {
  EXPECT_EQ(firstSlurmHost("node1"), "node1");
  EXPECT_EQ(firstSlurmHost("node1,node2"), "node1");
  EXPECT_EQ(firstSlurmHost("node[01-04,07],gpu5"), "node01");
  EXPECT_EQ(firstSlurmHost("rack[3,5]-gpu[2-4]"), "rack3-gpu2");
  EXPECT_EQ(firstSlurmHost("gpu[7]"), "gpu7");
  EXPECT_EQ(firstSlurmHost(""), "");
  EXPECT_EQ(firstSlurmHost("[1-2]"), "");
  EXPECT_EQ(firstSlurmHost("n[1"), "");
}

}  // namespace
}  // namespace ddl
