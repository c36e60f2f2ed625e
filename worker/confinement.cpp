#include "worker/confinement.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/resources.h"

namespace ddl::worker {

namespace {

std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `text` to a cgroup file (or a plain file in a test tree); "" or why not.
std::string writeFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot open " + path + ": " + std::strerror(errno);
  const ssize_t n = write(fd, text.data(), text.size());
  const int err = errno;
  close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    return "cannot write '" + text + "' to " + path + ": " + std::strerror(n < 0 ? err : EIO);
  return "";
}

bool hasWord(const std::string& list, const std::string& word) {
  std::istringstream in(list);
  std::string w;
  while (in >> w)
    if (w == word) return true;
  return false;
}

// The cgroup2 mount point from mountinfo, or "".
std::string cgroup2Mount(const std::string& mountinfo) {
  std::istringstream in(readFile(mountinfo));
  std::string line;
  while (std::getline(in, line)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype;
    tail >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream head(line.substr(0, dash));
    std::string id, parent, devno, root, mount;
    head >> id >> parent >> devno >> root >> mount;
    return mount;
  }
  return "";
}

// The process's cgroup v2 path ("0::/system.slice/ddl-agent.service"), or "".
std::string ownCgroup(const std::string& self_cgroup) {
  std::istringstream in(readFile(self_cgroup));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return "";
}

}  // namespace

std::string Confinement::rankName(const std::string& job, int attempt, int rank) {
  return job + "-a" + std::to_string(attempt) + "-r" + std::to_string(rank);
}

Confinement::Confinement(Options options) {
  const std::string fallback =
      "; ranks are pinned to their CPUs with sched_setaffinity, their memory is not limited";
  if (options.root == "none") {
    describe_ = "cgroups not used (--cgroup-root none)" + fallback;
    return;
  }
  std::string root = options.root;
  if (root.empty()) {
    const std::string mount = cgroup2Mount(options.mountinfo);
    const std::string own = ownCgroup(options.self_cgroup);
    if (mount.empty()) {
      describe_ = "not confined by cgroups: no cgroup2 file system is mounted" + fallback;
      return;
    }
    if (own.empty() || own == "/") {
      describe_ = "not confined by cgroups: the agent runs in the root cgroup of " + mount +
                  "; run it as the systemd unit with Delegate=yes (deploy/systemd/ddl-agent.service) or give "
                  "--cgroup-root" +
                  fallback;
      return;
    }
    root = mount + own;
  }
  const std::string controllers = readFile(root + "/cgroup.controllers");
  const bool want_cpuset = hasWord(controllers, "cpuset"), want_memory = hasWord(controllers, "memory");
  if (!want_cpuset && !want_memory) {
    describe_ = "not confined by cgroups: " + root + " offers neither the cpuset nor the memory controller" +
                (controllers.empty() ? std::string(" (no cgroup.controllers: not a cgroup2 directory?)")
                                     : " (it has: " + controllers.substr(0, controllers.find('\n')) +
                                           "; cgroup v1 may hold them)") +
                fallback;
    return;
  }
  const std::string enable = std::string(want_cpuset ? "+cpuset" : "") +
                             (want_cpuset && want_memory ? " " : "") + (want_memory ? "+memory" : "");
  // The agent leaves ROOT for ROOT/agent: a cgroup that hands controllers to children holds no processes.
  std::string why;
  if (mkdir((root + "/agent").c_str(), 0755) != 0 && errno != EEXIST) {
    why = "cannot create " + root + "/agent: " + std::strerror(errno);
  }
  if (why.empty()) {
    std::istringstream procs(readFile(root + "/cgroup.procs"));
    std::string pid;
    while (why.empty() && procs >> pid) {
      std::string err = writeFile(root + "/agent/cgroup.procs", pid);
      if (!err.empty() && pid == std::to_string(getpid())) why = err;  // others may have exited meanwhile
    }
    if (why.empty()) why = writeFile(root + "/agent/cgroup.procs", std::to_string(getpid()));
  }
  if (why.empty()) why = writeFile(root + "/cgroup.subtree_control", enable);
  if (why.empty() && mkdir((root + "/ranks").c_str(), 0755) != 0 && errno != EEXIST)
    why = "cannot create " + root + "/ranks: " + std::strerror(errno);
  if (why.empty()) why = writeFile(root + "/ranks/cgroup.subtree_control", enable);
  if (!why.empty()) {
    describe_ = "not confined by cgroups: " + why + fallback;
    return;
  }
  root_ = root;
  cpuset_ = want_cpuset;
  memory_ = want_memory;
  describe_ =
      "cgroups v2 under " + root + "/ranks: " +
      (cpuset_ ? std::string("cpuset") : "CPUs pinned with sched_setaffinity (no cpuset controller)") +
      (memory_ ? ", memory.max" : ", memory not limited (no memory controller)");
}

int Confinement::prepare(const std::string& name, const std::vector<int>& cpus, int64_t memory_bytes,
                         std::string* error) const {
  error->clear();
  if (root_.empty() || (cpus.empty() && memory_bytes <= 0)) return -1;
  const std::string dir = root_ + "/ranks/" + name;
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    *error = "cannot create the rank's cgroup " + dir + ": " + std::strerror(errno);
    return -1;
  }
  if (cpuset_ && !cpus.empty()) *error = writeFile(dir + "/cpuset.cpus", formatCpuList(cpus));
  if (error->empty() && memory_ && memory_bytes > 0) {
    *error = writeFile(dir + "/memory.max", std::to_string(memory_bytes));
    // One OOM kills the rank's whole cgroup, as a rank is useless to its job with a process missing.
    if (error->empty()) writeFile(dir + "/memory.oom.group", "1");
  }
  if (!error->empty()) {
    rmdir(dir.c_str());
    return -1;
  }
  const int fd = open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) *error = "cannot open " + dir + "/cgroup.procs: " + std::strerror(errno);
  return fd;
}

int64_t Confinement::finish(const std::string& name) const {
  if (root_.empty()) return 0;
  const std::string dir = root_ + "/ranks/" + name;
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return 0;
  int64_t oom_kills = 0;
  std::istringstream events(readFile(dir + "/memory.events"));
  std::string key;
  int64_t value = 0;
  while (events >> key >> value)
    if (key == "oom_kill") oom_kills = value;
  // A process that left the rank's session (a daemonised helper) is still in its cgroup: end it with the
  // rank.
  if (rmdir(dir.c_str()) != 0 && errno == EBUSY) {
    writeFile(dir + "/cgroup.kill", "1");
    for (int i = 0; i < 20 && rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) usleep(5000);
  }
  return oom_kills;
}

}  // namespace ddl::worker
