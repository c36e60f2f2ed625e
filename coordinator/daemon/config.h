// ddl-coordinator's settings: built-in defaults, then the JSON config file (--config), then command-line
// flags, each overriding the one before. Unknown keys and wrong types are errors that name the key, so a
// typo in /etc/ddl/coordinator.json stops the daemon at start instead of being silently ignored.
//
// Threads: plain values and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace ddl::coordinator {

struct DaemonConfig {
  std::string listen = "127.0.0.1:7070";  // gRPC, for agents and ddlctl; port 0 = any free port
  std::string http = "127.0.0.1:7080";    // dashboard, JSON API, /metrics, /healthz (read-only)
  // Off loopback the dashboard always serves HTTPS and needs a user's token (false there is an error); on
  // loopback it is plain and open unless asked: http_tls = HTTPS with the coordinator's certificate and tokens,
  // http_auth = tokens over plain HTTP (behind a proxy that adds TLS). Unset = the address decides.
  std::optional<bool> http_tls;
  std::optional<bool> http_auth;
  std::string data_dir = "/var/lib/ddl/coordinator";
  double heartbeat_grace_s = 10;
  double heartbeat_interval_s = 1;
  double stop_grace_s = 10;
  int port_first = 29500;  // default rendezvous port range of agents that give none
  int port_last = 29999;
  std::string log_level = "info";  // trace, debug, info, warn, error
  // Security (docs/security.md). TLS with the certificates in pki_dir unless insecure, which is refused on any
  // address but loopback.
  std::string pki_dir = "/etc/ddl/pki";
  bool insecure = false;
  bool allow_root_jobs = false;   // jobs of root are refused, and agents refuse uid 0 ranks, unless set
  int node_cert_days = 365;       // validity of the node certificates the coordinator issues
  double tls_refresh_s = 60;      // how often certificate files are re-read (rotation without a restart)
  double history_retention_days = 30;   // finished jobs leave the database after this; 0 keeps them forever
  int usage_retention_days = 400;       // daily usage rollups (ddlctl usage) are kept this long
  // Fair-share (placement/fair_share.h): usage halves in this many days; a job is charged per second 1 per
  // GPU, fairshare_cpu_weight per CPU and fairshare_mem_weight per GiB it holds (Slurm's TRESBillingWeights).
  double fairshare_half_life_days = 7;
  double fairshare_cpu_weight = 0;
  double fairshare_mem_weight = 0;
  // The head job may preempt jobs of other accounts where its account, with it, holds no more GPUs for its
  // share than theirs without them (placement/preemption.h); they get their QoS's grace and are requeued.
  bool fairshare_preemption = false;
  int finished_jobs_in_memory = 10000;  // the most recent finished jobs kept in memory; older ones are read back
  // Where the state lives (parseStoreUrl): "sqlite", a file in data_dir (one coordinator), or
  // "etcd://HOST:PORT,HOST:PORT/PREFIX", an etcd cluster that several coordinators share (one leads, the
  // others wait: docs/operations.md, "Several coordinators"). etcd is reached over TLS with etcd_ca (and the
  // client certificate etcd_cert/etcd_key where etcd checks clients); plaintext only with etcd_insecure,
  // toward loopback.
  std::string store = "sqlite";
  std::string etcd_ca, etcd_cert, etcd_key;
  bool etcd_insecure = false;
  int leader_lease_s = 3;  // the leader's etcd lease: a dead leader is replaced after about this long
  // What one etcd transaction may take: etcd's --max-txn-ops and (less gRPC's own) --max-request-bytes. A
  // batch of the coordinator's is one transaction: an array of more jobs than this, or a job whose record
  // could pass it, is refused at submit. Raise both here and in etcd for larger arrays and jobs.
  int etcd_max_txn_ops = 128;
  int64_t etcd_max_txn_bytes = (3 << 19) - (32 << 10);
  std::string advertise;   // HOST:PORT other coordinators name this one by when it leads ("" = listen)
};

// A parsed `store` setting.
struct StoreUrl {
  bool etcd = false;
  std::vector<std::string> endpoints;  // HOST:PORT each
  std::string prefix = "/ddl/";        // every key lives under it; ends in '/'
};
// "sqlite", or "etcd://HOST:PORT[,HOST:PORT...][/PREFIX]"; INVALID_ARGUMENT says what is wrong.
state::StatusOr<StoreUrl> parseStoreUrl(const std::string& text);

// Reads the JSON object at `path` over `config`. Keys: listen, http, data_dir, heartbeat_grace_s,
// heartbeat_interval_s, stop_grace_s, port_first, port_last, log_level, pki_dir, insecure, allow_root_jobs,
// node_cert_days, tls_refresh_s, http_tls, http_auth, history_retention_days, usage_retention_days,
// fairshare_half_life_days, fairshare_cpu_weight, fairshare_mem_weight, fairshare_preemption,
// finished_jobs_in_memory, store,
// etcd_ca, etcd_cert, etcd_key, etcd_insecure, leader_lease_s, etcd_max_txn_ops, etcd_max_txn_bytes,
// advertise.
state::Status loadConfigFile(const std::string& path, DaemonConfig* config);
// Parses JSON text (what loadConfigFile reads); `origin` names it in errors.
state::Status parseConfig(const std::string& text, const std::string& origin, DaemonConfig* config);
// Checks ranges and combinations once everything is applied.
state::Status validateConfig(const DaemonConfig& config);

}  // namespace ddl::coordinator
