// The rendezvous store's wire format and data, without sockets: what the TcpStoreServer's loop thread does
// with the bytes a client sends (tcp_store.cpp gives the format and the handshake) and with the keys it holds.
// tcp_store_server.cpp's server runs every received byte through parseStoreFrame and every request through
// StoreData; the fuzz target tests/fuzz/store_protocol_fuzz.cpp drives the same two with arbitrary bytes.
//
// Threads: plain functions; a StoreData belongs to one thread (the server's loop).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ddl::store_wire {

constexpr uint8_t kSet = 1;
constexpr uint8_t kGet = 2;
constexpr uint8_t kAdd = 3;
constexpr uint8_t kCancel = 4;
constexpr uint8_t kHello = 5;  // the handshake (tcp_store.cpp)
constexpr uint8_t kProof = 6;
constexpr uint8_t kGetMany = 7;  // one round trip for many keys: the bootstrap's gather

constexpr uint8_t kOk = 0;
constexpr uint8_t kFailed = 1;
constexpr uint8_t kRefused = 2;  // the connection did not prove the job's secret; the server closes it
constexpr uint8_t kTimedOut = 3;  // a GETMANY's deadline passed first; the payload names a missing key

constexpr size_t kNonceBytes = 32;
constexpr size_t kRequestHeaderBytes = 13;
constexpr size_t kReplyHeaderBytes = 9;
constexpr uint32_t kMaxKeyBytes = 64 * 1024;
constexpr uint32_t kMaxValueBytes = 16 * 1024 * 1024;
// A GETMANY names at most this many keys in at most this many bytes (its key list), waits at most this long,
// and its answer carries at most kMaxManyReplyBytes. The TCP store's client asks for at most 4,096 keys at a
// time (tcp_store_client.cpp), so that the answers of a bootstrap of kMaxRanks (32,768) ranks with records of a
// few KiB stay well within it.
constexpr uint32_t kMaxManyKeys = 64 * 1024;
constexpr uint32_t kMaxManyRequestBytes = 1024 * 1024;
constexpr uint32_t kMaxManyWaitMs = 24 * 3600 * 1000;
constexpr uint32_t kMaxManyReplyBytes = 64 * 1024 * 1024;

// Where a connection stands in the handshake; it decides which frames it may send.
enum class Admission : uint8_t {
  kOpen,        // may send requests: the store has no secret, or the connection proved it
  kAwaitHello,  // new, on a store with a secret
  kAwaitProof,  // got the client's nonce and sent ours
  kClosing,     // refused: nothing it sends is read
};

struct Frame {
  uint8_t op = 0;
  uint32_t id = 0;
  std::string_view key;    // into the buffer given to parseStoreFrame
  std::string_view value;  // likewise
  size_t size = 0;         // header + key + value: the bytes to consume
};

enum class FrameVerdict : uint8_t {
  kNeedMore,   // not a whole frame yet (the header, if complete, is acceptable): read more
  kRequest,    // a SET, GET, ADD, CANCEL or GETMANY (its key list well formed) to apply; frame is whole
  kHandshake,  // a HELLO or PROOF that this connection may send now; frame is whole
  kRefuse,     // a request from a connection that has not proved the secret: refuse it (on the header alone;
               // frame's op and id are set, key and value are not)
  kDrop,       // not a libddl client, or a corrupt stream: close the connection
};

// Looks at the frame at the start of `in`. has_secret: the store has a job secret. Never reads past `in` and
// accepts no header whose lengths exceed the limits above, so a caller that buffers only until kNeedMore
// turns into something else holds at most one frame.
FrameVerdict parseStoreFrame(std::string_view in, Admission admission, bool has_secret, Frame* frame);

// A GETMANY's value: u32 wait_ms (how long the server may hold it: the client's deadline), u32 count, then count
// keys, each u32 length + bytes. Its key field is empty. The server answers kOk with every value once all keys
// exist (encodeValues), or kTimedOut naming a missing key when wait_ms passes first: the client learns which
// rank did not publish, and the server holds no request past its client's interest.
std::string encodeGetMany(uint32_t wait_ms, const std::vector<std::string>& keys);
// False when value is not a well-formed GETMANY list within the limits above (each key at most kMaxKeyBytes,
// nothing after the last). keys point into value.
bool decodeGetMany(std::string_view value, uint32_t* wait_ms, std::vector<std::string_view>* keys);
// The answer: u32 count, then count values, each u32 length + bytes; decodeValues is its inverse (false on
// anything malformed, e.g. a count other than `expected`).
std::string encodeValues(const std::vector<const std::string*>& values);
bool decodeValues(std::string_view payload, size_t expected, std::vector<std::string>* values);

// A u32 on the wire, in network byte order: appended to *s, or read from the 4 bytes at p.
void putU32(std::string* s, uint32_t v);
uint32_t getU32(const char* p);

// A key as messages show it: whole when short and printable, else its length.
std::string shownKey(std::string_view key);

// What the store may hold in all. A SET or ADD that would pass a limit fails with "rendezvous store full: ..."
// and changes nothing. Real jobs hold a few hundred bytes per rank (UCX worker addresses, host names, counters).
struct StoreLimits {
  size_t max_keys = 256 * 1024;
  size_t max_total_bytes = 64 * 1024 * 1024;  // keys and values
  size_t max_value_bytes = kMaxValueBytes;
};

// The store's keys and values, with the limits. Errors are the messages the client gets (kFailed).
class StoreData {
 public:
  explicit StoreData(const StoreLimits& limits = {}) : limits_(limits) {}

  // Sets key to value (overwrites). Returns "" on success.
  std::string set(std::string_view key, std::string_view value);
  // Adds delta to the decimal integer at key (missing: 0), stores and returns it in *result. Returns "" on
  // success.
  std::string add(std::string_view key, int64_t delta, int64_t* result);
  // nullptr when the key is not set.
  const std::string* find(const std::string& key) const;

  size_t keys() const { return data_.size(); }
  size_t totalBytes() const { return total_bytes_; }

 private:
  // "" when replacing `old_bytes` of key's value (nullptr: a new key) with new_bytes stays within the limits.
  std::string checkRoom(std::string_view key, const std::string* old, size_t new_bytes) const;

  const StoreLimits limits_;
  std::unordered_map<std::string, std::string> data_;
  size_t total_bytes_ = 0;  // sum of the sizes of keys and values
};

}  // namespace ddl::store_wire
