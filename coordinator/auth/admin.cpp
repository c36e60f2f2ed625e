// The admin verbs (admin.h): what rpc/server.cpp's handlers did after checking the caller, moved here
// unchanged in their checks, messages and log lines.
#include "auth/admin.h"

#include <spdlog/spdlog.h>

#include "common/pki.h"

namespace ddl::coordinator::auth {

namespace {

void toProto(const Limits& l, v1::Limits* out) {
  out->set_gpus(l.gpus);
  out->set_running_jobs(l.running);
  out->set_pending_jobs(l.pending);
  if (l.gpu_hours > 0) {
    out->set_gpu_hours(l.gpu_hours);
    out->set_period(l.period);
  }
}

}  // namespace

void toProto(const Identity& who, v1::Identity* out) {
  out->set_name(who.name);
  out->set_role(roleName(who.role));
  out->set_via(who.via);
  out->set_account(who.account);
  for (const std::string& a : who.accounts) out->add_accounts(a);
}

Admin::Admin(UserRegistry* users, std::string pki_dir, int node_cert_days, bool insecure,
             std::function<int64_t()> now_s)
    : users_(users),
      pki_dir_(std::move(pki_dir)),
      node_cert_days_(node_cert_days),
      insecure_(insecure),
      now_s_(std::move(now_s)) {}

Status Admin::needUsers() const {
  if (users_) return Status::ok();
  return Status::failedPrecondition("this coordinator keeps no users (it was given no user registry)");
}

StatusOr<v1::AddUserResponse> Admin::addUser(const v1::AddUserRequest& request) {
  if (Status st = needUsers(); !st) return st;
  auto role = parseUserRole(request.role());
  if (!role) return Status::invalidArgument("role '" + request.role() + "' is not admin, user or viewer");
  auto token = users_->add(request.name(), *role, request.rotate(), request.account());
  if (!token) return token.status();
  auto who = users_->authenticate(*token);
  const std::string account = who ? who->account : request.account();
  spdlog::info("user {} ({}, account {}) {}", request.name(), roleName(*role), account,
               request.rotate() ? "has a new token" : "added");
  v1::AddUserResponse response;
  response.set_name(request.name());
  response.set_role(roleName(*role));
  response.set_token(*token);
  response.set_account(account);
  return response;
}

Status Admin::removeUser(const v1::RemoveUserRequest& request) {
  if (Status st = needUsers(); !st) return st;
  if (Status st = users_->remove(request.name()); !st) return st;
  spdlog::info("user {} removed", request.name());
  return Status::ok();
}

StatusOr<v1::ListUsersResponse> Admin::listUsers() const {
  if (Status st = needUsers(); !st) return st;
  v1::ListUsersResponse response;
  const auto limits = users_->userLimits();
  for (const auto& u : users_->list()) {
    v1::Identity* out = response.add_users();
    toProto(u, out);
    if (auto l = limits.find(u.name); l != limits.end()) toProto(l->second, out->mutable_limits());
  }
  return response;
}

StatusOr<v1::Identity> Admin::setUserAccounts(const v1::SetUserAccountsRequest& request) {
  if (Status st = needUsers(); !st) return st;
  const std::vector<std::string> add(request.add().begin(), request.add().end());
  const std::vector<std::string> remove(request.remove().begin(), request.remove().end());
  auto who = users_->setUserAccounts(request.name(), add, remove, request.default_account());
  if (!who) return who.status();
  std::string others;
  for (const std::string& a : who->accounts) others += (others.empty() ? "" : ",") + a;
  spdlog::info("user {}: default account {}, also in [{}]", who->name, who->account, others);
  v1::Identity out;
  toProto(*who, &out);
  return out;
}

StatusOr<v1::Account> Admin::addAccount(const v1::AddAccountRequest& request) {
  if (Status st = needUsers(); !st) return st;
  const int64_t share = request.share() == 0 && !request.update() ? 1 : request.share();
  if (Status st = users_->addAccount(request.name(), request.parent(), share, request.update()); !st)
    return st;
  auto listed = listAccounts();
  if (!listed) return listed.status();
  for (const v1::Account& a : listed->accounts()) {
    if (a.name() != request.name()) continue;
    spdlog::info("account {} (parent {}, share {}) {}", a.name(), a.parent(), a.share(),
                 request.update() ? "updated" : "added");
    return a;
  }
  return Status::internal("account " + request.name() + " was stored but is not listed");
}

Status Admin::removeAccount(const v1::RemoveAccountRequest& request) {
  if (Status st = needUsers(); !st) return st;
  if (Status st = users_->removeAccount(request.name()); !st) return st;
  spdlog::info("account {} removed", request.name());
  return Status::ok();
}

StatusOr<v1::ListAccountsResponse> Admin::listAccounts() const {
  if (Status st = needUsers(); !st) return st;
  v1::ListAccountsResponse response;
  for (const AccountInfo& a : users_->accounts()) {
    v1::Account* out = response.add_accounts();
    out->set_name(a.name);
    out->set_parent(a.parent);
    out->set_share(a.share);
    out->set_users(a.users);
    out->set_created_ms(a.created_s * 1000);
    toProto(a.limits, out->mutable_limits());
  }
  return response;
}

namespace {

void toProto(const QosInfo& q, v1::Qos* out) {
  out->set_name(q.name);
  out->set_priority(q.priority);
  for (const auto& p : q.preempt) out->add_preempt(p);
  out->set_grace_s(q.grace_s);
  out->set_gpus(q.gpus);
  for (const auto& a : q.accounts) out->add_accounts(a);
  out->set_created_ms(q.created_s * 1000);
}

}  // namespace

StatusOr<v1::Qos> Admin::addQos(const v1::AddQosRequest& request) {
  if (Status st = needUsers(); !st) return st;
  UserRegistry::QosChange change;
  if (request.has_priority()) change.priority = request.priority();
  if (request.has_grace_s()) change.grace_s = request.grace_s();
  if (request.has_gpus()) change.gpus = request.gpus();
  if (request.preempt_given() || request.preempt_size() > 0)
    change.preempt = std::vector<std::string>(request.preempt().begin(), request.preempt().end());
  if (request.accounts_given() || request.accounts_size() > 0)
    change.accounts = std::vector<std::string>(request.accounts().begin(), request.accounts().end());
  auto q = users_->setQos(request.name(), change, request.update());
  if (!q) return q.status();
  std::string preempts;
  for (const auto& p : q->preempt) preempts += (preempts.empty() ? "" : ",") + p;
  spdlog::info("QoS {} (priority {}, preempts {}, grace {} s, {} GPUs) {}", q->name, q->priority,
               preempts.empty() ? "nothing" : preempts, q->grace_s, q->gpus,
               request.update() ? "updated" : "added");
  v1::Qos out;
  toProto(*q, &out);
  return out;
}

Status Admin::removeQos(const v1::RemoveQosRequest& request) {
  if (Status st = needUsers(); !st) return st;
  if (Status st = users_->removeQos(request.name()); !st) return st;
  spdlog::info("QoS {} removed", request.name());
  return Status::ok();
}

StatusOr<v1::ListQosResponse> Admin::listQos() const {
  if (Status st = needUsers(); !st) return st;
  v1::ListQosResponse response;
  for (const QosInfo& q : users_->qosList()) toProto(q, response.add_qos());
  return response;
}

StatusOr<v1::Limits> Admin::setLimit(const v1::SetLimitRequest& request) {
  if (Status st = needUsers(); !st) return st;
  UserRegistry::LimitChange change;
  if (request.has_gpus()) change.gpus = request.gpus();
  if (request.has_running_jobs()) change.running = request.running_jobs();
  if (request.has_pending_jobs()) change.pending = request.pending_jobs();
  if (request.has_gpu_hours()) change.gpu_hours = request.gpu_hours();
  if (!request.period().empty()) change.period = request.period();
  auto set = users_->setLimit(request.account(), request.user(), change);
  if (!set) return set.status();
  spdlog::info("{} {} may hold {} GPUs, run {} jobs, queue {} jobs, use {} GPU-hours a {} (0: no limit)",
               request.account().empty() ? "user" : "account",
               request.account().empty() ? request.user() : request.account(), set->gpus, set->running,
               set->pending, set->gpu_hours, set->period);
  v1::Limits out;
  toProto(*set, &out);
  return out;
}

StatusOr<v1::IssueNodeCertificateResponse> Admin::issueNodeCertificate(
    const v1::IssueNodeCertificateRequest& request) {
  std::string error;
  auto key = pki::newPrivateKey(&error);
  if (!key) return Status::internal(error);
  std::string ca_pem;
  auto cert = signNode(request.node(), *key, request.days(), &ca_pem);
  if (!cert) return cert.status();
  v1::IssueNodeCertificateResponse response;
  response.set_certificate_pem(cert->pem);
  response.set_private_key_pem(*key);
  response.set_ca_pem(ca_pem);
  response.set_not_after_ms(cert->not_after_s * 1000);
  spdlog::info("issued a certificate for node {}, valid until {}", request.node(), cert->not_after_s);
  return response;
}

StatusOr<v1::CreateJoinTokenResponse> Admin::createJoinToken(const v1::CreateJoinTokenRequest& request) {
  if (Status st = needUsers(); !st) return st;
  std::string ca_pem, ca_key;
  if (Status st = readCa(&ca_pem, &ca_key); !st) return st;
  int64_t expires = 0;
  auto token =
      users_->createJoinToken(request.node(), request.ttl_s() > 0 ? request.ttl_s() : 3600, &expires);
  if (!token) return token.status();
  std::string error;
  auto info = pki::inspectCertificate(ca_pem, &error);
  if (!info) return Status::internal(error);
  v1::CreateJoinTokenResponse response;
  response.set_token(*token);
  response.set_expires_ms(expires * 1000);
  response.set_ca_sha256(info->sha256);
  return response;
}

StatusOr<v1::JoinResponse> Admin::join(const v1::JoinRequest& request) {
  if (insecure_)
    return Status::failedPrecondition("this coordinator runs --insecure: there is no CA to join");
  std::string error;
  auto ca = pki::readFile(pki_dir_ + "/" + pki::kCaCert, &error);
  if (!ca) return Status::unavailable(error);
  v1::JoinResponse response;
  response.set_ca_pem(*ca);
  if (request.token().empty()) return response;
  auto cn = pki::csrCommonName(request.csr_pem(), &error);
  if (!cn) return Status::invalidArgument(error);
  if (*cn != request.node()) {
    return Status::invalidArgument("the request's common name '" + *cn + "' is not the node '" +
                                   request.node() + "'");
  }
  if (Status st = needUsers(); !st) return st;
  // The CA's key is checked before the token is used up, so a coordinator that cannot sign keeps the token.
  std::string ca_cert, ca_key;
  if (Status st = readCa(&ca_cert, &ca_key); !st) return st;
  if (Status st = users_->redeemJoinToken(request.token(), request.node()); !st) {
    spdlog::warn("join refused for node {}: {}", request.node(), st.message());
    return st;
  }
  std::string ca_pem;
  auto cert = signNode(request.node(), request.csr_pem(), 0, &ca_pem);
  if (!cert) return cert.status();
  response.set_certificate_pem(cert->pem);
  response.set_not_after_ms(cert->not_after_s * 1000);
  spdlog::info("node {} joined with a join token; its certificate is valid until {}", request.node(),
               cert->not_after_s);
  return response;
}

Status Admin::readCa(std::string* cert, std::string* key) const {
  std::string error;
  auto c = pki::readFile(pki_dir_ + "/" + pki::kCaCert, &error);
  if (!c) return Status::failedPrecondition(error);
  auto k = pki::readFile(pki_dir_ + "/" + pki::kCaKey, &error);
  if (!k) {
    return Status::failedPrecondition("this coordinator cannot issue certificates: " + error +
                                      " (the CA key stays with whoever ran init-pki)");
  }
  *cert = std::move(*c);
  *key = std::move(*k);
  return Status::ok();
}

StatusOr<NodeCertificate> Admin::signNode(const std::string& node, const std::string& public_key_source,
                                          int days, std::string* ca_pem) const {
  if (auto why = pki::checkNodeName(node); !why.empty()) return Status::invalidArgument(why);
  if (days <= 0) days = node_cert_days_;
  if (days > kMaxNodeCertDays)
    return Status::invalidArgument("a node certificate is valid for at most 3650 days");
  std::string ca_key;
  if (Status st = readCa(ca_pem, &ca_key); !st) return st;
  return signNodeCertificate(node, public_key_source, *ca_pem, ca_key, days, now_s_());
}

}  // namespace ddl::coordinator::auth
