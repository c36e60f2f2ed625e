// What the dashboard plots (telemetry_history.h), kept and thinned as rank reports arrive.
#include "service/telemetry_history.h"

#include <algorithm>
#include <cstdio>

namespace ddl::coordinator {

namespace {

std::string rate(double bytes_per_s) {
  char buf[64];
  if (bytes_per_s >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2f GB/s", bytes_per_s / 1e9);
  } else if (bytes_per_s >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.1f MB/s", bytes_per_s / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f kB/s", bytes_per_s / 1e3);
  }
  return buf;
}

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f%%", fraction * 100);
  return buf;
}

}  // namespace

// Thinned to half, the first and the newest kept: rates between kept samples stay exact averages.
void TelemetryHistory::thin(std::deque<Sample>& samples) {
  std::deque<Sample> kept;
  for (size_t i = 0; i < samples.size(); i += 2) kept.push_back(samples[i]);
  if (kept.back().t_ms != samples.back().t_ms) kept.push_back(samples.back());
  samples.swap(kept);
}

size_t TelemetryHistory::capPerRank(const JobEntry& job) const {
  const size_t ranks = std::max<size_t>(1, job.ranks.size());
  return std::clamp(kJobSampleBudget / ranks, kMinSamplesPerRank, kMaxSamplesPerRank);
}

void TelemetryHistory::recordRank(const std::string& id, int attempt, int rank,
                                  const v1::RankProgress& progress, int64_t now_ms) {
  if (rank < 0 || rank >= kMaxRanksPerJob) return;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) {
    if (live_ >= kMaxLiveJobs) return;
    it = jobs_.emplace(id, JobEntry{}).first;
    it->second.attempt = attempt;
    ++live_;
  }
  JobEntry& job = it->second;
  if (job.ended && attempt > job.attempt && live_ < kMaxLiveJobs) {
    // Requeued or restarted (it was PENDING at a cluster point, so it looked ended): live again.
    job.ended = false;
    ++live_;
    ended_.erase(std::find(ended_.begin(), ended_.end(), id));
  }
  if (job.ended || attempt < job.attempt) return;
  if (attempt > job.attempt) {  // a new launch: its ranks start from zero
    job.attempt = attempt;
    job.ranks.clear();
  }
  auto& samples = job.ranks[rank];
  const Sample s{now_ms, static_cast<double>(progress.bytes()), progress.seconds(), progress.collectives()};
  if (!samples.empty()) {
    const Sample& last = samples.back();
    if (s.bytes < last.bytes || s.seconds < last.seconds || s.collectives < last.collectives) {
      samples.clear();  // counters went backwards: a new communicator
    } else if (s.t_ms < last.t_ms) {
      return;  // the wall clock stepped back; keep the series monotonic
    }
  }
  // The newest sample moves forward until it is kMinSpacingMs past the one before; then a new one starts.
  if (samples.size() >= 2 && samples.back().t_ms - samples[samples.size() - 2].t_ms < kMinSpacingMs) {
    samples.back() = s;
  } else {
    samples.push_back(s);
  }
  const size_t cap = capPerRank(job);
  if (samples.size() == 1 && capPerRank(job) < kMaxSamplesPerRank) {
    // A new rank lowered every rank's cap: hold the job to its budget now, not at each rank's next report.
    for (auto& [r, other] : job.ranks) {
      while (other.size() > cap) thin(other);
    }
  }
  if (samples.size() > cap) thin(samples);
}

bool TelemetryHistory::clusterDue(int64_t now_ms) const {
  return points_.empty() || now_ms - points_.back().t_ms >= kClusterIntervalMs ||
         now_ms < points_.back().t_ms;
}

void TelemetryHistory::recordCluster(int64_t now_ms, int gpus_used, int gpus_total,
                                     const std::map<std::string, int>& jobs_by_state,
                                     const std::function<bool(const std::string&)>& is_live) {
  ClusterPoint p;
  p.t_ms = now_ms;
  p.gpus_used = gpus_used;
  p.gpus_total = gpus_total;
  for (const auto& [state, n] : jobs_by_state) {
    auto at = std::find(state_names_.begin(), state_names_.end(), state);
    if (at == state_names_.end()) {
      if (state_names_.size() >= 32) continue;  // job states are a handful; never grow without bound
      at = state_names_.insert(state_names_.end(), state);
    }
    const size_t i = static_cast<size_t>(at - state_names_.begin());
    if (p.jobs.size() <= i) p.jobs.resize(i + 1, 0);
    p.jobs[i] = n;
  }
  p.jobs.resize(state_names_.size(), 0);
  points_.push_back(std::move(p));
  while (points_.size() > kMaxClusterPoints) points_.pop_front();

  for (auto& [id, job] : jobs_) {
    if (job.ended || is_live(id)) continue;
    job.ended = true;
    --live_;
    ended_.push_back(id);
  }
  while (ended_.size() > kMaxEndedJobs) {
    jobs_.erase(ended_.front());
    ended_.pop_front();
  }
}

JobSeries TelemetryHistory::jobSeries(const std::string& id) const {
  JobSeries out;
  out.job = id;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return out;
  out.ended = it->second.ended;
  out.attempt = it->second.attempt;
  for (const auto& [rank, samples] : it->second.ranks) {
    RankSeries r;
    r.rank = rank;
    for (size_t i = 1; i < samples.size(); ++i) {
      const Sample& a = samples[i - 1];
      const Sample& b = samples[i];
      const double dt = std::max<int64_t>(1, b.t_ms - a.t_ms) / 1000.0;
      r.t_ms.push_back(b.t_ms);
      r.bytes_per_s.push_back((b.bytes - a.bytes) / dt);
      r.busy_fraction.push_back(std::clamp((b.seconds - a.seconds) / dt, 0.0, 1.0));
      r.collectives.push_back(b.collectives);
    }
    out.ranks.push_back(std::move(r));
  }
  out.slow_rank = slowRankOf(out.ranks, &out.slow_why);
  return out;
}

ClusterSeries TelemetryHistory::clusterSeries() const {
  return {state_names_, std::vector<ClusterPoint>(points_.begin(), points_.end())};
}

JobFigures TelemetryHistory::figures(const std::string& id, int gpus, int64_t now_ms) const {
  JobFigures f;
  f.job = id;
  f.gpus = gpus;
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return f;
  for (const auto& [rank, samples] : it->second.ranks) {
    if (samples.empty()) continue;
    f.bytes += samples.back().bytes;
    f.seconds += samples.back().seconds;
    if (now_ms - samples.back().t_ms <= kReportingWindowMs) ++f.ranks_reporting;
  }
  return f;
}

size_t TelemetryHistory::samplesKept() const {
  size_t n = 0;
  for (const auto& [id, job] : jobs_) {
    for (const auto& [rank, samples] : job.ranks) n += samples.size();
  }
  return n;
}

int slowRankOf(const std::vector<RankSeries>& ranks, std::string* why) {
  struct Figure {
    int rank;
    double bytes_per_s;
    double busy;
  };
  std::vector<Figure> figures;
  for (const auto& r : ranks) {
    const size_t n = std::min(r.t_ms.size(), TelemetryHistory::kSlowWindow);
    if (n == 0) continue;
    double bytes = 0, busy = 0;
    for (size_t i = r.t_ms.size() - n; i < r.t_ms.size(); ++i) {
      bytes += r.bytes_per_s[i];
      busy += r.busy_fraction[i];
    }
    figures.push_back({r.rank, bytes / n, busy / n});
  }
  why->clear();
  if (figures.size() < 2) return -1;
  double lo = figures[0].bytes_per_s, hi = lo, least_busy = figures[0].busy, most_busy = least_busy;
  for (const auto& f : figures) {
    lo = std::min(lo, f.bytes_per_s);
    hi = std::max(hi, f.bytes_per_s);
    least_busy = std::min(least_busy, f.busy);
    most_busy = std::max(most_busy, f.busy);
  }
  if (hi <= 0) {
    *why = "no rank ran collectives over its latest samples";
    return -1;
  }
  const bool lockstep = (hi - lo) <= 0.1 * hi;
  // In lockstep every rank waits inside each collective for the last one to arrive: the straggler is the rank
  // that waits least, i.e. spends the least time in collectives. Within 10 points of each other, none is named.
  if (lockstep && most_busy - least_busy < 0.1) {
    *why = "ranks alike: throughput " + rate(hi) + ", " + percent(least_busy) + " to " + percent(most_busy) +
           " of their time in collectives";
    return -1;
  }
  const Figure* slow = &figures[0];
  for (const auto& f : figures) {
    if (lockstep ? f.busy < slow->busy : f.bytes_per_s < slow->bytes_per_s) slow = &f;
  }
  const std::string r = "rank " + std::to_string(slow->rank);
  if (lockstep) {
    *why = r + " spent the least time in collectives (" + percent(slow->busy) + " against up to " +
           percent(most_busy) + ") over its latest samples: the others wait for it there; throughput is alike " +
           "on every rank (" + rate(hi) + ")";
  } else {
    *why = r + " has the lowest collective throughput over its latest samples: " + rate(slow->bytes_per_s) +
           " against up to " + rate(hi) + " (" + percent(slow->busy) + " of its time in collectives)";
  }
  return slow->rank;
}

}  // namespace ddl::coordinator
