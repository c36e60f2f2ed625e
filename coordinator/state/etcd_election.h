// EtcdElection: which of several coordinators sharing an etcd cluster is the leader, and the revision that
// fences its writes.
//
// Each candidate holds an etcd lease of ttl_s seconds and campaigns by creating <prefix>leader (value: its
// id, its address for followers to redirect to) under that lease, in a transaction that succeeds only while
// the key is absent. The winner is the leader for as long as it keeps the lease alive (keepAlive, every ttl_s
// / 3 or so); when it stops (kill -9, a partition from etcd) etcd deletes the key once the lease runs out and
// another candidate's campaign wins. The key's create revision names one reign: EtcdStore::fence() makes
// every write a transaction that checks it, so a deposed leader that has not noticed yet cannot write (its
// transactions find another revision, or none, and are refused).
//
// The v3 election API (v3election.proto) does the same with a queue of candidates; a single create-if-absent
// key is enough here, where candidates only need to know who leads and whether it is themselves.
//
// Threads: thread-safe; a coordinator calls campaign/keepAlive from one thread (its ticker) and leader() from
// any.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "state/etcd_tls.h"

namespace ddl::state {

class EtcdClient;

class EtcdElection {
 public:
  struct Options {
    std::vector<std::string> endpoints;  // HOST:PORT of etcd's client URLs
    EtcdTls tls;                         // plaintext unless it names a CA
    std::string prefix = "/ddl/";        // the same as the coordinators' EtcdStore
    std::string id;                      // this candidate: its address, for followers to name the leader
    int ttl_s = 3;                       // the lease; etcd grants at least its minimum (2 s here)
    int64_t timeout_ms = 1000;           // per call
  };
  struct Leader {
    std::string id;        // "" when nobody leads
    int64_t revision = 0;  // the leader key's create revision: the reign
  };

  static StatusOr<std::unique_ptr<EtcdElection>> create(Options options);
  ~EtcdElection();

  // Tries once to lead: when the key is absent, takes a fresh lease and creates the key under it if it is
  // still absent. True when this candidate leads (now, or already).
  StatusOr<bool> campaign();
  // Renews the lease of a leader. FAILED_PRECONDITION when the lease is gone (it ran out: this candidate no
  // longer leads, and says so from now on); UNAVAILABLE when etcd cannot be reached (the lease may still run
  // out: a leader that cannot renew must stop acting before ttl_s has passed since its last renewal).
  Status keepAlive();
  // Gives up the lead at once (revokes the lease, which deletes the key).
  Status resign();
  // Who leads now, as etcd says.
  StatusOr<Leader> leader();

  bool leading() const;
  int64_t revision() const;  // this candidate's reign, 0 when it does not lead
  std::string key() const { return options_.prefix + "leader"; }

 private:
  explicit EtcdElection(Options options);

  Options options_;
  std::unique_ptr<EtcdClient> client_;
  mutable std::mutex mu_;
  int64_t lease_ = 0;     // 0: none held
  int64_t revision_ = 0;  // 0: not leading
};

}  // namespace ddl::state
