// TelemetryHistory: what the dashboard plots, kept in memory as reports arrive.
//
// Per job, per rank: the rank's cumulative collective counters (bytes, seconds inside collectives, count of
// collectives) as RankProgress carried them, stamped with the coordinator's wall clock when the report
// arrived (agents' clocks may differ from ours; arrival time keeps every series on one axis). Rates are
// derived when asked for, between consecutive kept samples: bytes per wall second, and the fraction of wall
// time spent inside collectives. Keeping cumulative values, not rates, makes thinning exact: dropping every
// other sample leaves the rate between the kept ones the true average over the longer interval, so a long job
// keeps its whole history at a coarser step instead of losing its start. A rank whose counters go backwards
// (a new attempt) starts over.
//
// Per cluster: every kClusterIntervalMs (on the coordinator's tick) the GPUs in use, the GPUs on nodes that
// are not DOWN, and the jobs by state.
//
// Bounds (every container here is capped; figures for 32-byte samples):
//   - samples per rank: at most kMaxSamplesPerRank (240), fewer for big jobs so that one job holds at most
//     kJobSampleBudget (16384) samples = 512 KiB: a rank keeps clamp(16384 / ranks, 16, 240). Past its cap a
//     rank's samples are thinned to half (every other one dropped). Samples closer than kMinSpacingMs (1 s)
//     to the one before replace the newest instead of adding one.
//   - ranks per job: kMaxRanksPerJob (1024); reports of higher ranks are ignored.
//   - jobs: kMaxLiveJobs (256) live jobs tracked (a job past that is not plotted), and the kMaxEndedJobs (64)
//     that ended last. Worst case (320 jobs of 1024 ranks) about 160 MiB; a typical 8-rank job is under 64
//     KiB.
//   - cluster points: kMaxClusterPoints (720): an hour at one point per 5 s; the oldest point leaves first.
//
// Threads: a plain object with no lock; the Coordinator owns it and calls it on its loop thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ddl/v1/ddl.pb.h"

namespace ddl::coordinator {

// One rank's series, rates derived between consecutive samples (so one point fewer than samples kept).
struct RankSeries {
  int rank = 0;
  std::vector<int64_t> t_ms;          // unix ms at the end of each interval
  std::vector<double> bytes_per_s;    // collective bytes per wall second over the interval
  std::vector<double> busy_fraction;  // share of wall time inside collectives over the interval, 0..1
  std::vector<int64_t> collectives;   // cumulative count at t_ms
};

// One job's series: ranks in rank order, and the rank the dashboard names as slow.
struct JobSeries {
  std::string job;
  bool ended = false;  // the job has ended; its series no longer grows
  int attempt = 0;     // the launch attempt the series belongs to
  std::vector<RankSeries> ranks;
  int slow_rank = -1;    // -1: fewer than two ranks have figures
  std::string slow_why;  // in words, for the page
};

struct ClusterPoint {
  int64_t t_ms = 0;
  int gpus_used = 0;
  int gpus_total = 0;
  std::vector<int> jobs;  // by ClusterSeries::states; a point older than a state's first sight is shorter
};

struct ClusterSeries {
  std::vector<std::string> states;   // job state names, in the order they were first seen
  std::vector<ClusterPoint> points;  // oldest first
};

// A live job's totals for /metrics (ddl_job_*).
struct JobFigures {
  std::string job;
  int gpus = 0;
  double bytes = 0;         // sum over its ranks of their cumulative collective bytes (this attempt)
  double seconds = 0;       // the same for seconds inside collectives
  int ranks_reporting = 0;  // ranks with a report in the last kReportingWindowMs
};

class TelemetryHistory {
 public:
  static constexpr size_t kMaxSamplesPerRank = 240;
  static constexpr size_t kMinSamplesPerRank = 16;
  static constexpr size_t kJobSampleBudget = 16384;
  static constexpr int kMaxRanksPerJob = 1024;
  static constexpr size_t kMaxLiveJobs = 256;
  static constexpr size_t kMaxEndedJobs = 64;
  static constexpr size_t kMaxClusterPoints = 720;
  static constexpr int64_t kMinSpacingMs = 1000;
  static constexpr int64_t kClusterIntervalMs = 5000;
  static constexpr int64_t kReportingWindowMs = 30000;
  static constexpr size_t kSlowWindow = 3;  // intervals per rank the slow rank is judged on

  // A rank's progress arrived at `now_ms` (unix ms). Ignored for an ended job, a rank past the cap, or a new
  // job past kMaxLiveJobs.
  void recordRank(const std::string& job, int attempt, int rank, const v1::RankProgress& progress,
                  int64_t now_ms);

  // Whether a cluster point is due at `now_ms`.
  bool clusterDue(int64_t now_ms) const;
  // Adds a cluster point, and retires the jobs that `is_live` no longer calls live (their series stop
  // growing; the last kMaxEndedJobs are kept).
  void recordCluster(int64_t now_ms, int gpus_used, int gpus_total,
                     const std::map<std::string, int>& jobs_by_state,
                     const std::function<bool(const std::string&)>& is_live);

  // The job's series; an empty one (no ranks) when none is kept.
  JobSeries jobSeries(const std::string& job) const;
  ClusterSeries clusterSeries() const;
  // A job's totals as of `now_ms` (zeros when nothing is kept).
  JobFigures figures(const std::string& job, int gpus, int64_t now_ms) const;

  // For tests and the header's memory figure.
  size_t samplesKept() const;
  size_t jobsKept() const { return jobs_.size(); }

 private:
  struct Sample {
    int64_t t_ms;
    double bytes;
    double seconds;
    int64_t collectives;
  };
  struct JobEntry {
    int attempt = 0;
    bool ended = false;
    std::map<int, std::deque<Sample>> ranks;
  };
  size_t capPerRank(const JobEntry& job) const;
  static void thin(std::deque<Sample>& samples);

  std::map<std::string, JobEntry> jobs_;  // live (at most kMaxLiveJobs) and ended (at most kMaxEndedJobs)
  size_t live_ = 0;
  std::deque<std::string> ended_;         // ended jobs kept, oldest first
  std::vector<std::string> state_names_;  // at most the job states there are (a few)
  std::deque<ClusterPoint> points_;       // at most kMaxClusterPoints
};

// The slow rank among `ranks` from their latest kSlowWindow intervals: the lowest collective throughput;
// where throughputs are within 10% of each other (ranks in lockstep move the same bytes; reports carry a
// second of jitter), the least time in collectives (the others wait for it inside each collective). -1 with
// fewer than two ranks that have figures, when none moved bytes (idle), or in lockstep with times in
// collectives within 10 points of each other; `why` says which (empty for the first).
int slowRankOf(const std::vector<RankSeries>& ranks, std::string* why);

}  // namespace ddl::coordinator
