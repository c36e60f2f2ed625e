// What ddl-agent tells the coordinator about a rank (worker/rank_status.h), from real processes started by
// the Supervisor, with and without ddl-rank-shim: the exit code and error text of a program that could not be
// executed, the program's own pid, one of exit_code and signal.
#include "worker/rank_status.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

namespace ddl::worker {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

class RankStatusTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ddl-rank-status-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = fs::canonical(tmpl);
    Supervisor::Options options;
    options.state_dir = (dir_ / "state").string();
    if (GetParam()) options.shim_path = DDL_BIN_DIR "/ddl-rank-shim";
    sup_ = std::make_unique<Supervisor>(
        [this](const RankState& s) {
          std::lock_guard lock(mu_);
          exits_.push_back(s);
          cv_.notify_all();
        },
        options);
  }

  void TearDown() override {
    sup_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  RankSpec spec(int rank, std::vector<std::string> argv) {
    RankSpec s;
    s.job_id = "j1";
    s.attempt = 1;
    s.rank = rank;
    s.argv = std::move(argv);
    s.log_path = (dir_ / ("rank" + std::to_string(rank) + ".log")).string();
    return s;
  }

  // The exit report of `rank`, as the agent sends it.
  std::optional<v1::RankStatus> exitOf(int rank) {
    std::unique_lock lock(mu_);
    std::optional<v1::RankStatus> found;
    cv_.wait_for(lock, milliseconds(5000), [&] {
      for (const RankState& s : exits_) {
        if (s.rank == rank) found = rankStatus(s, "node-a");
      }
      return found.has_value();
    });
    return found;
  }

  fs::path dir_;
  std::unique_ptr<Supervisor> sup_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<RankState> exits_;
};

TEST_P(RankStatusTest, AProgramThatCannotBeExecutedIsNamedWithTheShellsExitCode) {
  fs::create_directories(dir_ / "bin");
  std::ofstream(dir_ / "bin" / "not-executable") << "#!/bin/sh\n";
  std::ofstream(dir_ / "bin" / "not-a-binary") << "echo no #! line\n";
  chmod((dir_ / "bin" / "not-a-binary").c_str(), 0755);
  RankSpec missing = spec(0, {"trian.py", "--epochs", "3"});
  missing.env = {{"PATH", (dir_ / "bin").string()}};
  const std::string denied = (dir_ / "bin" / "not-executable").string();
  const std::string not_binary = (dir_ / "bin" / "not-a-binary").string();
  std::string error;
  sup_->start(missing, &error);
  sup_->start(spec(1, {denied}), &error);
  sup_->start(spec(2, {not_binary}), &error);

  struct Want {
    int rank;
    int exit_code;
    std::string error;
  };
  for (const Want& want :
       {Want{0, 127,
             "cannot execute 'trian.py': No such file or directory (searched PATH=" +
                 (dir_ / "bin").string() + ")"},
        Want{1, 126, "cannot execute '" + denied + "': Permission denied"},
        Want{2, 126, "cannot execute '" + not_binary + "': Exec format error (a script needs a #! line)"}}) {
    auto status = exitOf(want.rank);
    ASSERT_TRUE(status.has_value()) << "rank " << want.rank;
    EXPECT_EQ(status->state(), v1::RankStatus::EXITED);
    ASSERT_TRUE(status->has_exit_code());
    EXPECT_EQ(status->exit_code(), want.exit_code);
    EXPECT_FALSE(status->has_signal());
    EXPECT_EQ(status->error(), want.error);
    EXPECT_EQ(status->program_pid(), 0);  // no program ever ran
    EXPECT_EQ(status->node(), "node-a");
    EXPECT_EQ(status->job_id(), "j1");
    EXPECT_EQ(status->attempt(), 1);
  }
}

TEST_P(RankStatusTest, ARankThatRanCarriesTheProgramsPidAndNoError) {
  const fs::path pid_file = dir_ / "pid";
  std::string error;
  RankState started =
      sup_->start(spec(0, {"sh", "-c", "echo $$ > " + pid_file.string() + "; exit 3"}), &error);
  ASSERT_EQ(error, "");
  v1::RankStatus running = rankStatus(started, "node-a");
  EXPECT_EQ(running.state(), v1::RankStatus::RUNNING);
  EXPECT_FALSE(running.has_exit_code());
  EXPECT_FALSE(running.has_signal());

  auto status = exitOf(0);
  ASSERT_TRUE(status.has_value());
  std::ifstream in(pid_file);
  int program = 0;
  in >> program;
  ASSERT_GT(program, 0);
  EXPECT_EQ(status->program_pid(), program);
  EXPECT_EQ(status->pid(), started.pid);
  EXPECT_EQ(GetParam(), status->pid() != status->program_pid());  // the shim leads the group
  EXPECT_EQ(status->exit_code(), 3);
  EXPECT_EQ(status->error(), "");
}

INSTANTIATE_TEST_SUITE_P(Launch, RankStatusTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Shim" : "Direct"; });

}  // namespace
}  // namespace ddl::worker
