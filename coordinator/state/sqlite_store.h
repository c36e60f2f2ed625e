// SqliteStore: the embedded default Store, one SQLite database file in WAL mode.
//
// Durability: every batch is one transaction, committed with synchronous=FULL before the call
// returns, so an acknowledged submit survives kill -9, an OS crash and power loss. A process killed in the
// middle of a call leaves the database as it was before that call (SQLite ignores WAL frames without a commit
// record).
//
// Encoding: every field is a column; the lists (env, argv, transitions, allocation, GPUs) are child tables
// keyed by (owner, position), the label maps (a job's required labels, a node's labels) child tables keyed by
// (owner, key); entries one table keyed by (table, key). Strings are bound with explicit lengths and read
// back the same way, so argv and env round-trip arbitrary bytes ('=', newlines, NUL, invalid UTF-8) with no
// escaping to get wrong.
//
// Schema (sqlite_schema.h): a schema_version table and an ordered list of migrations, applied in one
// transaction on open; a fresh file gets all of them. Index lists and jobs.extra: sqlite_codec.h. A database
// written by a newer version, or an SQLite file that is not a ddl state database, is refused with DATA_LOSS
// rather than modified.
//
// Threads: thread-safe; any thread may call. One connection behind one mutex — calls are serialised, which
// costs nothing measurable next to the fsync each commit does anyway. Do not share an instance across fork();
// open a new one in the child.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "state/sqlite_schema.h"
#include "state/store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace ddl::state {

class SqliteStore : public Store {
 public:
  static constexpr int kSchemaVersion = sqlite_schema::kSchemaVersion;

  struct Options {
    std::string path;  // The database file. Its directory must exist (creating it is the caller's job).
    int busy_timeout_ms =
        5000;  // How long to wait for a lock held by another connection (e.g. a sqlite3 shell).
    // Tests only: called at named points inside applyBatch, "applyBatch:before-commit" and
    // "applyBatch:after-commit", so a test can kill the process exactly there.
    std::function<void(std::string_view point)> test_hook;
  };

  // Opens or creates the database and brings its schema up to date. Errors name the path: UNAVAILABLE when
  // the file cannot be opened or created, DATA_LOSS when it is not a ddl state database or is corrupt.
  static StatusOr<std::unique_ptr<SqliteStore>> open(Options options);

  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  Status applyBatch(const std::vector<Write>& batch) override;
  StatusOr<Job> getJob(const std::string& id) override;
  StatusOr<std::vector<NodeRecord>> listNodes() override;
  StatusOr<std::vector<Entry>> listEntries(const std::string& table) override;
  StatusOr<int64_t> lastJobNumber() override;
  StatusOr<std::vector<Job>> listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                          bool newest_first = false) override;
  StatusOr<int> purgeFinished(int64_t ended_before_ms, int limit) override;

  // PRAGMA integrity_check: OK, or DATA_LOSS with what SQLite found. Reads the whole file; for tools and
  // tests.
  Status integrityCheck();
  // The schema version found in the file after open (kSchemaVersion once migrated).
  int schemaVersion();
  const std::string& path() const { return options_.path; }

 private:
  class Stmt;
  class Txn;
  using Arg = std::variant<int64_t, std::string>;  // A value bound to a '?' in a query.

  explicit SqliteStore(Options options);
  Status init();
  Status migrateLocked();
  Status exec(const std::string& sql);
  StatusOr<sqlite3_stmt*> prepare(const std::string& sql);
  Status error(const std::string& what) const;
  Status error(const std::string& what, int rc) const;
  void hook(std::string_view point);

  StatusOr<std::vector<Job>> loadJobsLocked(const std::string& where, const std::vector<Arg>& args);
  StatusOr<Job> loadJobLocked(const std::string& id);
  StatusOr<std::vector<NodeRecord>> loadNodesLocked(const std::string* name);
  Status upsertNodeLocked(const NodeRecord& node);
  Status putJobLocked(const Write& write);
  Status insertAllocationLocked(int64_t seq, const std::string& id,
                                const std::vector<NodeAllocation>& allocation);

  Options options_;
  std::mutex mu_;
  sqlite3* db_ = nullptr;
  std::map<std::string, sqlite3_stmt*> stmts_;  // Prepared once per SQL text, reused.
};

}  // namespace ddl::state
