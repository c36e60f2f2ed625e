// The coordinator's event loop and its group commit (actor.h): turns, batches within the store's limits,
// effects and answers released as their batches become durable.
#include "service/actor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <thread>

namespace ddl::coordinator {

// The loop: one io_context run by one thread, and the ticker's timer.
struct Actor::Loop {
  boost::asio::io_context io;
  boost::asio::executor_work_guard<boost::asio::io_context::executor_type> work{io.get_executor()};
  boost::asio::steady_timer ticker{io};
  bool ticking = false;
  bool ticker_stopped = false;
  std::thread thread;
  std::atomic<std::thread::id> id{};
};

Actor::Actor(state::Store& store, GroupCommitter::Options options, std::function<void()> committed)
    : loop_(std::make_unique<Loop>()),
      store_(store),
      limits_(store.batchLimits()),
      committed_(std::move(committed)) {
  committer_ = std::make_unique<GroupCommitter>(
      store, options, [this](uint64_t seq, const state::Status& st, bool unapplied) {
        // On the committer's thread: health now (so /healthz does not wait for a busy loop), the rest on the
        // loop.
        setHealth(st.isOk(), st.isOk() ? ""
                                       : std::string(kCannotStoreState) + ": " + st.message() +
                                             "; retrying (new submits are refused until it works)");
        post([this, seq, st, unapplied] { committedOnLoop(seq, st, unapplied); });
      });
  loop_->thread = std::thread([this] {
    loop_->id = std::this_thread::get_id();
    loop_->io.run();
  });
  // The loop's id is set before it runs anything; wait for it so onLoop() is right from here on.
  call<bool>([] { return true; }, /*wait_for_commit=*/false);
}

Actor::~Actor() {
  stopCommitter();
  stopLoop();
}

bool Actor::onLoop() const { return std::this_thread::get_id() == loop_->id; }

boost::asio::io_context& Actor::io() { return loop_->io; }

void Actor::post(std::function<void()> fn) {
  boost::asio::post(loop_->io, [this, fn = std::move(fn)] {
    fn();
    flush();
  });
}

void Actor::put(state::Write w) {
  assert(onLoop());
  std::string key = w.key();
  const size_t bytes = store_.writeBytes(w);
  auto it = dirty_.find(key);
  // A batch never passes what one transaction of the store takes: a write that would make it do so starts the
  // next batch (each batch is whole records; what must be stored together reserve()s its room first).
  const size_t writes_after = dirty_.size() + (it == dirty_.end() ? 1 : 0);
  const size_t bytes_after = dirty_bytes_ - (it == dirty_.end() ? 0 : it->second.bytes) + bytes;
  if (!dirty_.empty() && (writes_after > limits_.max_writes || bytes_after > limits_.max_bytes)) {
    issueBatch();
    it = dirty_.end();
  }
  if (it == dirty_.end()) {
    dirty_.emplace(std::move(key), Dirty{std::move(w), bytes});
  } else {
    dirty_bytes_ -= it->second.bytes;
    it->second.write.supersede(std::move(w));
    it->second.bytes = bytes;
  }
  dirty_bytes_ += bytes;
}

bool Actor::reserve(size_t writes, size_t bytes) {
  assert(onLoop());
  if (!fitsOneBatch(writes, bytes)) return false;
  if (dirty_.size() + writes > limits_.max_writes || dirty_bytes_ + bytes > limits_.max_bytes) issueBatch();
  return true;
}

size_t Actor::bytesOf(const state::Write& w) const { return store_.writeBytes(w); }

void Actor::afterCommit(std::function<void()> effect) {
  assert(onLoop());
  turn_effects_.push_back({0, std::move(effect), nullptr});
}

void Actor::replyUnlessLost(std::function<void()> reply, std::function<void(const state::Status&)> lost) {
  assert(onLoop());
  if (dirty_.empty() && committed_seq_ == issued_seq_) return replyNow(std::move(reply));
  turn_effects_.push_back({0, std::move(reply), std::move(lost)});
}

void Actor::reply(std::function<void()> reply, bool ok) {
  assert(onLoop());
  // A refusal waits for nothing; a success only when everything it may report is already durable.
  if (!ok || (dirty_.empty() && committed_seq_ == issued_seq_)) {
    turn_replies_.push_back(std::move(reply));  // nothing to wait for: after this turn's commands, at once
  } else {
    afterCommit(std::move(reply));
  }
}

void Actor::issueBatch() {
  if (!dirty_.empty()) {
    std::vector<state::Write> batch;
    batch.reserve(dirty_.size());
    for (auto& [key, d] : dirty_) batch.push_back(std::move(d.write));
    dirty_.clear();
    dirty_bytes_ = 0;
    committer_->write(++issued_seq_, std::move(batch));
  }
  for (auto& e : turn_effects_) {
    e.seq = issued_seq_;
    effects_.push_back(std::move(e));
  }
  turn_effects_.clear();
}

void Actor::flush() {
  issueBatch();
  while (!effects_.empty() && effects_.front().seq <= committed_seq_) {
    auto effect = std::move(effects_.front().run);
    effects_.pop_front();
    effect();
  }
  std::vector<std::function<void()>> replies;
  replies.swap(turn_replies_);
  for (auto& reply : replies) reply();
}

void Actor::committedOnLoop(uint64_t seq, const state::Status& st, bool unapplied) {
  if (!st) {
    spdlog::error("storing state (batch {}): {}; retrying", seq, st.toString());
    // A failure that may have been applied (etcd's answer lost) decides nothing: the answers wait for the
    // retry, as every other success does.
    if (!unapplied) return;
    // The answers that must not wait behind a failing store: every batch up to `seq` failed this time.
    std::deque<Effect> lost, kept;
    for (auto& e : effects_) (e.lost && e.seq <= seq ? lost : kept).push_back(std::move(e));
    effects_.swap(kept);
    for (auto& e : lost) e.lost(st);
    return;
  }
  committed_seq_ = std::max(committed_seq_, seq);
  if (committed_) committed_();
  // flush() (after this turn) runs the effects that were waiting for it.
}

void Actor::startTicker(int64_t period_ms, std::function<void()> tick) {
  assert(onLoop());
  if (loop_->ticking || loop_->ticker_stopped) return;
  loop_->ticking = true;
  auto arm = std::make_shared<std::function<void()>>();
  *arm = [this, period_ms, tick = std::move(tick), arm] {
    loop_->ticker.expires_after(std::chrono::milliseconds(period_ms));
    loop_->ticker.async_wait([this, tick, arm](const boost::system::error_code& ec) {
      if (ec || loop_->ticker_stopped) {
        *arm = nullptr;  // ends the cycle of the closure holding itself
        return;
      }
      tick();
      flush();
      (*arm)();
    });
  };
  (*arm)();
}

void Actor::stopTicker() {
  assert(onLoop());
  loop_->ticker_stopped = true;
  loop_->ticker.cancel();
}

void Actor::setHealth(bool ok, const std::string& message) {
  std::lock_guard<std::mutex> lock(health_mu_);
  if (ok && !health_.ok) spdlog::info("storing state works again");
  health_.ok = ok;
  health_.message = message;
}

StoreHealth Actor::health() const {
  std::lock_guard<std::mutex> lock(health_mu_);
  return health_;
}

void Actor::stopCommitter() {
  if (committer_) committer_->stop();
}

void Actor::stopLoop() {
  assert(!onLoop());
  loop_->work.reset();
  loop_->io.stop();
  if (loop_->thread.joinable()) loop_->thread.join();
}

}  // namespace ddl::coordinator
