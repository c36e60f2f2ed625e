// Confinement: holds each rank to the CPUs and memory its job asked for (JobSpec.cpus_per_rank,
// memory_per_rank_bytes), as Slurm's task/cgroup does.
//
// With cgroups v2 the agent needs a cgroup of its own that it may write (a systemd unit with Delegate=yes, as
// deploy/systemd/ddl-agent.service has, or --cgroup-root). In it, ROOT:
//   ROOT/agent            the agent itself (a cgroup with children may hold no processes of its own)
//   ROOT/ranks/<rank>     one per rank, "<job>-a<attempt>-r<rank>": cpuset.cpus, memory.max, memory.oom.group
// The rank's first process moves itself there between fork and exec, so everything it starts is inside. When
// the rank has exited, what is left in its cgroup is killed (cgroup.kill) and the cgroup removed.
//
// Where cgroups v2 cannot be used (no cgroup2 mount, the controllers held by cgroup v1, the agent in the root
// cgroup, nothing writable), describe() says why, once at start and on every `ddlctl nodes -v`; ranks are
// then still pinned to their CPUs with sched_setaffinity (by the supervisor), but their memory is not
// limited.
//
// Threads: the constructor probes; prepare() and finish() may be called from any thread (they touch only
// the files of the rank they are given).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddl::worker {

class Confinement {
 public:
  struct Options {
    // "": the agent's own cgroup, found through mountinfo and self_cgroup; "none": cgroups are not used;
    // anything else: that directory (a delegated cgroup, or a plain directory tree in tests).
    std::string root;
    std::string mountinfo = "/proc/self/mountinfo";
    std::string self_cgroup = "/proc/self/cgroup";
  };

  explicit Confinement(Options options);

  bool cpuset() const { return cpuset_; }  // cgroups confine CPUs
  bool memory() const { return memory_; }  // cgroups limit memory
  // One line for the log and the node's record: what confines ranks here, or why cgroups do not.
  const std::string& describe() const { return describe_; }

  // Makes the rank's cgroup with its limits and returns an open descriptor of its cgroup.procs, into which
  // the rank's first process writes itself; the caller closes it. -1 with *error empty: nothing to do (no
  // cgroups here, or the rank asks for nothing); -1 with *error set: the limits could not be applied, and the
  // rank must not run unconfined.
  int prepare(const std::string& name, const std::vector<int>& cpus, int64_t memory_bytes,
              std::string* error) const;

  // After the rank's exit: kills what is left in its cgroup and removes it. Returns how many processes the
  // kernel's OOM killer killed in it (memory.events oom_kill), so that the caller can say so.
  int64_t finish(const std::string& name) const;

  static std::string rankName(const std::string& job, int attempt, int rank);

 private:
  std::string root_;  // "" when cgroups are not used
  bool cpuset_ = false;
  bool memory_ = false;
  std::string describe_;
};

}  // namespace ddl::worker
