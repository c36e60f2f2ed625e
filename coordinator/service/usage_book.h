// UsageBook: the coordinator's accounting room (Slurm's sacct and sreport, issue 41). Each launch attempt's
// usage (state::AttemptUsage, kept in its job's record until the job's history is purged) is also added to a
// daily rollup per (UTC day, account, user), which outlives the job: GPU- and CPU-seconds spread over the
// days the attempt spanned, in proportion to its time in each; the counts (attempts, ended jobs, failures,
// requeues) and the peak memory on the day it ended.
//
// Each rollup is a Store entry usage_daily/<YYYY-MM-DD>:<account>:<user> (a '%', ':' or '/' in a name as
// %XX), written in the turn the attempt ended, in the batch of the job's move where they fit one transaction
// together, else in the batches after it: never before it, so a crash cannot book an attempt twice (the job
// would still be placed at recovery, and end again). All of them are read back at recovery. Bounded: days
// older than retention_days are dropped (from memory and the store) once a day, and at most max_rows rollups
// are kept (the oldest days go first).
//
// It also keeps, since this coordinator started, each account's GPU-seconds as the GPUs are held (charged
// with fair-share's usage, every second) for /metrics' ddl_account_gpu_seconds_total, and the ended attempts
// per account and how they ended. Accounts are the admins' (a bounded tree), so the label set stays small.
//
// Threads: the coordinator's loop only.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/utc_day.h"
#include "state/job.h"
#include "state/store.h"

namespace ddl::coordinator {

class Actor;

struct UsageOptions {
  int retention_days = 400;  // daily rollups older than this are dropped
  size_t max_rows = 200000;  // (day, account, user) rollups kept at most
};

// What a rollup (or a report's row) adds up.
struct UsageFigures {
  double gpu_s = 0;
  double cpu_s = 0;
  int64_t attempts = 0;  // attempts that ended
  int64_t jobs = 0;      // jobs that ended (the attempt was their last)
  int64_t failed = 0;    // jobs that ended FAILED or TIMEOUT
  int64_t requeued = 0;  // attempts that ended in a requeue (not a preemption)
  int64_t preempted = 0;  // attempts preempted
  int64_t max_rss_bytes = 0;

  void add(const UsageFigures& o);
  bool operator==(const UsageFigures&) const = default;
};

// The part of [start_ms, end_ms) in each UTC day it touches: (day, fraction), fractions summing to 1. An
// empty interval is all in end_ms's day.
std::vector<std::pair<int64_t, double>> spreadOverDays(int64_t start_ms, int64_t end_ms);

class UsageBook {
 public:
  UsageBook(Actor& actor, UsageOptions options);

  // Reads the stored rollups (recovery). Entries that are not rollups are reported and skipped.
  state::Status loadOnLoop(state::Store& store);

  // Books an ended attempt of a job charged to (account, user); `to`: where the job went (PENDING for a
  // requeue, else the state it ended in). Returns the rollups' writes, for the caller to store with the job's
  // move (Coordinator::putJobOnLoop: in its batch where they fit, never before it).
  std::vector<state::Write> bookOnLoop(const std::string& account, const std::string& user,
                                       const state::AttemptUsage& u, state::JobState to);
  // A rank's CPU time and peak memory heard of after its attempt was booked (ranks that exited after the
  // attempt ended: the others of a failed one), added to the day the attempt ended; its writes as above.
  std::vector<state::Write> bookLateOnLoop(const std::string& account, const std::string& user,
                                           const state::AttemptUsage& ended, double cpu_s,
                                           int64_t max_rss_bytes);
  // The GPU-seconds of the attempts booked on first_day or later, per (account, user): what GPU-hours limits
  // count of ended attempts (the caller adds the running ones). Kept until a rollup changes, so a scheduling
  // pass pays for the walk only after an attempt ended.
  using SpentByUser = std::map<std::pair<std::string, std::string>, double>;
  const SpentByUser& gpuSecondsSinceOnLoop(int64_t first_day) const;
  // GPU-seconds as they are held, per account (fair-share's charge), for /metrics.
  void chargeOnLoop(const std::string& account, double gpu_s);
  // Drops what is past retention (at most once a day; housekeeping calls it).
  void trimOnLoop(int64_t now_ms);

  struct Query {
    int64_t first_day = 0, last_day = 0;  // inclusive
    std::string account, user;            // "": any
    bool by_account = false;              // one row per account (user "") instead of per (account, user)
    bool daily = false;                   // one row per day too
  };
  struct Row {
    int64_t day = -1;  // -1: the period
    std::string account, user;
    UsageFigures figures;
  };
  std::vector<Row> reportOnLoop(const Query& q) const;
  // The first day whose rollups are all kept as of now_ms: retention's first day, or later where the cap on
  // rollups dropped days after it.
  int64_t firstDayKept(int64_t now_ms) const {
    return std::max(utcDayOf(now_ms) - options_.retention_days + 1, capped_through_ + 1);
  }

  // For /metrics, since this coordinator started: GPU-seconds held per account, and ended attempts per
  // (account, how they ended).
  const std::map<std::string, double>& liveGpuSeconds() const { return live_gpu_s_; }
  const std::map<std::pair<std::string, std::string>, int64_t>& attemptsEnded() const { return ended_; }

 private:
  using Key = std::tuple<int64_t, std::string, std::string>;  // day, account, user
  void addOnLoop(const Key& key, const UsageFigures& f, std::vector<state::Write>* writes);
  void dropOnLoop(std::map<Key, UsageFigures>::iterator it);

  Actor& actor_;
  const UsageOptions options_;
  std::map<Key, UsageFigures> rows_;  // day first: the oldest are at the front
  int64_t trimmed_day_ = -1;          // the day trimOnLoop last ran
  int64_t capped_through_ = -1;       // the latest day whose rollups the max_rows cap dropped
  std::map<std::string, double> live_gpu_s_;
  std::map<std::pair<std::string, std::string>, int64_t> ended_;
  uint64_t generation_ = 0;  // bumped whenever a rollup changes
  struct SpentCache {
    uint64_t generation = 0;  // generation_ when `spent` was summed
    SpentByUser spent;
  };
  mutable std::map<int64_t, SpentCache> spent_since_;  // by first day: one per period limits count over
};

}  // namespace ddl::coordinator
