// The coordinator's two store threads. The event loop (coordinator.h) never waits for the disk: it hands its
// changes to the GroupCommitter and its history reads to the StoreReader, and hears back through callbacks.
//
// GroupCommitter: one thread that stores batches of writes. Batches handed over while a commit is running are
// folded together (by key: a later write of a job or node replaces an earlier one), so at 1,000 submits a
// second the disk sees one transaction and one fsync per commit time, not one per change. The group is built
// of whole batches within what one transaction of the store takes (Store::batchLimits, as LevelDB's
// BuildBatchGroup caps its group): a batch is never split, so each is stored whole or not at all. The loop
// hands over batches within those limits (Actor::put cuts a turn that would pass them). After each attempt
// it calls `committed(seq, status, unapplied)` on its own thread: OK means every batch up to `seq` is
// durable; an error means nothing new is known durable (`unapplied`: and none of it is,
// Store::knownUnapplied), and the same writes (plus any newer) are tried again after a backoff, for as long
// as it takes. What waits is bounded by the coordinator's state: one write per job and node at most. It also
// purges final jobs past their retention from the store, a chunk at a time, between commits.
//
// StoreReader: one thread that runs reads of history (jobs no longer kept in memory) with a bounded queue, so
// a slow disk delays listings of old jobs and nothing else.
//
// Threads: write()/run() from any thread; the callbacks run on the respective worker thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "state/store.h"

namespace ddl::coordinator {

// Whether the coordinator can store its state (the last commit worked), and if not, why.
struct StoreHealth {
  bool ok = true;
  std::string message;  // why not, for /healthz and the log
  // A standby coordinator's dashboard (not ok, message "standby: ... leads"): it serves /healthz and /metrics
  // only, saying so, and stores nothing.
  bool standby = false;
};

class GroupCommitter {
 public:
  struct Options {
    int64_t retry_min_ms = 100;  // first wait after a failed commit, doubling up to retry_max_ms
    int64_t retry_max_ms = 5000;
    int64_t retention_ms = 0;  // final jobs older than this are purged from the store; 0: kept forever
    int64_t purge_interval_ms = 60000;  // how often to look for them
    std::function<int64_t()> wall_ms;   // unix ms, for the retention
  };
  using Committed = std::function<void(uint64_t seq, const state::Status& status, bool unapplied)>;

  GroupCommitter(state::Store& store, Options options, Committed committed);
  ~GroupCommitter();
  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Queues a batch; `seq` grows with every call. Never blocks on the disk.
  void write(uint64_t seq, std::vector<state::Write> batch);
  // Tries once more to store what is queued, then ends the thread.
  void stop();
  // Writes waiting to be stored (for metrics).
  size_t backlog() const;

 private:
  void run();

  state::Store& store_;
  const Options options_;
  const Committed committed_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  // A batch as the loop handed it over (or a failed group, put back whole), oldest first; bounded by the jobs
  // and nodes in memory, since the loop makes at most one write per key per batch and folding happens here.
  struct Batch {
    uint64_t seq = 0;
    std::map<std::string, state::Write> writes;  // by Write::key()
  };
  // The oldest batches, folded by key while they fit one transaction (at least the first); their last seq.
  std::map<std::string, state::Write> takeGroup(uint64_t* seq);
  std::deque<Batch> pending_;
  size_t pending_writes_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

class StoreReader {
 public:
  static constexpr size_t kMaxQueued = 256;

  StoreReader();
  ~StoreReader();
  StoreReader(const StoreReader&) = delete;
  StoreReader& operator=(const StoreReader&) = delete;

  // Runs `task` on the reader thread; false (and `task` dropped) when kMaxQueued reads are already waiting.
  bool run(std::function<void()> task);
  void stop();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ddl::coordinator
