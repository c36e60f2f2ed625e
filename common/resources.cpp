#include "common/resources.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ddl {

namespace {

bool parseId(std::string_view s, int* out) {
  if (s.empty() || s.size() > 6) return false;
  int v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < 0 || v > kMaxCpuId) return false;
  *out = v;
  return true;
}

}  // namespace

std::string parseCpuList(std::string_view text, std::vector<int>* out) {
  std::vector<int> ids;
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    std::string_view part = text.substr(start, comma == std::string_view::npos ? comma : comma - start);
    start = comma == std::string_view::npos ? text.size() : comma + 1;
    size_t dash = part.find('-');
    int lo = 0, hi = 0;
    if (dash == std::string_view::npos) {
      if (!parseId(part, &lo)) return "a CPU list is ids and ranges such as 0-3,8 (ids 0 to 65535)";
      hi = lo;
    } else if (!parseId(part.substr(0, dash), &lo) || !parseId(part.substr(dash + 1), &hi) || hi < lo) {
      return "a CPU list is ids and ranges such as 0-3,8 (ids 0 to 65535, each range low-high)";
    }
    for (int id = lo; id <= hi; ++id) ids.push_back(id);
    if (ids.size() > static_cast<size_t>(kMaxCpuId) + 1) return "the CPU list repeats ids";
    if (comma != std::string_view::npos && start == text.size()) return "the CPU list ends with a comma";
  }
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  *out = std::move(ids);
  return "";
}

std::string formatCpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string s;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(cpus[i]);
    if (j > i) s += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return s;
}

std::string parseByteSize(std::string_view text, int64_t* bytes) {
  constexpr const char* kForms = "give a size such as 512M, 8G or 1.5T (binary units, as Slurm's --mem)";
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  std::string number(text.substr(0, i));
  std::string unit(text.substr(i));
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1) return kForms;
  double scale = 1;
  static const struct {
    const char* name;
    double scale;
  } kUnits[] = {{"", 1},
                {"B", 1},
                {"K", 1024.0},
                {"KB", 1024.0},
                {"KIB", 1024.0},
                {"M", 1048576.0},
                {"MB", 1048576.0},
                {"MIB", 1048576.0},
                {"G", 1073741824.0},
                {"GB", 1073741824.0},
                {"GIB", 1073741824.0},
                {"T", 1099511627776.0},
                {"TB", 1099511627776.0},
                {"TIB", 1099511627776.0}};
  bool known = false;
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      scale = u.scale;
      known = true;
    }
  }
  if (!known) return kForms;
  if (scale == 1 && number.find('.') != std::string::npos) return "a size in bytes is a whole number";
  const double value = std::strtod(number.c_str(), nullptr) * scale;
  if (!(value >= 1)) return "a size must be at least one byte";
  if (value > std::ldexp(1.0, 50)) return "a size must be at most 1 PiB";
  *bytes = static_cast<int64_t>(std::llround(value));
  return "";
}

std::string formatBytes(int64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (u < 5 && std::fabs(v) >= 1024) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0 || std::fabs(v - std::round(v)) < 0.05)
    std::snprintf(buf, sizeof buf, "%.0f %s", v, kUnits[u]);
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

std::string formatGpuHours(double hours) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.3f", hours);
  std::string out = text;
  while (out.back() == '0') out.pop_back();  // "0.100" -> "0.1", "5000.000" -> "5000."
  if (out.back() == '.') out.pop_back();
  return out;
}

}  // namespace ddl
