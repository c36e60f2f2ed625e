// LocalTransport and LocalFabric (local_transport.h): tagged sends and receives between threads, eager below
// the rendezvous size, with kill() for tests of dead peers.
#include "transport/local_transport.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "error.h"
#include "transport/node_key.h"

namespace ddl {

LocalFabric::LocalFabric(int size, size_t rendezvous_bytes) : ranks_(size), rendezvous_bytes_(rendezvous_bytes) {}

void LocalFabric::kill(int rank, const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  ranks_[rank].dead = why.empty() ? "killed" : why;
}

void LocalFabric::deliver(Request* r, const Posted& p, int src, uint64_t tag, const char* data, size_t len) {
  r->sender_tag = tag;
  r->peer = src;
  if (len > p.len) {
    r->truncated = true;
    r->ok = false;
    r->error = "message truncated";
    len = p.len;
  }
  if (len) std::memcpy(p.buf, data, len);
  r->length = len;
  r->done.store(true, std::memory_order_release);
}

LocalTransport::LocalTransport(std::shared_ptr<LocalFabric> fabric, int rank)
    : fabric_(std::move(fabric)), rank_(rank) {}

std::string LocalTransport::hostOf(int rank) const { return "local"; }

std::string LocalTransport::nodeOf(int rank) const {
  return fabric_->nodes_.empty() ? localNodeKey() : fabric_->nodes_.at(rank);
}

void LocalTransport::send(Request& r, int peer, uint64_t tag, const void* buf, size_t len) {
  r.is_recv = false;
  r.peer = peer;
  r.posted_len = len;
  std::lock_guard<std::mutex> lk(fabric_->mu_);
  auto& dst = fabric_->ranks_[peer];
  if (!fabric_->ranks_[rank_].dead.empty()) {
    r.ok = false;
    r.error = "this rank was killed";
  } else if (!dst.dead.empty()) {
    r.ok = false;
    r.error = "peer is dead: " + dst.dead;
  } else {
    auto it = std::find_if(dst.posted.begin(), dst.posted.end(),
                           [&](const LocalFabric::Posted& p) { return (tag & p.mask) == (p.tag & p.mask); });
    if (it != dst.posted.end()) {
      LocalFabric::Posted p = *it;
      dst.posted.erase(it);
      LocalFabric::deliver(p.req, p, rank_, tag, static_cast<const char*>(buf), len);
    } else {
      const char* b = static_cast<const char*>(buf);
      const bool rendezvous = len > fabric_->rendezvous_bytes_;
      dst.unexpected.push_back({tag, rank_, std::vector<char>(b, b + len), rendezvous ? &r : nullptr});
      if (rendezvous) return;  // completes when a receive takes it
    }
  }
  r.done.store(true, std::memory_order_release);
}

void LocalTransport::recv(Request& r, int peer, uint64_t tag, uint64_t mask, void* buf, size_t len) {
  r.is_recv = true;
  r.peer = peer;
  r.posted_len = len;
  std::lock_guard<std::mutex> lk(fabric_->mu_);
  auto& me = fabric_->ranks_[rank_];
  LocalFabric::Posted p{&r, tag, mask, buf, len};
  auto it = std::find_if(me.unexpected.begin(), me.unexpected.end(),
                         [&](const LocalFabric::Message& m) { return (m.tag & mask) == (tag & mask); });
  if (it != me.unexpected.end()) {
    LocalFabric::deliver(&r, p, it->src, it->tag, it->data.data(), it->data.size());
    if (it->send) it->send->done.store(true, std::memory_order_release);
    me.unexpected.erase(it);
    return;
  }
  me.posted.push_back(p);
}

void LocalTransport::cancel(Request& r) {
  std::lock_guard<std::mutex> lk(fabric_->mu_);
  if (r.done.load(std::memory_order_acquire)) return;
  auto& posted = fabric_->ranks_[rank_].posted;
  auto it = std::find_if(posted.begin(), posted.end(), [&](const LocalFabric::Posted& p) { return p.req == &r; });
  if (it != posted.end()) posted.erase(it);
  if (!r.is_recv && r.peer >= 0) {  // a rendezvous send still waiting at the peer
    auto& q = fabric_->ranks_[r.peer].unexpected;
    q.remove_if([&](const LocalFabric::Message& m) { return m.send == &r; });
  }
  r.ok = false;
  r.error = "cancelled";
  r.done.store(true, std::memory_order_release);
}

bool LocalTransport::progress() { return false; }

bool LocalTransport::probe(uint64_t tag, uint64_t mask, uint64_t* sender_tag) {
  std::lock_guard<std::mutex> lk(fabric_->mu_);
  for (const auto& m : fabric_->ranks_[rank_].unexpected) {
    if ((m.tag & mask) == (tag & mask)) {
      *sender_tag = m.tag;
      return true;
    }
  }
  return false;
}

std::string LocalTransport::peerError(int peer) const {
  std::lock_guard<std::mutex> lk(fabric_->mu_);
  if (!fabric_->ranks_[rank_].dead.empty()) return "this rank was killed";
  return fabric_->ranks_[peer].dead;
}

void LocalTransport::idleWait(int timeout_us) {
  if (timeout_us <= 0) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(timeout_us));
  }
}

}  // namespace ddl
