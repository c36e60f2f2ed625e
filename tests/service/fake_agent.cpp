#include "service/fake_agent.h"

#include <algorithm>
#include <chrono>

#include "ddl/tls.h"

namespace ddl::testing {

namespace {
int64_t nowMs() {
  using namespace std::chrono;
  return duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count();
}
}  // namespace

FakeAgent::FakeAgent(std::string target, std::string node, int gpus, std::map<std::string, std::string> labels,
                     const std::string& pki_dir)
    : target_(std::move(target)), node_(std::move(node)), gpus_(gpus), labels_(std::move(labels)) {
  if (pki_dir.empty()) {
    stub_ = v1::AgentService::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  } else {
    grpc::ChannelArguments args;
    tls::addChannelArgs(&args);
    auto credentials = tls::channelCredentials({pki_dir + "/ca.crt", pki_dir + "/node.crt", pki_dir + "/node.key"});
    stub_ = v1::AgentService::NewStub(grpc::CreateCustomChannel(target_, credentials, args));
  }
}

FakeAgent::~FakeAgent() {
  stopHeartbeats();
  disconnect();
}

std::string FakeAgent::connect() {
  disconnect();
  v1::RegisterRequest req;
  req.set_node(node_);
  req.set_address("127.0.0.1");
  for (int i = 0; i < gpus_; ++i) {
    v1::Gpu* g = req.add_gpus();
    g->set_index(i);
    g->set_uuid("virtual-" + node_ + "-" + std::to_string(i));
    g->set_model("virtual");
  }
  for (const auto& [k, v] : labels_) (*req.mutable_labels())[k] = v;
  for (const auto& r : held()) *req.add_ranks() = r;
  v1::RegisterResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Status st = stub_->Register(&ctx, req, &resp);
  if (!st.ok()) return "register: " + st.error_message();

  std::lock_guard<std::mutex> lock(mu_);
  session_ = resp.session();
  context_ = std::make_unique<grpc::ClientContext>();
  stream_ = stub_->Connect(context_.get());
  stream_done_ = false;
  v1::AgentMessage hello;
  hello.mutable_hello()->set_node(node_);
  hello.mutable_hello()->set_session(session_);
  if (!stream_->Write(hello)) return "connect: the stream closed at once";
  reader_ = std::thread([this] { readLoop(); });
  return "";
}

void FakeAgent::disconnect() {
  std::thread reader;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (context_) context_->TryCancel();
    reader = std::move(reader_);
  }
  if (reader.joinable()) reader.join();
  std::lock_guard<std::mutex> lock(mu_);
  stream_.reset();
  context_.reset();
}

void FakeAgent::readLoop() {
  v1::Command cmd;
  while (stream_->Read(&cmd)) {
    std::vector<v1::AgentMessage> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      commands_.push_back(cmd);
      if (cmd.has_start()) {
        for (const auto& r : cmd.start().ranks()) {
          v1::RankStatus s;
          s.set_job_id(cmd.start().job_id());
          s.set_attempt(cmd.start().attempt());
          s.set_rank(r.rank());
          s.set_gpu(r.gpu());
          s.set_state(v1::RankStatus::RUNNING);
          s.set_pid(100000 + r.rank());
          s.set_started_ms(nowMs());
          ranks_[{s.job_id(), s.rank()}] = s;
          events.emplace_back();
          *events.back().mutable_rank_event() = s;
        }
      } else if (cmd.has_stop()) {
        // A real agent sends SIGTERM and reports the exits; the fake simply lets the ranks go.
        for (auto it = ranks_.begin(); it != ranks_.end();) {
          const auto& named = cmd.stop().ranks();  // some ranks only (an elastic job going on without them)
          bool match =
              it->first.first == cmd.stop().job_id() &&
              (cmd.stop().attempt() == 0 || it->second.attempt() <= cmd.stop().attempt()) &&
              (named.empty() || std::find(named.begin(), named.end(), it->first.second) != named.end());
          it = match ? ranks_.erase(it) : std::next(it);
        }
      }
    }
    for (const auto& e : events) write(e);
    cv_.notify_all();
  }
  grpc::Status st = stream_->Finish();
  std::lock_guard<std::mutex> lock(mu_);
  last_status_ = st;
  stream_done_ = true;
  cv_.notify_all();
}

bool FakeAgent::write(const v1::AgentMessage& msg) {
  std::lock_guard<std::mutex> lock(write_mu_);
  grpc::ClientReaderWriter<v1::AgentMessage, v1::Command>* stream;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!stream_ || stream_done_) return false;
    stream = stream_.get();
  }
  return stream->Write(msg);
}

bool FakeAgent::heartbeat() {
  v1::AgentMessage msg;
  for (const auto& r : held()) *msg.mutable_heartbeat()->add_ranks() = r;
  msg.mutable_heartbeat()->set_sent_ms(nowMs());
  return write(msg);
}

void FakeAgent::startHeartbeats(int interval_ms) {
  stopHeartbeats();
  {
    std::lock_guard<std::mutex> lock(mu_);
    heartbeating_ = true;
  }
  heartbeater_ = std::thread([this, interval_ms] {
    std::unique_lock<std::mutex> lock(mu_);
    while (heartbeating_) {
      lock.unlock();
      heartbeat();
      lock.lock();
      cv_.wait_for(lock, std::chrono::milliseconds(interval_ms), [&] { return !heartbeating_; });
    }
  });
}

void FakeAgent::stopHeartbeats() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    heartbeating_ = false;
  }
  cv_.notify_all();
  if (heartbeater_.joinable()) heartbeater_.join();
}

bool FakeAgent::waitStart(const std::string& job, v1::StartRanks* out, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    for (auto it = commands_.rbegin(); it != commands_.rend(); ++it) {
      if (it->has_start() && it->start().job_id() == job) {
        if (out) *out = it->start();
        return true;
      }
    }
    return false;
  });
}

bool FakeAgent::waitStop(const std::string& job, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    for (const auto& c : commands_) {
      if (c.has_stop() && c.stop().job_id() == job) return true;
    }
    return false;
  });
}

bool FakeAgent::exitRank(const std::string& job, int rank, int code, bool signal, const std::string& error) {
  v1::AgentMessage msg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = ranks_.find({job, rank});
    if (it == ranks_.end()) return false;
    it->second.set_state(v1::RankStatus::EXITED);
    if (signal) {
      it->second.set_signal(code);
    } else {
      it->second.set_exit_code(code);
    }
    it->second.set_exited_ms(nowMs());
    if (!error.empty()) it->second.set_error(error);  // as the agent reports a rank that could not start
    *msg.mutable_rank_event() = it->second;
  }
  return write(msg);
}

bool FakeAgent::exitAll(const std::string& job) {
  bool ok = true;
  for (const auto& r : held()) {
    if (r.job_id() == job && r.state() == v1::RankStatus::RUNNING) ok = exitRank(job, r.rank(), 0) && ok;
  }
  return ok;
}

std::vector<v1::RankStatus> FakeAgent::held() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::RankStatus> out;
  for (const auto& [key, r] : ranks_) out.push_back(r);
  return out;
}

grpc::Status FakeAgent::lastStreamStatus() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::seconds(5), [&] { return stream_done_; });
  return last_status_;
}

}  // namespace ddl::testing
