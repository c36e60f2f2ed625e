#include "rpc/server.h"

#include <spdlog/spdlog.h>

#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <thread>

#include "common/pki.h"
#include "ddl/tls.h"
#include "ddl/v1/ddl.grpc.pb.h"
#include "rpc/access.h"

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

int64_t nowS() { return static_cast<int64_t>(std::time(nullptr)); }

// The CA's certificate and key from the PKI directory, to sign node certificates with.
Status readCa(const SecurityOptions& security, std::string* cert, std::string* key) {
  std::string error;
  auto c = pki::readFile(security.pki_dir + "/" + pki::kCaCert, &error);
  if (!c) return Status::failedPrecondition(error);
  auto k = pki::readFile(security.pki_dir + "/" + pki::kCaKey, &error);
  if (!k) {
    return Status::failedPrecondition("this coordinator cannot issue certificates: " + error +
                                      " (the CA key stays with whoever ran init-pki)");
  }
  *cert = std::move(*c);
  *key = std::move(*k);
  return Status::ok();
}

// A node's client certificate (CN and DNS SAN = the node) for the key or request in public_key_source.
StatusOr<std::string> signNode(const SecurityOptions& security, const std::string& node,
                               const std::string& public_key_source, int days, int64_t* not_after_s,
                               std::string* ca_pem) {
  if (auto why = pki::checkNodeName(node); !why.empty()) return Status::invalidArgument(why);
  if (days <= 0) days = security.node_cert_days;
  if (days > 3650) return Status::invalidArgument("a node certificate is valid for at most 3650 days");
  std::string ca_key;
  if (Status st = readCa(security, ca_pem, &ca_key); !st) return st;
  std::string error;
  const int64_t now = nowS();
  *not_after_s = now + int64_t{days} * 86400;
  auto cert = pki::makeCertificate({node, {node}, {}, pki::Usage::kClient}, public_key_source, *ca_pem, ca_key,
                                   now - 300, *not_after_s, &error);
  if (!cert) return Status::invalidArgument(error);
  return *cert;
}

}  // namespace

class RpcServer::AgentServiceImpl final : public v1::AgentService::Service {
 public:
  AgentServiceImpl(Coordinator& c, const SecurityOptions& security) : coordinator_(c), security_(security) {}

  grpc::Status Register(grpc::ServerContext* context, const v1::RegisterRequest* request,
                        v1::RegisterResponse* response) override {
    if (Status st = access::checkNode(tls::peerCertificateName(*context), request->node(), security_.insecure); !st) {
      spdlog::warn("register refused: {}", st.message());
      return toGrpc(st);
    }
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
    if (Status st = access::checkNode(tls::peerCertificateName(*context), node, security_.insecure); !st) {
      spdlog::warn("agent stream refused: {}", st.message());
      return toGrpc(st);
    }
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

  // Called over TLS without a client certificate: a request with no token answers the CA certificate only
  // (what a joining node checks against the hash it was given before it sends its token); with a token, the
  // node's certificate for its CSR.
  grpc::Status Join(grpc::ServerContext*, const v1::JoinRequest* request, v1::JoinResponse* response) override {
    if (security_.insecure) {
      return toGrpc(Status::failedPrecondition("this coordinator runs --insecure: there is no CA to join"));
    }
    std::string error;
    auto ca = pki::readFile(security_.pki_dir + "/" + pki::kCaCert, &error);
    if (!ca) return toGrpc(Status::unavailable(error));
    response->set_ca_pem(*ca);
    if (request->token().empty()) return grpc::Status::OK;
    auto cn = pki::csrCommonName(request->csr_pem(), &error);
    if (!cn) return toGrpc(Status::invalidArgument(error));
    if (*cn != request->node()) {
      return toGrpc(Status::invalidArgument("the request's common name '" + *cn + "' is not the node '" +
                                            request->node() + "'"));
    }
    if (Status st = security_.users->redeemJoinToken(request->token(), request->node()); !st) {
      spdlog::warn("join refused for node {}: {}", request->node(), st.message());
      return toGrpc(st);
    }
    int64_t not_after = 0;
    std::string ca_pem;
    auto cert = signNode(security_, request->node(), request->csr_pem(), 0, &not_after, &ca_pem);
    if (!cert) return toGrpc(cert.status());
    response->set_certificate_pem(*cert);
    response->set_not_after_ms(not_after * 1000);
    spdlog::info("node {} joined with a join token; its certificate is valid until {}", request->node(), not_after);
    return grpc::Status::OK;
  }

 private:
  Coordinator& coordinator_;
  const SecurityOptions& security_;
};

class RpcServer::UserServiceImpl final : public v1::UserService::Service {
 public:
  UserServiceImpl(Coordinator& c, const SecurityOptions& security) : coordinator_(c), security_(security) {}

  grpc::Status Submit(grpc::ServerContext* ctx, const v1::SubmitRequest* req, v1::SubmitResponse* resp) override {
    auto who = identify(ctx);
    if (!who) return toGrpc(who.status());
    if (Status st = access::maySubmit(*who); !st) return toGrpc(st);
    auto spec = access::ownSpec(*who, req->spec(), security_.allow_root_jobs);
    if (!spec) return toGrpc(spec.status());
    return fill(coordinator_.submit(*spec), resp->mutable_job());
  }
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::Job* resp) override {
    return fill(ownedJob(ctx, req->id(), "see"), resp);
  }
  grpc::Status ListJobs(grpc::ServerContext* ctx, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    auto who = identify(ctx);
    if (!who) return toGrpc(who.status());
    auto jobs = coordinator_.listJobs(*req);
    if (!jobs) return toGrpc(jobs.status());
    *resp = std::move(*jobs);
    for (auto& job : *resp->mutable_jobs()) access::redactFor(*who, &job);
    return grpc::Status::OK;
  }
  grpc::Status CancelJob(grpc::ServerContext* ctx, const v1::CancelJobRequest* req, v1::Job* resp) override {
    auto job = ownedJob(ctx, req->id(), "cancel");
    if (!job) return toGrpc(job.status());
    return fill(coordinator_.cancel(req->id()), resp);
  }
  grpc::Status ListNodes(grpc::ServerContext* ctx, const v1::ListNodesRequest*,
                         v1::ListNodesResponse* resp) override {
    auto who = identify(ctx);
    if (!who) return toGrpc(who.status());
    for (auto& node : coordinator_.listNodes()) *resp->add_nodes() = std::move(node);
    return grpc::Status::OK;
  }
  grpc::Status DrainNode(grpc::ServerContext* ctx, const v1::DrainNodeRequest* req, v1::Node* resp) override {
    if (auto st = admin(ctx, req->drain() ? "drain" : "undrain"); !st.ok()) return st;
    return fill(coordinator_.drain(req->node(), req->drain()), resp);
  }
  grpc::Status GetRing(grpc::ServerContext* ctx, const v1::GetRingRequest* req, v1::RingLayout* resp) override {
    auto who = identify(ctx);
    if (!who) return toGrpc(who.status());
    return fill(coordinator_.ring(req->id()), resp);
  }
  grpc::Status GetLogs(grpc::ServerContext* ctx, const v1::GetLogsRequest* req, v1::GetLogsResponse* resp) override {
    auto job = ownedJob(ctx, req->id(), "read the logs of");
    if (!job) return toGrpc(job.status());
    return fill(coordinator_.readLog(*req), resp);
  }
  grpc::Status WhoAmI(grpc::ServerContext* ctx, const v1::WhoAmIRequest*, v1::Identity* resp) override {
    auto who = identify(ctx);
    if (!who) return toGrpc(who.status());
    resp->set_name(who->name);
    resp->set_role(auth::roleName(who->role));
    resp->set_via(who->via);
    return grpc::Status::OK;
  }
  grpc::Status AddUser(grpc::ServerContext* ctx, const v1::AddUserRequest* req, v1::AddUserResponse* resp) override {
    if (auto st = admin(ctx, "adding users"); !st.ok()) return st;
    auto role = auth::parseUserRole(req->role());
    if (!role) return toGrpc(Status::invalidArgument("role '" + req->role() + "' is not admin, user or viewer"));
    auto token = security_.users->add(req->name(), *role, req->rotate());
    if (!token) return toGrpc(token.status());
    spdlog::info("user {} ({}) {}", req->name(), auth::roleName(*role), req->rotate() ? "has a new token" : "added");
    resp->set_name(req->name());
    resp->set_role(auth::roleName(*role));
    resp->set_token(*token);
    return grpc::Status::OK;
  }
  grpc::Status RemoveUser(grpc::ServerContext* ctx, const v1::RemoveUserRequest* req,
                          v1::RemoveUserResponse*) override {
    if (auto st = admin(ctx, "removing users"); !st.ok()) return st;
    if (Status st = security_.users->remove(req->name()); !st) return toGrpc(st);
    spdlog::info("user {} removed", req->name());
    return grpc::Status::OK;
  }
  grpc::Status ListUsers(grpc::ServerContext* ctx, const v1::ListUsersRequest*, v1::ListUsersResponse* resp) override {
    if (auto st = admin(ctx, "listing users"); !st.ok()) return st;
    for (const auto& u : security_.users->list()) {
      v1::Identity* out = resp->add_users();
      out->set_name(u.name);
      out->set_role(auth::roleName(u.role));
      out->set_via(u.via);
    }
    return grpc::Status::OK;
  }
  grpc::Status IssueNodeCertificate(grpc::ServerContext* ctx, const v1::IssueNodeCertificateRequest* req,
                                    v1::IssueNodeCertificateResponse* resp) override {
    if (auto st = admin(ctx, "issuing node certificates"); !st.ok()) return st;
    std::string error;
    auto key = pki::newPrivateKey(&error);
    if (!key) return toGrpc(Status::internal(error));
    int64_t not_after = 0;
    std::string ca_pem;
    auto cert = signNode(security_, req->node(), *key, req->days(), &not_after, &ca_pem);
    if (!cert) return toGrpc(cert.status());
    resp->set_certificate_pem(*cert);
    resp->set_private_key_pem(*key);
    resp->set_ca_pem(ca_pem);
    resp->set_not_after_ms(not_after * 1000);
    spdlog::info("issued a certificate for node {}, valid until {}", req->node(), not_after);
    return grpc::Status::OK;
  }
  grpc::Status CreateJoinToken(grpc::ServerContext* ctx, const v1::CreateJoinTokenRequest* req,
                               v1::CreateJoinTokenResponse* resp) override {
    if (auto st = admin(ctx, "making join tokens"); !st.ok()) return st;
    std::string ca_pem, ca_key;
    if (Status st = readCa(security_, &ca_pem, &ca_key); !st) return toGrpc(st);
    int64_t expires = 0;
    auto token = security_.users->createJoinToken(req->node(), req->ttl_s() > 0 ? req->ttl_s() : 3600, &expires);
    if (!token) return toGrpc(token.status());
    std::string error;
    auto info = pki::inspectCertificate(ca_pem, &error);
    if (!info) return toGrpc(Status::internal(error));
    resp->set_token(*token);
    resp->set_expires_ms(expires * 1000);
    resp->set_ca_sha256(info->sha256);
    return grpc::Status::OK;
  }

 private:
  template <typename T>
  static grpc::Status fill(StatusOr<T> result, T* out) {
    if (!result) return toGrpc(result.status());
    *out = std::move(*result);
    return grpc::Status::OK;
  }

  StatusOr<auth::Identity> identify(grpc::ServerContext* ctx) const {
    auto who = access::identifyUser(tls::bearerToken(*ctx), security_.users, security_.insecure);
    if (!who) spdlog::info("refused {}: {}", ctx->peer(), who.status().message());
    return who;
  }

  grpc::Status admin(grpc::ServerContext* ctx, const char* what) const {
    auto who = identify(ctx);
    if (!who) return toGrpc(who.status());
    return toGrpc(access::mustBeAdmin(*who, what));
  }

  // The job, if the caller may `verb` it (its owner or an admin).
  StatusOr<v1::Job> ownedJob(grpc::ServerContext* ctx, const std::string& id, const char* verb) const {
    auto who = identify(ctx);
    if (!who) return who.status();
    auto job = coordinator_.getJob(id);
    if (!job) return job.status();
    if (Status st = access::mayTouchJob(*who, *job, verb); !st) return st;
    return job;
  }

  Coordinator& coordinator_;
  const SecurityOptions& security_;
};

RpcServer::RpcServer(Coordinator& coordinator, SecurityOptions security)
    : coordinator_(coordinator),
      security_(std::move(security)),
      agent_service_(std::make_unique<AgentServiceImpl>(coordinator, security_)),
      user_service_(std::make_unique<UserServiceImpl>(coordinator, security_)) {}

RpcServer::~RpcServer() { shutdown(); }

namespace {
tls::Files serverFiles(const std::string& pki_dir) {
  return {pki_dir + "/" + pki::kCaCert, pki_dir + "/" + pki::kCoordinatorCert, pki_dir + "/" + pki::kCoordinatorKey};
}
}  // namespace

Status RpcServer::checkTlsFiles(const std::string& pki_dir) {
  const std::string hint = "make the cluster's certificates with 'ddl-coordinator init-pki " + pki_dir +
                           "' (docs/security.md), or give --insecure on a loopback address for development";
  if (auto why = tls::checkFiles(serverFiles(pki_dir), hint); !why.empty()) return Status::failedPrecondition(why);
  return Status::ok();
}

Status RpcServer::start(const std::string& listen, std::string* bound) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size()) {
    return Status::invalidArgument("listen address '" + listen + "' is not HOST:PORT (e.g. 127.0.0.1:7070)");
  }
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (security_.insecure) {
    if (auto why = tls::checkInsecure(listen, "ddl-coordinator"); !why.empty()) return Status::invalidArgument(why);
    credentials = grpc::InsecureServerCredentials();
  } else {
    if (Status st = checkTlsFiles(security_.pki_dir); !st) return st;
    if (!security_.users) return Status::failedPrecondition("no user registry");
    credentials = tls::serverCredentials(serverFiles(security_.pki_dir), security_.refresh_s);
  }
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, credentials, &port);
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
