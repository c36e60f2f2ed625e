// The coordinator's store threads (persistence.h): the GroupCommitter and the StoreReader.
#include "service/persistence.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

namespace ddl::coordinator {

GroupCommitter::GroupCommitter(state::Store& store, Options options, Committed committed)
    : store_(store), options_(std::move(options)), committed_(std::move(committed)) {
  thread_ = std::thread([this] { run(); });
}

GroupCommitter::~GroupCommitter() { stop(); }

void GroupCommitter::write(uint64_t seq, std::vector<state::Write> batch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    Batch b;
    b.seq = seq;
    for (auto& w : batch) {
      std::string key = w.key();
      auto it = b.writes.find(key);
      if (it == b.writes.end()) {
        b.writes.emplace(std::move(key), std::move(w));
      } else {
        it->second.supersede(std::move(w));
      }
    }
    pending_writes_ += b.writes.size();
    pending_.push_back(std::move(b));
  }
  cv_.notify_one();
}

size_t GroupCommitter::backlog() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_writes_;
}

std::map<std::string, state::Write> GroupCommitter::takeGroup(uint64_t* seq) {
  const state::Store::BatchLimits limits = store_.batchLimits();
  // An unbounded store (SQLite) takes everything queued: no sizes to count.
  const bool bounded = limits.max_writes != SIZE_MAX || limits.max_bytes != SIZE_MAX;
  std::map<std::string, state::Write> group;
  std::map<std::string, size_t> bytes_of;  // per key in the group, as Store::writeBytes counts
  size_t bytes = 0;
  while (!pending_.empty()) {
    Batch& next = pending_.front();
    const size_t count = next.writes.size();
    if (bounded) {
      // What the group would hold with `next` folded in: its new keys and bytes, a replaced key's new bytes.
      size_t writes_after = group.size(), bytes_after = bytes;
      std::vector<std::pair<const std::string*, size_t>> sizes;
      for (const auto& [key, w] : next.writes) {
        const size_t b = store_.writeBytes(w);
        sizes.emplace_back(&key, b);
        auto old = bytes_of.find(key);
        if (old == bytes_of.end()) {
          ++writes_after;
          bytes_after += b;
        } else {
          bytes_after = bytes_after - old->second + b;
        }
      }
      if (!group.empty() && (writes_after > limits.max_writes || bytes_after > limits.max_bytes)) break;
      for (auto& [key, b] : sizes) bytes_of[*key] = b;
      bytes = bytes_after;
    }
    if (group.empty()) {
      group = std::move(next.writes);  // the common case: one batch waiting, taken whole
    } else {
      for (auto& [key, w] : next.writes) {
        auto it = group.find(key);
        if (it == group.end()) {
          group.emplace(key, std::move(w));
        } else {
          it->second.supersede(std::move(w));
        }
      }
    }
    pending_writes_ -= count;
    *seq = next.seq;
    pending_.pop_front();
  }
  return group;
}

void GroupCommitter::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void GroupCommitter::run() {
  using Clock = std::chrono::steady_clock;
  int64_t backoff_ms = 0;  // 0: the last commit worked
  auto next_purge =
      Clock::now() + std::chrono::milliseconds(std::min<int64_t>(options_.purge_interval_ms, 5000));
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const auto wake = backoff_ms > 0              ? Clock::now() + std::chrono::milliseconds(backoff_ms)
                      : options_.retention_ms > 0 ? next_purge
                                                  : Clock::now() + std::chrono::hours(1);
    cv_.wait_until(lock, wake, [&] { return stopping_ || (backoff_ms == 0 && !pending_.empty()); });
    const bool last = stopping_;
    if (!pending_.empty() && (backoff_ms == 0 || Clock::now() >= wake || last)) {
      // The oldest batches that fit one transaction together: one commit for all of them.
      uint64_t seq = 0;
      std::map<std::string, state::Write> group = takeGroup(&seq);
      lock.unlock();
      std::vector<state::Write> writes;
      writes.reserve(group.size());
      for (auto& [key, w] : group) writes.push_back(std::move(w));
      state::Status st = store_.applyBatch(writes);
      committed_(seq, st, !st && store_.knownUnapplied(st));
      lock.lock();
      if (st) {
        // More may be waiting that did not fit this group: at once, no backoff.
        backoff_ms = 0;
      } else {
        // The group back in front, whole (it fits), to be tried again later before anything newer.
        Batch again;
        again.seq = seq;
        for (auto& w : writes) again.writes.emplace(w.key(), std::move(w));
        pending_writes_ += again.writes.size();
        pending_.push_front(std::move(again));
        backoff_ms =
            backoff_ms == 0 ? options_.retry_min_ms : std::min(backoff_ms * 2, options_.retry_max_ms);
      }
    }
    // Stopping: what is left, group after group while they are stored; one failure ends it (the state on
    // disk is then what was acknowledged, and a restarted coordinator recovers from it).
    if (last && (pending_.empty() || backoff_ms > 0)) return;
    if (last) continue;
    if (options_.retention_ms > 0 && backoff_ms == 0 && pending_.empty() && Clock::now() >= next_purge) {
      next_purge = Clock::now() + std::chrono::milliseconds(options_.purge_interval_ms);
      lock.unlock();
      const int64_t cutoff = options_.wall_ms() - options_.retention_ms;
      int total = 0;
      for (int round = 0; round < 100; ++round) {  // at most 100,000 jobs a pass; the next pass goes on
        auto removed = store_.purgeFinished(cutoff, 1000);
        if (!removed) {
          spdlog::warn("purging old jobs from the store: {}", removed.status().toString());
          break;
        }
        total += *removed;
        if (*removed < 1000) break;
      }
      if (total > 0)
        spdlog::info("purged {} jobs that ended more than {} h ago", total, options_.retention_ms / 3600000);
      lock.lock();
    }
  }
}

StoreReader::StoreReader() {
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, nothing left
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      lock.lock();
    }
  });
}

StoreReader::~StoreReader() { stop(); }

bool StoreReader::run(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ || tasks_.size() >= kMaxQueued) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void StoreReader::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

}  // namespace ddl::coordinator
