// LocalTransport: ranks that are threads of one process, connected through a shared LocalFabric.
//
// Sends up to rendezvous_bytes are eager: the payload is copied into the matching posted receive, or queued
// until one is posted, and the send completes at once. Larger sends complete only once a receive has taken
// them, as UCX's rendezvous protocol does, so algorithms that forget to post a send or to wait for one hang
// here too. Matching follows UCX's tag rules (tag and mask, in arrival order). kill() makes a rank look dead to
// its peers, for failure tests without processes. Used by the fast algorithm tests.
//
// Threads: every rank's thread calls its own LocalTransport; the fabric's mutex guards the queues, and a
// request may be completed by the sending rank's thread.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace ddl {

class LocalFabric {
 public:
  explicit LocalFabric(int size, size_t rendezvous_bytes = 256);
  int size() const { return static_cast<int>(ranks_.size()); }
  // From now on rank looks dead: its peers' sends to it fail, and their receives from it fail.
  void kill(int rank, const std::string& why);
  // Puts the ranks on nodes (one key per rank) for tests of node layouts; by default every rank is on this
  // process's node (localNodeKey()). Call before the transports are used.
  void setNodes(std::vector<std::string> nodes) { nodes_ = std::move(nodes); }

 private:
  friend class LocalTransport;
  struct Message {
    uint64_t tag;
    int src;
    std::vector<char> data;
    Request* send;  // a rendezvous send, completed when a receive takes the message
  };
  struct Posted {
    Request* req;
    uint64_t tag, mask;
    void* buf;
    size_t len;
  };
  struct RankState {
    std::list<Message> unexpected;
    std::list<Posted> posted;
    std::string dead;  // non-empty once killed
  };
  static void deliver(Request* r, const Posted& p, int src, uint64_t tag, const char* data, size_t len);

  std::mutex mu_;
  std::vector<RankState> ranks_;
  size_t rendezvous_bytes_;
  std::vector<std::string> nodes_;
};

class LocalTransport : public Transport {
 public:
  LocalTransport(std::shared_ptr<LocalFabric> fabric, int rank);
  int rank() const override { return rank_; }
  int size() const override { return fabric_->size(); }
  std::string hostOf(int rank) const override;
  // This process's node, unless LocalFabric::setNodes said otherwise.
  std::string nodeOf(int rank) const override;
  void send(Request& r, int peer, uint64_t tag, const void* buf, size_t len) override;
  void recv(Request& r, int peer, uint64_t tag, uint64_t mask, void* buf, size_t len) override;
  void cancel(Request& r) override;
  bool progress() override;
  bool probe(uint64_t tag, uint64_t mask, uint64_t* sender_tag) override;
  std::string peerError(int peer) const override;
  void idleWait(int timeout_us) override;

 private:
  std::shared_ptr<LocalFabric> fabric_;
  int rank_;
};

}  // namespace ddl
