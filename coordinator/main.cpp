// ddl-coordinator: the cluster daemon. Reads its settings (daemon/config.h), opens its state (SQLite in the
// data directory, or etcd shared with other coordinators: then it waits as a standby until it leads),
// recovers jobs and nodes, serves gRPC over TLS (docs/security.md), and runs until SIGTERM or SIGINT, then
// shuts down cleanly: agent streams end, calls in flight finish, the store closes, the lead is given up.
// Running ranks are not touched: agents keep them and report them to the next coordinator. A leader that
// loses its lead (its etcd lease, or a write refused by another's reign) exits at once with status 75, for
// systemd to restart it as a standby.
//
// Its PKI tools are subcommands: init-pki DIR (the CA, the coordinator's certificate, the first admin),
// renew-cert (a new coordinator certificate, picked up by the running daemon) and issue-node NAME (a node's
// certificate, signed offline with the CA key).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "auth/pki_dir.h"
#include "auth/users.h"
#include "common/flag_errors.h"
#include "common/pki.h"
#include "common/signals.h"
#include "common/version.h"
#include "daemon/config.h"
#include "daemon/state_backend.h"
#include "ddl/tls.h"
#include "http/http_server.h"
#include "rpc/server.h"
#include "service/coordinator.h"
#include "state/data_dir_lock.h"

#ifdef DDL_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

using namespace ddl::coordinator;

namespace {

// The exit status of a leader that lost its lead (EX_TEMPFAIL): systemd restarts it, as a standby.
constexpr int kExitLostLead = 75;

int fail(const std::string& message) {
  spdlog::critical("{}", message);
  return 1;
}

// The command line: the daemon's flags (each overrides the config file) and the PKI tools.
struct Flags {
  std::string config_path;
  std::optional<std::string> listen, http_listen, data_dir, log_level, pki_dir;
  std::optional<double> grace;
  bool http_tls = false, http_auth = false, insecure = false, allow_root = false;
  std::optional<std::string> store, etcd_ca, etcd_cert, etcd_key, advertise;
  std::optional<int> leader_lease;
  bool etcd_insecure = false;
  // PKI tools: each runs, prints, and exits.
  auth::InitPkiOptions init;
  int days = 365;
  std::string node_name, out_dir;
  std::vector<std::string> names;
  CLI::App* init_pki = nullptr;
  CLI::App* renew = nullptr;
  CLI::App* issue = nullptr;
  CLI::App* migrate = nullptr;
};

void declareDaemonFlags(CLI::App& app, Flags& f) {
  app.add_option("--config", f.config_path, "JSON config file (e.g. /etc/ddl/coordinator.json)");
  app.add_option("--listen", f.listen,
                 "gRPC address HOST:PORT for agents and ddlctl (default 127.0.0.1:7070)");
  app.add_option("--http", f.http_listen,
                 "dashboard, JSON API and /metrics HOST:PORT (default 127.0.0.1:7080; any "
                 "other address serves HTTPS and needs tokens)");
  app.add_flag("--http-tls", f.http_tls, "dashboard over HTTPS with tokens on a loopback address too");
  app.add_flag("--http-auth", f.http_auth, "dashboard tokens on a loopback address too, over plain HTTP");
  app.add_option("--data-dir", f.data_dir,
                 "directory for the state database (default /var/lib/ddl/coordinator)");
  app.add_option("--heartbeat-grace", f.grace,
                 "seconds without a heartbeat before a node is DOWN (default 10)");
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn or error (default info)");
  app.add_option("--pki-dir", f.pki_dir, "the cluster's certificates and users (default /etc/ddl/pki)");
  app.add_flag(
      "--insecure", f.insecure,
      "plaintext gRPC with no authentication: development only, refused on any address but loopback");
  app.add_flag("--allow-root-jobs", f.allow_root,
               "let jobs of root run (ranks as uid 0); refused by default");
  app.add_option("--store", f.store,
                 "sqlite (default: a file in --data-dir) or etcd://HOST:PORT,HOST:PORT/PREFIX, shared by "
                 "several coordinators of which one leads");
  app.add_option("--etcd-ca", f.etcd_ca, "the CA certificate (PEM) of etcd's servers");
  app.add_option("--etcd-cert", f.etcd_cert, "this coordinator's client certificate for etcd (PEM)");
  app.add_option("--etcd-key", f.etcd_key, "its private key (PEM)");
  app.add_flag("--etcd-insecure", f.etcd_insecure, "plaintext to etcd: development only, loopback only");
  app.add_option("--leader-lease", f.leader_lease,
                 "seconds a leader's etcd lease lasts: a dead leader is replaced after about this long "
                 "(default 3)");
  app.add_option("--advertise", f.advertise,
                 "HOST:PORT the other coordinators name this one by while it leads (default --listen)");
}

void declarePkiTools(CLI::App& app, Flags& f) {
  f.init_pki = app.add_subcommand("init-pki",
                                  "make the cluster CA, the coordinator's certificate and the "
                                  "first admin's token in DIR");
  f.init_pki->add_option("DIR", f.init.dir, "directory (e.g. /etc/ddl/pki)")->required();
  f.init_pki->add_option("--name", f.init.names,
                         "another DNS name or IP address for the coordinator's certificate "
                         "(repeatable; ddl-coordinator, localhost and this host are always in)");
  f.init_pki->add_option("--days", f.init.cert_days, "the coordinator certificate's validity (default 365)");
  f.init_pki->add_option("--ca-days", f.init.ca_days, "the CA's validity (default 3650)");
  f.init_pki->add_option("--admin", f.init.admin, "the first admin user's name (default admin)");
  f.renew = app.add_subcommand("renew-cert",
                               "a new certificate for the coordinator, from the CA in "
                               "--pki-dir; the running coordinator picks it up");
  f.renew->add_option("--name", f.names, "another DNS name or IP address (repeatable)");
  f.renew->add_option("--days", f.days, "validity (default 365)");
  f.issue = app.add_subcommand("issue-node",
                               "sign a node certificate with the CA in --pki-dir and write "
                               "ca.crt, node.crt and node.key into --out");
  f.issue->add_option("NAME", f.node_name, "the node's name (as ddl-agent --node gives it)")->required();
  f.issue->add_option("--out", f.out_dir, "directory for the node's files")->required();
  f.issue->add_option("--days", f.days, "validity (default 365)");
  f.migrate =
      app.add_subcommand("migrate-to-etcd",
                         "copy the SQLite state in --data-dir (its coordinator stopped) into the empty "
                         "etcd store that --store names, for several coordinators to share");
  f.migrate->fallthrough();  // the daemon's --data-dir, --store and --etcd-* flags, after the word too
}

// Runs the PKI tool the command line named, if any: its exit status, or nullopt to run the daemon.
std::optional<int> runPkiTool(const Flags& f) {
  const std::string pki = f.pki_dir.value_or(DaemonConfig{}.pki_dir);
  if (f.init_pki->parsed()) {
    auto token = auth::initPki(f.init);
    if (!token) return fail(token.status().message());
    std::printf(
        "made the cluster CA and the coordinator's certificate in %s\n"
        "first admin: %s, token in %s/%s (give it to ddlctl: --token-file, $DDL_TOKEN or "
        "~/.config/ddl/token)\n"
        "keep %s/%s secret: whoever holds it can make node certificates\n",
        f.init.dir.c_str(), f.init.admin.c_str(), f.init.dir.c_str(), ddl::pki::kAdminToken,
        f.init.dir.c_str(), ddl::pki::kCaKey);
    return 0;
  }
  if (f.renew->parsed()) {
    if (auto st = auth::renewCoordinatorCert(pki, f.names, f.days); !st) return fail(st.message());
    std::printf("renewed %s/%s; a running coordinator serves it within its tls_refresh_s\n", pki.c_str(),
                ddl::pki::kCoordinatorCert);
    return 0;
  }
  if (f.issue->parsed()) {
    if (auto st = auth::issueNodeFiles(pki, f.node_name, f.days, f.out_dir); !st) return fail(st.message());
    std::printf("wrote %s/{ca.crt,node.crt,node.key} for node %s\n", f.out_dir.c_str(), f.node_name.c_str());
    return 0;
  }
  return std::nullopt;
}

// migrate-to-etcd: the SQLite state of --data-dir copied into --store's etcd.
int runMigration(const DaemonConfig& config) {
  auto lock = ddl::state::DataDirLock::acquire(config.data_dir);  // no coordinator may write it meanwhile
  if (!lock) return fail(lock.status().message());
  auto copied = migrateSqliteToEtcd(config.data_dir + "/state.db", config);
  if (!copied) return fail("migrate-to-etcd: " + copied.status().message());
  std::printf("%s\nstart the coordinators with --store %s (and the same etcd settings)\n", copied->c_str(),
              config.store.c_str());
  return 0;
}

// The settings: the config file's, then the flags over them. "" or why they are refused.
std::string loadSettings(const Flags& f, DaemonConfig* config) {
  if (!f.config_path.empty()) {
    if (auto st = loadConfigFile(f.config_path, config); !st) return st.message();
  }
  if (f.listen) config->listen = *f.listen;
  if (f.http_listen) config->http = *f.http_listen;
  if (f.http_tls) config->http_tls = true;
  if (f.http_auth) config->http_auth = true;
  if (f.data_dir) config->data_dir = *f.data_dir;
  if (f.grace) config->heartbeat_grace_s = *f.grace;
  if (f.log_level) config->log_level = *f.log_level;
  if (f.pki_dir) config->pki_dir = *f.pki_dir;
  if (f.insecure) config->insecure = true;
  if (f.allow_root) config->allow_root_jobs = true;
  if (f.store) config->store = *f.store;
  if (f.etcd_ca) config->etcd_ca = *f.etcd_ca;
  if (f.etcd_cert) config->etcd_cert = *f.etcd_cert;
  if (f.etcd_key) config->etcd_key = *f.etcd_key;
  if (f.etcd_insecure) config->etcd_insecure = true;
  if (f.leader_lease) config->leader_lease_s = *f.leader_lease;
  if (f.advertise) config->advertise = *f.advertise;
  if (f.grace && config->heartbeat_interval_s >= config->heartbeat_grace_s) {
    config->heartbeat_interval_s = config->heartbeat_grace_s / 4;  // keep the default ratio for short graces
  }
  if (auto st = validateConfig(*config); !st) return "bad setting: " + st.message();
  return "";
}

CoordinatorOptions coordinatorOptions(const DaemonConfig& config) {
  CoordinatorOptions options;
  options.heartbeat_grace_ms = static_cast<int64_t>(config.heartbeat_grace_s * 1000);
  options.heartbeat_interval_ms = static_cast<int64_t>(config.heartbeat_interval_s * 1000);
  options.stop_grace_ms = static_cast<int64_t>(config.stop_grace_s * 1000);
  options.port_first = config.port_first;
  options.port_last = config.port_last;
  options.allow_root_jobs = config.allow_root_jobs;
  options.history_retention_ms = static_cast<int64_t>(config.history_retention_days * 86400000.0);
  options.accounting.retention_days = config.usage_retention_days;
  options.shares.half_life_s = config.fairshare_half_life_days * 86400;
  options.shares.cpu_weight = config.fairshare_cpu_weight;
  options.shares.mem_weight_per_gib = config.fairshare_mem_weight;
  options.max_finished_in_memory = static_cast<size_t>(config.finished_jobs_in_memory);
  return options;
}

// The users, accounts and join tokens in the store (users.json imported the first time: auth/users.h). An
// --insecure coordinator keeps them too: tokens then name their users, and calls without one are anonymous.
ddl::state::StatusOr<std::unique_ptr<auth::UserRegistry>> openUsers(const DaemonConfig& config,
                                                                    ddl::state::Store& store) {
  auto users = auth::UserRegistry::open(store, config.pki_dir + "/" + ddl::pki::kUsersFile);
  if (!users) return users.status();
  if (!config.insecure && (*users)->size() == 0) {
    spdlog::warn(
        "the state store has no users: nobody can submit jobs (ddl-coordinator init-pki makes the "
        "first admin in {}/{}, imported at the next start)",
        config.pki_dir, ddl::pki::kUsersFile);
  }
  return std::move(*users);
}

// Writes `text` to `path` whole: through a temporary file renamed over it, so a reader never sees half.
void writeWhole(const std::string& path, const std::string& text) {
  {
    std::ofstream out(path + ".tmp");
    out << text << "\n";
  }
  std::error_code ec;
  std::filesystem::rename(path + ".tmp", path, ec);
}

ddl::coordinator::http::HttpOptions httpOptions(const DaemonConfig& config, const auth::UserRegistry* users) {
  return {config.http_tls.value_or(false), config.http_auth.value_or(false), config.pki_dir, users};
}

// A standby's dashboard while it waits to lead (several coordinators on etcd): /metrics says it stands by, so
// Prometheus scrapes every coordinator, and /healthz and every other path answer 503 naming the leader
// (http::StandbyBackend). It checks tokens against users.json until it can read the store, then against the
// store's users, read again every kUsersRefreshMs (a user added or removed with ddlctl counts here too).
class StandbyDashboard {
 public:
  // Serves config.http (writing its address to http_file), or says why not in the log and serves nothing:
  // a standby that cannot show its state still stands by. An unreadable users.json is an error.
  static ddl::state::StatusOr<std::unique_ptr<StandbyDashboard>> start(const DaemonConfig& config,
                                                                       const StateBackend& backend,
                                                                       const std::string& http_file) {
    auto users = auth::UserRegistry::readOnly(config.pki_dir + "/" + ddl::pki::kUsersFile);
    if (!users) return users.status();
    auto d = std::unique_ptr<StandbyDashboard>(new StandbyDashboard);
    d->users_ = std::move(*users);
    d->backend_ = std::make_unique<ddl::coordinator::http::StandbyBackend>(
        backend.describe(), [&backend] { return backend.standbyStatus(); });
    d->server_ = std::make_unique<ddl::coordinator::http::HttpServer>(*d->backend_,
                                                                      httpOptions(config, d->users_.get()));
    std::string bound;
    if (auto st = d->server_->start(config.http, &bound); !st) {
      spdlog::warn("standby dashboard: {}; going on without it", st.message());
      d->server_.reset();
    } else {
      writeWhole(http_file, bound);
      spdlog::info("standby dashboard on {}://{}/ (/metrics and /healthz)", d->server_->scheme(), bound);
      d->refresher_ = std::thread([raw = d.get(), &backend] { raw->refreshUsers(backend); });
    }
    return d;
  }
  ~StandbyDashboard() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (refresher_.joinable()) refresher_.join();
    if (server_) server_->stop();
  }

 private:
  StandbyDashboard() = default;
  static constexpr int64_t kUsersRefreshMs = 5000;
  // Until stopped: the store's users in place of the file's, every kUsersRefreshMs once the store is open.
  void refreshUsers(const StateBackend& backend) {
    std::string last_error;
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      if (ddl::state::Store* store = backend.readableStore()) {
        lock.unlock();
        const ddl::state::Status st = users_->refreshFrom(*store);
        lock.lock();
        const std::string error = st ? "" : st.message();
        if (error != last_error && !error.empty()) {
          spdlog::warn("standby dashboard: cannot read the users from the store ({}); the last read stands",
                       error);
        }
        last_error = error;
      }
      wake_.wait_for(lock, std::chrono::milliseconds(kUsersRefreshMs), [this] { return stopping_; });
    }
  }
  std::mutex mu_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread refresher_;
  std::unique_ptr<auth::UserRegistry> users_;
  std::unique_ptr<ddl::coordinator::http::StandbyBackend> backend_;
  std::unique_ptr<ddl::coordinator::http::HttpServer> server_;  // after what it serves: stopped first
};

SecurityOptions securityOptions(const DaemonConfig& config, auth::UserRegistry* users) {
  SecurityOptions security;
  security.insecure = config.insecure;
  security.pki_dir = config.pki_dir;
  security.users = users;
  security.allow_root_jobs = config.allow_root_jobs;
  security.node_cert_days = config.node_cert_days;
  security.refresh_s = static_cast<unsigned>(config.tls_refresh_s);
  return security;
}

// Where the state lives and the lead, for /metrics and the dashboard.
StoreInfo storeInfo(const StateBackend& backend) {
  StoreInfo status;
  status.store = backend.describe();
  if (auto lead = backend.lead()) {
    status.reign = lead->reign;
    status.lease_age_s = lead->renewed_ms_ago / 1000.0;
    status.lease_ttl_s = lead->ttl_s;
  }
  return status;
}

// The daemon from its settings to its shutdown; the exit status.
int runDaemon(const DaemonConfig& config) {
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
  const std::string addr_file = config.data_dir + "/coordinator.addr";
  const std::string http_file = config.data_dir + "/coordinator.http";
  // Losing the lead ends the process at once: nothing it would do after it may overlap the next leader's.
  auto lost_lead = [addr_file, http_file](const std::string& why) {
    spdlog::critical("no longer the leader: {}; exiting (status {}) without another write", why,
                     kExitLostLead);
    spdlog::default_logger()->flush();
    std::error_code ignored;
    std::filesystem::remove(addr_file, ignored);
    std::filesystem::remove(http_file, ignored);
    std::_Exit(kExitLostLead);
  };
  auto backend =
      StateBackend::open(config, config.advertise.empty() ? config.listen : config.advertise, lost_lead);
  if (!backend) return fail(backend.status().message());

  // Block the stop signals in every thread; the main thread waits for them below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  int sig = 0;
  // A stop signal within ms, or 0 (ms <= 0: wait for one without end).
  auto waitSignal = [&](int64_t ms) {
    if (ms <= 0) return sigwait(&stop_signals, &sig) == 0 ? sig : 0;
    const timespec pause{static_cast<time_t>(ms / 1000), static_cast<long>(ms % 1000) * 1000000};
    const int got = sigtimedwait(&stop_signals, nullptr, &pause);
    return got > 0 ? (sig = got) : 0;
  };
  // A standby serves /metrics and /healthz while it waits (standby_dashboard.h), then hands the port over.
  std::unique_ptr<StandbyDashboard> standby;
  if ((*backend)->shared()) {
    auto started = StandbyDashboard::start(config, **backend, http_file);
    if (!started) return fail(started.status().message());
    standby = std::move(*started);
  }
#ifdef DDL_HAVE_SYSTEMD
  // A standby is up (systemd's start must not time out while it waits to lead); its status says which it is.
  if ((*backend)->shared()) sd_notify(0, "READY=1\nSTATUS=standby: waiting to lead");
#endif
  auto leading = (*backend)->awaitLead([&](int64_t ms) { return waitSignal(ms) != 0; });
  standby.reset();
  if (!leading) return fail(leading.status().message());
  if (!*leading) {
    std::filesystem::remove(http_file, ec);
    spdlog::info("{}: stopped while standing by", ddl::signalName(sig));
    return 0;
  }
  (*backend)->keepLeading();  // from now until resign(): recovery, serving and shutdown under a live lease

  CoordinatorOptions options = coordinatorOptions(config);
  options.store_info = [b = backend->get()] { return storeInfo(*b); };
  Coordinator coordinator((*backend)->store(), options);
  if (auto st = coordinator.recover(); !st) {
    return fail("recovering state from " + (*backend)->describe() + ": " + st.message());
  }
  // Read at the lead: the store holds what the last leader changed.
  auto users = openUsers(config, (*backend)->store());
  if (!users) return fail(users.status().message());
  if (config.insecure) {
    spdlog::warn("--insecure: plaintext gRPC and no authentication; any local process can act as any user");
  }
  // The scheduler orders the queue by the accounts' shares: it gets them now and after every change.
  auth::UserRegistry* registry = users->get();
  auto shareTree = [registry, share_preemption = config.fairshare_preemption](
                       const std::vector<auth::AccountInfo>& accounts) {
    auto limits = [](const auth::Limits& l) {
      return ddl::placement::Limits{
          l.gpus, l.running, l.pending, l.gpu_hours,
          ddl::placement::parsePeriod(l.period).value_or(ddl::placement::Period::kMonth)};
    };
    ddl::placement::ShareTree tree;
    tree.share_preemption = share_preemption;
    for (const auto& a : accounts) {
      if (!a.parent.empty()) tree.accounts[a.name] = {a.parent, a.share, limits(a.limits)};
    }
    for (const auto& [name, l] : registry->userLimits()) tree.users[name] = limits(l);
    for (const auto& q : registry->qosList())
      tree.qos[q.name] = {q.priority, q.preempt, q.grace_s, q.gpus, q.accounts};
    return tree;
  };
  coordinator.setAccounts(shareTree(registry->accounts()));
  registry->onAccountsChanged([&coordinator, shareTree](const std::vector<auth::AccountInfo>& accounts) {
    coordinator.setAccounts(shareTree(accounts));
  });
  RpcServer server(coordinator, securityOptions(config, users->get()));
  std::string bound;
  if (auto st = server.start(config.listen, &bound); !st) return fail(st.message());
  ddl::coordinator::http::HttpServer dashboard(coordinator, httpOptions(config, users->get()));
  std::string http_bound;
  if (auto st = dashboard.start(config.http, &http_bound); !st) return fail(st.message());
  coordinator.start();
  writeWhole(http_file, http_bound);
  spdlog::info("dashboard on {}://{}/ (JSON API /api/v1, Prometheus /metrics)", dashboard.scheme(), http_bound);
  // Scripts and tests that asked for port 0 read the real address here.
  writeWhole(addr_file, bound);
  spdlog::info("ddl-coordinator listening on {} (state in {})", bound, (*backend)->describe());
#ifdef DDL_HAVE_SYSTEMD
  sd_notify(0, "READY=1");  // Type=notify unit (deploy/systemd/); a no-op outside systemd
  if ((*backend)->shared()) sd_notify(0, "STATUS=leading");
#endif

  waitSignal(0);
  spdlog::info("{}: shutting down", ddl::signalName(sig));
#ifdef DDL_HAVE_SYSTEMD
  sd_notify(0, "STOPPING=1");
#endif
  // Agent streams first, then callers (their calls finish while the coordinator still answers and stores),
  // then the coordinator, which stores what is left; then the lead goes to a standby at once.
  coordinator.closeAgents();
  server.shutdown();
  dashboard.stop();
  coordinator.stop();
  (*backend)->resign();
  std::filesystem::remove(addr_file, ec);
  std::filesystem::remove(http_file, ec);
  spdlog::info("stopped");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ddl-coordinator: places gang-scheduled jobs on GPU nodes and tracks them durably"};
  Flags flags;
  declareDaemonFlags(app, flags);
  declarePkiTools(app, flags);
  app.set_version_flag("--version", std::string("ddl-coordinator ") + ddl::kVersion,
                       "print the version and exit");
  app.require_subcommand(0, 1);
  // Mistakes are said for a person, with the nearest real flag (common/flag_errors.h), as ddlctl does.
  if (const int parsed = ddl::parseFlags(app, argc, argv); parsed >= 0) return parsed;
  if (std::optional<int> status = runPkiTool(flags)) return *status;
  DaemonConfig config;
  if (std::string why = loadSettings(flags, &config); !why.empty()) return fail(why);
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  if (flags.migrate->parsed()) return runMigration(config);
  return runDaemon(config);
}
