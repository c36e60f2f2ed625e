// ddl-coordinator's settings file and its checks (config.h), and the store URL's grammar.
#include "daemon/config.h"

#include "common/host_port.h"
#include "common/json_config.h"

namespace ddl::coordinator {

using state::Status;

// The keys, in the order the unknown-key message lists them.
DDL_JSON_CONFIG(DaemonConfig, listen, http, data_dir, heartbeat_grace_s, heartbeat_interval_s, stop_grace_s,
                port_first, port_last, log_level, pki_dir, insecure, allow_root_jobs, node_cert_days,
                tls_refresh_s, http_tls, http_auth, history_retention_days, usage_retention_days,
                fairshare_half_life_days, fairshare_cpu_weight, fairshare_mem_weight, fairshare_preemption,
                finished_jobs_in_memory, store, etcd_ca, etcd_cert, etcd_key, etcd_insecure, leader_lease_s,
                etcd_max_txn_ops, etcd_max_txn_bytes, advertise)

namespace {

const ConfigHints& hints() {
  static const ConfigHints kHints = {
      {"listen", "a string \"HOST:PORT\""},
      {"http", "a string \"HOST:PORT\""},
      {"http_tls", "true or false"},
      {"http_auth", "true or false"},
      {"data_dir", "a string (a directory)"},
      {"heartbeat_grace_s", "a number of seconds"},
      {"heartbeat_interval_s", "a number of seconds"},
      {"stop_grace_s", "a number of seconds"},
      {"port_first", "an integer port"},
      {"port_last", "an integer port"},
      {"pki_dir", "a string (a directory)"},
      {"node_cert_days", "an integer number of days"},
      {"tls_refresh_s", "a number of seconds"},
      {"history_retention_days", "a number of days (0: keep forever)"},
      {"usage_retention_days", "an integer number of days"},
      {"fairshare_half_life_days", "a number of days"},
      {"fairshare_cpu_weight", "a number (GPU-seconds charged per CPU-second)"},
      {"fairshare_mem_weight", "a number (GPU-seconds charged per GiB-second)"},
      {"fairshare_preemption", "true or false"},
      {"finished_jobs_in_memory", "an integer count of jobs"},
      {"store", "a string: \"sqlite\" or \"etcd://HOST:PORT,HOST:PORT/PREFIX\""},
      {"etcd_ca", "a string (a PEM file)"},
      {"etcd_cert", "a string (a PEM file)"},
      {"etcd_key", "a string (a PEM file)"},
      {"etcd_insecure", "true or false"},
      {"leader_lease_s", "an integer number of seconds"},
      {"etcd_max_txn_ops", "an integer (etcd's --max-txn-ops)"},
      {"etcd_max_txn_bytes", "an integer number of bytes (under etcd's --max-request-bytes)"},
      {"advertise", "a string \"HOST:PORT\""},
  };
  return kHints;
}

}  // namespace

Status parseConfig(const std::string& text, const std::string& origin, DaemonConfig* config) {
  return parseJsonConfig(text, origin, config, hints());
}

Status loadConfigFile(const std::string& path, DaemonConfig* config) { return loadJsonConfig(path, config, hints()); }

StatusOr<StoreUrl> parseStoreUrl(const std::string& text) {
  StoreUrl url;
  if (text == "sqlite") return url;
  const std::string scheme = "etcd://";
  const auto bad = [&](const std::string& why) {
    return Status::invalidArgument("store '" + text + "': " + why +
                                   " (give \"sqlite\" or \"etcd://HOST:PORT,HOST:PORT/PREFIX\")");
  };
  if (text.compare(0, scheme.size(), scheme) != 0) return bad("unknown kind of store");
  url.etcd = true;
  std::string rest = text.substr(scheme.size());
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    std::string prefix = rest.substr(slash);
    rest.resize(slash);
    if (prefix.size() > 1) url.prefix = prefix.back() == '/' ? prefix : prefix + "/";
  }
  for (const std::string& endpoint : splitAddressList(rest)) {
    StatusOr<HostPort> hp = parseHostPort(endpoint);
    if (!hp || hp->port == 0) {
      return bad("'" + endpoint + "' is not an etcd member's HOST:PORT" +
                 (hp ? std::string(" (port 0)") : ": " + hp.status().message()));
    }
    url.endpoints.push_back(endpoint);
  }
  return url;
}

namespace {

// The etcd settings against the store they serve: TLS unless told otherwise, and plaintext only to loopback.
Status checkEtcdSettings(const DaemonConfig& c) {
  auto bad = [](const std::string& m) { return Status::invalidArgument(m); };
  StatusOr<StoreUrl> url = parseStoreUrl(c.store);
  if (!url) return url.status();
  const bool any_file = !c.etcd_ca.empty() || !c.etcd_cert.empty() || !c.etcd_key.empty();
  if (!url->etcd) {
    if (any_file || c.etcd_insecure) return bad("etcd_* settings are given, but store is \"sqlite\"");
    return Status::ok();
  }
  if (c.leader_lease_s < 2 || c.leader_lease_s > 60)
    return bad("leader_lease_s must be between 2 and 60 seconds");
  if (c.etcd_max_txn_ops < 2 || c.etcd_max_txn_ops > 1000000)
    return bad("etcd_max_txn_ops must be between 2 and 1000000 (etcd's --max-txn-ops)");
  if (c.etcd_max_txn_bytes < 65536 || c.etcd_max_txn_bytes > (int64_t{2} << 30))
    return bad("etcd_max_txn_bytes must be between 65536 and 2 GiB (under etcd's --max-request-bytes)");
  if (!c.advertise.empty()) {
    if (StatusOr<HostPort> a = parseHostPort(c.advertise); !a || a->port == 0) {
      return bad("advertise '" + c.advertise + "' is not HOST:PORT with a port");
    }
  }
  if (c.etcd_cert.empty() != c.etcd_key.empty()) return bad("etcd_cert and etcd_key go together");
  if (c.etcd_insecure) {
    if (any_file) return bad("etcd_insecure is set, and so are etcd TLS files: choose one");
    for (const std::string& e : url->endpoints) {
      if (!isLoopback(e)) {
        return bad("etcd_insecure is refused for '" + e +
                   "', which is not a loopback address: give etcd_ca " +
                   "(and etcd_cert, etcd_key) to reach etcd over TLS");
      }
    }
  } else if (c.etcd_ca.empty()) {
    return bad(
        "the etcd store needs etcd_ca (--etcd-ca: the CA of etcd's certificates, and etcd_cert/etcd_key " +
        std::string("where etcd checks clients); etcd_insecure allows plaintext toward loopback"));
  }
  return Status::ok();
}

}  // namespace

Status validateConfig(const DaemonConfig& c) {
  auto bad = [](const std::string& m) { return Status::invalidArgument(m); };
  if (StatusOr<HostPort> listen = parseHostPort(c.listen); !listen) {
    return bad("listen '" + c.listen + "' is not HOST:PORT with PORT 0..65535: " + listen.status().message() +
               " (e.g. 127.0.0.1:7070)");
  }
  if (StatusOr<HostPort> http = parseHostPort(c.http); !http) {
    return bad("http '" + c.http + "' is not HOST:PORT with PORT 0..65535: " + http.status().message() +
               " (e.g. 127.0.0.1:7080)");
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
  if (!(c.history_retention_days >= 0 && c.history_retention_days <= 36500)) {
    return bad("history_retention_days must be between 0 (keep forever) and 36500");
  }
  if (c.usage_retention_days < 32 || c.usage_retention_days > 36500) {
    return bad(
        "usage_retention_days must be between 32 (GPU-hours budgets count up to a month of the rollups) "
        "and 36500");
  }
  if (!(c.fairshare_half_life_days >= 0.001 && c.fairshare_half_life_days <= 3650)) {
    return bad("fairshare_half_life_days must be between 0.001 and 3650");
  }
  for (const auto& [key, value] : {std::pair{"fairshare_cpu_weight", c.fairshare_cpu_weight},
                                   std::pair{"fairshare_mem_weight", c.fairshare_mem_weight}}) {
    if (!(value >= 0 && value <= 1000)) return bad(std::string(key) + " must be between 0 and 1000");
  }
  if (c.finished_jobs_in_memory < 0 || c.finished_jobs_in_memory > 1000000) {
    return bad("finished_jobs_in_memory must be between 0 and 1000000");
  }
  // The dashboard off loopback is HTTPS with tokens, whatever is set; a setting that says otherwise is a mistake.
  for (const auto& [key, value] : {std::pair{"http_tls", c.http_tls}, std::pair{"http_auth", c.http_auth}}) {
    if (value == false && !isLoopback(c.http)) {
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
  return checkEtcdSettings(c);
}

}  // namespace ddl::coordinator
