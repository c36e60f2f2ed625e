// The agent's end of DDL_AGENT_SOCKET (telemetry_listener.h): rank reports, kept per rank, believed only
// from the rank's own processes.
#include "worker/telemetry_listener.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <stdexcept>
#include <cstring>
#include <sstream>

#include "common/clock.h"

namespace ddl::worker {

TelemetryListener::TelemetryListener(const std::string& path, std::string* error, SenderCheck check)
    : path_(path), check_(std::move(check)) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    *error = "telemetry socket path " + path + " is longer than " + std::to_string(sizeof(addr.sun_path) - 1) +
             " bytes; use a shorter data directory";
    return;
  }
  ::unlink(path.c_str());
  fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const int on = 1;
  if (fd_ < 0 || ::setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) != 0 ||
      ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::chmod(path.c_str(), 0666) != 0 || ::pipe2(wake_, O_CLOEXEC) != 0) {
    *error = "telemetry socket " + path + ": " + std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return;
  }
  reader_ = std::thread([this] { readLoop(); });
}

TelemetryListener::~TelemetryListener() {
  if (reader_.joinable()) {
    char c = 0;
    (void)::write(wake_[1], &c, 1);
    reader_.join();
  }
  for (int fd : {fd_, wake_[0], wake_[1]}) {
    if (fd >= 0) ::close(fd);
  }
  if (fd_ >= 0) ::unlink(path_.c_str());
}

namespace {
// A time from a report: libddl measures it, so NaN or infinity is a malformed report (it would show as such on
// the dashboard and in the metrics). Throws like std::stod.
double finite(const std::string& text) {
  const double v = std::stod(text);
  if (!std::isfinite(v)) throw std::invalid_argument("not a finite number");
  return v;
}
}  // namespace

bool TelemetryListener::parse(const std::string& text, std::string* job, int* attempt, int* rank,
                              v1::RankProgress* out) {
  // libddl writes printable ASCII. Anything else is refused whole: a byte that is not UTF-8 in a string field
  // (last, last_algo) would make the heartbeat carrying this report unparseable at the coordinator, which
  // drops the whole message (found by tests/fuzz/telemetry_fuzz.cpp).
  for (unsigned char c : text) {
    if (c >= 0x7f || (c < 0x20 && c != ' ' && c != '\t' && c != '\n' && c != '\r')) return false;
  }
  std::istringstream in(text);
  std::string word;
  if (!(in >> word) || word != "ddl1") return false;
  bool have_rank = false;
  *job = "-";
  *attempt = 0;
  while (in >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
    try {
      if (key == "job") *job = value;
      else if (key == "attempt") *attempt = std::stoi(value);
      else if (key == "rank") *rank = std::stoi(value), have_rank = true;
      else if (key == "size") out->set_world_size(std::stoi(value));
      else if (key == "count") out->set_collectives(std::stoll(value));
      else if (key == "bytes") out->set_bytes(std::stoll(value));
      else if (key == "seconds") out->set_seconds(finite(value));
      else if (key == "last") out->set_last_op(value);
      else if (key == "last_bytes") out->set_last_bytes(std::stoll(value));
      else if (key == "last_us") out->set_last_us(finite(value));
      else if (key == "last_algo") out->set_last_algo(value);
      else if (key == "dims_us") {
        std::istringstream dims(value);
        std::string d;
        while (std::getline(dims, d, ',')) {
          if (!d.empty()) out->add_dims_us(finite(d));
        }
      }
    } catch (const std::exception&) {
      return false;  // a malformed number: ignore the datagram
    }
  }
  return have_rank;
}

void TelemetryListener::readLoop() {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
  char buf[2048];
  while (true) {
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    iovec iov{buf, sizeof(buf) - 1};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd_, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n <= 0) continue;
    pid_t sender = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS &&
          c->cmsg_len == CMSG_LEN(sizeof(ucred))) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
        sender = cred.pid;
      }
    }
    std::string job;
    int attempt = 0, rank = 0;
    v1::RankProgress progress;
    if (!parse(std::string(buf, static_cast<size_t>(n)), &job, &attempt, &rank, &progress)) continue;
    // Not that rank's to report (or no credentials, which the kernel always attaches with SO_PASSCRED).
    if (check_ && (sender <= 0 || !check_(job, attempt, rank, sender))) continue;
    progress.set_updated_ms(unixNowMs());
    std::lock_guard<std::mutex> lock(mu_);
    latest_[{job, attempt, rank}] = progress;
  }
}

std::optional<v1::RankProgress> TelemetryListener::latest(const std::string& job, int attempt, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = latest_.find({job, attempt, rank});
  if (it == latest_.end()) return std::nullopt;
  return it->second;
}

void TelemetryListener::forget(const std::string& job, int attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = latest_.begin(); it != latest_.end();) {
    bool match = std::get<0>(it->first) == job && (attempt == 0 || std::get<1>(it->first) <= attempt);
    it = match ? latest_.erase(it) : std::next(it);
  }
}

}  // namespace ddl::worker
