// How ddl-agent reports a rank to the coordinator: a Supervisor RankState as a RankStatus message. Kept apart
// from the Agent so that what the coordinator receives (exit code, signal, error text, pids) is tested with
// real processes and no coordinator.
//
// Threads: a pure function.
#pragma once

#include <string>

#include "ddl/v1/ddl.pb.h"
#include "worker/supervisor.h"

namespace ddl::worker {

// Everything but progress (the agent adds the rank's telemetry). An exited rank carries exactly one of
// exit_code and signal; error is RankState::error ("cannot execute 'train.py': No such file or directory"
// for a rank that could not be started); node is this agent's node name.
v1::RankStatus rankStatus(const RankState& state, const std::string& node);

}  // namespace ddl::worker
