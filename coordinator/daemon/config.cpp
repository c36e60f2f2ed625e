#include "daemon/config.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "ddl/tls.h"

namespace ddl::coordinator {

using state::Status;

namespace {

template <typename T>
Status read(const nlohmann::json& j, const std::string& key, const std::string& origin, const char* type,
            T* out) {
  try {
    *out = j.get<T>();
  } catch (const nlohmann::json::exception&) {
    return Status::invalidArgument(origin + ": key '" + key + "' must be " + type + ", not " + j.dump());
  }
  return Status::ok();
}

}  // namespace

Status parseConfig(const std::string& text, const std::string& origin, DaemonConfig* config) {
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::invalidArgument(origin + ": not valid JSON: " + e.what());
  }
  if (!doc.is_object()) return Status::invalidArgument(origin + ": must hold a JSON object");
  for (const auto& [key, value] : doc.items()) {
    Status st;
    if (key == "listen") {
      st = read(value, key, origin, "a string \"HOST:PORT\"", &config->listen);
    } else if (key == "http") {
      st = read(value, key, origin, "a string \"HOST:PORT\"", &config->http);
    } else if (key == "http_tls" || key == "http_auth") {
      bool on = false;
      st = read(value, key, origin, "true or false", &on);
      (key == "http_tls" ? config->http_tls : config->http_auth) = on;
    } else if (key == "data_dir") {
      st = read(value, key, origin, "a string (a directory)", &config->data_dir);
    } else if (key == "heartbeat_grace_s") {
      st = read(value, key, origin, "a number of seconds", &config->heartbeat_grace_s);
    } else if (key == "heartbeat_interval_s") {
      st = read(value, key, origin, "a number of seconds", &config->heartbeat_interval_s);
    } else if (key == "stop_grace_s") {
      st = read(value, key, origin, "a number of seconds", &config->stop_grace_s);
    } else if (key == "port_first") {
      st = read(value, key, origin, "an integer port", &config->port_first);
    } else if (key == "port_last") {
      st = read(value, key, origin, "an integer port", &config->port_last);
    } else if (key == "log_level") {
      st = read(value, key, origin, "a string", &config->log_level);
    } else if (key == "pki_dir") {
      st = read(value, key, origin, "a string (a directory)", &config->pki_dir);
    } else if (key == "insecure") {
      st = read(value, key, origin, "true or false", &config->insecure);
    } else if (key == "allow_root_jobs") {
      st = read(value, key, origin, "true or false", &config->allow_root_jobs);
    } else if (key == "node_cert_days") {
      st = read(value, key, origin, "an integer number of days", &config->node_cert_days);
    } else if (key == "tls_refresh_s") {
      st = read(value, key, origin, "a number of seconds", &config->tls_refresh_s);
    } else {
      return Status::invalidArgument(origin + ": unknown key '" + key +
                                     "' (known: listen, http, data_dir, heartbeat_grace_s, heartbeat_interval_s, "
                                     "stop_grace_s, port_first, port_last, log_level, pki_dir, insecure, allow_root_jobs, "
                                     "node_cert_days, tls_refresh_s, http_tls, http_auth)");
    }
    if (!st) return st;
  }
  return Status::ok();
}

Status loadConfigFile(const std::string& path, DaemonConfig* config) {
  std::ifstream in(path);
  if (!in) return Status::invalidArgument("cannot read config file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parseConfig(text.str(), path, config);
}

Status validateConfig(const DaemonConfig& c) {
  auto bad = [](const std::string& m) { return Status::invalidArgument(m); };
  const size_t colon = c.listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == c.listen.size() ||
      c.listen.find_first_not_of("0123456789", colon + 1) != std::string::npos || c.listen.size() - colon > 6 ||
      std::stol(c.listen.substr(colon + 1)) > 65535) {
    return bad("listen '" + c.listen + "' is not HOST:PORT with PORT 0..65535 (e.g. 127.0.0.1:7070)");
  }
  if (c.data_dir.empty()) return bad("data_dir is empty");
  if (!(c.heartbeat_grace_s >= 0.1 && c.heartbeat_grace_s <= 86400)) {
    return bad("heartbeat_grace_s must be between 0.1 and 86400 seconds");
  }
  if (!(c.heartbeat_interval_s > 0) || c.heartbeat_interval_s >= c.heartbeat_grace_s) {
    return bad("heartbeat_interval_s must be > 0 and less than heartbeat_grace_s");
  }
  if (!(c.stop_grace_s >= 0 && c.stop_grace_s <= 86400)) return bad("stop_grace_s must be between 0 and 86400 seconds");
  if (c.port_first < 1024 || c.port_last > 65535 || c.port_last <= c.port_first) {
    return bad("port_first..port_last must lie in 1024..65535 and hold at least 2 ports");
  }
  if (c.pki_dir.empty() && !c.insecure) return bad("pki_dir is empty");
  if (c.node_cert_days < 1 || c.node_cert_days > 3650) return bad("node_cert_days must be between 1 and 3650");
  if (!(c.tls_refresh_s >= 1 && c.tls_refresh_s <= 86400)) return bad("tls_refresh_s must be between 1 and 86400");
  // The dashboard off loopback is HTTPS with tokens, whatever is set; a setting that says otherwise is a mistake.
  for (const auto& [key, value] : {std::pair{"http_tls", c.http_tls}, std::pair{"http_auth", c.http_auth}}) {
    if (value == false && !tls::isLoopback(c.http)) {
      return bad(std::string(key) + " is false, but http '" + c.http + "' is not a loopback address: there the " +
                 "dashboard always serves HTTPS and needs tokens (docs/dashboard.md); bind it to 127.0.0.1 for " +
                 "plain HTTP");
    }
  }
  if (c.http_tls == true && c.http_auth == false) return bad("http_tls needs tokens: set http_auth true or leave it out");
  static const char* levels[] = {"trace", "debug", "info", "warn", "error"};
  bool known = false;
  for (const char* l : levels) known = known || c.log_level == l;
  if (!known) return bad("log_level '" + c.log_level + "' is not one of trace, debug, info, warn, error");
  return Status::ok();
}

}  // namespace ddl::coordinator
