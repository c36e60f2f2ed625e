// Elastic communicators (comm.h): shrink (ddlCommShrink), grow (ddlCommGrow) and join (ddlCommJoin), each
// making the next generation of a communicator through the rendezvous store of the first one, under
// "gen/<g>/".
//
// Shrink: a communicator of the survivors, made from a broken one without a new rendezvous address. The
// survivors agree on who is gone through the rendezvous store the communicator was made with
// (rendezvous/agreement.h: one decision, which every survivor reads, under "shrink/<generation>/<attempt>/"),
// then meet under "gen/<the decision's generation>/" of that store as a new communicator: new UCX endpoints,
// a new node segment, the node kernel set up again on first use. The parent stays as it is (broken, usually)
// until the caller destroys it; buffers and streams are the caller's and go on with the new communicator.
//
// Cost: the agreement is a few store calls per rank plus the leader's polling (every 2 ms) until every
// survivor has come; then a bootstrap of the survivors (UCX endpoints, one small allreduce on the node).
#include <algorithm>
#include <cstdio>
#include <optional>

#include "comm.h"
#include "env.h"
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

void Comm::requireStore(const char* fn) const {
  if (!root_store_) {
    fail(ddlInvalidArgument,
         std::string(fn) +
             ": this communicator has no rendezvous store (it was made over a transport of a test)");
  }
  if (!root_store_->canAdd()) {
    fail(ddlInvalidArgument,
         std::string(fn) +
             ": the communicator's store (ddlStore_t) has no add function, which agreeing "
             "and admitting need");
  }
}

std::unique_ptr<Comm> Comm::nextGeneration(int nranks, int rank, int generation, const Options& options,
                                           const std::shared_ptr<Store>& root,
                                           const std::shared_ptr<TcpStoreServer>& server, const char* where) {
  Options opts = options;
  opts.topology =
      Topology{};  // the new communicator's own: flat, or (ranks per node) x (nodes) as the nodes say
  std::shared_ptr<Store> store = makePrefixStore(root, "gen/" + std::to_string(generation) + "/");
  auto comm = bootstrap(nranks, rank, *store, true, where, opts, Deadline(options.timeout_ms));
  comm->root_store_ = root;
  comm->store_server_ = server;  // rank 0's, while any generation may still meet through it
  comm->store_ = std::move(store);
  comm->generation_ = generation;
  return comm;
}

std::unique_ptr<Comm> Comm::shrink(const std::vector<int>& exclude) {
  requireStore("ddlCommShrink");
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

  const Deadline deadline(options_.timeout_ms), read_deadline(2 * int64_t{options_.timeout_ms});
  // Every survivor calls shrink the same number of times on this communicator (again after one whose new
  // communicator failed to form): each attempt agrees anew.
  const Agreement agreed = agreeExcluded(
      *root_store_, "shrink/" + std::to_string(generation_) + "/" + std::to_string(attempts_++) + "/", size_,
      rank_, suspects, [this](int r) { return probeDead(r); }, deadline, read_deadline);
  const std::vector<int>& gone = agreed.excluded;
  std::vector<int> members;
  for (int r = 0; r < size_; ++r)
    if (!std::binary_search(gone.begin(), gone.end(), r)) members.push_back(r);
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  auto child =
      nextGeneration(static_cast<int>(members.size()), new_rank, agreed.generation, options_, root_store_,
                     store_server_, "the communicator of the survivors (ddlCommShrink)");
  child->excluded_ = gone;
  return child;
}

// Joining (ddlCommGrow, ddlCommJoin), in the root store:
//   join/waiting        a counter: each joining process takes ticket t = its new value
//   join/admitted       how many tickets a grow has dealt with (admitted or found abandoned)
//   join/ticket/<t>     a first-write register: "<generation> <rank>" from the grow that admits it, or "gone"
//                       from a joiner that stopped waiting; whichever came first counts
//   grow/<g>/size       the size of generation g's communicator made by a grow
//   generation          a counter: each new generation's number (a grow's rank 0, a shrink's leader), so that
//                       no attempt, even one whose communicator never formed, shares another's keys
// The grown communicator's ranks keep their numbers, the joiners follow in ticket order.
namespace {
constexpr const char* kGone = "gone";
std::string ticketKey(int64_t t) { return "join/ticket/" + std::to_string(t); }
}  // namespace

std::unique_ptr<Comm> Comm::grow(int max_new) {
  requireStore("ddlCommGrow");
  if (max_new < 0) fail(ddlInvalidArgument, "ddlCommGrow: maxNewRanks is negative");
  const int room = tag::kMaxRanks - size_;
  const int limit = max_new == 0 ? room : std::min(max_new, room);
  // Rank 0 admits the joiners waiting now (up to the limit), then every rank learns how many, the generation,
  // and whether rank 0 failed: {admitted, generation, failed}, the others' zeros under MAX.
  int64_t mine[3] = {0, 0, 0}, all[3] = {0, 0, 0};
  std::string why;
  if (rank_ == 0) {
    try {
      Store& s = *root_store_;
      const int64_t generation = s.add("generation", 1);
      const int64_t waiting = s.add("join/waiting", 0);
      const int64_t first = s.add("join/admitted", 0);
      int64_t t = first;
      for (; t < waiting && mine[0] < limit; ++t) {
        const std::string admit = std::to_string(generation) + " " + std::to_string(size_ + mine[0]);
        // A joiner that died between its two writes of "gone" leaves the register unwritten: after a few
        // seconds the ticket counts as given up.
        std::string got;
        try {
          got = firstWriteWins(s, ticketKey(t + 1), admit, Deadline(std::min(options_.timeout_ms, 5000)));
        } catch (const Error& e) {
          if (e.code() != ddlTimeout) throw;
        }
        if (got == admit) ++mine[0];
      }
      s.add("join/admitted", t - first);  // rank 0 of the lineage is its only writer
      if (mine[0]) s.set("grow/" + std::to_string(generation) + "/size", std::to_string(size_ + mine[0]));
      mine[1] = generation;
    } catch (const Error& e) {
      mine[2] = 1;  // the others learn it below instead of waiting for rank 0
      why = e.what();
    }
  }
  allReduce(mine, all, 3, ddlInt64, ddlMax);
  if (all[2]) {
    const std::string cause = why.empty() ? " (rank 0's ddlCommGrow returned why)" : ": " + why;
    fail(ddlSystemError,
         "ddlCommGrow: rank 0 could not admit joiners" + cause + "; this communicator goes on");
  }
  if (all[0] == 0) return nullptr;
  auto lk = lockOp();
  return nextGeneration(size_ + static_cast<int>(all[0]), rank_, static_cast<int>(all[1]), options_,
                        root_store_, store_server_, "the grown communicator (ddlCommGrow)");
}

std::unique_ptr<Comm> Comm::join(const std::string& root, const Options& options) {
  std::string host;
  int port = 0;
  parseRoot(root, &host, &port);
  std::shared_ptr<Store> store = connectTcpStore(host, port, Deadline(options.timeout_ms), options.secret);
  return join(store, options);
}

std::unique_ptr<Comm> Comm::join(const std::shared_ptr<Store>& root, const Options& options) {
  const int64_t t = root->add("join/waiting", 1);
  const Deadline deadline(options.timeout_ms);
  std::string admitted;
  try {
    admitted = firstWriteValue(*root, ticketKey(t), deadline);
  } catch (const Error& e) {
    if (e.code() != ddlTimeout) throw;
    // Not admitted in time: give the ticket up, unless a grow has just taken it.
    admitted = firstWriteWins(*root, ticketKey(t), kGone, Deadline(options.timeout_ms));
    if (admitted == kGone) {
      fail(ddlTimeout, "ddlCommJoin: no communicator grew to admit this process within " +
                           std::to_string(options.timeout_ms) +
                           " ms (the running ranks admit joiners when they call ddlCommGrow)");
    }
  }
  int generation = 0, rank = 0;
  if (std::sscanf(admitted.c_str(), "%d %d", &generation, &rank) != 2 || generation < 1 || rank < 1) {
    fail(ddlInternalError, "ddlCommJoin: a malformed admission in the store: '" + admitted + "'");
  }
  // A fresh wait: the admission may have come just as the first one ended; rank 0 writes the size right
  // after.
  const std::string size =
      root->get("grow/" + std::to_string(generation) + "/size", Deadline(options.timeout_ms));
  const int nranks =
      static_cast<int>(parseInt(size, "the grown communicator's size", rank + 1, tag::kMaxRanks));
  return nextGeneration(nranks, rank, generation, options, root, nullptr,
                        "the grown communicator (ddlCommJoin)");
}

}  // namespace ddl
