// One coordinator per data directory: an exclusive flock on DATA_DIR/coordinator.lock, held for the process's
// life. A second coordinator started on the same directory is refused at once with the holder's pid, instead
// of both writing one database and failing each other's jobs. The kernel drops the lock when the holder exits
// (kill -9 included), so a stale file never blocks a restart.
//
// Threads: any; the object only holds the descriptor.
#pragma once

#include <string>

#include "common/status.h"

namespace ddl::state {

class DataDirLock {
 public:
  // Takes the lock on `dir` (which must exist) and writes this process's pid into the lock file.
  // FAILED_PRECONDITION naming the holder's pid when another process holds it; UNAVAILABLE when the file
  // cannot be opened.
  static StatusOr<DataDirLock> acquire(const std::string& dir);

  DataDirLock(DataDirLock&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  DataDirLock& operator=(DataDirLock&&) = delete;
  DataDirLock(const DataDirLock&) = delete;
  ~DataDirLock();

 private:
  explicit DataDirLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace ddl::state
