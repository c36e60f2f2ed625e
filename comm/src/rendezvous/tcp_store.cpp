// TcpStore: the rendezvous store of a real job. Rank 0 runs a TcpStoreServer on the DDL_ROOT port
// (tcp_store_server.cpp); every rank (rank 0 too) connects a TcpStore client to it (tcp_store_client.cpp),
// publishes its UCX worker address with set() and reads the others' with get(), which the server answers only
// once the key exists. This file is the protocol the two share: the format and the handshake described here,
// and the pieces of them both ends use (tcp_store.h). Plain POSIX sockets and poll(), and
// libcrypto (OpenSSL) for the handshake's HMAC-SHA256, random nonces and constant-time compare: libddl links
// UCX, libcrypto and the C/C++ runtime, nothing else (libcrypto's symbols are versioned, so it does not clash
// with a framework that loads another OpenSSL).
//
// Wire format (all integers in network byte order). Every request carries an id that its reply echoes, so one
// connection can carry several requests at once and replies may come back out of order:
//   request: u8 op, u32 id, u32 key_len, u32 value_len, key bytes, value bytes
//     kSet    value = the new value                  reply: empty
//     kGet    no value; the reply waits for the key  reply: the value
//     kAdd    value = i64 delta                      reply: i64 new value (stored as a decimal string)
//     kCancel no value; id = a GET or GETMANY the client gave up on (its deadline passed); no reply
//     kGetMany no key; value = wait_ms and a key list (store_protocol.h)
//             reply: every value (encodeValues) once all keys exist, or kTimedOut when wait_ms passes first
//             (payload u32 missing-key count, then the first missing key)
//     kHello, kProof: the handshake below, and only before it is done
//   reply:   u8 status (kOk, kFailed, kRefused, kTimedOut), u32 id, u32 length, payload (kFailed: a message for users)
// Keys are at most kMaxKeyBytes and values kMaxValueBytes; the server checks the lengths in the header before
// buffering a body, and drops a client that sends a malformed frame, so garbage on the port cannot make it
// allocate without bound or disturb the other clients. What the store holds in all is bounded too (StoreLimits in
// store_protocol.h: keys, total bytes): a SET or ADD past it is answered kFailed ("rendezvous store full: ...")
// and the server goes on. The parsing and the data live in store_protocol.{h,cpp}, pure code over bytes that a
// fuzz target drives as well. The server listens on exactly the address DDL_ROOT names, not on every interface.
//
// Admission. When the job has a secret (DDL_JOB_SECRET), a connection proves it before its first request and
// the server proves it back, so a rank also tells rank 0's store from a stray process that took the port
// first. Both sides contribute a fresh nonce, so nothing seen on the wire can be replayed, and the secret
// itself never crosses it (frames as above, key_len 0, id 0; Nc, Ns: 32 random bytes each):
//   client -> server  kHello  value   Nc
//   server -> client  kOk     payload Ns
//   client -> server  kProof  value   HMAC-SHA256(secret, "ddl-store client v1" | Nc | Ns)
//   server -> client  kOk     payload HMAC-SHA256(secret, "ddl-store server v1" | Nc | Ns), or kRefused
// The client proves first, so a rank with a wrong secret is told so rather than blaming the server, and the
// server's proof goes only to a client that proved itself; the labels keep one side's proof from serving as
// the other's. MACs are compared in constant time. Until a connection has proved the secret it may send
// nothing but the handshake: a request (a rank without the secret) is answered kRefused, anything else closes
// it, and so does the handshake deadline (TcpStoreHandshakeLimits). At most max_pending connections are in
// the handshake at once, the oldest making way for a new one, so strangers on the port can neither exhaust
// the server nor keep a rank out (a rank whose connection closes mid-handshake connects again). A refused
// connection gets its reply, then the server shuts its side down and discards input until the peer closes
// (closing with unread input would reset the connection and could lose the reply). What follows the handshake
// is neither encrypted nor authenticated frame by frame: the store keeps out strangers on the port, not a tap
// on the network path. Without a secret the store is open to anyone who can connect, as before; a client with
// a secret refuses such a store (it cannot prove the secret), and a server with one refuses clients without.
#include "rendezvous/tcp_store.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "error.h"
#include "rendezvous/store.h"

namespace ddl::store_wire {

std::string errnoString(int err) {
  char buf[256];
  // strerror_r is the GNU variant (returns the message) or the XSI one (fills buf); accept either.
  struct Pick {
    static const char* of(const char* gnu, const char*) { return gnu; }
    static const char* of(int xsi, const char* b) { return xsi == 0 ? b : "unknown error"; }
  };
  return Pick::of(strerror_r(err, buf, sizeof buf), buf);
}

int pollMs(int64_t ms) { return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX)); }

std::string encodeI64(int64_t v) {
  std::string s;
  uint64_t u = static_cast<uint64_t>(v);
  putU32(&s, static_cast<uint32_t>(u >> 32));
  putU32(&s, static_cast<uint32_t>(u));
  return s;
}
int64_t decodeI64(const char* p) {
  return static_cast<int64_t>((static_cast<uint64_t>(getU32(p)) << 32) | getU32(p + 4));
}

Nonce freshNonce() {
  Nonce n;
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    fail(ddlSystemError, "libcrypto could not produce random bytes for the rendezvous store's handshake");
  }
  return n;
}

Mac handshakeMac(const std::string& secret, std::string_view label, const Nonce& client,
                 const Nonce& server) {
  std::string msg(label);
  msg.append(bytesOf(client));
  msg.append(bytesOf(server));
  Mac mac;
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac.data(), &len) == nullptr ||
      len != mac.size()) {
    fail(ddlSystemError, "libcrypto's HMAC-SHA256 failed in the rendezvous store's handshake");
  }
  return mac;
}

void checkSecretSize(const std::string& secret) {
  if (secret.size() > kMaxJobSecretBytes) {
    fail(ddlInvalidArgument, "the job's secret is " + std::to_string(secret.size()) +
                                 " bytes long; the rendezvous store takes at most " +
                                 std::to_string(kMaxJobSecretBytes) + " (check DDL_JOB_SECRET)");
  }
}

bool sameMac(const Mac& expected, std::string_view got) {
  return got.size() == expected.size() && CRYPTO_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

std::string requestFrame(uint8_t op, uint32_t id, std::string_view key, std::string_view value) {
  std::string frame;
  frame.reserve(kRequestHeaderBytes + key.size() + value.size());
  frame.push_back(static_cast<char>(op));
  putU32(&frame, id);
  putU32(&frame, static_cast<uint32_t>(key.size()));
  putU32(&frame, static_cast<uint32_t>(value.size()));
  frame.append(key);
  frame.append(value);
  return frame;
}

}  // namespace ddl::store_wire
