// The cluster's PKI directory, as the operator's tools make and renew it (ddl-coordinator init-pki,
// renew-cert, issue-node; ddlctl admin issue-node writes the same files on a node).
//
//   DIR/ca.crt            the cluster CA (10 years by default)               0644
//   DIR/ca.key            its key: whoever holds it can mint identities      0600
//   DIR/coordinator.crt   the coordinator's server certificate (1 year)     0644
//   DIR/coordinator.key                                                      0600
//   DIR/users.json        users, roles and token hashes                       0600
//   DIR/admin.token       the first admin's token, for ddlctl on this host   0600
// and on a node: DIR/ca.crt, DIR/node.crt, DIR/node.key (0600).
//
// Every node certificate, whichever way it is made (issue-node here, ddlctl admin issue-node and
// AgentService.Join through the coordinator's auth/admin.h), is signed by signNodeCertificate.
//
// Threads: plain functions; callers serialise calls on one directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace ddl::coordinator::auth {

struct InitPkiOptions {
  std::string dir;
  std::vector<std::string> names;  // extra DNS names or IP addresses for the coordinator's certificate
  int ca_days = 3650;
  int cert_days = 365;
  std::string admin = "admin";     // the first admin user
};

// Makes the CA, the coordinator's certificate and the first admin (users.json, admin.token). Refuses to touch
// a directory that holds a CA already. Returns the admin's token.
state::StatusOr<std::string> initPki(const InitPkiOptions& options);

// A new key and certificate for the coordinator, signed by DIR's CA; the running coordinator picks them up
// within its tls_refresh_s.
state::Status renewCoordinatorCert(const std::string& dir, const std::vector<std::string>& names, int days);

// Writes a node's identity into out_dir: ca.crt, node.crt, node.key (0600). Used with a certificate the
// coordinator issued (ddlctl admin issue-node) or one signed from DIR's CA directly (issue-node).
state::Status writeNodeIdentity(const std::string& out_dir, const std::string& ca_pem, const std::string& cert_pem,
                                const std::string& key_pem);
// Signs a node certificate with DIR's CA and writes it (and a new key) into out_dir.
state::Status issueNodeFiles(const std::string& dir, const std::string& node, int days, const std::string& out_dir);

// The longest validity of a node certificate, in days.
inline constexpr int kMaxNodeCertDays = 3650;

struct NodeCertificate {
  std::string pem;
  int64_t not_after_s = 0;  // unix seconds
};
// A node's client certificate: CN and DNS SAN are `node` (the name the coordinator takes as the agent's
// identity), for the public key in public_key_source (the node's private key or its CSR, PEM), signed by the
// CA (ca_cert_pem, ca_key_pem), valid from 5 minutes before now_s (a node whose clock is a little behind can
// use it at once) for `days` days. Refuses a name pki::checkNodeName refuses and days
// outside 1..kMaxNodeCertDays; callers check both first, in their users' words, so these refusals are a last
// line.
state::StatusOr<NodeCertificate> signNodeCertificate(const std::string& node,
                                                     const std::string& public_key_source,
                                                     const std::string& ca_cert_pem,
                                                     const std::string& ca_key_pem, int days, int64_t now_s);

}  // namespace ddl::coordinator::auth
