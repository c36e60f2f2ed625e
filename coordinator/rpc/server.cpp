// The coordinator's gRPC services (server.h): each handler identifies its caller (auth/access.h) and
// translates the call onto the Coordinator or auth::Admin.
#include "rpc/server.h"

#include <netdb.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "auth/access.h"
#include "common/host_port.h"
#include "common/pki.h"
#include "ddl/tls.h"
#include "ddl/v1/ddl.grpc.pb.h"

namespace ddl::coordinator {

grpc::Status toGrpc(const Status& status) {
  if (status.isOk()) return grpc::Status::OK;
  // state::StatusCode values are gRPC's codes by construction.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), status.message());
}

// One agent's Connect stream (gRPC's callback API: no thread waits on it). Reads one message at a time: the
// next read starts once the coordinator's loop has handled the last message, so an agent can never queue more
// than one message in the coordinator. Writes go out one at a time from a bounded queue. Every coordinator
// callback holds the stream open (`inflight_`), so OnDone deletes it only when none is pending.
//
// Threads: gRPC's callback threads and the coordinator's loop (the callbacks, send and close); mu_ guards
// everything below it.
class ConnectStream final : public grpc::ServerBidiReactor<v1::AgentMessage, v1::Command> {
 public:
  static constexpr size_t kMaxQueuedCommands = 10000;

  ConnectStream(Coordinator& coordinator, grpc::CallbackServerContext* context, bool insecure)
      : coordinator_(coordinator), context_(context), insecure_(insecure), link_(std::make_shared<Link>(this)) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return finish(grpc::Status::OK);  // the agent closed its side (or the call was cancelled)
    if (node_.empty()) return hello();
    StatusDone done = holdFor([this](Status st) {
      if (!st) return finish(toGrpc(st));
      readNext();
    });
    if (in_.has_heartbeat()) {
      coordinator_.heartbeat(node_, session_, in_.heartbeat(), std::move(done));
    } else if (in_.has_rank_event()) {
      coordinator_.rankEvent(node_, session_, in_.rank_event(), std::move(done));
    } else if (in_.has_log_data()) {
      coordinator_.logData(node_, session_, in_.log_data(), std::move(done));
    } else {
      done(Status::invalidArgument("node " + node_ + ": hello sent twice on one stream"));
    }
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.pop_front();
    if (!ok) return finishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "writing to the agent failed"));
    if (!queue_.empty() && !finished_) {
      StartWrite(&queue_.front());
    } else {
      writing_ = false;
    }
  }

  void OnCancel() override { finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream cancelled")); }

  void OnDone() override {
    link_->detach();
    // Also when the attach is still on its way: the loop runs this detach after it (it ignores a link that is
    // not the node's current one), so a finished stream never stays attached.
    if (!node_.empty()) coordinator_.detachAgent(node_, session_, link_);
    std::unique_lock<std::mutex> lock(mu_);
    done_ = true;
    if (inflight_ == 0) {
      lock.unlock();
      delete this;
    }
  }

 private:
  // What the coordinator holds: forwards to the stream while it lives.
  class Link final : public AgentLink {
   public:
    explicit Link(ConnectStream* stream) : stream_(stream) {}
    void send(const v1::Command& command) override {
      std::lock_guard<std::mutex> lock(mu_);
      if (stream_) stream_->send(command);
    }
    void close() override {
      std::lock_guard<std::mutex> lock(mu_);
      if (stream_) stream_->finish(grpc::Status(grpc::StatusCode::ABORTED, "the coordinator closed this stream"));
    }
    void detach() {
      std::lock_guard<std::mutex> lock(mu_);
      stream_ = nullptr;
    }

   private:
    std::mutex mu_;
    ConnectStream* stream_;
  };
  using StatusDone = std::function<void(Status)>;

  void hello() {
    if (!in_.has_hello()) {
      return finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the first message on Connect must be hello"));
    }
    const std::string node = in_.hello().node();
    if (Status st = access::checkNode(tls::peerCertificateName(*context_), node, insecure_); !st) {
      spdlog::warn("agent stream refused: {}", st.message());
      return finish(toGrpc(st));
    }
    node_ = node;
    session_ = in_.hello().session();
    coordinator_.attachAgent(node_, session_, link_, holdFor([this](Status st) {
                               if (!st) return finish(toGrpc(st));
                               readNext();
                             }));
  }

  // A coordinator callback that keeps the stream alive until it has run (and is skipped once it is finished).
  StatusDone holdFor(std::function<void(Status)> fn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++inflight_;
    }
    return [this, fn = std::move(fn)](Status st) {
      bool finished;
      {
        std::lock_guard<std::mutex> lock(mu_);
        finished = finished_;
      }
      if (!finished) fn(std::move(st));  // without mu_: fn starts a read or finishes
      std::unique_lock<std::mutex> lock(mu_);
      if (--inflight_ == 0 && done_) {
        lock.unlock();
        delete this;
      }
    };
  }

  // The next read, unless the stream is finished: under mu_, as Finish is, so no read starts after it (gRPC may
  // run OnDone and drop its stream once Finish has no operation left to wait for).
  void readNext() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!finished_) StartRead(&in_);
  }

  void send(const v1::Command& command) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    if (queue_.size() >= kMaxQueuedCommands) {
      spdlog::warn("node {}: {} commands queued and not read; closing its stream", node_, kMaxQueuedCommands);
      return finishLocked(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "the agent reads its commands too slowly"));
    }
    queue_.push_back(command);
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }

  void finish(grpc::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    finishLocked(std::move(status));
  }
  void finishLocked(grpc::Status status) {
    if (finished_) return;
    finished_ = true;
    Finish(std::move(status));
  }

  Coordinator& coordinator_;
  grpc::CallbackServerContext* context_;
  const bool insecure_;
  const std::shared_ptr<Link> link_;
  v1::AgentMessage in_;
  std::string node_, session_;  // set by the hello

  std::mutex mu_;
  std::deque<v1::Command> queue_;  // front: being written
  bool writing_ = false;
  bool finished_ = false;
  bool done_ = false;
  int inflight_ = 0;
};

class RpcServer::AgentServiceImpl final : public v1::AgentService::CallbackService {
 public:
  AgentServiceImpl(Coordinator& c, const SecurityOptions& security, auth::Admin& admin)
      : coordinator_(c), security_(security), admin_(admin) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override {
    auto* reactor = context->DefaultReactor();
    if (Status st = access::checkNode(tls::peerCertificateName(*context), request->node(), security_.insecure); !st) {
      spdlog::warn("register refused: {}", st.message());
      reactor->Finish(toGrpc(st));
      return reactor;
    }
    coordinator_.registerAgent(*request, [reactor, response](StatusOr<v1::RegisterResponse> result) {
      if (result) *response = std::move(*result);
      reactor->Finish(toGrpc(result.status()));
    });
    return reactor;
  }

  grpc::ServerBidiReactor<v1::AgentMessage, v1::Command>* Connect(grpc::CallbackServerContext* context) override {
    return new ConnectStream(coordinator_, context, security_.insecure);
  }

  // Called over TLS without a client certificate: a request with no token answers the CA certificate only
  // (what a joining node checks against the hash it was given before it sends its token); with a token, the
  // node's certificate for its CSR.
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context, const v1::JoinRequest* request,
                                 v1::JoinResponse* response) override {
    auto* reactor = context->DefaultReactor();
    auto joined = admin_.join(*request);
    if (joined) *response = std::move(*joined);
    reactor->Finish(toGrpc(joined.status()));
    return reactor;
  }

 private:
  Coordinator& coordinator_;
  const SecurityOptions& security_;
  auth::Admin& admin_;
};

// The user service. Calls that reach the coordinator answer from its callbacks (on its loop thread, after the
// change is durable); the rest (users, certificates: rare and quick, in auth::Admin) answer at once.
class RpcServer::UserServiceImpl final : public v1::UserService::CallbackService {
  using Ctx = grpc::CallbackServerContext;
  using Reactor = grpc::ServerUnaryReactor;

 public:
  UserServiceImpl(Coordinator& c, const SecurityOptions& security, auth::Admin& admin)
      : coordinator_(c), security_(security), admin_(admin) {}

  Reactor* Submit(Ctx* ctx, const v1::SubmitRequest* req, v1::SubmitResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    auto who = identify(ctx);
    if (!who) return finish(r, who.status());
    if (Status st = access::maySubmit(*who); !st) return finish(r, st);
    auto spec = access::ownSpec(*who, req->spec(), security_.allow_root_jobs, security_.users);
    if (!spec) return finish(r, spec.status());
    v1::SubmitRequest request = *req;
    *request.mutable_spec() = std::move(*spec);
    coordinator_.submit(request, fill(r, resp));
    return r;
  }
  Reactor* GetJob(Ctx* ctx, const v1::GetJobRequest* req, v1::Job* resp) override {
    auto* r = ctx->DefaultReactor();
    ownedJob(ctx, req->id(), "see", fill(r, resp));
    return r;
  }
  Reactor* ListJobs(Ctx* ctx, const v1::ListJobsRequest* req, v1::ListJobsResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    auto who = identify(ctx);
    if (!who) return finish(r, who.status());
    coordinator_.listJobs(*req, [r, resp, who = *who](StatusOr<v1::ListJobsResponse> jobs) {
      if (jobs) {
        *resp = std::move(*jobs);
        for (auto& job : *resp->mutable_jobs()) access::redactFor(who, &job);
      }
      r->Finish(toGrpc(jobs.status()));
    });
    return r;
  }
  Reactor* CancelJob(Ctx* ctx, const v1::CancelJobRequest* req, v1::Job* resp) override {
    auto* r = ctx->DefaultReactor();
    ownedJob(ctx, req->id(), req->signal() ? "signal" : "cancel",
             [this, r, resp, id = req->id(), signal = req->signal()](StatusOr<v1::Job> job) {
               if (!job) return fill(r, resp)(job.status());
               coordinator_.cancel(id, signal, fill(r, resp));
             });
    return r;
  }
  Reactor* HoldJob(Ctx* ctx, const v1::HoldJobRequest* req, v1::Job* resp) override {
    auto* r = ctx->DefaultReactor();
    auto who = identify(ctx);
    if (!who) return finish(r, who.status());
    ownedJob(ctx, req->id(), req->hold() ? "hold" : "release",
             [this, r, resp, id = req->id(), hold = req->hold(), who = *who](StatusOr<v1::Job> job) {
               if (!job) return fill(r, resp)(job.status());
               // An admin's hold on someone else's job is an admin hold: its owner cannot release it.
               const bool by_admin = who.isAdmin() && who.name != job->spec().user();
               coordinator_.hold(id, hold, by_admin, fill(r, resp));
             });
    return r;
  }
  Reactor* RequeueJob(Ctx* ctx, const v1::RequeueJobRequest* req, v1::Job* resp) override {
    auto* r = ctx->DefaultReactor();
    ownedJob(ctx, req->id(), "requeue", [this, r, resp, id = req->id()](StatusOr<v1::Job> job) {
      if (!job) return fill(r, resp)(job.status());
      coordinator_.requeue(id, fill(r, resp));
    });
    return r;
  }
  Reactor* ListNodes(Ctx* ctx, const v1::ListNodesRequest*, v1::ListNodesResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    auto who = identify(ctx);
    if (!who) return finish(r, who.status());
    coordinator_.listNodes([r, resp](StatusOr<std::vector<v1::Node>> nodes) {
      if (nodes) {
        for (auto& node : *nodes) *resp->add_nodes() = std::move(node);
      }
      r->Finish(toGrpc(nodes.status()));
    });
    return r;
  }
  Reactor* DrainNode(Ctx* ctx, const v1::DrainNodeRequest* req, v1::Node* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, req->drain() ? "drain" : "undrain"); !st.ok()) return now(r, st);
    coordinator_.drain(req->node(), req->drain(), req->reason(), fill(r, resp));
    return r;
  }
  Reactor* ClearGpuFault(Ctx* ctx, const v1::ClearGpuFaultRequest* req, v1::Node* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "clearing a GPU's fault"); !st.ok()) return now(r, st);
    coordinator_.clearGpuFault(req->node(), req->gpu(), fill(r, resp));
    return r;
  }
  Reactor* RemoveNode(Ctx* ctx, const v1::RemoveNodeRequest* req, v1::RemoveNodeResponse*) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "removing nodes"); !st.ok()) return now(r, st);
    coordinator_.removeNode(req->node(), [r](StatusOr<v1::Node> node) { r->Finish(toGrpc(node.status())); });
    return r;
  }
  Reactor* GetRing(Ctx* ctx, const v1::GetRingRequest* req, v1::RingLayout* resp) override {
    auto* r = ctx->DefaultReactor();
    auto who = identify(ctx);
    if (!who) return finish(r, who.status());
    coordinator_.ring(req->id(), fill(r, resp));
    return r;
  }
  Reactor* GetLogs(Ctx* ctx, const v1::GetLogsRequest* req, v1::GetLogsResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    ownedJob(ctx, req->id(), "read the logs of", [this, r, req, resp](StatusOr<v1::Job> job) {
      if (!job) return fill(r, resp)(job.status());
      coordinator_.readLog(*req, fill(r, resp));
    });
    return r;
  }
  Reactor* WhoAmI(Ctx* ctx, const v1::WhoAmIRequest* req, v1::Identity* resp) override {
    return now(ctx->DefaultReactor(), whoAmI(ctx, req, resp));
  }
  Reactor* AddUser(Ctx* ctx, const v1::AddUserRequest* req, v1::AddUserResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "adding users"); !st.ok()) return now(r, st);
    fill(r, resp)(admin_.addUser(*req));
    return r;
  }
  Reactor* RemoveUser(Ctx* ctx, const v1::RemoveUserRequest* req, v1::RemoveUserResponse*) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "removing users"); !st.ok()) return now(r, st);
    return finish(r, admin_.removeUser(*req));
  }
  Reactor* ListUsers(Ctx* ctx, const v1::ListUsersRequest*, v1::ListUsersResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "listing users"); !st.ok()) return now(r, st);
    fill(r, resp)(admin_.listUsers());
    return r;
  }
  Reactor* SetUserAccounts(Ctx* ctx, const v1::SetUserAccountsRequest* req, v1::Identity* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "changing a user's accounts"); !st.ok()) return now(r, st);
    fill(r, resp)(admin_.setUserAccounts(*req));
    return r;
  }
  Reactor* AddAccount(Ctx* ctx, const v1::AddAccountRequest* req, v1::Account* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, req->update() ? "changing accounts" : "adding accounts"); !st.ok())
      return now(r, st);
    fill(r, resp)(admin_.addAccount(*req));
    return r;
  }
  Reactor* RemoveAccount(Ctx* ctx, const v1::RemoveAccountRequest* req, v1::RemoveAccountResponse*) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "removing accounts"); !st.ok()) return now(r, st);
    return finish(r, admin_.removeAccount(*req));
  }
  // Anyone who may call sees the accounts and their shares (as sshare shows them to every user).
  Reactor* ListAccounts(Ctx* ctx, const v1::ListAccountsRequest*, v1::ListAccountsResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    auto who = identify(ctx);
    if (!who) return finish(r, who.status());
    fill(r, resp)(admin_.listAccounts());
    return r;
  }
  Reactor* AddQos(Ctx* ctx, const v1::AddQosRequest* req, v1::Qos* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, req->update() ? "changing QoS" : "adding QoS"); !st.ok()) return now(r, st);
    fill(r, resp)(admin_.addQos(*req));
    return r;
  }
  Reactor* RemoveQos(Ctx* ctx, const v1::RemoveQosRequest* req, v1::RemoveQosResponse*) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "removing QoS"); !st.ok()) return now(r, st);
    return finish(r, admin_.removeQos(*req));
  }
  // Anyone who may call sees the QoS (as sacctmgr show qos).
  Reactor* ListQos(Ctx* ctx, const v1::ListQosRequest*, v1::ListQosResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    auto who = identify(ctx);
    if (!who) return finish(r, who.status());
    fill(r, resp)(admin_.listQos());
    return r;
  }
  Reactor* SetLimit(Ctx* ctx, const v1::SetLimitRequest* req, v1::Limits* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "setting limits"); !st.ok()) return now(r, st);
    fill(r, resp)(admin_.setLimit(*req));
    return r;
  }
  Reactor* GetShares(Ctx* ctx, const v1::GetSharesRequest*, v1::GetSharesResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    auto who = identify(ctx);
    if (!who) return finish(r, who.status());
    coordinator_.shares(fill(r, resp));
    return r;
  }
  // Usage rollups (sreport), to anyone who may call, as the shares are.
  Reactor* GetUsage(Ctx* ctx, const v1::GetUsageRequest* req, v1::GetUsageResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    auto who = identify(ctx);
    if (!who) return finish(r, who.status());
    coordinator_.usage(*req, fill(r, resp));
    return r;
  }
  Reactor* IssueNodeCertificate(Ctx* ctx, const v1::IssueNodeCertificateRequest* req,
                                v1::IssueNodeCertificateResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "issuing node certificates"); !st.ok()) return now(r, st);
    fill(r, resp)(admin_.issueNodeCertificate(*req));
    return r;
  }
  Reactor* CreateJoinToken(Ctx* ctx, const v1::CreateJoinTokenRequest* req,
                           v1::CreateJoinTokenResponse* resp) override {
    auto* r = ctx->DefaultReactor();
    if (auto st = admin(ctx, "making join tokens"); !st.ok()) return now(r, st);
    fill(r, resp)(admin_.createJoinToken(*req));
    return r;
  }

 private:
  static Reactor* now(Reactor* r, grpc::Status status) {
    r->Finish(std::move(status));
    return r;
  }
  static Reactor* finish(Reactor* r, const Status& status) { return now(r, toGrpc(status)); }
  // A coordinator callback that copies the answer into `out` and finishes the call.
  template <typename T>
  static std::function<void(StatusOr<T>)> fill(Reactor* r, T* out) {
    return [r, out](StatusOr<T> result) {
      if (result) *out = std::move(*result);
      r->Finish(toGrpc(result.status()));
    };
  }

  grpc::Status whoAmI(grpc::ServerContextBase* ctx, const v1::WhoAmIRequest*, v1::Identity* resp) {
    auto who = identify(ctx);
    if (!who) return toGrpc(who.status());
    auth::toProto(*who, resp);
    return grpc::Status::OK;
  }

 private:
  StatusOr<auth::Identity> identify(grpc::ServerContextBase* ctx) const {
    auto who = access::identifyUser(tls::bearerToken(*ctx), security_.users, security_.insecure);
    if (!who) spdlog::info("refused {}: {}", ctx->peer(), who.status().message());
    return who;
  }

  grpc::Status admin(grpc::ServerContextBase* ctx, const char* what) const {
    auto who = identify(ctx);
    if (!who) return toGrpc(who.status());
    return toGrpc(access::mustBeAdmin(*who, what));
  }

  // The job, to `then`, if the caller may `verb` it (its owner or an admin).
  void ownedJob(grpc::ServerContextBase* ctx, const std::string& id, const char* verb,
                std::function<void(StatusOr<v1::Job>)> then) const {
    auto who = identify(ctx);
    if (!who) return then(who.status());
    coordinator_.getJob(id, [who = *who, verb, then = std::move(then)](StatusOr<v1::Job> job) {
      if (!job) return then(job.status());
      if (Status st = access::mayTouchJob(who, *job, verb); !st) return then(st);
      then(std::move(job));
    });
  }

  Coordinator& coordinator_;
  const SecurityOptions& security_;
  auth::Admin& admin_;
};

RpcServer::RpcServer(Coordinator& coordinator, SecurityOptions security)
    : coordinator_(coordinator),
      security_(std::move(security)),
      admin_(security_.users, security_.pki_dir, security_.node_cert_days, security_.insecure),
      agent_service_(std::make_unique<AgentServiceImpl>(coordinator, security_, admin_)),
      user_service_(std::make_unique<UserServiceImpl>(coordinator, security_, admin_)) {}

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

namespace {

// Why gRPC could not listen on `where` (it says only that it could not): a plain bind() of the same address
// tells "in use" (another process listens there: a second coordinator, say) from "not an address of this host".
std::string whyNoListen(const HostPort& where) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  if (getaddrinfo(where.host.c_str(), std::to_string(where.port).c_str(), &hints, &res) != 0 || !res) {
    return "cannot resolve host '" + where.host + "'";
  }
  std::string why = "gRPC refused it";
  const int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0) {
      const int err = errno;
      why = err == EADDRINUSE ? "address in use: another process (another ddl-coordinator?) listens on port " +
                                    std::to_string(where.port) + "; stop it or choose another --listen port"
            : err == EADDRNOTAVAIL ? "'" + where.host + "' is not an address of this host"
                                   : std::string(strerror(err));
    }
    close(fd);
  }
  freeaddrinfo(res);
  return why;
}

}  // namespace

Status RpcServer::start(const std::string& listen, std::string* bound) {
  auto where = parseHostPort(listen);
  if (!where) {
    return Status::invalidArgument("listen address '" + listen + "': " + where.status().message() +
                                   " (expected HOST:PORT, e.g. 127.0.0.1:7070)");
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
  // gRPC sets SO_REUSEPORT by default: a second coordinator on this port would then start beside the first and
  // the kernel would deal the clients out between the two. The port is this coordinator's alone.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(agent_service_.get());
  builder.RegisterService(user_service_.get());
  // Agents keep their stream open for days; let them ping it so a dead peer is noticed on either side.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Calls in flight per connection (each is at most one task on the coordinator's loop at a time): an agent
  // holds one stream, ddlctl makes one call at a time; a client past this waits in HTTP/2 flow control.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 256);
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0) {
    server_.reset();
    return Status::unavailable("cannot listen on " + listen + ": " + whyNoListen(*where));
  }
  *bound = formatHostPort(where->host, port);
  return Status::ok();
}

void RpcServer::shutdown(int64_t deadline_ms) {
  if (!server_) return;
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  server_->Wait();
  server_.reset();
}

}  // namespace ddl::coordinator
