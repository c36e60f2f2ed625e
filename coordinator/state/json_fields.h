// Tolerant readers of a record's JSON (or MessagePack, read through nlohmann::json) fields, shared by the
// SQLite codec (jobs.extra) and the etcd record codec: a missing key, or a value of the wrong type, reads as
// the default, so one damaged record cannot keep the coordinator from loading the rest.
//
// Threads: pure functions.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace ddl::state::json_fields {

// o[key] as T (bool, std::string, a floating point or an integer type that holds the value), else fallback.
template <class T>
T field(const nlohmann::json& o, const char* key, T fallback) {
  auto it = o.find(key);
  if (it == o.end()) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    return it->is_boolean() ? it->get<bool>() : fallback;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return it->is_string() ? it->get<std::string>() : fallback;
  } else if constexpr (std::is_floating_point_v<T>) {
    return it->is_number() ? it->get<T>() : fallback;
  } else {
    if (!it->is_number_integer()) return fallback;
    const auto v = it->get<int64_t>();
    return v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max() ? fallback
                                                                                  : static_cast<T>(v);
  }
}

// The elements of the array o[key] that are T (std::string or int); empty when it is not an array.
template <class T>
std::vector<T> list(const nlohmann::json& o, const char* key) {
  std::vector<T> out;
  auto it = o.find(key);
  if (it == o.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if constexpr (std::is_same_v<T, std::string>) {
      if (v.is_string()) out.push_back(v.get<std::string>());
    } else {
      if (v.is_number_integer()) out.push_back(v.get<T>());
    }
  }
  return out;
}

}  // namespace ddl::state::json_fields
