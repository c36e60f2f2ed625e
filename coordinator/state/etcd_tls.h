// How a coordinator proves itself to etcd and checks etcd's certificate: the files etcd's own clients take
// (etcdctl --cacert, --cert, --key). No CA file: plaintext, which the daemon allows only toward loopback with
// an explicit --etcd-insecure (daemon/config.h).
//
// Threads: a plain value.
#pragma once

#include <string>

namespace ddl::state {

struct EtcdTls {
  std::string ca;    // PEM: the CA that signed etcd's server certificates; "" = plaintext
  std::string cert;  // PEM: this coordinator's client certificate, for etcd's --client-cert-auth ("" = none)
  std::string key;   // PEM: its private key (with cert, or both "")

  bool enabled() const { return !ca.empty(); }
};

}  // namespace ddl::state
