// The launch plan of one rank: what Supervisor::launch hands to fork and exec, computed from the rank's spec
// (its argv, env, working directory and the account it runs as, RankSpec::run_as), the agent's own
// environment and the agent's settings, without touching the system: no file, no descriptor, no clock. Tests
// check it field by field in microseconds (tests/unit/rank_launch_plan_test.cpp); the supervisor's tests
// check the same behaviour with real processes.
//
// planLaunch() checks the spec and gives the program's environment (the order and which value wins are
// below), the PATH that argv[0] is looked for in and the paths tried for it, in order. shimCommandLine()
// gives ddl-rank-shim's argv: it names the descriptors of the environment file and of the report pipe, which
// exist only once the plan's environment has been written, so it is a second call.
//
// Beside the plan, openRankLog() sets up the rank's log (its directory, the file, owner and mode): the one
// function here that touches the system, split out of Supervisor::launch like the plan so that launch keeps
// only fork, the launch report and the process table.
//
// Threads: plain functions of their arguments; any thread.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"
#include "common/status.h"
#include "run_as.h"
#include "supervisor.h"

namespace ddl::worker {

// Where argv[0] is looked for when the rank's environment has no PATH.
inline constexpr const char* kDefaultSearchPath = "/usr/local/bin:/usr/bin:/bin";

struct LaunchPlan {
  // The program's environment, KEY=VALUE: the agent's (agent_env, in its order), then the run-as account's
  // SHELL, the spec's entries in order, then the account's HOME, USER and LOGNAME (common/rank_env.h,
  // accountEnvironment), which nothing overrides. Each is applied as setenv would: a name already there keeps
  // its place and takes the new value, so a later entry for a name wins.
  std::vector<std::string> env;
  // The PATH argv[0] is looked for in: env's (its last PATH= entry), else kDefaultSearchPath.
  std::string search_path;
  // The paths to try for the program, in order, as execvp does: argv[0] itself if it has a '/', else
  // DIR/argv[0] for each DIR of search_path ("" is ".").
  std::vector<std::string> program_candidates;
};

// The plan for spec, given the agent's environment (KEY=VALUE, as in environ). Refused (invalid argument,
// with the reason as the message) for an empty argv or argv[0] ("empty command line") and for an env name
// that is empty or has a '=' ("invalid environment variable name 'A=B'").
StatusOr<LaunchPlan> planLaunch(const RankSpec& spec, const std::vector<std::string>& agent_env);

// What the shim is told besides the program's candidates and argv (rank_shim.cpp has the layout).
struct ShimChannels {
  std::string exit_record;  // where the shim writes how the rank ended
  int env_fd = -1;          // the environment file (NUL-separated LaunchPlan::env) the shim inherits
  int report_fd = -1;       // the write end of the supervisor's report pipe
};

// ddl-rank-shim's argv: shim_path, then --user UID:GID:GROUPS (with run_as), --workdir DIR (with a workdir),
// --env-fd FD, EXIT_RECORD, REPORT_FD, N and the N program candidates, "--", then spec.argv.
std::vector<std::string> shimCommandLine(const std::string& shim_path, const RankSpec& spec,
                                         const std::vector<std::string>& program_candidates,
                                         const ShimChannels& channels);

// Moves fd above 0..2: if the agent runs with a standard stream closed, a fresh descriptor can be 0, 1 or 2,
// and the child's dup2 onto the standard streams would then clobber it or leave it close-on-exec. Returns
// the descriptor to use (close-on-exec), or -1 with errno set, fd being closed in either case when it moved.
int aboveStdio(int fd);

// Opens the rank's log into *log for appending, above the standard streams and close-on-exec: /dev/null
// (write-only) for an empty path, else the file, created with its parent directories, mode 0600 (also when it
// was there before) and owned by `owner` where given (the agent's user otherwise); the directories stay the
// agent's. A symbolic link is refused (the file is about to be given away and chmod'ed). On failure returns
// the reason ("cannot open the log /x/rank-0.log: Permission denied"); *log then holds the file if it could
// be opened (its owner or mode could not be set), so that the reason can be written into it.
Status openRankLog(const std::string& path, const std::optional<Account>& owner, Fd* log);

}  // namespace ddl::worker
