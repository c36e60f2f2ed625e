#include "rpc/server.h"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "ddl/v1/ddl.grpc.pb.h"

namespace ddl::coordinator {

grpc::Status toGrpc(const Status& status) {
  if (status.isOk()) return grpc::Status::OK;
  // state::StatusCode values are gRPC's codes by construction.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

namespace {

// An AgentLink over one Connect stream: send() queues, a writer thread writes, close() cancels the call so
// the reading handler thread wakes up too.
class StreamLink : public AgentLink {
 public:
  explicit StreamLink(grpc::ServerContext* context) : context_(context) {}

  void send(const v1::Command& command) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    queue_.push_back(command);
    cv_.notify_one();
  }

  void close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_one();
    context_->TryCancel();
  }

  // The writer thread's body: writes commands in order until close() or a failed write.
  void writeLoop(grpc::ServerReaderWriter<v1::Command, v1::AgentMessage>* stream) {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      if (closed_) return;
      v1::Command cmd = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      bool ok = stream->Write(cmd);
      lock.lock();
      if (!ok) {
        closed_ = true;
        context_->TryCancel();
        return;
      }
    }
  }

 private:
  grpc::ServerContext* context_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::Command> queue_;
  bool closed_ = false;
};

}  // namespace

class RpcServer::AgentServiceImpl final : public v1::AgentService::Service {
 public:
  explicit AgentServiceImpl(Coordinator& c) : coordinator_(c) {}

  grpc::Status Register(grpc::ServerContext*, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    auto result = coordinator_.registerAgent(*request);
    if (!result) return toGrpc(result.status());
    *response = std::move(*result);
    return grpc::Status::OK;
  }

  grpc::Status Connect(grpc::ServerContext* context,
                       grpc::ServerReaderWriter<v1::Command, v1::AgentMessage>* stream) override {
    v1::AgentMessage msg;
    if (!stream->Read(&msg)) return grpc::Status(grpc::StatusCode::CANCELLED, "stream ended before hello");
    if (!msg.has_hello()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message on Connect must be hello");
    }
    const std::string node = msg.hello().node();
    const std::string session = msg.hello().session();
    auto link = std::make_shared<StreamLink>(context);
    Status st = coordinator_.attachAgent(node, session, link);
    if (!st) return toGrpc(st);
    std::thread writer([&] { link->writeLoop(stream); });

    grpc::Status result = grpc::Status::OK;
    while (stream->Read(&msg)) {
      if (msg.has_heartbeat()) {
        st = coordinator_.heartbeat(node, session, msg.heartbeat());
      } else if (msg.has_rank_event()) {
        st = coordinator_.rankEvent(node, session, msg.rank_event());
      } else if (msg.has_log_data()) {
        st = coordinator_.logData(node, session, msg.log_data());
      } else {
        st = Status::invalidArgument("node " + node + ": hello sent twice on one stream");
      }
      if (!st) {
        result = toGrpc(st);
        break;
      }
    }
    coordinator_.detachAgent(node, session, link);
    link->close();
    writer.join();
    return result;
  }

 private:
  Coordinator& coordinator_;
};

class RpcServer::UserServiceImpl final : public v1::UserService::Service {
 public:
  explicit UserServiceImpl(Coordinator& c) : coordinator_(c) {}

  grpc::Status Submit(grpc::ServerContext*, const v1::SubmitRequest* req, v1::SubmitResponse* resp) override {
    return fill(coordinator_.submit(req->spec()), resp->mutable_job());
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* req, v1::Job* resp) override {
    return fill(coordinator_.getJob(req->id()), resp);
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    auto jobs = coordinator_.listJobs(*req);
    if (!jobs) return toGrpc(jobs.status());
    for (auto& job : *jobs) *resp->add_jobs() = std::move(job);
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req, v1::Job* resp) override {
    return fill(coordinator_.cancel(req->id()), resp);
  }
  grpc::Status ListNodes(grpc::ServerContext*, const v1::ListNodesRequest*,
                         v1::ListNodesResponse* resp) override {
    for (auto& node : coordinator_.listNodes()) *resp->add_nodes() = std::move(node);
    return grpc::Status::OK;
  }
  grpc::Status DrainNode(grpc::ServerContext*, const v1::DrainNodeRequest* req, v1::Node* resp) override {
    return fill(coordinator_.drain(req->node(), req->drain()), resp);
  }
  grpc::Status GetRing(grpc::ServerContext*, const v1::GetRingRequest* req, v1::RingLayout* resp) override {
    return fill(coordinator_.ring(req->id()), resp);
  }
  grpc::Status GetLogs(grpc::ServerContext*, const v1::GetLogsRequest* req, v1::GetLogsResponse* resp) override {
    return fill(coordinator_.readLog(*req), resp);
  }

 private:
  template <typename T>
  static grpc::Status fill(StatusOr<T> result, T* out) {
    if (!result) return toGrpc(result.status());
    *out = std::move(*result);
    return grpc::Status::OK;
  }

  Coordinator& coordinator_;
};

RpcServer::RpcServer(Coordinator& coordinator)
    : coordinator_(coordinator),
      agent_service_(std::make_unique<AgentServiceImpl>(coordinator)),
      user_service_(std::make_unique<UserServiceImpl>(coordinator)) {}

RpcServer::~RpcServer() { shutdown(); }

Status RpcServer::start(const std::string& listen, std::string* bound) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) {
    return Status::invalidArgument("listen address '" + listen + "' is not HOST:PORT (e.g. 127.0.0.1:7070)");
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(agent_service_.get());
  builder.RegisterService(user_service_.get());
  // Agents keep their stream open for days; let them ping it so a dead peer is noticed on either side.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    server_.reset();
    return Status::unavailable("cannot listen on " + listen +
                               " (address in use, or not an address of this host?)");
  }
  *bound = listen.substr(0, colon) + ":" + std::to_string(port);
  return Status::ok();
}

void RpcServer::shutdown(int64_t deadline_ms) {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  server_->Wait();
  server_.reset();
}

}  // namespace ddl::coordinator
