#include "common/json_config.h"

#include <cerrno>
#include <cstring>
#include <fstream>

namespace ddl::config_detail {

namespace {

std::string describe(const nlohmann::json& sample) {
  switch (sample.type()) {
    case nlohmann::json::value_t::string:
      return "a string";
    case nlohmann::json::value_t::boolean:
      return "true or false";
    case nlohmann::json::value_t::number_integer:
      return "an integer";
    case nlohmann::json::value_t::number_unsigned:
      return "an integer of 0 or more";
    case nlohmann::json::value_t::number_float:
      return "a number";
    case nlohmann::json::value_t::object:
      return "an object";
    case nlohmann::json::value_t::array:
      return "a list";
    default:
      return "a value of another type";
  }
}

}  // namespace

StatusOr<std::string> readFile(const std::string& path, size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::invalidArgument("cannot read config file " + path + ": " + std::strerror(errno));
  std::string text(max_bytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad())
    return Status::invalidArgument("cannot read config file " + path + ": " + std::strerror(errno));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > max_bytes) {
    return Status::invalidArgument("config file " + path + " is larger than " + std::to_string(max_bytes) +
                                   " bytes; is it the right file?");
  }
  return text;
}

StatusOr<nlohmann::json> parseObject(const std::string& text, const std::string& origin, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return Status::invalidArgument(origin + ": larger than " + std::to_string(max_bytes) + " bytes");
  }
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number like 2e9500
    return Status::invalidArgument(origin + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object()) return Status::invalidArgument(origin + ": must hold a JSON object");
  return doc;
}

Status checkKnown(std::string_view key, std::string_view keys, const std::string& origin) {
  size_t start = 0;
  while (start < keys.size()) {
    size_t end = keys.find(',', start);
    if (end == std::string_view::npos) end = keys.size();
    std::string_view k = keys.substr(start, end - start);
    while (!k.empty() && k.front() == ' ') k.remove_prefix(1);
    while (!k.empty() && k.back() == ' ') k.remove_suffix(1);
    if (k == key) return Status::ok();
    start = end + 1;
  }
  return Status::invalidArgument(origin + ": unknown key '" + std::string(key) +
                                 "' (known: " + std::string(keys) + ")");
}

Status wrongType(const std::string& key, const nlohmann::json& value, const nlohmann::json& current,
                 const std::string& origin, const ConfigHints& hints) {
  auto hint = hints.find(key);
  std::string shown = value.dump();
  if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
  return Status::invalidArgument(origin + ": key '" + key + "' must be " +
                                 (hint != hints.end() ? hint->second : describe(current)) + ", not " + shown);
}

}  // namespace ddl::config_detail
