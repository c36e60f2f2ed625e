// The rendezvous store's frames and data without sockets (store_protocol.h): parseStoreFrame, the GETMANY
// encodings, and StoreData's bounded keys and values.
#include "rendezvous/store_protocol.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>

namespace ddl::store_wire {

uint32_t getU32(const char* p) {
  uint32_t n;
  std::memcpy(&n, p, 4);
  return ntohl(n);
}

void putU32(std::string* s, uint32_t v) {
  uint32_t n = htonl(v);
  s->append(reinterpret_cast<const char*>(&n), 4);
}

namespace {

// Reads a u32 length and that many bytes from the front of *in; false when *in is too short.
bool takeBytes(std::string_view* in, std::string_view* out) {
  if (in->size() < 4) return false;
  const uint32_t len = getU32(in->data());
  if (in->size() - 4 < len) return false;
  *out = in->substr(4, len);
  in->remove_prefix(4 + size_t{len});
  return true;
}

std::string sizeText(size_t bytes) {
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " bytes";
}

}  // namespace

std::string shownKey(std::string_view key) {
  bool printable = key.size() <= 128;
  for (char c : key) printable = printable && c >= 0x20 && c < 0x7f;
  return printable ? "'" + std::string(key) + "'" : "of " + std::to_string(key.size()) + " bytes";
}

FrameVerdict parseStoreFrame(std::string_view in, Admission admission, bool has_secret, Frame* frame) {
  if (in.size() < kRequestHeaderBytes) return FrameVerdict::kNeedMore;
  const char* p = in.data();
  const uint8_t op = static_cast<uint8_t>(p[0]);
  const uint32_t id = getU32(p + 1);
  const uint32_t key_len = getU32(p + 5);
  const uint32_t value_len = getU32(p + 9);
  frame->op = op;
  frame->id = id;
  frame->key = {};
  frame->value = {};
  frame->size = 0;
  const bool request = (key_len <= kMaxKeyBytes && ((op == kSet && value_len <= kMaxValueBytes) ||
                                                    ((op == kGet || op == kCancel) && value_len == 0) ||
                                                    (op == kAdd && value_len == 8))) ||
                       (op == kGetMany && key_len == 0 && value_len >= 8 && value_len <= kMaxManyRequestBytes);
  const bool handshake = (op == kHello || op == kProof) && key_len == 0 && value_len == kNonceBytes;
  // A client without the job's secret: refuse it on the header alone (its body is not worth buffering).
  if (request && admission == Admission::kAwaitHello) return FrameVerdict::kRefuse;
  bool expected = false;
  switch (admission) {
    case Admission::kOpen:
      expected = request || (handshake && op == kHello && !has_secret);
      break;
    case Admission::kAwaitHello:
      expected = handshake && op == kHello;
      break;
    case Admission::kAwaitProof:
      expected = handshake && op == kProof;
      break;
    case Admission::kClosing:
      expected = false;
      break;
  }
  if (!expected) return FrameVerdict::kDrop;
  // Both lengths are bounded above, so the sum cannot overflow.
  const size_t total = kRequestHeaderBytes + size_t{key_len} + size_t{value_len};
  if (in.size() < total) return FrameVerdict::kNeedMore;
  frame->key = in.substr(kRequestHeaderBytes, key_len);
  frame->value = in.substr(kRequestHeaderBytes + key_len, value_len);
  frame->size = total;
  if (op == kGetMany) {
    // Checked whole here, so the server's loop applies only well-formed lists; a malformed one is a corrupt
    // stream like any other.
    uint32_t wait_ms = 0;
    std::vector<std::string_view> keys;
    if (!decodeGetMany(frame->value, &wait_ms, &keys)) return FrameVerdict::kDrop;
  }
  return handshake ? FrameVerdict::kHandshake : FrameVerdict::kRequest;
}

std::string encodeGetMany(uint32_t wait_ms, const std::vector<std::string>& keys) {
  std::string out;
  putU32(&out, wait_ms);
  putU32(&out, static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) {
    putU32(&out, static_cast<uint32_t>(k.size()));
    out.append(k);
  }
  return out;
}

bool decodeGetMany(std::string_view value, uint32_t* wait_ms, std::vector<std::string_view>* keys) {
  keys->clear();
  if (value.size() < 8 || value.size() > kMaxManyRequestBytes) return false;
  *wait_ms = getU32(value.data());
  const uint32_t count = getU32(value.data() + 4);
  // Every key takes at least its 4-byte length, so count is checked against the bytes before reserving.
  if (*wait_ms > kMaxManyWaitMs || count == 0 || count > kMaxManyKeys || count > (value.size() - 8) / 4) {
    return false;
  }
  value.remove_prefix(8);
  keys->reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    std::string_view key;
    if (!takeBytes(&value, &key) || key.size() > kMaxKeyBytes) return false;
    keys->push_back(key);
  }
  return value.empty();
}

std::string encodeValues(const std::vector<const std::string*>& values) {
  size_t total = 4;
  for (const std::string* v : values) total += 4 + v->size();
  std::string out;
  out.reserve(total);
  putU32(&out, static_cast<uint32_t>(values.size()));
  for (const std::string* v : values) {
    putU32(&out, static_cast<uint32_t>(v->size()));
    out.append(*v);
  }
  return out;
}

bool decodeValues(std::string_view payload, size_t expected, std::vector<std::string>* values) {
  values->clear();
  if (payload.size() < 4 || getU32(payload.data()) != expected || expected > (payload.size() - 4) / 4) {
    return false;
  }
  payload.remove_prefix(4);
  values->reserve(expected);
  for (size_t i = 0; i < expected; ++i) {
    std::string_view v;
    if (!takeBytes(&payload, &v)) return false;
    values->emplace_back(v);
  }
  return payload.empty();
}

std::string StoreData::checkRoom(std::string_view key, const std::string* old, size_t new_bytes) const {
  if (new_bytes > limits_.max_value_bytes) {
    return "rendezvous store full: a value of " + std::to_string(new_bytes) + " bytes for key " + shownKey(key) +
           " is larger than the store's limit of " + sizeText(limits_.max_value_bytes) + " per value";
  }
  if (old == nullptr && data_.size() >= limits_.max_keys) {
    return "rendezvous store full: it holds " + std::to_string(data_.size()) + " keys, its limit; key " +
           shownKey(key) + " was not stored (a job publishing keys without end?)";
  }
  const size_t freed = old ? old->size() : 0;
  const size_t added = (old ? 0 : key.size()) + new_bytes;
  if (total_bytes_ - freed + added > limits_.max_total_bytes) {
    return "rendezvous store full: storing " + std::to_string(new_bytes) + " bytes at key " + shownKey(key) +
           " would pass its limit of " + sizeText(limits_.max_total_bytes) + " in all (it holds " +
           std::to_string(total_bytes_) + " bytes in " + std::to_string(data_.size()) + " keys)";
  }
  return "";
}

std::string StoreData::set(std::string_view key, std::string_view value) {
  std::string k(key);
  auto it = data_.find(k);
  const std::string* old = it == data_.end() ? nullptr : &it->second;
  if (std::string error = checkRoom(key, old, value.size()); !error.empty()) return error;
  if (old) {
    total_bytes_ -= old->size();
    it->second.assign(value.data(), value.size());
  } else {
    total_bytes_ += k.size();
    data_.emplace(std::move(k), std::string(value));
  }
  total_bytes_ += value.size();
  return "";
}

std::string StoreData::add(std::string_view key, int64_t delta, int64_t* result) {
  std::string k(key);
  auto it = data_.find(k);
  int64_t current = 0;
  if (it != data_.end() && !it->second.empty()) {
    const std::string& value = it->second;
    const char* end = value.data() + value.size();
    auto [ptr, ec] = std::from_chars(value.data(), end, current);
    if (ec != std::errc() || ptr != end) {
      std::string shown = value.size() <= 64 ? "'" + value + "'" : "of " + std::to_string(value.size()) + " bytes";
      return "cannot add to store key " + shownKey(key) + ": its value " + shown + " is not a decimal integer";
    }
  }
  if (__builtin_add_overflow(current, delta, result)) {
    return "cannot add " + std::to_string(delta) + " to store key " + shownKey(key) +
           ": the result overflows int64 (value " + std::to_string(current) + ")";
  }
  return set(key, std::to_string(*result));
}

const std::string* StoreData::find(const std::string& key) const {
  auto it = data_.find(key);
  return it == data_.end() ? nullptr : &it->second;
}

}  // namespace ddl::store_wire
