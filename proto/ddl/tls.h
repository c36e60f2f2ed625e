// tls: how every gRPC link of ddl is secured, in one place for the coordinator, ddl-agent and ddlctl.
//
//  - The coordinator serves TLS with its certificate from the cluster CA and asks every client for a
//    certificate (GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY): agents present their node certificate, which
//    must verify against the CA; ddlctl presents none and authenticates each call with a bearer token instead.
//    A certificate from another CA, or an expired one, fails the handshake.
//  - Clients verify the coordinator's certificate against the CA and check that it names kCoordinatorName
//    ("ddl-coordinator"), whatever address they dial.
//  - Certificates and keys are read from files and re-read every refresh interval (gRPC's
//    FileWatcherCertificateProvider), so a rotated certificate is used for new connections without a restart;
//    connections already open (an agent's stream, and so its running jobs) are not disturbed.
//  - Plaintext is for loopback addresses only, with an explicit --insecure (checkInsecure).
//
// Threads: pure functions; the credentials they return may be shared by any threads.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

namespace ddl::tls {

// The files one party uses. cert and key are empty for a client without a certificate (ddlctl).
struct Files {
  std::string ca;
  std::string cert;
  std::string key;
};

// How often the files are re-read (seconds). gRPC's minimum is 1.
inline constexpr unsigned kDefaultRefreshS = 60;

// "" when the files exist, parse, belong together and are signed by the CA; otherwise the reason, naming the
// file and saying how to make one (`hint`, e.g. "run 'ddl-coordinator init-pki /etc/ddl/pki'").
std::string checkFiles(const Files& files, const std::string& hint);

std::shared_ptr<grpc::ServerCredentials> serverCredentials(const Files& files, unsigned refresh_s = kDefaultRefreshS);
std::shared_ptr<grpc::ChannelCredentials> channelCredentials(const Files& files,
                                                             unsigned refresh_s = kDefaultRefreshS);
// What a TLS client's channel needs besides its credentials: the name to check in the coordinator's
// certificate. Adds to `args`.
void addChannelArgs(grpc::ChannelArguments* args);

// "" when plaintext may be used on `host_port`: only with --insecure and only on a loopback address
// (ddl::isLoopback, common/host_port.h).
// `who` names the program in the message ("ddl-coordinator", "ddl-agent", "ddlctl").
std::string checkInsecure(const std::string& host_port, const std::string& who);

// The bearer token of a call's metadata ("authorization: Bearer TOKEN"), or "".
std::string bearerToken(const grpc::ServerContextBase& context);
// The node name a verified client certificate proves (its CN; the first DNS SAN if it has no CN), or "".
std::string peerCertificateName(const grpc::ServerContextBase& context);

}  // namespace ddl::tls
