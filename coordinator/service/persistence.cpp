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
    for (auto& w : batch) {
      std::string key = w.key();
      auto it = pending_.find(key);
      if (it == pending_.end()) {
        pending_.emplace(std::move(key), std::move(w));
      } else {
        it->second.supersede(std::move(w));
      }
    }
    pending_seq_ = std::max(pending_seq_, seq);
  }
  cv_.notify_one();
}

size_t GroupCommitter::backlog() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
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
      // Take everything queued so far: one transaction for all of it.
      std::map<std::string, state::Write> batch;
      batch.swap(pending_);
      const uint64_t seq = pending_seq_;
      lock.unlock();
      std::vector<state::Write> writes;
      writes.reserve(batch.size());
      for (auto& [key, w] : batch) writes.push_back(std::move(w));
      state::Status st = store_.applyBatch(writes);
      committed_(seq, st, !st && store_.knownUnapplied(st));
      lock.lock();
      if (st) {
        backoff_ms = 0;
      } else {
        // Put the writes back under anything newer for the same keys, and try again later.
        for (auto& w : writes) {
          std::string key = w.key();
          auto it = pending_.find(key);
          if (it == pending_.end())
            pending_.emplace(std::move(key), std::move(w));
          else {
            state::Write newer = std::move(it->second);
            it->second = std::move(w);
            it->second.supersede(std::move(newer));
          }
        }
        backoff_ms =
            backoff_ms == 0 ? options_.retry_min_ms : std::min(backoff_ms * 2, options_.retry_max_ms);
      }
    }
    if (last) return;
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
