// The bootstrap over the real pieces, ranks as threads of this process: a TcpStoreServer, one TcpStore client
// per rank and UcxTransport. Covers the one-record gather (a rank that never publishes is named), lazy
// endpoints (a ring connects each rank to its two neighbours only, and node keys are known without
// connecting), and that a failure still reaches every rank when ranks tell only the peers they are connected
// to: the report floods from rank to rank. And a whole start at an IPv6 DDL_ROOT.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "comm.h"
#include "error.h"
#include "transport/node_key.h"
#include "rendezvous/store.h"
#include "transport/ucx_transport.h"

namespace ddl {
namespace {

struct RankEnd {
  ddlResult_t code = ddlSuccess;
  std::string what;
};

// Runs body(rank, transport, comm) on n thread ranks, each bootstrapped through its own TcpStore client.
// `transport` stays valid while `comm` lives (comm owns it).
std::vector<RankEnd> runUcxRanks(int n, const Options& opts,
                                 const std::function<void(int, Transport&, Comm&)>& body) {
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  std::vector<RankEnd> ends(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto store = connectTcpStore("127.0.0.1", server->port(), Deadline(20000), "");
        auto transport = createUcxTransport(r, n, *store, Deadline(20000), false);
        Transport* t = transport.get();
        Comm comm(std::move(transport), opts);
        body(r, *t, comm);
      } catch (const Error& e) {
        ends[r] = {e.code(), e.what()};
      } catch (const std::exception& e) {
        ends[r] = {ddlInternalError, e.what()};
      }
    });
  }
  for (auto& t : threads) t.join();
  return ends;
}

class LazyEndpoints : public testing::TestWithParam<int> {};

// Fails without lazy endpoints: every rank then holds n-1 endpoints from the start.
TEST_P(LazyEndpoints, ARingConnectsEachRankToItsTwoNeighboursOnly) {
  const int n = GetParam();
  Options opts;
  opts.timeout_ms = 20000;
  opts.algo = Algo::kRing;
  auto ends = runUcxRanks(n, opts, [n](int r, Transport& t, Comm& comm) {
    // Right after init: no endpoint, yet every rank's host and node are known (Transport::nodeOf).
    EXPECT_EQ(t.connectedPeers(), 0) << "rank " << r;
    for (int p = 0; p < n; ++p) {
      EXPECT_EQ(t.nodeOf(p), localNodeKey()) << "rank " << r << " about rank " << p;
      EXPECT_NE(t.hostOf(p), "unknown host");
    }
    std::vector<float> data(1000 * n + 3);
    for (int round = 0; round < 3; ++round) {  // later rounds reuse the endpoints: made at most once
      std::iota(data.begin(), data.end(), static_cast<float>(r));
      comm.allReduce(data.data(), data.data(), data.size(), ddlFloat32, ddlSum);
      const float base = static_cast<float>(n * (n - 1)) / 2;
      for (size_t i = 0; i < data.size(); i += 97) ASSERT_EQ(data[i], base + static_cast<float>(i) * n);
    }
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    EXPECT_EQ(t.connectedPeers(), 2) << "rank " << r;
    EXPECT_TRUE(t.connected(next) && t.connected(prev)) << "rank " << r;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(ends[r].code, ddlSuccess) << "rank " << r << ": " << ends[r].what;
}

INSTANTIATE_TEST_SUITE_P(Ranks, LazyEndpoints, testing::Values(4, 8));

// Rank 3 tells only ranks 2 and 4 (its ring neighbours) and 1 and 7 (its hypercube partners, 3 ^ 2 and 3 ^
// 4); ranks 0, 5 and 6 hear of it passed on from rank to rank, before their deadline (else ddlTimeout). Fails
// without passing the report on unchanged: each rank then put its own name in front, and past a few hundred
// ranks the 1 KiB control message would have lost the origin.
TEST(LazyEndpoints, AFailureReachesEveryRankThroughItsNeighbours) {
  constexpr int n = 8, victim = 3;
  Options opts;
  opts.timeout_ms = 30000;  // far longer than the report needs to cross 4 ranks
  opts.algo = Algo::kRing;
  auto ends = runUcxRanks(n, opts, [](int r, Transport& t, Comm& comm) {
    std::vector<int32_t> data(4096, 1);
    comm.allReduce(data.data(), data.data(), data.size(), ddlInt32, ddlSum);  // connects the ring
    if (r == victim) {
      comm.abort();
      return;
    }
    comm.allReduce(data.data(), data.data(), data.size(), ddlInt32, ddlSum);  // never completes: victim is out
  });
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    EXPECT_EQ(ends[r].code, ddlRemoteError) << "rank " << r << ": " << ends[r].what;
    // The origin, passed on unchanged from rank to rank.
    EXPECT_EQ(ends[r].what.rfind("rank 3 (", 0), 0u) << "rank " << r << ": " << ends[r].what;
    EXPECT_NE(ends[r].what.find("aborted by ddlCommAbort"), std::string::npos) << ends[r].what;
  }
}

// The gather's timeout names the record that is missing, so the rank that did not start.
TEST(Bootstrap, AMissingRankIsNamed) {
  constexpr int n = 4;
  auto server = startTcpStoreServer("127.0.0.1", 0, "");
  std::vector<RankEnd> ends(n - 1);
  std::vector<std::thread> threads;
  for (int r = 0; r < n - 1; ++r) {  // rank 3 never starts
    threads.emplace_back([&, r] {
      try {
        auto store = connectTcpStore("127.0.0.1", server->port(), Deadline(10000), "");
        createUcxTransport(r, n, *store, Deadline(500), false);
      } catch (const Error& e) {
        ends[r] = {e.code(), e.what()};
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_EQ(ends[r].code, ddlTimeout) << ends[r].what;
    EXPECT_NE(ends[r].what.find("waiting for key 'boot/3'"), std::string::npos) << ends[r].what;
    EXPECT_NE(ends[r].what.find("rank 3 (at least) did not join the communicator of 4 ranks"),
              std::string::npos)
        << ends[r].what;
  }
}

// A free port on [::1], or 0 with *why when this machine has no IPv6 loopback.
int freeIpv6Port(std::string* why) {
  int fd = ::socket(AF_INET6, SOCK_STREAM, 0);
  if (fd < 0) {
    *why = std::string("no IPv6 sockets: ") + std::strerror(errno);
    return 0;
  }
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_addr = in6addr_loopback;
  socklen_t len = sizeof addr;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin6_port);
  } else {
    *why = std::string("cannot bind [::1]: ") + std::strerror(errno);
  }
  ::close(fd);
  return port;
}

// DDL_ROOT=[::1]:port: the whole communicator start (rank 0's store, every rank's client, the gather).
TEST(Bootstrap, RendezvousAtAnIpv6Root) {
  std::string why;
  const int port = freeIpv6Port(&why);
  if (port == 0) GTEST_SKIP() << "this machine has no IPv6 loopback (" << why << ")";
  constexpr int n = 3;
  const std::string root = "[::1]:" + std::to_string(port);
  std::vector<RankEnd> ends(n);
  std::vector<float> sums(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        Options opts;
        opts.timeout_ms = 20000;
        auto comm = Comm::create(n, r, root, opts);
        float v = static_cast<float>(r + 1);
        comm->allReduce(&v, &v, 1, ddlFloat32, ddlSum);
        sums[r] = v;
      } catch (const Error& e) {
        ends[r] = {e.code(), e.what()};
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ends[r].code, ddlSuccess) << "rank " << r << ": " << ends[r].what;
    EXPECT_EQ(sums[r], 6.0f) << "rank " << r;
  }
}

// Which UCX_TLS values keep UCX's rendezvous threshold (RDMA possible) and which get libddl's eager 2 MiB.
TEST(UcxTls, RdmaTransportsAreToldApartFromTheOthers) {
  for (const char* tls :
       {"", "all", "^tcp", "ib", "rc", "rc_x,sm", "tcp,ud_verbs", "dc_mlx5", "sm,self,rc_v"}) {
    EXPECT_TRUE(ucxTlsMayUseRdma(tls)) << tls;
  }
  for (const char* tls :
       {"tcp", "sm,self", "tcp,sm,self", "cuda_copy,tcp", "posix,sysv,cma,tcp", "cuda_ipc,self"}) {
    EXPECT_FALSE(ucxTlsMayUseRdma(tls)) << tls;
  }
}

}  // namespace
}  // namespace ddl
