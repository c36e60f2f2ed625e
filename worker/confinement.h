// Confinement: holds each rank to the CPUs and memory its job asked for (JobSpec.cpus_per_rank,
// memory_per_rank_bytes), as Slurm's task/cgroup does.
//
// With cgroups v2 the agent needs a cgroup dedicated to ranks and delegated to it, ROOT: the cgroup of
// deploy/systemd/ddl-ranks.service (Delegate=yes), found by default, or --cgroup-root. Not the agent's own: a
// cgroup that hands controllers to its children may hold no process, so systemd could not start a new agent
// in it while confined ranks outlive the old one. In ROOT:
//   ROOT/holder           whatever ran in ROOT itself (ddl-ranks.service's placeholder), moved there
//   ROOT/ranks/<rank>     one per rank, "<job>-a<attempt>-r<rank>": cpuset.cpus, memory.max, memory.swap.max
//                         (0: over its memory a rank is killed, not swapped), memory.oom.group
// The rank's first process moves itself there between fork and exec, so everything it starts is inside. When
// the rank has exited, what is left in its cgroup is killed (cgroup.kill, else SIGKILL to each process) and
// the cgroup removed.
//
// Where cgroups v2 cannot be used (no cgroup2 mount, the controllers held by cgroup v1, no delegated cgroup
// for ranks, nothing writable), describe() says why, once at start and under `ddlctl nodes`; ranks are then
// still pinned to their CPUs with sched_setaffinity (by the supervisor), but their memory is not limited.
//
// Threads: the constructor probes; prepare() and finish() may be called from any thread (they touch only
// the files of the rank they are given).
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ddl::worker {

class Confinement {
 public:
  struct Options {
    // "": ddl-ranks.service's cgroup (system.slice/ddl-ranks.service under the cgroup2 mount found through
    // mountinfo), where it exists; "none": cgroups are not used; anything else: that directory (a delegated
    // cgroup dedicated to ranks, or a plain directory tree in tests). Never a cgroup the agent is in.
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
  // cgroups here, or the rank asks for nothing); -1 with *error set: the limits could not be applied (or the
  // cgroup holds processes already: that rank runs), and the rank must not run unconfined.
  // mems: the NUMA nodes its memory is bound to (cpuset.mems, with the cpuset controller); empty: not bound.
  int prepare(const std::string& name, const std::vector<int>& cpus, int64_t memory_bytes, std::string* error,
              const std::vector<int>& mems = {}) const;

  // After the rank's exit: kills what is left in its cgroup and removes it. oom_kills: how many processes the
  // kernel's OOM killer killed in it (memory.events oom_kill), so that the caller can say so; error: why the
  // cgroup is left behind ("" once removed).
  struct Finished {
    int64_t oom_kills = 0;
    std::string error;
  };
  Finished finish(const std::string& name) const;

  static std::string rankName(const std::string& job, int attempt, int rank);

  // Removes the rank cgroups under ROOT/ranks that hold no process: those a previous agent left (a rank that
  // took longer to die than finish() waits). Call before any rank starts (a cgroup prepare() just made is
  // empty too). Returns how many it removed.
  int sweep() const;

 private:
  // Makes ROOT ready (holder, controllers, ranks/): at start, and again from prepare() where ROOT was made
  // afresh meanwhile (ddl-ranks.service stopped and started, and systemd trimmed its empty cgroups). "" or
  // why.
  std::string setUpRoot(const std::string& root, const std::string& enable) const;

  mutable std::mutex mu_;  // setUpRoot from prepare() on any thread
  std::string enable_;     // "+cpuset +memory", or what ROOT offers of them
  std::string root_;  // "" when cgroups are not used
  bool cpuset_ = false;
  bool memory_ = false;
  std::string describe_;
};

}  // namespace ddl::worker
