// The leader election among coordinators on etcd (etcd_election.h): a create-if-absent key under a lease,
// campaigned for, kept alive and resigned.
#include "state/etcd_election.h"

#include <utility>

#include "state/etcd_client.h"

namespace ddl::state {

namespace pb = etcdserverpb;

EtcdElection::EtcdElection(Options options) : options_(std::move(options)) {}
EtcdElection::~EtcdElection() = default;

StatusOr<std::unique_ptr<EtcdElection>> EtcdElection::create(Options options) {
  if (options.endpoints.empty()) return Status::invalidArgument("etcd election: give at least one endpoint");
  if (options.id.empty()) return Status::invalidArgument("etcd election: the candidate needs an id");
  if (options.ttl_s < 1) return Status::invalidArgument("etcd election: the lease must last at least 1 s");
  std::unique_ptr<EtcdElection> election(new EtcdElection(std::move(options)));
  auto client =
      EtcdClient::create(election->options_.endpoints, election->options_.tls, election->options_.timeout_ms);
  if (!client) return client.status();
  election->client_ = std::move(*client);
  return election;
}

StatusOr<bool> EtcdElection::campaign() {
  std::lock_guard<std::mutex> lock(mu_);
  if (revision_ > 0) return true;
  const std::string key = this->key();
  // Held already? By this candidate's own lease (a campaign whose answer was lost), it leads.
  pb::RangeRequest get;
  get.set_key(key);
  pb::RangeResponse got;
  if (Status st = client_->kv(&pb::KV::Stub::Range, get, &got, "reading " + key); !st) return st;
  if (got.kvs_size() > 0) {
    if (lease_ != 0 && got.kvs(0).lease() == lease_) {
      revision_ = got.kvs(0).create_revision();
      return true;
    }
    return false;
  }
  // Absent: a fresh lease (one taken for an earlier, lost campaign may have run out since), then the key if
  // it is still absent.
  pb::LeaseGrantRequest grant;
  grant.set_ttl(options_.ttl_s);
  pb::LeaseGrantResponse granted;
  Status st =
      client_->call("taking a lease to campaign", [&](EtcdClient::Endpoint& e, grpc::ClientContext* ctx) {
        return e.lease->LeaseGrant(ctx, grant, &granted);
      });
  if (!st) return st;
  if (!granted.error().empty()) return Status::unavailable("etcd refused a lease: " + granted.error());
  lease_ = granted.id();
  pb::TxnRequest txn;
  requireCreateRevision(&txn, key, 0);
  pb::PutRequest* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(options_.id);
  put->set_lease(lease_);
  pb::TxnResponse done;
  // On an error the lease is kept: the put may have landed, and the next campaign then finds the key under
  // it.
  if (Status put_st = client_->kv(&pb::KV::Stub::Txn, txn, &done, "campaigning for " + key); !put_st)
    return put_st;
  if (!done.succeeded()) return false;   // another candidate was quicker
  revision_ = done.header().revision();  // the put's revision is the key's create revision
  return true;
}

Status EtcdElection::keepAlive() {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease_ == 0) return Status::failedPrecondition("no lease to keep alive; campaign first");
  pb::LeaseKeepAliveRequest request;
  request.set_id(lease_);
  pb::LeaseKeepAliveResponse response;
  Status st =
      client_->call("renewing the leader's lease", [&](EtcdClient::Endpoint& e, grpc::ClientContext* ctx) {
        auto stream = e.lease->LeaseKeepAlive(ctx);
        if (!stream->Write(request) || !stream->Read(&response)) {
          stream->WritesDone();
          grpc::Status finished = stream->Finish();
          return finished.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the keep-alive stream ended")
                               : finished;
        }
        stream->WritesDone();
        return stream->Finish();
      });
  if (!st) return st;
  if (response.ttl() <= 0) {
    lease_ = 0;
    revision_ = 0;
    return Status::failedPrecondition("the lease of " + key() + " ran out: this coordinator no longer leads");
  }
  return Status::ok();
}

Status EtcdElection::resign() {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease_ == 0) return Status::ok();
  pb::LeaseRevokeRequest revoke;
  revoke.set_id(lease_);
  pb::LeaseRevokeResponse revoked;
  Status st = client_->call("giving up the lead", [&](EtcdClient::Endpoint& e, grpc::ClientContext* ctx) {
    return e.lease->LeaseRevoke(ctx, revoke, &revoked);
  });
  lease_ = 0;
  revision_ = 0;
  return st;
}

StatusOr<EtcdElection::Leader> EtcdElection::leader() {
  pb::RangeRequest get;
  get.set_key(key());
  pb::RangeResponse got;
  if (Status st = client_->kv(&pb::KV::Stub::Range, get, &got, "reading " + key()); !st) return st;
  Leader leader;
  if (got.kvs_size() > 0) {
    leader.id = got.kvs(0).value();
    leader.revision = got.kvs(0).create_revision();
  }
  return leader;
}

bool EtcdElection::leading() const {
  std::lock_guard<std::mutex> lock(mu_);
  return revision_ > 0;
}

int64_t EtcdElection::revision() const {
  std::lock_guard<std::mutex> lock(mu_);
  return revision_;
}

}  // namespace ddl::state
