// ddl-coordinator: the cluster daemon. Reads its settings (daemon/config.h), opens the SQLite state in the data
// directory, recovers jobs and nodes, serves gRPC, and runs until SIGTERM or SIGINT, then shuts down cleanly:
// agent streams end, calls in flight finish, the store closes. Running ranks are not touched: agents keep
// them and report them to the next coordinator.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "daemon/config.h"
#include "http/http_server.h"
#include "rpc/server.h"
#include "service/coordinator.h"
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
  app.add_option("--http", http_listen, "dashboard, JSON API and /metrics HOST:PORT (default 127.0.0.1:7080)");
  app.add_option("--data-dir", data_dir, "directory for the state database (default /var/lib/ddl/coordinator)");
  app.add_option("--heartbeat-grace", grace, "seconds without a heartbeat before a node is DOWN (default 10)");
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error (default info)");
  CLI11_PARSE(app, argc, argv);

  DaemonConfig config;
  if (!config_path.empty()) {
    auto st = loadConfigFile(config_path, &config);
    if (!st) return fail(st.message());
  }
  if (listen) config.listen = *listen;
  if (http_listen) config.http = *http_listen;
  if (data_dir) config.data_dir = *data_dir;
  if (grace) config.heartbeat_grace_s = *grace;
  if (log_level) config.log_level = *log_level;
  if (grace && config.heartbeat_interval_s >= config.heartbeat_grace_s) {
    config.heartbeat_interval_s = config.heartbeat_grace_s / 4;  // keep the default ratio for short graces
  }
  if (auto st = validateConfig(config); !st) return fail("bad setting: " + st.message());
  spdlog::set_level(spdlog::level::from_str(config.log_level));

  std::error_code ec;
  std::filesystem::create_directories(config.data_dir, ec);
  if (ec) return fail("cannot create data directory " + config.data_dir + ": " + ec.message());
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
  Coordinator coordinator(**store, options);
  if (auto st = coordinator.recover(); !st) return fail("recovering state from " + store_options.path + ": " + st.message());

  RpcServer server(coordinator);
  std::string bound;
  if (auto st = server.start(config.listen, &bound); !st) return fail(st.message());
  ddl::coordinator::http::HttpServer dashboard(coordinator);
  std::string http_bound;
  if (auto st = dashboard.start(config.http, &http_bound); !st) return fail(st.message());
  coordinator.start();
  {
    std::ofstream out(config.data_dir + "/coordinator.http");
    out << http_bound << "\n";
  }
  spdlog::info("dashboard on http://{}/ (JSON API /api/v1, Prometheus /metrics)", http_bound);
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
  spdlog::info("{}: shutting down", strsignal(sig));
#ifdef DDL_HAVE_SYSTEMD
  sd_notify(0, "STOPPING=1");
#endif
  coordinator.stop();
  dashboard.stop();
  server.shutdown();
  std::filesystem::remove(addr_file, ec);
  std::filesystem::remove(config.data_dir + "/coordinator.http", ec);
  spdlog::info("stopped");
  return 0;
}
