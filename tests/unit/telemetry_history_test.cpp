// TelemetryHistory: rates derived from cumulative counters, its bounds (samples, ranks, jobs, cluster
// points), thinning that keeps rates exact, retirement of ended jobs, and the slow rank.
#include "ddl/messages.h"
#include "service/telemetry_history.h"

#include <gtest/gtest.h>

namespace ddl::coordinator {
namespace {

v1::RankProgress progress(int64_t bytes, double seconds, int64_t collectives) {
  v1::RankProgress p;
  p.set_bytes(bytes);
  p.set_seconds(seconds);
  p.set_collectives(collectives);
  return p;
}

TEST(TelemetryHistory, RatesAreDerivedBetweenSamples) {
  TelemetryHistory h;
  h.recordRank("j-000001", 1, 0, progress(0, 0, 0), 10000);
  h.recordRank("j-000001", 1, 0, progress(2000000, 0.5, 10), 12000);  // 2 MB in 2 s, 0.5 s busy
  h.recordRank("j-000001", 1, 0, progress(5000000, 1.5, 25), 13000);  // 3 MB in 1 s, 1 s busy
  JobSeries s = h.jobSeries("j-000001");
  ASSERT_EQ(s.ranks.size(), 1u);
  const RankSeries& r = s.ranks[0];
  ASSERT_EQ(r.t_ms.size(), 2u);
  EXPECT_EQ(r.t_ms[0], 12000);
  EXPECT_DOUBLE_EQ(r.bytes_per_s[0], 1e6);
  EXPECT_DOUBLE_EQ(r.busy_fraction[0], 0.25);
  EXPECT_DOUBLE_EQ(r.bytes_per_s[1], 3e6);
  EXPECT_DOUBLE_EQ(r.busy_fraction[1], 1.0);
  EXPECT_EQ(r.collectives[1], 25);
  EXPECT_TRUE(h.jobSeries("j-000002").ranks.empty());
}

TEST(TelemetryHistory, ReportsCloserThanASecondReplaceTheNewest) {
  TelemetryHistory h;
  for (int i = 0; i <= 10; ++i)
    h.recordRank("j-1", 1, 0, progress(i * 100, 0, i), 1000 + i * 200);  // 2 s in all
  JobSeries s = h.jobSeries("j-1");
  ASSERT_EQ(s.ranks.size(), 1u);
  EXPECT_LE(s.ranks[0].t_ms.size(), 2u);
  EXPECT_EQ(s.ranks[0].t_ms.back(), 3000);
  EXPECT_EQ(s.ranks[0].collectives.back(), 10);
}

TEST(TelemetryHistory, ThinningKeepsTheBoundAndTheAverage) {
  TelemetryHistory h;
  // 1000 reports 1 s apart at a steady 1 MB/s: the rank keeps at most 240 samples and every rate stays 1
  // MB/s.
  for (int i = 0; i < 1000; ++i)
    h.recordRank("j-1", 1, 0, progress(int64_t{i} * 1000000, i * 0.5, i), i * 1000);
  EXPECT_LE(h.samplesKept(), TelemetryHistory::kMaxSamplesPerRank);
  EXPECT_GE(h.samplesKept(), TelemetryHistory::kMaxSamplesPerRank / 2);
  JobSeries s = h.jobSeries("j-1");
  const RankSeries& r = s.ranks[0];
  EXPECT_EQ(r.t_ms.back(), 999000);   // the newest is always kept
  EXPECT_LE(r.t_ms.front(), 500000);  // and so is the start: the series covers the whole run, coarser
  for (size_t i = 0; i < r.t_ms.size(); ++i) {
    EXPECT_NEAR(r.bytes_per_s[i], 1e6, 1e-3) << i;
    EXPECT_NEAR(r.busy_fraction[i], 0.5, 1e-9) << i;
  }
}

TEST(TelemetryHistory, BigJobsGetFewerSamplesPerRankAndRanksAreCapped) {
  TelemetryHistory h;
  for (int rank = 0; rank < TelemetryHistory::kMaxRanksPerJob + 10; ++rank) {
    for (int i = 0; i < 40; ++i) h.recordRank("j-big", 1, rank, progress(i, 0, i), i * 1000);
  }
  JobSeries s = h.jobSeries("j-big");
  EXPECT_EQ(s.ranks.size(), static_cast<size_t>(TelemetryHistory::kMaxRanksPerJob));
  EXPECT_LE(h.samplesKept(), TelemetryHistory::kJobSampleBudget + TelemetryHistory::kMaxRanksPerJob);
}

TEST(TelemetryHistory, CountersGoingBackOrANewAttemptStartOver) {
  TelemetryHistory h;
  h.recordRank("j-1", 1, 0, progress(1000, 1, 10), 1000);
  h.recordRank("j-1", 1, 0, progress(2000, 2, 20), 3000);
  h.recordRank("j-1", 1, 0, progress(10, 0.1, 1), 5000);  // restarted communicator
  EXPECT_TRUE(h.jobSeries("j-1").ranks[0].t_ms.empty());
  h.recordRank("j-1", 2, 1, progress(10, 0.1, 1), 6000);  // attempt 2: attempt 1's ranks are gone
  JobSeries s = h.jobSeries("j-1");
  EXPECT_EQ(s.attempt, 2);
  ASSERT_EQ(s.ranks.size(), 1u);
  EXPECT_EQ(s.ranks[0].rank, 1);
  h.recordRank("j-1", 1, 0, progress(5000, 5, 50), 7000);  // a late report of attempt 1 is ignored
  EXPECT_EQ(h.jobSeries("j-1").ranks.size(), 1u);
}

TEST(TelemetryHistory, EndedJobsRetireAndOnlyTheLast64AreKept) {
  TelemetryHistory h;
  for (int j = 0; j < 100; ++j) h.recordRank("j-" + std::to_string(j), 1, 0, progress(1, 1, 1), 1000);
  h.recordCluster(2000, 0, 4, {{"RUNNING", 1}}, [](const std::string& id) { return id == "j-99"; });
  EXPECT_EQ(h.jobsKept(), TelemetryHistory::kMaxEndedJobs + 1);
  EXPECT_TRUE(h.jobSeries("j-0").ranks.empty());  // ended first, forgotten first
  EXPECT_TRUE(h.jobSeries("j-98").ended);
  EXPECT_FALSE(h.jobSeries("j-99").ended);
  h.recordRank("j-98", 1, 0, progress(5, 5, 5), 9000);  // an ended job's series no longer grows
  EXPECT_TRUE(h.jobSeries("j-98").ranks[0].t_ms.empty());
}

TEST(TelemetryHistory, ARequeuedJobIsPlottedAgainWithItsNewAttempt) {
  TelemetryHistory h;
  h.recordRank("j-1", 1, 0, progress(1, 1, 1), 1000);
  h.recordCluster(2000, 0, 4, {}, [](const std::string&) { return false; });  // PENDING again: looks ended
  EXPECT_TRUE(h.jobSeries("j-1").ended);
  h.recordRank("j-1", 2, 0, progress(1, 1, 1), 3000);
  h.recordRank("j-1", 2, 0, progress(2, 2, 2), 5000);
  JobSeries s = h.jobSeries("j-1");
  EXPECT_FALSE(s.ended);
  EXPECT_EQ(s.attempt, 2);
  ASSERT_EQ(s.ranks.size(), 1u);
  EXPECT_EQ(s.ranks[0].t_ms.size(), 1u);
  h.recordCluster(9000, 0, 4, {}, [](const std::string&) { return false; });
  EXPECT_TRUE(h.jobSeries("j-1").ended);  // ended once more, and counted once among the ended
  for (int j = 0; j < 70; ++j) h.recordRank("k-" + std::to_string(j), 1, 0, progress(1, 1, 1), 10000);
  h.recordCluster(16000, 0, 4, {}, [](const std::string&) { return false; });
  EXPECT_EQ(h.jobsKept(), TelemetryHistory::kMaxEndedJobs);
}

TEST(TelemetryHistory, LiveJobsAreCapped) {
  TelemetryHistory h;
  for (size_t j = 0; j < TelemetryHistory::kMaxLiveJobs + 50; ++j) {
    h.recordRank("j-" + std::to_string(j), 1, 0, progress(1, 1, 1), 1000);
  }
  EXPECT_EQ(h.jobsKept(), TelemetryHistory::kMaxLiveJobs);
}

TEST(TelemetryHistory, ClusterPointsEveryFiveSecondsAndBounded) {
  TelemetryHistory h;
  EXPECT_TRUE(h.clusterDue(0));
  auto live = [](const std::string&) { return true; };
  h.recordCluster(1000, 2, 4, {{"PENDING", 1}, {"RUNNING", 1}}, live);
  EXPECT_FALSE(h.clusterDue(5999));
  EXPECT_TRUE(h.clusterDue(6000));
  h.recordCluster(6000, 4, 4, {{"PENDING", 0}, {"RUNNING", 2}, {"TIMEOUT", 1}}, live);
  ClusterSeries c = h.clusterSeries();
  ASSERT_EQ(c.points.size(), 2u);
  ASSERT_EQ(c.states.size(), 3u);
  EXPECT_EQ(c.states[2], "TIMEOUT");
  EXPECT_EQ(c.points[1].jobs[1], 2);
  EXPECT_EQ(c.points[1].gpus_used, 4);
  for (int i = 0; i < 2000; ++i) h.recordCluster(10000 + i * 5000, 1, 4, {{"RUNNING", 1}}, live);
  c = h.clusterSeries();
  EXPECT_EQ(c.points.size(), TelemetryHistory::kMaxClusterPoints);
  EXPECT_EQ(c.points.back().t_ms, 10000 + 1999 * 5000);
}

TEST(TelemetryHistory, FiguresSumTheRanksAndCountThoseReporting) {
  TelemetryHistory h;
  h.recordRank("j-1", 1, 0, progress(100, 1.5, 3), 1000);
  h.recordRank("j-1", 1, 1, progress(200, 2.5, 3), 50000);
  JobFigures f = h.figures("j-1", 4, 60000);
  EXPECT_EQ(f.gpus, 4);
  EXPECT_DOUBLE_EQ(f.bytes, 300);
  EXPECT_DOUBLE_EQ(f.seconds, 4.0);
  EXPECT_EQ(f.ranks_reporting, 1);  // rank 0 has been silent for 59 s
  EXPECT_EQ(h.figures("j-2", 1, 60000).bytes, 0);
}

TEST(TelemetryHistory, TheSlowRankIsTheSlowestOrTheOneTheOthersWaitFor) {
  TelemetryHistory h;
  for (int i = 0; i < 5; ++i) {
    for (int rank = 0; rank < 4; ++rank) {
      const int64_t per_s = rank == 2 ? 1000000 : 4000000;  // rank 2 moves a quarter of the bytes
      h.recordRank("j-1", 1, rank, progress(per_s * i, 0.5 * i, i), i * 1000);
    }
  }
  JobSeries s = h.jobSeries("j-1");
  EXPECT_EQ(s.slow_rank, 2);
  EXPECT_NE(s.slow_why.find("rank 2"), std::string::npos) << s.slow_why;
  EXPECT_NE(s.slow_why.find("lowest"), std::string::npos) << s.slow_why;

  // Lockstep (the same bytes everywhere), as when rank 1 sleeps before every all_reduce: rank 1 arrives last
  // and hardly waits (5% of its time in collectives), the others wait for it (94%). Rank 1 is named.
  TelemetryHistory lockstep;
  for (int i = 0; i < 5; ++i) {
    for (int rank = 0; rank < 3; ++rank) {
      lockstep.recordRank("j-1", 1, rank, progress(1000000 * i, (rank == 1 ? 0.05 : 0.94) * i, i), i * 1000);
    }
  }
  s = lockstep.jobSeries("j-1");
  EXPECT_EQ(s.slow_rank, 1) << s.slow_why;
  EXPECT_NE(s.slow_why.find("least time in collectives (5%"), std::string::npos) << s.slow_why;

  // Ranks alike (within 10 points): none is named, and why.
  TelemetryHistory alike;
  for (int i = 0; i < 5; ++i) {
    for (int rank = 0; rank < 3; ++rank) {
      alike.recordRank("j-1", 1, rank, progress(1000000 * i, (0.5 + 0.02 * rank) * i, i), i * 1000);
    }
  }
  s = alike.jobSeries("j-1");
  EXPECT_EQ(s.slow_rank, -1) << s.slow_why;
  EXPECT_NE(s.slow_why.find("alike"), std::string::npos) << s.slow_why;

  // Idle: the counters stand still (between phases, after the last collective): no slow rank.
  TelemetryHistory idle;
  for (int i = 0; i < 5; ++i) {
    for (int rank = 0; rank < 3; ++rank) {
      const int k = std::min(i, 1);  // one collective, then nothing
      idle.recordRank("j-1", 1, rank, progress(1000000 * k, (rank == 1 ? 0.1 : 0.9) * k, k), i * 1000);
    }
  }
  s = idle.jobSeries("j-1");
  EXPECT_EQ(s.slow_rank, -1) << s.slow_why;
  EXPECT_NE(s.slow_why.find("no rank ran collectives"), std::string::npos) << s.slow_why;

  TelemetryHistory one;
  one.recordRank("j-1", 1, 0, progress(1, 1, 1), 1000);
  one.recordRank("j-1", 1, 0, progress(2, 2, 2), 2000);
  EXPECT_EQ(one.jobSeries("j-1").slow_rank, -1);
}

TEST(Messages, TheStragglerIsTheRankThatSpentTheLeastTimeInCollectives) {
  auto job = [](std::vector<double> seconds) {
    v1::Job j;
    for (size_t r = 0; r < seconds.size(); ++r) {
      v1::RankStatus* s = j.add_ranks();
      s->set_rank(static_cast<int>(r));
      if (seconds[r] < 0) continue;  // no progress reported
      s->mutable_progress()->set_collectives(100);
      s->mutable_progress()->set_seconds(seconds[r]);
      s->mutable_progress()->set_last_us(r == 0 ? 900 : 10);  // the last collective's time does not decide
    }
    return j;
  };
  EXPECT_EQ(slowestRank(job({28.0, 1.5, 27.9})), 1);  // rank 1 slept before every collective
  EXPECT_EQ(slowestRank(job({10.0, 9.5, 9.8})), -1);  // alike: nobody stands out
  EXPECT_EQ(slowestRank(job({10.0})), -1);
  EXPECT_EQ(slowestRank(job({10.0, -1})), -1);
}

}  // namespace
}  // namespace ddl::coordinator
