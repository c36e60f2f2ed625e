// HotBuffers: which of a group's CUDA allreduce buffers torch_ddl registers with libddl (ddlCommRegister), so
// that the node kernel reads and writes them in place (zero-copy) with no change to the user's script. DDP
// allreduces the same bucket storages every step; once a storage has been allreduced kUsesToRegister times,
// it is registered at the group's next round, and its calls are zero-copy from then on.
//
// Why rounds: ddlCommRegister and ddlCommDeregister are collectives (every rank, the same order), while
// which storages a rank sees is its own. So the ranks meet at the same calls: the 2nd, 4th, 8th, ... 1024th
// noted allreduce, then every 1024th. A round is one small max over every rank, a blocking host collective
// that holds the caller until every rank reaches it. Then they deregister what any rank no longer uses, and
// register as many of their hot storages as every rank has (the i-th of each pair in one registration: the
// kernel reads each member's own buffer in its row, so pairs need not be alike).
//
// Why a registration holds its storage: a peer maps the storage's allocation over CUDA IPC, and freeing an
// allocation that a peer still maps is undefined in CUDA. A registered storage is kept alive (the caching
// allocator cannot free its segment) until a round finds that nobody else holds it (DDP rebuilt its buckets,
// or was deleted); then every rank deregisters it and lets it go. A candidate is held only weakly.
//
// Bounded: kMaxCandidates storages counted, kMaxRegistered registered per group, kPerRound per round. A
// registration a rank cannot make (PyTorch's expandable segments: memory from cuMemCreate, which CUDA IPC
// cannot share) fails on every rank and changes nothing: those storages stay staged and are not offered
// again, and after kMaxRefusals refusals the group stops registering. A round while the caller's stream is
// being captured into a CUDA graph registers and deregisters nothing (ranks capture alike), and a
// registration that a captured call of any rank used is never let go: the graph may replay it at any time.
//
// Torch-free, so that tests run it over libddl on the emulated device (tests/unit/hot_buffers_test.cpp):
// Traits says what a buffer is (process_group_ddl.h: torch's c10::Storage):
//   Strong               holds the memory;  Weak  names it without holding it
//   weak(s) -> Weak, lock(w) -> Strong (empty where gone), id(s) (the same for one buffer while alive),
//   data(s) -> void*, bytes(s) -> size_t, othersHold(s) (someone besides HotBuffers holds it).
// Threads: one call at a time (the group's calls in order). Lifetime: outlive the communicator, whose
// ddlCommDestroy drops the registrations; the storages are let go after it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torch_ddl {

// What a round does on the communicator: collectives of every rank.
struct HotBufferOps {
  std::function<void(std::vector<int64_t>& v)> max_all;  // v becomes the elementwise max over every rank
  // ddlCommRegister: the handle, or null with *why where a rank could not share its buffer (on every rank).
  std::function<void*(void* data, size_t bytes, std::string* why)> add;
  std::function<void(void* handle)> remove;  // ddlCommDeregister
};

template <class Traits>
class HotBuffers {
 public:
  using Strong = typename Traits::Strong;
  using Weak = typename Traits::Weak;

  static constexpr int kUsesToRegister = 2;
  static constexpr int kMaxCandidates = 64;
  static constexpr int kMaxRegistered = 32;
  static constexpr int kPerRound = 8;
  static constexpr int kMaxRefusals = 4;
  static constexpr uint64_t kEvery = 1024;

  // Before each of the group's allreduces that the node kernel runs (the same calls on every rank), on buf:
  // counts it and, at a round's call, runs the round. capturing: the call's stream is being captured. Throws
  // what ops throw (a broken communicator).
  void note(const Strong& buf, bool capturing, const HotBufferOps& ops) {
    ++calls_;
    if (Registered* r = registeredAt(Traits::id(buf))) {
      // A graph captured this call with the registration's row in it, and may be replayed at any time: the
      // registration stays (ddlCommDeregister's contract), whatever the other ranks hold.
      r->captured = r->captured || capturing;
    } else {
      count(buf);
    }
    if (roundAt(calls_)) round(capturing, ops);
  }

  // Whether a round comes at the call-th call (from 1).
  static bool roundAt(uint64_t call) { return call % kEvery == 0 || (call >= 2 && (call & (call - 1)) == 0); }

  int registered() const { return static_cast<int>(registered_.size()); }
  int candidates() const { return static_cast<int>(candidates_.size()); }
  int refusals() const { return refusals_; }
  // Why the last registration was refused ("" where none was).
  const std::string& lastRefusal() const { return last_why_; }

 private:
  struct Candidate {
    Weak weak;
    uint64_t first = 0;  // the call that first used it: under DDP the same bucket's on every rank
    int uses = 0;        // < 0: refused
  };
  struct Registered {
    Strong buf;
    void* handle;
    bool captured = false;  // a call on it was captured into a CUDA graph on this rank: never let go
  };

  Registered* registeredAt(const void* id) {
    for (auto& r : registered_)
      if (Traits::id(r.buf) == id) return &r;
    return nullptr;
  }

  void count(const Strong& buf) {
    // No memory, nothing to register: ddlCommRegister would refuse it on this rank alone, before the others
    // meet it, and the ranks' registrations would fall out of step.
    if (Traits::bytes(buf) == 0 || !Traits::data(buf)) return;
    const void* id = Traits::id(buf);
    auto it = candidates_.find(id);
    if (it == candidates_.end()) {
      if (static_cast<int>(candidates_.size()) >= kMaxCandidates && !makeRoom()) return;
      it = candidates_.emplace(id, Candidate{Traits::weak(buf), calls_, 0}).first;
    }
    if (it->second.uses >= 0) ++it->second.uses;
  }

  // Forgets the candidates that are gone, else the least used one; false where every one is refused.
  bool makeRoom() {
    for (auto it = candidates_.begin(); it != candidates_.end();) {
      it = Traits::lock(it->second.weak) ? std::next(it) : candidates_.erase(it);
    }
    if (static_cast<int>(candidates_.size()) < kMaxCandidates) return true;
    auto least = candidates_.end();
    for (auto it = candidates_.begin(); it != candidates_.end(); ++it) {
      if (it->second.uses >= 0 && (least == candidates_.end() || it->second.uses < least->second.uses))
        least = it;
    }
    if (least == candidates_.end()) return false;
    candidates_.erase(least);
    return true;
  }

  void round(bool capturing, const HotBufferOps& ops) {
    // What this rank offers, held from now on: the hot candidates still alive, most used first, then first
    // used first (so that under DDP every rank offers its buckets in the same order).
    struct Offer {
      int uses;
      uint64_t first;
      Strong buf;
    };
    std::vector<Offer> offer;
    for (auto it = candidates_.begin(); it != candidates_.end();) {
      Strong s = Traits::lock(it->second.weak);
      if (!s) {
        it = candidates_.erase(it);
        continue;
      }
      if (it->second.uses >= kUsesToRegister)
        offer.push_back(Offer{it->second.uses, it->second.first, std::move(s)});
      ++it;
    }
    std::sort(offer.begin(), offer.end(), [](const Offer& a, const Offer& b) {
      return a.uses != b.uses ? a.uses > b.uses : a.first < b.first;
    });
    if (offer.size() > static_cast<size_t>(kPerRound)) offer.resize(kPerRound);
    // [0] any rank capturing, [1] minus the fewest offered, [2 + i] registration i is unused on some rank,
    // [2 + kMaxRegistered + i] registration i is in a graph of some rank's.
    std::vector<int64_t> v(2 + 2 * kMaxRegistered, 0);
    v[0] = capturing ? 1 : 0;
    v[1] = -static_cast<int64_t>(offer.size());
    for (size_t i = 0; i < registered_.size(); ++i) {
      v[2 + i] = Traits::othersHold(registered_[i].buf) ? 0 : 1;
      v[2 + kMaxRegistered + i] = registered_[i].captured ? 1 : 0;
    }
    ops.max_all(v);
    if (v[0] != 0) return;
    // The same registrations, in the same order, on every rank. A storage is let go only once its
    // deregistration returned (should one throw, the rest stay held).
    for (size_t i = 0; i < registered_.size(); ++i) {
      if (v[2 + i] == 0 || v[2 + kMaxRegistered + i] != 0) continue;
      ops.remove(registered_[i].handle);
      registered_[i].handle = nullptr;
    }
    registered_.erase(std::remove_if(registered_.begin(), registered_.end(),
                                     [](const Registered& r) { return r.handle == nullptr; }),
                      registered_.end());
    if (refusals_ >= kMaxRefusals) return;
    const int64_t room = kMaxRegistered - static_cast<int64_t>(registered_.size());
    const int64_t k = std::min(-v[1], room);
    for (int64_t i = 0; i < k; ++i) {
      const Strong& s = offer[static_cast<size_t>(i)].buf;
      std::string why;
      void* h = ops.add(Traits::data(s), Traits::bytes(s), &why);
      if (h) {
        registered_.push_back(Registered{s, h});
        candidates_.erase(Traits::id(s));
      } else {  // on every rank alike: the pair stays staged
        if (auto c = candidates_.find(Traits::id(s)); c != candidates_.end()) c->second.uses = -1;
        last_why_ = why;
        if (++refusals_ >= kMaxRefusals) return;
      }
    }
  }

  uint64_t calls_ = 0;
  std::unordered_map<const void*, Candidate> candidates_;
  std::vector<Registered> registered_;
  int refusals_ = 0;
  std::string last_why_;
};

}  // namespace torch_ddl
