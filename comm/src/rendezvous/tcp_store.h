// What the TCP store's two ends share (the server: tcp_store_server.cpp; the client: tcp_store_client.cpp):
// the i64 of ADD, the request frame, the handshake's nonces and proofs, and the socket helpers both use.
// The wire format and the handshake are described at the top of tcp_store.cpp, which defines these.
//
// Threads: plain functions.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rendezvous/store_protocol.h"

namespace ddl::store_wire {

constexpr size_t kMacBytes = 32;  // SHA-256
static_assert(kNonceBytes == kMacBytes, "kHello and kProof frames have one value length");
constexpr std::string_view kClientLabel = "ddl-store client v1";
constexpr std::string_view kServerLabel = "ddl-store server v1";
constexpr size_t kRecvChunkBytes = 64 * 1024;  // what one recv() of either end takes at most

using Nonce = std::array<unsigned char, kNonceBytes>;
using Mac = std::array<unsigned char, kMacBytes>;

template <size_t N>
std::string_view bytesOf(const std::array<unsigned char, N>& a) {
  return {reinterpret_cast<const char*>(a.data()), a.size()};
}

// strerror_r's message for err.
std::string errnoString(int err);
// Milliseconds for poll(): never negative, never past INT_MAX.
int pollMs(int64_t ms);
// An i64 on the wire: two u32 (putU32, store_protocol.h), the high one first.
std::string encodeI64(int64_t v);
int64_t decodeI64(const char* p);

// kNonceBytes from libcrypto's random generator; throws ddlSystemError when it has none.
Nonce freshNonce();
// HMAC-SHA256(secret, label | client | server): one side's proof that it holds the secret.
Mac handshakeMac(const std::string& secret, std::string_view label, const Nonce& client, const Nonce& server);
// Throws ddlInvalidArgument for a secret longer than kMaxJobSecretBytes (store.h).
void checkSecretSize(const std::string& secret);
// Constant time: how much of a proof matched must not show in how long the check took.
bool sameMac(const Mac& expected, std::string_view got);
// A request: u8 op, u32 id, u32 key_len, u32 value_len, key, value.
std::string requestFrame(uint8_t op, uint32_t id, std::string_view key, std::string_view value);

}  // namespace ddl::store_wire
