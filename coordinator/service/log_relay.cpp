// The log reads waiting for agents (log_relay.h): each with its timer on the loop, capped in number.
#include "service/log_relay.h"

#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <utility>

#include "service/convert.h"

namespace ddl::coordinator {

struct LogRelay::Wait {
  Done done;
  v1::ReadLog read;
  std::string node;
  std::string where;
  boost::asio::steady_timer timer;
  explicit Wait(boost::asio::io_context& io) : timer(io) {}
};

LogRelay::LogRelay(boost::asio::io_context& io, int64_t timeout_ms, size_t max_waits)
    : io_(io), timeout_ms_(timeout_ms), max_waits_(max_waits) {}

LogRelay::~LogRelay() = default;

state::StatusOr<v1::Command> LogRelay::start(const std::string& node, const std::string& where,
                                             v1::ReadLog read, Done done) {
  if (waits_.size() >= max_waits_) {
    return state::Status::unavailable("too many log reads wait for agents now; try again");
  }
  const std::string rid = "log-" + std::to_string(++requests_);
  read.set_request(rid);
  auto wait = std::make_shared<Wait>(io_);
  wait->done = std::move(done);
  wait->node = node;
  wait->where = where;
  wait->read = read;
  waits_[rid] = wait;
  wait->timer.expires_after(std::chrono::milliseconds(timeout_ms_));
  wait->timer.async_wait([this, rid](const boost::system::error_code&) {
    auto w = waits_.find(rid);
    if (w == waits_.end()) return;  // answered
    auto waiting = w->second;
    waits_.erase(w);
    waiting->done(state::Status::unavailable(waiting->where + ", which did not answer within " +
                                             secondsText(timeout_ms_)));
  });
  v1::Command cmd;
  *cmd.mutable_read_log() = std::move(read);
  return cmd;
}

void LogRelay::answer(const std::string& node, const v1::LogData& data,
                      const std::function<bool(const std::string& job_id)>& job_ended) {
  auto it = waits_.find(data.request());
  if (it == waits_.end() || it->second->node != node) return;  // the reader gave up already
  auto wait = it->second;
  waits_.erase(it);
  wait->timer.cancel();
  if (!data.error().empty()) return wait->done(state::Status::notFound(wait->where + ": " + data.error()));
  v1::GetLogsResponse resp;
  resp.set_data(data.data());
  resp.set_next_offset(wait->read.offset() + static_cast<int64_t>(data.data().size()));
  resp.set_size(data.size());
  resp.set_job_ended(job_ended(wait->read.job_id()));
  resp.set_attempt(wait->read.attempt());
  resp.set_node(node);
  wait->done(std::move(resp));
}

void LogRelay::cancelTimers() {
  for (auto& [rid, wait] : waits_) wait->timer.cancel();
}

}  // namespace ddl::coordinator
