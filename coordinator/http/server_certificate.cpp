// The dashboard's HTTPS context (server_certificate.h): the coordinator's certificate and key, re-read when
// the files change.
#include "http/server_certificate.h"

#include <openssl/ssl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include "common/pki.h"

namespace ddl::coordinator::http {

namespace ssl = boost::asio::ssl;
using state::Status;
using state::StatusOr;

ServerCertificate::ServerCertificate(std::string cert_path, std::string key_path)
    : cert_path_(std::move(cert_path)), key_path_(std::move(key_path)) {}

std::string ServerCertificate::fingerprint() const {
  std::string out;
  for (const std::string* path : {&cert_path_, &key_path_}) {
    struct stat st {};
    if (::stat(path->c_str(), &st) != 0) {
      out += "missing;";
      continue;
    }
    out += std::to_string(st.st_ino) + ":" + std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) +
           "." + std::to_string(st.st_mtim.tv_nsec) + ";";
  }
  return out;
}

StatusOr<std::shared_ptr<ssl::context>> ServerCertificate::load() const {
  std::string error;
  auto cert = pki::readFile(cert_path_, &error);
  if (!cert) return Status::failedPrecondition(error);
  auto key = pki::readFile(key_path_, &error);
  if (!key) return Status::failedPrecondition(error);
  auto ctx = std::make_shared<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 | ssl::context::no_sslv3 |
                   ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 | ssl::context::single_dh_use);
  SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
  boost::system::error_code ec;
  ctx->use_certificate_chain(boost::asio::buffer(*cert), ec);
  if (ec) return Status::failedPrecondition(cert_path_ + " is not a PEM certificate: " + ec.message());
  ctx->use_private_key(boost::asio::buffer(*key), ssl::context::pem, ec);
  if (ec || SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
    return Status::failedPrecondition(key_path_ + " is not the private key of " + cert_path_ +
                                      (ec ? " (" + ec.message() + ")" : std::string()));
  }
  return ctx;
}

StatusOr<std::shared_ptr<ssl::context>> ServerCertificate::context() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string now = fingerprint();
  if (context_ && now == loaded_) return context_;
  if (now != tried_) {  // files changed since the last read (or never read): read them again
    tried_ = now;
    auto loaded = load();
    if (loaded) {
      const bool renewed = context_ != nullptr;
      context_ = *loaded;
      loaded_ = now;
      last_error_ = Status::ok();
      if (renewed) spdlog::info("dashboard: serving the renewed certificate {}", cert_path_);
      return context_;
    }
    last_error_ = loaded.status();
    if (context_) {
      spdlog::warn("dashboard: {}; still serving the previous certificate (tried again when the files change)",
                   last_error_.message());
    }
  }
  if (context_) return context_;
  return last_error_;
}

}  // namespace ddl::coordinator::http
