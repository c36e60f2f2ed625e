// SqliteStore: see sqlite_store.h for the contract. Notes on the implementation:
//
// - journal_mode=WAL: a commit appends to the -wal file and readers never block the writer; a process killed
//   mid-transaction leaves frames without a commit record, which recovery ignores.
// - synchronous=FULL: in WAL mode, NORMAL syncs only at checkpoints, so an acknowledged commit survives
//   kill -9 (the data is in the OS page cache) but not an OS crash or power loss: the last transactions can
//   roll back. The issue asks that an acknowledged submit be durable, so FULL: the WAL is fsync'ed at every
//   commit. The price is one fsync per batch (bench/store_bench.cpp measures it on a given disk).
// - Every batch (and purge) is one BEGIN IMMEDIATE ... COMMIT transaction under mu_; reads run under mu_ too,
// on
//   the same connection, so a caller never sees a half-applied change.
// - Lists (env, argv, transitions, allocation, GPUs) are child tables keyed by (owner, ord); maps (a job's
//   required labels, a node's labels) by (owner, key). Loading many jobs takes six queries in all, whatever
//   the number of jobs.
// - What no query ever filters on (time limit, dependencies, array, hold, each rank's result) is one JSON
//   document per job in jobs.extra (schema 6, sqlite_codec.h): a job's record grows without a new table per
//   field.
#include "state/sqlite_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <unordered_map>
#include <utility>
#include <variant>

#include "state/sqlite_codec.h"
#include "state/sqlite_schema.h"

namespace ddl::state {

using sqlite_codec::decodeExtra;
using sqlite_codec::decodeIndices;
using sqlite_codec::encodeExtra;
using sqlite_codec::encodeIndices;
using sqlite_schema::kApplicationId;

// A cached prepared statement in use: binds and reads columns, and resets itself when it goes out of scope so
// the cache never holds a statement mid-step or bound to freed strings.
class SqliteStore::Stmt {
 public:
  explicit Stmt(sqlite3_stmt* s) : s_(s) {}
  ~Stmt() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  Stmt& bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  // Explicit length: embedded NULs and any other bytes are stored as given.
  Stmt& bind(int i, const std::string& v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& bind(int i, const std::optional<int>& v) {
    if (v) return bind(i, static_cast<int64_t>(*v));
    sqlite3_bind_null(s_, i);
    return *this;
  }
  Stmt& bind(int i, const Arg& v) {
    std::visit([&](const auto& x) { bind(i, x); }, v);
    return *this;
  }
  // Binds a failure as four columns (rank, host, exit code, signal) starting at i; all NULL when there is
  // none.
  Stmt& bindFailure(int i, const std::optional<Failure>& f) {
    if (!f) {
      for (int k = 0; k < 4; ++k) sqlite3_bind_null(s_, i + k);
      return *this;
    }
    bind(i, static_cast<int64_t>(f->rank));
    bind(i + 1, f->host);
    bind(i + 2, f->exit_code);
    return bind(i + 3, f->signal);
  }

  int step() { return sqlite3_step(s_); }
  void reset() { sqlite3_reset(s_); }  // Before stepping again with new bindings.

  bool isNull(int c) { return sqlite3_column_type(s_, c) == SQLITE_NULL; }
  int64_t i64(int c) { return sqlite3_column_int64(s_, c); }
  int i32(int c) { return static_cast<int>(sqlite3_column_int64(s_, c)); }
  std::optional<int> optInt(int c) { return isNull(c) ? std::nullopt : std::optional<int>(i32(c)); }
  std::string text(int c) {
    const unsigned char* p = sqlite3_column_text(s_, c);  // Before column_bytes, as the SQLite docs require.
    int n = sqlite3_column_bytes(s_, c);
    return p ? std::string(reinterpret_cast<const char*>(p), n) : std::string();
  }
  std::optional<Failure> failure(int c) {
    if (isNull(c)) return std::nullopt;
    return Failure{i32(c), text(c + 1), optInt(c + 2), optInt(c + 3)};
  }

 private:
  sqlite3_stmt* s_;
};

// BEGIN IMMEDIATE (take the write lock up front, so a transaction never fails half-way on a lock upgrade);
// rolls back unless commit() succeeded.
class SqliteStore::Txn {
 public:
  explicit Txn(SqliteStore* store) : store_(store) {}
  ~Txn() {
    if (open_) sqlite3_exec(store_->db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  Status begin() {
    Status st = store_->exec("BEGIN IMMEDIATE");
    open_ = st.isOk();
    return st;
  }
  Status commit() {
    Status st = store_->exec("COMMIT");
    if (st) open_ = false;
    return st;
  }

 private:
  SqliteStore* store_;
  bool open_ = false;
};

#define DDL_RETURN_IF_ERROR(expr)      \
  do {                                 \
    ::ddl::state::Status st_ = (expr); \
    if (!st_) return st_;              \
  } while (0)

// Declares `Stmt var` over the cached statement for sql, or returns the preparation error.
#define DDL_PREPARE(var, sql)                \
  auto var##_or_ = prepare(sql);             \
  if (!var##_or_) return var##_or_.status(); \
  Stmt var(*var##_or_)

// Steps a statement that returns no rows; returns an error naming `what` unless it is done.
#define DDL_STEP_DONE(stmt, what)                    \
  do {                                               \
    int rc_ = (stmt).step();                         \
    if (rc_ != SQLITE_DONE) return error(what, rc_); \
  } while (0)

// ---- Open, schema -----------------------------------------------------------------------------------------

SqliteStore::SqliteStore(Options options) : options_(std::move(options)) {}

SqliteStore::~SqliteStore() {
  for (auto& [sql, stmt] : stmts_) sqlite3_finalize(stmt);
  // The last connection to close checkpoints the WAL into the main file and removes it.
  if (db_) sqlite3_close_v2(db_);
}

StatusOr<std::unique_ptr<SqliteStore>> SqliteStore::open(Options options) {
  std::unique_ptr<SqliteStore> store(new SqliteStore(std::move(options)));
  Status st = store->init();
  if (!st) return st;
  return store;
}

Status SqliteStore::init() {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& path = options_.path;
  if (path.empty()) return Status::invalidArgument("state database path is empty; configure state.path");
  int rc = sqlite3_open_v2(path.c_str(), &db_,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db_ ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close_v2(db_);
    db_ = nullptr;
    return Status::unavailable("cannot open state database '" + path + "': " + msg +
                               "; check that its directory exists and is writable");
  }
  sqlite3_busy_timeout(db_, options_.busy_timeout_ms);

  // The first statement that reads the file; a non-database file fails here with SQLITE_NOTADB.
  sqlite3_stmt* wal = nullptr;
  rc = sqlite3_prepare_v2(db_, "PRAGMA journal_mode=WAL", -1, &wal, nullptr);
  if (rc == SQLITE_OK) rc = sqlite3_step(wal);
  std::string mode =
      rc == SQLITE_ROW ? reinterpret_cast<const char*>(sqlite3_column_text(wal, 0)) : std::string();
  Status st = rc == SQLITE_ROW ? Status::ok() : error("enabling WAL mode", rc);
  sqlite3_finalize(wal);
  if (!st) return st;
  if (mode != "wal") {
    return Status::unavailable("state database '" + path + "': WAL mode not available (journal mode is '" +
                               mode + "'); put the database on a local file system");
  }
  DDL_RETURN_IF_ERROR(exec("PRAGMA synchronous=FULL"));  // Why FULL: see the top of this file.
  return migrateLocked();
}

Status SqliteStore::migrateLocked() {
  Txn txn(this);
  DDL_RETURN_IF_ERROR(txn.begin());
  int64_t app_id = 0, objects = 0, version = 0;
  {
    DDL_PREPARE(q, "PRAGMA application_id");
    if (q.step() != SQLITE_ROW) return error("reading application_id");
    app_id = q.i64(0);
  }
  {
    DDL_PREPARE(q, "SELECT count(*) FROM sqlite_master");
    if (q.step() != SQLITE_ROW) return error("reading the schema");
    objects = q.i64(0);
  }
  if (objects > 0 && app_id != kApplicationId) {
    return Status::dataLoss("'" + options_.path +
                            "' is an SQLite database but not a ddl state database; point the coordinator's "
                            "state path at a new file");
  }
  if (objects > 0) {
    DDL_PREPARE(q, "SELECT version FROM schema_version");
    if (q.step() != SQLITE_ROW) return error("reading schema_version");
    version = q.i64(0);
  } else {
    DDL_RETURN_IF_ERROR(
        exec("CREATE TABLE schema_version (version INTEGER NOT NULL);"
             "INSERT INTO schema_version VALUES (0);"
             "PRAGMA application_id = " +
             std::to_string(kApplicationId)));
  }
  if (version > kSchemaVersion) {
    return Status::dataLoss("state database '" + options_.path + "' has schema version " +
                            std::to_string(version) + ", newer than this coordinator's " +
                            std::to_string(kSchemaVersion) + "; run a newer ddl-coordinator");
  }
  if (version == kSchemaVersion) return Status::ok();  // Rolls back the empty transaction.
  for (int64_t v = version; v < kSchemaVersion; ++v) {
    Status st = exec(sqlite_schema::migration(v));
    if (!st)
      return Status(st.code(), "migrating to schema version " + std::to_string(v + 1) + ": " + st.message());
  }
  DDL_RETURN_IF_ERROR(exec("UPDATE schema_version SET version = " + std::to_string(kSchemaVersion)));
  return txn.commit();
}

int SqliteStore::schemaVersion() {
  std::lock_guard<std::mutex> lock(mu_);
  auto q = prepare("SELECT version FROM schema_version");
  if (!q) return -1;
  Stmt s(*q);
  return s.step() == SQLITE_ROW ? s.i32(0) : -1;
}

Status SqliteStore::integrityCheck() {
  std::lock_guard<std::mutex> lock(mu_);
  DDL_PREPARE(q, "PRAGMA integrity_check");
  std::string problems;
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) {
    std::string line = q.text(0);
    if (line != "ok") problems += (problems.empty() ? "" : "; ") + line;
  }
  if (rc != SQLITE_DONE) return error("integrity check", rc);
  if (!problems.empty()) return Status::dataLoss("state database '" + options_.path + "': " + problems);
  return Status::ok();
}

// ---- Helpers ----------------------------------------------------------------------------------------------

Status SqliteStore::exec(const std::string& sql) {
  int rc = sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return error("running '" + sql.substr(0, sql.find_first_of("(\n")) + "'", rc);
  return Status::ok();
}

StatusOr<sqlite3_stmt*> SqliteStore::prepare(const std::string& sql) {
  auto it = stmts_.find(sql);
  if (it != stmts_.end()) return it->second;
  sqlite3_stmt* stmt = nullptr;
  int rc = sqlite3_prepare_v3(db_, sql.c_str(), -1, SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) return error("preparing '" + sql + "'", rc);
  stmts_.emplace(sql, stmt);
  return stmt;
}

Status SqliteStore::error(const std::string& what) const { return error(what, sqlite3_errcode(db_)); }

Status SqliteStore::error(const std::string& what, int rc) const {
  std::string msg = "state database '" + options_.path + "': " + what + ": " +
                    (db_ && sqlite3_errcode(db_) == rc ? sqlite3_errmsg(db_) : sqlite3_errstr(rc));
  switch (rc & 0xff) {
    case SQLITE_NOTADB:
    case SQLITE_CORRUPT:
      return Status::dataLoss(
          msg +
          "; the file is damaged or not a ddl state database: move it aside to start with an "
          "empty state, or restore a backup");
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
      return Status::unavailable(msg + "; check that the file and its directory are writable");
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return Status::unavailable(msg + "; another process holds the database lock");
    case SQLITE_FULL:
      return Status::internal(msg + "; the disk is full");
    default:
      return Status::internal(msg);
  }
}

void SqliteStore::hook(std::string_view point) {
  if (options_.test_hook) options_.test_hook(point);
}

// ---- Jobs -------------------------------------------------------------------------------------------------

// Loads the jobs matching `where` (a condition on the jobs table with ? placeholders for args), in seq order.
StatusOr<std::vector<Job>> SqliteStore::loadJobsLocked(const std::string& where,
                                                       const std::vector<Arg>& args) {
  std::vector<Job> jobs;
  std::unordered_map<int64_t, size_t> index;  // seq -> position in jobs
  {
    DDL_PREPARE(q,
                "SELECT seq, name, user_name, nodes, gpus_per_node, total_gpus, topology_override, priority,"
                " max_restarts, workdir, state, restarts, submit_ms, fail_rank, fail_host, fail_exit_code,"
                " fail_signal, topology, root_port, extra FROM jobs WHERE " +
                    where + " ORDER BY seq");
    for (size_t i = 0; i < args.size(); ++i) q.bind(static_cast<int>(i) + 1, args[i]);
    int rc;
    while ((rc = q.step()) == SQLITE_ROW) {
      Job job;
      const int64_t seq = q.i64(0);
      job.id = formatJobId(seq);
      job.spec.name = q.text(1);
      job.spec.user = q.text(2);
      job.spec.nodes = q.i32(3);
      job.spec.gpus_per_node = q.i32(4);
      job.spec.total_gpus = q.i32(5);
      job.spec.topology_override = q.text(6);
      job.spec.priority = q.i32(7);
      job.spec.max_restarts = q.i32(8);
      job.spec.workdir = q.text(9);
      std::optional<JobState> state = parseJobState(q.text(10));
      if (!state) return Status::dataLoss("job " + job.id + " has unknown state '" + q.text(10) + "'");
      job.state = *state;
      job.restarts = q.i32(11);
      job.submit_ms = q.i64(12);
      job.failure = q.failure(13);
      job.topology = q.text(17);
      job.root_port = q.i32(18);
      decodeExtra(q.text(19), job);
      index[seq] = jobs.size();
      jobs.push_back(std::move(job));
    }
    if (rc != SQLITE_DONE) return error("reading jobs", rc);
  }
  if (jobs.empty()) return jobs;

  // The child rows of exactly those jobs, in (job, position) order; maps (no position) in (job, key) order.
  const std::string of_jobs =
      " WHERE job_seq IN (SELECT seq FROM jobs WHERE " + where + ") ORDER BY job_seq, ";
  auto each = [&](const std::string& sql, const char* what, auto&& fn, const char* order = "ord") -> Status {
    DDL_PREPARE(q, sql + of_jobs + order);
    for (size_t i = 0; i < args.size(); ++i) q.bind(static_cast<int>(i) + 1, args[i]);
    int rc;
    while ((rc = q.step()) == SQLITE_ROW) {
      auto it = index.find(q.i64(0));
      if (it == index.end()) continue;  // Cannot happen under the lock; harmless if it did.
      DDL_RETURN_IF_ERROR(fn(jobs[it->second], q));
    }
    if (rc != SQLITE_DONE) return error(std::string("reading ") + what, rc);
    return Status::ok();
  };
  DDL_RETURN_IF_ERROR(each("SELECT job_seq, value FROM job_env", "job env", [](Job& job, Stmt& q) {
    job.spec.env.push_back(q.text(1));
    return Status::ok();
  }));
  DDL_RETURN_IF_ERROR(each("SELECT job_seq, value FROM job_argv", "job commands", [](Job& job, Stmt& q) {
    job.spec.command.push_back(q.text(1));
    return Status::ok();
  }));
  DDL_RETURN_IF_ERROR(each(
      "SELECT job_seq, key, value FROM job_labels", "job labels",
      [](Job& job, Stmt& q) {
        job.spec.required_labels[q.text(1)] = q.text(2);
        return Status::ok();
      },
      "key"));
  DDL_RETURN_IF_ERROR(each(
      "SELECT job_seq, from_state, to_state, at_ms, reason, fail_rank, fail_host, fail_exit_code, fail_signal"
      " FROM job_transitions",
      "job transitions", [](Job& job, Stmt& q) {
        std::optional<JobState> from = parseJobState(q.text(1)), to = parseJobState(q.text(2));
        if (!from || !to)
          return Status::dataLoss("job " + job.id + " has a transition with an unknown state");
        job.transitions.push_back(Transition{*from, *to, q.i64(3), q.text(4), q.failure(5)});
        return Status::ok();
      }));
  DDL_RETURN_IF_ERROR(each(
      "SELECT job_seq, node, gpus, cpus, memory_bytes FROM job_allocation", "job allocations",
      [](Job& job, Stmt& q) {
        std::optional<std::vector<int>> gpus = decodeIndices(q.text(2));
        if (!gpus)
          return Status::dataLoss("job " + job.id + ": bad GPU list '" + q.text(2) + "' in allocation");
        std::optional<std::vector<int>> cpus = decodeIndices(q.text(3));
        if (!cpus)
          return Status::dataLoss("job " + job.id + ": bad CPU list '" + q.text(3) + "' in allocation");
        job.allocation.push_back(NodeAllocation{q.text(1), std::move(*gpus), std::move(*cpus), q.i64(4)});
        return Status::ok();
      }));
  return jobs;
}

StatusOr<Job> SqliteStore::loadJobLocked(const std::string& id) {
  std::optional<int64_t> seq = jobIdNumber(id);
  if (!seq) return jobNotFound(id);
  auto jobs = loadJobsLocked("seq = ?", {*seq});
  if (!jobs) return jobs.status();
  if (jobs->empty()) return jobNotFound(id);
  return std::move(jobs->front());
}

StatusOr<Job> SqliteStore::getJob(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  return loadJobLocked(id);
}

// ---- Nodes ------------------------------------------------------------------------------------------------

Status SqliteStore::upsertNodeLocked(const NodeRecord& node) {
  {
    DDL_PREPARE(
        q,
        "INSERT OR REPLACE INTO nodes (name, address, state, last_heartbeat_ms, drained, drain_reason,"
        " cpus, memory_bytes, cpu_numa, gpu_faults) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    q.bind(1, node.name).bind(2, node.address).bind(3, std::string(toString(node.state)));
    q.bind(4, node.last_heartbeat_ms).bind(5, int64_t{node.drained ? 1 : 0}).bind(6, node.drain_reason);
    q.bind(7, encodeIndices(node.cpus)).bind(8, node.memory_bytes).bind(9, encodeIndices(node.cpu_numa));
    q.bind(10, sqlite_codec::encodeGpuFaults(node.gpu_faults));
    DDL_STEP_DONE(q, "storing node " + node.name);
  }
  for (const char* table : {"node_gpus", "node_labels"}) {
    DDL_PREPARE(q, std::string("DELETE FROM ") + table + " WHERE node = ?");
    q.bind(1, node.name);
    DDL_STEP_DONE(q, "replacing the " + std::string(table) + " of node " + node.name);
  }
  {
    DDL_PREPARE(q,
                "INSERT INTO node_gpus (node, ord, idx, uuid, model, memory_bytes, topology)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)");
    for (size_t i = 0; i < node.gpus.size(); ++i) {
      const GpuInfo& g = node.gpus[i];
      q.bind(1, node.name).bind(2, static_cast<int64_t>(i)).bind(3, int64_t{g.index}).bind(4, g.uuid);
      q.bind(5, g.model).bind(6, g.memory_bytes).bind(7, sqlite_codec::encodeGpuTopology(g));
      DDL_STEP_DONE(q, "storing the GPUs of node " + node.name);
      q.reset();
    }
  }
  {
    DDL_PREPARE(q, "INSERT INTO node_labels (node, key, value) VALUES (?, ?, ?)");
    for (const auto& [key, value] : node.labels) {
      q.bind(1, node.name).bind(2, key).bind(3, value);
      DDL_STEP_DONE(q, "storing the labels of node " + node.name);
      q.reset();
    }
  }
  return Status::ok();
}

// All nodes, or only the one called *name.
StatusOr<std::vector<NodeRecord>> SqliteStore::loadNodesLocked(const std::string* name) {
  const std::string where = name ? " WHERE name = ?" : "";
  const std::string where_node = name ? " WHERE node = ?" : "";
  std::vector<NodeRecord> nodes;
  std::map<std::string, size_t> index;
  {
    DDL_PREPARE(q,
                "SELECT name, address, state, last_heartbeat_ms, drained, drain_reason, cpus, memory_bytes,"
                " cpu_numa, gpu_faults FROM nodes" +
                    where + " ORDER BY name");
    if (name) q.bind(1, *name);
    int rc;
    while ((rc = q.step()) == SQLITE_ROW) {
      NodeRecord n;
      n.name = q.text(0);
      n.address = q.text(1);
      std::optional<NodeState> state = parseNodeState(q.text(2));
      if (!state) return Status::dataLoss("node " + n.name + " has unknown state '" + q.text(2) + "'");
      n.state = *state;
      n.last_heartbeat_ms = q.i64(3);
      n.drained = q.i64(4) != 0;
      n.drain_reason = q.text(5);
      std::optional<std::vector<int>> cpus = decodeIndices(q.text(6));
      if (!cpus) return Status::dataLoss("node " + n.name + ": bad CPU list '" + q.text(6) + "'");
      n.cpus = std::move(*cpus);
      n.memory_bytes = q.i64(7);
      // A damaged NUMA list reads as unknown: placement then ignores NUMA on this node until it registers.
      n.cpu_numa = decodeIndices(q.text(8)).value_or(std::vector<int>());
      if (n.cpu_numa.size() != n.cpus.size()) n.cpu_numa.clear();
      n.gpu_faults = sqlite_codec::decodeGpuFaults(q.text(9));
      index[n.name] = nodes.size();
      nodes.push_back(std::move(n));
    }
    if (rc != SQLITE_DONE) return error("reading nodes", rc);
  }
  {
    DDL_PREPARE(q, "SELECT node, idx, uuid, model, memory_bytes, topology FROM node_gpus" + where_node +
                       " ORDER BY node, ord");
    if (name) q.bind(1, *name);
    int rc;
    while ((rc = q.step()) == SQLITE_ROW) {
      auto it = index.find(q.text(0));
      if (it != index.end()) {
        GpuInfo g{q.i32(1), q.text(2), q.text(3), q.i64(4)};
        sqlite_codec::decodeGpuTopology(q.text(5), g);
        nodes[it->second].gpus.push_back(std::move(g));
      }
    }
    if (rc != SQLITE_DONE) return error("reading node GPUs", rc);
  }
  {
    DDL_PREPARE(q, "SELECT node, key, value FROM node_labels" + where_node);
    if (name) q.bind(1, *name);
    int rc;
    while ((rc = q.step()) == SQLITE_ROW) {
      auto it = index.find(q.text(0));
      if (it != index.end()) nodes[it->second].labels[q.text(1)] = q.text(2);
    }
    if (rc != SQLITE_DONE) return error("reading node labels", rc);
  }
  return nodes;
}

StatusOr<std::vector<NodeRecord>> SqliteStore::listNodes() {
  std::lock_guard<std::mutex> lock(mu_);
  return loadNodesLocked(nullptr);
}

// ---- Entries
// -----------------------------------------------------------------------------------------------

StatusOr<std::vector<Entry>> SqliteStore::listEntries(const std::string& table) {
  std::lock_guard<std::mutex> lock(mu_);
  DDL_PREPARE(q, table.empty() ? "SELECT tbl, key, value FROM entries ORDER BY tbl, key"
                               : "SELECT tbl, key, value FROM entries WHERE tbl = ? ORDER BY key");
  if (!table.empty()) q.bind(1, table);
  std::vector<Entry> out;
  int rc;
  while ((rc = q.step()) == SQLITE_ROW) out.push_back(Entry{q.text(0), q.text(1), q.text(2)});
  if (rc != SQLITE_DONE)
    return error("reading the entries of " + (table.empty() ? "every table" : table), rc);
  return out;
}

// ---- Batches (the coordinator's group commit) ---------------------------------------------------------------

Status SqliteStore::putJobLocked(const Write& w) {
  const Job& job = w.job;
  std::optional<int64_t> seq = jobIdNumber(job.id);
  if (!seq) return Status::invalidArgument("cannot store job '" + job.id + "': not a job id");
  if (w.new_job) {
    DDL_RETURN_IF_ERROR(validateJobSpec(job.spec));
    DDL_PREPARE(
        q,
        "INSERT OR REPLACE INTO jobs (seq, name, user_name, nodes, gpus_per_node, total_gpus, topology_override,"
        " priority, max_restarts, workdir, state, restarts, submit_ms, topology, root_port, end_ms, extra)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    const JobSpec& spec = job.spec;
    q.bind(1, *seq).bind(2, spec.name).bind(3, spec.user).bind(4, int64_t{spec.nodes});
    q.bind(5, int64_t{spec.gpus_per_node}).bind(6, int64_t{spec.total_gpus}).bind(7, spec.topology_override);
    q.bind(8, int64_t{spec.priority}).bind(9, int64_t{spec.max_restarts}).bind(10, spec.workdir);
    q.bind(11, std::string(toString(job.state))).bind(12, int64_t{job.restarts}).bind(13, job.submit_ms);
    q.bind(14, job.topology).bind(15, int64_t{job.root_port}).bind(16, endedAtMs(job));
    q.bind(17, encodeExtra(job));
    DDL_STEP_DONE(q, "inserting job " + job.id);
    for (const char* table : {"job_env", "job_argv", "job_labels"}) {
      DDL_PREPARE(d, std::string("DELETE FROM ") + table + " WHERE job_seq = ?");
      d.bind(1, *seq);
      DDL_STEP_DONE(d, "replacing " + std::string(table) + " of job " + job.id);
    }
    for (auto [table, list] : {std::pair{"job_env", &spec.env}, std::pair{"job_argv", &spec.command}}) {
      DDL_PREPARE(i, std::string("INSERT INTO ") + table + " (job_seq, ord, value) VALUES (?, ?, ?)");
      for (size_t k = 0; k < list->size(); ++k) {
        i.bind(1, *seq).bind(2, static_cast<int64_t>(k)).bind(3, (*list)[k]);
        DDL_STEP_DONE(i, "inserting " + std::string(table) + " of job " + job.id);
        i.reset();
      }
    }
    DDL_PREPARE(l, "INSERT INTO job_labels (job_seq, key, value) VALUES (?, ?, ?)");
    for (const auto& [key, value] : spec.required_labels) {
      l.bind(1, *seq).bind(2, key).bind(3, value);
      DDL_STEP_DONE(l, "inserting the labels of job " + job.id);
      l.reset();
    }
  } else {
    DDL_PREPARE(q,
                "UPDATE jobs SET state = ?, restarts = ?, fail_rank = ?, fail_host = ?, fail_exit_code = ?,"
                " fail_signal = ?, topology = ?, root_port = ?, end_ms = ?, extra = ? WHERE seq = ?");
    q.bind(1, std::string(toString(job.state))).bind(2, int64_t{job.restarts}).bindFailure(3, job.failure);
    q.bind(7, job.topology).bind(8, int64_t{job.root_port}).bind(9, endedAtMs(job));
    q.bind(10, encodeExtra(job)).bind(11, *seq);
    DDL_STEP_DONE(q, "updating job " + job.id);
    if (sqlite3_changes(db_) == 0) {
      return Status::internal("cannot update job " + job.id + ": it was never stored (a batch lost its insert)");
    }
  }
  for (const char* table : {"job_transitions", "job_allocation"}) {
    DDL_PREPARE(d, std::string("DELETE FROM ") + table + " WHERE job_seq = ?");
    d.bind(1, *seq);
    DDL_STEP_DONE(d, "replacing " + std::string(table) + " of job " + job.id);
  }
  {
    DDL_PREPARE(q,
                "INSERT INTO job_transitions (job_seq, ord, from_state, to_state, at_ms, reason, fail_rank,"
                " fail_host, fail_exit_code, fail_signal) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
    for (size_t k = 0; k < job.transitions.size(); ++k) {
      const Transition& t = job.transitions[k];
      q.bind(1, *seq).bind(2, static_cast<int64_t>(k));
      q.bind(3, std::string(toString(t.from))).bind(4, std::string(toString(t.to)));
      q.bind(5, t.at_ms).bind(6, t.reason).bindFailure(7, t.failure);
      DDL_STEP_DONE(q, "recording the transitions of job " + job.id);
      q.reset();
    }
  }
  return insertAllocationLocked(*seq, job.id, job.allocation);
}

Status SqliteStore::insertAllocationLocked(int64_t seq, const std::string& id,
                                           const std::vector<NodeAllocation>& allocation) {
  DDL_PREPARE(
      q,
      "INSERT INTO job_allocation (job_seq, ord, node, gpus, cpus, memory_bytes) VALUES (?, ?, ?, ?, ?, ?)");
  for (size_t k = 0; k < allocation.size(); ++k) {
    q.bind(1, seq).bind(2, static_cast<int64_t>(k)).bind(3, allocation[k].node);
    q.bind(4, encodeIndices(allocation[k].gpus)).bind(5, encodeIndices(allocation[k].cpus));
    q.bind(6, allocation[k].memory_bytes);
    DDL_STEP_DONE(q, "storing the allocation of job " + id);
    q.reset();
  }
  return Status::ok();
}

Status SqliteStore::applyBatch(const std::vector<Write>& batch) {
  if (batch.empty()) return Status::ok();
  std::lock_guard<std::mutex> lock(mu_);
  Txn txn(this);
  DDL_RETURN_IF_ERROR(txn.begin());
  for (const Write& w : batch) {
    switch (w.kind) {
      case Write::Kind::kPutJob:
        DDL_RETURN_IF_ERROR(putJobLocked(w));
        break;
      case Write::Kind::kPutNode:
        if (w.node.name.empty()) return Status::invalidArgument("node record has an empty name");
        DDL_RETURN_IF_ERROR(upsertNodeLocked(w.node));
        break;
      case Write::Kind::kDeleteNode:
        for (const char* sql : {"DELETE FROM nodes WHERE name = ?", "DELETE FROM node_gpus WHERE node = ?",
                                "DELETE FROM node_labels WHERE node = ?"}) {
          DDL_PREPARE(d, sql);
          d.bind(1, w.name);
          DDL_STEP_DONE(d, "removing node " + w.name);
        }
        break;
      case Write::Kind::kPutEntry: {
        DDL_RETURN_IF_ERROR(entryRefused(w.entry));
        DDL_PREPARE(q, "INSERT OR REPLACE INTO entries (tbl, key, value) VALUES (?, ?, ?)");
        q.bind(1, w.entry.table).bind(2, w.entry.key).bind(3, w.entry.value);
        DDL_STEP_DONE(q, "storing entry " + w.entry.table + "/" + w.entry.key);
        break;
      }
      case Write::Kind::kDeleteEntry: {
        DDL_RETURN_IF_ERROR(entryRefused(w.entry, false));
        DDL_PREPARE(q, "DELETE FROM entries WHERE tbl = ? AND key = ?");
        q.bind(1, w.entry.table).bind(2, w.entry.key);
        DDL_STEP_DONE(q, "removing entry " + w.entry.table + "/" + w.entry.key);
        break;
      }
    }
  }
  hook("applyBatch:before-commit");
  DDL_RETURN_IF_ERROR(txn.commit());
  hook("applyBatch:after-commit");
  return Status::ok();
}

StatusOr<int64_t> SqliteStore::lastJobNumber() {
  std::lock_guard<std::mutex> lock(mu_);
  // AUTOINCREMENT keeps the highest number ever used in sqlite_sequence, also once those rows are deleted.
  DDL_PREPARE(q, "SELECT MAX(n) FROM (SELECT seq AS n FROM sqlite_sequence WHERE name = 'jobs'"
                 " UNION ALL SELECT MAX(seq) FROM jobs)");
  if (q.step() != SQLITE_ROW) return error("reading the last job number");
  return q.i64(0);
}

StatusOr<std::vector<Job>> SqliteStore::listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                                     bool newest_first) {
  std::string where = "1";
  std::vector<Arg> args;
  if (!filter.states.empty()) {
    where += " AND state IN (";
    bool first = true;
    for (JobState st : filter.states) {
      where += first ? "?" : ", ?";
      first = false;
      args.push_back(std::string(toString(st)));
    }
    where += ")";
  }
  if (filter.user) {
    where += " AND user_name = ?";
    args.push_back(*filter.user);
  }
  if (filter.name) {
    where += " AND name = ?";
    args.push_back(*filter.name);
  }
  if (filter.since_ms) {
    where += " AND submit_ms >= ?";
    args.push_back(filter.since_ms);
  }
  if (filter.until_ms) {
    where += " AND submit_ms < ?";
    args.push_back(filter.until_ms);
  }
  if (newest_first) {
    if (after_number > 0) {
      where += " AND seq < ?";
      args.push_back(after_number);
    }
  } else {
    where += " AND seq > ?";
    args.push_back(after_number);
  }
  where += std::string(" ORDER BY seq ") + (newest_first ? "DESC" : "ASC") + " LIMIT ?";
  args.push_back(int64_t{std::max(0, limit)});
  std::lock_guard<std::mutex> lock(mu_);
  auto jobs = loadJobsLocked("seq IN (SELECT seq FROM jobs WHERE " + where + ")", args);
  if (jobs && newest_first) std::reverse(jobs->begin(), jobs->end());
  return jobs;
}

StatusOr<int> SqliteStore::purgeFinished(int64_t ended_before_ms, int limit) {
  std::lock_guard<std::mutex> lock(mu_);
  Txn txn(this);
  DDL_RETURN_IF_ERROR(txn.begin());
  const std::string victims = "SELECT seq FROM jobs WHERE end_ms > 0 AND end_ms < ? LIMIT ?";
  for (const char* table : {"job_env", "job_argv", "job_labels", "job_transitions", "job_allocation"}) {
    DDL_PREPARE(d, std::string("DELETE FROM ") + table + " WHERE job_seq IN (" + victims + ")");
    d.bind(1, ended_before_ms).bind(2, int64_t{limit});
    DDL_STEP_DONE(d, "purging old jobs from " + std::string(table));
  }
  DDL_PREPARE(d, "DELETE FROM jobs WHERE seq IN (" + victims + ")");
  d.bind(1, ended_before_ms).bind(2, int64_t{limit});
  DDL_STEP_DONE(d, "purging old jobs");
  const int removed = sqlite3_changes(db_);
  DDL_RETURN_IF_ERROR(txn.commit());
  return removed;
}

}  // namespace ddl::state
