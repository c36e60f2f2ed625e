// The Agent (agent.h): registration and the Connect stream, heartbeats, commands (start, stop, signal, read
// a log), rank exits, log retention and the logs' disk watch.
#include "worker/agent.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/fd.h"
#include "common/host_port.h"
#include "common/pki.h"
#include "common/rank_env.h"
#include "common/resources.h"
#include "common/signals.h"
#include "worker/gpu_health.h"
#include "worker/log_retention.h"
#include "worker/rank_status.h"
#include "worker/run_as.h"
#include "worker/topology.h"

extern char** environ;

namespace ddl::worker {

namespace {

// The local address of the interface that routes toward the coordinator: what the other nodes can most likely
// reach too. A connected UDP socket sends nothing; it only makes the kernel pick the route.
std::string localAddressToward(const std::string& target) {
  StatusOr<HostPort> parsed = parseHostPort(target);
  if (!parsed) return "127.0.0.1";
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(parsed->host.c_str(), std::to_string(parsed->port).c_str(), &hints, &res) != 0 || !res) {
    return "127.0.0.1";
  }
  std::string out = "127.0.0.1";
  int fd = socket(res->ai_family, SOCK_DGRAM, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char buf[INET6_ADDRSTRLEN] = {0};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* addr = local.ss_family == AF_INET
                             ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                             : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, buf, sizeof(buf))) out = buf;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

// ddl-rank-shim: next to this executable (the build tree, /usr/bin with a flat install), else in
// ../libexec/ddl (the packages). "" if neither has it.
std::string findRankShim() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  for (const auto& candidate : {self.parent_path() / "ddl-rank-shim",
                                self.parent_path().parent_path() / "libexec" / "ddl" / "ddl-rank-shim"}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return "";
}

}  // namespace

tls::Files tlsFiles(const AgentConfig& config) {
  return {config.pki_dir + "/" + pki::kCaCert, config.pki_dir + "/" + pki::kNodeCert,
          config.pki_dir + "/" + pki::kNodeKey};
}

Agent::Agent(AgentConfig config, Inventory inventory)
    : config_(std::move(config)),
      inventory_(std::move(inventory)),
      confinement_(Confinement::Options{config_.cgroup_root}),
      run_as_job_user_(geteuid() == 0),
      agent_user_(userName(geteuid())) {
  coordinators_ = splitAddressList(config_.coordinator);
  address_ = config_.address.empty() ? localAddressToward(coordinators_.front()) : config_.address;
  if (const int swept = confinement_.sweep(); swept > 0)
    spdlog::info("removed {} empty rank cgroups left by earlier ranks", swept);
  if (confinement_.cpuset() && confinement_.memory())
    spdlog::info("ranks that ask for CPUs or memory: {}", confinement_.describe());
  else
    spdlog::warn("ranks that ask for CPUs or memory: {}", confinement_.describe());
  // The GPUs' faults, read with each heartbeat (real GPUs only), and the site's health check program.
  if (!inventory_.virtual_gpus) {
    gpu_health_ = GpuHealth::open(static_cast<int>(inventory_.gpus.size()));
    if (!gpu_health_) {
      spdlog::warn("NVML cannot be opened to watch the GPUs' health; their faults go unseen");
    } else {
      // Polled every second on a thread of its own (detached, as the disk watch: an NVML call on a GPU
      // falling off the bus may take seconds, and must hold up neither heartbeats nor the agent's exit).
      std::thread([health = gpu_health_, watch = disk_watch_] {
        std::unique_lock<std::mutex> lock(watch->mu);
        while (!watch->stop) {
          lock.unlock();
          health->poll(unixNowMs());
          lock.lock();
          watch->cv.wait_for(lock, std::chrono::seconds(1), [&] { return watch->stop; });
        }
      }).detach();
    }
  }
  if (!config_.health_check_program.empty()) {
    health_check_ = std::make_unique<HealthCheck>(
        config_.health_check_program, config_.health_check_interval_s, config_.health_check_timeout_s);
    spdlog::info("health check {} every {} s", config_.health_check_program, config_.health_check_interval_s);
  }
  {
    std::random_device rd;
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%d-%08x%08x", static_cast<int>(getpid()), rd(), rd());
    instance_ = buf;
  }
  // Notice a coordinator that vanished without closing the connection (host down, cable pulled).
  channel_args_.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  channel_args_.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
  channel_args_.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect attempts are paced by run(); keep gRPC's own backoff short so a restarted coordinator is found fast.
  channel_args_.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as the least time a connection attempt gets, the TLS
  // handshake included, and 100 ms cut handshakes short on a loaded machine.
  channel_args_.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Channels of their own (session() makes one per try where there are several coordinators): not gRPC's
  // shared connections, whose backoff after a refusal would outlast the channel.
  channel_args_.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (config_.insecure) {
    credentials_ = grpc::InsecureChannelCredentials();  // main() checked that the coordinator is on loopback
  } else {
    // The node certificate proves this node's name; the files are re-read, so a renewed certificate is used
    // from the next connection on without restarting the agent or its ranks.
    tls::addChannelArgs(&channel_args_);
    credentials_ = tls::channelCredentials(tlsFiles(config_), static_cast<unsigned>(config_.tls_refresh_s));
  }
  stubs_.resize(coordinators_.size());
  Supervisor::Options options;
  options.state_dir = config_.data_dir + "/ranks";
  options.shim_path = findRankShim();
  options.env_allowed.insert(options.env_allowed.end(), config_.rank_env.begin(), config_.rank_env.end());
  {
    // Said once: what of the agent's own environment its ranks will not see (names, never values).
    std::vector<std::string> own, withheld;
    for (char** e = environ; e != nullptr && *e != nullptr; ++e) own.emplace_back(*e);
    inheritedEnvironment(own, options.env_allowed, &withheld);
    if (!withheld.empty()) {
      std::string names;
      for (const std::string& n : withheld) names += (names.empty() ? "" : ", ") + n;
      spdlog::info("not passed on to ranks from the agent's environment: {} (agent.json rank_env adds names)",
                   names);
    }
  }
  if (options.shim_path.empty()) {
    spdlog::warn("ddl-rank-shim not found next to ddl-agent or in ../libexec/ddl: ranks run without it, and the "
                 "exit code of a rank adopted after an agent restart will be unknown (255)");
  }
  supervisor_ = std::make_unique<Supervisor>([this](const RankState& s) { onRankExit(s); }, options);
  // The telemetry listener before recover(): exits of adopted ranks are reported (onRankExit, toProto) from
  // the supervisor's thread as soon as it runs. Reports are believed only from their rank's session.
  std::string error;
  telemetry_ = std::make_unique<TelemetryListener>(
      config_.data_dir + "/agent.sock", &error,
      [this](const std::string& job, int attempt, int rank, pid_t sender) {
        return supervisor_->inRankSession(job, attempt, rank, sender);
      });
  if (!error.empty()) {
    spdlog::warn("rank telemetry off: {}", error);
    telemetry_.reset();
  }
  // Ranks a previous agent process left running (a restart or an upgrade): adopted before the first
  // registration, so the coordinator hears of them at once.
  for (const auto& problem : supervisor_->recover()) spdlog::warn("{}", problem);
  if (const size_t held = supervisor_->ranks().size()) {
    spdlog::info("adopted {} ranks left by the previous agent from {}", held, options.state_dir);
  }
  if (config_.log_retention_hours > 0 || config_.log_max_mb > 0) {
    log_cleaner_ = std::thread([this] { cleanLogsUntilStopped(); });
  }
  if (config_.log_disk_min_free_mb > 0) {
    // The logger is held by the thread, so a last line after the agent is gone still has one.
    std::thread([watch = disk_watch_, logger = spdlog::default_logger(), dir = config_.data_dir + "/logs",
                 min = static_cast<uint64_t>(config_.log_disk_min_free_mb) << 20] {
      std::string last;
      std::unique_lock<std::mutex> lock(watch->mu);
      while (!watch->stop) {
        lock.unlock();
        const std::string warning = logDiskWarning(dir, min);  // may hang on a dead file system: unlocked
        lock.lock();
        if (watch->stop) return;
        if (warning != last) {  // once per change
          if (!warning.empty())
            logger->warn("{}", warning);
          else
            logger->info("the rank logs' disk has room again");
          last = warning;
        }
        watch->warning = warning;
        watch->cv.wait_for(lock, std::chrono::seconds(5), [&] { return watch->stop; });
      }
    }).detach();
  }
}

Agent::~Agent() {
  {
    std::lock_guard<std::mutex> lock(disk_watch_->mu);
    disk_watch_->stop = true;
  }
  disk_watch_->cv.notify_all();
  stop(static_cast<int>(config_.stop_grace_s * 1000));
  if (log_cleaner_.joinable()) log_cleaner_.join();
}

// The log cleaner's thread: a round at start and then every 5 minutes (or a tenth of the retention, if that
// is shorter, but at least a minute). The live jobs are read from the supervisor first, so a rank that is
// held keeps its job's logs; one launched after that snapshot is protected by kMinLogAge.
void Agent::cleanLogsUntilStopped() {
  LogRetention retention;
  retention.max_age =
      std::chrono::milliseconds(static_cast<int64_t>(config_.log_retention_hours * 3'600'000));
  retention.max_bytes = static_cast<uint64_t>(config_.log_max_mb) * 1024 * 1024;
  const auto period =
      std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(retention.max_age / 10),
                 std::chrono::milliseconds(60'000), std::chrono::milliseconds(300'000));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    std::set<std::string> live;
    for (const RankState& r : supervisor_->ranks()) live.insert(r.job_id);
    LogCleanup done =
        cleanRankLogs(config_.data_dir + "/logs", retention, live, std::chrono::system_clock::now());
    if (!done.removed.empty()) {
      spdlog::info("removed the rank logs of {} jobs ({} bytes; {} bytes of logs kept)", done.removed.size(),
                   done.bytes_removed, done.bytes_kept);
    }
    for (const std::string& e : done.errors) spdlog::warn("log cleanup: {}", e);
    lock.lock();
    cv_.wait_for(lock, period, [&] { return stopping_; });
  }
}

void Agent::run() {
  std::mt19937 rng(std::random_device{}());
  int failures = 0;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    }
    std::string why = session(&failures);
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) return;
    // Exponential backoff from 250 ms to 8 s with +-50% jitter, so a restarted coordinator is not hit by
    // every agent of the cluster in the same millisecond. Several coordinators (one leads, the others do not
    // listen): the next try goes to the next one, and the backoff grows once per round of them, not per
    // refusal. Never past a quarter of the coordinator's heartbeat grace (as its last answer gave it): a
    // coordinator that comes back (a restart, a new leader) waits that long for its nodes before it marks
    // them DOWN and fails their jobs, and an agent asleep through it would lose them.
    const int rounds = failures / static_cast<int>(coordinators_.size());
    const bool round_left = failures % static_cast<int>(coordinators_.size()) != 0;
    const int most = std::clamp(grace_ms_ / 4, 250, 8000);
    const int base = round_left ? 100 : std::min(most, 250 << std::min(rounds, 5));
    const int delay = std::uniform_int_distribution<int>(base / 2, base * 3 / 2)(rng);
    spdlog::warn("coordinator {}: {}; retrying in {} ms", coordinators_[current_], why, delay);
    current_ = (current_ + 1) % coordinators_.size();
    cv_.wait_for(lock, std::chrono::milliseconds(delay), [&] { return stopping_; });
  }
}

void Agent::stop(int rank_grace_ms) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    if (context_) context_->TryCancel();
  }
  cv_.notify_all();
  if (!supervisor_) return;
  if (!config_.stop_ranks_on_exit) {
    const auto held = supervisor_->ranks();
    const auto running = std::count_if(held.begin(), held.end(), [](const RankState& r) { return r.running; });
    if (running > 0) spdlog::info("leaving {} ranks running; the next ddl-agent adopts them", running);
    return;
  }
  supervisor_->stopAll(rank_grace_ms);
  // Wait (bounded) until the escalation to SIGKILL has done its work, so no rank outlives the agent.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(rank_grace_ms + 2000);
  while (std::chrono::steady_clock::now() < deadline) {
    auto ranks = supervisor_->ranks();
    if (std::none_of(ranks.begin(), ranks.end(), [](const RankState& r) { return r.running; })) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string Agent::session(int* failures) {
  v1::RegisterRequest req;
  req.set_node(config_.node);
  req.set_address(address_);
  for (const auto& g : inventory_.gpus) *req.add_gpus() = g;
  for (const auto& n : inventory_.nics) *req.add_nics() = n;
  for (const auto& [k, v] : config_.labels) (*req.mutable_labels())[k] = v;
  for (const auto& r : supervisor_->ranks()) *req.add_ranks() = toProto(r);
  req.set_port_first(config_.port_first);
  req.set_port_last(config_.port_last);
  req.set_agent_version("0.1.0");
  req.set_instance(instance_);
  for (int c : inventory_.cpus) req.add_cpus(c);
  for (int n : inventory_.cpu_numa) req.add_cpu_numa(n);
  req.set_memory_bytes(inventory_.memory_bytes);
  req.set_confinement(confinement_.describe());

  v1::RegisterResponse resp;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    // One coordinator: one channel, riding out its reconnect backoff instead of failing at once. Several: a
    // standby refuses the connection, so each try is a fresh channel's first connection, which fails at once
    // there (and the next coordinator is tried) but is not refused for a connection that failed earlier.
    const bool several = coordinators_.size() > 1;
    if (several || !stubs_[current_]) {
      stubs_[current_] = v1::AgentService::NewStub(
          grpc::CreateCustomChannel(coordinators_[current_], credentials_, channel_args_));
    }
    ctx.set_wait_for_ready(!several);
    grpc::Status st = stubs_[current_]->Register(&ctx, req, &resp);
    if (!st.ok()) {
      ++*failures;
      return "register failed: " + st.error_message();
    }
  }
  *failures = 0;
  spdlog::info("registered with {} as {} ({}), {} GPUs ({}), {} ranks held", coordinators_[current_],
               config_.node, address_, inventory_.gpus.size(), inventory_.gpu_source, req.ranks_size());

  grpc::ClientContext context;
  auto stream = stubs_[current_]->Connect(&context);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return "stopping";
    context_ = &context;
    stream_ = stream.get();
  }
  v1::AgentMessage hello;
  hello.mutable_hello()->set_node(config_.node);
  hello.mutable_hello()->set_session(resp.session());
  write(hello);

  if (resp.heartbeat_grace_ms() > 0) grace_ms_ = resp.heartbeat_grace_ms();
  // Heartbeats: the full state of every rank held, every interval the coordinator asked for.
  bool session_over = false;
  std::thread heartbeats([&] {
    const auto interval = std::chrono::milliseconds(std::max(100, resp.heartbeat_interval_ms()));
    std::unique_lock<std::mutex> lock(mu_);
    while (!session_over && !stopping_) {
      lock.unlock();
      v1::AgentMessage hb;
      for (const auto& r : supervisor_->ranks()) *hb.mutable_heartbeat()->add_ranks() = toProto(r);
      hb.mutable_heartbeat()->set_sent_ms(unixNowMs());
      {
        std::lock_guard<std::mutex> disk_lock(disk_watch_->mu);
        hb.mutable_heartbeat()->set_warning(disk_watch_->warning);
      }
      noteDiskInRankLogs(hb.heartbeat().warning());
      if (gpu_health_) {
        for (const v1::GpuFault& f : gpu_health_->faults()) *hb.mutable_heartbeat()->add_gpu_faults() = f;
        // A slowdown is a warning, beside the logs' disk's (shown under ddlctl nodes).
        if (const std::string slow = gpu_health_->slowdown(); !slow.empty()) {
          const std::string disk = hb.heartbeat().warning();
          hb.mutable_heartbeat()->set_warning(disk.empty() ? slow : disk + "; " + slow);
        }
      }
      if (health_check_) {
        if (std::optional<std::string> failed = health_check_->failure())
          hb.mutable_heartbeat()->set_health_check(*failed);
      }
      write(hb);
      lock.lock();
      cv_.wait_for(lock, interval, [&] { return session_over || stopping_; });
    }
  });

  v1::Command command;
  while (stream->Read(&command)) handle(command);
  {
    std::lock_guard<std::mutex> lock(mu_);
    session_over = true;
    context_ = nullptr;
    stream_ = nullptr;
  }
  cv_.notify_all();
  heartbeats.join();
  {
    std::lock_guard<std::mutex> write_lock(write_mu_);  // no writer may still hold the stream
  }
  grpc::Status st = stream->Finish();
  ++*failures;
  return "stream ended: " + (st.ok() ? std::string("closed by the coordinator") : st.error_message());
}

bool Agent::write(const v1::AgentMessage& message) {
  std::lock_guard<std::mutex> write_lock(write_mu_);
  grpc::ClientReaderWriter<v1::AgentMessage, v1::Command>* stream;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stream = stream_;
  }
  return stream && stream->Write(message);
}

void Agent::handle(const v1::Command& command) {
  if (command.has_start()) {
    startRanks(command.start());
  } else if (command.has_read_log()) {
    readLog(command.read_log());
  } else if (command.has_stop()) {
    const auto& stop = command.stop();
    if (stop.ranks_size() > 0) {
      // Some ranks of a job that goes on (elastic): stopped, and their exits reported and kept until the
      // job's own stop, which releases them with the rest.
      const std::vector<int> ranks(stop.ranks().begin(), stop.ranks().end());
      spdlog::info("job {} attempt {}: stop of {} rank(s) ({}), grace {} ms", stop.job_id(), stop.attempt(),
                   ranks.size(), stop.reason(), stop.grace_ms());
      supervisor_->stop(stop.job_id(), stop.attempt(), stop.grace_ms(), ranks);
      return;
    }
    spdlog::info("job {} attempt {}: stop ({}), grace {} ms", stop.job_id(), stop.attempt(), stop.reason(),
                 stop.grace_ms());
    {
      std::lock_guard<std::mutex> lock(mu_);
      int& newest = stopped_[stop.job_id()];
      newest = std::max(newest, stop.attempt() == 0 ? INT32_MAX : stop.attempt());
    }
    supervisor_->stop(stop.job_id(), stop.attempt(), stop.grace_ms());
    supervisor_->release(stop.job_id(), stop.attempt());
    if (telemetry_) telemetry_->forget(stop.job_id(), stop.attempt());
    forgetIfGone(stop.job_id());  // ranks that had exited already are released; nothing more will come
  } else if (command.has_signal()) {
    signalJob(command.signal());
  } else if (command.has_clear_gpu_fault()) {
    if (gpu_health_) gpu_health_->clear(command.clear_gpu_fault().gpu());
  }
}

void Agent::signalJob(const v1::SignalJob& command) {
  const std::string what = signalName(command.signal());
  if (command.signal() < 1 || command.signal() > 64) {
    spdlog::warn("job {} attempt {}: {} refused: a signal is a number from 1 to 64", command.job_id(),
                 command.attempt(), what);
    return;
  }
  if (command.preempt_deadline_ms() > 0) {
    // The deadline first: a rank's handler may read it as soon as the signal comes.
    const std::string path = preemptDeadlinePath(command.job_id(), command.attempt());
    char text[32];
    std::snprintf(text, sizeof(text), "%.3f\n", command.preempt_deadline_ms() / 1000.0);
    std::string why;
    if (!pki::writeFile(path, text, 0644, &why))
      spdlog::warn("job {} attempt {}: cannot write the preemption deadline: {}", command.job_id(),
                   command.attempt(), why);
  }
  const int sent = supervisor_->signalJob(command.job_id(), command.attempt(), command.signal());
  if (sent == 0) {
    spdlog::info("job {} attempt {}: {} ignored: no running rank of it on this node", command.job_id(),
                 command.attempt(), what);
  } else {
    spdlog::info("job {} attempt {}: {} sent to {} ranks", command.job_id(), command.attempt(), what, sent);
  }
}

void Agent::readLog(const v1::ReadLog& read) {
  v1::AgentMessage reply;
  v1::LogData* data = reply.mutable_log_data();
  data->set_request(read.request());
  const std::string path = logPath(read.job_id(), read.attempt(), read.rank());
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    data->set_error("no log at " + path + " on node " + config_.node + " (the rank never started here?)");
  } else {
    in.seekg(0, std::ios::end);
    const int64_t size = in.tellg();
    data->set_size(size);
    const int64_t offset = std::min<int64_t>(std::max<int64_t>(read.offset(), 0), size);
    const int64_t n = std::min<int64_t>(std::max(read.max_bytes(), 0), size - offset);
    std::string buf(static_cast<size_t>(n), '\0');
    in.seekg(offset);
    in.read(buf.data(), n);
    buf.resize(static_cast<size_t>(in.gcount()));
    data->set_data(std::move(buf));
  }
  write(reply);
}

std::string Agent::preemptDeadlinePath(const std::string& job, int attempt) const {
  return config_.data_dir + "/logs/" + job + "/attempt-" + std::to_string(attempt) + "/preempt-deadline";
}

std::string Agent::logPath(const std::string& job, int attempt, int rank) const {
  return config_.data_dir + "/logs/" + job + "/attempt-" + std::to_string(attempt) + "/rank-" +
         std::to_string(rank) + ".log";
}

void Agent::startRanks(const v1::StartRanks& start) {
  spdlog::info("job {} attempt {}: starting {} ranks as {}: {}", start.job_id(), start.attempt(),
               start.ranks_size(), run_as_job_user_ ? "user '" + start.user() + "'" : agent_user_,
               start.command_size() ? start.command(0) : "");
  // One lookup for all the job's ranks here; a refusal fails each of them with the same reason.
  std::optional<Account> account;
  std::string refusal;
  if (run_as_job_user_) {
    account = lookupAccount(start.user(), config_.node, start.allow_root(), &refusal);
    if (!account) spdlog::error("job {} attempt {}: {}", start.job_id(), start.attempt(), refusal);
  } else if (start.user() != agent_user_) {
    spdlog::info("job {}: its ranks run as {}, the agent's user, not as the job's user '{}': only an agent "
                 "running as root runs ranks as their users",
                 start.job_id(), agent_user_, start.user());
  }
  for (const auto& launch : start.ranks()) {
    RankSpec spec;
    spec.job_id = start.job_id();
    spec.attempt = start.attempt();
    spec.rank = launch.rank();
    spec.gpu = launch.gpu();
    spec.argv.assign(start.command().begin(), start.command().end());
    spec.workdir = start.workdir();
    spec.log_path = logPath(start.job_id(), start.attempt(), launch.rank());
    for (const auto& e : launch.env()) spec.env.emplace_back(e.name(), e.value());
    RankNodeSpec node;
    node.gpu = launch.gpu();
    if (!inventory_.virtual_gpus && launch.gpu() >= 0 &&
        launch.gpu() < static_cast<int>(inventory_.gpus.size()))
      node.gpu_uuid = inventory_.gpus[launch.gpu()].uuid();
    if (launch.gpu() >= 0 && launch.gpu() < static_cast<int>(inventory_.gpus.size())) {
      // The NIC nearest the GPU; UCX is told to use it unless the job or the agent's environment chose.
      node.net_device = inventory_.gpus[launch.gpu()].nic();
      node.set_ucx_net_devices = !node.net_device.empty() && std::getenv("UCX_NET_DEVICES") == nullptr &&
                                 std::none_of(launch.env().begin(), launch.env().end(),
                                              [](const auto& e) { return e.name() == "UCX_NET_DEVICES"; }) &&
                                 ucxDeviceReady(inventory_.sys, node.net_device);
    }
    if (telemetry_) node.agent_socket = telemetry_->path();
    node.preempt_deadline_file = preemptDeadlinePath(start.job_id(), start.attempt());
    for (auto& kv : nodeEnvironment(node)) spec.env.push_back(std::move(kv));
    spec.run_as = account;
    spec.cpus.assign(launch.cpus().begin(), launch.cpus().end());
    std::string error;
    if (!refusal.empty()) {
      supervisor_->reject(spec, refusal, &error);  // recorded as an exit, which onRankExit reports
      continue;
    }
    std::string confine_error;
    // Its memory on its CPUs' NUMA node (placement gives a rank CPUs of its GPU's node where it can): first
    // there, or only there (numa_memory).
    const std::vector<int> mems =
        config_.numa_memory == "none"
            ? std::vector<int>()
            : memoryNodesOf(spec.cpus, inventory_.cpus, inventory_.cpu_numa, inventory_.sys);
    if (config_.numa_memory == "prefer") spec.prefer_numa = mems;
    Fd cgroup(confinement_.prepare(Confinement::rankName(spec.job_id, spec.attempt, spec.rank), spec.cpus,
                                   launch.memory_bytes(), &confine_error,
                                   config_.numa_memory == "bind" ? mems : std::vector<int>()));
    if (!confine_error.empty()) {
      spdlog::error("job {} rank {}: {}", start.job_id(), launch.rank(), confine_error);
      supervisor_->reject(spec, confine_error + "; the rank does not run unconfined", &error);
      continue;
    }
    spec.cgroup_procs_fd = cgroup.get();
    RankState state = supervisor_->start(spec, &error);
    if (!error.empty()) {
      spdlog::error("job {} rank {}: {}", start.job_id(), launch.rank(), error);
      continue;  // the supervisor recorded the failure as an exit, which onRankExit reports
    }
    v1::AgentMessage event;
    *event.mutable_rank_event() = toProto(state);
    write(event);
  }
}

void Agent::noteDiskInRankLogs(const std::string& warning) {
  // Once when the warning comes and once when it goes, not at each change of the free space it names.
  if (warning.empty() == disk_noted_.empty()) return;
  disk_noted_ = warning;
  // The logs' disk filled up (or has room again): each running rank's log says so where its output may be
  // cut, so that a log that ends mid-line is not taken for the rank's own last words.
  char when[32] = "";
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  if (localtime_r(&now, &local) != nullptr) std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &local);
  const std::string note =
      !warning.empty() ? "[ddl-agent " + std::string(when) + ": " + warning +
                             ": this rank's output from here on may be lost]"
                       : "[ddl-agent " + std::string(when) +
                             ": the logs' disk has room again; output since the note above may be missing]";
  std::vector<std::string> logs;
  for (const RankState& r : supervisor_->ranks()) {
    if (r.running) logs.push_back(logPath(r.job_id, r.attempt, r.rank));
  }
  // Written on a thread of its own: a file system that hangs must not hold the heartbeats up.
  std::thread([logs = std::move(logs), note, logger = spdlog::default_logger()] {
    for (const std::string& log : logs) {
      if (std::string why = appendLogNote(log, note); !why.empty()) logger->warn("{}", why);
    }
  }).detach();
}

void Agent::onRankExit(const RankState& state) {
  // Before the report: a user who reads the rank's last lines (ddlctl wait, status) sees why it died.
  const Confinement::Finished confined =
      confinement_.finish(Confinement::rankName(state.job_id, state.attempt, state.rank));
  if (!confined.error.empty()) spdlog::warn("job {} rank {}: {}", state.job_id, state.rank, confined.error);
  if (const int64_t kills = confined.oom_kills; kills > 0) {
    const std::string line = "ddl-agent: the kernel's OOM killer ended this rank (" + std::to_string(kills) +
                             (kills == 1 ? " process" : " processes") +
                             "): it used more memory than its job asked for per rank (--mem-per-rank)\n";
    spdlog::warn("job {} attempt {} rank {}: out of memory in its cgroup", state.job_id, state.attempt,
                 state.rank);
    if (std::string why = appendLogNote(logPath(state.job_id, state.attempt, state.rank), line); !why.empty())
      spdlog::warn("cannot add the OOM note to the rank's log: {}", why);
  }
  spdlog::info("job {} attempt {} rank {} (pid {}) {}", state.job_id, state.attempt, state.rank, state.pid,
               !state.error.empty() ? "could not start: " + state.error
               : state.signal       ? "killed by signal " + std::to_string(*state.signal)
                                    : "exited with code " + std::to_string(state.exit_code.value_or(-1)));
  v1::AgentMessage event;
  *event.mutable_rank_event() = toProto(state);
  write(event);  // when no stream is up, the next registration carries it
  bool release = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = stopped_.find(state.job_id);
    release = it != stopped_.end() && state.attempt <= it->second;
  }
  if (!release) return;
  supervisor_->release(state.job_id, state.attempt);
  forgetIfGone(state.job_id);
}

void Agent::forgetIfGone(const std::string& job) {
  // Once a stopped job has no rank left here, forget it, so stopped_ does not grow with every job ever run.
  const auto held = supervisor_->ranks();
  if (std::none_of(held.begin(), held.end(), [&](const RankState& r) { return r.job_id == job; })) {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_.erase(job);
  }
}

v1::RankStatus Agent::toProto(const RankState& s) const {
  v1::RankStatus r = rankStatus(s, config_.node);
  if (telemetry_) {
    if (auto p = telemetry_->latest(s.job_id, s.attempt, s.rank)) *r.mutable_progress() = *p;
  }
  return r;
}

}  // namespace ddl::worker
