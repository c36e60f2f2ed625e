// Confinement (confinement.h): each rank's cgroup v2 (cpuset, memory) under the delegated root, or CPU
// affinity alone where there is none.
#include "worker/confinement.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
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
  const std::string mount = cgroup2Mount(options.mountinfo);
  const std::string own = ownCgroup(options.self_cgroup);
  std::string root = options.root;
  if (root.empty()) {
    if (mount.empty()) {
      describe_ = "not confined by cgroups: no cgroup2 file system is mounted" + fallback;
      return;
    }
    root = mount + "/system.slice/ddl-ranks.service";
    struct stat st {};
    if (stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      describe_ = "not confined by cgroups: no delegated cgroup for ranks (" + root +
                  " is missing: start ddl-ranks.service from deploy/systemd, or give --cgroup-root)" +
                  fallback;
      return;
    }
  }
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  // Never the agent's own cgroup or one above it: it would have to leave it, and systemd could not start the
  // next agent there while confined ranks live.
  if (!mount.empty() && !own.empty()) {
    const std::string mine = own == "/" ? mount : mount + own;
    if (mine == root || mine.rfind(root + "/", 0) == 0) {
      describe_ = "not confined by cgroups: " + root +
                  " holds the agent itself; give a cgroup dedicated to ranks (ddl-ranks.service)" + fallback;
      return;
    }
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
  std::string why = setUpRoot(root, enable);
  if (!why.empty()) {
    describe_ = "not confined by cgroups: " + why + fallback;
    return;
  }
  root_ = root;
  enable_ = enable;
  cpuset_ = want_cpuset;
  memory_ = want_memory;
  describe_ =
      "cgroups v2 under " + root + "/ranks: " +
      (cpuset_ ? std::string("cpuset") : "CPUs pinned with sched_setaffinity (no cpuset controller)") +
      (memory_ ? ", memory.max" : ", memory not limited (no memory controller)");
}

std::string Confinement::setUpRoot(const std::string& root, const std::string& enable) const {
  // What runs in ROOT itself (the unit's placeholder) leaves for ROOT/holder: a cgroup that hands controllers
  // to its children holds no process.
  std::string why;
  if (mkdir((root + "/holder").c_str(), 0755) != 0 && errno != EEXIST) {
    why = "cannot create " + root + "/holder: " + std::strerror(errno);
  }
  if (why.empty()) {
    std::istringstream procs(readFile(root + "/cgroup.procs"));
    for (int pid = 0; why.empty() && procs >> pid;) {
      std::string err = writeFile(root + "/holder/cgroup.procs", std::to_string(pid));
      if (!err.empty() && kill(pid, 0) == 0) why = err;  // one that has exited meanwhile is fine
    }
  }
  if (why.empty()) why = writeFile(root + "/cgroup.subtree_control", enable);
  if (why.empty() && mkdir((root + "/ranks").c_str(), 0755) != 0 && errno != EEXIST)
    why = "cannot create " + root + "/ranks: " + std::strerror(errno);
  if (why.empty()) why = writeFile(root + "/ranks/cgroup.subtree_control", enable);
  return why;
}

int Confinement::sweep() const {
  if (root_.empty()) return 0;
  int removed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(root_ + "/ranks", ec)) {
    if (entry.is_directory(ec) && !entry.is_symlink(ec) && rmdir(entry.path().c_str()) == 0) ++removed;
  }
  return removed;
}

int Confinement::prepare(const std::string& name, const std::vector<int>& cpus, int64_t memory_bytes,
                         std::string* error, const std::vector<int>& mems) const {
  error->clear();
  if (root_.empty() || (cpus.empty() && memory_bytes <= 0)) return -1;
  if (name.empty() || name[0] == '.' || name.find('/') != std::string::npos) {
    *error = "'" + name + "' cannot name a cgroup";
    return -1;
  }
  const std::string dir = root_ + "/ranks/" + name;
  int made = mkdir(dir.c_str(), 0755);
  if (made != 0 && errno == ENOENT) {
    // ROOT/ranks is gone: ROOT was made afresh (its unit restarted with no rank left). Set it up again.
    std::lock_guard<std::mutex> lock(mu_);
    if (std::string why = setUpRoot(root_, enable_); !why.empty()) {
      *error = "the cgroup for ranks was made afresh and cannot be set up again: " + why;
      return -1;
    }
    made = mkdir(dir.c_str(), 0755);
  }
  if (made != 0) {
    if (errno != EEXIST) {
      *error = "cannot create the rank's cgroup " + dir + ": " + std::strerror(errno);
      return -1;
    }
    // Left by an earlier start of this rank that has ended: reusable. One with processes is a running rank's.
    if (readFile(dir + "/cgroup.events").find("populated 1") != std::string::npos) {
      *error = "the rank's cgroup " + dir + " holds processes already (is the rank running?)";
      return -1;
    }
  }
  if (cpuset_ && !cpus.empty()) *error = writeFile(dir + "/cpuset.cpus", formatCpuList(cpus));
  if (error->empty() && cpuset_ && !mems.empty())
    *error = writeFile(dir + "/cpuset.mems", formatCpuList(mems));
  if (error->empty() && memory_ && memory_bytes > 0) {
    *error = writeFile(dir + "/memory.max", std::to_string(memory_bytes));
    // Over its memory a rank is killed rather than swapped (where the kernel accounts swap at all).
    struct stat st {};
    if (error->empty() && stat((dir + "/memory.swap.max").c_str(), &st) == 0)
      *error = writeFile(dir + "/memory.swap.max", "0");
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

Confinement::Finished Confinement::finish(const std::string& name) const {
  Finished done;
  if (root_.empty() || name.empty() || name[0] == '.' || name.find('/') != std::string::npos) return done;
  const std::string dir = root_ + "/ranks/" + name;
  struct stat st {};
  if (stat(dir.c_str(), &st) != 0) return done;
  std::istringstream events(readFile(dir + "/memory.events"));
  std::string key;
  int64_t value = 0;
  while (events >> key >> value)
    if (key == "oom_kill") done.oom_kills = value;
  // A process that left the rank's session (a daemonised helper) is still in its cgroup: end it with the
  // rank. cgroup.kill where the kernel has it (5.14), else SIGKILL to each process listed; bounded, then left
  // for the next start of a rank of that name (prepare() reuses an empty one).
  for (int round = 0; round < 20 && rmdir(dir.c_str()) != 0 && errno == EBUSY; ++round) {
    if (round == 0 && !writeFile(dir + "/cgroup.kill", "1").empty()) {
      std::istringstream procs(readFile(dir + "/cgroup.procs"));
      for (int pid = 0; procs >> pid;)
        if (pid > 0) kill(pid, SIGKILL);
    }
    usleep(5000);
  }
  if (stat(dir.c_str(), &st) == 0) done.error = "cannot remove " + dir + ": " + std::strerror(errno);
  return done;
}

}  // namespace ddl::worker
