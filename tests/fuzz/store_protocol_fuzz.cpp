// Fuzzes the rendezvous server's handling of a client's bytes (comm/src/store_protocol.h): frames parsed as the
// server's loop parses them, in the order a connection's admission state allows, and requests applied to the
// store's data under small limits. Input: byte 0 picks the store (with or without a secret) and how the bytes
// arrive (at once, or in pieces as recv() may deliver them); the rest is what the client sends.
//
// Checks beyond the sanitizers: a frame never claims more bytes than it was given, a frame the parser accepted
// whole parses the same when more bytes follow, a GETMANY taken whole has a well-formed key list within the
// limits and its answer decodes to the values held, and the data never passes its limits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "rendezvous/store_protocol.h"

using namespace ddl::store_wire;

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "store_protocol_fuzz: %s\n", what);
    std::abort();
  }
}

int64_t decodeI64(std::string_view v) {
  uint64_t u = 0;
  for (char c : v) u = (u << 8) | static_cast<unsigned char>(c);
  return static_cast<int64_t>(u);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool has_secret = data[0] & 1;
  const size_t piece = (data[0] >> 1) == 0 ? SIZE_MAX : (data[0] >> 1);  // bytes per simulated recv()
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);

  const StoreLimits limits{/*max_keys=*/8, /*max_total_bytes=*/4096, /*max_value_bytes=*/1024};
  StoreData store(limits);
  Admission admission = has_secret ? Admission::kAwaitHello : Admission::kOpen;
  std::string buffered;  // what the server holds of this connection's input, as Conn::in
  size_t fed = 0;
  while (fed < input.size() && admission != Admission::kClosing) {
    const size_t n = std::min(piece, input.size() - fed);
    buffered.append(input.substr(fed, n));
    fed += n;
    size_t off = 0;
    for (;;) {
      Frame frame;
      const std::string_view rest = std::string_view(buffered).substr(off);
      const FrameVerdict verdict = parseStoreFrame(rest, admission, has_secret, &frame);
      if (verdict == FrameVerdict::kNeedMore) break;
      if (verdict == FrameVerdict::kRefuse) {
        check(admission == Admission::kAwaitHello, "refused a connection that was not awaiting HELLO");
        admission = Admission::kClosing;
        break;
      }
      if (verdict == FrameVerdict::kDrop) return 0;
      check(frame.size >= kRequestHeaderBytes && frame.size <= rest.size(), "frame size out of range");
      check(frame.key.size() <= kMaxKeyBytes && frame.value.size() <= kMaxValueBytes, "lengths past limits");
      check(frame.key.data() == rest.data() + kRequestHeaderBytes, "key not after the header");
      // The same frame with bytes after it parses alike (the parser looks at its own frame only).
      Frame again;
      std::string longer(rest.substr(0, frame.size));
      longer += "\x01trailing";
      check(parseStoreFrame(longer, admission, has_secret, &again) == verdict && again.size == frame.size,
            "a whole frame parses differently with bytes after it");
      if (verdict == FrameVerdict::kHandshake) {
        check(frame.value.size() == kNonceBytes, "handshake with a wrong length");
        if (frame.op == kHello && has_secret) {
          admission = Admission::kAwaitProof;
        } else if (frame.op == kProof) {
          admission = (frame.value[0] & 1) ? Admission::kOpen : Admission::kClosing;  // proof right or wrong
        } else {
          admission = Admission::kClosing;  // HELLO to an open store: refused
        }
      } else {
        check(admission == Admission::kOpen, "a request accepted before the handshake");
        const std::string key(frame.key);
        int64_t result = 0;
        switch (frame.op) {
          case kSet:
            (void)store.set(key, frame.value);
            break;
          case kGet:
            (void)store.find(key);
            break;
          case kAdd:
            check(frame.value.size() == 8, "ADD without 8 bytes");
            if (store.add(key, decodeI64(frame.value), &result).empty()) {
              check(*store.find(key) == std::to_string(result), "ADD stored another value");
            }
            break;
          case kCancel:
            break;
          case kGetMany: {
            // The parser took it whole, so the list is well formed and within the limits; the answer to it
            // decodes to the very values the store holds.
            uint32_t wait_ms = 0;
            std::vector<std::string_view> keys;
            check(decodeGetMany(frame.value, &wait_ms, &keys), "a GETMANY accepted with a malformed key list");
            check(frame.key.empty() && !keys.empty() && keys.size() <= kMaxManyKeys && wait_ms <= kMaxManyWaitMs,
                  "a GETMANY accepted past its limits");
            std::vector<const std::string*> found;
            for (std::string_view k : keys) {
              check(k.size() <= kMaxKeyBytes, "a GETMANY key past the limit");
              if (const std::string* v = store.find(std::string(k))) found.push_back(v);
            }
            std::vector<std::string> decoded;
            check(decodeValues(encodeValues(found), found.size(), &decoded), "an answer does not decode");
            for (size_t i = 0; i < found.size(); ++i) check(decoded[i] == *found[i], "an answer decodes to other values");
            break;
          }
          default:
            check(false, "an unknown op accepted");
        }
        check(store.keys() <= limits.max_keys && store.totalBytes() <= limits.max_total_bytes,
              "the store passed its limits");
      }
      off += frame.size;
      if (admission == Admission::kClosing) break;
    }
    buffered.erase(0, off);
    // What the server buffers: at most one frame's header and body plus one recv().
    check(buffered.size() <= kRequestHeaderBytes + kMaxKeyBytes + kMaxValueBytes + piece, "buffer grew past a frame");
  }
  return 0;
}
