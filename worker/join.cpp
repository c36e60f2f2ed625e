// ddl-agent join (join.h): a key pair and a CSR made here, traded with a one-time token for the node's
// certificate.
#include "worker/join.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <ctime>
#include <filesystem>

#include "common/pki.h"
#include "ddl/tls.h"
#include "ddl/v1/ddl.grpc.pb.h"

namespace ddl::worker {


namespace {

void setDeadline(grpc::ClientContext* ctx, double timeout_s) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
}

// TLS that encrypts but does not verify the coordinator yet: step 1 only, where nothing secret is sent.
std::shared_ptr<grpc::ChannelCredentials> unverifiedCredentials() {
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_verify_server_certs(false);
  options.set_check_call_host(false);
  options.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
  return grpc::experimental::TlsCredentials(options);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  s.erase(std::remove(s.begin(), s.end(), ':'), s.end());  // accept openssl's AA:BB:... form too
  return s;
}

}  // namespace

Status joinCluster(const JoinOptions& o) {
  if (auto why = pki::checkNodeName(o.node); !why.empty()) return Status::invalidArgument(why);
  if (o.token.empty()) return Status::invalidArgument("no join token (ddlctl admin join-token NODE makes one)");
  if (o.ca_sha256.empty()) return Status::invalidArgument("no --ca-sha256: the CA's hash comes with the join token");
  const std::string ca_path = o.pki_dir + "/" + pki::kCaCert;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  std::string error;

  // 1. The CA, pinned by its hash, and the coordinator's certificate checked against it.
  std::string ca_pem;
  {
    auto stub = v1::AgentService::NewStub(grpc::CreateChannel(o.coordinator, unverifiedCredentials()));
    grpc::ClientContext ctx;
    setDeadline(&ctx, o.timeout_s);
    v1::JoinRequest req;
    req.set_node(o.node);
    v1::JoinResponse resp;
    grpc::Status st = stub->Join(&ctx, req, &resp);
    if (!st.ok()) return Status::unavailable("coordinator " + o.coordinator + ": " + st.error_message());
    ca_pem = resp.ca_pem();
    auto info = pki::inspectCertificate(ca_pem, &error);
    if (!info) return Status::dataLoss("the coordinator sent no valid CA certificate: " + error);
    if (info->sha256 != lower(o.ca_sha256)) {
      return Status::permissionDenied("the coordinator's CA has SHA-256 " + info->sha256 + ", not " +
                                      lower(o.ca_sha256) + ": refusing to join (wrong address, or someone in "
                                      "between)");
    }
    auto auth = ctx.auth_context();
    std::string server_pem;
    for (const auto& v : auth ? auth->FindPropertyValues(GRPC_X509_PEM_CERT_PROPERTY_NAME)
                              : std::vector<grpc::string_ref>{}) {
      server_pem.assign(v.data(), v.size());
    }
    if (server_pem.empty() || !pki::verifyCertificate(server_pem, ca_pem, now, &error)) {
      return Status::permissionDenied("the coordinator's certificate is not from the pinned CA" +
                                      (error.empty() ? std::string() : " (" + error + ")"));
    }
  }

  // 2. The node's key and request; the token travels only over the verified connection.
  auto key = pki::newPrivateKey(&error);
  if (!key) return Status::internal(error);
  auto csr = pki::makeCsr(*key, o.node, &error);
  if (!csr) return Status::internal(error);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(o.pki_dir).parent_path(), ec);
  if (!pki::makePrivateDir(o.pki_dir, &error)) return Status::failedPrecondition(error);
  if (!pki::writeFile(ca_path, ca_pem, 0644, &error)) return Status::internal(error);
  grpc::ChannelArguments args;
  tls::addChannelArgs(&args);
  auto stub = v1::AgentService::NewStub(
      grpc::CreateCustomChannel(o.coordinator, tls::channelCredentials({ca_path, "", ""}), args));
  grpc::ClientContext ctx;
  setDeadline(&ctx, o.timeout_s);
  v1::JoinRequest req;
  req.set_node(o.node);
  req.set_token(o.token);
  req.set_csr_pem(*csr);
  v1::JoinResponse resp;
  grpc::Status st = stub->Join(&ctx, req, &resp);
  if (!st.ok()) return Status::permissionDenied("join refused: " + st.error_message());

  // 3. What came back is this node's, from this CA.
  auto info = pki::inspectCertificate(resp.certificate_pem(), &error);
  if (!info || info->common_name != o.node || !pki::verifyCertificate(resp.certificate_pem(), ca_pem, now, &error)) {
    return Status::dataLoss("the coordinator answered with a certificate that is not node " + o.node + "'s: " + error);
  }
  if (!pki::writeFile(o.pki_dir + "/" + pki::kNodeKey, *key, 0600, &error) ||
      !pki::writeFile(o.pki_dir + "/" + pki::kNodeCert, resp.certificate_pem(), 0644, &error)) {
    return Status::internal(error);
  }
  return Status::ok();
}

}  // namespace ddl::worker
