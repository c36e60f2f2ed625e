// The topology grammar (topology_dims.h).
#include "common/topology_dims.h"

#include <algorithm>

namespace ddl {

std::string parseTopologyDims(std::string_view text, std::vector<int>* dims) {
  std::vector<int> out;
  long long product = 1;
  size_t pos = 0;
  while (true) {
    size_t end = text.find_first_of("xX", pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view part = text.substr(pos, end - pos);
    long long value = 0;
    bool digits = !part.empty();
    for (char c : part) {
      digits = digits && c >= '0' && c <= '9';
      // Held just above the cap once past it: no overflow however long the part.
      if (digits) value = std::min<long long>(value * 10 + (c - '0'), kMaxTopologyDim + 1LL);
    }
    if (!digits || value < 1) return "'" + std::string(part) + "' is not a positive integer";
    if (value > kMaxTopologyDim) {
      return "dimension '" + std::string(part) + "' is larger than " + std::to_string(kMaxTopologyDim);
    }
    if (out.size() == kMaxTopologyDims)
      return "more than " + std::to_string(kMaxTopologyDims) + " dimensions";
    out.push_back(static_cast<int>(value));
    product *= value;  // at most 2^31 * 2^20 before the check: no overflow
    if (product > kMaxTopologyRanks) return "the dimensions multiply to more than 2^31 ranks";
    if (end == text.size()) break;
    pos = end + 1;
  }
  *dims = std::move(out);
  return "";
}

long long topologyRanks(const std::vector<int>& dims) {
  long long p = 1;
  for (int d : dims) p *= d;
  return p;
}

std::string formatTopologyDims(const std::vector<int>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(dims[i]);
  }
  return s;
}

}  // namespace ddl
