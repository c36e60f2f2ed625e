// Tests of the rendezvous stores: MemoryStore, and TcpStore against a TcpStoreServer on a loopback port.
// Covers waiting and timeouts, many clients and threads at once, a client that starts before its server, a
// server that goes away under a waiting client, and garbage on the server's port. Time bounds are loose (they
// catch hangs, not slowness); every wait is bounded by a deadline so a broken store fails the test instead of
// hanging.
#include "rendezvous/store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "error.h"

namespace ddl {
namespace {

using std::chrono::milliseconds;

int64_t msSince(Clock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - start).count();
}

// A port nobody listens on right now: bind port 0, read it, close.
int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// Runs fn(i) on n threads and returns the messages of the exceptions they threw.
std::vector<std::string> runThreads(int n, const std::function<void(int)>& fn) {
  std::mutex mu;
  std::vector<std::string> errors;
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back("thread " + std::to_string(i) + ": " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Expects fn to throw ddl::Error with code, and returns its message.
std::string expectError(ddlResult_t code, const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected ddl::Error with code " << code;
  return "";
}

// --- MemoryStore
// --------------------------------------------------------------------------------------------

TEST(MemoryStore, SetGetAdd) {
  auto store = makeMemoryStore();
  store->set("a", "1");
  EXPECT_EQ(store->get("a", Deadline(1000)), "1");
  store->set("a", "two");  // overwrites
  EXPECT_EQ(store->get("a", Deadline(1000)), "two");
  store->set("empty", "");
  EXPECT_EQ(store->get("empty", Deadline(1000)), "");
  EXPECT_EQ(store->add("n", 5), 5);  // missing = 0
  EXPECT_EQ(store->add("n", -7), -2);
  EXPECT_EQ(store->get("n", Deadline(1000)), "-2");  // counters are decimal strings
}

TEST(MemoryStore, AddRejectsNonIntegerAndOverflow) {
  auto store = makeMemoryStore();
  store->set("s", "abc");
  std::string msg = expectError(ddlInvalidArgument, [&] { store->add("s", 1); });
  EXPECT_NE(msg.find("'s'"), std::string::npos) << msg;
  EXPECT_EQ(store->get("s", Deadline(1000)), "abc");
  store->add("big", INT64_MAX);
  expectError(ddlInvalidArgument, [&] { store->add("big", 1); });
  EXPECT_EQ(store->get("big", Deadline(1000)), std::to_string(INT64_MAX));
}

TEST(MemoryStore, GetWaitsForLaterSet) {
  auto store = makeMemoryStore();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    store->set("late", "here");
  });
  auto start = Clock::now();
  EXPECT_EQ(store->get("late", Deadline(10000)), "here");
  EXPECT_GE(msSince(start), 50);
  setter.join();
}

TEST(MemoryStore, GetTimesOut) {
  auto store = makeMemoryStore();
  auto start = Clock::now();
  std::string msg = expectError(ddlTimeout, [&] { store->get("never", Deadline(200)); });
  int64_t elapsed = msSince(start);
  EXPECT_GE(elapsed, 150);
  EXPECT_LE(elapsed, 5000);
  EXPECT_NE(msg.find("'never'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("200 ms"), std::string::npos) << msg;
}

TEST(MemoryStore, ConcurrentAdds) {
  auto store = makeMemoryStore();
  auto errors = runThreads(8, [&](int) {
    for (int i = 0; i < 100; ++i) store->add("counter", 1);
  });
  EXPECT_TRUE(errors.empty()) << errors[0];
  EXPECT_EQ(store->get("counter", Deadline(1000)), "800");
}

// --- parseHostPort
// ------------------------------------------------------------------------------------------

TEST(ParseHostPort, Good) {
  struct Case {
    const char* addr;
    const char* host;
    int port;
  };
  for (const Case& c :
       {Case{"localhost:29500", "localhost", 29500}, Case{"10.0.0.1:1", "10.0.0.1", 1},
        Case{"node-7.cluster.local:65535", "node-7.cluster.local", 65535}, Case{"[::1]:8080", "::1", 8080},
        Case{"[fe80::1%eth0]:80", "fe80::1%eth0", 80}, Case{"host:0", "host", 0}}) {
    std::string host;
    int port = -1;
    parseHostPort(c.addr, &host, &port);
    EXPECT_EQ(host, c.host) << c.addr;
    EXPECT_EQ(port, c.port) << c.addr;
  }
}

TEST(ParseHostPort, Bad) {
  for (const char* addr : {"", "host", "host:", ":29500", "host:abc", "host:12x", "host:65536", "host:-1",
                           "host:+80", "host: 80", "host:99999999999999999999", "[::1]", "[::1]:", "[::1:80",
                           "[]:80", "[::1]x:80", "::1:80", "a b:80"}) {
    std::string host = "unchanged";
    int port = -1;
    std::string msg = expectError(ddlInvalidArgument, [&] { parseHostPort(addr, &host, &port); });
    EXPECT_NE(msg.find("invalid rendezvous address '" + std::string(addr) + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("host:port"), std::string::npos) << msg;
    EXPECT_EQ(host, "unchanged");
    EXPECT_EQ(port, -1);
  }
}

// --- TcpStore
// -----------------------------------------------------------------------------------------------

std::unique_ptr<Store> connectLocal(int port) {
  return connectTcpStore("127.0.0.1", port, Deadline(10000), "");
}

TEST(TcpStore, SetGetAdd) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  ASSERT_GT(server->port(), 0);
  auto store = connectLocal(server->port());
  store->set("a", "1");
  EXPECT_EQ(store->get("a", Deadline(5000)), "1");
  store->set("a", "two");
  EXPECT_EQ(store->get("a", Deadline(5000)), "two");
  store->set("empty", "");
  EXPECT_EQ(store->get("empty", Deadline(5000)), "");
  std::string binary("\0\xff\n:x", 5);
  store->set(binary, binary);
  EXPECT_EQ(store->get(binary, Deadline(5000)), binary);
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -7), -2);
  EXPECT_EQ(store->get("n", Deadline(5000)), "-2");
  store->set("forty", "40");
  EXPECT_EQ(store->add("forty", 2), 42);  // add works on a value set as text
  // Another client sees the same data.
  auto other = connectTcpStore("localhost", server->port(), Deadline(10000), "");
  EXPECT_EQ(other->get("a", Deadline(5000)), "two");
  EXPECT_EQ(other->add("n", 0), -2);
}

TEST(TcpStore, AddToNonIntegerFailsAndConnectionStaysUsable) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto store = connectLocal(server->port());
  store->set("s", "abc");
  std::string msg = expectError(ddlInvalidArgument, [&] { store->add("s", 1); });
  EXPECT_NE(msg.find("'s'"), std::string::npos) << msg;
  store->add("big", INT64_MAX);
  expectError(ddlInvalidArgument, [&] { store->add("big", 1); });
  EXPECT_EQ(store->get("s", Deadline(5000)), "abc");
  EXPECT_EQ(store->add("ok", 3), 3);
}

TEST(TcpStore, LargeValueRoundTrip) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto writer = connectLocal(server->port());
  auto reader = connectLocal(server->port());
  std::string value(4 * 1024 * 1024 + 17, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 131 + (i >> 12));
  std::thread t([&] { writer->set("blob", value); });
  EXPECT_EQ(reader->get("blob", Deadline(10000)), value);  // likely deferred, then sent in many pieces
  t.join();
  EXPECT_EQ(writer->get("blob", Deadline(10000)), value);
}

TEST(TcpStore, OversizedKeyOrValueRejected) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto store = connectLocal(server->port());
  expectError(ddlInvalidArgument, [&] { store->set(std::string(64 * 1024 + 1, 'k'), "v"); });
  expectError(ddlInvalidArgument, [&] { store->set("k", std::string(16 * 1024 * 1024 + 1, 'v')); });
  store->set("k", "v");  // the connection is unaffected
  EXPECT_EQ(store->get("k", Deadline(5000)), "v");
}

TEST(TcpStore, ConcurrentClients) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  const int kThreads = 8;
  auto errors = runThreads(kThreads, [&](int rank) {
    auto store = connectLocal(server->port());
    store->set("rank" + std::to_string(rank), "addr-of-" + std::to_string(rank));
    for (int i = 0; i < 100; ++i) store->add("counter", 1);
    for (int peer = 0; peer < kThreads; ++peer) {
      std::string got = store->get("rank" + std::to_string(peer), Deadline(10000));
      if (got != "addr-of-" + std::to_string(peer)) throw std::runtime_error("wrong value " + got);
    }
  });
  EXPECT_TRUE(errors.empty()) << errors[0];
  auto store = connectLocal(server->port());
  EXPECT_EQ(store->get("counter", Deadline(5000)), "800");
}

TEST(TcpStore, ThreadsShareOneClient) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto store = connectLocal(server->port());
  // Thread 0 waits on a key that thread 1 sets later through the same connection: a get() in progress must
  // not block other calls on its client.
  auto errors = runThreads(8, [&](int t) {
    if (t == 0) {
      if (store->get("late", Deadline(10000)) != "ok") throw std::runtime_error("wrong value");
    }
    for (int i = 0; i < 100; ++i) {
      store->add("counter", 1);
      store->set("t" + std::to_string(t), std::to_string(i));
      if (store->get("t" + std::to_string(t), Deadline(10000)) != std::to_string(i)) {
        throw std::runtime_error("wrong value");
      }
    }
    if (t == 1) store->set("late", "ok");
  });
  EXPECT_TRUE(errors.empty()) << errors[0];
  EXPECT_EQ(store->get("counter", Deadline(5000)), "800");
}

TEST(TcpStore, DeferredGetsReleasedBySetFromAnotherClient) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  std::atomic<int> waiting{0};
  std::thread setter([&] {
    auto store = connectLocal(server->port());
    for (int i = 0; i < 500 && waiting.load() < 4; ++i) std::this_thread::sleep_for(milliseconds(10));
    std::this_thread::sleep_for(milliseconds(100));  // let the gets reach the server
    store->set("go", "now");
  });
  auto errors = runThreads(4, [&](int) {
    auto store = connectLocal(server->port());
    ++waiting;
    if (store->get("go", Deadline(10000)) != "now") throw std::runtime_error("wrong value");
  });
  setter.join();
  EXPECT_TRUE(errors.empty()) << errors[0];
}

TEST(TcpStore, GetTimesOutAndConnectionStaysUsable) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto store = connectLocal(server->port());
  auto start = Clock::now();
  std::string msg = expectError(ddlTimeout, [&] { store->get("missing", Deadline(200)); });
  int64_t elapsed = msSince(start);
  EXPECT_GE(elapsed, 150);
  EXPECT_LE(elapsed, 5000);
  EXPECT_NE(msg.find("'missing'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("200 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(server->port())), std::string::npos) << msg;
  // Setting the key now must not confuse the connection with an answer to the abandoned get.
  store->set("missing", "found");
  EXPECT_EQ(store->get("missing", Deadline(5000)), "found");
  EXPECT_EQ(store->add("count", 2), 2);
  EXPECT_EQ(store->get("count", Deadline(5000)), "2");
}

TEST(TcpStore, ConnectRetriesUntilServerStarts) {
  int port = freePort();
  std::unique_ptr<Store> client;
  std::string error;
  auto start = Clock::now();
  std::thread t([&] {
    try {
      client = connectTcpStore("127.0.0.1", port, Deadline(10000), "");
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(300));
  std::unique_ptr<TcpStoreServer> server;
  try {
    server = startTcpStoreServer("127.0.0.1", port, "");
  } catch (const Error& e) {
    t.join();
    GTEST_SKIP() << "another process took port " << port << " meanwhile: " << e.what();
  }
  t.join();
  ASSERT_TRUE(client) << error;
  EXPECT_GE(msSince(start), 250);
  client->set("k", "v");
  EXPECT_EQ(client->get("k", Deadline(5000)), "v");
}

TEST(TcpStore, UnreachableServerTimesOut) {
  int port = freePort();
  auto start = Clock::now();
  std::string msg = expectError(ddlTimeout, [&] { connectTcpStore("127.0.0.1", port, Deadline(300), ""); });
  int64_t elapsed = msSince(start);
  EXPECT_GE(elapsed, 250);
  EXPECT_LE(elapsed, 5000);
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("300 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Connection refused"), std::string::npos) << msg;
}

TEST(TcpStore, BadConnectArguments) {
  expectError(ddlInvalidArgument, [] { connectTcpStore("127.0.0.1", 0, Deadline(1000), ""); });
  expectError(ddlInvalidArgument, [] { connectTcpStore("", 29500, Deadline(1000), ""); });
  expectError(ddlInvalidArgument, [] { connectTcpStore("127.0.0.1", 70000, Deadline(1000), ""); });
}

TEST(TcpStore, UnresolvableHost) {
  // NXDOMAIN fails at once (ddlInvalidArgument); a resolver that cannot answer is retried until the deadline.
  try {
    connectTcpStore("no-such-host.invalid", 29500, Deadline(2000), "");
    ADD_FAILURE() << "connected to no-such-host.invalid";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ddlInvalidArgument || e.code() == ddlTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, PortInUse) {
  auto first = startTcpStoreServer("127.0.0.1", 0, "");
  int port = first->port();
  std::string msg = expectError(ddlSystemError, [&] { startTcpStoreServer("127.0.0.1", port, ""); });
  EXPECT_NE(msg.find("port " + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("Address already in use"), std::string::npos) << msg;
  expectError(ddlInvalidArgument, [] { startTcpStoreServer("127.0.0.1", 65536, ""); });
}

TEST(TcpStore, ServerDestroyedWhileClientWaits) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto store = connectLocal(server->port());
  store->set("warm", "up");  // the connection is established and served
  std::string msg;
  ddlResult_t code = ddlSuccess;
  Clock::time_point destroyed;
  std::thread waiter([&] {
    try {
      store->get("never", Deadline(30000));
    } catch (const Error& e) {
      code = e.code();
      msg = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(100));
  destroyed = Clock::now();
  server.reset();  // must join its thread promptly
  EXPECT_LE(msSince(destroyed), 5000);
  waiter.join();
  EXPECT_LE(msSince(destroyed), 5000) << "the waiting client noticed late";
  EXPECT_EQ(code, ddlRemoteError) << msg;
  EXPECT_NE(msg.find("closed the connection"), std::string::npos) << msg;
  // Later calls fail the same way at once.
  expectError(ddlRemoteError, [&] { store->set("k", "v"); });
}

TEST(TcpStore, ServerGoneBeforeRequest) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto store = connectLocal(server->port());
  server.reset();
  auto start = Clock::now();
  std::string msg = expectError(ddlRemoteError, [&] { store->add("k", 1); });
  EXPECT_LE(msSince(start), 5000);
  EXPECT_NE(msg.find("closed the connection"), std::string::npos) << msg;
}

// Reads exactly n bytes from a blocking socket with a receive timeout; false on EOF, error or timeout.
bool recvExactly(int fd, size_t n, std::string* out) {
  out->assign(n, '\0');
  size_t got = 0;
  while (got < n) {  // bounded: every recv waits at most the socket's receive timeout
    ssize_t r = ::recv(fd, out->data() + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

uint32_t u32At(const std::string& s, size_t at) {
  uint32_t n;
  std::memcpy(&n, s.data() + at, 4);
  return ntohl(n);
}

// A raw socket to the server, for speaking bad protocol.
class RawClient {
 public:
  explicit RawClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    timeval tv{10, 0};  // no read below can hang the test
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  ~RawClient() { close(); }
  bool connected() const { return connected_; }
  void send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
  }
  // One reply frame: u8 status, u32 id, u32 length, payload. False if the connection ended or 10 s passed.
  bool readReply(uint8_t* status, uint32_t* id, std::string* payload) {
    std::string header;
    if (!recvExactly(fd_, 9, &header)) return false;
    *status = static_cast<uint8_t>(header[0]);
    *id = u32At(header, 1);
    return recvExactly(fd_, u32At(header, 5), payload);
  }
  // True while the server has neither closed the connection nor sent anything for wait_ms.
  bool quietFor(int wait_ms) {
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, wait_ms) == 0;
  }
  // True when the server closes the connection within timeout_ms (replies before that are skipped).
  bool closedByServer(int timeout_ms) {
    auto deadline = Deadline(timeout_ms);
    while (!deadline.expired()) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(deadline.remainingMs())) <= 0) continue;
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;
    }
    return false;
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
};

std::string frame(uint8_t op, uint32_t id, const std::string& key, const std::string& value) {
  std::string s(1, static_cast<char>(op));
  for (uint32_t v : {id, static_cast<uint32_t>(key.size()), static_cast<uint32_t>(value.size())}) {
    uint32_t n = htonl(v);
    s.append(reinterpret_cast<const char*>(&n), 4);
  }
  return s + key + value;
}

TEST(TcpStore, GarbageClientsAreDroppedOthersUnaffected) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto good = connectLocal(server->port());
  good->set("before", "1");
  // A well-formed SET from a raw client works (checks this test's framing) ...
  {
    RawClient raw(server->port());
    ASSERT_TRUE(raw.connected());
    raw.send(frame(1, 7, "raw", "ok"));
    EXPECT_EQ(good->get("raw", Deadline(5000)), "ok");
  }
  // ... and each kind of garbage gets its sender disconnected.
  const std::string kGarbage[] = {
      "GET / HTTP/1.1\r\nHost: x\r\n\r\n",                      // an unknown op
      frame(1, 1, "k", "v").replace(5, 4, "\xff\xff\xff\xff"),  // a 4 GiB key
      frame(1, 1, "k", "v").replace(9, 4, "\x7f\xff\xff\xff"),  // a 2 GiB value
      frame(3, 1, "k", "abc"),                                  // an ADD whose delta is not 8 bytes
      frame(2, 1, "k", "v"),                                    // a GET with a value
      std::string(13, '\0'),                                    // op 0
  };
  for (const std::string& garbage : kGarbage) {
    RawClient raw(server->port());
    ASSERT_TRUE(raw.connected());
    raw.send(garbage);
    EXPECT_TRUE(raw.closedByServer(5000)) << "server kept a client that sent garbage";
    good->set("k", "v");
    EXPECT_EQ(good->get("before", Deadline(5000)), "1");
  }
  // Half a frame, then a hang-up; and a GET left waiting by a client that leaves.
  {
    RawClient half(server->port());
    half.send(frame(1, 1, "half", "value").substr(0, 15));
    RawClient leaver(server->port());
    leaver.send(frame(2, 1, "orphan", ""));
    std::this_thread::sleep_for(milliseconds(50));
  }
  std::this_thread::sleep_for(milliseconds(50));
  good->set("orphan", "x");  // answers no one: the waiting client is gone
  EXPECT_EQ(good->get("orphan", Deadline(5000)), "x");
  EXPECT_EQ(good->add("after", 1), 1);
  auto late = connectLocal(server->port());
  EXPECT_EQ(late->get("before", Deadline(5000)), "1");
}

// --- Admission: the job's secret
// -----------------------------------------------------------------------------------------

const std::string kSecret = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

std::unique_ptr<Store> connectWith(int port, const std::string& secret, int64_t timeout_ms = 10000) {
  return connectTcpStore("127.0.0.1", port, Deadline(timeout_ms), secret);
}

std::string randomBytes(size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(std::rand());
  return s;
}

TEST(TcpStoreSecret, HoldersOfTheSecretAreServed) {
  auto server = startTcpStoreServer("127.0.0.1", 0, kSecret);
  auto a = connectWith(server->port(), kSecret);
  auto b = connectWith(server->port(), kSecret);
  a->set("addr/0", "x");
  EXPECT_EQ(b->get("addr/0", Deadline(5000)), "x");
  EXPECT_EQ(b->add("joined", 1), 1);
  EXPECT_EQ(a->add("joined", 1), 2);
  // The secret is opaque: any bytes but NUL, up to 4096 of them.
  std::string odd(kMaxJobSecretBytes, 'x');
  for (size_t i = 0; i < odd.size(); ++i) odd[i] = static_cast<char>(1 + i % 255);
  auto server2 = startTcpStoreServer("127.0.0.1", 0, odd);
  connectWith(server2->port(), odd)->set("k", "v");
  expectError(ddlInvalidArgument, [&] { startTcpStoreServer("127.0.0.1", 0, odd + "x"); });
  expectError(ddlInvalidArgument, [&] { connectWith(server2->port(), odd + "x"); });
}

TEST(TcpStoreSecret, WrongSecretIsRefusedAndOthersAreUnaffected) {
  auto server = startTcpStoreServer("127.0.0.1", 0, kSecret);
  auto good = connectWith(server->port(), kSecret);
  good->set("before", "1");
  const auto start = Clock::now();
  std::string msg = expectError(ddlInvalidArgument, [&] { connectWith(server->port(), kSecret + "0"); });
  EXPECT_LE(msSince(start), 5000) << "a refusal must not wait for the deadline";
  EXPECT_NE(msg.find("rendezvous store at 127.0.0.1:" + std::to_string(server->port()) +
                     " refused this rank: wrong DDL_JOB_SECRET (is this rank part of the job?)"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find(kSecret), std::string::npos) << "no message may show the secret: " << msg;
  EXPECT_EQ(good->get("before", Deadline(5000)), "1");
  EXPECT_EQ(connectWith(server->port(), kSecret)->add("after", 1), 1);
}

TEST(TcpStoreSecret, ClientWithoutTheSecretIsRefusedOnItsFirstRequest) {
  auto server = startTcpStoreServer("127.0.0.1", 0, kSecret);
  for (int request = 0; request < 3; ++request) {  // add, set, and a get of a key that is never set
    auto open = connectWith(server->port(), "");
    std::string msg = expectError(ddlInvalidArgument, [&] {
      if (request == 0) open->add("joined/0", 1);
      if (request == 1) open->set("k", "v");
      if (request == 2) open->get("never", Deadline(20000));
    });
    EXPECT_NE(
        msg.find("rendezvous store at 127.0.0.1:" + std::to_string(server->port()) +
                 " refused this rank: it admits only holders of the job's secret, and DDL_JOB_SECRET is "
                 "not set here"),
        std::string::npos)
        << msg;
  }
  auto good = connectWith(server->port(), kSecret);
  EXPECT_EQ(good->add("joined/0", 1), 1) << "the refused ADD must not have been applied";
}

// A store without a secret cannot prove one: a rank that has the job's secret does not trust it.
TEST(TcpStoreSecret, OpenStoreDoesNotSatisfyAClientWithASecret) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  std::string msg = expectError(ddlRemoteError, [&] { connectWith(server->port(), kSecret); });
  EXPECT_NE(msg.find("did not prove the job's secret: it has none"), std::string::npos) << msg;
  connectWith(server->port(), "")->set("k", "v");  // and the open store still serves
}

// A process posing as the store: accepts one connection on a loopback port and runs `act` on it.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd)> act) {
    listen_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    EXPECT_EQ(::bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listen_, 8), 0);
    ::getsockname(listen_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this, act = std::move(act)] {
      pollfd p{listen_, POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return;
      int fd = ::accept(listen_, nullptr, nullptr);
      if (fd < 0) return;
      timeval tv{10, 0};  // no read can hang the test
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      act(fd);
      ::close(fd);
    });
  }
  ~FakeServer() {
    thread_.join();
    ::close(listen_);
  }
  int port() const { return port_; }

 private:
  int listen_ = -1;
  int port_ = 0;
  std::thread thread_;
};

std::string replyFrame(uint8_t status, uint32_t id, const std::string& payload) {
  std::string s(1, static_cast<char>(status));
  for (uint32_t v : {id, static_cast<uint32_t>(payload.size())}) {
    uint32_t n = htonl(v);
    s.append(reinterpret_cast<const char*>(&n), 4);
  }
  return s + payload;
}

void sendAll(int fd, const std::string& bytes) { ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL); }

// Plays the handshake as far as the client's proof and answers it with answer(proof).
std::function<void(int)> fakeHandshake(std::function<std::string(const std::string& proof)> answer) {
  return [answer](int fd) {
    std::string hello, proof;
    if (!recvExactly(fd, 13 + 32, &hello)) return;
    sendAll(fd, replyFrame(0, 0, randomBytes(32)));
    if (!recvExactly(fd, 13 + 32, &proof)) return;
    sendAll(fd, replyFrame(0, 0, answer(proof.substr(13))));
    std::string rest;
    recvExactly(fd, 1, &rest);  // until the client hangs up
  };
}

TEST(TcpStoreSecret, FakeServerThatAcceptsAnyProofIsDetected) {
  FakeServer fake(fakeHandshake([](const std::string&) { return randomBytes(32); }));
  std::string msg = expectError(ddlRemoteError, [&] { connectWith(fake.port(), kSecret); });
  EXPECT_NE(msg.find("rendezvous store at 127.0.0.1:" + std::to_string(fake.port()) +
                     " did not prove the job's secret (another process on DDL_ROOT's port?)"),
            std::string::npos)
      << msg;
}

// The server's proof is not the client's: a fake that sends the client's own proof back is caught.
TEST(TcpStoreSecret, FakeServerThatReflectsTheClientsProofIsDetected) {
  FakeServer fake(fakeHandshake([](const std::string& proof) { return proof; }));
  std::string msg = expectError(ddlRemoteError, [&] { connectWith(fake.port(), kSecret); });
  EXPECT_NE(msg.find("did not prove the job's secret (another process on DDL_ROOT's port?)"),
            std::string::npos)
      << msg;
}

TEST(TcpStoreSecret, FakeServerSpeakingAnotherProtocolIsDetected) {
  FakeServer fake([](int fd) {
    std::string hello;
    recvExactly(fd, 13 + 32, &hello);
    sendAll(fd, "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    recvExactly(fd, 1, &hello);
  });
  std::string msg = expectError(ddlRemoteError, [&] { connectWith(fake.port(), kSecret); });
  EXPECT_NE(msg.find("did not prove the job's secret: its answer is not libddl's handshake"),
            std::string::npos)
      << msg;
}

TEST(TcpStoreSecret, SilentFakeServerTimesOutNamingTheHandshake) {
  FakeServer fake([](int fd) {
    std::string rest;
    recvExactly(fd, 1 << 20, &rest);  // reads the hello, answers nothing, until the client hangs up
  });
  const auto start = Clock::now();
  std::string msg = expectError(ddlTimeout, [&] { connectWith(fake.port(), kSecret, 800); });
  EXPECT_LE(msSince(start), 5000);
  EXPECT_NE(msg.find("did not answer libddl's handshake"), std::string::npos) << msg;
}

// Strangers on the port (garbage, silence, a wrong proof, a request without the secret, a half handshake) are
// dropped or refused, and the real clients meanwhile see nothing of them.
TEST(TcpStoreSecret, StrangersAreDroppedWithoutDisturbingTheJob) {
  auto server = startTcpStoreServer("127.0.0.1", 0, kSecret, {/*timeout_ms=*/1500, /*max_pending=*/64});
  const int port = server->port();
  auto good = connectWith(port, kSecret);
  good->set("before", "1");

  RawClient silent(port), half(port), garbage(port), wrong_proof(port), no_secret(port);
  for (RawClient* c : {&silent, &half, &garbage, &wrong_proof, &no_secret}) ASSERT_TRUE(c->connected());
  half.send(frame(5, 0, "", randomBytes(32)).substr(0, 20));
  garbage.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
  // A SET announcing a 16 MiB value: refused on its header, the body never buffered.
  no_secret.send(frame(1, 42, "k", "").replace(9, 4, std::string("\x01\x00\x00\x00", 4)));
  wrong_proof.send(frame(5, 0, "", randomBytes(32)));
  uint8_t status = 0xff;
  uint32_t id = 0xffffffff;
  std::string payload;
  ASSERT_TRUE(wrong_proof.readReply(&status, &id, &payload));
  EXPECT_EQ(status, 0);  // the server's nonce
  EXPECT_EQ(payload.size(), 32u);
  wrong_proof.send(frame(6, 0, "", randomBytes(32)));

  // While they are all connected, ranks join and work.
  auto errors = runThreads(4, [&](int rank) {
    auto store = connectWith(port, kSecret);
    store->set("addr/" + std::to_string(rank), "a" + std::to_string(rank));
    for (int peer = 0; peer < 4; ++peer) {
      if (store->get("addr/" + std::to_string(peer), Deadline(10000)) != "a" + std::to_string(peer)) {
        throw std::runtime_error("wrong value");
      }
    }
  });
  EXPECT_TRUE(errors.empty()) << errors[0];

  ASSERT_TRUE(wrong_proof.readReply(&status, &id, &payload));
  EXPECT_EQ(status, 2) << "a wrong proof is refused";
  EXPECT_TRUE(wrong_proof.closedByServer(5000));
  ASSERT_TRUE(no_secret.readReply(&status, &id, &payload));
  EXPECT_EQ(status, 2) << "a request without the secret is refused";
  EXPECT_EQ(id, 42u);
  EXPECT_TRUE(no_secret.closedByServer(5000));
  EXPECT_TRUE(garbage.closedByServer(5000));
  // Silence and half a handshake end at the handshake deadline.
  EXPECT_TRUE(silent.closedByServer(10000)) << "a silent stranger kept its connection past the deadline";
  EXPECT_TRUE(half.closedByServer(10000));
  EXPECT_EQ(good->get("before", Deadline(5000)), "1");
  EXPECT_EQ(good->add("after", 1), 1);
}

// More strangers than the server keeps in the handshake: the oldest make way, and a rank still gets in.
TEST(TcpStoreSecret, StrangersCannotFillTheHandshakeSlots) {
  constexpr int kPending = 3;
  auto server = startTcpStoreServer("127.0.0.1", 0, kSecret, {/*timeout_ms=*/60000, /*max_pending=*/kPending});
  std::vector<std::unique_ptr<RawClient>> strangers;
  for (int i = 0; i < 2 * kPending; ++i) {
    strangers.push_back(std::make_unique<RawClient>(server->port()));
    ASSERT_TRUE(strangers.back()->connected());
    // One at a time, so the server accepts them in this order.
    std::this_thread::sleep_for(milliseconds(20));
  }
  for (int i = 0; i < kPending; ++i) {
    EXPECT_TRUE(strangers[i]->closedByServer(5000)) << "stranger " << i << " was not dropped for a newer one";
  }
  for (int i = kPending; i < 2 * kPending; ++i) EXPECT_TRUE(strangers[i]->quietFor(100)) << i;
  auto good = connectWith(server->port(), kSecret);
  good->set("k", "v");
  EXPECT_EQ(good->get("k", Deadline(5000)), "v");
  EXPECT_TRUE(strangers[kPending]->closedByServer(5000))
      << "the rank's connection took the oldest one's place";
}

// --- Bounds: the address the server listens on, and what it holds
// -----------------------------------------------------------------

// Fails without the fix: the server listened on 0.0.0.0, so a connection to 127.0.0.2 (another address of this
// host, also loopback on Linux) reached a store that DDL_ROOT put on 127.0.0.1.
TEST(TcpStoreBounds, ListensOnlyOnTheAddressItWasGiven) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto connectTo = [&](const char* ip) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server->port()));
    ::inet_pton(AF_INET, ip, &addr.sin_addr);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    int err = rc == 0 ? 0 : errno;
    ::close(fd);
    return err;
  };
  EXPECT_EQ(connectTo("127.0.0.1"), 0);
  EXPECT_EQ(connectTo("127.0.0.2"), ECONNREFUSED);
  auto store = connectLocal(server->port());
  store->set("k", "v");
  EXPECT_EQ(store->get("k", Deadline(5000)), "v");

  // A host name listens where it resolves ("localhost": a loopback address), and clients find it by name.
  auto named = startTcpStoreServer("localhost", 0, "");
  auto client = connectTcpStore("localhost", named->port(), Deadline(10000), "");
  client->set("k", "named");
  EXPECT_EQ(client->get("k", Deadline(5000)), "named");
  std::string msg = expectError(ddlInvalidArgument, [] { startTcpStoreServer("no-such-host.invalid", 0, ""); });
  EXPECT_NE(msg.find("no-such-host.invalid"), std::string::npos) << msg;
  // An address that is not this host's cannot be listened on; the message says what to check.
  msg = expectError(ddlSystemError, [] { startTcpStoreServer("192.0.2.1", 0, ""); });
  EXPECT_NE(msg.find("DDL_ROOT must name an address of rank 0's host"), std::string::npos) << msg;
}

TEST(StoreData, LimitsOnKeysBytesAndValues) {
  store_wire::StoreData data({/*max_keys=*/3, /*max_total_bytes=*/100, /*max_value_bytes=*/50});
  EXPECT_EQ(data.set("a", std::string(40, 'x')), "");
  EXPECT_EQ(data.totalBytes(), 41u);
  EXPECT_NE(data.set("b", std::string(51, 'x')).find("rendezvous store full: a value of 51 bytes"),
            std::string::npos);
  EXPECT_EQ(data.set("b", std::string(50, 'x')), "");  // 92 bytes with the keys
  EXPECT_NE(data.set("c", std::string(8, 'x')).find("rendezvous store full: storing 8 bytes at key 'c'"),
            std::string::npos);
  EXPECT_EQ(data.set("c", std::string(7, 'x')), "");  // 100 bytes: exactly the limit
  EXPECT_NE(data.set("d", "").find("rendezvous store full: it holds 3 keys"), std::string::npos);
  int64_t result = 0;
  EXPECT_NE(data.add("d", 1, &result).find("rendezvous store full"), std::string::npos);
  EXPECT_EQ(data.find("d"), nullptr);  // a failed ADD creates nothing
  // Overwriting counts the new size only.
  EXPECT_EQ(data.set("a", "1"), "");
  EXPECT_EQ(data.totalBytes(), 61u);
  EXPECT_EQ(data.add("a", 41, &result), "");
  EXPECT_EQ(result, 42);
  EXPECT_EQ(*data.find("a"), "42");
  EXPECT_EQ(data.keys(), 3u);
}

// /proc/self/status's VmRSS in KiB: a figure for the log, not an assertion.
long rssKiB() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

// Fails without the caps: all 30 SETs of 16 MiB succeeded and the store grew by 480 MiB.
TEST(TcpStoreBounds, AFullStoreFailsTheSetAndKeepsServing) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");  // the defaults: 64 MiB in all
  auto store = connectLocal(server->port());
  store->set("small", "1");
  const std::string value(16 * 1024 * 1024, 'v');
  const long before = rssKiB();
  int stored = 0;
  std::string last_error;
  for (int i = 0; i < 30; ++i) {
    try {
      store->set("big" + std::to_string(i), value);
      ++stored;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ddlInvalidArgument);
      last_error = e.what();
    }
  }
  const long after = rssKiB();
  std::printf("30 SETs of 16 MiB: %d stored, rss %ld -> %ld KiB (+%ld MiB)\n", stored, before, after,
              (after - before) / 1024);
  EXPECT_EQ(stored, 3);  // 3 x 16 MiB and the keys fit in 64 MiB, a fourth does not
  EXPECT_NE(last_error.find("rendezvous store full: storing 16777216 bytes at key 'big29' would pass its limit of "
                            "64 MiB in all"),
            std::string::npos)
      << last_error;
  // The server and this connection go on: reads, overwrites and new small keys still work.
  EXPECT_EQ(store->get("small", Deadline(5000)), "1");
  store->set("big0", "freed");
  store->set("after", "2");
  EXPECT_EQ(store->get("after", Deadline(5000)), "2");
  EXPECT_EQ(store->add("counter", 5), 5);
}

TEST(TcpStoreBounds, KeyCountLimitIsConfigurable) {
  StoreLimits limits;
  limits.max_keys = 10;
  auto server = startTcpStoreServer("127.0.0.1", 0, "", {}, limits);
  auto store = connectLocal(server->port());
  for (int i = 0; i < 10; ++i) store->set("k" + std::to_string(i), "v");
  std::string msg = expectError(ddlInvalidArgument, [&] { store->set("k10", "v"); });
  EXPECT_NE(msg.find("rendezvous store full: it holds 10 keys"), std::string::npos) << msg;
  msg = expectError(ddlInvalidArgument, [&] { store->add("n", 1); });
  EXPECT_NE(msg.find("rendezvous store full"), std::string::npos) << msg;
  EXPECT_EQ(store->get("k9", Deadline(5000)), "v");
}

// --- Multi-get: the bootstrap's gather
// -----------------------------------------------------------------------------------------

// The same checks for each store: values in the order asked (repeats, empty and binary values), a wait for keys
// set later by another client, and a timeout that names the first missing key and how many more are missing.
void checkGetMany(Store& a, Store& b, const std::string& where) {
  a.set("g/0", "zero");
  a.set("g/1", "");
  const std::string binary("\0\xff:", 3);
  a.set("g/2", binary);
  EXPECT_EQ(b.getMany({"g/2", "g/0", "g/1", "g/0"}, Deadline(5000)),
            (std::vector<std::string>{binary, "zero", "", "zero"}));
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(100));
    a.set("g/4", "four");
    std::this_thread::sleep_for(milliseconds(50));
    a.set("g/3", "three");
  });
  auto start = Clock::now();
  EXPECT_EQ(b.getMany({"g/0", "g/3", "g/4"}, Deadline(10000)), (std::vector<std::string>{"zero", "three", "four"}));
  EXPECT_GE(msSince(start), 100);
  setter.join();
  start = Clock::now();
  std::string msg = expectError(ddlTimeout, [&] { b.getMany({"g/0", "g/5", "g/1", "g/6", "g/7"}, Deadline(300)); });
  const int64_t elapsed = msSince(start);
  EXPECT_GE(elapsed, 250);
  EXPECT_LE(elapsed, 5000);
  EXPECT_NE(msg.find("300 ms waiting for key 'g/5' and 2 more"), std::string::npos) << msg;
  EXPECT_NE(msg.find(where), std::string::npos) << msg;
  // Setting them now must not confuse the store with an answer to the abandoned gather.
  a.set("g/5", "five");
  EXPECT_EQ(b.get("g/5", Deadline(5000)), "five");
  EXPECT_EQ(b.getMany({"g/5"}, Deadline(5000)), (std::vector<std::string>{"five"}));
}

TEST(MemoryStore, GetManyWaitsForEveryKeyAndNamesAMissingOne) {
  auto store = makeMemoryStore();
  checkGetMany(*store, *store, "in-memory store");
}

// Fails without TcpStore's own getMany: the default asks key by key and its timeout names one key only.
TEST(TcpStore, GetManyWaitsForEveryKeyAndNamesAMissingOne) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto a = connectLocal(server->port());
  auto b = connectLocal(server->port());
  checkGetMany(*a, *b, "127.0.0.1:" + std::to_string(server->port()));
  EXPECT_EQ(b->add("after", 1), 1);  // the connection is still in step
  // The server reuses its last answer only while nothing changed: a SET in between shows.
  a->set("c", "1");
  EXPECT_EQ(b->getMany({"c", "g/0"}, Deadline(5000)), (std::vector<std::string>{"1", "zero"}));
  EXPECT_EQ(a->getMany({"c", "g/0"}, Deadline(5000)), (std::vector<std::string>{"1", "zero"}));
  a->set("c", "2");
  EXPECT_EQ(b->getMany({"c", "g/0"}, Deadline(5000)), (std::vector<std::string>{"2", "zero"}));
  EXPECT_EQ(a->add("n", 3), 3);
  EXPECT_EQ(b->getMany({"n", "c"}, Deadline(5000)), (std::vector<std::string>{"3", "2"}));
  EXPECT_EQ(a->add("n", 1), 4);
  EXPECT_EQ(b->getMany({"n", "c"}, Deadline(5000)), (std::vector<std::string>{"4", "2"}));
}

// Many clients gather from one another at once, as ranks at bootstrap.
TEST(TcpStore, GetManyGathersAcrossClients) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  constexpr int kClients = 32;
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) keys.push_back("rec/" + std::to_string(i));
  auto errors = runThreads(kClients, [&](int i) {
    auto store = connectLocal(server->port());
    store->set(keys[i], std::string(static_cast<size_t>(i) * 100, static_cast<char>('a' + i % 26)));
    const std::vector<std::string> all = store->getMany(keys, Deadline(20000));
    if (all.size() != keys.size()) throw std::runtime_error("wrong count");
    for (int j = 0; j < kClients; ++j) {
      if (all[j] != std::string(static_cast<size_t>(j) * 100, static_cast<char>('a' + j % 26)))
        throw std::runtime_error("wrong value for " + keys[j]);
    }
  });
  EXPECT_TRUE(errors.empty()) << errors[0];
}

// A key list longer than one request takes (kMaxManyRequestBytes) goes as several, transparently.
TEST(TcpStore, GetManySplitsALongKeyList) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto store = connectLocal(server->port());
  std::vector<std::string> keys;
  for (int i = 0; i < 40; ++i) keys.push_back(std::to_string(i) + std::string(60 * 1024, 'k'));  // 2.4 MB of keys
  for (size_t i = 0; i < keys.size(); ++i) store->set(keys[i], std::to_string(i));
  const std::vector<std::string> values = store->getMany(keys, Deadline(10000));
  ASSERT_EQ(values.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) EXPECT_EQ(values[i], std::to_string(i));
  expectError(ddlInvalidArgument, [&] { store->getMany({std::string(store_wire::kMaxKeyBytes + 1, 'x')}, Deadline(1000)); });
}

// Answers are bounded too (kMaxManyReplyBytes, 64 MiB): a gather whose values come to more (here 9,000 records
// of 8 KiB, 72 MiB) still works, because the client asks in batches of keys.
TEST(TcpStore, GetManyOfMoreThanOneAnswerHoldsGoesInBatches) {
  StoreLimits roomy;
  roomy.max_total_bytes = 128 * 1024 * 1024;  // the default store holds 64 MiB in all
  auto server = startTcpStoreServer("127.0.0.1", 0, "", {}, roomy);
  auto store = connectLocal(server->port());
  std::vector<std::string> keys;
  for (int i = 0; i < 9000; ++i) {
    keys.push_back("boot/" + std::to_string(i));
    store->set(keys.back(), std::string(8192, static_cast<char>('a' + i % 26)));
  }
  const std::vector<std::string> values = store->getMany(keys, Deadline(60000));
  ASSERT_EQ(values.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(values[i], std::string(8192, static_cast<char>('a' + i % 26))) << keys[i];
  }
}

// A gather in batches that times out says which batch it counted: the server sees one batch at a time.
// Interleaved batch gathers of several clients (each batch an answer of its own, kept side by side) get
// their own values, and a SET in between is seen by the next one.
TEST(TcpStore, BatchedGathersNameTheirBatchAndKeepTheirAnswersApart) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  auto a = connectLocal(server->port());
  std::vector<std::string> keys;
  for (int i = 0; i < 5000; ++i) keys.push_back("nobody/" + std::to_string(i));
  std::string msg = expectError(ddlTimeout, [&] { a->getMany(keys, Deadline(200)); });
  EXPECT_NE(
      msg.find(
          "waiting for key 'nobody/0' and 4095 more of keys 1-4096 of 5000 (the rest not asked for yet)"),
      std::string::npos)
      << msg;
  for (size_t i = 0; i < 4096; ++i) a->set(keys[i], std::to_string(i));
  msg = expectError(ddlTimeout, [&] { a->getMany(keys, Deadline(200)); });
  EXPECT_NE(
      msg.find(
          "waiting for key 'nobody/4096' and 903 more of keys 4097-5000 of 5000 (those before were there)"),
      std::string::npos)
      << msg;
  for (size_t i = 4096; i < keys.size(); ++i) a->set(keys[i], std::to_string(i));
  std::vector<std::string> tail(keys.begin() + 4096, keys.end());
  auto errors = runThreads(8, [&](int t) {
    auto store = connectLocal(server->port());
    for (int round = 0; round < 3; ++round) {
      const auto& ask = (t + round) % 2 ? tail : keys;
      const std::vector<std::string> got = store->getMany(ask, Deadline(20000));
      const size_t base = &ask == &tail ? 4096 : 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != std::to_string(base + i)) throw std::runtime_error("wrong value for " + ask[i]);
      }
    }
  });
  EXPECT_TRUE(errors.empty()) << errors[0];
  a->set(tail[0], "changed");
  EXPECT_EQ(a->getMany(tail, Deadline(5000))[0], "changed");
}

TEST(StoreWire, GetManyListIsBoundedAndValidated) {
  using namespace store_wire;
  std::vector<std::string_view> keys;
  uint32_t wait_ms = 0;
  const std::string good = encodeGetMany(1500, {"a", "", "bc"});
  ASSERT_TRUE(decodeGetMany(good, &wait_ms, &keys));
  EXPECT_EQ(wait_ms, 1500u);
  EXPECT_EQ(keys, (std::vector<std::string_view>{"a", "", "bc"}));
  EXPECT_FALSE(decodeGetMany(good + "x", &wait_ms, &keys));                         // bytes after the list
  EXPECT_FALSE(decodeGetMany(good.substr(0, good.size() - 1), &wait_ms, &keys));   // cut short
  EXPECT_FALSE(decodeGetMany(encodeGetMany(1, {}), &wait_ms, &keys));               // no keys
  EXPECT_FALSE(decodeGetMany(encodeGetMany(kMaxManyWaitMs + 1, {"a"}), &wait_ms, &keys));
  EXPECT_FALSE(decodeGetMany(encodeGetMany(1, {std::string(kMaxKeyBytes + 1, 'k')}), &wait_ms, &keys));
  std::string lying = encodeGetMany(1, {"a"});
  lying.replace(4, 4, std::string("\x00\x10\x00\x00", 4));  // claims 1 Mi keys in 13 bytes
  EXPECT_FALSE(decodeGetMany(lying, &wait_ms, &keys));
  // The frame parser takes a whole GETMANY only with a well-formed list, within its size limit.
  auto frameOf = [](const std::string& value) {
    std::string f(1, static_cast<char>(kGetMany));
    auto put = [&](uint32_t v) {
      uint32_t n = htonl(v);
      f.append(reinterpret_cast<const char*>(&n), 4);
    };
    put(9);
    put(0);
    put(static_cast<uint32_t>(value.size()));
    return f + value;
  };
  Frame frame;
  EXPECT_EQ(parseStoreFrame(frameOf(good), Admission::kOpen, false, &frame), FrameVerdict::kRequest);
  EXPECT_EQ(parseStoreFrame(frameOf(good + "x"), Admission::kOpen, false, &frame), FrameVerdict::kDrop);
  std::string huge = frameOf(good).substr(0, kRequestHeaderBytes);
  huge.replace(9, 4, std::string("\x00\x10\x00\x01", 4));  // kMaxManyRequestBytes + 1
  EXPECT_EQ(parseStoreFrame(huge, Admission::kOpen, false, &frame), FrameVerdict::kDrop);
  // The answer round-trips, and a count other than the one asked for is malformed.
  const std::string v1 = "x", v2;
  std::vector<std::string> values;
  const std::string answer = encodeValues({&v1, &v2});
  ASSERT_TRUE(decodeValues(answer, 2, &values));
  EXPECT_EQ(values, (std::vector<std::string>{"x", ""}));
  EXPECT_FALSE(decodeValues(answer, 3, &values));
  EXPECT_FALSE(decodeValues(answer + "y", 2, &values));
}

// --- IPv6 rendezvous
// -----------------------------------------------------------------------------------------

// Whether this machine can listen on [::1]: containers and hosts booted with ipv6.disable=1 cannot.
std::string noIpv6Loopback() {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) return std::string("no IPv6 sockets: ") + std::strerror(errno);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  const int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int err = errno;
  ::close(fd);
  return rc == 0 ? "" : std::string("cannot bind [::1]: ") + std::strerror(err);
}

TEST(TcpStoreIpv6, RendezvousOverIpv6Loopback) {
  if (std::string why = noIpv6Loopback(); !why.empty()) GTEST_SKIP() << "this machine has no IPv6 loopback (" << why << ")";
  std::string host;
  int port = -1;
  parseHostPort("[::1]:0", &host, &port);  // DDL_ROOT's form
  auto server = startTcpStoreServer(host, port, kSecret);
  ASSERT_GT(server->port(), 0);
  auto a = connectTcpStore(host, server->port(), Deadline(10000), kSecret);
  auto b = connectTcpStore("::1", server->port(), Deadline(10000), kSecret);
  a->set("k", "v6");
  EXPECT_EQ(b->get("k", Deadline(5000)), "v6");
  EXPECT_EQ(b->getMany({"k"}, Deadline(5000)), (std::vector<std::string>{"v6"}));
  // Exactly [::1]: the same port on IPv4 loopback (a dual-stack socket would take it) is not the store.
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  v4.sin_port = htons(static_cast<uint16_t>(server->port()));
  v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&v4), sizeof v4);
  const int err = errno;
  ::close(fd);
  EXPECT_TRUE(rc != 0 && err == ECONNREFUSED) << "127.0.0.1:" << server->port() << " reached the [::1] store";
  // Messages show the address as DDL_ROOT writes it.
  std::string msg = expectError(ddlTimeout, [&] { a->get("never", Deadline(100)); });
  EXPECT_NE(msg.find("[::1]:" + std::to_string(server->port())), std::string::npos) << msg;
}

}  // namespace
}  // namespace ddl
