// LogRelay: the coordinator's reads of rank logs that wait for an agent's answer.
//
// A user's GetLogs becomes a ReadLog command on the agent's stream; the agent answers with LogData on the
// same stream, later. The relay keeps each read that waits (its request id, node, what to answer), answers it
// when the LogData comes, or with UNAVAILABLE after the timeout, and drops LogData no read waits for (the
// reader gave up). At most `max_waits` reads wait at once; a read over the limit is refused at once.
//
// Threads: the coordinator's loop only (its timers run on the loop's io_context).
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/status.h"
#include "ddl/v1/ddl.pb.h"

namespace ddl::coordinator {

class LogRelay {
 public:
  using Done = std::function<void(state::StatusOr<v1::GetLogsResponse>)>;

  LogRelay(boost::asio::io_context& io, int64_t timeout_ms, size_t max_waits);
  ~LogRelay();
  LogRelay(const LogRelay&) = delete;
  LogRelay& operator=(const LogRelay&) = delete;

  // Registers a read of `read` (its request id is set here) from `node`, answered through `done`; `where`
  // names the log in messages ("rank 3's log (attempt 1) is on node n2"). Returns the ReadLog command to send
  // to the node, or UNAVAILABLE when max_waits reads already wait (then `done` is not called).
  state::StatusOr<v1::Command> start(const std::string& node, const std::string& where, v1::ReadLog read,
                                     Done done);
  // An agent's answer. `job_ended` says whether the read's job has ended (GetLogsResponse.job_ended). A
  // LogData from another node than the one asked, or for no waiting read, is ignored.
  void answer(const std::string& node, const v1::LogData& data,
              const std::function<bool(const std::string& job_id)>& job_ended);
  // Cancels every timer (the coordinator is stopping); the reads are answered UNAVAILABLE as their timers
  // end.
  void cancelTimers();
  size_t waiting() const { return waits_.size(); }

 private:
  struct Wait;
  boost::asio::io_context& io_;
  const int64_t timeout_ms_;
  const size_t max_waits_;
  uint64_t requests_ = 0;
  std::map<std::string, std::shared_ptr<Wait>> waits_;  // by request id; at most max_waits_
};

}  // namespace ddl::coordinator
