// TelemetryListener: the agent's end of DDL_AGENT_SOCKET. A Unix datagram socket that the ranks' libddl sends
// its collective totals to (comm/src/telemetry.h gives the format); the latest report of each rank is kept
// and attached to that rank's status in heartbeats.
//
// Ranks run as their jobs' users, so the socket is writable by every local user (mode 0666; the directories
// above it must let them through). A report names its own job and rank, so it is believed only when the
// sender may speak for that rank: the kernel attaches the sender's pid to each datagram (SO_PASSCRED) and the
// SenderCheck, given by the agent, decides (it accepts processes in the rank's own session).
//
// Threads: one reader thread; latest()/forget() from any thread.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include "ddl/v1/ddl.pb.h"

namespace ddl::worker {

class TelemetryListener {
 public:
  // Whether process `sender` may report for the rank. Called on the reader thread, with no lock held.
  using SenderCheck = std::function<bool(const std::string& job, int attempt, int rank, pid_t sender)>;

  // Binds `path` (an old socket file there is replaced). On failure, error says why and nothing listens.
  // Without a check every report is believed.
  TelemetryListener(const std::string& path, std::string* error, SenderCheck check = nullptr);
  ~TelemetryListener();

  const std::string& path() const { return path_; }
  std::optional<v1::RankProgress> latest(const std::string& job, int attempt, int rank);
  // Drops what is known of the job's attempts <= attempt (0: all).
  void forget(const std::string& job, int attempt);

  // Parses one datagram; false if it is not a ddl1 report (or has a byte that is not printable ASCII). Exposed
  // for tests and tests/fuzz/telemetry_fuzz.cpp.
  static bool parse(const std::string& text, std::string* job, int* attempt, int* rank, v1::RankProgress* out);

 private:
  void readLoop();

  std::string path_;
  const SenderCheck check_;
  int fd_ = -1;
  int wake_[2] = {-1, -1};
  std::thread reader_;
  std::mutex mu_;
  std::map<std::tuple<std::string, int, int>, v1::RankProgress> latest_;
};

}  // namespace ddl::worker
