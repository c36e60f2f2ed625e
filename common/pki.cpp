#include "common/pki.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>

namespace ddl::pki {

namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Req = std::unique_ptr<X509_REQ, Deleter<X509_REQ, X509_REQ_free>>;
using Ext = std::unique_ptr<X509_EXTENSION, Deleter<X509_EXTENSION, X509_EXTENSION_free>>;
using Names = std::unique_ptr<GENERAL_NAMES, Deleter<GENERAL_NAMES, GENERAL_NAMES_free>>;
using Bn = std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>>;

// OpenSSL's own reason for the last failure, appended to `what`.
bool fail(std::string* error, const std::string& what) {
  const unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (error) {
    *error = what;
    if (code != 0) {
      char buf[256];
      ERR_error_string_n(code, buf, sizeof(buf));
      *error += " (" + std::string(buf) + ")";
    }
  }
  return false;
}

Bio memBio(const std::string& text) { return Bio(BIO_new_mem_buf(text.data(), static_cast<int>(text.size()))); }

std::string drain(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string();
}

Key readKey(const std::string& pem) {
  Bio bio = memBio(pem);
  return Key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

Cert readCert(const std::string& pem) {
  Bio bio = memBio(pem);
  return Cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

Req readReq(const std::string& pem) {
  Bio bio = memBio(pem);
  return Req(bio ? PEM_read_bio_X509_REQ(bio.get(), nullptr, nullptr, nullptr) : nullptr);
}

std::string commonNameOf(const X509_NAME* name) {
  const int at = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  if (at < 0) return "";
  const ASN1_STRING* value = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, at));
  unsigned char* utf8 = nullptr;
  const int n = ASN1_STRING_to_UTF8(&utf8, value);
  if (n < 0) return "";
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(n));
  OPENSSL_free(utf8);
  return out;
}

int64_t unixSeconds(const ASN1_TIME* t) {
  struct tm tm {};
  if (ASN1_TIME_to_tm(t, &tm) != 1) return 0;
  return static_cast<int64_t>(timegm(&tm));
}

bool addExtension(X509* cert, X509V3_CTX* ctx, int nid, const std::string& value, std::string* error) {
  Ext ext(X509V3_EXT_conf_nid(nullptr, ctx, nid, value.c_str()));
  if (!ext || X509_add_ext(cert, ext.get(), -1) != 1) {
    return fail(error, "cannot add certificate extension " + std::string(OBJ_nid2sn(nid)) + "=" + value);
  }
  return true;
}

bool isIpAddress(const std::string& text) {
  unsigned char buf[16];
  return inet_pton(AF_INET, text.c_str(), buf) == 1 || inet_pton(AF_INET6, text.c_str(), buf) == 1;
}

std::string toHex(const unsigned char* bytes, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += hex[bytes[i] >> 4];
    out += hex[bytes[i] & 15];
  }
  return out;
}

}  // namespace

std::string sha256Hex(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &n, EVP_sha256(), nullptr) != 1) return "";
  return toHex(digest, n);
}

std::string randomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(bytes)) != 1) return "";
  return toHex(reinterpret_cast<const unsigned char*>(raw.data()), bytes);
}

bool constantTimeEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::optional<std::string> newPrivateKey(std::string* error) {
  Key key(EVP_EC_gen("P-256"));
  if (!key) return fail(error, "cannot make an EC P-256 key"), std::nullopt;
  Bio out(BIO_new(BIO_s_mem()));
  if (!out || PEM_write_bio_PrivateKey(out.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return fail(error, "cannot encode the private key"), std::nullopt;
  }
  return drain(out.get());
}

std::optional<std::string> makeCsr(const std::string& key_pem, const std::string& common_name, std::string* error) {
  Key key = readKey(key_pem);
  if (!key) return fail(error, "not a PEM private key"), std::nullopt;
  Req req(X509_REQ_new());
  X509_NAME* name = X509_REQ_get_subject_name(req.get());
  if (X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(common_name.c_str()), -1, -1, 0) != 1 ||
      X509_REQ_set_pubkey(req.get(), key.get()) != 1 || X509_REQ_sign(req.get(), key.get(), EVP_sha256()) <= 0) {
    return fail(error, "cannot make a certificate request for " + common_name), std::nullopt;
  }
  Bio out(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509_REQ(out.get(), req.get()) != 1) return fail(error, "cannot encode the request"), std::nullopt;
  return drain(out.get());
}

std::optional<std::string> csrCommonName(const std::string& csr_pem, std::string* error) {
  Req req = readReq(csr_pem);
  if (!req) return fail(error, "not a PEM certificate request (PKCS#10)"), std::nullopt;
  EVP_PKEY* key = X509_REQ_get0_pubkey(req.get());
  if (!key || X509_REQ_verify(req.get(), key) != 1) {
    return fail(error, "the certificate request's signature does not check out"), std::nullopt;
  }
  return commonNameOf(X509_REQ_get_subject_name(req.get()));
}

std::optional<std::string> makeCertificate(const Subject& subject, const std::string& public_key_source,
                                           const std::string& ca_cert_pem, const std::string& ca_key_pem,
                                           int64_t not_before_s, int64_t not_after_s, std::string* error) {
  if (not_after_s <= not_before_s) {
    if (error) *error = "a certificate's end of validity must come after its start";
    return std::nullopt;
  }
  // The subject's public key: from a private key, or from a request whose signature checks out.
  Key subject_key;
  Req req;
  if (public_key_source.find("REQUEST-----") != std::string::npos) {
    if (!csrCommonName(public_key_source, error)) return std::nullopt;
    req = readReq(public_key_source);
  } else {
    subject_key = readKey(public_key_source);
    if (!subject_key) return fail(error, "not a PEM private key or certificate request"), std::nullopt;
  }
  EVP_PKEY* public_key = req ? X509_REQ_get0_pubkey(req.get()) : subject_key.get();

  const bool self_signed = ca_cert_pem.empty() && ca_key_pem.empty();
  Cert ca_cert;
  Key ca_key;
  if (self_signed) {
    if (!subject_key) {
      if (error) *error = "a self-signed certificate needs the private key, not a request";
      return std::nullopt;
    }
  } else {
    ca_cert = readCert(ca_cert_pem);
    ca_key = readKey(ca_key_pem);
    if (!ca_cert || !ca_key) return fail(error, "the CA certificate or key is not valid PEM"), std::nullopt;
    if (X509_check_private_key(ca_cert.get(), ca_key.get()) != 1) {
      return fail(error, "the CA key does not belong to the CA certificate"), std::nullopt;
    }
  }

  Cert cert(X509_new());
  Bn serial(BN_new());
  if (!cert || !serial || X509_set_version(cert.get(), 2) != 1 || BN_rand(serial.get(), 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())) ||
      !ASN1_TIME_set(X509_getm_notBefore(cert.get()), static_cast<time_t>(not_before_s)) ||
      !ASN1_TIME_set(X509_getm_notAfter(cert.get()), static_cast<time_t>(not_after_s)) ||
      X509_set_pubkey(cert.get(), public_key) != 1) {
    return fail(error, "cannot fill in the certificate for " + subject.common_name), std::nullopt;
  }
  X509_NAME* name = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(name, "O", MBSTRING_UTF8, reinterpret_cast<const unsigned char*>("ddl"), -1, -1,
                                 0) != 1 ||
      X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(subject.common_name.c_str()), -1, -1, 0) != 1) {
    return fail(error, "bad common name '" + subject.common_name + "'"), std::nullopt;
  }
  X509* issuer = self_signed ? cert.get() : ca_cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(issuer)) != 1) {
    return fail(error, "cannot set the issuer"), std::nullopt;
  }

  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert.get(), nullptr, nullptr, 0);
  const bool ca = subject.usage == Usage::kCa;
  if (!addExtension(cert.get(), &ctx, NID_basic_constraints, ca ? "critical,CA:TRUE,pathlen:0" : "critical,CA:FALSE",
                    error) ||
      !addExtension(cert.get(), &ctx, NID_key_usage,
                    ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature,keyAgreement", error) ||
      !addExtension(cert.get(), &ctx, NID_subject_key_identifier, "hash", error)) {
    return std::nullopt;
  }
  if (!ca) {
    if (!addExtension(cert.get(), &ctx, NID_ext_key_usage,
                      subject.usage == Usage::kServer ? "serverAuth" : "clientAuth", error) ||
        !addExtension(cert.get(), &ctx, NID_authority_key_identifier, "keyid:always", error)) {
      return std::nullopt;
    }
    std::string san;
    for (const auto& dns : subject.dns_names) san += (san.empty() ? "DNS:" : ",DNS:") + dns;
    for (const auto& ip : subject.ip_addresses) {
      if (!isIpAddress(ip)) {
        if (error) *error = "'" + ip + "' is not an IP address";
        return std::nullopt;
      }
      san += (san.empty() ? "IP:" : ",IP:") + ip;
    }
    if (!san.empty() && !addExtension(cert.get(), &ctx, NID_subject_alt_name, san, error)) return std::nullopt;
  }
  EVP_PKEY* signer = self_signed ? subject_key.get() : ca_key.get();
  if (X509_sign(cert.get(), signer, EVP_sha256()) <= 0) {
    return fail(error, "cannot sign the certificate for " + subject.common_name), std::nullopt;
  }
  Bio out(BIO_new(BIO_s_mem()));
  if (PEM_write_bio_X509(out.get(), cert.get()) != 1) return fail(error, "cannot encode the certificate"), std::nullopt;
  return drain(out.get());
}

std::optional<CertInfo> inspectCertificate(const std::string& cert_pem, std::string* error) {
  Cert cert = readCert(cert_pem);
  if (!cert) return fail(error, "not a PEM certificate"), std::nullopt;
  CertInfo info;
  info.common_name = commonNameOf(X509_get_subject_name(cert.get()));
  info.issuer_common_name = commonNameOf(X509_get_issuer_name(cert.get()));
  info.not_before_s = unixSeconds(X509_get0_notBefore(cert.get()));
  info.not_after_s = unixSeconds(X509_get0_notAfter(cert.get()));
  Names names(static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert.get(), NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; names && i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names.get(), i);
    if (n->type == GEN_DNS) {
      const ASN1_IA5STRING* s = n->d.dNSName;
      info.dns_names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(s)),
                                  static_cast<size_t>(ASN1_STRING_length(s)));
    }
  }
  unsigned char* der = nullptr;
  const int n = i2d_X509(cert.get(), &der);
  if (n > 0) {
    info.sha256 = sha256Hex(std::string_view(reinterpret_cast<char*>(der), static_cast<size_t>(n)));
    OPENSSL_free(der);
  }
  return info;
}

bool verifyCertificate(const std::string& cert_pem, const std::string& ca_cert_pem, int64_t now_s,
                       std::string* error) {
  Cert cert = readCert(cert_pem), ca = readCert(ca_cert_pem);
  if (!cert || !ca) return fail(error, "not a PEM certificate");
  EVP_PKEY* ca_key = X509_get0_pubkey(ca.get());
  if (!ca_key || X509_verify(cert.get(), ca_key) != 1) return fail(error, "not signed by this CA");
  if (unixSeconds(X509_get0_notBefore(cert.get())) > now_s) return fail(error, "not valid yet");
  if (unixSeconds(X509_get0_notAfter(cert.get())) < now_s) return fail(error, "expired");
  return true;
}

std::optional<std::string> readFile(const std::string& path, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (error) *error = "cannot read " + path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool writeFile(const std::string& path, std::string_view content, unsigned mode, std::string* error) {
  // A fresh name, created exclusively and never through a symlink: in a directory others can write to, a name
  // they prepared (a link to /etc/shadow, a file they hold open) must not receive a key.
  const std::string tmp = path + ".tmp." + randomHex(8);
  auto failed = [&](const std::string& what) {
    if (error) *error = "cannot " + what + " " + tmp + ": " + std::strerror(errno);
    ::unlink(tmp.c_str());
    return false;
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    if (error) *error = "cannot create " + tmp + ": " + std::strerror(errno);
    return false;
  }
  if (::fchmod(fd, mode) != 0) {  // O_CREAT's mode is masked by the umask
    ::close(fd);
    return failed("set the mode of");
  }
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return failed("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) return failed("write");
  if (::rename(tmp.c_str(), path.c_str()) != 0) return failed("rename");
  return true;
}

bool makePrivateDir(const std::string& dir, std::string* error) {
  if (::mkdir(dir.c_str(), 0700) == 0) return true;
  if (errno != EEXIST) {
    if (error) *error = "cannot create " + dir + ": " + std::strerror(errno);
    return false;
  }
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    if (error) *error = dir + " exists and is not a directory";
    return false;
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 022) != 0) {
    if (error) {
      *error = dir + " belongs to another user or others may write to it: give a directory of your own for keys";
    }
    return false;
  }
  return true;
}

std::string checkNodeName(std::string_view name) {
  if (name.empty() || name.size() > 63) return "a node name has 1 to 63 characters";
  if (name.front() == '-' || name.front() == '.') return "a node name cannot start with '-' or '.'";
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_') {
      return "node name '" + std::string(name) + "' has a character other than letters, digits, '.', '-', '_'";
    }
  }
  // Host names compare without case and with an optional final dot: none of those may be the coordinator's.
  std::string lower(name);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.back() == '.') return "a node name cannot end with '.'";
  if (lower == kCoordinatorName) return "'" + std::string(name) + "' is the coordinator's name";
  return "";
}

}  // namespace ddl::pki
