// The launch plan: what a placed job's attempt sends to each of its nodes, as a pure function.
//
// Given the job, its allocation and ring layout, the rendezvous address (rank 0's node and port) and the
// attempt's secret, startCommands() builds one StartRanks per node: the command, workdir and user, and per
// rank its GPU, local rank, CPUs, memory and environment. The environment is the user's variables first and
// ddl's own after them (common/rank_env.h: rank, world, topology, rendezvous, secret; the array's variables),
// so a stray RANK in a job's env cannot break the job. The coordinator records STARTING, then sends these.
//
// rootPort() picks the rendezvous port pair for a job rooted on a node: from a slot derived from the job's
// number (a restarted coordinator computes the same port for a job still running), skipping the slots that
// other live jobs rooted there hold.
//
// No I/O, no clock, no randomness (the secret is an argument): tests build a plan and compare it field by
// field.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"
#include "placement/placement.h"
#include "placement/ring_layout.h"
#include "state/job.h"

namespace ddl::coordinator {

struct LaunchTarget {
  int attempt = 0;
  std::string root_address;  // rank 0's node, as agents and ranks reach it
  int port = 0;              // DDL_ROOT's port; MASTER_PORT is port + 1
  std::string secret;        // the attempt's rendezvous secret (newJobSecret)
  bool allow_root = false;   // the operator allows jobs of root (StartRanks.allow_root)
};

// One StartRanks command per node of the layout, by node name.
std::map<std::string, v1::Command> startCommands(const state::Job& job,
                                                 const placement::Allocation& allocation,
                                                 const placement::RingLayout& layout,
                                                 const LaunchTarget& target);

// An elastic job's new ranks (elastic.cpp): StartRanks for each joiner's node, each rank's environment as
// startCommands makes it (DDL_RANK and RANK are its launch slot, WORLD_SIZE the size the job grows to, no
// DDL_TOPOLOGY) and DDL_JOIN=1 last: the program joins the running ranks (ddlCommJoin, torch_ddl.elastic)
// and learns its rank there. `allocation` is the job's with the joiners' GPUs.
std::map<std::string, v1::Command> joinCommands(const state::Job& job,
                                                const placement::Allocation& allocation,
                                                const std::vector<placement::RankSlot>& joiners,
                                                int world_size, const LaunchTarget& target);

// The ranks of an attempt as the job keeps them until their agents report: rank, attempt, node and GPU, in
// rank order.
std::vector<state::RankResult> placedRanks(const placement::RingLayout& layout, int attempt);

// The first port of the pair for `job` in [first, last] (pairs: first, first + 2, ...); `taken(port)` says
// whether another live job rooted on the same node holds it. When every pair is taken, the job's own slot.
int rootPort(const std::string& job, int first, int last, const std::function<bool(int port)>& taken);

}  // namespace ddl::coordinator
