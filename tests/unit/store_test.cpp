// Tests of the rendezvous stores: MemoryStore, and TcpStore against a TcpStoreServer on a loopback port.
// Covers waiting and timeouts, many clients and threads at once, a client that starts before its server, a
// server that goes away under a waiting client, and garbage on the server's port. Time bounds are loose (they
// catch hangs, not slowness); every wait is bounded by a deadline so a broken store fails the test instead of
// hanging.
#include "store.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
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

std::unique_ptr<Store> connectLocal(int port) { return connectTcpStore("127.0.0.1", port, Deadline(10000)); }

TEST(TcpStore, SetGetAdd) {
  auto server = startTcpStoreServer(0);
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
  auto other = connectTcpStore("localhost", server->port(), Deadline(10000));
  EXPECT_EQ(other->get("a", Deadline(5000)), "two");
  EXPECT_EQ(other->add("n", 0), -2);
}

TEST(TcpStore, AddToNonIntegerFailsAndConnectionStaysUsable) {
  auto server = startTcpStoreServer(0);
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
  auto server = startTcpStoreServer(0);
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
  auto server = startTcpStoreServer(0);
  auto store = connectLocal(server->port());
  expectError(ddlInvalidArgument, [&] { store->set(std::string(64 * 1024 + 1, 'k'), "v"); });
  expectError(ddlInvalidArgument, [&] { store->set("k", std::string(16 * 1024 * 1024 + 1, 'v')); });
  store->set("k", "v");  // the connection is unaffected
  EXPECT_EQ(store->get("k", Deadline(5000)), "v");
}

TEST(TcpStore, ConcurrentClients) {
  auto server = startTcpStoreServer(0);
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
  auto server = startTcpStoreServer(0);
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
  auto server = startTcpStoreServer(0);
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
  auto server = startTcpStoreServer(0);
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
      client = connectTcpStore("127.0.0.1", port, Deadline(10000));
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(milliseconds(300));
  std::unique_ptr<TcpStoreServer> server;
  try {
    server = startTcpStoreServer(port);
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
  std::string msg = expectError(ddlTimeout, [&] { connectTcpStore("127.0.0.1", port, Deadline(300)); });
  int64_t elapsed = msSince(start);
  EXPECT_GE(elapsed, 250);
  EXPECT_LE(elapsed, 5000);
  EXPECT_NE(msg.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("300 ms"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Connection refused"), std::string::npos) << msg;
}

TEST(TcpStore, BadConnectArguments) {
  expectError(ddlInvalidArgument, [] { connectTcpStore("127.0.0.1", 0, Deadline(1000)); });
  expectError(ddlInvalidArgument, [] { connectTcpStore("", 29500, Deadline(1000)); });
  expectError(ddlInvalidArgument, [] { connectTcpStore("127.0.0.1", 70000, Deadline(1000)); });
}

TEST(TcpStore, UnresolvableHost) {
  // NXDOMAIN fails at once (ddlInvalidArgument); a resolver that cannot answer is retried until the deadline.
  try {
    connectTcpStore("no-such-host.invalid", 29500, Deadline(2000));
    ADD_FAILURE() << "connected to no-such-host.invalid";
  } catch (const Error& e) {
    EXPECT_TRUE(e.code() == ddlInvalidArgument || e.code() == ddlTimeout) << e.what();
    EXPECT_NE(std::string(e.what()).find("no-such-host.invalid"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, PortInUse) {
  auto first = startTcpStoreServer(0);
  int port = first->port();
  std::string msg = expectError(ddlSystemError, [&] { startTcpStoreServer(port); });
  EXPECT_NE(msg.find("port " + std::to_string(port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("Address already in use"), std::string::npos) << msg;
  expectError(ddlInvalidArgument, [] { startTcpStoreServer(65536); });
}

TEST(TcpStore, ServerDestroyedWhileClientWaits) {
  auto server = startTcpStoreServer(0);
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
  auto server = startTcpStoreServer(0);
  auto store = connectLocal(server->port());
  server.reset();
  auto start = Clock::now();
  std::string msg = expectError(ddlRemoteError, [&] { store->add("k", 1); });
  EXPECT_LE(msSince(start), 5000);
  EXPECT_NE(msg.find("closed the connection"), std::string::npos) << msg;
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
  }
  ~RawClient() { close(); }
  bool connected() const { return connected_; }
  void send(const std::string& bytes) {
    ASSERT_EQ(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
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
  auto server = startTcpStoreServer(0);
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

}  // namespace
}  // namespace ddl
