// Where a rank of ddlCommInitFromEnv comes from: the launcher's own variables, read in a fixed order, so that
// a libddl program starts unchanged under ddlrun and ddl-agent, torchrun, Slurm's srun and mpirun.
//
//   1. ddl (ddlrun, ddl-agent):  DDL_RANK, DDL_WORLD_SIZE, DDL_ROOT
//   2. torchrun (and anything that sets its variables):  RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; libddl's
//      store listens on MASTER_PORT + 1 (torch's own store has MASTER_PORT), or DDL_PORT
//   3. Slurm (srun):  SLURM_PROCID, SLURM_NTASKS; rank 0's host is the first of SLURM_JOB_NODELIST (srun puts
//      task 0 there), the port DDL_PORT, else 29400 + SLURM_JOB_ID mod 500 (the same on every task of the
//      job)
//   4. Open MPI (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE) and PMI launchers such as MPICH's hydra
//   (PMI_RANK,
//      PMI_SIZE): they name no host for rank 0, so DDL_ROOT (or MASTER_ADDR with DDL_PORT or MASTER_PORT)
//      must come with them, e.g. `mpirun -x DDL_ROOT=node1:29500`
//
// A set of variables counts when its rank and size are both set; the first such set decides, and a set that
// is incomplete or malformed is an error naming the variable (never a silent fall-through to the next
// launcher).
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace ddl {

struct LaunchEnv {
  int rank = 0;
  int size = 0;
  std::string root;    // HOST:PORT of rank 0's rendezvous store
  std::string source;  // "ddl", "torchrun", "slurm", "open-mpi", "pmi": which variables decided
};

// Reads the variables through `get` (empty: unset). Throws ddlInvalidArgument (ddl::Error) with what is
// missing or wrong, and which launchers' variables it looked for.
LaunchEnv launchEnvironment(const std::function<std::string(const char*)>& get);

// The first host of a Slurm hostlist ("node[01-04,07],gpu5" -> "node01"); empty for an empty or malformed
// one.
std::string firstSlurmHost(const std::string& nodelist);

}  // namespace ddl
