// The TCP rendezvous store's client (connectTcpStore, store.h): the connection, the handshake's client side, and
// the Store calls over it. The wire format and the handshake are tcp_store.cpp's.
//
// Client threads: connectTcpStore runs the handshake on the caller's thread, before the TcpStore exists. Then
// any thread may call set/get/add at any time. A caller sends its whole frame under send_mu_, then waits for
// its reply: one waiting caller at a time holds the reader role and polls the socket, hands every reply it
// parses to its owner and wakes them; the others sleep on a condition variable until their reply arrives, the
// connection breaks or their deadline passes. So a get() blocked on a missing key does not stop another
// thread's set() on the same connection (a single mutex held across get() would deadlock that case).
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/fd.h"
#include "common/host_port.h"
#include "error.h"
#include "rendezvous/store.h"
#include "rendezvous/store_protocol.h"
#include "rendezvous/tcp_store.h"

namespace ddl {
namespace {

using namespace store_wire;

constexpr uint32_t kMaxHandshakeReplyBytes = 1024;  // a client reading a handshake reply takes no more
// Longest reply payload: a GETMANY's values, a value, or a failure message (which quotes at most the key and a
// few words).
constexpr uint32_t kMaxReplyBytes = std::max<uint32_t>(kMaxManyReplyBytes, kMaxValueBytes + kMaxKeyBytes + 1024);
// Keys per GETMANY request a client sends: with bootstrap records of a few KiB (UCX addresses of several
// devices) an answer stays far below kMaxManyReplyBytes at any rank count, at 8 round trips for 32,768 ranks.
constexpr size_t kKeysPerGetMany = 4096;
// How much longer than the wait_ms it sends a client waits for a GETMANY's answer: the server answers at
// wait_ms (kTimedOut, naming the missing key), and that answer is worth the wait.
constexpr int64_t kManyGraceMs = 1000;

class TcpStore final : public Store {
 public:
  // fd: connected, and past the handshake when has_secret.
  TcpStore(Fd fd, std::string addr, int64_t timeout_ms, bool has_secret)
      : fd_(std::move(fd)), addr_(std::move(addr)), timeout_ms_(timeout_ms), has_secret_(has_secret) {}

  void set(const std::string& key, const std::string& value) override {
    checkSizes(key, value.size());
    Deadline deadline(timeout_ms_);
    Reply r;
    if (!call(kSet, key, value, deadline, &r)) failNoAnswer();
    checkOk(r);
  }

  std::string get(const std::string& key, const Deadline& deadline) override {
    checkSizes(key, 0);
    Reply r;
    if (!call(kGet, key, {}, deadline, &r)) {
      cancelGet(key, r.id);
      fail(ddlTimeout, "timed out after " + std::to_string(deadline.timeoutMs()) + " ms waiting for key '" +
                           key + "' in the rendezvous store at " + addr_ +
                           " (did every rank start and publish it?)");
    }
    checkOk(r);
    return std::move(r.payload);
  }

  std::vector<std::string> getMany(const std::vector<std::string>& keys, const Deadline& deadline) override {
    std::vector<std::string> values;
    values.reserve(keys.size());
    size_t first = 0;
    while (first < keys.size()) {  // one request in practice (store_protocol.h); bounded by keys.size()
      size_t end = first;
      size_t bytes = 8;
      while (end < keys.size() && end - first < kKeysPerGetMany && bytes + 4 + keys[end].size() <= kMaxManyRequestBytes) {
        checkSizes(keys[end], 0);
        bytes += 4 + keys[end].size();
        ++end;
      }
      if (end == first) checkSizes(keys[end], 0);  // throws: a key too long for any request
      const std::vector<std::string> batch(keys.begin() + first, keys.begin() + end);
      const uint32_t wait_ms = static_cast<uint32_t>(std::clamp<int64_t>(deadline.remainingMs(), 0, kMaxManyWaitMs));
      Reply r;
      if (!call(kGetMany, {}, encodeGetMany(wait_ms, batch), Deadline(wait_ms + kManyGraceMs), &r)) {
        cancelGet({}, r.id);
        fail(ddlTimeout, "timed out after " + std::to_string(deadline.timeoutMs()) + " ms waiting for " +
                             std::to_string(batch.size()) + " keys (from '" + batch.front() +
                             "') in the rendezvous store at " + addr_ + ", which did not answer (is rank 0 alive?)");
      }
      if (r.status == kTimedOut) {
        if (r.payload.size() < 4) breakAndFail(ddlRemoteError, "rendezvous store at " + addr_ + " sent a malformed reply");
        const uint32_t missing = getU32(r.payload.data());
        const std::string key = r.payload.substr(4);
        // The server counts only this batch's missing keys; later batches were not asked about yet.
        std::string batch_note;
        if (first > 0 || end < keys.size()) {
          batch_note = " of keys " + std::to_string(first + 1) + "-" + std::to_string(end) + " of " +
                       std::to_string(keys.size()) + " (" + (first > 0 ? "those before were there" : "") +
                       (first > 0 && end < keys.size() ? "; " : "") +
                       (end < keys.size() ? "the rest not asked for yet" : "") + ")";
        }
        fail(ddlTimeout, "timed out after " + std::to_string(deadline.timeoutMs()) + " ms waiting for key '" +
                             key + "'" +
                             (missing > 1 ? " and " + std::to_string(missing - 1) + " more" : std::string()) +
                             batch_note + " in the rendezvous store at " + addr_ +
                             " (did every rank start and publish it?)");
      }
      checkOk(r);
      std::vector<std::string> got;
      if (!decodeValues(r.payload, batch.size(), &got))
        breakAndFail(ddlRemoteError, "rendezvous store at " + addr_ + " sent a malformed reply");
      for (std::string& v : got) values.push_back(std::move(v));
      first = end;
    }
    return values;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    checkSizes(key, 8);
    Deadline deadline(timeout_ms_);
    Reply r;
    if (!call(kAdd, key, encodeI64(delta), deadline, &r)) failNoAnswer();
    checkOk(r);
    if (r.payload.size() != 8)
      breakAndFail(ddlRemoteError, "rendezvous store at " + addr_ + " sent a malformed reply");
    return decodeI64(r.payload.data());
  }

 private:
  struct Reply {
    uint32_t id = 0;
    uint8_t status = kOk;
    std::string payload;
  };

  static void checkSizes(const std::string& key, size_t value_bytes) {
    if (key.size() > kMaxKeyBytes || value_bytes > kMaxValueBytes) {
      fail(ddlInvalidArgument,
           "store key of " + std::to_string(key.size()) + " bytes or value of " +
               std::to_string(value_bytes) + " bytes is too long for the rendezvous store (limits " +
               std::to_string(kMaxKeyBytes) + " and " + std::to_string(kMaxValueBytes) + ")");
    }
  }

  void checkOk(const Reply& r) const {
    if (r.status != kOk)
      fail(ddlInvalidArgument, r.payload);  // the server's message, e.g. ADD to a non-integer
  }

  [[noreturn]] void failNoAnswer() const {
    fail(ddlTimeout, "rendezvous store at " + addr_ + " did not answer within " +
                         std::to_string(timeout_ms_) + " ms (is rank 0 alive?)");
  }

  // Marks the connection unusable (when a stream error makes every later reply untrustworthy) and throws.
  [[noreturn]] void breakAndFail(ddlResult_t code, const std::string& msg) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      breakLocked(code, msg);
    }
    cv_.notify_all();
    fail(code, msg);
  }

  void breakLocked(ddlResult_t code, const std::string& msg) {
    if (broken_) return;
    broken_ = true;
    broken_code_ = code;
    broken_msg_ = msg;
    ::shutdown(fd_.get(), SHUT_RDWR);  // wakes a reader blocked in poll()
  }

  std::string closedMessage() const {
    return "rendezvous store at " + addr_ + " closed the connection (rank 0 exited?)";
  }

  // Sends one request and waits for its reply. False when the deadline passes first; r->id is the request's
  // id.
  bool call(uint8_t op, const std::string& key, std::string_view value, const Deadline& deadline, Reply* r) {
    uint32_t id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_) fail(broken_code_, broken_msg_);
      id = next_id_++;
      pending_.emplace(id, std::nullopt);
    }
    r->id = id;
    const std::string frame = requestFrame(op, id, key, value);
    bool sent = false;
    try {
      sent = sendFrame(frame, deadline);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.erase(id);
      throw;
    }
    if (!sent) {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.erase(id);
      return false;
    }
    return waitReply(id, deadline, r);
  }

  // Writes a whole frame. False if the deadline passed before any byte went out; throws on a broken
  // connection.
  bool sendFrame(const std::string& frame, const Deadline& deadline) {
    std::lock_guard<std::mutex> send_lock(send_mu_);
    size_t sent = 0;
    while (sent < frame.size()) {
      ssize_t n = ::send(fd_.get(), frame.data() + sent, frame.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      int err = n < 0 ? errno : EPIPE;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        if (deadline.expired()) {
          if (sent == 0) return false;
          // Half a frame is on the wire: the stream cannot be used again.
          breakAndFail(ddlTimeout, "rendezvous store at " + addr_ + " stopped reading requests for " +
                                       std::to_string(deadline.timeoutMs()) + " ms (is rank 0 alive?)");
        }
        pollfd p{fd_.get(), POLLOUT, 0};
        ::poll(&p, 1, std::max(1, pollMs(deadline.remainingMs())));
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (broken_) fail(broken_code_, broken_msg_);  // e.g. the reader saw the close first
      }
      if (err == EPIPE || err == ECONNRESET) breakAndFail(ddlRemoteError, closedMessage());
      breakAndFail(ddlSystemError,
                   "cannot send to the rendezvous store at " + addr_ + ": " + errnoString(err));
    }
    return true;
  }

  // Waits for the reply to id (see the file comment: one waiter reads, the others sleep). False at the
  // deadline.
  bool waitReply(uint32_t id, const Deadline& deadline, Reply* r) {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      auto it = pending_.find(id);
      DDL_ASSERT(it != pending_.end());
      if (it->second) {
        *r = std::move(*it->second);
        pending_.erase(it);
        return true;
      }
      if (broken_) {
        pending_.erase(it);
        fail(broken_code_, broken_msg_);
      }
      if (deadline.expired()) {
        pending_.erase(it);
        return false;
      }
      if (reading_) {
        cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(1, deadline.remainingMs())));
        continue;
      }
      reading_ = true;
      lock.unlock();
      std::vector<Reply> replies;
      ddlResult_t error_code = ddlSuccess;
      std::string error;
      try {
        readOnceAsReader(deadline.remainingMs(), &replies, &error_code, &error);
      } catch (const std::exception& e) {
        error_code = ddlSystemError;
        error = std::string("reading from the rendezvous store at " + addr_ + " failed: ") + e.what();
      }
      lock.lock();
      reading_ = false;
      for (Reply& reply : replies) {
        auto owner = pending_.find(reply.id);
        if (owner != pending_.end()) owner->second = std::move(reply);  // else: a GET that timed out; drop it
      }
      if (error_code != ddlSuccess) breakLocked(error_code, error);
      cv_.notify_all();
    }
  }

  // Only the thread holding the reader role calls this (it owns rbuf_). Waits up to timeout_ms for data,
  // reads one chunk, and returns the complete replies in it; sets *error_code on a closed or corrupt stream.
  void readOnceAsReader(int64_t timeout_ms, std::vector<Reply>* replies, ddlResult_t* error_code,
                        std::string* error) {
    pollfd p{fd_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, pollMs(timeout_ms));
    if (n < 0 && errno != EINTR) {
      *error_code = ddlSystemError;
      *error = "cannot poll the connection to the rendezvous store at " + addr_ + ": " + errnoString(errno);
      return;
    }
    if (n <= 0) return;
    // Read straight into rbuf_: callers' threads may have small stacks, so no large buffer on the stack.
    size_t old_size = rbuf_.size();
    rbuf_.resize(old_size + kRecvChunkBytes);
    ssize_t got = ::recv(fd_.get(), rbuf_.data() + old_size, kRecvChunkBytes, 0);
    int err = errno;
    rbuf_.resize(old_size + static_cast<size_t>(std::max<ssize_t>(got, 0)));
    if (got < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)) return;
    if (got == 0 || (got < 0 && (err == ECONNRESET || err == EPIPE))) {
      *error_code = ddlRemoteError;
      *error = closedMessage();
      return;
    }
    if (got < 0) {
      *error_code = ddlSystemError;
      *error = "cannot read from the rendezvous store at " + addr_ + ": " + errnoString(err);
      return;
    }
    size_t off = 0;
    while (rbuf_.size() - off >= kReplyHeaderBytes) {
      const char* h = rbuf_.data() + off;
      uint8_t status = static_cast<uint8_t>(h[0]);
      uint32_t length = getU32(h + 5);
      if (status == kRefused) {  // the store did not admit this connection, and closes it
        *error_code = ddlInvalidArgument;
        *error = has_secret_ ? "rendezvous store at " + addr_ +
                                   " refused this rank: wrong DDL_JOB_SECRET (is this rank part of the job?)"
                             : "rendezvous store at " + addr_ +
                                   " refused this rank: it admits only holders of the job's secret, and "
                                   "DDL_JOB_SECRET is not set here (is this rank part of the job?)";
        break;
      }
      if ((status != kOk && status != kFailed && status != kTimedOut) || length > kMaxReplyBytes) {
        *error_code = ddlRemoteError;
        *error = "rendezvous store at " + addr_ + " sent a malformed reply (is DDL_ROOT a libddl store?)";
        return;
      }
      if (rbuf_.size() - off < kReplyHeaderBytes + length) break;
      Reply reply;
      reply.id = getU32(h + 1);
      reply.status = status;
      reply.payload.assign(h + kReplyHeaderBytes, length);
      replies->push_back(std::move(reply));
      off += kReplyHeaderBytes + length;
    }
    rbuf_.erase(0, off);
  }

  // Tells the server to forget a GET whose deadline passed, so it neither answers it later nor keeps it
  // queued.
  void cancelGet(const std::string& key, uint32_t id) {
    try {
      sendFrame(requestFrame(kCancel, id, key, {}), Deadline(std::min<int64_t>(timeout_ms_, 1000)));
    } catch (const Error&) {
      // Best effort: the caller reports its timeout, which is the error that matters.
    }
  }

  Fd fd_;
  const std::string addr_;    // "host:port", for messages
  const int64_t timeout_ms_;  // how long set() and add() wait for the server
  const bool has_secret_;     // the connection proved the job's secret

  std::mutex send_mu_;  // one frame on the wire at a time; taken before mu_ when both are held

  std::mutex mu_;
  std::condition_variable cv_;  // a reply arrived, the reader role is free, or the connection broke
  uint32_t next_id_ = 1;
  std::unordered_map<uint32_t, std::optional<Reply>> pending_;  // requests waiting for their reply
  bool reading_ = false;                                        // some waiter holds the reader role
  bool broken_ = false;
  ddlResult_t broken_code_ = ddlSuccess;
  std::string broken_msg_;

  std::string rbuf_;  // received bytes not yet parsed; owned by the reader role
};

bool sameEndpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    auto& x = reinterpret_cast<const sockaddr_in&>(a);
    auto& y = reinterpret_cast<const sockaddr_in&>(b);
    return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    auto& x = reinterpret_cast<const sockaddr_in6&>(a);
    auto& y = reinterpret_cast<const sockaddr_in6&>(b);
    return x.sin6_port == y.sin6_port && std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof x.sin6_addr) == 0;
  }
  return false;
}

// One non-blocking connect to ai, waiting at most until the deadline. An invalid Fd and *error on failure.
Fd tryConnect(const addrinfo* ai, const Deadline& deadline, std::string* error) {
  Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
  if (!fd.valid()) {
    *error = errnoString(errno);
    return Fd();
  }
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) < 0) {
    if (errno != EINPROGRESS && errno != EINTR) {
      *error = errnoString(errno);
      return Fd();
    }
    pollfd p{fd.get(), POLLOUT, 0};
    int n;
    do {
      n = ::poll(&p, 1, pollMs(deadline.remainingMs()));
    } while (n < 0 && errno == EINTR && !deadline.expired());
    if (n <= 0) {
      *error = "connection attempt timed out";
      return Fd();
    }
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      *error = errnoString(err);
      return Fd();
    }
  }
  // Retrying a local port with nobody listening can make TCP connect the socket to itself (simultaneous open)
  // when the kernel happens to pick that port as the source port. That is no server: treat it as refused.
  sockaddr_storage local{}, peer{};
  socklen_t local_len = sizeof local, peer_len = sizeof peer;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &local_len) < 0 ||
      ::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &peer_len) < 0) {
    *error = errnoString(errno);
    return Fd();
  }
  if (sameEndpoint(local, peer)) {
    *error = errnoString(ECONNREFUSED);
    return Fd();
  }
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// The client's side of the handshake's blocking steps: writes (`out`) or reads (`in`) exactly len bytes before
// the deadline. False with *why when the connection closed, failed or stayed silent.
bool transferBefore(int fd, const char* out, char* in, size_t len, const Deadline& deadline, std::string* why) {
  const bool sending = out != nullptr;
  size_t done = 0;
  while (done < len) {  // bounded by the deadline
    ssize_t n = sending ? ::send(fd, out + done, len - done, MSG_NOSIGNAL) : ::recv(fd, in + done, len - done, 0);
    int err = n < 0 ? errno : 0;
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0 && !sending) {
      *why = "the connection closed during libddl's handshake";
      return false;
    }
    if (n == 0 || (err != EINTR && err != EAGAIN && err != EWOULDBLOCK)) {
      *why = "the connection failed during libddl's handshake: " + errnoString(n == 0 ? EPIPE : err);
      return false;
    }
    if (deadline.expired()) {
      *why = std::string("a process accepted the connection but did not ") +
             (sending ? "read" : "answer") + " libddl's handshake (another process on DDL_ROOT's port?)";
      return false;
    }
    pollfd p{fd, static_cast<short>(sending ? POLLOUT : POLLIN), 0};
    ::poll(&p, 1, std::max(1, pollMs(deadline.remainingMs())));
  }
  return true;
}

bool sendBefore(int fd, std::string_view bytes, const Deadline& deadline, std::string* why) {
  return transferBefore(fd, bytes.data(), nullptr, bytes.size(), deadline, why);
}

bool recvBefore(int fd, char* buf, size_t len, const Deadline& deadline, std::string* why) {
  return transferBefore(fd, nullptr, buf, len, deadline, why);
}

// Proves the job's secret to the server at addr over fd and checks the server's proof (file comment). False,
// with *why, when the connection closed or went silent first: a server that dropped it to make room, or a
// slow start, deserves a new connection. Throws when the server refused the secret or did not prove it.
bool proveSecret(int fd, const std::string& addr, const std::string& secret, const Deadline& deadline,
                 std::string* why) {
  // Each attempt waits as long as a server waits for a handshake, or until the caller's deadline if that
  // comes first: then the caller's deadline has passed when this returns, and this attempt's reason is the
  // last.
  const int64_t attempt_ms = TcpStoreHandshakeLimits{}.timeout_ms;
  const Deadline own(attempt_ms);
  const Deadline& step = deadline.remainingMs() <= attempt_ms ? deadline : own;
  const std::string no_proof = "rendezvous store at " + addr + " did not prove the job's secret";
  const std::string stranger = " (another process on DDL_ROOT's port?)";
  // One handshake reply; throws on anything a libddl store would not send.
  auto readReply = [&](uint8_t* status, std::string* payload) {
    char header[kReplyHeaderBytes];
    if (!recvBefore(fd, header, sizeof header, step, why)) return false;
    *status = static_cast<uint8_t>(header[0]);
    const uint32_t length = getU32(header + 5);
    if (getU32(header + 1) != 0 || (*status != kOk && *status != kRefused) ||
        length > kMaxHandshakeReplyBytes) {
      fail(ddlRemoteError, no_proof + ": its answer is not libddl's handshake" + stranger);
    }
    payload->resize(length);
    return recvBefore(fd, payload->data(), length, step, why);
  };

  const Nonce client_nonce = freshNonce();
  if (!sendBefore(fd, requestFrame(kHello, 0, {}, bytesOf(client_nonce)), step, why)) return false;
  uint8_t status = kOk;
  std::string payload;
  if (!readReply(&status, &payload)) return false;
  if (status == kRefused) {
    fail(ddlRemoteError, no_proof +
                             ": it has none (was rank 0 started without DDL_JOB_SECRET, or is another "
                             "process on DDL_ROOT's port?)");
  }
  if (payload.size() != kNonceBytes)
    fail(ddlRemoteError, no_proof + ": its answer is not libddl's handshake" + stranger);
  Nonce server_nonce;
  std::memcpy(server_nonce.data(), payload.data(), kNonceBytes);

  const Mac proof = handshakeMac(secret, kClientLabel, client_nonce, server_nonce);
  if (!sendBefore(fd, requestFrame(kProof, 0, {}, bytesOf(proof)), step, why)) return false;
  if (!readReply(&status, &payload)) return false;
  if (status == kRefused) {
    fail(ddlInvalidArgument, "rendezvous store at " + addr +
                                 " refused this rank: wrong DDL_JOB_SECRET (is this rank part of the job?)");
  }
  if (!sameMac(handshakeMac(secret, kServerLabel, client_nonce, server_nonce), payload)) {
    fail(ddlRemoteError, no_proof + stranger);
  }
  return true;
}

}  // namespace

std::unique_ptr<Store> connectTcpStore(const std::string& host, int port, const Deadline& deadline,
                                       const std::string& secret) {
  const std::string addr = formatHostPort(host, port);
  if (host.empty() || port <= 0 || port > 65535) {
    fail(ddlInvalidArgument,
         "invalid rendezvous store address '" + addr + "': expected a host and a port in 1..65535");
  }
  checkSecretSize(secret);
  // set() and add() wait this long for the server's answer; it is the job's timeout, with a floor so that a
  // short connect deadline does not make every later request fragile.
  const int64_t request_timeout_ms = std::max<int64_t>(deadline.timeoutMs(), 1000);
  const std::string port_text = std::to_string(port);
  std::string last_error = "no connection attempt made";
  int64_t backoff_ms = 50;
  for (;;) {  // bounded by the deadline
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found);
    if (rc == 0) {
      std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
      for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
        Fd fd = tryConnect(ai, deadline, &last_error);
        if (fd.valid() && (secret.empty() || proveSecret(fd.get(), addr, secret, deadline, &last_error))) {
          return std::make_unique<TcpStore>(std::move(fd), addr, request_timeout_ms, !secret.empty());
        }
      }
    } else if (rc == EAI_AGAIN) {
      // A temporary DNS failure (rank 0's name may not be published yet): retry until the deadline.
      last_error = std::string("cannot resolve host '") + host + "': " + ::gai_strerror(rc);
    } else {
      std::string why = rc == EAI_SYSTEM ? errnoString(errno) : ::gai_strerror(rc);
      fail(ddlInvalidArgument, "cannot resolve the rendezvous host '" + host + "' of " + addr + ": " + why +
                                   " (is DDL_ROOT right?)");
    }
    if (deadline.expired()) {
      fail(ddlTimeout, "cannot reach the rendezvous store at " + addr + " after " +
                           std::to_string(deadline.timeoutMs()) + " ms: " + last_error +
                           " (is rank 0 running, and is DDL_ROOT right?)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(backoff_ms, deadline.remainingMs())));
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 500);
  }
}

void parseHostPort(const std::string& addr, std::string* host, int* port) {
  DDL_ASSERT(host != nullptr && port != nullptr);
  StatusOr<HostPort> parsed = parseHostPort(std::string_view(addr));  // common/host_port.h, ddl's one parser
  if (!parsed) {
    fail(ddlInvalidArgument, "invalid rendezvous address '" + addr + "': " + parsed.status().message() +
                                 " (expected host:port, e.g. node0:29500 or [::1]:29500)");
  }
  *host = parsed->host;
  *port = parsed->port;
}

}  // namespace ddl
