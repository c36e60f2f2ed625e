// Rank log retention and the logs' disk (log_retention.h): whole job directories removed by age and size,
// the full-disk warning, and the agent's notes in rank logs.
#include "worker/log_retention.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "common/fd.h"

namespace ddl::worker {
namespace {

namespace fs = std::filesystem;

struct JobDir {
  std::string job;
  fs::path path;
  std::chrono::system_clock::time_point newest;
  uint64_t bytes = 0;
};

std::chrono::system_clock::time_point mtimeOf(const struct stat& st) {
  return std::chrono::system_clock::time_point(std::chrono::seconds(st.st_mtim.tv_sec) +
                                               std::chrono::nanoseconds(st.st_mtim.tv_nsec));
}

// The newest mtime and the total size of the files under `dir` (itself included), without following links.
bool scan(JobDir& dir, std::vector<std::string>& errors) {
  struct stat st {};
  if (lstat(dir.path.c_str(), &st) != 0) return false;
  dir.newest = mtimeOf(st);
  std::error_code ec;
  fs::recursive_directory_iterator it(dir.path, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (lstat(it->path().c_str(), &st) != 0) continue;  // gone meanwhile
    dir.newest = std::max(dir.newest, mtimeOf(st));
    if (S_ISREG(st.st_mode)) dir.bytes += static_cast<uint64_t>(st.st_size);
  }
  if (ec) {
    errors.push_back("cannot read " + dir.path.string() + ": " + ec.message());
    return false;
  }
  return true;
}

}  // namespace

std::string logDiskWarning(const std::string& logs_dir, uint64_t min_free_bytes) {
  struct statvfs st {};
  if (statvfs(logs_dir.c_str(), &st) != 0)
    return "cannot check the free space of " + logs_dir + ": " + std::strerror(errno);
  const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  if (free_bytes >= min_free_bytes) return "";
  return "the rank logs' disk is full (" + std::to_string(free_bytes >> 20) + " MiB free in " + logs_dir +
         ", under " + std::to_string(min_free_bytes >> 20) +
         " MiB): ranks' output is being cut; free space there, or lower log_max_mb or log_retention_hours";
}

LogCleanup cleanRankLogs(const std::string& logs_dir, const LogRetention& retention,
                         const std::set<std::string>& live_jobs, std::chrono::system_clock::time_point now) {
  LogCleanup result;
  std::vector<JobDir> dirs;
  std::error_code ec;
  fs::directory_iterator it(logs_dir, ec);
  if (ec) {
    if (ec != std::errc::no_such_file_or_directory)
      result.errors.push_back("cannot read " + logs_dir + ": " + ec.message());
    return result;
  }
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_directory(type_ec) || it->is_symlink(type_ec)) continue;
    JobDir dir{it->path().filename().string(), it->path(), {}, 0};
    if (scan(dir, result.errors)) dirs.push_back(std::move(dir));
  }
  if (ec) result.errors.push_back("cannot list " + logs_dir + ": " + ec.message());

  auto removable = [&](const JobDir& d) { return !live_jobs.count(d.job) && now - d.newest >= kMinLogAge; };
  auto remove = [&](JobDir& d) {
    std::error_code rm_ec;
    fs::remove_all(d.path, rm_ec);
    if (rm_ec) {
      result.errors.push_back("cannot remove " + d.path.string() + ": " + rm_ec.message());
      return false;
    }
    result.removed.push_back(d.job);
    result.bytes_removed += d.bytes;
    d.bytes = 0;
    return true;
  };
  // Oldest first: the order of removal by size, and a stable order for the age pass.
  std::sort(dirs.begin(), dirs.end(), [](const JobDir& a, const JobDir& b) {
    return a.newest != b.newest ? a.newest < b.newest : a.job < b.job;
  });
  std::vector<bool> gone(dirs.size(), false);
  if (retention.max_age.count() > 0) {
    for (size_t i = 0; i < dirs.size(); ++i) {
      if (removable(dirs[i]) && now - dirs[i].newest > retention.max_age) gone[i] = remove(dirs[i]);
    }
  }
  uint64_t total = 0;
  for (const JobDir& d : dirs) total += d.bytes;
  if (retention.max_bytes > 0) {
    for (size_t i = 0; i < dirs.size() && total > retention.max_bytes; ++i) {
      if (gone[i] || !removable(dirs[i])) continue;
      const uint64_t bytes = dirs[i].bytes;
      if (remove(dirs[i])) total -= bytes;
    }
  }
  result.bytes_kept = total;
  return result;
}

std::string appendLogNote(const std::string& path, const std::string& note) {
  Fd log(open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW));
  if (log.get() < 0) return "cannot open " + path + ": " + std::strerror(errno);
  std::string text = note;
  if (text.empty() || text.back() != '\n') text += '\n';
  struct stat st {};
  char last = '\n';
  if (fstat(log.get(), &st) == 0 && st.st_size > 0 && pread(log.get(), &last, 1, st.st_size - 1) == 1 &&
      last != '\n') {
    text.insert(text.begin(), '\n');
  }
  const ssize_t n = ::write(log.get(), text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size()))
    return "cannot write to " + path + ": " + (n < 0 ? std::strerror(errno) : std::string("short write"));
  return "";
}

}  // namespace ddl::worker
