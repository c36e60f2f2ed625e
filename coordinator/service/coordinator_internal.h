// What the files of the Coordinator's implementation share (coordinator.cpp: lifecycle, recovery, scheduling
// and launch; agents.cpp: the node registry and the agents' reports; elastic.cpp: elastic jobs' shrink and
// grow; user_calls.cpp: the users' calls and queries). Not for other code: the Coordinator's interface is
// coordinator.h.
#pragma once

#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"
#include "state/job.h"

namespace ddl::coordinator {

using state::JobState;

// Placed and not ended: SCHEDULED, STARTING or RUNNING.
inline bool isLive(JobState s) {
  return s == JobState::kScheduled || s == JobState::kStarting || s == JobState::kRunning;
}

inline bool exitedCleanly(const v1::RankStatus& r) {
  return r.state() == v1::RankStatus::EXITED && !r.has_signal() && r.exit_code() == 0;
}

// "rank 2" or "ranks 4, 5": the ranks a reason names.
inline std::string rankList(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace ddl::coordinator
