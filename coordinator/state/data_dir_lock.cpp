// One coordinator per data directory (data_dir_lock.h): the flock on DATA_DIR/coordinator.lock.
#include "state/data_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ddl::state {

StatusOr<DataDirLock> DataDirLock::acquire(const std::string& dir) {
  const std::string path = dir + "/coordinator.lock";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return Status::unavailable("cannot open " + path + ": " + std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char buf[32] = {};
    const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
    ::close(fd);
    std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    if (err == EWOULDBLOCK) {
      return Status::failedPrecondition(
          "another ddl-coordinator" + (holder.empty() ? "" : " (pid " + holder + ")") +
          " already uses the data directory " + dir + "; stop it first, or give this one another --data-dir");
    }
    return Status::unavailable("cannot lock " + path + ": " + std::strerror(err));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // The lock holds regardless; only the message a second coordinator gives loses the pid.
  }
  return DataDirLock(fd);
}

DataDirLock::~DataDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor drops the lock
}

}  // namespace ddl::state
