// Retention of rank logs on a node. The agent writes each rank's output to
// DATA_DIR/logs/JOB/attempt-N/rank-R.log and, without this, never deletes one, so a busy node's disk fills
// with the output of jobs finished long ago. cleanRankLogs() removes whole job directories:
//
//  - by age: a job directory whose newest file (or directory) was modified more than max_age ago;
//  - by size: while all job directories together hold more than max_bytes, the one whose newest change is
//    oldest goes first (least recently written, so least likely to be read).
//
// A job in `live_jobs` (one with a rank this node still holds: running, or exited and not yet released) is
// never removed, nor is a directory changed within the last kMinLogAge (a job being launched between the
// agent's snapshot of its ranks and this scan). Only directories directly under logs_dir are candidates;
// symbolic links are not followed (std::filesystem::remove_all removes a link, not what it points to), and
// anything that is not a directory is left alone.
//
// Cost: one stat per file under logs_dir per call; the agent calls it every few minutes from its own thread.
//
// Threads: a pure function over the file system; any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

namespace ddl::worker {

inline constexpr std::chrono::minutes kMinLogAge{10};

struct LogRetention {
  std::chrono::milliseconds max_age{0};  // 0: no bound by age
  uint64_t max_bytes = 0;                // 0: no bound by size
};

struct LogCleanup {
  std::vector<std::string> removed;  // job ids, in the order they were removed
  uint64_t bytes_removed = 0;
  uint64_t bytes_kept = 0;          // under logs_dir after the cleanup
  std::vector<std::string> errors;  // what could not be read or removed (left for the next round)
};

LogCleanup cleanRankLogs(const std::string& logs_dir, const LogRetention& retention,
                         const std::set<std::string>& live_jobs, std::chrono::system_clock::time_point now);

// A rank writes its output straight into its log, so on a full disk its lines are lost without a word: the
// agent checks the logs' file system every heartbeat and says so (its log, `ddlctl nodes`, the dashboard).
// "" while at least min_free_bytes are free to unprivileged writers (ranks run as their users); else the
// warning, naming the directory and what is free.
std::string logDiskWarning(const std::string& logs_dir, uint64_t min_free_bytes);

// Appends `note` to the rank log at `path` as a line of its own, after a newline where the log ends mid-line
// (as one cut by a full disk does): the agent's words in a rank's output (an OOM kill; output lost while the
// logs' disk was full, said when the agent sees it fill and again when it has room). The agent writes as
// root, so the file system's reserve may take a note the rank itself could no longer write. "" or why not.
std::string appendLogNote(const std::string& path, const std::string& note);

}  // namespace ddl::worker
