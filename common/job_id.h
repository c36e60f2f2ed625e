// Job ids, "j-000042": the one definition the coordinator, the dashboard and ddlctl share (header-only); and
// the rule for a submit's request id, which ddlctl checks before sending and the coordinator on arrival.
//
// The number is a store-assigned sequence that is never reused; the zero padding makes the common case sort
// as text the way it sorts as a number. Past 999999 the number simply grows wider ("j-1000000"): compare ids
// with jobIdNumber(), not as text.
#pragma once

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

namespace ddl {

inline std::string formatJobId(int64_t number) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "j-%06lld", static_cast<long long>(number));
  return buf;
}

namespace job_id_detail {
// 1 to 18 decimal digits making a positive number, else nullopt.
inline std::optional<int64_t> positiveNumber(std::string_view digits) {
  if (digits.empty() || digits.size() > 18) return std::nullopt;
  int64_t n = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  if (n <= 0) return std::nullopt;
  return n;
}
}  // namespace job_id_detail

// The number inside a job id, or nullopt when the text is not one ("j-" then 1 to 18 digits, positive).
inline std::optional<int64_t> jobIdNumber(std::string_view id) {
  if (id.substr(0, 2) != "j-") return std::nullopt;
  return job_id_detail::positiveNumber(id.substr(2));
}

// A job id as users may type it: "j-000042", "j-42", "42" or "000042" all mean j-000042. nullopt otherwise.
inline std::optional<std::string> canonicalJobId(std::string_view text) {
  if (text.substr(0, 2) == "j-") text.remove_prefix(2);
  auto n = job_id_detail::positiveNumber(text);
  if (!n) return std::nullopt;
  return formatJobId(*n);
}

// A submit's request id (SubmitRequest.request_id): at most kMaxRequestIdBytes of letters, digits and . _ : -
// ("" is none).
inline constexpr size_t kMaxRequestIdBytes = 128;

// Why `id` is not a request id, or "".
inline std::string requestIdProblem(std::string_view id) {
  if (id.size() > kMaxRequestIdBytes)
    return "the request id is " + std::to_string(id.size()) + " bytes; the limit is " +
           std::to_string(kMaxRequestIdBytes);
  for (size_t i = 0; i < id.size(); ++i) {
    const char c = id[i];
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' && c != '-')
      return "the request id has a character other than letters, digits and . _ : - at byte " +
             std::to_string(i);
  }
  return "";
}

}  // namespace ddl
