// A point in time after which a blocking wait gives up (monotonic clock).
#pragma once

#include <chrono>
#include <cstdint>

namespace ddl {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  explicit Deadline(int64_t timeout_ms)
      : timeout_ms_(timeout_ms), end_(Clock::now() + std::chrono::milliseconds(timeout_ms)) {}
  bool expired() const { return Clock::now() >= end_; }
  // Milliseconds left, never negative.
  int64_t remainingMs() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now()).count();
    return left > 0 ? left : 0;
  }
  int64_t timeoutMs() const { return timeout_ms_; }

 private:
  int64_t timeout_ms_;
  Clock::time_point end_;
};

}  // namespace ddl
