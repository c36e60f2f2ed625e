// Telemetry (telemetry.h): one datagram per collective to the node agent's socket, when DDL_AGENT_SOCKET names
// one; never blocking the caller.
#include "telemetry.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "algo/algo.h"
#include "env.h"

namespace ddl {

namespace {
constexpr auto kInterval = std::chrono::milliseconds(200);
}

std::unique_ptr<Telemetry> Telemetry::fromEnv(int rank, int size) {
  const std::string path = getEnv("DDL_AGENT_SOCKET");
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) return nullptr;
  int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return nullptr;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  if (::access(path.c_str(), F_OK) != 0) {
    ::close(fd);
    return nullptr;  // no agent here: run without telemetry
  }
  std::string job = getEnv("DDL_JOB_ID");
  if (job.empty() || job.find_first_of(" \n") != std::string::npos) job = "-";
  const std::string launched = getEnv("DDL_RANK");
  if (!launched.empty() && launched.size() <= 9 &&
      launched.find_first_not_of("0123456789") == std::string::npos)
    rank = std::atoi(launched.c_str());
  const int attempt = std::atoi(getEnv("DDL_JOB_ATTEMPT").c_str());
  return std::unique_ptr<Telemetry>(new Telemetry(fd, addr, rank, size, job, attempt));
}

Telemetry::Telemetry(int fd, const sockaddr_un& agent, int rank, int size, std::string job, int attempt)
    : fd_(fd), agent_(agent), job_(std::move(job)), attempt_(attempt), rank_(rank), size_(size) {}

Telemetry::~Telemetry() {
  if (dirty_) send();
  ::close(fd_);
}

void Telemetry::record(CollKind kind, size_t bytes, int algo, double seconds,
                       const std::vector<double>& dim_seconds) {
  ++count_;
  bytes_ += bytes;
  seconds_ += seconds;
  last_kind_ = kind;
  last_bytes_ = bytes;
  last_seconds_ = seconds;
  last_algo_ = algo;
  last_dims_ = dim_seconds;
  dirty_ = true;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_sent_ >= kInterval) {
    last_sent_ = now;
    send();
  }
}

void Telemetry::send() {
  char buf[512];
  int n = std::snprintf(buf, sizeof(buf),
                        "ddl1 job=%s attempt=%d rank=%d size=%d count=%llu bytes=%llu seconds=%.6f last=%s last_bytes=%zu "
                        "last_us=%.1f last_algo=%s dims_us=",
                        job_.c_str(), attempt_, rank_, size_, static_cast<unsigned long long>(count_),
                        static_cast<unsigned long long>(bytes_), seconds_, collName(last_kind_), last_bytes_,
                        last_seconds_ * 1e6,
                        last_kind_ == CollKind::kAllReduce ? algoName(static_cast<Algo>(last_algo_)) : "-");
  for (size_t i = 0; i < last_dims_.size() && n > 0 && n < static_cast<int>(sizeof(buf)) - 24; ++i) {
    n += std::snprintf(buf + n, sizeof(buf) - n, "%s%.1f", i ? "," : "", last_dims_[i] * 1e6);
  }
  if (n <= 0 || n >= static_cast<int>(sizeof(buf))) return;
  // Addressed by path each time, not connected once: an agent that restarts binds a new socket at the same
  // path, and the ranks it re-adopts keep reporting to it. Dropped when the agent lags or is away.
  (void)::sendto(fd_, buf, static_cast<size_t>(n), MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&agent_), sizeof(agent_));
  dirty_ = false;
}

}  // namespace ddl
