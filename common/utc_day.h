// UTC days, as the usage rollups count them (coordinator/service/usage_book.h) and ddlctl usage reads them:
// days since 1970-01-01 of unix ms, their text "YYYY-MM-DD", and back, on <chrono>'s civil calendar.
// Threads: any.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

namespace ddl {

inline int64_t utcDayOf(int64_t unix_ms) {
  using namespace std::chrono;
  return floor<days>(sys_time<milliseconds>(milliseconds(unix_ms))).time_since_epoch().count();
}

inline std::string utcDayText(int64_t day) {
  using namespace std::chrono;
  const year_month_day ymd{sys_days(days(day))};
  char text[32];
  std::snprintf(text, sizeof(text), "%04d-%02u-%02u", static_cast<int>(ymd.year()),
                static_cast<unsigned>(ymd.month()), static_cast<unsigned>(ymd.day()));
  return text;
}

// The first day of the UTC week (from Monday) and of the calendar month that hold `day`, and the first day of
// the next month.
inline int64_t utcWeekStart(int64_t day) {
  return day - ((day + 3) % 7 + 7) % 7;  // 1970-01-01 (day 0) was a Thursday
}
inline int64_t utcMonthStart(int64_t day) {
  using namespace std::chrono;
  const year_month_day ymd{sys_days(days(day))};
  return sys_days(ymd.year() / ymd.month() / std::chrono::day(1)).time_since_epoch().count();
}
inline int64_t utcNextMonthStart(int64_t day) {
  using namespace std::chrono;
  const year_month_day ymd{sys_days(days(day))};
  return sys_days(ymd.year() / ymd.month() / std::chrono::day(1) + months(1)).time_since_epoch().count();
}

// The day of "YYYY-MM-DD" (1970 on); nullopt for anything else, 2026-02-30 included.
inline std::optional<int64_t> parseUtcDay(const std::string& text) {
  int y = 0;
  unsigned m = 0, d = 0;
  char tail = 0;
  if (text.size() != 10 || text[4] != '-' || text[7] != '-' ||
      std::sscanf(text.c_str(), "%4d-%2u-%2u%c", &y, &m, &d, &tail) != 3 || y < 1970) {
    return std::nullopt;
  }
  using namespace std::chrono;
  const year_month_day ymd{year(y), month(m), day(d)};
  if (!ymd.ok()) return std::nullopt;
  return sys_days(ymd).time_since_epoch().count();
}

}  // namespace ddl
