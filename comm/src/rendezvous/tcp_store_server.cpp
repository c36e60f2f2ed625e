// TcpStoreServer (store.h): rank 0's side of the TCP rendezvous store. The wire format and the admission
// handshake are tcp_store.cpp's; the parsing of frames and the bounded data, store_protocol.h's.
//
// Server threads: the constructor and destructor run on the caller's thread; everything else (accepting,
// reading, answering, releasing waiting GETs) runs on one background thread in a poll() loop over the
// listening socket, the clients and a self-pipe that the destructor writes to stop it. Methods named
// ...FromLoop run only on that thread and own the store's state without locks.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
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

// A client with this many unsent reply bytes is not read from until it drains them (backpressure).
constexpr size_t kMaxUnsentBytes = 64 * 1024 * 1024;
constexpr size_t kMaxManyAnswers = 16;                     // answers kept for reuse (see many_answers_)
constexpr size_t kMaxManyAnswerBytes = size_t{256} << 20;  // and their bytes, together
constexpr std::chrono::seconds kManyAnswerIdle{10};        // dropped when none was asked for in this long
// GETs one connection may have waiting at once; an honest client has one per calling thread.
constexpr int kMaxWaitingGets = 1024;
// GETMANYs one connection may have waiting at once (each holds up to kMaxManyRequestBytes of keys); the
// bootstrap has one.
constexpr int kMaxWaitingMany = 16;

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

}  // namespace

std::unique_ptr<TcpStoreServer> startTcpStoreServer(const std::string& host, int port, const std::string& secret,
                                                    const TcpStoreHandshakeLimits& limits,
                                                    const StoreLimits& store_limits) {
  return std::make_unique<TcpStoreServerImpl>(host, port, secret, limits, store_limits);
}

}  // namespace ddl
