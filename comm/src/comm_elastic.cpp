// Elastic communicators (comm.h): shrink (ddlCommShrink), grow (ddlCommGrow) and join (ddlCommJoin), each
// making the next generation of a communicator through the rendezvous store of the first one, under
// "gen/<g>/".
//
// Shrink: a communicator of the survivors, made from a broken one without a new rendezvous address. The
// survivors agree on who is gone through the rendezvous store the communicator was made with
// (rendezvous/agreement.h: one decision, which every survivor reads), then meet under a prefix of that store
// ("shrink/<generation>/comm/") as a new communicator: new UCX endpoints, a new node segment, the node kernel
// set up again on first use. The parent stays as it is (broken, usually) until the caller destroys it;
// buffers and streams are the caller's and go on with the new communicator.
//
// Cost: the agreement is a few store calls per rank plus the leader's polling (every 2 ms) until every
// survivor has come; then a bootstrap of the survivors (UCX endpoints, one small allreduce on the node).
#include <algorithm>
#include <cstdio>
#include <optional>
#include <set>

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
}

std::unique_ptr<Comm> Comm::nextGeneration(int nranks, int rank, int generation, const Options& options,
                                           const std::shared_ptr<Store>& root, const char* where) {
  Options opts = options;
  opts.topology =
      Topology{};  // the new communicator's own: flat, or (ranks per node) x (nodes) as the nodes say
  std::shared_ptr<Store> store = makePrefixStore(root, "gen/" + std::to_string(generation) + "/");
  auto comm = bootstrap(nranks, rank, *store, true, where, opts, Deadline(options.timeout_ms));
  comm->root_store_ = root;
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
  const std::vector<int> gone = agreeExcluded(
      *root_store_, "shrink/" + std::to_string(generation_) + "/", size_, rank_, suspects,
      [this](int r) { return probeDead(r); }, deadline, read_deadline);
  std::vector<int> members;
  for (int r = 0; r < size_; ++r)
    if (!std::binary_search(gone.begin(), gone.end(), r)) members.push_back(r);
  const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  auto child = nextGeneration(static_cast<int>(members.size()), new_rank, generation_ + 1, options_,
                              root_store_, "the communicator of the survivors (ddlCommShrink)");
  child->store_server_ = store_server_;
  child->excluded_ = gone;
  return child;
}

// Joining (ddlCommGrow, ddlCommJoin), in the root store:
//   join/waiting        a counter: each joining process takes ticket t = its new value
//   join/admitted       how many tickets a grow has dealt with (admitted or found abandoned)
//   join/ticket/<t>     a first-write register: "<generation> <rank>" from the grow that admits it, or "gone"
//                       from a joiner that stopped waiting; whichever came first counts
//   grow/<g>/size       the size of generation g's communicator made by a grow
// A grow of generation g-1 makes generation g: its ranks keep their numbers, the joiners follow in ticket
// order.
namespace {
constexpr const char* kGone = "gone";
std::string ticketKey(int64_t t) { return "join/ticket/" + std::to_string(t); }
}  // namespace

std::unique_ptr<Comm> Comm::grow(int max_new) {
  requireStore("ddlCommGrow");
  if (max_new < 0) fail(ddlInvalidArgument, "ddlCommGrow: maxNewRanks is negative");
  const int room = tag::kMaxRanks - size_;
  const int limit = max_new == 0 ? room : std::min(max_new, room);
  const int generation = generation_ + 1;
  // Rank 0 admits the joiners waiting now (up to the limit), then every rank learns how many.
  int64_t admitted = 0;
  if (rank_ == 0) {
    Store& s = *root_store_;
    const int64_t waiting = s.add("join/waiting", 0);
    const int64_t first = s.add("join/admitted", 0);
    int64_t t = first;
    const Deadline d(options_.timeout_ms);
    for (; t < waiting && admitted < limit; ++t) {
      const std::string mine = std::to_string(generation) + " " + std::to_string(size_ + admitted);
      if (firstWriteWins(s, ticketKey(t + 1), mine, d) == mine) ++admitted;
    }
    s.add("join/admitted", t - first);  // rank 0 of the lineage is its only writer
    if (admitted) s.set("grow/" + std::to_string(generation) + "/size", std::to_string(size_ + admitted));
  }
  int64_t count = 0;
  allReduce(&admitted, &count, 1, ddlInt64, ddlMax);
  if (count == 0) return nullptr;
  auto lk = lockOp();
  auto child = nextGeneration(size_ + static_cast<int>(count), rank_, generation, options_, root_store_,
                              "the grown communicator (ddlCommGrow)");
  child->store_server_ = store_server_;
  return child;
}

std::unique_ptr<Comm> Comm::join(const std::string& root, const Options& options) {
  std::string host;
  int port = 0;
  parseHostPort(root, &host, &port);
  if (port == 0) fail(ddlInvalidArgument, "rendezvous address '" + root + "' needs a non-zero port");
  std::shared_ptr<Store> store = connectTcpStore(host, port, Deadline(options.timeout_ms), options.secret);
  return join(store, options);
}

std::unique_ptr<Comm> Comm::join(const std::shared_ptr<Store>& root, const Options& options) {
  const int64_t t = root->add("join/waiting", 1);
  const Deadline deadline(options.timeout_ms);
  std::string admitted;
  try {
    admitted = root->get(ticketKey(t) + "/value", deadline);
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
  const std::string size = root->get("grow/" + std::to_string(generation) + "/size", deadline);
  const int nranks =
      static_cast<int>(parseInt(size, "the grown communicator's size", rank + 1, tag::kMaxRanks));
  return nextGeneration(nranks, rank, generation, options, root, "the grown communicator (ddlCommJoin)");
}

}  // namespace ddl
