#include "common/array_spec.h"

#include <set>

namespace ddl {

namespace {

// 1 to 9 decimal digits.
bool number(std::string_view t, int* out) {
  if (t.empty() || t.size() > 9) return false;
  int v = 0;
  for (char c : t) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

std::string parseArraySpec(std::string_view text, ArraySpec* out) {
  if (text.size() > kMaxArraySpecBytes)
    return "it is " + std::to_string(text.size()) + " bytes; the limit is " + std::to_string(kMaxArraySpecBytes);
  // Only these characters: what the messages below echo of the text is then safe to print.
  if (text.find_first_not_of("0123456789,-:%") != std::string_view::npos)
    return "only digits and , - : % may appear";
  *out = ArraySpec{};
  std::string_view list = text;
  if (auto pct = list.find('%'); pct != std::string_view::npos) {
    if (!number(list.substr(pct + 1), &out->max_running) || out->max_running < 1)
      return "the limit after % must be a whole number of at least 1";
    list = list.substr(0, pct);
  }
  std::set<int> seen;
  size_t steps = 0;  // indices produced, duplicates included
  while (!list.empty()) {
    const size_t comma = list.find(',');
    const std::string_view part = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (comma != std::string_view::npos && list.empty()) return "it ends with a comma";
    int first = 0, last = 0, step = 1;
    std::string_view range = part;
    if (auto colon = part.find(':'); colon != std::string_view::npos) {
      if (!number(part.substr(colon + 1), &step) || step < 1) return "a step must be a whole number of at least 1";
      range = part.substr(0, colon);
    }
    if (auto dash = range.find('-'); dash != std::string_view::npos) {
      if (!number(range.substr(0, dash), &first) || !number(range.substr(dash + 1), &last))
        return "'" + std::string(part) + "' is not FIRST-LAST";
    } else {
      if (!number(range, &first)) return "'" + std::string(part) + "' is not an index";
      if (range.size() != part.size()) return "a step needs a range, as in 0-15:4";
      last = first;
    }
    if (first > last) return "'" + std::string(part) + "' counts down";
    if (last > kMaxArrayIndex) return "indices go up to " + std::to_string(kMaxArrayIndex);
    if ((last - first) / step + 1 > static_cast<int>(kMaxArrayJobs - steps))
      return "more than " + std::to_string(kMaxArrayJobs) + " jobs";
    for (int i = first; i <= last; i += step, ++steps) seen.insert(i);
  }
  if (seen.empty()) return "no index";
  out->indices.assign(seen.begin(), seen.end());
  return "";
}

}  // namespace ddl
