// Telemetry: what a rank tells its node agent about its collectives, so the cluster knows each rank's last
// progress and speed (ddlctl status, the dashboard) without touching the data path.
//
// When DDL_AGENT_SOCKET names a Unix datagram socket (ddl-agent sets it for every rank it launches), each
// finished collective is added to running totals, and at most every 200 ms (plus once at the end) one small
// datagram goes to the agent, never blocking: if the agent is slow or gone (restarting), the datagram is
// dropped. The cost per collective is a clock read and a few additions; a send happens at most 5 times a
// second.
//
// Datagram (one line of text, space-separated key=value, values without spaces):
//   ddl1 job=J attempt=A rank=R size=P count=N bytes=B seconds=S last=allreduce last_bytes=B last_us=U
//   last_algo=A dims_us=a,b
// job and attempt come from DDL_JOB_ID and DDL_JOB_ATTEMPT (set by the agent; "-" and 0 otherwise); rank is
// DDL_RANK, the rank the agent launched (its launch slot), where set, else the communicator's: a communicator
// that shrank or grew (an elastic job's), a joiner's or a subgroup's numbers its ranks its own way, and the
// agent knows the process by the rank it launched.
// count/bytes/seconds are totals since the communicator was created; last_* describe the latest collective;
// dims_us the time spent per dim of DDL_TOPOLOGY in the latest mdring allreduce ("" otherwise).
//
// Threads: record() is called by the thread running collectives (one at a time per communicator).
#pragma once

#include <sys/un.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "session.h"

namespace ddl {

class Telemetry {
 public:
  // From DDL_AGENT_SOCKET; nullptr when unset or when the socket cannot be made (telemetry is best effort).
  static std::unique_ptr<Telemetry> fromEnv(int rank, int size);
  ~Telemetry();  // sends the final totals

  void record(CollKind kind, size_t bytes, int algo, double seconds, const std::vector<double>& dim_seconds);

 private:
  Telemetry(int fd, const sockaddr_un& agent, int rank, int size, std::string job, int attempt);
  void send();

  int fd_;
  sockaddr_un agent_;
  std::string job_;
  int attempt_;
  int rank_, size_;
  uint64_t count_ = 0, bytes_ = 0;
  double seconds_ = 0;
  CollKind last_kind_ = CollKind::kAllReduce;
  size_t last_bytes_ = 0;
  double last_seconds_ = 0;
  int last_algo_ = 0;
  std::vector<double> last_dims_;
  std::chrono::steady_clock::time_point last_sent_{};
  bool dirty_ = false;
};

}  // namespace ddl
