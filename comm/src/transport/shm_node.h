// ShmNode: the ranks of a communicator that share a node (node_key.h), joined by one shared-memory segment.
//
// Each member owns a slot of `buffers` round buffers of `round_bytes` in the segment, and a control line of
// three round counters (copied, reduced, consumed) that only it writes. The shared-memory collectives
// (algo/shm.cpp) move a message in rounds: a member copies its input for round g into its slot and publishes
// copied = g+1; the member that owns a chunk reduces that chunk of every slot in place, reading peers' memory
// directly, and publishes reduced = g+1; members copy finished chunks out and publish consumed = g+1, which
// lets the owner reuse the buffer `buffers` rounds later. Counters never reset: every shared-memory
// collective advances all three by its number of rounds on every member, so they stay equal across
// collectives.
//
// Waits spin briefly, then yield or block on a futex on the counter (a publisher wakes only when someone
// sleeps), so ranks that share cores give them up. No wait is unbounded: every wait polls the collective's
// WaitContext (wait_context.h, the Session: abort, peers' failure reports, the deadline), the segment's
// failure word (a member that fails sets it and wakes everyone), and whether the awaited member's process
// still exists. A member's collective signature sits beside its counters, so members that called different
// collectives fail with a mismatch, not a hang.
//
// The segment is created by the node's first member with a random name, announced through the bootstrap
// store, and unlinked as soon as every member has mapped it, so once a communicator is up nothing is left in
// /dev/shm whatever happens to its ranks. A creator killed during the attach itself leaves the name behind:
// names carry the creator's PID namespace and pid, and the node's next creator removes those whose creator is
// gone. Each member reserves its slot's pages (posix_fallocate), on its NUMA node, so a
// full /dev/shm is an error at attach, not a SIGBUS later. A member's death is seen through a pidfd (or
// kill(pid, 0)), which node keys make meaningful: members share a PID namespace.
//
// Threads: one thread at a time per member (the communicator serialises collectives).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deadline.h"
#include "rendezvous/store.h"
#include "transport/wait_context.h"

namespace ddl {

class ShmNode {
 public:
  enum Counter { kCopied = 0, kReduced = 1, kConsumed = 2 };

  // Maps the node's segment. members: the global ranks that share the node, ascending; rank is one of them.
  // Returns null, with *why saying why, when the segment cannot be made or opened (no /dev/shm, no space);
  // throws ddl::Error only for what the store throws (a peer that never announces its segment: ddlTimeout).
  // round_bytes is rounded down to a multiple of 64 bytes per member.
  static std::unique_ptr<ShmNode> attach(Store& store, const std::vector<int>& members, int rank,
                                         size_t round_bytes, int buffers, const Deadline& deadline,
                                         std::string* why);
  ~ShmNode();
  ShmNode(const ShmNode&) = delete;
  ShmNode& operator=(const ShmNode&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  int me() const { return me_; }
  int rankOf(int member) const { return members_[member]; }
  const std::vector<int>& members() const { return members_; }
  size_t roundBytes() const { return round_bytes_; }
  int buffers() const { return buffers_; }

  // Buffer buf (0 .. buffers-1) of member's slot.
  char* slot(int member, int buf) const;
  // The buffer of member's slot that round g uses.
  char* roundSlot(int member, uint32_t g) const { return slot(member, static_cast<int>(g % buffers_)); }

  // The round this member reached: the value of its counters between collectives.
  uint32_t round() const { return round_; }
  void setRound(uint32_t r) { round_ = r; }

  // Starts a collective: publishes its signature (which must be equal on every member).
  void begin(uint64_t signature);
  void publish(Counter c, uint32_t value);
  // Waits until every other member's counter c reached target (wrap-safe), then checks that it runs this
  // collective. Throws ddl::Error: abort, timeout, a peer's failure report, a dead member, a mismatch.
  void waitAll(WaitContext& s, Counter c, uint32_t target);
  // Opens a handle on every member's process (once every member has attached), so that a later death, even
  // with its pid reused, is seen. alive() calls it when it has not been.
  void watchMembers();
  // False once the member's process has ended (its pidfd, or kill(pid, 0)): ddlCommShrink's probe.
  bool alive(int member);
  // Marks the segment failed with why (first one wins) and wakes every waiting member.
  void markFailed(const std::string& why) noexcept;

  // Wait policy, from the channel: spin rounds before yielding, yields before blocking on the futex.
  void setWaitPolicy(int spin_rounds, int yield_rounds) {
    spin_rounds_ = spin_rounds;
    yield_rounds_ = yield_rounds;
  }

  struct Header;
  struct Line;

 private:
  ShmNode() = default;
  Line& line(int member) const;
  void waitOne(WaitContext& s, int member, Counter c, uint32_t target);
  void checkPeer(WaitContext& s, int member);

  std::vector<int> members_;
  int me_ = 0;
  size_t round_bytes_ = 0;
  int buffers_ = 0;
  char* base_ = nullptr;
  size_t map_bytes_ = 0;
  size_t lines_offset_ = 0, data_offset_ = 0;
  std::string name_;  // unlinked by the last member to attach; kept to unlink on failure paths
  uint32_t round_ = 0;
  uint32_t start_round_ = 0;  // round_ when the current collective began
  uint32_t collective_ = 0;   // shared-memory collectives begun
  uint64_t signature_ = 0;
  int spin_rounds_ = 20000, yield_rounds_ = 0;
  std::vector<int> pidfds_;  // per member, once watchMembers ran: a pidfd, or -1 (kill(pid, 0) then)
};

}  // namespace ddl
