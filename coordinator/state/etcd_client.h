// The connection to an etcd cluster that EtcdStore and EtcdElection share: one gRPC channel per endpoint with
// its KV and Lease stubs. A call goes to the endpoint that answered last and, when that one is unreachable
// (UNAVAILABLE, a deadline, too many requests), to the others in turn. Plaintext, or TLS with the files
// of etcd_tls.h. A refusal etcd answered with ends the
// call, since no other member would decide differently: INVALID_ARGUMENT (too many operations, a request too
// large), INTERNAL for the rest. FAILED_PRECONDITION is left to the callers: it means a fence that failed.
// Internal to ddl_state_etcd.
//
// Threads: thread-safe; calls may run concurrently.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/pki.h"
#include "common/status.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "state/etcd_tls.h"

namespace ddl::state {

class EtcdClient {
 public:
  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  };

  // One channel per endpoint, over TLS when tls names a CA (its files are read here: INVALID_ARGUMENT names
  // one that cannot be read). Connecting happens on the first call.
  static StatusOr<std::unique_ptr<EtcdClient>> create(const std::vector<std::string>& endpoints,
                                                      const EtcdTls& tls, int64_t timeout_ms) {
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
    if (tls.enabled()) {
      if (tls.cert.empty() != tls.key.empty()) {
        return Status::invalidArgument("etcd TLS: give the client certificate and its key together");
      }
      grpc::SslCredentialsOptions ssl;
      for (auto [path, into] :
           {std::pair{&tls.ca, &ssl.pem_root_certs}, std::pair{&tls.cert, &ssl.pem_cert_chain},
            std::pair{&tls.key, &ssl.pem_private_key}}) {
        if (path->empty()) continue;
        std::string error;
        std::optional<std::string> pem = pki::readFile(*path, &error);
        if (!pem) return Status::invalidArgument("etcd TLS: " + error);
        if (pem->empty()) return Status::invalidArgument("etcd TLS: " + *path + " is empty");
        *into = std::move(*pem);
      }
      credentials = grpc::SslCredentials(ssl);
    }
    std::unique_ptr<EtcdClient> client(new EtcdClient(timeout_ms));
    for (const std::string& e : endpoints) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(-1);  // a page of large job records may pass gRPC's default 4 MiB
      // A member back after an outage is found within a second, not after gRPC's default backoff (up to 2
      // minutes): a standby must see etcd again to take over. (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, which
      // gRPC takes as the least time a connection attempt gets.)
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      auto channel = grpc::CreateCustomChannel(e, credentials, args);
      client->endpoints_.push_back(
          {e, channel, etcdserverpb::KV::NewStub(channel), etcdserverpb::Lease::NewStub(channel)});
    }
    return client;
  }

  // Runs fn(endpoint, context) on the endpoints in turn until one answers; `what` names the call in errors.
  template <class Fn>
  Status call(const std::string& what, Fn fn) {
    requests_.fetch_add(1);
    if (gate_ && !gate_()) return Status::unavailable(what + ": not sent (the test's gate is closed)");
    std::string errors;
    const size_t n = endpoints_.size();
    const size_t first = current_.load();
    for (size_t i = 0; i < n; ++i) {
      const size_t k = (first + i) % n;
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms_));
      grpc::Status st = fn(endpoints_[k], &ctx);
      if (st.ok()) {
        current_ = k;
        return Status::ok();
      }
      const std::string text = endpoints_[k].address + ": " + st.error_message();
      switch (st.error_code()) {
        case grpc::StatusCode::UNAVAILABLE:
        case grpc::StatusCode::DEADLINE_EXCEEDED:
        case grpc::StatusCode::RESOURCE_EXHAUSTED:  // "too many requests": another member may take it
          break;
        case grpc::StatusCode::INVALID_ARGUMENT:
        case grpc::StatusCode::OUT_OF_RANGE:
          return Status::invalidArgument(what + ": etcd at " + text);
        default:
          return Status::internal(what + ": etcd at " + text);
      }
      errors += (errors.empty() ? "" : "; ") + text;
    }
    return Status::unavailable(what + ": no etcd endpoint answered (" + errors + ")");
  }

  // The KV calls by method: client.kv(&KV::Stub::Range, request, &response, "reading ...").
  template <class Request, class Response>
  Status kv(grpc::Status (etcdserverpb::KV::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
            const Request& request, Response* response, const std::string& what) {
    return call(what, [&](Endpoint& e, grpc::ClientContext* ctx) {
      return (e.kv.get()->*method)(ctx, request, response);
    });
  }

  // Requests made so far (each call(), whichever endpoint answered).
  int64_t requests() const { return requests_.load(); }
  // For crash tests: called before every request; false and the request is not sent (UNAVAILABLE), as if this
  // process had died just then. Set before the client is shared.
  void setGate(std::function<bool()> gate) { gate_ = std::move(gate); }

 private:
  explicit EtcdClient(int64_t timeout_ms) : timeout_ms_(timeout_ms) {}

  std::function<bool()> gate_;
  std::atomic<int64_t> requests_{0};
  std::vector<Endpoint> endpoints_;
  std::atomic<size_t> current_{0};
  const int64_t timeout_ms_;
};

// Makes `txn` apply its success operations only while `key` has create revision `revision` (0: the key is
// absent). The one condition ddl's transactions use: create-if-absent, and a leader's fence
// (etcd_election.h).
inline void requireCreateRevision(etcdserverpb::TxnRequest* txn, const std::string& key, int64_t revision) {
  etcdserverpb::Compare* compare = txn->add_compare();
  compare->set_key(key);
  compare->set_target(etcdserverpb::Compare::CREATE);
  compare->set_result(etcdserverpb::Compare::EQUAL);
  compare->set_create_revision(revision);
}

}  // namespace ddl::state
