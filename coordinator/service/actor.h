// Actor: the coordinator's event loop and its group commit, the one thread every part of the service runs on.
//
// One thread runs an Asio io_context. Work reaches it through post(): each posted function is one turn of the
// loop, and turns never overlap, so the state they touch needs no lock. Nothing on the loop touches the disk:
//  - put() records a change (a whole job or node record, state::Write) during a turn; at the end of the turn
//    the turn's changes, one per key, go to the GroupCommitter (persistence.h) as one batch, or as several
//    when they would pass what one transaction of the store takes (Store::batchLimits): a put that would
//    starts the next one; reserve() keeps changes that must be stored together in one;
//  - afterCommit() runs an effect (a command to an agent, an answer) on the loop once this turn's batch and
//    every earlier one are durable, in the order the effects were made;
//  - reply() answers a caller: a refusal at the end of the turn (never behind a failing store), a success at
//    once only when nothing is waiting to be stored, else after the commit;
//  - replyUnlessLost() is reply() for a success that must not wait behind a failing store (a submit): if the
//    first attempt to store its turn's batch fails, known unapplied (Store::knownUnapplied: a failed SQLite
//    transaction; not an etcd request whose answer was lost), `lost` runs instead, at once, with the error.
// A failed commit is retried by the committer until it works; meanwhile health() says why.
//
// The coordinator (coordinator.h) keeps its state in the turns it posts here; its *OnLoop methods assert
// onLoop(). The loop also runs a ticker (startTicker) and any Asio timer made on io().
//
// Threads: post(), call(), health() and backlog() from any thread (call() never from the loop: it would wait
// for itself); everything else on the loop only.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cassert>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "service/persistence.h"
#include "state/store.h"

namespace ddl::coordinator {

class Actor {
 public:
  // Starts the loop thread. `committed` runs on the loop after each batch that became durable, before the
  // effects it releases (the coordinator lets final jobs leave memory there).
  Actor(state::Store& store, GroupCommitter::Options options, std::function<void()> committed);
  // Stops the committer (storing what is left) and the loop.
  ~Actor();
  Actor(const Actor&) = delete;
  Actor& operator=(const Actor&) = delete;

  bool onLoop() const;
  boost::asio::io_context& io();

  // Runs fn on the loop as one turn; then the turn's changes go to the committer.
  void post(std::function<void()> fn);
  // Runs fn on the loop and waits for its answer and, with wait_for_commit, for the changes it made to be
  // durable (a refusal, Status or StatusOr not OK, waits for nothing). Never on the loop.
  template <class R>
  R call(std::function<R()> fn, bool wait_for_commit = true);

  // ---- On the loop ----
  void put(state::Write write);
  // Makes room in the current batch for changes that must be stored together (an array's jobs): false when
  // `writes` writes of `bytes` (Store::writeBytes) could never fit one transaction of the store; else true,
  // having started a new batch first when the current one could not take them.
  bool reserve(size_t writes, size_t bytes);
  // Whether `writes` writes of `bytes` fit one transaction of the store at all.
  bool fitsOneBatch(size_t writes, size_t bytes) const {
    return writes <= limits_.max_writes && bytes <= limits_.max_bytes;
  }
  // What `write` counts for in a batch (Store::writeBytes).
  size_t bytesOf(const state::Write& write) const;
  void afterCommit(std::function<void()> effect);
  void reply(std::function<void()> reply, bool ok);
  // An answer that reports nothing this turn changed (a read): at the end of the turn, whatever waits.
  void replyNow(std::function<void()> reply) { turn_replies_.push_back(std::move(reply)); }
  // A success that leaves once everything up to this turn's batch is durable; if an attempt to store that
  // batch fails first, `lost` runs instead (on the loop, once, with the error) and `reply` never does. The
  // changes themselves stay queued and are stored when the store works again: `lost` undoes what it must.
  void replyUnlessLost(std::function<void()> reply, std::function<void(const state::Status&)> lost);
  // The end of a turn: hands the changes to the committer, runs the effects and answers that may run. post()
  // does this after every turn; a timer's handler calls it itself.
  void flush();
  // The batch this turn's changes will be part of, and the last batch known durable.
  uint64_t nextBatch() const { return issued_seq_ + 1; }
  uint64_t committedBatch() const { return committed_seq_; }
  // Every period_ms: tick(), then flush(), until stopTicker(). Starting it twice does nothing.
  void startTicker(int64_t period_ms, std::function<void()> tick);
  void stopTicker();

  // ---- Any thread ----
  StoreHealth health() const;
  size_t backlog() const { return committer_->backlog(); }
  // Tries once more to store what is waiting, then ends the committer's thread (the daemon's shutdown).
  void stopCommitter();
  // Ends the loop thread; what was posted and has not run is dropped. Any thread but the loop.
  void stopLoop();

 private:
  struct Loop;  // the io_context, its thread and the ticker (actor.cpp)
  void committedOnLoop(uint64_t seq, const state::Status& status, bool unapplied);
  void setHealth(bool ok, const std::string& message);

  // Hands this turn's changes so far to the committer as one batch, and its effects so far to wait for it.
  void issueBatch();

  struct Dirty {
    state::Write write;
    size_t bytes = 0;  // Store::writeBytes
  };
  std::unique_ptr<Loop> loop_;
  state::Store& store_;
  const state::Store::BatchLimits limits_;
  std::function<void()> committed_;
  std::map<std::string, Dirty> dirty_;  // this turn's changes since its last batch, by key
  size_t dirty_bytes_ = 0;
  // An effect waiting for its batch; `lost` set: it is dropped, and `lost` run, if that batch fails once.
  struct Effect {
    uint64_t seq = 0;
    std::function<void()> run;
    std::function<void(const state::Status&)> lost;
  };
  std::vector<Effect> turn_effects_;                 // this turn's effects (seq not yet known)
  std::vector<std::function<void()>> turn_replies_;  // this turn's answers that wait for nothing
  std::deque<Effect> effects_;                       // waiting for their batch, in order
  uint64_t issued_seq_ = 0;                                         // the last batch handed to the committer
  uint64_t committed_seq_ = 0;                                      // the last batch known durable
  mutable std::mutex health_mu_;
  StoreHealth health_;
  std::unique_ptr<GroupCommitter> committer_;  // after loop_: destroyed first, its callback posts to the loop
};

namespace detail {
template <class T>
bool succeeded(const state::StatusOr<T>& r) {
  return r.isOk();
}
inline bool succeeded(const state::Status& s) { return s.isOk(); }
template <class R>
bool succeeded(const R&) {
  return true;
}
}  // namespace detail

template <class R>
R Actor::call(std::function<R()> fn, bool wait_for_commit) {
  assert(!onLoop() && "a synchronous call from the loop would wait for itself");
  std::promise<R> promise;
  auto future = promise.get_future();
  post([&] {
    auto result = std::make_shared<R>(fn());
    // Without waiting for the commit, the answer still leaves at the end of the turn, once its changes are
    // handed to the committer: a stopCommitter() after the call then stores them.
    if (!wait_for_commit) return replyNow([&promise, result] { promise.set_value(std::move(*result)); });
    reply([&promise, result] { promise.set_value(std::move(*result)); }, detail::succeeded(*result));
  });
  return future.get();
}

}  // namespace ddl::coordinator
