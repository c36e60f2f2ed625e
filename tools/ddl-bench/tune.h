// ddl-bench --tune FILE: DDL's exploration mode as a tool. Every rank times every candidate allreduce setting
// (rhd; ring and mdring at several pipeline segment sizes) over the sweep, and rank 0 writes the fastest per
// size as rules of a tuning table (comm/src/algo/tune.h) that libddl reads from DDL_TUNE_FILE. Rules for other
// rank counts and topologies already in FILE are kept, so one file can hold the tables of 2, 3, 4... ranks.
//
// Each candidate is its own communicator (algorithm and segment size are fixed per communicator, and every rank
// must agree on them): the first meets at DDL_ROOT, each next one at a port rank 0 finds free and broadcasts
// over the previous one. Single-threaded, like the rest of ddl-bench.
#pragma once

#include <string>

#include "bench_common.h"
#include "ddl/ddl.h"

namespace ddlbench {

// Times ddlAllReduce: barrier, warmup, barrier, then the mean of `iters` calls, the slowest rank's (µs).
// Returns a negative value, after printing "ddl-bench: <who>: <libddl's error>", if a call failed.
double timeAllReduce(ddlComm_t comm, const std::string& who, const void* send, void* recv, size_t count,
                     ddlDataType_t type, ddlRedOp_t op, int warmup, int iters);

struct TuneOptions {
  bench_sweep sweep;
  ddlDataType_t type;
  size_t elem_size;
  ddlRedOp_t op;
  std::string path;  // the table to write (rank 0)
};

// Runs the exploration on this rank; returns ddl-bench's exit status (0, 2 when the file cannot be written,
// 3 on a libddl error).
int runTune(const TuneOptions& options);

}  // namespace ddlbench
