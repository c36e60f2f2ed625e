#include "ddl/tls.h"

#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <ctime>

#include "common/host_port.h"
#include "common/pki.h"

namespace ddl::tls {

std::string checkFiles(const Files& files, const std::string& hint) {
  std::string error;
  const auto ca = pki::readFile(files.ca, &error);
  if (!ca) return error + " (the cluster CA certificate; " + hint + ")";
  const auto ca_info = pki::inspectCertificate(*ca, &error);
  if (!ca_info) return files.ca + ": " + error;
  if (files.cert.empty() && files.key.empty()) return "";
  const auto cert = pki::readFile(files.cert, &error);
  if (!cert) return error + " (" + hint + ")";
  const auto key = pki::readFile(files.key, &error);
  if (!key) return error + " (" + hint + ")";
  if (!pki::verifyCertificate(*cert, *ca, static_cast<int64_t>(std::time(nullptr)), &error)) {
    return files.cert + ": " + error + " (checked against " + files.ca + "; " + hint + ")";
  }
  // A key that does not belong to the certificate fails every handshake with an obscure message; say it here.
  std::string csr_error;
  const auto probe = pki::makeCsr(*key, "probe", &csr_error);
  if (!probe) return files.key + ": " + csr_error;
  const auto signed_probe = pki::makeCertificate({"probe", {}, {}, pki::Usage::kClient}, *probe, *cert, *key,
                                                 0, 1, &csr_error);
  if (!signed_probe) return files.key + " is not the key of " + files.cert;
  return "";
}

std::shared_ptr<grpc::ServerCredentials> serverCredentials(const Files& files, unsigned refresh_s) {
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(files.key, files.cert,
                                                                                         files.ca, refresh_s);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  // Agents must present a node certificate (checked per call, rpc/auth); ddlctl presents none and sends a token.
  options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> channelCredentials(const Files& files, unsigned refresh_s) {
  std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> provider;
  if (files.cert.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(files.ca, refresh_s);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(files.key, files.cert, files.ca,
                                                                                    refresh_s);
  }
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!files.cert.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  return grpc::experimental::TlsCredentials(options);
}

void addChannelArgs(grpc::ChannelArguments* args) { args->SetSslTargetNameOverride(pki::kCoordinatorName); }

std::string checkInsecure(const std::string& host_port, const std::string& who) {
  if (ddl::isLoopback(host_port)) return "";
  return who + ": --insecure (plaintext, no authentication) is allowed only on a loopback address, not " +
         host_port + "; use TLS (docs/security.md)";
}

std::string bearerToken(const grpc::ServerContextBase& context) {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return "";
  const std::string value(it->second.data(), it->second.size());
  static const std::string kBearer = "Bearer ";
  return value.compare(0, kBearer.size(), kBearer) == 0 ? value.substr(kBearer.size()) : "";
}

std::string peerCertificateName(const grpc::ServerContextBase& context) {
  auto auth = context.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return "";
  // Only a certificate that verified against the CA makes the peer authenticated; its CN is the node's name.
  for (const auto& cn : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
    return std::string(cn.data(), cn.size());
  }
  for (const auto& san : auth->FindPropertyValues(GRPC_X509_SAN_PROPERTY_NAME)) {
    return std::string(san.data(), san.size());
  }
  return "";
}

}  // namespace ddl::tls
