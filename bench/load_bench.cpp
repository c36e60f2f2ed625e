// load_bench: the coordinator under a cluster's load, through its real gRPC services. A tool that prints
// figures (a table, and JSON with --json), not a test.
//
// Load mode (default): the bench starts a ddl-coordinator process (or attaches to one with --attach), then in
// this one process --nodes simulated agents each Register and hold the real Connect stream: mutual TLS with
// one node certificate per node name, all signed by the CA of a PKI made with `ddl-coordinator init-pki` (or
// plaintext on loopback with --insecure). They heartbeat at --heartbeat-hz with every rank they hold, report
// ranks RUNNING as soon as a StartRanks comes and EXITED (code 0) --job-ms later, so jobs complete. A few
// submitter threads submit 1-GPU jobs at --rate per second (open loop: each send is due at a fixed time; a
// late thread sends at once) and time each acknowledgement. Threads stay bounded: gRPC's callback API drives
// every stream from its own small pool; one thread sends heartbeats, one sends rank exits, a few submit.
//
// Measured:
//  - submit acknowledgement latency (median, p99, max) and the rate reached;
//  - heartbeat handling: the protocol does not answer heartbeats, so (a) the coordinator's
//    ddl_heartbeat_lag_seconds from /metrics, sampled every second (at 1 Hz a healthy value stays near 1 s;
//    more means heartbeats wait to be handled or nodes go quiet), and (b) the stream's handling time end to
//    end: from a sampled job's rank EXITED event leaving the agent to the job's SUCCEEDED transition (both
//    clocks are this machine's);
//  - the coordinator's CPU (utime+stime from /proc/PID/stat over the load phase) and RSS (VmRSS, VmHWM);
//  - placement under load: a 256-GPU job (32 nodes x 8 GPUs), submit to SCHEDULED from its transitions;
//  - small jobs' submit to SCHEDULED, from the transitions of the sampled jobs.
//
// History mode (--history N): N finished jobs are written straight into a state file through ddl_state's
// SqliteStore (on /dev/shm, where a commit's fsync is free, then moved to --dir), then a coordinator is
// started on it: time from exec to serving (its address file written and a ListJobs answered), its RSS, and
// the latency of a ListJobs page (the server's default page, all states).
//
//   load-bench [--nodes 2000] [--gpus 8] [--heartbeat-hz 1] [--rate 1000] [--duration 30] [--submitters 16]
//              [--job-ms 2000] [--insecure] [--coordinator-bin PATH] [--dir DIR] [--json FILE]
//              [--store etcd://127.0.0.1:PORT,...]   (the state in an etcd on loopback, plaintext: issue 30)
//              [--attach HOST:PORT --pid PID --http HOST:PORT (--pki-dir DIR | --insecure)]
//   load-bench --history 1000000 [--coordinator-bin PATH] [--dir DIR] [--json FILE]
//   load-bench --history-db STATE.DB ...   (an earlier run's state file instead of writing one)
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/pki.h"
#include "ddl/tls.h"
#include "ddl/v1/ddl.grpc.pb.h"
#include "e2e_helpers.h"
#include "state/direct_store.h"
#include "state/sqlite_store.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace ddl;

int64_t nowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}
double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

using ddl::e2e::slurp;  // "" for a file that cannot be read (a /proc file of a process that just ended)
std::string firstLine(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "load-bench: %s\n", why.c_str());
  std::exit(1);
}

struct Options {
  int nodes = 2000, gpus = 8, submitters = 16, duration_s = 30, job_ms = 2000, big_jobs = 3;
  double heartbeat_hz = 1, rate = 1000;
  bool insecure = false;
  long history = 0;
  std::string coordinator_bin, dir, json, attach, http, pki_dir, history_db;
  std::string
      store;  // the coordinator's --store ("" = its default, SQLite); etcd on loopback only, plaintext
  pid_t pid = 0;
};

// ---- the coordinator process --------------------------------------------------------------------------------

struct ProcSample {
  double cpu_s = 0;  // utime + stime
  long rss_kb = 0, hwm_kb = 0;
};

ProcSample sampleProc(pid_t pid) {
  ProcSample s;
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  // Fields after the command name (which may hold spaces) start after the last ')'.
  size_t close = stat.rfind(')');
  if (close != std::string::npos) {
    std::istringstream in(stat.substr(close + 2));
    std::string f;
    std::vector<std::string> fields;
    while (in >> f) fields.push_back(f);
    // fields[0] is field 3 (state); utime is field 14, stime 15.
    if (fields.size() > 13) {
      s.cpu_s = (std::stod(fields[11]) + std::stod(fields[12])) / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  std::istringstream status(slurp("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kb = std::atol(line.c_str() + 6);
    if (line.rfind("VmHWM:", 0) == 0) s.hwm_kb = std::atol(line.c_str() + 6);
  }
  return s;
}

// GET http://HOST:PORT/path (the coordinator's dashboard on loopback needs no token): the body, or "".
std::string httpGet(const std::string& host_port, const std::string& path) {
  const std::string out = ddl::e2e::httpGet(host_port, path);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

std::optional<double> metric(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name + " ", 0) == 0) return std::atof(line.c_str() + name.size() + 1);
  }
  return std::nullopt;
}

using ddl::e2e::spawn;  // the end-to-end tests' launcher: output appended to a log

struct Coordinator {
  pid_t pid = 0;
  bool owned = false;
  std::string address, http;
  double started_s = 0;  // exec to the address file
};

Coordinator startCoordinator(const Options& o, const fs::path& data_dir, const fs::path& log) {
  Coordinator c;
  std::vector<std::string> argv = {o.coordinator_bin, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                                   "--data-dir", data_dir.string(), "--log-level", "warn", "--heartbeat-grace", "30"};
  if (o.insecure) {
    argv.push_back("--insecure");
  } else {
    argv.insert(argv.end(), {"--pki-dir", o.pki_dir});
  }
  if (!o.store.empty()) {
    argv.insert(argv.end(), {"--store", o.store});
    if (o.store.rfind("etcd://", 0) == 0) argv.push_back("--etcd-insecure");
  }
  fs::remove(data_dir / "coordinator.addr");
  auto t0 = Clock::now();
  c.pid = spawn(argv, log);
  c.owned = true;
  for (int i = 0; i < 60000 && !fs::exists(data_dir / "coordinator.addr"); ++i) {
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) == c.pid) die("ddl-coordinator exited at start:\n" + slurp(log));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  c.started_s = secondsSince(t0);
  c.address = firstLine(data_dir / "coordinator.addr");
  c.http = firstLine(data_dir / "coordinator.http");
  if (c.address.empty()) die("ddl-coordinator wrote no address in 120 s:\n" + slurp(log));
  return c;
}

void stopCoordinator(Coordinator& c) {
  if (!c.owned || c.pid <= 0) return;
  kill(c.pid, SIGTERM);
  int status = 0;
  for (int i = 0; i < 300 && waitpid(c.pid, &status, WNOHANG) != c.pid; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (kill(c.pid, 0) == 0) {
    kill(c.pid, SIGKILL);
    waitpid(c.pid, &status, 0);
  }
  c.pid = 0;
}

// ---- credentials ----------------------------------------------------------------------------------------------

struct Pki {
  std::string ca, ca_key, token;
};

std::shared_ptr<grpc::Channel> userChannel(const Options& o, const std::string& address) {
  if (o.insecure) return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::ChannelArguments args;
  tls::addChannelArgs(&args);
  return grpc::CreateCustomChannel(address, tls::channelCredentials({o.pki_dir + "/ca.crt", "", ""}), args);
}

// One channel (one TCP connection, one TLS session) per simulated agent, as real agents have. The node's key and
// certificate are held in memory (no file watcher thread per channel).
std::shared_ptr<grpc::Channel> agentChannel(const Options& o, const Pki& pki, const std::string& address,
                                            const std::string& node) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // no sharing of one connection between simulated agents
  if (o.insecure) return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  std::string error;
  auto key = pki::newPrivateKey(&error);
  if (!key) die("key for " + node + ": " + error);
  pki::Subject subject;
  subject.common_name = node;
  subject.dns_names = {node};
  subject.usage = pki::Usage::kClient;
  const int64_t now_s = nowMs() / 1000;
  auto cert = pki::makeCertificate(subject, *key, pki.ca, pki.ca_key, now_s - 300, now_s + 86400, &error);
  if (!cert) die("certificate for " + node + ": " + error);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = pki.ca;
  ssl.pem_private_key = *key;
  ssl.pem_cert_chain = *cert;
  tls::addChannelArgs(&args);
  return grpc::CreateCustomChannel(address, grpc::SslCredentials(ssl), args);
}

// ---- simulated agents ----------------------------------------------------------------------------------------

struct Shared;

class SimAgent : public grpc::ClientBidiReactor<v1::AgentMessage, v1::Command> {
 public:
  SimAgent(Shared* shared, std::string node, std::shared_ptr<grpc::Channel> channel)
      : shared_(shared), node_(std::move(node)), stub_(v1::AgentService::NewStub(channel)) {}

  // Registers (asynchronously); the stream opens from the answer's callback. `done` is called once either way.
  void start(int gpus, std::function<void(bool)> done);
  void send(v1::AgentMessage msg) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    out_.push_back(std::move(msg));
    if (!writing_) {
      writing_ = true;
      StartWrite(&out_.front());
    }
  }
  void heartbeat() {
    v1::AgentMessage msg;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [key, r] : held_) *msg.mutable_heartbeat()->add_ranks() = r;
    }
    msg.mutable_heartbeat()->set_sent_ms(nowMs());
    send(std::move(msg));
  }
  // Every held rank of (job, attempt) exits 0; returns when the events were queued.
  void exitRanks(const std::string& job, int attempt);
  bool connected() {
    std::lock_guard<std::mutex> lock(mu_);
    return open_ && !closed_;
  }
  void cancel() { ctx_.TryCancel(); }
  void waitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(10), [&] { return closed_ || !open_; });
  }

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    out_.pop_front();
    if (!ok || closed_ || out_.empty()) {
      writing_ = false;
      if (!ok) out_.clear();
      return;
    }
    StartWrite(&out_.front());
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_all();
  }

 private:
  Shared* shared_;
  const std::string node_;
  std::unique_ptr<v1::AgentService::Stub> stub_;
  grpc::ClientContext register_ctx_, ctx_;
  v1::RegisterRequest register_req_;
  v1::RegisterResponse register_resp_;
  v1::Command in_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::AgentMessage> out_;
  bool writing_ = false, open_ = false, closed_ = false;
  std::map<std::pair<std::string, int>, v1::RankStatus> held_;
};

// Rank exits due at a time, sent by one thread.
struct Exit {
  Clock::time_point due;
  SimAgent* agent;
  std::string job;
  int attempt;
  bool operator>(const Exit& o) const { return due > o.due; }
};

struct Shared {
  int job_ms = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::priority_queue<Exit, std::vector<Exit>, std::greater<Exit>> exits;
  bool stopping = false;
  std::atomic<long> starts{0}, stops{0};
  // Sampled jobs (every job whose id ends in "00"): when their last rank's exit was sent.
  std::mutex sample_mu;
  std::map<std::string, int64_t> exit_sent_ms;
};

void SimAgent::start(int gpus, std::function<void(bool)> done) {
  register_req_.set_node(node_);
  register_req_.set_address("127.0.0.1");
  for (int i = 0; i < gpus; ++i) {
    v1::Gpu* g = register_req_.add_gpus();
    g->set_index(i);
    g->set_uuid("virtual-" + node_ + "-" + std::to_string(i));
    g->set_model("virtual");
  }
  (*register_req_.mutable_labels())["switch"] = "s" + std::to_string(std::hash<std::string>{}(node_) % 64);
  register_req_.set_agent_version("load-bench");
  register_ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  stub_->async()->Register(&register_ctx_, &register_req_, &register_resp_, [this, done](grpc::Status st) {
    if (!st.ok()) {
      std::fprintf(stderr, "register %s: %s\n", node_.c_str(), st.error_message().c_str());
      done(false);
      return;
    }
    stub_->async()->Connect(&ctx_, this);
    v1::AgentMessage hello;
    hello.mutable_hello()->set_node(node_);
    hello.mutable_hello()->set_session(register_resp_.session());
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
      out_.push_back(std::move(hello));
      writing_ = true;
      StartWrite(&out_.front());
    }
    StartRead(&in_);
    StartCall();
    done(true);
  });
}

void SimAgent::OnReadDone(bool ok) {
  if (!ok) return;
  if (in_.has_start()) {
    const auto& s = in_.start();
    std::vector<v1::AgentMessage> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& r : s.ranks()) {
        v1::RankStatus rs;
        rs.set_job_id(s.job_id());
        rs.set_attempt(s.attempt());
        rs.set_rank(r.rank());
        rs.set_gpu(r.gpu());
        rs.set_state(v1::RankStatus::RUNNING);
        rs.set_pid(100000 + r.rank());
        rs.set_started_ms(nowMs());
        held_[{s.job_id(), r.rank()}] = rs;
        events.emplace_back();
        *events.back().mutable_rank_event() = rs;
      }
    }
    for (auto& e : events) send(std::move(e));
    shared_->starts++;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->exits.push({Clock::now() + std::chrono::milliseconds(shared_->job_ms), this, s.job_id(), s.attempt()});
    }
    shared_->cv.notify_one();
  } else if (in_.has_stop()) {
    shared_->stops++;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      bool match = it->first.first == in_.stop().job_id() &&
                   (in_.stop().attempt() == 0 || it->second.attempt() <= in_.stop().attempt());
      it = match ? held_.erase(it) : std::next(it);
    }
  }
  StartRead(&in_);
}

void SimAgent::exitRanks(const std::string& job, int attempt) {
  std::vector<v1::AgentMessage> events;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, r] : held_) {
      if (key.first != job || r.attempt() != attempt || r.state() != v1::RankStatus::RUNNING) continue;
      r.set_state(v1::RankStatus::EXITED);
      r.set_exit_code(0);
      r.set_exited_ms(nowMs());
      events.emplace_back();
      *events.back().mutable_rank_event() = r;
    }
  }
  for (auto& e : events) send(std::move(e));
  if (job.size() > 2 && job.compare(job.size() - 2, 2, "00") == 0) {
    std::lock_guard<std::mutex> lock(shared_->sample_mu);
    shared_->exit_sent_ms[job] = nowMs();
  }
}

// ---- figures ----------------------------------------------------------------------------------------------

struct Dist {
  size_t n = 0;
  double median = 0, p99 = 0, max = 0;
};
Dist dist(std::vector<double> v) {
  Dist d;
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  d.n = v.size();
  d.median = v[v.size() / 2];
  d.p99 = v[std::min(v.size() - 1, static_cast<size_t>(0.99 * (v.size() - 1) + 0.5))];
  d.max = v.back();
  return d;
}

struct Row {
  std::string name, unit;
  double value;
};

void report(const std::vector<Row>& rows, const std::string& mode, const Options& o) {
  std::printf("%-52s %14s  %s\n", "figure", "value", "unit");
  for (const auto& r : rows) std::printf("%-52s %14.3f  %s\n", r.name.c_str(), r.value, r.unit.c_str());
  if (o.json.empty()) return;
  std::ofstream out(o.json);
  out << "{\"benchmark\":\"load\",\"mode\":\"" << mode << "\",\"nodes\":" << o.nodes << ",\"gpus_per_node\":" << o.gpus
      << ",\"heartbeat_hz\":" << o.heartbeat_hz << ",\"target_rate\":" << o.rate << ",\"duration_s\":"
      << o.duration_s << ",\"history\":" << o.history << ",\"tls\":" << (o.insecure ? "false" : "true")
      << ",\"figures\":{";
  for (size_t i = 0; i < rows.size(); ++i) out << (i ? "," : "") << "\"" << rows[i].name << "\":" << rows[i].value;
  out << "}}\n";
}

template <typename Call>
grpc::Status call(const std::string& token, Call&& f) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return f(&ctx);
}

int upNodes(v1::UserService::Stub& user, const std::string& token) {
  v1::ListNodesResponse resp;
  if (!call(token, [&](grpc::ClientContext* c) { return user.ListNodes(c, {}, &resp); }).ok()) return -1;
  int up = 0;
  for (const auto& n : resp.nodes()) up += n.state() == "UP" && n.connected();
  return up;
}

int64_t transitionMs(const v1::Job& j, v1::JobState to) {
  for (const auto& t : j.transitions()) {
    if (t.to() == to) return t.at_ms();
  }
  return -1;
}

// ---- load mode ------------------------------------------------------------------------------------------------

// The cluster's PKI for a run (init-pki into `dir` unless --pki-dir gave one); nothing under --insecure.
Pki loadPki(Options& o, const fs::path& dir) {
  Pki pki;
  if (o.insecure) return pki;
  if (o.pki_dir.empty()) {
    o.pki_dir = (dir / "pki").string();
    const fs::path log = dir / "init-pki.log";
    if (ddl::e2e::runToEnd({o.coordinator_bin, "init-pki", o.pki_dir}, log) != 0) {
      die("init-pki failed:\n" + slurp(log));
    }
  }
  pki.ca = slurp(o.pki_dir + "/ca.crt");
  pki.ca_key = slurp(o.pki_dir + "/ca.key");
  pki.token = firstLine(o.pki_dir + "/admin.token");
  if (pki.ca.empty() || pki.ca_key.empty() || pki.token.empty()) {
    die(o.pki_dir + " lacks ca.crt, ca.key or admin.token (node certificates are signed here with the CA key)");
  }
  return pki;
}

// Agents: certificates made first (not timed), then Register + Connect with at most 64 registrations in
// flight, until every node is UP; their time and the coordinator's memory go into `rows`.
std::vector<std::unique_ptr<SimAgent>> connectAgents(const Options& o, const Pki& pki, const Coordinator& coord,
                                                     Shared& shared, v1::UserService::Stub& user,
                                                     std::vector<Row>& rows) {
  std::vector<std::unique_ptr<SimAgent>> agents;
  auto t_certs = Clock::now();
  for (int i = 0; i < o.nodes; ++i) {
    const std::string node = "sim" + std::to_string(i);
    agents.push_back(std::make_unique<SimAgent>(&shared, node, agentChannel(o, pki, coord.address, node)));
  }
  std::printf("# %d simulated agents (%s), credentials made in %.1f s; coordinator %s pid %d\n", o.nodes,
              o.insecure ? "plaintext" : "mutual TLS, one certificate each", secondsSince(t_certs),
              coord.address.c_str(), coord.pid);
  std::fflush(stdout);
  std::mutex reg_mu;
  std::condition_variable reg_cv;
  int in_flight = 0, failed = 0;
  auto t_reg = Clock::now();
  for (auto& a : agents) {
    std::unique_lock<std::mutex> lock(reg_mu);
    reg_cv.wait(lock, [&] { return in_flight < 64; });
    ++in_flight;
    lock.unlock();
    a->start(o.gpus, [&](bool ok) {
      std::lock_guard<std::mutex> l(reg_mu);
      --in_flight;
      failed += !ok;
      reg_cv.notify_all();
    });
  }
  {
    std::unique_lock<std::mutex> lock(reg_mu);
    reg_cv.wait_for(lock, std::chrono::seconds(120), [&] { return in_flight == 0; });
  }
  if (failed > 0) die(std::to_string(failed) + " registrations failed");
  int up = 0;
  for (int i = 0; i < 600 && (up = upNodes(user, pki.token)) < o.nodes; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double connect_s = secondsSince(t_reg);
  if (up < o.nodes) die("only " + std::to_string(up) + " of " + std::to_string(o.nodes) + " nodes UP after 60 s");
  rows.push_back({"agents_register_and_connect_s", "s", connect_s});
  rows.push_back({"coordinator_rss_with_agents_mib", "MiB", sampleProc(coord.pid).rss_kb / 1024.0});
  return agents;
}

// What runs beside the load: the agents' heartbeats (agent i due at (k + i/N) / hz), the rank exits they
// owe, and the heartbeat-lag gauge sampled every second. stop() ends them.
class Background {
 public:
  Background(const Options& o, const Coordinator& coord, Shared& shared,
             std::vector<std::unique_ptr<SimAgent>>& agents)
      : shared_(shared) {
    heartbeater_ = std::thread([&, hz = o.heartbeat_hz, nodes = o.nodes] {
      const auto t0 = Clock::now();
      const double period = 1.0 / hz;
      long next = 0;  // heartbeats sent so far over all agents
      while (running_) {
        const long due = static_cast<long>(secondsSince(t0) / period * nodes);
        for (; next < due && running_; ++next) agents[next % nodes]->heartbeat();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    exiter_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(shared_.mu);
      while (!shared_.stopping) {
        if (shared_.exits.empty()) {
          shared_.cv.wait_for(lock, std::chrono::milliseconds(100));
          continue;
        }
        Exit e = shared_.exits.top();
        if (e.due > Clock::now()) {
          shared_.cv.wait_until(lock, e.due);
          continue;
        }
        shared_.exits.pop();
        lock.unlock();
        e.agent->exitRanks(e.job, e.attempt);
        lock.lock();
      }
    });
    sampler_ = std::thread([this, http = coord.http, hz = o.heartbeat_hz] {
      // From two heartbeat periods on: before that the gauge still counts the time since registration.
      const auto from = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(2.0 / hz));
      while (running_ && Clock::now() < from) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      while (running_) {
        if (!http.empty()) {
          if (auto v = metric(httpGet(http, "/metrics"), "ddl_heartbeat_lag_seconds")) lag_.push_back(*v);
        }
        for (int i = 0; i < 10 && running_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  // Ends the threads; the lag samples seen.
  std::vector<double> stop() {
    running_ = false;
    heartbeater_.join();
    sampler_.join();
    {
      std::lock_guard<std::mutex> lock(shared_.mu);
      shared_.stopping = true;
    }
    shared_.cv.notify_all();
    exiter_.join();
    return lag_;
  }

 private:
  Shared& shared_;
  std::atomic<bool> running_{true};
  std::vector<double> lag_;
  std::thread heartbeater_, exiter_, sampler_;
};

// Placement of a 256-GPU job under load, o.big_jobs times across the run: submit to SCHEDULED (ms) each.
std::vector<double> placeBigJobs(const Options& o, const Pki& pki, v1::UserService::Stub& user) {
  std::vector<double> big;
  for (int b = 0; b < o.big_jobs; ++b) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.duration_s * 1000 / (o.big_jobs + 1)));
    v1::SubmitRequest req;
    req.mutable_spec()->set_name("big");
    req.mutable_spec()->set_nodes(32);
    req.mutable_spec()->set_gpus_per_node(8);
    req.mutable_spec()->set_priority(10);
    req.mutable_spec()->add_command("/bin/true");
    v1::SubmitResponse resp;
    if (o.gpus < 8 || o.nodes < 32) break;
    if (!call(pki.token, [&](grpc::ClientContext* c) { return user.Submit(c, req, &resp); }).ok()) continue;
    for (int i = 0; i < 600; ++i) {
      v1::GetJobRequest g;
      g.set_id(resp.job().id());
      v1::Job j;
      call(pki.token, [&](grpc::ClientContext* c) { return user.GetJob(c, g, &j); });
      if (int64_t at = transitionMs(j, v1::SCHEDULED); at > 0) {
        big.push_back(static_cast<double>(at - j.submit_ms()));
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return big;
}

// End to end for the sampled small jobs (at most 300): submit -> SCHEDULED, and the rank exit leaving the
// agent -> SUCCEEDED, into `rows`.
void endToEndRows(const Pki& pki, Shared& shared, v1::UserService::Stub& user, std::vector<Row>& rows) {
  std::map<std::string, int64_t> sampled;
  {
    std::lock_guard<std::mutex> lock(shared.sample_mu);
    sampled = shared.exit_sent_ms;
  }
  std::vector<double> sched, exit_to_done;
  int n = 0;
  for (const auto& [id, sent] : sampled) {
    if (++n > 300) break;
    v1::GetJobRequest g;
    g.set_id(id);
    v1::Job j;
    if (!call(pki.token, [&](grpc::ClientContext* c) { return user.GetJob(c, g, &j); }).ok()) continue;
    if (int64_t at = transitionMs(j, v1::SCHEDULED); at > 0) sched.push_back(static_cast<double>(at - j.submit_ms()));
    if (int64_t at = transitionMs(j, v1::SUCCEEDED); at > 0) exit_to_done.push_back(static_cast<double>(at - sent));
  }
  const Dist sd = dist(sched), ed = dist(exit_to_done);
  rows.push_back({"small_job_submit_to_scheduled_median_ms", "ms", sd.median});
  rows.push_back({"small_job_submit_to_scheduled_p99_ms", "ms", sd.p99});
  rows.push_back({"rank_exit_event_to_succeeded_median_ms", "ms", ed.median});
  rows.push_back({"rank_exit_event_to_succeeded_p99_ms", "ms", ed.p99});
  rows.push_back({"rank_exit_samples", "jobs", static_cast<double>(ed.n)});
}

int runLoad(Options o, const fs::path& dir) {
  Coordinator coord;
  if (!o.attach.empty()) {
    coord.address = o.attach;
    coord.pid = o.pid;
    coord.http = o.http;
  }
  const Pki pki = loadPki(o, dir);
  if (o.attach.empty()) coord = startCoordinator(o, dir / "coordinator", dir / "coordinator.log");
  auto user = v1::UserService::NewStub(userChannel(o, coord.address));
  std::vector<Row> rows;
  rows.push_back({"coordinator_rss_idle_mib", "MiB", sampleProc(coord.pid).rss_kb / 1024.0});
  Shared shared;
  shared.job_ms = o.job_ms;
  std::vector<std::unique_ptr<SimAgent>> agents = connectAgents(o, pki, coord, shared, *user, rows);
  Background background(o, coord, shared, agents);

  // Submitters, open loop.
  const ProcSample before = sampleProc(coord.pid);
  const auto t_load = Clock::now();
  const long total = static_cast<long>(o.rate * o.duration_s);
  std::vector<std::vector<double>> ack(o.submitters);
  std::vector<long> rejected(o.submitters, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < o.submitters; ++t) {
    pool.emplace_back([&, t] {
      auto stub = v1::UserService::NewStub(userChannel(o, coord.address));
      v1::SubmitRequest req;
      req.mutable_spec()->set_name("load");
      req.mutable_spec()->set_nodes(1);
      req.mutable_spec()->set_gpus_per_node(1);
      req.mutable_spec()->add_command("/bin/true");
      for (long k = t; k < total; k += o.submitters) {
        const auto due = t_load + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(k / o.rate));
        std::this_thread::sleep_until(due);
        if (secondsSince(t_load) > o.duration_s + 30) break;  // far behind: stop rather than run on
        v1::SubmitResponse resp;
        const auto s0 = Clock::now();
        grpc::Status st = call(pki.token, [&](grpc::ClientContext* c) { return stub->Submit(c, req, &resp); });
        ack[t].push_back(std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
        if (!st.ok()) rejected[t]++;
      }
    });
  }
  const std::vector<double> big = placeBigJobs(o, pki, *user);
  for (auto& th : pool) th.join();
  const double load_s = secondsSince(t_load);
  const ProcSample after = sampleProc(coord.pid);
  // Let the last jobs finish before the end-to-end samples are read.
  std::this_thread::sleep_for(std::chrono::milliseconds(o.job_ms + 2000));
  const std::vector<double> lag = background.stop();

  std::vector<double> all;
  long nrejected = 0;
  for (int t = 0; t < o.submitters; ++t) {
    all.insert(all.end(), ack[t].begin(), ack[t].end());
    nrejected += rejected[t];
  }
  const Dist a = dist(all);
  rows.push_back({"submits", "jobs", static_cast<double>(a.n)});
  rows.push_back({"submits_rejected", "jobs", static_cast<double>(nrejected)});
  rows.push_back({"submit_rate_reached", "jobs/s", a.n / load_s});
  rows.push_back({"submit_ack_median_ms", "ms", a.median});
  rows.push_back({"submit_ack_p99_ms", "ms", a.p99});
  rows.push_back({"submit_ack_max_ms", "ms", a.max});
  rows.push_back({"jobs_started_on_agents", "starts", static_cast<double>(shared.starts.load())});
  const Dist l = dist(lag);
  rows.push_back({"heartbeat_lag_gauge_median_s", "s", l.median});
  rows.push_back({"heartbeat_lag_gauge_max_s", "s", l.max});
  rows.push_back({"coordinator_cpu_under_load", "cores", (after.cpu_s - before.cpu_s) / load_s});
  rows.push_back({"coordinator_rss_after_load_mib", "MiB", after.rss_kb / 1024.0});
  rows.push_back({"coordinator_rss_peak_mib", "MiB", after.hwm_kb / 1024.0});
  const Dist bd = dist(big);
  rows.push_back({"place_256gpu_job_submit_to_scheduled_median_ms", "ms", bd.median});
  rows.push_back({"place_256gpu_job_submit_to_scheduled_max_ms", "ms", bd.max});
  rows.push_back({"place_256gpu_job_samples", "jobs", static_cast<double>(bd.n)});
  endToEndRows(pki, shared, *user, rows);

  report(rows, "load", o);
  for (auto& a2 : agents) a2->cancel();
  for (auto& a2 : agents) a2->waitDone();
  stopCoordinator(coord);
  return 0;
}

// ---- history mode ---------------------------------------------------------------------------------------------

int runHistory(Options o, const fs::path& dir) {
  o.insecure = true;  // a loopback coordinator of the bench's own; measures state, not TLS
  std::string shm = "/dev/shm/ddl-load-bench-XXXXXX";
  if (!::mkdtemp(shm.data())) die("mkdtemp " + shm);
  auto t0 = Clock::now();
  if (!o.history_db.empty()) {
    // A state file of an earlier run (its jobs are counted by the coordinator's answer below).
    fs::copy_file(o.history_db, fs::path(shm) / "state.db");
  } else {
    state::SqliteStore::Options so;
    so.path = shm + "/state.db";
    auto sqlite = state::SqliteStore::open(so);
    if (!sqlite) die(sqlite.status().toString());
    state::DirectStore store(**sqlite);
    state::JobSpec spec;
    spec.name = "history";
    spec.user = "bench";
    spec.nodes = 1;
    spec.gpus_per_node = 1;
    spec.total_gpus = 1;
    spec.command = {"/bin/true"};
    for (long i = 0; i < o.history; ++i) {
      auto job = store.createJob(spec);
      if (!job) die(job.status().toString());
      for (auto to : {state::JobState::kScheduled, state::JobState::kStarting, state::JobState::kRunning,
                      state::JobState::kSucceeded}) {
        if (auto t = store.transition(job->id, to, "history"); !t) die(t.status().toString());
      }
      if ((i + 1) % 100000 == 0) {
        std::printf("# %ld jobs written (%.0f s)\n", i + 1, secondsSince(t0));
        std::fflush(stdout);
      }
    }
  }
  const double fill_s = secondsSince(t0);
  const fs::path data = dir / "coordinator";
  fs::create_directories(data);
  for (const auto& e : fs::directory_iterator(shm)) fs::copy_file(e.path(), data / e.path().filename());
  fs::remove_all(shm);
  const auto db_bytes = fs::file_size(data / "state.db");

  auto t_start = Clock::now();
  Coordinator coord = startCoordinator(o, data, dir / "coordinator.log");
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto user = v1::UserService::NewStub(grpc::CreateCustomChannel(coord.address, grpc::InsecureChannelCredentials(), args));
  std::vector<double> page;
  double serving_s = 0;
  // Serving: the first answered call (ListNodes: cheap whatever the history).
  for (int i = 0; i < 6000; ++i) {
    v1::ListNodesResponse resp;
    if (call("", [&](grpc::ClientContext* c) { return user->ListNodes(c, {}, &resp); }).ok()) {
      serving_s = secondsSince(t_start);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // A page of 500 (the documented default), all states, first page; then the server's own default (page_size 0)
  // once. The channel takes answers of any size: a server that ignores page_size answers every job, and that
  // is what is timed then (the number of jobs answered is reported). 5 pages at most, within 10 minutes.
  double page_jobs = -1;
  const auto t_pages = Clock::now();
  for (int i = 0; i < 5 && secondsSince(t_pages) < 600; ++i) {
    v1::ListJobsRequest req;
    req.set_page_size(500);
    v1::ListJobsResponse resp;
    auto s0 = Clock::now();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    grpc::Status st = user->ListJobs(&ctx, req, &resp);
    if (!st.ok()) die("ListJobs failed: " + st.error_message());
    page.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s0).count());
    page_jobs = resp.jobs_size();
    std::printf("# ListJobs page_size 500: %d jobs (%.0f MiB) in %.1f ms\n", resp.jobs_size(),
                resp.ByteSizeLong() / 1048576.0, page.back());
    std::fflush(stdout);
  }
  double default_page_ms = -1, default_page_jobs = -1;
  {
    v1::ListJobsRequest req;
    v1::ListJobsResponse resp;
    auto s0 = Clock::now();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(300));
    grpc::Status st = user->ListJobs(&ctx, req, &resp);
    default_page_ms = std::chrono::duration<double, std::milli>(Clock::now() - s0).count();
    if (st.ok()) {
      default_page_jobs = resp.jobs_size();
    } else {
      std::printf("# ListJobs with the server's default page size failed: %s\n", st.error_message().c_str());
    }
  }
  const ProcSample s = sampleProc(coord.pid);
  std::vector<Row> rows;
  rows.push_back({"history_jobs_written", "jobs", static_cast<double>(o.history)});
  rows.push_back({"history_fill_s", "s", fill_s});
  rows.push_back({"state_db_mib", "MiB", db_bytes / 1048576.0});
  rows.push_back({"restart_to_address_file_s", "s", coord.started_s});
  rows.push_back({"restart_to_serving_s", "s", serving_s});
  rows.push_back({"coordinator_rss_mib", "MiB", s.rss_kb / 1024.0});
  const Dist p = dist(page);
  rows.push_back({"listjobs_page_median_ms", "ms", p.median});
  rows.push_back({"listjobs_page_max_ms", "ms", p.max});
  rows.push_back({"listjobs_page_jobs", "jobs", page_jobs});
  rows.push_back({"listjobs_default_page_ms", "ms", default_page_ms});
  rows.push_back({"listjobs_default_page_jobs", "jobs (-1: failed)", default_page_jobs});
  report(rows, "history", o);
  stopCoordinator(coord);
  return 0;
}

void usage(const char* argv0) {
  std::fprintf(
      stderr,
      "usage: %s [--nodes N] [--gpus G] [--heartbeat-hz HZ] [--rate JOBS_PER_S] [--duration S]\n"
      "          [--submitters T] [--job-ms MS] [--big-jobs N] [--insecure] [--coordinator-bin PATH]\n"
      "          [--store etcd://127.0.0.1:PORT,...] (the coordinator's state in an etcd on loopback)\n"
      "          [--dir DIR] [--json FILE]\n"
      "          [--attach HOST:PORT --pid PID [--http HOST:PORT] (--pki-dir DIR | --insecure)]\n"
      "       %s (--history N | --history-db STATE.DB) [--coordinator-bin PATH] [--dir DIR] [--json FILE]\n",
      argv0, argv0);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.coordinator_bin = (fs::path(argv[0]).parent_path() / "ddl-coordinator").string();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--insecure") {
      o.insecure = true;
      continue;
    }
    if (a == "-h" || a == "--help") {
      usage(argv[0]);
      return 0;
    }
    if (i + 1 >= argc) {
      usage(argv[0]);
      return 2;
    }
    const std::string v = argv[++i];
    char* end = nullptr;
    const double num = std::strtod(v.c_str(), &end);
    const bool numeric = end && *end == '\0' && !v.empty();
    auto need = [&](double lo) {
      if (!numeric || num < lo) {
        std::fprintf(stderr, "%s needs a number >= %g, not '%s'\n", a.c_str(), lo, v.c_str());
        std::exit(2);
      }
      return num;
    };
    if (a == "--nodes") o.nodes = static_cast<int>(need(1));
    else if (a == "--gpus") o.gpus = static_cast<int>(need(1));
    else if (a == "--heartbeat-hz") o.heartbeat_hz = need(0.01);
    else if (a == "--rate") o.rate = need(0.1);
    else if (a == "--duration") o.duration_s = static_cast<int>(need(1));
    else if (a == "--submitters") o.submitters = static_cast<int>(need(1));
    else if (a == "--job-ms") o.job_ms = static_cast<int>(need(0));
    else if (a == "--big-jobs") o.big_jobs = static_cast<int>(need(0));
    else if (a == "--history") o.history = static_cast<long>(need(1));
    else if (a == "--pid") o.pid = static_cast<pid_t>(need(1));
    else if (a == "--coordinator-bin") o.coordinator_bin = v;
    else if (a == "--dir") o.dir = v;
    else if (a == "--json") o.json = v;
    else if (a == "--attach") o.attach = v;
    else if (a == "--http") o.http = v;
    else if (a == "--pki-dir") o.pki_dir = v;
    else if (a == "--history-db") o.history_db = v;
    else if (a == "--store")
      o.store = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      usage(argv[0]);
      return 2;
    }
  }
  if (!o.attach.empty() && o.pid <= 0) {
    std::fprintf(stderr, "--attach needs the coordinator's --pid (its CPU and memory are read from /proc)\n");
    return 2;
  }
  if (!o.attach.empty() && !o.insecure && o.pki_dir.empty()) {
    std::fprintf(stderr, "--attach needs --pki-dir (the cluster's CA, its key and admin.token) or --insecure\n");
    return 2;
  }
  if (o.attach.empty() && !fs::exists(o.coordinator_bin)) {
    std::fprintf(stderr, "%s not found; pass --coordinator-bin\n", o.coordinator_bin.c_str());
    return 2;
  }
  // Every agent holds a connection, and so does the coordinator for each: raise the descriptor limit (the
  // coordinator inherits it).
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < static_cast<rlim_t>(o.nodes) * 2 + 256) {
      std::fprintf(stderr, "the descriptor limit (%ld) is too low for %d agents; raise ulimit -n\n",
                   static_cast<long>(rl.rlim_cur), o.nodes);
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  std::string tmpl = ((o.dir.empty() ? fs::temp_directory_path() : fs::path(o.dir)) / "ddl-load-bench-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) {
    std::perror(tmpl.c_str());
    return 1;
  }
  const int rc = o.history > 0 || !o.history_db.empty() ? runHistory(o, tmpl) : runLoad(o, tmpl);
  fs::remove_all(tmpl);
  return rc;
}
