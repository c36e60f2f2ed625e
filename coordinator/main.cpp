// ddl-coordinator: the cluster daemon. Reads its settings (daemon/config.h), opens the SQLite state in the data
// directory, recovers jobs and nodes, serves gRPC over TLS (docs/security.md), and runs until SIGTERM or SIGINT,
// then shuts down cleanly: agent streams end, calls in flight finish, the store closes. Running ranks are not
// touched: agents keep them and report them to the next coordinator.
//
// Its PKI tools are subcommands: init-pki DIR (the CA, the coordinator's certificate, the first admin),
// renew-cert (a new coordinator certificate, picked up by the running daemon) and issue-node NAME (a node's
// certificate, signed offline with the CA key).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <cstdio>
#include <fstream>

#include "auth/pki_dir.h"
#include "auth/users.h"
#include "common/pki.h"
#include "common/signals.h"
#include "common/version.h"
#include "ddl/tls.h"
#include "daemon/config.h"
#include "http/http_server.h"
#include "rpc/server.h"
#include "service/coordinator.h"
#include "state/data_dir_lock.h"
#include "state/sqlite_store.h"

#ifdef DDL_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

using namespace ddl::coordinator;

namespace {

int fail(const std::string& message) {
  spdlog::critical("{}", message);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddl-coordinator: places gang-scheduled jobs on GPU nodes and tracks them durably"};
  std::string config_path;
  std::optional<std::string> listen, http_listen, data_dir, log_level;
  std::optional<double> grace;
  app.add_option("--config", config_path, "JSON config file (e.g. /etc/ddl/coordinator.json)");
  app.add_option("--listen", listen, "gRPC address HOST:PORT for agents and ddlctl (default 127.0.0.1:7070)");
  app.add_option("--http", http_listen, "dashboard, JSON API and /metrics HOST:PORT (default 127.0.0.1:7080; any "
                                        "other address serves HTTPS and needs tokens)");
  bool http_tls = false, http_auth = false;
  app.add_flag("--http-tls", http_tls, "dashboard over HTTPS with tokens on a loopback address too");
  app.add_flag("--http-auth", http_auth, "dashboard tokens on a loopback address too, over plain HTTP");
  app.add_option("--data-dir", data_dir, "directory for the state database (default /var/lib/ddl/coordinator)");
  app.add_option("--heartbeat-grace", grace, "seconds without a heartbeat before a node is DOWN (default 10)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error (default info)");
  std::optional<std::string> pki_dir;
  bool insecure = false, allow_root = false;
  app.add_option("--pki-dir", pki_dir, "the cluster's certificates and users (default /etc/ddl/pki)");
  app.add_flag("--insecure", insecure,
               "plaintext gRPC with no authentication: development only, refused on any address but loopback");
  app.add_flag("--allow-root-jobs", allow_root, "let jobs of root run (ranks as uid 0); refused by default");

  // PKI tools: each runs, prints, and exits.
  auth::InitPkiOptions init;
  int days = 365;
  std::string node_name, out_dir;
  std::vector<std::string> names;
  CLI::App* init_pki = app.add_subcommand("init-pki", "make the cluster CA, the coordinator's certificate and the "
                                                      "first admin's token in DIR");
  init_pki->add_option("DIR", init.dir, "directory (e.g. /etc/ddl/pki)")->required();
  init_pki->add_option("--name", init.names, "another DNS name or IP address for the coordinator's certificate "
                                             "(repeatable; ddl-coordinator, localhost and this host are always in)");
  init_pki->add_option("--days", init.cert_days, "the coordinator certificate's validity (default 365)");
  init_pki->add_option("--ca-days", init.ca_days, "the CA's validity (default 3650)");
  init_pki->add_option("--admin", init.admin, "the first admin user's name (default admin)");
  CLI::App* renew = app.add_subcommand("renew-cert", "a new certificate for the coordinator, from the CA in "
                                                     "--pki-dir; the running coordinator picks it up");
  renew->add_option("--name", names, "another DNS name or IP address (repeatable)");
  renew->add_option("--days", days, "validity (default 365)");
  CLI::App* issue = app.add_subcommand("issue-node", "sign a node certificate with the CA in --pki-dir and write "
                                                     "ca.crt, node.crt and node.key into --out");
  issue->add_option("NAME", node_name, "the node's name (as ddl-agent --node gives it)")->required();
  issue->add_option("--out", out_dir, "directory for the node's files")->required();
  issue->add_option("--days", days, "validity (default 365)");
  app.set_version_flag("--version", std::string("ddl-coordinator ") + ddl::kVersion, "print the version and exit");
  app.require_subcommand(0, 1);
  CLI11_PARSE(app, argc, argv);

  const std::string pki = pki_dir.value_or(DaemonConfig{}.pki_dir);
  if (init_pki->parsed()) {
    auto token = auth::initPki(init);
    if (!token) return fail(token.status().message());
    std::printf("made the cluster CA and the coordinator's certificate in %s\n"
                "first admin: %s, token in %s/%s (give it to ddlctl: --token-file, $DDL_TOKEN or "
                "~/.config/ddl/token)\n"
                "keep %s/%s secret: whoever holds it can make node certificates\n",
                init.dir.c_str(), init.admin.c_str(), init.dir.c_str(), ddl::pki::kAdminToken, init.dir.c_str(),
                ddl::pki::kCaKey);
    return 0;
  }
  if (renew->parsed()) {
    if (auto st = auth::renewCoordinatorCert(pki, names, days); !st) return fail(st.message());
    std::printf("renewed %s/%s; a running coordinator serves it within its tls_refresh_s\n", pki.c_str(),
                ddl::pki::kCoordinatorCert);
    return 0;
  }
  if (issue->parsed()) {
    if (auto st = auth::issueNodeFiles(pki, node_name, days, out_dir); !st) return fail(st.message());
    std::printf("wrote %s/{ca.crt,node.crt,node.key} for node %s\n", out_dir.c_str(), node_name.c_str());
    return 0;
  }

  DaemonConfig config;
  if (!config_path.empty()) {
    auto st = loadConfigFile(config_path, &config);
    if (!st) return fail(st.message());
  }
  if (listen) config.listen = *listen;
  if (http_listen) config.http = *http_listen;
  if (http_tls) config.http_tls = true;
  if (http_auth) config.http_auth = true;
  if (data_dir) config.data_dir = *data_dir;
  if (grace) config.heartbeat_grace_s = *grace;
  if (log_level) config.log_level = *log_level;
  if (pki_dir) config.pki_dir = *pki_dir;
  if (insecure) config.insecure = true;
  if (allow_root) config.allow_root_jobs = true;
  if (grace && config.heartbeat_interval_s >= config.heartbeat_grace_s) {
    config.heartbeat_interval_s = config.heartbeat_grace_s / 4;  // keep the default ratio for short graces
  }
  if (auto st = validateConfig(config); !st) return fail("bad setting: " + st.message());
  spdlog::set_level(spdlog::level::from_str(config.log_level));

  // Security first: a coordinator that cannot serve TLS says so before it touches its state.
  if (config.insecure) {
    if (auto why = ddl::tls::checkInsecure(config.listen, "ddl-coordinator"); !why.empty()) return fail(why);
  } else if (auto st = RpcServer::checkTlsFiles(config.pki_dir); !st) {
    return fail(st.message());
  }
  std::error_code ec;
  std::filesystem::create_directories(config.data_dir, ec);
  if (ec) return fail("cannot create data directory " + config.data_dir + ": " + ec.message());
  auto lock = ddl::state::DataDirLock::acquire(config.data_dir);  // held until exit: one writer per data dir
  if (!lock) return fail(lock.status().message());
  ddl::state::SqliteStore::Options store_options;
  store_options.path = config.data_dir + "/state.db";
  auto store = ddl::state::SqliteStore::open(store_options);
  if (!store) return fail(store.status().message());

  // Block the stop signals in every thread; the main thread waits for them below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  CoordinatorOptions options;
  options.heartbeat_grace_ms = static_cast<int64_t>(config.heartbeat_grace_s * 1000);
  options.heartbeat_interval_ms = static_cast<int64_t>(config.heartbeat_interval_s * 1000);
  options.stop_grace_ms = static_cast<int64_t>(config.stop_grace_s * 1000);
  options.port_first = config.port_first;
  options.port_last = config.port_last;
  options.allow_root_jobs = config.allow_root_jobs;
  options.history_retention_ms = static_cast<int64_t>(config.history_retention_days * 86400000.0);
  options.max_finished_in_memory = static_cast<size_t>(config.finished_jobs_in_memory);
  Coordinator coordinator(**store, options);
  if (auto st = coordinator.recover(); !st) return fail("recovering state from " + store_options.path + ": " + st.message());

  // Users are read when there is a PKI directory (an --insecure coordinator may still have one: tokens then
  // name their users, and calls without one are anonymous).
  std::unique_ptr<auth::UserRegistry> users;
  std::error_code pki_ec;
  if (!config.insecure || std::filesystem::exists(config.pki_dir + "/" + ddl::pki::kUsersFile, pki_ec)) {
    auto opened = auth::UserRegistry::open(config.pki_dir + "/" + ddl::pki::kUsersFile);
    if (!opened) return fail(opened.status().message());
    users = std::move(*opened);
    if (!config.insecure && users->size() == 0) {
      spdlog::warn("{}/{} has no users: nobody can submit jobs (ddl-coordinator init-pki makes the first admin)",
                   config.pki_dir, ddl::pki::kUsersFile);
    }
  }
  SecurityOptions security;
  security.insecure = config.insecure;
  security.pki_dir = config.pki_dir;
  security.users = users.get();
  security.allow_root_jobs = config.allow_root_jobs;
  security.node_cert_days = config.node_cert_days;
  security.refresh_s = static_cast<unsigned>(config.tls_refresh_s);
  if (config.insecure) {
    spdlog::warn("--insecure: plaintext gRPC and no authentication; any local process can act as any user");
  }
  RpcServer server(coordinator, security);
  std::string bound;
  if (auto st = server.start(config.listen, &bound); !st) return fail(st.message());
  ddl::coordinator::http::HttpServer dashboard(
      coordinator, {config.http_tls.value_or(false), config.http_auth.value_or(false), config.pki_dir, users.get()});
  std::string http_bound;
  if (auto st = dashboard.start(config.http, &http_bound); !st) return fail(st.message());
  coordinator.start();
  {
    std::ofstream out(config.data_dir + "/coordinator.http");
    out << http_bound << "\n";
  }
  spdlog::info("dashboard on {}://{}/ (JSON API /api/v1, Prometheus /metrics)", dashboard.scheme(), http_bound);
  // Scripts and tests that asked for port 0 read the real address here.
  const std::string addr_file = config.data_dir + "/coordinator.addr";
  {
    std::ofstream out(addr_file + ".tmp");
    out << bound << "\n";
  }
  std::filesystem::rename(addr_file + ".tmp", addr_file, ec);
  spdlog::info("ddl-coordinator listening on {} (state in {})", bound, store_options.path);
#ifdef DDL_HAVE_SYSTEMD
  sd_notify(0, "READY=1");  // Type=notify unit (deploy/systemd/); a no-op outside systemd
#endif

  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("{}: shutting down", ddl::signalName(sig));
#ifdef DDL_HAVE_SYSTEMD
  sd_notify(0, "STOPPING=1");
#endif
  // Agent streams first, then callers (their calls finish while the coordinator still answers and stores),
  // then the coordinator, which stores what is left.
  coordinator.closeAgents();
  server.shutdown();
  dashboard.stop();
  coordinator.stop();
  std::filesystem::remove(addr_file, ec);
  std::filesystem::remove(config.data_dir + "/coordinator.http", ec);
  spdlog::info("stopped");
  return 0;
}
