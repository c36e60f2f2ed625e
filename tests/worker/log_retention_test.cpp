// Rank-log retention (worker/log_retention.h) over real directories in a temporary folder. Ages come from
// mtimes set with utimes() against a fixed "now", never from sleeping.
#include "worker/log_retention.h"

#include <gtest/gtest.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "worker/agent_config.h"

namespace {

namespace fs = std::filesystem;
using namespace ddl::worker;
using Clock = std::chrono::system_clock;
using std::chrono::hours;
using std::chrono::minutes;

class LogRetentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("ddl-log-retention-" + std::to_string(getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    logs_ = root_ / "logs";
    fs::create_directories(logs_);
    // Whole seconds: utimes() below is given seconds.
    now_ =
        Clock::time_point(std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()));
  }
  void TearDown() override { fs::remove_all(root_); }

  // logs/JOB/attempt-1/rank-R.log for each rank, `bytes` each, everything (files and directories) last
  // modified `age` before now.
  void makeJob(const std::string& job, std::chrono::seconds age, int ranks = 2, size_t bytes = 100) {
    const fs::path dir = logs_ / job / "attempt-1";
    fs::create_directories(dir);
    for (int r = 0; r < ranks; ++r)
      std::ofstream(dir / ("rank-" + std::to_string(r) + ".log")) << std::string(bytes, 'x');
    for (int r = 0; r < ranks; ++r) setAge(dir / ("rank-" + std::to_string(r) + ".log"), age);
    setAge(dir, age);
    setAge(logs_ / job, age);
  }
  void setAge(const fs::path& p, std::chrono::seconds age) {
    const auto t = std::chrono::duration_cast<std::chrono::seconds>((now_ - age).time_since_epoch()).count();
    timeval times[2] = {{static_cast<time_t>(t), 0}, {static_cast<time_t>(t), 0}};
    ASSERT_EQ(utimes(p.c_str(), times), 0) << p;
  }
  bool exists(const std::string& job) { return fs::exists(logs_ / job); }

  fs::path root_, logs_;
  Clock::time_point now_;
};

// Fails without the cleanup: no log was ever removed.
TEST_F(LogRetentionTest, OldLogsOfFinishedJobsGoOthersStay) {
  makeJob("j-000001", hours(24 * 8));   // finished a week and a day ago
  makeJob("j-000002", hours(24 * 6));   // younger than the retention
  makeJob("j-000003", hours(24 * 30));  // old, but a rank of it is still held here
  makeJob("j-000004", hours(24 * 8));
  // A job whose old logs were appended to a minute ago: its newest file decides.
  setAge(logs_ / "j-000004" / "attempt-1" / "rank-1.log", minutes(1));
  std::ofstream(logs_ / "stray.txt") << "not a job";
  setAge(logs_ / "stray.txt", hours(24 * 30));
  // A link named like a job, to a directory elsewhere: never followed.
  fs::create_directories(root_ / "elsewhere");
  std::ofstream(root_ / "elsewhere" / "keep.txt") << "keep";
  fs::create_directory_symlink(root_ / "elsewhere", logs_ / "j-000005");

  LogRetention retention;
  retention.max_age = hours(24 * 7);
  LogCleanup done = cleanRankLogs(logs_.string(), retention, {"j-000003"}, now_);
  EXPECT_EQ(done.removed, (std::vector<std::string>{"j-000001"}));
  EXPECT_EQ(done.bytes_removed, 200u);
  EXPECT_TRUE(done.errors.empty()) << done.errors.front();
  EXPECT_FALSE(exists("j-000001"));
  EXPECT_TRUE(exists("j-000002"));
  EXPECT_TRUE(exists("j-000003")) << "a live job's logs are never removed";
  EXPECT_TRUE(exists("j-000004"));
  EXPECT_TRUE(fs::exists(logs_ / "stray.txt"));
  EXPECT_TRUE(fs::exists(root_ / "elsewhere" / "keep.txt"));
  EXPECT_EQ(done.bytes_kept, 600u);

  // Once the job's ranks are released, the next round removes it.
  done = cleanRankLogs(logs_.string(), retention, {}, now_);
  EXPECT_EQ(done.removed, (std::vector<std::string>{"j-000003"}));
}

TEST_F(LogRetentionTest, SizeBoundRemovesTheLeastRecentlyWrittenFirst) {
  makeJob("j-000001", hours(3), 1, 1000);
  makeJob("j-000002", hours(2), 1, 1000);  // held: skipped, though older than j-000003
  makeJob("j-000003", hours(1), 1, 1000);
  makeJob("j-000004", minutes(1), 1, 1000);  // just launched: protected by kMinLogAge
  LogRetention retention;
  retention.max_bytes = 1500;
  LogCleanup done = cleanRankLogs(logs_.string(), retention, {"j-000002"}, now_);
  EXPECT_EQ(done.removed, (std::vector<std::string>{"j-000001", "j-000003"}));
  EXPECT_EQ(done.bytes_removed, 2000u);
  EXPECT_EQ(done.bytes_kept, 2000u) << "over the bound, but what is left is live or new";
  EXPECT_TRUE(exists("j-000002"));
  EXPECT_TRUE(exists("j-000004"));

  retention.max_bytes = 5000;  // under the bound: nothing to do
  EXPECT_TRUE(cleanRankLogs(logs_.string(), retention, {}, now_).removed.empty());
}

TEST_F(LogRetentionTest, NoBoundsKeepEverythingAndAMissingDirectoryIsNoError) {
  makeJob("j-000001", hours(24 * 365));
  LogCleanup done = cleanRankLogs(logs_.string(), LogRetention{}, {}, now_);
  EXPECT_TRUE(done.removed.empty());
  EXPECT_TRUE(exists("j-000001"));
  done = cleanRankLogs((root_ / "missing").string(), LogRetention{hours(1), 1}, {}, now_);
  EXPECT_TRUE(done.removed.empty());
  EXPECT_TRUE(done.errors.empty());
}

TEST(AgentConfigLogRetention, KeysParseAndAreChecked) {
  AgentConfig c;
  EXPECT_EQ(c.log_retention_hours, 168);
  EXPECT_EQ(c.log_max_mb, 0);
  ASSERT_TRUE(parseAgentConfig(R"({"log_retention_hours": 0.5, "log_max_mb": 2048})", "test", &c).isOk());
  EXPECT_EQ(c.log_retention_hours, 0.5);
  EXPECT_EQ(c.log_max_mb, 2048);
  EXPECT_TRUE(validateAgentConfig(c).isOk());
  c.log_retention_hours = -1;
  EXPECT_NE(validateAgentConfig(c).message().find("log_retention_hours"), std::string::npos);
  c.log_retention_hours = 0;
  c.log_max_mb = -5;
  EXPECT_NE(validateAgentConfig(c).message().find("log_max_mb"), std::string::npos);
  EXPECT_FALSE(parseAgentConfig(R"({"log_retention_hours": "a week"})", "test", &c).isOk());
}

// Issue 28 item 5: a full log disk cuts ranks' output silently; the agent says so. A tmpfs of 1 MiB filled
// up (where this runs as root) is a real full disk; the bounds around it are checked on any machine.
TEST_F(LogRetentionTest, AFullLogDiskIsSaid) {
  EXPECT_EQ(logDiskWarning(logs_.string(), 0), "");
  const std::string full = logDiskWarning(logs_.string(), uint64_t{1} << 62);
  EXPECT_NE(full.find("the rank logs' disk is full ("), std::string::npos) << full;
  EXPECT_NE(full.find(" MiB free in " + logs_.string() + ", under "), std::string::npos) << full;
  EXPECT_NE(full.find("ranks' output is being cut"), std::string::npos) << full;
  EXPECT_NE(logDiskWarning((root_ / "missing").string(), 1).find("cannot check the free space of"),
            std::string::npos);
  const fs::path small = root_ / "tmpfs";
  fs::create_directories(small);
  if (geteuid() != 0 ||
      std::system(("mount -t tmpfs -o size=1m ddl-test " + small.string() + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "skipped: the full-disk case needs root to mount a small tmpfs";
  EXPECT_EQ(logDiskWarning(small.string(), 512 << 10), "");              // 1 MiB empty
  { std::ofstream(small / "rank-0.log") << std::string(1 << 20, 'x'); }  // fills it (the write is cut)
  EXPECT_NE(logDiskWarning(small.string(), 512 << 10).find("(0 MiB free in " + small.string()),
            std::string::npos);
  EXPECT_EQ(std::system(("umount " + small.string()).c_str()), 0);
}

// Issue 39: a rank log cut by a full disk ended mid-line with no word; the agent's note goes on a line of its
// own after the cut, and after a whole line without an empty one.
TEST_F(LogRetentionTest, TheAgentsNotesStartALineOfTheirOwn) {
  const fs::path log = logs_ / "rank-0.log";
  { std::ofstream(log) << "epoch 3 loss 0.41\nepoch 4 lo"; }  // cut mid-line
  EXPECT_EQ(appendLogNote(log.string(), "[ddl-agent: the disk is full]"), "");
  EXPECT_EQ(appendLogNote(log.string(), "[ddl-agent: room again]\n"), "");
  std::ifstream in(log);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "epoch 3 loss 0.41\nepoch 4 lo\n[ddl-agent: the disk is full]\n[ddl-agent: room again]\n");
  EXPECT_NE(appendLogNote((logs_ / "missing.log").string(), "x").find("cannot open"), std::string::npos);
}

}  // namespace
