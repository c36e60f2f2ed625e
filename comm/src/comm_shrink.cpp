// Comm::shrink (comm.h), ddlCommShrink: a communicator of the survivors, made from a broken one without a new
// rendezvous address. The survivors agree on who is gone through the rendezvous store the communicator was
// made with (rendezvous/agreement.h: one decision, which every survivor reads), then meet under a prefix of
// that store
// ("shrink/<generation>/comm/") as a new communicator: new UCX endpoints, a new node segment, the node kernel
// set up again on first use. The parent stays as it is (broken, usually) until the caller destroys it;
// buffers and streams are the caller's and go on with the new communicator.
//
// Cost: the agreement is a few store calls per rank plus the leader's polling (every 2 ms) until every
// survivor has come; then a bootstrap of the survivors (UCX endpoints, one small allreduce on the node).
#include <algorithm>
#include <optional>
#include <set>

#include "comm.h"
#include "error.h"
#include "rendezvous/agreement.h"

namespace ddl {

namespace {
// A probe's tag: the point-to-point bit, a sequence and a unit no point-to-point message has (a tagged one's
// sequence bits above the low 9 are 0, an untagged one's unit is below tag::kUserTag), so no receive matches
// it.
uint64_t probeTag(int rank) {
  return tag::kP2P | tag::kSeqMask | tag::kUnitMask | (static_cast<uint64_t>(rank) << tag::kSrcShift);
}

// Whether rank's process has ended, where it is a member of the node's segment (its process looked at
// directly); nullopt elsewhere.
std::optional<bool> memberDead(ShmNode* shm, int rank) {
  if (!shm) return std::nullopt;
  const std::vector<int>& m = shm->members();
  const auto it = std::find(m.begin(), m.end(), rank);
  if (it == m.end()) return std::nullopt;
  return !shm->alive(static_cast<int>(it - m.begin()));
}

}  // namespace

bool Comm::probeDead(int peer) {
  if (const auto dead = memberDead(shm_.get(), peer)) return *dead;
  Transport& t = channel_->transport();
  if (!t.peerError(peer).empty()) return true;
  if (probes_.empty()) probes_.resize(size_);
  if (!probes_[peer]) {
    static const char kByte = 0;
    probes_[peer] = std::make_unique<Request>();
    t.send(*probes_[peer], peer, probeTag(rank_), &kByte, 1);
  }
  t.progress();
  return !t.peerError(peer).empty() || (probes_[peer]->done && !probes_[peer]->ok);
}

std::unique_ptr<Comm> Comm::shrink(const std::vector<int>& exclude) {
  if (!store_) {
    fail(ddlInvalidArgument,
         "ddlCommShrink: this communicator has no rendezvous store to agree through (made over a transport "
         "of a "
         "test)");
  }
  std::vector<int> suspects;
  for (int r : exclude) {
    if (r < 0 || r >= size_) {
      fail(ddlInvalidArgument, "ddlCommShrink: excluded rank " + std::to_string(r) + " is not in [0, " +
                                   std::to_string(size_ - 1) + "]");
    }
    if (r == rank_) {
      fail(ddlInvalidArgument, "ddlCommShrink: rank " + std::to_string(r) +
                                   " excludes itself: only the ranks that go on call ddlCommShrink");
    }
    suspects.push_back(r);
  }
  drainAsync();  // the queued calls finish, or fail with the communicator
  auto lk = lockOp();
  const Transport& t = channel_->transport();
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && (!t.peerError(r).empty() || memberDead(shm_.get(), r).value_or(false)))
      suspects.push_back(r);

  const std::string prefix = "shrink/" + std::to_string(generation_) + "/";
  const Deadline deadline(options_.timeout_ms), read_deadline(2 * int64_t{options_.timeout_ms});
  const std::vector<int> gone = agreeExcluded(
      *store_, prefix + "agree/", size_, rank_, suspects, [this](int r) { return probeDead(r); }, deadline,
      read_deadline);
  std::vector<int> members;
  for (int r = 0; r < size_; ++r)
    if (!std::binary_search(gone.begin(), gone.end(), r)) members.push_back(r);
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());

  Options opts = options_;
  opts.topology = Topology{};  // the survivors' own: flat, or (ranks per node) x (nodes) as the nodes say
  std::shared_ptr<Store> store = makePrefixStore(store_, prefix + "comm/");
  auto child =
      bootstrap(static_cast<int>(members.size()), new_rank, *store, true,
                "the communicator of the survivors (ddlCommShrink)", opts, Deadline(options_.timeout_ms));
  child->store_ = std::move(store);
  child->store_server_ = store_server_;
  child->generation_ = generation_ + 1;
  child->excluded_ = gone;
  return child;
}

}  // namespace ddl
