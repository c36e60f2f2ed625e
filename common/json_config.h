// Settings files in JSON: the one loader behind the coordinator's and the agent's config files.
//
// A settings struct lists its keys once, with DDL_JSON_CONFIG (the nlohmann/json macro
// NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT, plus the key list in declared order for messages).
// Loading applies a file over the struct's current values (defaults, or what the caller set before):
//   - the file must be at most kMaxConfigBytes and hold one JSON object;
//   - a key the struct does not declare is refused, naming the key, the file and the keys there are;
//   - a value that does not convert, or converts with a loss (1.5 or 1e12 into an int), is refused,
//     naming the key and what it must be (a per-key hint such as "a number of seconds", else the JSON
//     type of its default).
// Nothing is changed unless the whole file is good. std::optional<T> members read null as "unset".
//
// Threads: pure functions over their arguments.
#pragma once

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

// std::optional<T> as null or a T (nlohmann/json 3.11 has no support of its own).
namespace nlohmann {
template <typename T>
struct adl_serializer<std::optional<T>> {
  static void to_json(json& j, const std::optional<T>& value) {
    if (value) {
      j = *value;
    } else {
      j = nullptr;
    }
  }
  static void from_json(const json& j, std::optional<T>& value) {
    if (j.is_null()) {
      value.reset();
    } else {
      value = j.get<T>();
    }
  }
};
}  // namespace nlohmann

// In the namespace of Type, after its definition: DDL_JSON_CONFIG(AgentConfig, coordinator, node, ...).
#define DDL_JSON_CONFIG(Type, ...)                                   \
  NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Type, __VA_ARGS__) \
  [[maybe_unused]] inline constexpr std::string_view ddlJsonConfigKeys(const Type*) { return #__VA_ARGS__; }

namespace ddl {

inline constexpr size_t kMaxConfigBytes = size_t{1} << 20;

// What a key's value must be, for messages: {"listen", "a string \"HOST:PORT\""}. Keys without one are
// described by the JSON type of their current value.
using ConfigHints = std::map<std::string, std::string, std::less<>>;

namespace config_detail {

// The file's text, at most max_bytes. Errors: "cannot read config file PATH: ...", "... is larger than ...".
StatusOr<std::string> readFile(const std::string& path, size_t max_bytes);
// One JSON object, or "ORIGIN: not valid JSON: ..." / "ORIGIN: must hold a JSON object".
StatusOr<nlohmann::json> parseObject(const std::string& text, const std::string& origin, size_t max_bytes);
// "ORIGIN: unknown key 'k' (known: a, b, c)" when `key` is not in `keys` (DDL_JSON_CONFIG's list); OK else.
Status checkKnown(std::string_view key, std::string_view keys, const std::string& origin);
// "ORIGIN: key 'k' must be HINT, not VALUE".
Status wrongType(const std::string& key, const nlohmann::json& value, const nlohmann::json& current,
                 const std::string& origin, const ConfigHints& hints);

}  // namespace config_detail

// Applies the JSON object `doc` over *config (see the top of this file); `origin` names the file in errors.
template <typename T>
Status applyJsonConfig(const nlohmann::json& doc, const std::string& origin, T* config,
                       const ConfigHints& hints = {}) {
  if (!doc.is_object()) return Status::invalidArgument(origin + ": must hold a JSON object");
  nlohmann::json current = *config;
  for (const auto& [key, value] : doc.items()) {
    if (Status st = config_detail::checkKnown(key, ddlJsonConfigKeys(config), origin); !st) return st;
    // A number written as a double for an integer setting (7070.0) must be whole and within an int's range
    // before anything converts it: converting a double out of that range is undefined (found by fuzzing:
    // "port_last": 2.4e35).
    if (value.is_number_float() && current.contains(key) && current.at(key).is_number_integer()) {
      const double d = value.template get<double>();
      if (!(d >= -2147483648.0 && d <= 2147483647.0 && d == static_cast<double>(static_cast<int64_t>(d)))) {
        return config_detail::wrongType(key, value, current.at(key), origin, hints);
      }
    }
    nlohmann::json next = current;
    next[key] = value;
    try {
      // The round trip shows a lossy conversion: 1.5 read into an int comes back as 1.
      const nlohmann::json back = next.template get<T>();
      if (back.at(key) != value) return config_detail::wrongType(key, value, current.at(key), origin, hints);
    } catch (const nlohmann::json::exception&) {
      return config_detail::wrongType(key, value, current.at(key), origin, hints);
    }
    current = std::move(next);
  }
  *config = current.template get<T>();
  return Status::ok();
}

// parseObject + applyJsonConfig: for text that did not come from a file (tests, flags).
template <typename T>
Status parseJsonConfig(const std::string& text, const std::string& origin, T* config,
                       const ConfigHints& hints = {}, size_t max_bytes = kMaxConfigBytes) {
  StatusOr<nlohmann::json> doc = config_detail::parseObject(text, origin, max_bytes);
  if (!doc) return doc.status();
  return applyJsonConfig(*doc, origin, config, hints);
}

// Reads the file at `path` over *config.
template <typename T>
Status loadJsonConfig(const std::string& path, T* config, const ConfigHints& hints = {},
                      size_t max_bytes = kMaxConfigBytes) {
  StatusOr<std::string> text = config_detail::readFile(path, max_bytes);
  if (!text) return text.status();
  return parseJsonConfig(*text, path, config, hints, max_bytes);
}

}  // namespace ddl
