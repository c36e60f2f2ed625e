// The agent's launch plan of a rank (worker/launch_plan.h) as pure functions: the program's environment (its
// order and which value wins), the PATH search's candidates, the refusals and the shim's command line, with
// no process started; and the rank log's set-up beside it, in a temporary directory. supervisor_test checks
// the same behaviour through real processes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "launch_plan.h"

namespace ddl::worker {
namespace {

using Strings = std::vector<std::string>;

RankSpec rank(Strings argv) {
  RankSpec spec;
  spec.job_id = "j-000042";
  spec.attempt = 1;
  spec.rank = 0;
  spec.argv = std::move(argv);
  return spec;
}

Account alice(std::string shell) {
  Account account;
  account.name = "alice";
  account.uid = 1001;
  account.gid = 1001;
  account.groups = {1001, 27};
  account.home = "/home/alice";
  account.shell = std::move(shell);
  return account;
}

LaunchPlan planned(const RankSpec& spec, const Strings& agent_env) {
  StatusOr<LaunchPlan> plan = planLaunch(spec, agent_env);
  EXPECT_TRUE(plan.isOk()) << plan.status().toString();
  return plan.isOk() ? *plan : LaunchPlan{};
}

// The agent's variables keep their places; the account's SHELL comes before the job's env (which may replace
// it), the job's entries apply in order (the later wins, a new name goes at the end), and the account's HOME,
// USER and LOGNAME come last, whatever the job said.
TEST(RankLaunchPlan, EnvironmentOrderAndWhichValueWins) {
  RankSpec spec = rank({"train"});
  spec.run_as = alice("/bin/zsh");
  spec.env = {{"A", "job"},  {"HOME", "/tmp/evil"}, {"SHELL", "/bin/bash"}, {"NEW", "1"},
              {"A", "job2"}, {"USER", "root"},      {"B", "x=y"},           {"PATHX", "p"}};
  const Strings agent_env = {"PATH=/agent/bin", "HOME=/root", "SHELL=/bin/sh", "A=agent", "LANG=C"};
  EXPECT_EQ(planned(spec, agent_env).env,
            (Strings{"PATH=/agent/bin", "HOME=/home/alice", "SHELL=/bin/bash", "A=job2", "LANG=C", "NEW=1",
                     "USER=alice", "B=x=y", "PATHX=p", "LOGNAME=alice"}));
  EXPECT_EQ(planned(spec, agent_env).search_path, "/agent/bin") << "PATHX is not PATH";

  // The account's shell where the job sets none; an account without one leaves the agent's.
  spec.env.clear();
  EXPECT_EQ(planned(spec, agent_env).env, (Strings{"PATH=/agent/bin", "HOME=/home/alice", "SHELL=/bin/zsh",
                                                   "A=agent", "LANG=C", "USER=alice", "LOGNAME=alice"}));
  spec.run_as = alice("");
  EXPECT_EQ(planned(spec, agent_env).env, (Strings{"PATH=/agent/bin", "HOME=/home/alice", "SHELL=/bin/sh",
                                                   "A=agent", "LANG=C", "USER=alice", "LOGNAME=alice"}));

  // Without run_as the job's HOME and USER stand (the rank runs as the agent's user).
  spec.run_as.reset();
  spec.env = {{"HOME", "/scratch"}, {"USER", "bob"}};
  EXPECT_EQ(planned(spec, agent_env).env,
            (Strings{"PATH=/agent/bin", "HOME=/scratch", "SHELL=/bin/sh", "A=agent", "LANG=C", "USER=bob"}));
}

// argv[0] without a '/' is tried in each directory of the PATH in force (the job's over the agent's, else the
// default), an empty directory meaning "."; with a '/', as it is.
TEST(RankLaunchPlan, PathCandidates) {
  RankSpec spec = rank({"train", "--lr=0.1"});
  LaunchPlan plan = planned(spec, {"LANG=C"});
  EXPECT_EQ(plan.search_path, kDefaultSearchPath);
  EXPECT_EQ(plan.program_candidates, (Strings{"/usr/local/bin/train", "/usr/bin/train", "/bin/train"}));

  plan = planned(spec, {"PATH=/agent/bin:/usr/bin"});
  EXPECT_EQ(plan.search_path, "/agent/bin:/usr/bin");
  EXPECT_EQ(plan.program_candidates, (Strings{"/agent/bin/train", "/usr/bin/train"}));

  // An environ with PATH twice (possible, not usual): the search takes the last, as it always has.
  EXPECT_EQ(planned(spec, {"PATH=/first", "PATH=/second"}).search_path, "/second");

  spec.env = {{"PATH", "/opt/a::/opt/b:"}};
  plan = planned(spec, {"PATH=/agent/bin:/usr/bin"});
  EXPECT_EQ(plan.search_path, "/opt/a::/opt/b:");
  EXPECT_EQ(plan.program_candidates, (Strings{"/opt/a/train", "./train", "/opt/b/train", "./train"}));

  spec.argv = {"./bin/run.sh"};
  EXPECT_EQ(planned(spec, {}).program_candidates, (Strings{"./bin/run.sh"}));
  spec.argv = {"/usr/bin/python3", "train.py"};
  EXPECT_EQ(planned(spec, {}).program_candidates, (Strings{"/usr/bin/python3"}));
}

TEST(RankLaunchPlan, RefusesWhatCannotBeExecuted) {
  auto refusal = [](const RankSpec& spec) {
    StatusOr<LaunchPlan> plan = planLaunch(spec, {"PATH=/usr/bin"});
    EXPECT_FALSE(plan.isOk());
    return plan.isOk() ? std::string("(planned)") : plan.status().message();
  };
  EXPECT_EQ(refusal(rank({})), "empty command line");
  EXPECT_EQ(refusal(rank({"", "x"})), "empty command line");
  RankSpec spec = rank({"train"});
  spec.env = {{"GOOD", "1"}, {"A=B", "2"}};
  EXPECT_EQ(refusal(spec), "invalid environment variable name 'A=B'");
  spec.env = {{"", "2"}};
  EXPECT_EQ(refusal(spec), "invalid environment variable name ''");
}

// The shim's argv in rank_shim.cpp's layout: options, EXIT_RECORD REPORT_FD N CANDIDATES... -- ARGV...
TEST(RankLaunchPlan, ShimCommandLine) {
  RankSpec spec = rank({"train", "--lr", "0.1"});
  const Strings candidates = {"/a/train", "/b/train"};
  const ShimChannels channels{"/state/j-000042/attempt-1/rank-0.exit", 5, 7};
  EXPECT_EQ(
      shimCommandLine("/usr/libexec/ddl/ddl-rank-shim", spec, candidates, channels),
      (Strings{"/usr/libexec/ddl/ddl-rank-shim", "--env-fd", "5", "/state/j-000042/attempt-1/rank-0.exit",
               "7", "2", "/a/train", "/b/train", "--", "train", "--lr", "0.1"}));

  spec.run_as = alice("/bin/zsh");
  spec.workdir = "/home/alice/run";
  EXPECT_EQ(shimCommandLine("/usr/libexec/ddl/ddl-rank-shim", spec, candidates, channels),
            (Strings{"/usr/libexec/ddl/ddl-rank-shim", "--user", "1001:1001:1001,27", "--workdir",
                     "/home/alice/run", "--env-fd", "5", "/state/j-000042/attempt-1/rank-0.exit", "7", "2",
                     "/a/train", "/b/train", "--", "train", "--lr", "0.1"}));
}

// The log: its directories are made, an old file is made private again, a symbolic link is refused with the
// reason, and an empty path is /dev/null. Every descriptor is above the standard streams.
TEST(RankLaunchPlan, RankLog) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("rank_launch_plan_test." + std::to_string(getpid()));
  fs::remove_all(dir);
  const std::string path = (dir / "logs/j-000042/attempt-1/rank-0.log").string();

  Fd log;
  Status opened = openRankLog(path, std::nullopt, &log);
  ASSERT_TRUE(opened.isOk()) << opened.toString();
  EXPECT_GT(log.get(), 2);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);

  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  opened = openRankLog(path, std::nullopt, &log);
  ASSERT_TRUE(opened.isOk()) << opened.toString();
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "an earlier start's log is made private again";

  const std::string link = (dir / "logs/j-000042/attempt-1/rank-1.log").string();
  fs::create_symlink(path, link);
  opened = openRankLog(link, std::nullopt, &log);
  EXPECT_FALSE(opened.isOk());
  EXPECT_EQ(opened.message().rfind("cannot open the log " + link + ": ", 0), 0u) << opened.message();
  EXPECT_LT(log.get(), 0);

  opened = openRankLog("", std::nullopt, &log);
  ASSERT_TRUE(opened.isOk()) << opened.toString();
  EXPECT_GT(log.get(), 2);
  EXPECT_EQ(fcntl(log.get(), F_GETFL) & O_ACCMODE, O_WRONLY);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ddl::worker
