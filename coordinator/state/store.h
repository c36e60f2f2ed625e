// Store: the coordinator's durable state — jobs with their lifecycle, the node registry, and entries: small
// keyed records whose owners above the store encode them (users, accounts and join tokens: auth/users.h).
//
// The coordinator keeps its working copy in memory and writes every change through a Store, so that after a
// restart (a crash or kill -9 included) every job and node comes back as it was. Implementations:
//  - SqliteStore (sqlite_store.h): the embedded default, one file in WAL mode;
//  - MemoryStore (memory_store.h): no persistence, for tests of higher layers;
//  - EtcdStore (etcd_store.h): etcd's v3 API, shared by several coordinators of which one leads.
//
// Contract for every implementation:
//  - Thread-safe: any thread may call any method, concurrently. Each call is atomic: another caller sees
//    all of it or none of it.
//  - applyBatch() returns OK only once every write in it is durable (for SqliteStore: synced to disk), so
//    the coordinator acknowledges a submit as soon as the batch holding it is applied.
//  - No exceptions cross the interface; errors are Status values whose message names the job or node.
//  - State rules live in job.h (allowedTransition / applyTransition), applied by the store's callers; a store
//    keeps what it is given.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "state/job.h"

namespace ddl::state {

struct JobFilter {
  std::set<JobState> states;        // Empty: any state.
  std::optional<std::string> user;  // nullopt: any user.
  std::optional<std::string> name;  // nullopt: any name.
  int64_t since_ms = 0;             // 0: no bound; else submitted at or after (unix ms).
  int64_t until_ms = 0;             // 0: no bound; else submitted before (unix ms).
};

// A value under (table, key) that the store keeps as given: what the coordinator's other records are (users,
// accounts, join tokens) without a table, a codec and a migration each in every store. Its owner encodes the
// value and bounds how many a table holds. Table names are a-z and '_' (1 to 32; not "jobs", "nodes" or
// "meta", which EtcdStore's layout uses); keys are 1 to 256 bytes without '/' or control characters; values
// at most 64 KiB. checkEntry says why one is refused.
struct Entry {
  std::string table;
  std::string key;
  std::string value;

  bool operator==(const Entry&) const = default;
};
inline constexpr size_t kMaxEntryValueBytes = 64 * 1024;
// "" when `e` may be stored (its value is not looked at when value_too); else why not.
inline std::string checkEntry(const Entry& e, bool value_too = true);
inline Status entryRefused(const Entry& e,
                           bool value_too = true);  // INVALID_ARGUMENT with checkEntry's reason, or OK

// One change in a batch (Store::applyBatch). Records are stored whole; a later write of the same key()
// replaces an earlier one that has not been applied yet, so a batch holds at most one write per job, node and
// entry.
struct Write {
  enum class Kind { kPutJob, kPutNode, kDeleteNode, kPutEntry, kDeleteEntry };
  Kind kind = Kind::kPutJob;
  Job job;               // kPutJob: the job as it is now.
  bool new_job = false;  // kPutJob: the job's first write, so its spec (which never changes) is written too.
  NodeRecord node;       // kPutNode.
  std::string name;      // kDeleteNode: the node's name.
  Entry entry;           // kPutEntry; kDeleteEntry: its table and key.

  static Write putEntry(Entry e) {
    Write w;
    w.kind = Kind::kPutEntry;
    w.entry = std::move(e);
    return w;
  }
  static Write deleteEntry(std::string table, std::string key) {
    Write w;
    w.kind = Kind::kDeleteEntry;
    w.entry = {std::move(table), std::move(key), ""};
    return w;
  }

  std::string key() const {
    switch (kind) {
      case Kind::kPutJob:
        return "j:" + job.id;
      case Kind::kPutNode:
        return "n:" + node.name;
      case Kind::kDeleteNode:
        return "n:" + name;
      case Kind::kPutEntry:
      case Kind::kDeleteEntry:
        return "e:" + entry.table + "/" + entry.key;
    }
    return "";
  }
  // Folds a later write of the same key into this one.
  void supersede(Write later) {
    const bool was_new = kind == Kind::kPutJob && new_job;
    *this = std::move(later);
    if (kind == Kind::kPutJob) new_job = new_job || was_new;
  }
};

// The durable state as the coordinator's event loop uses it: it keeps jobs and nodes itself, in memory, and
// stores them in batches (LevelDB's shape: a single change is a batch of one). Reads are for recovery at
// start and for pages of old jobs no longer kept in memory. One-change-at-a-time calls (create a job, move
// it, register a node) are helpers over these in direct_store.h, for tests, benches and tools.
class Store {
 public:
  virtual ~Store() = default;

  // Applies every write in one transaction: all of them become durable, or none (the error says why). A
  // batch beyond batchLimits() is refused (INVALID_ARGUMENT), never split: callers build batches within them.
  virtual Status applyBatch(const std::vector<Write>& batch) = 0;
  // What one transaction takes: at most max_writes writes of at most max_bytes in all, as writeBytes counts.
  // The coordinator's group commit builds every batch within them, and a change that could never fit one is
  // refused where it is made. Unbounded by default (SQLite).
  struct BatchLimits {
    size_t max_writes = SIZE_MAX;
    size_t max_bytes = SIZE_MAX;
  };
  virtual BatchLimits batchLimits() const { return {}; }
  // An upper bound of the bytes `w` takes in a batch, cheap enough for every change (no encoding); 0 where
  // the store counts no bytes.
  virtual size_t writeBytes(const Write& w) const { return 0; }
  // Whether a batch that failed with `failure` is known not to have been applied. By default it is (a local
  // transaction that failed was rolled back); a remote store whose answer was lost cannot say (etcd).
  virtual bool knownUnapplied(const Status& failure) const { return true; }

  // NOT_FOUND (jobNotFound) for an id that is not a job id or was never stored (or was purged).
  virtual StatusOr<Job> getJob(const std::string& id) = 0;
  // All nodes, by name.
  virtual StatusOr<std::vector<NodeRecord>> listNodes() = 0;
  // Every entry of `table` by key ("": of every table, by table and key).
  virtual StatusOr<std::vector<Entry>> listEntries(const std::string& table) = 0;
  // The highest job number ever stored (0 for none); never goes down, not even when old jobs are purged.
  virtual StatusOr<int64_t> lastJobNumber() = 0;
  // At most `limit` jobs matching the filter whose number is above `after_number`; or, with newest_first, the
  // newest ones below `after_number` (0: from the newest). Either way in ascending order.
  virtual StatusOr<std::vector<Job>> listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                                  bool newest_first = false) = 0;
  // Removes at most `limit` jobs that ended (SUCCEEDED, FAILED, CANCELLED) before ended_before_ms; returns
  // how many it removed.
  virtual StatusOr<int> purgeFinished(int64_t ended_before_ms, int limit) = 0;
};

// The system clock as unix milliseconds: the default clock of the stores.
inline int64_t systemNowMs() { return unixNowMs(); }

// Shared by the implementations so their messages match.
inline Status jobNotFound(const std::string& id) {
  return Status::notFound("job " + id + " not found; list jobs to see the ids that exist");
}
inline Status nodeNotFound(const std::string& name) {
  return Status::notFound("node " + name + " not found; it has never registered");
}
inline std::string checkEntry(const Entry& e, bool value_too) {
  if (e.table.empty() || e.table.size() > 32) return "an entry's table has 1 to 32 characters";
  for (char c : e.table) {
    if (!(c >= 'a' && c <= 'z') && c != '_') return "entry table '" + e.table + "' may hold only a-z and '_'";
  }
  if (e.table == "jobs" || e.table == "nodes" || e.table == "meta")
    return "entry table '" + e.table + "' is reserved";
  if (e.key.empty() || e.key.size() > 256) return "an entry's key has 1 to 256 bytes";
  for (char c : e.key) {
    if (c == '/' || static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return "entry key in '" + e.table + "' holds '/' or a control character";
    }
  }
  if (value_too && e.value.size() > kMaxEntryValueBytes) {
    return "entry " + e.table + "/" + e.key + " is over 64 KiB";
  }
  return "";
}
inline Status entryRefused(const Entry& e, bool value_too) {
  const std::string why = checkEntry(e, value_too);
  return why.empty() ? Status::ok() : Status::invalidArgument("cannot store an entry: " + why);
}

inline bool matches(const JobFilter& filter, const Job& job) {
  return (filter.states.empty() || filter.states.count(job.state) > 0) &&
         (!filter.user || *filter.user == job.spec.user) && (!filter.name || *filter.name == job.spec.name) &&
         (filter.since_ms == 0 || job.submit_ms >= filter.since_ms) &&
         (filter.until_ms == 0 || job.submit_ms < filter.until_ms);
}

}  // namespace ddl::state
