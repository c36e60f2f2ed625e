// The two clocks of ddl's programs, in milliseconds. steadyNowMs for intervals, timeouts and liveness (never
// jumps); unixNowMs for what is recorded or shown as a time of day (job submit times, log lines). Code that
// tests need to drive takes a std::function<int64_t()> defaulting to one of these. Threads: any.
#pragma once

#include <chrono>
#include <cstdint>

namespace ddl {

inline int64_t steadyNowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(steady_clock::now().time_since_epoch()).count();
}

inline int64_t unixNowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}

inline int64_t unixNowS() { return unixNowMs() / 1000; }

}  // namespace ddl
