// TcpStore: the rendezvous store of a real job. Rank 0 runs a TcpStoreServer on the DDL_ROOT port; every rank
// (rank 0 too) connects a TcpStore client to it, publishes its UCX worker address with set() and reads the
// others' with get(), which the server answers only once the key exists. Plain POSIX sockets and poll(), and
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
//
// Server threads: the constructor and destructor run on the caller's thread; everything else (accepting,
// reading, answering, releasing waiting GETs) runs on one background thread in a poll() loop over the
// listening socket, the clients and a self-pipe that the destructor writes to stop it. Methods named
// ...FromLoop run only on that thread and own the store's state without locks.
//
// Client threads: connectTcpStore runs the handshake on the caller's thread, before the TcpStore exists. Then
// any thread may call set/get/add at any time. A caller sends its whole frame under send_mu_, then waits for
// its reply: one waiting caller at a time holds the reader role and polls the socket, hands every reply it
// parses to its owner and wakes them; the others sleep on a condition variable until their reply arrives, the
// connection breaks or their deadline passes. So a get() blocked on a missing key does not stop another
// thread's set() on the same connection (a single mutex held across get() would deadlock that case).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
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

namespace ddl {
namespace {

using namespace store_wire;

constexpr size_t kMacBytes = 32;  // SHA-256
static_assert(kNonceBytes == kMacBytes, "kHello and kProof frames have one value length");
constexpr uint32_t kMaxHandshakeReplyBytes = 1024;  // a client reading a handshake reply takes no more
constexpr std::string_view kClientLabel = "ddl-store client v1";
constexpr std::string_view kServerLabel = "ddl-store server v1";

// Longest reply payload: a GETMANY's values, a value, or a failure message (which quotes at most the key and a
// few words).
constexpr uint32_t kMaxReplyBytes = std::max<uint32_t>(kMaxManyReplyBytes, kMaxValueBytes + kMaxKeyBytes + 1024);
// A client with this many unsent reply bytes is not read from until it drains them (backpressure).
constexpr size_t kMaxUnsentBytes = 64 * 1024 * 1024;
// Keys per GETMANY request a client sends: with bootstrap records of a few KiB (UCX addresses of several
// devices) an answer stays far below kMaxManyReplyBytes at any rank count, at 8 round trips for 32,768 ranks.
constexpr size_t kKeysPerGetMany = 4096;
constexpr size_t kMaxManyAnswers = 16;                     // answers kept for reuse (see many_answers_)
constexpr size_t kMaxManyAnswerBytes = size_t{256} << 20;  // and their bytes, together
constexpr std::chrono::seconds kManyAnswerIdle{10};        // dropped when none was asked for in this long
// GETs one connection may have waiting at once; an honest client has one per calling thread.
constexpr int kMaxWaitingGets = 1024;
// GETMANYs one connection may have waiting at once (each holds up to kMaxManyRequestBytes of keys); the
// bootstrap has one.
constexpr int kMaxWaitingMany = 16;
// How much longer than the wait_ms it sends a client waits for a GETMANY's answer: the server answers at
// wait_ms (kTimedOut, naming the missing key), and that answer is worth the wait.
constexpr int64_t kManyGraceMs = 1000;
constexpr size_t kRecvChunkBytes = 64 * 1024;

std::string errnoString(int err) {
  char buf[256];
  // strerror_r is the GNU variant (returns the message) or the XSI one (fills buf); accept either.
  struct Pick {
    static const char* of(const char* gnu, const char*) { return gnu; }
    static const char* of(int xsi, const char* b) { return xsi == 0 ? b : "unknown error"; }
  };
  return Pick::of(strerror_r(err, buf, sizeof buf), buf);
}

// Milliseconds for poll(): never negative, never past INT_MAX.
int pollMs(int64_t ms) { return static_cast<int>(std::clamp<int64_t>(ms, 0, INT_MAX)); }

void putU32(std::string* s, uint32_t v) {
  uint32_t n = htonl(v);
  s->append(reinterpret_cast<const char*>(&n), 4);
}
uint32_t getU32(const char* p) {
  uint32_t n;
  std::memcpy(&n, p, 4);
  return ntohl(n);
}
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

using Nonce = std::array<unsigned char, kNonceBytes>;
using Mac = std::array<unsigned char, kMacBytes>;

template <size_t N>
std::string_view bytesOf(const std::array<unsigned char, N>& a) {
  return {reinterpret_cast<const char*>(a.data()), a.size()};
}

Nonce freshNonce() {
  Nonce n;
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) {
    fail(ddlSystemError, "libcrypto could not produce random bytes for the rendezvous store's handshake");
  }
  return n;
}

// HMAC-SHA256(secret, label | client | server): one side's proof that it holds the secret.
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

// Constant time: how much of a proof matched must not show in how long the check took.
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

// -----------------------------------------------------------------------------------------------------------
// Server

class TcpStoreServerImpl final : public TcpStoreServer {
 public:
  TcpStoreServerImpl(const std::string& host, int port, std::string secret, const TcpStoreHandshakeLimits& limits,
                     const StoreLimits& store_limits);
  ~TcpStoreServerImpl() override;
  int port() const override { return port_; }

 private:
  using Auth = Admission;  // kClosing: the reply goes out, then input is discarded until the peer closes
  struct Conn {
    Fd fd;
    std::string in;        // received bytes not yet parsed (at most one partial frame + one recv chunk)
    // Replies not yet fully sent, in order. A GETMANY answer that every rank asks for is one shared string,
    // not p copies: p ranks' gathers of p records hold p records' worth here, not p^2.
    std::deque<std::shared_ptr<const std::string>> out;
    size_t out_bytes = 0;  // bytes in out not yet sent
    size_t out_sent = 0;   // bytes of out.front() already sent
    int waiting_gets = 0;  // GETs of this connection in waiters_
    int waiting_many = 0;  // GETMANYs of this connection in many_
    bool dead = false;     // to be closed at the end of this loop round
    Auth auth = Auth::kOpen;
    bool shut_down = false;  // kClosing: everything is sent and our side of the stream is shut down
    Nonce client_nonce{};
    Nonce server_nonce{};
  };
  struct Waiter {
    uint64_t conn;
    uint32_t id;
    bool many = false;  // a GETMANY (in many_) waiting for this key, the first of its keys still missing
  };
  // A GETMANY not answered yet. Keys before `next` exist; it waits (in waiters_) on keys[next]. Each key is
  // looked up once while it waits, so a gather of p keys costs the server O(p) lookups, not O(p) per SET.
  struct ManyGet {
    std::vector<std::string> keys;
    size_t next = 0;
    Clock::time_point deadline;
  };
  using ManyId = std::pair<uint64_t, uint32_t>;  // connection, request id

  void runLoop();
  void acceptFromLoop();
  void readFromLoop(uint64_t conn_id, Conn& c);
  void handleFromLoop(uint64_t conn_id, Conn& c, uint8_t op, uint32_t id, std::string key,
                      std::string_view value);
  void replyFromLoop(Conn& c, uint8_t status, uint32_t id, std::string_view payload);
  // The same with a payload that other connections may be sending too (a GETMANY answer).
  void replyFromLoop(Conn& c, uint8_t status, uint32_t id, std::shared_ptr<const std::string> payload);
  void releaseWaitersFromLoop(const std::string& key);
  void startManyFromLoop(uint64_t conn_id, Conn& c, uint32_t id, std::string_view value);
  // Moves it past the keys that exist; answers it (and forgets it) when none is missing, else queues it on the
  // first missing key.
  void stepManyFromLoop(std::map<ManyId, ManyGet>::iterator it);
  // The encoded answer to a GETMANY of keys, whose values are values: one already made for the same keys
  // while the data has not changed, else a new one (kept for the next asker).
  std::shared_ptr<const std::string> manyAnswerFromLoop(const std::vector<std::string>& keys,
                                                        const std::vector<const std::string*>& values);
  // Forgets it, and its place in waiters_.
  void dropManyFromLoop(std::map<ManyId, ManyGet>::iterator it);
  void expireManyFromLoop(Clock::time_point now);
  void flushFromLoop(Conn& c);
  void forgetWaitersFromLoop(uint64_t conn_id);
  void handshakeFromLoop(uint64_t conn_id, Conn& c, uint8_t op, uint32_t id, std::string_view value);
  void refuseFromLoop(uint64_t conn_id, Conn& c, std::optional<uint32_t> id);
  void trackHandshakeFromLoop(uint64_t conn_id);
  void expireHandshakesFromLoop(Clock::time_point now);

  const std::string secret_;  // empty: the store is open
  const TcpStoreHandshakeLimits limits_;
  int port_ = 0;
  Fd listen_fd_;
  Fd wake_read_;   // the loop polls it; readable = stop
  Fd wake_write_;  // the destructor writes one byte to it

  // State of the loop thread (the constructor only creates it).
  uint64_t next_conn_id_ = 1;
  std::unordered_map<uint64_t, Conn> conns_;
  StoreData data_;
  std::unordered_map<std::string, std::vector<Waiter>> waiters_;  // GETs deferred until their key is set
  std::map<ManyId, ManyGet> many_;  // GETMANYs not answered yet; at most kMaxWaitingMany per connection
  // GETMANY answers, while the data has not changed since: at bootstrap every rank asks for the same
  // keys at once, and encoding p values once instead of p times took the 1,024-rank gather of 1.5 KB records
  // from 3.5 s to 2.9 s (bench/init_bench.cpp --store-only; rank 0 publishing one table: 2.1 to 2.6 s).
  // Clients ask in batches of kKeysPerGetMany keys, so there is one answer per batch (every rank cuts the
  // same list the same way): up to kMaxManyAnswers of them, oldest dropped first, while they come to no more
  // than kMaxManyAnswerBytes. All are dropped when the data changes (a SET or ADD), and once none was asked
  // for in kManyAnswerIdle, so that the table does not stay in memory for the job's life. An answer still
  // queued for a connection lives on there (shared), whatever happens here.
  struct ManyAnswer {
    std::vector<std::string> keys;
    std::shared_ptr<const std::string> answer;
  };
  std::vector<ManyAnswer> many_answers_;
  Clock::time_point many_answers_used_{};                         // when one was last asked for
  Clock::time_point accept_paused_until_{};                       // after EMFILE and the like
  // Connections that have not proved the secret, and refused ones still closing: their deadline, by
  // connection id (so the oldest first). At most limits_.max_pending.
  std::map<uint64_t, Clock::time_point> handshakes_;

  std::thread thread_;  // last: started once everything above exists
};

TcpStoreServerImpl::TcpStoreServerImpl(const std::string& host, int port, std::string secret,
                                       const TcpStoreHandshakeLimits& limits, const StoreLimits& store_limits)
    : secret_(std::move(secret)), limits_(limits), data_(store_limits) {
  DDL_ASSERT(limits_.timeout_ms > 0 && limits_.max_pending > 0);
  checkSecretSize(secret_);
  if (port < 0 || port > 65535) {
    fail(ddlInvalidArgument, "cannot listen on port " + std::to_string(port) +
                                 " for the rendezvous store: ports are 0..65535 (check DDL_ROOT)");
  }
  const std::string where = formatHostPort(host, port) + " for the rendezvous store";
  if (host.empty()) fail(ddlInvalidArgument, "cannot listen on " + where + ": no host given (check DDL_ROOT)");
  // Exactly the address DDL_ROOT names (a host name: the address it resolves to), never every interface: a
  // store for 127.0.0.1 is not reachable from the network.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (int rc = ::getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    std::string why = rc == EAI_SYSTEM ? errnoString(errno) : ::gai_strerror(rc);
    fail(ddlInvalidArgument, "cannot listen on " + where + ": cannot resolve '" + host + "': " + why +
                                 " (is DDL_ROOT right?)");
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(found, &::freeaddrinfo);
  int err = 0;
  for (const addrinfo* ai = found; ai != nullptr && !listen_fd_.valid(); ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      err = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // restart despite TIME_WAIT
    if (ai->ai_family == AF_INET6) ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) < 0 || ::listen(fd.get(), SOMAXCONN) < 0) {
      err = errno;
      continue;
    }
    listen_fd_ = std::move(fd);
  }
  if (!listen_fd_.valid()) {
    std::string msg = "cannot listen on " + where + ": " + errnoString(err);
    if (err == EADDRINUSE) {
      msg += " (is another job using DDL_ROOT port " + std::to_string(port) + "?)";
    } else if (err == EACCES) {
      msg += " (ports below 1024 need privileges: choose another DDL_ROOT port)";
    } else if (err == EADDRNOTAVAIL) {
      msg += " (DDL_ROOT must name an address of rank 0's host)";
    }
    fail(ddlSystemError, msg);
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (::getsockname(listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    fail(ddlSystemError, "cannot read the address of the rendezvous store socket: " + errnoString(errno));
  }
  port_ = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port)
                                     : ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) < 0) {
    fail(ddlSystemError, "cannot create the rendezvous store's wake-up pipe: " + errnoString(errno));
  }
  wake_read_.reset(pipe_fds[0]);
  wake_write_.reset(pipe_fds[1]);
  thread_ = std::thread([this] { runLoop(); });
}

TcpStoreServerImpl::~TcpStoreServerImpl() {
  char byte = 1;
  ssize_t n;
  do {
    n = ::write(wake_write_.get(), &byte, 1);
  } while (n < 0 && errno == EINTR);  // EAGAIN: the pipe is full, so the loop is woken already
  thread_.join();
  // The members close every descriptor: clients, listener, pipe. Connected clients then see the connection
  // close and fail with ddlRemoteError instead of waiting for their deadline.
}

void TcpStoreServerImpl::runLoop() {
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;  // ids[i] is the connection of fds[i + 2]
  for (;;) {
    fds.clear();
    ids.clear();
    Clock::time_point now = Clock::now();
    bool accepting = now >= accept_paused_until_;
    fds.push_back({wake_read_.get(), POLLIN, 0});
    fds.push_back({accepting ? listen_fd_.get() : -1, POLLIN, 0});  // poll() skips a negative fd
    for (auto& [id, c] : conns_) {
      size_t unsent = c.out_bytes;
      short events = 0;
      if (unsent < kMaxUnsentBytes) events |= POLLIN;
      if (unsent > 0) events |= POLLOUT;
      fds.push_back({c.fd.get(), events, 0});
      ids.push_back(id);
    }
    // Wake for the end of an accept pause and for the first handshake deadline.
    std::optional<Clock::time_point> wake_at;
    if (!accepting) wake_at = accept_paused_until_;
    for (const auto& [id, deadline] : handshakes_)
      wake_at = wake_at ? std::min(*wake_at, deadline) : deadline;
    for (const auto& [id, m] : many_) wake_at = wake_at ? std::min(*wake_at, m.deadline) : m.deadline;
    if (!many_answers_.empty()) {
      const auto drop_at = many_answers_used_ + kManyAnswerIdle;
      wake_at = wake_at ? std::min(*wake_at, drop_at) : drop_at;
    }
    int timeout = -1;
    if (wake_at) {
      timeout = 1 + pollMs(std::chrono::duration_cast<std::chrono::milliseconds>(*wake_at - now).count());
    }
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "libddl: the rendezvous store on port %d stopped: poll failed: %s\n", port_,
                   errnoString(errno).c_str());
      return;
    }
    if (fds[0].revents != 0) return;  // the destructor asks us to stop
    if (fds[1].revents != 0) acceptFromLoop();
    for (size_t i = 0; i < ids.size(); ++i) {
      short revents = fds[i + 2].revents;
      if (revents == 0) continue;
      auto it = conns_.find(ids[i]);
      if (it == conns_.end() || it->second.dead) continue;
      Conn& c = it->second;
      try {
        // On an error or hang-up the recv() reports what happened.
        if (revents & (POLLIN | POLLERR | POLLHUP)) readFromLoop(ids[i], c);
        if (!c.dead && (revents & POLLOUT)) flushFromLoop(c);
        if (revents & POLLNVAL) c.dead = true;
      } catch (const std::exception& e) {  // e.g. bad_alloc on a huge value: lose this client, keep serving
        std::fprintf(stderr, "libddl: the rendezvous store on port %d dropped a client: %s\n", port_,
                     e.what());
        c.dead = true;
      }
    }
    expireHandshakesFromLoop(Clock::now());
    expireManyFromLoop(Clock::now());
    // Send what this round produced (its own replies and GETs that a SET released), then close dropped
    // clients. A refused connection whose reply is out gets a FIN; it is closed once the peer closes too.
    for (auto& [id, c] : conns_) {
      if (!c.dead && c.out_bytes > 0) flushFromLoop(c);
      if (!c.dead && c.auth == Auth::kClosing && !c.shut_down && c.out_bytes == 0) {
        ::shutdown(c.fd.get(), SHUT_WR);
        c.shut_down = true;
      }
    }
    for (auto it = conns_.begin(); it != conns_.end();) {
      if (it->second.dead) {
        forgetWaitersFromLoop(it->first);
        handshakes_.erase(it->first);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void TcpStoreServerImpl::acceptFromLoop() {
  for (;;) {  // bounded: the backlog is finite, and EAGAIN ends it
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EINTR || err == ECONNABORTED) continue;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
        // The pending connection stays in the backlog; retry later rather than spin on a readable listener.
        std::fprintf(
            stderr,
            "libddl: the rendezvous store on port %d cannot accept a connection: %s (raise ulimit -n?)\n",
            port_, errnoString(err).c_str());
        accept_paused_until_ = Clock::now() + std::chrono::milliseconds(100);
      }
      return;  // EAGAIN: all accepted
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Conn c;
    c.fd.reset(fd);
    const uint64_t id = next_conn_id_++;
    if (!secret_.empty()) c.auth = Auth::kAwaitHello;
    conns_.emplace(id, std::move(c));
    if (!secret_.empty()) trackHandshakeFromLoop(id);
  }
}

void TcpStoreServerImpl::trackHandshakeFromLoop(uint64_t conn_id) {
  if (static_cast<int>(handshakes_.size()) >= limits_.max_pending) {
    // The oldest makes way: strangers holding every place cannot keep a rank out, only make it connect again.
    auto oldest = handshakes_.begin();
    auto conn = conns_.find(oldest->first);
    if (conn != conns_.end()) conn->second.dead = true;
    handshakes_.erase(oldest);
  }
  handshakes_.emplace(conn_id, Clock::now() + std::chrono::milliseconds(limits_.timeout_ms));
}

void TcpStoreServerImpl::expireHandshakesFromLoop(Clock::time_point now) {
  for (auto it = handshakes_.begin(); it != handshakes_.end();) {
    if (it->second > now) {
      ++it;
      continue;
    }
    auto conn = conns_.find(it->first);
    if (conn != conns_.end()) conn->second.dead = true;
    it = handshakes_.erase(it);
  }
}

void TcpStoreServerImpl::readFromLoop(uint64_t conn_id, Conn& c) {
  size_t old_size = c.in.size();
  c.in.resize(old_size + kRecvChunkBytes);
  ssize_t n = ::recv(c.fd.get(), c.in.data() + old_size, kRecvChunkBytes, 0);
  int err = errno;
  c.in.resize(old_size + static_cast<size_t>(std::max<ssize_t>(n, 0)));
  if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK || err == EINTR)) return;
  if (n <= 0) {  // the client closed its end, or the connection failed
    c.dead = true;
    return;
  }
  size_t off = 0;
  while (!c.dead && c.auth != Auth::kClosing) {
    Frame frame;
    const FrameVerdict verdict =
        parseStoreFrame(std::string_view(c.in).substr(off), c.auth, !secret_.empty(), &frame);
    if (verdict == FrameVerdict::kNeedMore) break;  // the rest of the frame has not arrived yet
    if (verdict == FrameVerdict::kRefuse) {
      // A client without the job's secret: tell it why, then close.
      refuseFromLoop(conn_id, c, frame.op == kCancel ? std::nullopt : std::optional<uint32_t>(frame.id));
      break;
    }
    if (verdict == FrameVerdict::kDrop) {  // not a libddl client, or a corrupt stream
      c.dead = true;
      return;
    }
    if (verdict == FrameVerdict::kHandshake) {
      handshakeFromLoop(conn_id, c, frame.op, frame.id, frame.value);
    } else {
      handleFromLoop(conn_id, c, frame.op, frame.id, std::string(frame.key), frame.value);
    }
    off += frame.size;
  }
  if (c.auth == Auth::kClosing) {
    c.in.clear();  // refused: what it sends from now on is read and dropped
  } else {
    c.in.erase(0, off);
  }
}

void TcpStoreServerImpl::handshakeFromLoop(uint64_t conn_id, Conn& c, uint8_t op, uint32_t id,
                                           std::string_view value) {
  if (secret_.empty()) {  // a client with a secret asks this open store to prove one: it cannot
    refuseFromLoop(conn_id, c, id);
    return;
  }
  if (op == kHello) {
    std::memcpy(c.client_nonce.data(), value.data(), kNonceBytes);
    c.server_nonce = freshNonce();
    replyFromLoop(c, kOk, id, bytesOf(c.server_nonce));
    c.auth = Auth::kAwaitProof;
    return;
  }
  if (!sameMac(handshakeMac(secret_, kClientLabel, c.client_nonce, c.server_nonce), value)) {
    refuseFromLoop(conn_id, c, id);
    return;
  }
  replyFromLoop(c, kOk, id, bytesOf(handshakeMac(secret_, kServerLabel, c.client_nonce, c.server_nonce)));
  c.auth = Auth::kOpen;
  handshakes_.erase(conn_id);
}

void TcpStoreServerImpl::refuseFromLoop(uint64_t conn_id, Conn& c, std::optional<uint32_t> id) {
  if (id) replyFromLoop(c, kRefused, *id, std::string_view());
  c.auth = Auth::kClosing;
  // A refused connection lingers until the peer closes, at most until the handshake deadline (the one it has
  // already on a store with a secret).
  if (handshakes_.count(conn_id) == 0) trackHandshakeFromLoop(conn_id);
}

void TcpStoreServerImpl::handleFromLoop(uint64_t conn_id, Conn& c, uint8_t op, uint32_t id, std::string key,
                                        std::string_view value) {
  switch (op) {
    case kSet: {
      if (std::string error = data_.set(key, value); !error.empty()) {
        replyFromLoop(c, kFailed, id, error);  // the store is full: this SET fails, the server goes on
        break;
      }
      many_answers_.clear();  // they hold the old data
      replyFromLoop(c, kOk, id, std::string_view());
      releaseWaitersFromLoop(key);
      break;
    }
    case kGet: {
      if (const std::string* value = data_.find(key)) {
        replyFromLoop(c, kOk, id, *value);
      } else if (c.waiting_gets >= kMaxWaitingGets) {
        c.dead = true;  // a client leaking GETs; an honest one cancels those it gives up on
      } else {
        waiters_[key].push_back({conn_id, id});
        ++c.waiting_gets;
      }
      break;
    }
    case kAdd: {
      int64_t result = 0;
      std::string error = data_.add(key, decodeI64(value.data()), &result);
      if (!error.empty()) {
        replyFromLoop(c, kFailed, id, error);
      } else {
        many_answers_.clear();
        replyFromLoop(c, kOk, id, encodeI64(result));
        releaseWaitersFromLoop(key);
      }
      break;
    }
    case kGetMany:
      startManyFromLoop(conn_id, c, id, value);
      break;
    case kCancel: {
      if (auto many = many_.find({conn_id, id}); many != many_.end()) {
        dropManyFromLoop(many);
        break;
      }
      auto it = waiters_.find(key);
      if (it == waiters_.end()) break;  // answered already: the client drops the late reply
      size_t erased =
          std::erase_if(it->second, [&](const Waiter& w) { return w.conn == conn_id && w.id == id; });
      c.waiting_gets -= static_cast<int>(erased);
      if (it->second.empty()) waiters_.erase(it);
      break;
    }
    default:
      DDL_ASSERT(false);  // readFromLoop lets only known ops through
  }
}

void TcpStoreServerImpl::replyFromLoop(Conn& c, uint8_t status, uint32_t id, std::string_view payload) {
  auto frame = std::make_shared<std::string>();
  frame->push_back(static_cast<char>(status));
  putU32(frame.get(), id);
  putU32(frame.get(), static_cast<uint32_t>(payload.size()));
  frame->append(payload);
  c.out_bytes += frame->size();
  c.out.push_back(std::move(frame));
}

void TcpStoreServerImpl::replyFromLoop(Conn& c, uint8_t status, uint32_t id,
                                       std::shared_ptr<const std::string> payload) {
  auto head = std::make_shared<std::string>();
  head->push_back(static_cast<char>(status));
  putU32(head.get(), id);
  putU32(head.get(), static_cast<uint32_t>(payload->size()));
  c.out_bytes += head->size() + payload->size();
  c.out.push_back(std::move(head));
  if (!payload->empty()) c.out.push_back(std::move(payload));
}

void TcpStoreServerImpl::releaseWaitersFromLoop(const std::string& key) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::vector<Waiter> waiters = std::move(it->second);
  waiters_.erase(it);
  const std::string* found = data_.find(key);
  DDL_ASSERT(found != nullptr);  // called right after the key was set
  const std::string& value = *found;
  for (const Waiter& w : waiters) {
    auto conn = conns_.find(w.conn);
    if (conn == conns_.end() || conn->second.dead) continue;
    if (w.many) {
      // Its entry here is gone with the others; stepping it queues it on its next missing key, if any.
      if (auto many = many_.find({w.conn, w.id}); many != many_.end()) stepManyFromLoop(many);
      continue;
    }
    --conn->second.waiting_gets;
    replyFromLoop(conn->second, kOk, w.id, value);
  }
}

void TcpStoreServerImpl::startManyFromLoop(uint64_t conn_id, Conn& c, uint32_t id, std::string_view value) {
  uint32_t wait_ms = 0;
  std::vector<std::string_view> keys;
  const bool well_formed = decodeGetMany(value, &wait_ms, &keys);
  DDL_ASSERT(well_formed);  // parseStoreFrame lets only well-formed lists through
  if (c.waiting_many >= kMaxWaitingMany || many_.count({conn_id, id}) != 0) {
    c.dead = true;  // a client leaking GETMANYs, or reusing an id: not libddl's
    return;
  }
  ManyGet m;
  m.keys.assign(keys.begin(), keys.end());
  m.deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
  ++c.waiting_many;
  stepManyFromLoop(many_.emplace(ManyId{conn_id, id}, std::move(m)).first);
}

void TcpStoreServerImpl::stepManyFromLoop(std::map<ManyId, ManyGet>::iterator it) {
  ManyGet& m = it->second;
  while (m.next < m.keys.size() && data_.find(m.keys[m.next]) != nullptr) ++m.next;
  if (m.next < m.keys.size()) {
    waiters_[m.keys[m.next]].push_back({it->first.first, it->first.second, true});
    return;
  }
  auto conn = conns_.find(it->first.first);
  DDL_ASSERT(conn != conns_.end());  // a closing connection's GETMANYs are forgotten with it
  std::vector<const std::string*> values;
  values.reserve(m.keys.size());
  size_t bytes = 4;
  for (const std::string& key : m.keys) {
    values.push_back(data_.find(key));
    bytes += 4 + values.back()->size();
  }
  if (bytes > kMaxManyReplyBytes) {
    replyFromLoop(conn->second, kFailed, it->first.second,
                  "the values of the " + std::to_string(m.keys.size()) + " keys asked for at once come to " +
                      std::to_string(bytes) + " bytes, more than one answer carries (" +
                      std::to_string(kMaxManyReplyBytes) + "): ask for fewer keys at a time");
  } else {
    replyFromLoop(conn->second, kOk, it->first.second, manyAnswerFromLoop(m.keys, values));
  }
  --conn->second.waiting_many;
  many_.erase(it);
}

std::shared_ptr<const std::string> TcpStoreServerImpl::manyAnswerFromLoop(
    const std::vector<std::string>& keys, const std::vector<const std::string*>& values) {
  many_answers_used_ = Clock::now();
  for (const ManyAnswer& a : many_answers_) {
    if (a.keys.size() == keys.size() && a.keys.front() == keys.front() && a.keys == keys) return a.answer;
  }
  auto answer = std::make_shared<const std::string>(encodeValues(values));
  size_t held = answer->size();
  for (const ManyAnswer& a : many_answers_) held += a.answer->size();
  while (!many_answers_.empty() && (many_answers_.size() >= kMaxManyAnswers || held > kMaxManyAnswerBytes)) {
    held -= many_answers_.front().answer->size();
    many_answers_.erase(many_answers_.begin());
  }
  many_answers_.push_back({keys, answer});
  return answer;
}

void TcpStoreServerImpl::dropManyFromLoop(std::map<ManyId, ManyGet>::iterator it) {
  const ManyGet& m = it->second;
  if (m.next < m.keys.size()) {
    auto w = waiters_.find(m.keys[m.next]);
    if (w != waiters_.end()) {
      std::erase_if(w->second, [&](const Waiter& x) {
        return x.many && x.conn == it->first.first && x.id == it->first.second;
      });
      if (w->second.empty()) waiters_.erase(w);
    }
  }
  if (auto conn = conns_.find(it->first.first); conn != conns_.end()) --conn->second.waiting_many;
  many_.erase(it);
}

void TcpStoreServerImpl::expireManyFromLoop(Clock::time_point now) {
  if (!many_answers_.empty() && now >= many_answers_used_ + kManyAnswerIdle) many_answers_.clear();
  for (auto it = many_.begin(); it != many_.end();) {
    auto next = std::next(it);
    if (it->second.deadline <= now) {
      const ManyGet& m = it->second;
      auto conn = conns_.find(it->first.first);
      if (conn != conns_.end() && !conn->second.dead) {
        uint32_t missing = 0;
        for (size_t i = m.next; i < m.keys.size(); ++i) missing += data_.find(m.keys[i]) == nullptr;
        std::string payload;
        putU32(&payload, missing);
        payload += m.keys[m.next];
        replyFromLoop(conn->second, kTimedOut, it->first.second, payload);
      }
      dropManyFromLoop(it);
    }
    it = next;
  }
}

void TcpStoreServerImpl::flushFromLoop(Conn& c) {
  while (!c.out.empty()) {
    const std::string& front = *c.out.front();
    if (c.out_sent == front.size()) {
      c.out.pop_front();
      c.out_sent = 0;
      continue;
    }
    ssize_t n = ::send(c.fd.get(), front.data() + c.out_sent, front.size() - c.out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      c.out_sent += static_cast<size_t>(n);
      c.out_bytes -= static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      return;  // the loop polls for POLLOUT
    } else {
      c.dead = true;
      return;
    }
  }
  c.out_sent = 0;
}

void TcpStoreServerImpl::forgetWaitersFromLoop(uint64_t conn_id) {
  for (auto it = many_.lower_bound({conn_id, 0}); it != many_.end() && it->first.first == conn_id;) {
    it = many_.erase(it);  // their waiters_ entries go below
  }
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    std::erase_if(it->second, [&](const Waiter& w) { return w.conn == conn_id; });
    it = it->second.empty() ? waiters_.erase(it) : std::next(it);
  }
}

// -----------------------------------------------------------------------------------------------------------
// Client

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

std::unique_ptr<TcpStoreServer> startTcpStoreServer(const std::string& host, int port, const std::string& secret,
                                                    const TcpStoreHandshakeLimits& limits,
                                                    const StoreLimits& store_limits) {
  return std::make_unique<TcpStoreServerImpl>(host, port, secret, limits, store_limits);
}

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
