// The SQLite state database's schema, as the migrations that build it: see sqlite_schema.h.
#include "state/sqlite_schema.h"

namespace ddl::state::sqlite_schema {
namespace {

// kMigrations[i] brings the schema from version i to i + 1. Append only; never edit a released entry.
const char* const kMigrations[] = {
    // 0 -> 1: the initial schema.
    R"sql(
CREATE TABLE jobs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- The number in the job id; AUTOINCREMENT: never reused.
  name TEXT NOT NULL,
  user_name TEXT NOT NULL,
  nodes INTEGER NOT NULL,
  gpus_per_node INTEGER NOT NULL,
  total_gpus INTEGER NOT NULL,
  topology_override TEXT NOT NULL,
  priority INTEGER NOT NULL,
  max_restarts INTEGER NOT NULL,
  workdir TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('PENDING', 'SCHEDULED', 'STARTING', 'RUNNING', 'SUCCEEDED', 'FAILED',
                                       'CANCELLED')),
  restarts INTEGER NOT NULL,
  submit_ms INTEGER NOT NULL,
  fail_rank INTEGER,  -- NULL: no failure recorded.
  fail_host TEXT,
  fail_exit_code INTEGER,
  fail_signal INTEGER,
  topology TEXT NOT NULL
);
CREATE INDEX jobs_by_state ON jobs (state);
CREATE INDEX jobs_by_user ON jobs (user_name);
CREATE TABLE job_env (
  job_seq INTEGER NOT NULL, ord INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (job_seq, ord)
) WITHOUT ROWID;
CREATE TABLE job_argv (
  job_seq INTEGER NOT NULL, ord INTEGER NOT NULL, value TEXT NOT NULL, PRIMARY KEY (job_seq, ord)
) WITHOUT ROWID;
CREATE TABLE job_transitions (
  job_seq INTEGER NOT NULL, ord INTEGER NOT NULL,
  from_state TEXT NOT NULL, to_state TEXT NOT NULL, at_ms INTEGER NOT NULL, reason TEXT NOT NULL,
  fail_rank INTEGER, fail_host TEXT, fail_exit_code INTEGER, fail_signal INTEGER,
  PRIMARY KEY (job_seq, ord)
) WITHOUT ROWID;
CREATE TABLE job_allocation (
  job_seq INTEGER NOT NULL, ord INTEGER NOT NULL,
  node TEXT NOT NULL, gpus TEXT NOT NULL,  -- gpus: local indices, decimal, comma-separated ("0,1,2,3").
  PRIMARY KEY (job_seq, ord)
) WITHOUT ROWID;
CREATE TABLE nodes (
  name TEXT NOT NULL PRIMARY KEY, address TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('UP', 'DOWN', 'DRAINING')), last_heartbeat_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE node_gpus (
  node TEXT NOT NULL, ord INTEGER NOT NULL,
  idx INTEGER NOT NULL, uuid TEXT NOT NULL, model TEXT NOT NULL, memory_bytes INTEGER NOT NULL,
  PRIMARY KEY (node, ord)
) WITHOUT ROWID;
CREATE TABLE node_labels (
  node TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (node, key)
) WITHOUT ROWID;
)sql",
    // 1 -> 2: a job's required node labels. Jobs from version 1 have none, which is what an empty table says.
    R"sql(
CREATE TABLE job_labels (
  job_seq INTEGER NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (job_seq, key)
) WITHOUT ROWID;
)sql",
    // 2 -> 3: the operator's drain, apart from the state, so that it outlives DOWN. Before, a drain was the
    // DRAINING state alone.
    R"sql(
ALTER TABLE nodes ADD COLUMN drained INTEGER NOT NULL DEFAULT 0 CHECK (drained IN (0, 1));
UPDATE nodes SET drained = 1 WHERE state = 'DRAINING';
)sql",
    // 3 -> 4: a placed job's rendezvous port. Jobs placed by version 3 have 0 (unknown): a restarted
    // coordinator derives their port again, as version 3 did.
    R"sql(
ALTER TABLE jobs ADD COLUMN root_port INTEGER NOT NULL DEFAULT 0;
)sql",
    // 4 -> 5: when a final job ended, so that history past its retention can be purged by an index.
    R"sql(
ALTER TABLE jobs ADD COLUMN end_ms INTEGER NOT NULL DEFAULT 0;
UPDATE jobs SET end_ms = (SELECT MAX(at_ms) FROM job_transitions WHERE job_seq = seq)
  WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED');
CREATE INDEX jobs_by_end ON jobs (end_ms) WHERE end_ms > 0;
)sql",
    // 5 -> 6: the TIMEOUT state (the state column's CHECK is part of the table, so the table is rebuilt, with
    // its AUTOINCREMENT counter kept: ids are never reused), jobs.extra (a JSON document: see the file
    // comment) and a drain's reason.
    R"sql(
CREATE TEMP TABLE saved_job_seq AS SELECT seq FROM sqlite_sequence WHERE name = 'jobs';
CREATE TABLE jobs_v6 (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  name TEXT NOT NULL,
  user_name TEXT NOT NULL,
  nodes INTEGER NOT NULL,
  gpus_per_node INTEGER NOT NULL,
  total_gpus INTEGER NOT NULL,
  topology_override TEXT NOT NULL,
  priority INTEGER NOT NULL,
  max_restarts INTEGER NOT NULL,
  workdir TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('PENDING', 'SCHEDULED', 'STARTING', 'RUNNING', 'SUCCEEDED', 'FAILED',
                                       'CANCELLED', 'TIMEOUT')),
  restarts INTEGER NOT NULL,
  submit_ms INTEGER NOT NULL,
  fail_rank INTEGER,
  fail_host TEXT,
  fail_exit_code INTEGER,
  fail_signal INTEGER,
  topology TEXT NOT NULL,
  root_port INTEGER NOT NULL DEFAULT 0,
  end_ms INTEGER NOT NULL DEFAULT 0,
  extra TEXT NOT NULL DEFAULT '{}'
);
INSERT INTO jobs_v6 (seq, name, user_name, nodes, gpus_per_node, total_gpus, topology_override, priority,
                     max_restarts, workdir, state, restarts, submit_ms, fail_rank, fail_host, fail_exit_code,
                     fail_signal, topology, root_port, end_ms)
  SELECT seq, name, user_name, nodes, gpus_per_node, total_gpus, topology_override, priority, max_restarts,
         workdir, state, restarts, submit_ms, fail_rank, fail_host, fail_exit_code, fail_signal, topology,
         root_port, end_ms FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v6 RENAME TO jobs;
UPDATE sqlite_sequence SET seq = MAX(seq, COALESCE((SELECT MAX(seq) FROM temp.saved_job_seq), 0))
  WHERE name = 'jobs';
INSERT INTO sqlite_sequence (name, seq)
  SELECT 'jobs', seq FROM temp.saved_job_seq
  WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'jobs');
DROP TABLE temp.saved_job_seq;
CREATE INDEX jobs_by_state ON jobs (state);
CREATE INDEX jobs_by_user ON jobs (user_name);
CREATE INDEX jobs_by_end ON jobs (end_ms) WHERE end_ms > 0;
ALTER TABLE nodes ADD COLUMN drain_reason TEXT NOT NULL DEFAULT '';
)sql",
    // 6 -> 7: CPUs and memory. A placed job's CPUs and memory per node (empty and 0 for jobs placed before,
    // which asked for none), and what each node's agent offers (read again when the agent registers).
    R"sql(
ALTER TABLE job_allocation ADD COLUMN cpus TEXT NOT NULL DEFAULT '';
ALTER TABLE job_allocation ADD COLUMN memory_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN cpus TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN memory_bytes INTEGER NOT NULL DEFAULT 0;
)sql",
    // 7 -> 8: entries (store.h): users, accounts and join tokens, each a value its owner encodes.
    R"sql(
CREATE TABLE entries (
  tbl TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (tbl, key)
) WITHOUT ROWID;
)sql",
    // 8 -> 9: where each GPU sits in its node (NUMA node, NVLink peers, nearest NIC: sqlite_codec's GPU
    // topology, "" where unknown), the NUMA node of each CPU a node offers (read again at registration), and
    // the node's faulted GPUs (kept until an admin clears them).
    R"sql(
ALTER TABLE node_gpus ADD COLUMN topology TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN cpu_numa TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN gpu_faults TEXT NOT NULL DEFAULT '';
)sql",
};

constexpr int kMigrationCount = sizeof(kMigrations) / sizeof(kMigrations[0]);
static_assert(kMigrationCount == kSchemaVersion, "one migration per schema version");

}  // namespace

const char* migration(int64_t from_version) {
  return from_version >= 0 && from_version < kMigrationCount ? kMigrations[from_version] : nullptr;
}

}  // namespace ddl::state::sqlite_schema
