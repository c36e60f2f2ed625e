// The cluster's PKI directory (pki_dir.h): init-pki, renew-cert and issue-node, over common/pki's OpenSSL
// calls.
#include "auth/pki_dir.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>

#include "auth/users.h"
#include "common/pki.h"

namespace ddl::coordinator::auth {

using state::Status;
using state::StatusOr;

namespace {

std::string at(const std::string& dir, const char* file) { return dir + "/" + file; }

Status makeDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::unavailable("cannot create " + dir + ": " + ec.message());
  return Status::ok();
}

Status write(const std::string& path, const std::string& text, unsigned mode) {
  std::string error;
  if (!pki::writeFile(path, text, mode, &error)) return Status::internal(error);
  return Status::ok();
}

// The coordinator's certificate: its fixed name, localhost, this host's name, and what the operator adds.
pki::Subject coordinatorSubject(const std::vector<std::string>& names) {
  pki::Subject subject{pki::kCoordinatorName, {pki::kCoordinatorName, "localhost"}, {"127.0.0.1", "::1"},
                       pki::Usage::kServer};
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0 && *host) subject.dns_names.emplace_back(host);
  for (const auto& n : names) {
    unsigned char buf[16];
    const bool ip = inet_pton(AF_INET, n.c_str(), buf) == 1 || inet_pton(AF_INET6, n.c_str(), buf) == 1;
    (ip ? subject.ip_addresses : subject.dns_names).push_back(n);
  }
  return subject;
}

}  // namespace

StatusOr<std::string> initPki(const InitPkiOptions& o) {
  if (o.dir.empty()) return Status::invalidArgument("init-pki needs a directory");
  if (o.ca_days < 1 || o.cert_days < 1 || o.ca_days > 36500 || o.cert_days > o.ca_days) {
    return Status::invalidArgument("validities: 1 <= --days <= --ca-days <= 36500");
  }
  if (auto why = checkUserName(o.admin); !why.empty()) return Status::invalidArgument(why);
  std::error_code ec;
  if (std::filesystem::exists(at(o.dir, pki::kCaCert), ec) || std::filesystem::exists(at(o.dir, pki::kCaKey), ec)) {
    return Status::failedPrecondition(o.dir + " holds a CA already; init-pki never overwrites one (renew the "
                                      "coordinator's certificate with 'ddl-coordinator renew-cert')");
  }
  if (Status st = makeDir(o.dir); !st) return st;
  ::chmod(o.dir.c_str(), 0755);
  std::string error;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  auto ca_key = pki::newPrivateKey(&error);
  if (!ca_key) return Status::internal(error);
  auto ca = pki::makeCertificate({"ddl cluster CA", {}, {}, pki::Usage::kCa}, *ca_key, "", "", now - 300,
                                 now + int64_t{o.ca_days} * 86400, &error);
  if (!ca) return Status::internal(error);
  // The key first: a crash between the two leaves no CA certificate without its key.
  if (Status st = write(at(o.dir, pki::kCaKey), *ca_key, 0600); !st) return st;
  if (Status st = write(at(o.dir, pki::kCaCert), *ca, 0644); !st) return st;
  if (Status st = renewCoordinatorCert(o.dir, o.names, o.cert_days); !st) return st;
  auto token = addToUsersFile(at(o.dir, pki::kUsersFile), o.admin, Role::kAdmin);
  if (!token) return token.status();
  if (Status st = write(at(o.dir, pki::kAdminToken), *token + "\n", 0600); !st) return st;
  return *token;
}

Status renewCoordinatorCert(const std::string& dir, const std::vector<std::string>& names, int days) {
  if (days < 1 || days > 3650) return Status::invalidArgument("--days must be between 1 and 3650");
  std::string error;
  auto ca = pki::readFile(at(dir, pki::kCaCert), &error);
  auto ca_key = ca ? pki::readFile(at(dir, pki::kCaKey), &error) : std::nullopt;
  if (!ca || !ca_key) return Status::failedPrecondition(error + " (run 'ddl-coordinator init-pki " + dir + "' first)");
  auto key = pki::newPrivateKey(&error);
  if (!key) return Status::internal(error);
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  auto cert = pki::makeCertificate(coordinatorSubject(names), *key, *ca, *ca_key, now - 300,
                                   now + int64_t{days} * 86400, &error);
  if (!cert) return Status::invalidArgument(error);
  if (Status st = write(at(dir, pki::kCoordinatorKey), *key, 0600); !st) return st;
  return write(at(dir, pki::kCoordinatorCert), *cert, 0644);
}

Status writeNodeIdentity(const std::string& out_dir, const std::string& ca_pem, const std::string& cert_pem,
                         const std::string& key_pem) {
  std::string error;
  if (!pki::makePrivateDir(out_dir, &error)) return Status::failedPrecondition(error);
  if (Status st = write(at(out_dir, pki::kCaCert), ca_pem, 0644); !st) return st;
  if (!key_pem.empty()) {
    if (Status st = write(at(out_dir, pki::kNodeKey), key_pem, 0600); !st) return st;
  }
  return write(at(out_dir, pki::kNodeCert), cert_pem, 0644);
}

Status issueNodeFiles(const std::string& dir, const std::string& node, int days, const std::string& out_dir) {
  if (auto why = pki::checkNodeName(node); !why.empty()) return Status::invalidArgument(why);
  if (days < 1 || days > kMaxNodeCertDays)
    return Status::invalidArgument("--days must be between 1 and 3650");
  std::string error;
  auto ca = pki::readFile(at(dir, pki::kCaCert), &error);
  auto ca_key = ca ? pki::readFile(at(dir, pki::kCaKey), &error) : std::nullopt;
  if (!ca || !ca_key) return Status::failedPrecondition(error);
  auto key = pki::newPrivateKey(&error);
  if (!key) return Status::internal(error);
  auto cert = signNodeCertificate(node, *key, *ca, *ca_key, days, static_cast<int64_t>(std::time(nullptr)));
  if (!cert) return cert.status();
  return writeNodeIdentity(out_dir, *ca, cert->pem, *key);
}

StatusOr<NodeCertificate> signNodeCertificate(const std::string& node, const std::string& public_key_source,
                                              const std::string& ca_cert_pem, const std::string& ca_key_pem,
                                              int days, int64_t now_s) {
  if (auto why = pki::checkNodeName(node); !why.empty()) return Status::invalidArgument(why);
  if (days < 1 || days > kMaxNodeCertDays) {
    return Status::invalidArgument("a node certificate is valid for 1 to 3650 days, not " +
                                   std::to_string(days));
  }
  NodeCertificate out;
  out.not_after_s = now_s + int64_t{days} * 86400;
  std::string error;
  auto cert = pki::makeCertificate({node, {node}, {}, pki::Usage::kClient}, public_key_source, ca_cert_pem,
                                   ca_key_pem, now_s - 300, out.not_after_s, &error);
  if (!cert) return Status::invalidArgument(error);
  out.pem = std::move(*cert);
  return out;
}

}  // namespace ddl::coordinator::auth
