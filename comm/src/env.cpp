// The environment's values and the number parsers (env.h).
#include "env.h"

#include <cerrno>
#include <cstdlib>

#include "error.h"

namespace ddl {

std::string getEnv(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

long long parseInt(const std::string& text, const char* what, long long lo, long long hi) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno || *end != '\0' || v < lo || v > hi) {
    fail(ddlInvalidArgument, std::string(what) + " must be an integer in [" + std::to_string(lo) + ", " +
                                 std::to_string(hi) + "], got '" + text + "'");
  }
  return v;
}

long long parseByteCount(const std::string& text, const char* what, long long lo, long long hi) {
  std::string digits = text;
  int shift = 0;
  if (!digits.empty()) {
    const char last = digits.back();
    shift = last == 'K' || last == 'k'   ? 10
            : last == 'M' || last == 'm' ? 20
            : last == 'G' || last == 'g' ? 30
                                         : 0;
    if (shift) digits.pop_back();
  }
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(digits.c_str(), &end, 10);
  if (digits.empty() || errno || *end != '\0' || v < 0 || v > (hi >> shift) || (v << shift) < lo) {
    fail(ddlInvalidArgument, std::string(what) + " must be a byte count from " + std::to_string(lo) + " to " +
                                 std::to_string(hi) +
                                 " (a K, M or G suffix multiplies by 1024, 1024^2, 1024^3), got '" + text +
                                 "'");
  }
  return v << shift;
}

}  // namespace ddl
