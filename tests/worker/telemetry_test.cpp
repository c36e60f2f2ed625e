// Rank telemetry end to end inside one process: libddl's reporter (comm/src/telemetry.h) sends over a real
// Unix datagram socket to the agent's TelemetryListener, which keeps the latest report per rank.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "telemetry.h"
#include "worker/telemetry_listener.h"

namespace {

using ddl::worker::TelemetryListener;

TEST(TelemetryTest, ParsesAReport) {
  std::string job;
  int attempt = 0, rank = -1;
  ddl::v1::RankProgress p;
  ASSERT_TRUE(TelemetryListener::parse(
      "ddl1 job=j-000007 attempt=2 rank=3 size=4 count=10 bytes=4096 seconds=0.5 last=allreduce last_bytes=1024 "
      "last_us=12.5 last_algo=mdring dims_us=3.0,9.5",
      &job, &attempt, &rank, &p));
  EXPECT_EQ(job, "j-000007");
  EXPECT_EQ(attempt, 2);
  EXPECT_EQ(rank, 3);
  EXPECT_EQ(p.world_size(), 4);
  EXPECT_EQ(p.collectives(), 10);
  EXPECT_EQ(p.last_algo(), "mdring");
  ASSERT_EQ(p.dims_us_size(), 2);
  EXPECT_DOUBLE_EQ(p.dims_us(1), 9.5);
  EXPECT_FALSE(TelemetryListener::parse("hello", &job, &attempt, &rank, &p));
  EXPECT_FALSE(TelemetryListener::parse("ddl1 rank=x", &job, &attempt, &rank, &p));
  EXPECT_FALSE(TelemetryListener::parse("ddl1 count=3", &job, &attempt, &rank, &p));  // no rank
  // Found by telemetry_fuzz (tests/fuzz/corpus/telemetry/not_utf8): a byte that is not UTF-8 in a string field
  // was kept, and the heartbeat carrying the report would not parse at the coordinator. Fails without the check.
  EXPECT_FALSE(TelemetryListener::parse("ddl1 rank=1 last=\xff", &job, &attempt, &rank, &p));
  EXPECT_FALSE(TelemetryListener::parse("ddl1 rank=1 last_algo=r\xc3", &job, &attempt, &rank, &p));
  EXPECT_FALSE(TelemetryListener::parse("ddl1 rank=1 job=\x01", &job, &attempt, &rank, &p));
  // Likewise (corpus/telemetry/nan): NaN and infinite times were taken. libddl measures them: never so.
  EXPECT_FALSE(TelemetryListener::parse("ddl1 rank=1 seconds=nan", &job, &attempt, &rank, &p));
  EXPECT_FALSE(TelemetryListener::parse("ddl1 rank=1 last_us=inf", &job, &attempt, &rank, &p));
  EXPECT_FALSE(TelemetryListener::parse("ddl1 rank=1 dims_us=1,-inf", &job, &attempt, &rank, &p));
}

TEST(TelemetryTest, LibddlReportsReachTheListener) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ddl-telemetry-" + std::to_string(getpid()) + ".sock")).string();
  std::string error;
  TelemetryListener listener(path, &error);
  ASSERT_EQ(error, "");
  setenv("DDL_AGENT_SOCKET", path.c_str(), 1);
  setenv("DDL_JOB_ID", "j-000042", 1);
  setenv("DDL_JOB_ATTEMPT", "1", 1);
  {
    auto reporter = ddl::Telemetry::fromEnv(/*rank=*/1, /*size=*/2);
    ASSERT_NE(reporter, nullptr);
    reporter->record(ddl::CollKind::kAllReduce, 1 << 20, 2, 0.001, {0.0004, 0.0006});
    reporter->record(ddl::CollKind::kAllReduce, 1 << 20, 2, 0.002, {0.0008, 0.0012});  // within 200 ms: kept
  }  // the destructor sends the final totals
  unsetenv("DDL_AGENT_SOCKET");
  std::optional<ddl::v1::RankProgress> p;
  for (int i = 0; i < 100 && !(p && p->collectives() == 2); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    p = listener.latest("j-000042", 1, 1);
  }
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->collectives(), 2);
  EXPECT_EQ(p->bytes(), 2 << 20);
  EXPECT_NEAR(p->last_us(), 2000, 1);
  EXPECT_EQ(p->last_op(), "allreduce");
  ASSERT_EQ(p->dims_us_size(), 2);
  EXPECT_NEAR(p->dims_us(1), 1200, 1);
  listener.forget("j-000042", 0);
  EXPECT_FALSE(listener.latest("j-000042", 1, 1).has_value());
}

// An agent restart: the listener's socket is replaced at the same path while the rank keeps running; the rank's
// later reports reach the new one.
TEST(TelemetryTest, ReportsReachAListenerRestartedAtTheSamePath) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ddl-telemetry-re-" + std::to_string(getpid()) + ".sock")).string();
  std::string error;
  auto first = std::make_unique<TelemetryListener>(path, &error);
  ASSERT_EQ(error, "");
  setenv("DDL_AGENT_SOCKET", path.c_str(), 1);
  setenv("DDL_JOB_ID", "j-000043", 1);
  setenv("DDL_JOB_ATTEMPT", "1", 1);
  auto reporter = ddl::Telemetry::fromEnv(/*rank=*/0, /*size=*/2);
  unsetenv("DDL_AGENT_SOCKET");
  ASSERT_NE(reporter, nullptr);
  first.reset();
  TelemetryListener second(path, &error);
  ASSERT_EQ(error, "");
  reporter->record(ddl::CollKind::kAllReduce, 4096, 0, 0.001, {});  // the first record is sent at once
  std::optional<ddl::v1::RankProgress> p;
  for (int i = 0; i < 100 && !p; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    p = second.latest("j-000043", 1, 0);
  }
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->collectives(), 1);
}

// Ranks run as their jobs' users: anyone may send, and the check (the agent's: is the sender in that rank's
// session?) decides which reports are believed, by the pid the kernel vouches for.
TEST(TelemetryTest, ReportsAreBelievedOnlyWhenTheSenderPassesTheCheck) {
  const std::string name = "ddl-telemetry-ck-" + std::to_string(getpid()) + ".sock";
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::mutex mu;
  std::vector<pid_t> senders;
  std::string error;
  TelemetryListener listener(path, &error, [&](const std::string& job, int, int, pid_t sender) {
    std::lock_guard<std::mutex> lock(mu);
    senders.push_back(sender);
    return job == "j-trusted";
  });
  ASSERT_EQ(error, "");
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  setenv("DDL_AGENT_SOCKET", path.c_str(), 1);
  setenv("DDL_JOB_ATTEMPT", "1", 1);
  // In this order: once the second is in, so was the first.
  for (const char* job : {"j-forged", "j-trusted"}) {
    setenv("DDL_JOB_ID", job, 1);
    auto reporter = ddl::Telemetry::fromEnv(/*rank=*/0, /*size=*/1);
    ASSERT_NE(reporter, nullptr);
    reporter->record(ddl::CollKind::kAllReduce, 4096, 0, 0.001, {});
  }
  unsetenv("DDL_AGENT_SOCKET");
  std::optional<ddl::v1::RankProgress> p;
  for (int i = 0; i < 100 && !p; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    p = listener.latest("j-trusted", 1, 0);
  }
  ASSERT_TRUE(p.has_value());
  EXPECT_FALSE(listener.latest("j-forged", 1, 0).has_value());
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(senders.empty());
  for (pid_t sender : senders) EXPECT_EQ(sender, getpid());
}

TEST(TelemetryTest, NoAgentMeansNoReporter) {
  setenv("DDL_AGENT_SOCKET", "/nonexistent/dir/agent.sock", 1);
  EXPECT_EQ(ddl::Telemetry::fromEnv(0, 1), nullptr);
  unsetenv("DDL_AGENT_SOCKET");
}

}  // namespace
