// The launch plan of one rank (launch_plan.h): the environment, the PATH search and the shim's command line
// as pure functions, and the rank log's set-up beside them.
#include "launch_plan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <system_error>

#include "common/rank_env.h"
#include "launch_protocol.h"

namespace ddl::worker {
namespace {

std::string errnoText(int err) { return std::system_category().message(err); }

// Sets NAME=value in env as setenv would: in place where the name is there, else at the end.
void setEnv(std::vector<std::string>& env, const std::string& name, const std::string& value) {
  std::string prefix = name + "=";
  auto it = std::find_if(env.begin(), env.end(),
                         [&](const std::string& s) { return s.compare(0, prefix.size(), prefix) == 0; });
  if (it != env.end()) {
    *it = prefix + value;
  } else {
    env.push_back(prefix + value);
  }
}

}  // namespace

StatusOr<LaunchPlan> planLaunch(const RankSpec& spec, const std::vector<std::string>& agent_env) {
  if (spec.argv.empty() || spec.argv[0].empty()) return Status::invalidArgument("empty command line");
  for (const auto& [name, value] : spec.env) {
    if (name.empty() || name.find('=') != std::string::npos) {
      return Status::invalidArgument("invalid environment variable name '" + name + "'");
    }
  }

  // The environment: the agent's, then the run-as account's SHELL, the spec's entries in order, and the
  // account's HOME, USER and LOGNAME, which nothing overrides (see supervisor.h).
  LaunchPlan plan;
  plan.env = agent_env;
  RankAccountEnvironment account_env;
  if (spec.run_as) {
    account_env = accountEnvironment({spec.run_as->name, spec.run_as->home, spec.run_as->shell});
  }
  for (const auto& [name, value] : account_env.defaults) setEnv(plan.env, name, value);
  for (const auto& [name, value] : spec.env) setEnv(plan.env, name, value);
  for (const auto& [name, value] : account_env.identity) setEnv(plan.env, name, value);
  plan.search_path = kDefaultSearchPath;
  for (const auto& s : plan.env) {
    if (s.compare(0, 5, "PATH=") == 0) plan.search_path = s.substr(5);
  }

  const std::string& program = spec.argv[0];
  if (program.find('/') != std::string::npos) {
    plan.program_candidates.push_back(program);
  } else {
    const std::string& search_path = plan.search_path;
    size_t begin = 0;
    while (true) {
      size_t end = search_path.find(':', begin);
      std::string dir = search_path.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
      plan.program_candidates.push_back((dir.empty() ? "." : dir) + "/" + program);
      if (end == std::string::npos) break;
      begin = end + 1;
    }
  }
  return plan;
}

std::vector<std::string> shimCommandLine(const std::string& shim_path, const RankSpec& spec,
                                         const std::vector<std::string>& program_candidates,
                                         const ShimChannels& channels) {
  // The run-as ids, the working directory, the program's candidates and argv as its arguments (rank_shim.cpp
  // gives the layout).
  std::vector<std::string> args = {shim_path};
  if (spec.run_as) {
    args.insert(args.end(),
                {"--user", launch::formatIdentity(spec.run_as->uid, spec.run_as->gid, spec.run_as->groups)});
  }
  if (!spec.workdir.empty()) args.insert(args.end(), {"--workdir", spec.workdir});
  args.insert(args.end(), {"--env-fd", std::to_string(channels.env_fd)});
  args.push_back(channels.exit_record);
  args.insert(args.end(), {std::to_string(channels.report_fd), std::to_string(program_candidates.size())});
  args.insert(args.end(), program_candidates.begin(), program_candidates.end());
  args.push_back("--");
  args.insert(args.end(), spec.argv.begin(), spec.argv.end());
  return args;
}

int aboveStdio(int fd) {
  if (fd < 0 || fd > 2) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  int saved = errno;
  close(fd);
  errno = saved;
  return moved;
}

Status openRankLog(const std::string& path, const std::optional<Account>& owner, Fd* log) {
  log->reset();
  if (path.empty()) {
    log->reset(aboveStdio(open("/dev/null", O_WRONLY | O_CLOEXEC)));
    if (log->get() < 0) return Status::internal("cannot open /dev/null: " + errnoText(errno));
    return Status::ok();
  }
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) return Status::internal("cannot create the log directory " + parent.string() + ": " + ec.message());
  // O_NOFOLLOW: it is about to be given away and chmod'ed, so it must be the file it seems to be.
  log->reset(aboveStdio(open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600)));
  if (log->get() < 0) return Status::internal("cannot open the log " + path + ": " + errnoText(errno));
  // The owner's only, also when it was there before (an earlier start of the same rank).
  struct stat st {};
  if (fstat(log->get(), &st) == 0 && S_ISREG(st.st_mode)) {
    if (owner && (st.st_uid != owner->uid || st.st_gid != owner->gid) &&
        fchown(log->get(), owner->uid, owner->gid) != 0) {
      return Status::internal("cannot give the log " + path + " to " + describeAccount(*owner) + ": " +
                              errnoText(errno));
    }
    if ((st.st_mode & 07777) != 0600 && fchmod(log->get(), 0600) != 0) {
      return Status::internal("cannot make the log " + path + " private (0600): " + errnoText(errno));
    }
  }
  return Status::ok();
}

}  // namespace ddl::worker
