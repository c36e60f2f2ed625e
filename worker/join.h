// ddl-agent join: a new node gets its certificate with a one-time join token (ddlctl admin join-token), as a
// Kubernetes node does with a bootstrap token.
//
//  1. Over TLS that does not yet verify the coordinator, ask for the cluster CA (AgentService.Join with no
//     token). Trust it only if its SHA-256 is the one the operator was given with the token (--ca-sha256),
//     and only if the certificate the coordinator presented on that connection was signed by it and names
//     ddl-coordinator. Nothing secret has been sent yet.
//  2. Make the node's key here (it never leaves the node) and a certificate request for the node's name;
//     over TLS that now verifies the coordinator against that CA, send the request with the token.
//  3. Check the certificate that comes back (signed by the CA, for this node) and write ca.crt, node.key (0600)
//     and node.crt into the PKI directory.
//
// Threads: one call, blocking the caller for at most a few RPC deadlines.
#pragma once

#include <string>

#include "common/status.h"

namespace ddl::worker {

struct JoinOptions {
  std::string coordinator;  // HOST:PORT
  std::string node;
  std::string token;
  std::string ca_sha256;    // hex, as ddlctl admin join-token printed it
  std::string pki_dir;      // where ca.crt, node.crt and node.key go
  double timeout_s = 10;
};

Status joinCluster(const JoinOptions& options);

}  // namespace ddl::worker
