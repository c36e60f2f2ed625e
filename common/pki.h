// pki: the cluster's certificates and tokens, over OpenSSL's libcrypto (which gRPC links already).
//
// ddl's PKI is small on purpose: one cluster CA (EC P-256, self-signed) signs
//  - the coordinator's server certificate, which carries the DNS name "ddl-coordinator" (kCoordinatorName)
//    besides any names and addresses the operator adds; clients check that name, whatever address they dial
//    (as Consul checks "server.<dc>.consul"), so a coordinator can move or sit behind several addresses;
//  - one client certificate per node: CN and DNS SAN are the node's name, which the coordinator takes as the
//    agent's identity (an agent can only speak for the node its certificate names).
// Users do not hold certificates: they hold bearer tokens, random strings of which the coordinator keeps only
// the SHA-256 (users.h). Keys never leave the machine that made them, except when an admin asks the
// coordinator to issue a node's certificate and key in one go (ddlctl admin issue-node).
//
// Errors are sentences in *error, naming the file or the part that failed; functions return nullopt/false.
// Threads: pure functions over their arguments (OpenSSL 3 is thread-safe for these calls).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ddl::pki {

// The DNS name every coordinator certificate carries and every client checks.
inline constexpr const char* kCoordinatorName = "ddl-coordinator";

// Files in a PKI directory (ddl-coordinator init-pki DIR; /etc/ddl/pki on a real cluster).
inline constexpr const char* kCaCert = "ca.crt";
inline constexpr const char* kCaKey = "ca.key";
inline constexpr const char* kCoordinatorCert = "coordinator.crt";
inline constexpr const char* kCoordinatorKey = "coordinator.key";
inline constexpr const char* kNodeCert = "node.crt";
inline constexpr const char* kNodeKey = "node.key";
inline constexpr const char* kUsersFile = "users.json";
inline constexpr const char* kAdminToken = "admin.token";

enum class Usage { kCa, kServer, kClient };

struct Subject {
  std::string common_name;
  std::vector<std::string> dns_names;     // subjectAltName DNS entries
  std::vector<std::string> ip_addresses;  // subjectAltName IP entries ("127.0.0.1", "::1")
  Usage usage = Usage::kClient;
};

struct CertInfo {
  std::string common_name;
  std::vector<std::string> dns_names;
  std::string issuer_common_name;
  int64_t not_before_s = 0;  // unix seconds
  int64_t not_after_s = 0;
  std::string sha256;  // of the DER encoding, hex: what `openssl x509 -fingerprint -sha256` prints, unseparated
};

// SHA-256 of `data`, 64 lowercase hex digits.
std::string sha256Hex(std::string_view data);
// `bytes` bytes from the system's random source as hex; "" if it fails.
std::string randomHex(size_t bytes);
// Equal without leaking where they differ (CRYPTO_memcmp); false for different lengths.
bool constantTimeEqual(std::string_view a, std::string_view b);

// A new EC P-256 private key, PEM (PKCS#8).
std::optional<std::string> newPrivateKey(std::string* error);
// A PKCS#10 request for `common_name`, signed by key_pem.
std::optional<std::string> makeCsr(const std::string& key_pem, const std::string& common_name, std::string* error);
// The common name of a request whose signature checks out; nullopt (with the reason) otherwise.
std::optional<std::string> csrCommonName(const std::string& csr_pem, std::string* error);

// A certificate for `subject` whose public key is taken from `public_key_source` (a private key PEM or a
// CSR PEM), valid from not_before_s to not_after_s (unix seconds), signed by the CA (ca_cert_pem, ca_key_pem);
// with both CA arguments empty it is self-signed by the key in public_key_source (which must then be a
// private key).
std::optional<std::string> makeCertificate(const Subject& subject, const std::string& public_key_source,
                                           const std::string& ca_cert_pem, const std::string& ca_key_pem,
                                           int64_t not_before_s, int64_t not_after_s, std::string* error);

std::optional<CertInfo> inspectCertificate(const std::string& cert_pem, std::string* error);
// Whether cert_pem was signed by ca_cert_pem's key and is within its validity at `now_s`; the reason if not.
bool verifyCertificate(const std::string& cert_pem, const std::string& ca_cert_pem, int64_t now_s,
                       std::string* error);

// Whole-file helpers. writeFile writes a temporary file with `mode` in the same directory and renames it over
// `path`, so a reader (gRPC's file watcher) sees the old file or the new one, never half of one.
std::optional<std::string> readFile(const std::string& path, std::string* error);
// The temporary file has a random name and is created exclusively, never through a symlink.
bool writeFile(const std::string& path, std::string_view content, unsigned mode, std::string* error);
// A directory for keys: created 0700, or an existing one that is the caller's and writable by nobody else.
bool makePrivateDir(const std::string& dir, std::string* error);

// A node name as the PKI accepts it: 1..63 of [A-Za-z0-9._-], not starting with '-' or '.', not ending with
// '.', and not kCoordinatorName in any case. "" if fine, else why not.
std::string checkNodeName(std::string_view name);

}  // namespace ddl::pki
