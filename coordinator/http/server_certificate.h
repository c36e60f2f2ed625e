// The dashboard's HTTPS side: the coordinator's certificate and key (the PKI directory's coordinator.crt and
// coordinator.key, the same files its gRPC port serves) as an OpenSSL server context, TLS 1.2 or later.
//
// The files are re-read when they change, so `ddl-coordinator renew-cert` reaches the dashboard without a
// restart: every new connection asks for the context, which costs two stat() calls, and a change of either
// file's inode, size or modification time makes the next one read both again. Connections already open keep
// the context they started with. A renewal writes the key and then the certificate (each by a rename), so a
// connection in between finds a key that does not match the certificate: that read fails, the previous context
// keeps being served, and the next change of the files is tried again.
//
// Threads: context() from any thread (one mutex).
#pragma once

#include <boost/asio/ssl/context.hpp>
#include <memory>
#include <mutex>
#include <string>

#include "common/status.h"

namespace ddl::coordinator::http {

class ServerCertificate {
 public:
  ServerCertificate(std::string cert_path, std::string key_path);

  // The context for a new connection. An error only while no pair of files has ever loaded; it names the file
  // and what is wrong with it.
  state::StatusOr<std::shared_ptr<boost::asio::ssl::context>> context();

 private:
  // Identifies both files' current contents without reading them: inode, size and mtime (ns) of each.
  std::string fingerprint() const;
  state::StatusOr<std::shared_ptr<boost::asio::ssl::context>> load() const;

  const std::string cert_path_;
  const std::string key_path_;
  std::mutex mu_;
  std::shared_ptr<boost::asio::ssl::context> context_;  // the last pair that loaded
  std::string loaded_;                                   // its fingerprint
  std::string tried_;                                    // the last fingerprint read, loaded or not
  state::Status last_error_;
};

}  // namespace ddl::coordinator::http
