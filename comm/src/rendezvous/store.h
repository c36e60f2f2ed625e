// Key-value store used to bootstrap a communicator: ranks publish their UCX worker address and host name,
// and read everyone else's. Gloo's Store idea, NCCL's unique-id idea.
//
// Implementations: MemoryStore (one process, ranks as threads: tests), TcpStore (a client connected to the
// TcpStoreServer that rank 0 hosts at DDL_ROOT) and CallbackStore (a framework's store handed in through
// ddlStore_t). Failures throw ddl::Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ddl/ddl.h"
#include "deadline.h"
#include "rendezvous/store_protocol.h"

namespace ddl {

using store_wire::StoreLimits;

class Store {
 public:
  virtual ~Store() = default;
  // Sets key to value (overwrites).
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Returns the value of key, waiting until some rank sets it; throws ddlTimeout at the deadline.
  virtual std::string get(const std::string& key, const Deadline& deadline) = 0;
  // The values of keys, in their order, once every one is set; throws ddlTimeout naming a key still missing at
  // the deadline. This is the bootstrap's gather, so TcpStore and MemoryStore answer it in one round trip
  // (a get() per key costs p round trips through rank 0's server, minutes at a thousand ranks). This default
  // asks get() key by key: a framework's store (CallbackStore) has no multi-get of its own.
  virtual std::vector<std::string> getMany(const std::vector<std::string>& keys, const Deadline& deadline) {
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (const std::string& key : keys) values.push_back(get(key, deadline));
    return values;
  }
  // Atomically adds delta to the integer at key (missing = 0) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Whether add() works: a caller's ddlStore_t may have none.
  virtual bool canAdd() const { return true; }
};

// In-process store for ranks-as-threads tests.
std::shared_ptr<Store> makeMemoryStore();

// Every key of base under prefix (Gloo's PrefixStore): a communicator made from another (ddlCommShrink) meets
// under a prefix of its own in its parent's store, which it keeps.
std::shared_ptr<Store> makePrefixStore(std::shared_ptr<Store> base, const std::string& prefix);

// Over a caller's store (ddlCommInitRankWithStore). set and get must be non-null; add() needs store.add.
std::unique_ptr<Store> makeCallbackStore(const ddlStore_t& store);

// The job's secret (DDL_JOB_SECRET) is an opaque string of 1 to this many bytes; empty means none.
constexpr size_t kMaxJobSecretBytes = 4096;

// How long a connection to the TCP store may take to prove the job's secret, and how many may be at it at
// once (the oldest is dropped for a newer one). Tests shorten them.
struct TcpStoreHandshakeLimits {
  int timeout_ms = 5000;
  int max_pending = 64;
};

// Server side of the TCP store, run by rank 0 (a background thread serves every client).
class TcpStoreServer {
 public:
  virtual ~TcpStoreServer() = default;
  virtual int port() const = 0;  // the bound port (useful when asked for port 0)
};
// Listens at host:port (0 = any free port): exactly that address (a host name: the first of its addresses that
// can be bound), never every interface. Throws ddlInvalidArgument when host does not resolve. Throws ddlSystemError when the port is taken,
// with a message naming the port. With a non-empty secret the server answers only connections that prove they
// hold it (and proves it to them in turn; see tcp_store.cpp); an empty secret leaves the store open to anyone
// who can connect.
// store_limits bound what the store holds (store_protocol.h): a SET or ADD past them fails with "rendezvous store
// full: ..." and the server goes on.
std::unique_ptr<TcpStoreServer> startTcpStoreServer(const std::string& host, int port, const std::string& secret,
                                                    const TcpStoreHandshakeLimits& limits = {},
                                                    const StoreLimits& store_limits = {});

// Client side: connects to host:port, retrying refused connections until the deadline (rank 0 may start last).
// Throws ddlTimeout naming "host:port" and the last socket error when the deadline passes, ddlInvalidArgument
// for port 0 or a host name that does not resolve. With a non-empty secret it proves the secret to the server
// and requires the server to prove it back before any request: ddlInvalidArgument when the server refuses
// this secret, ddlRemoteError when the server cannot prove it (another process on the port). An empty secret
// sends requests at once, which a server with a secret refuses (ddlInvalidArgument on the first request).
// The returned store's set() and add() wait for the server's answer up to deadline.timeoutMs() (at least
// 1 s); once the server closes the connection every call throws ddlRemoteError. Keys are limited to 64 KiB
// and values to 16 MiB (ddlInvalidArgument beyond).
std::unique_ptr<Store> connectTcpStore(const std::string& host, int port, const Deadline& deadline,
                                       const std::string& secret);

// Splits "host:port" or "[ipv6]:port" (port 0..65535; 0 only makes sense to a server); throws
// ddlInvalidArgument with the offending text when malformed.
void parseHostPort(const std::string& addr, std::string* host, int* port);

}  // namespace ddl
