// StateBackend: the coordinator's Store as its settings name it (daemon/config.h, `store`) and, on etcd, the
// lead among the coordinators that share it.
//
// SQLite: the file DATA_DIR/state.db; this coordinator always leads.
// etcd: an EtcdStore shared with other coordinators, and an EtcdElection. Only the leader serves (main.cpp
// starts the Coordinator, gRPC and the dashboard once awaitLead() returns); every write it makes is fenced
// with its reign, so once another coordinator leads its writes are refused. A leader that cannot renew its
// lease must stop before the lease can run out: keepLeading()'s watchdog says so a renewal interval (ttl/3)
// before, and so does the store's fenced-write callback; the daemon then exits at once (its ranks are the
// agents', and keep running), and systemd starts it again as a standby.
//
// Threads: store() and lead() from any thread; awaitLead, keepLeading and resign from one (main's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "daemon/config.h"
#include "state/store.h"

namespace ddl::coordinator {

class StateBackend {
 public:
  // Called when this coordinator no longer leads: etcd refused a write (on the writing thread) or the lease
  // (on keepLeading()'s threads). It must end the process: nothing the coordinator does after may overlap the
  // next leader's reign.
  using LostLead = std::function<void(const std::string& why)>;

  // Opens what `config.store` names. `self` is this coordinator's address (HOST:PORT) for the others' logs.
  static state::StatusOr<std::unique_ptr<StateBackend>> open(const DaemonConfig& config,
                                                             const std::string& self, LostLead lost_lead);
  virtual ~StateBackend() = default;

  // The store: on etcd, once awaitLead() has returned true.
  virtual state::Store& store() = 0;
  // What and where, for the log: "SQLite /var/lib/ddl/coordinator/state.db", "etcd a:2379,b:2379 (/ddl/)".
  virtual std::string describe() const = 0;
  // Blocks until this coordinator leads (true), or until wait(ms) returns true (false: a stop signal came),
  // or etcd refuses the store for good (its error: a newer layout, say). wait is called between tries with
  // the pause to take. etcd that cannot be reached yet (a standby started before it) is tried again.
  virtual state::StatusOr<bool> awaitLead(const std::function<bool(int64_t ms)>& wait) = 0;
  // Whether other coordinators may share this store (etcd): then this one may have to wait to lead.
  virtual bool shared() const = 0;
  // Once awaitLead() returned true: keeps the lead from now until resign(), from threads of its own (so that
  // recovery, serving and shutdown all run under a live lease). When a renewal is refused, or none has worked
  // for the lease minus one renewal interval, it calls the LostLead given to open().
  virtual void keepLeading() = 0;
  // Stops keeping the lead and gives it up (a clean shutdown), so that a standby takes over without waiting
  // for the lease.
  virtual void resign() = 0;

  // The lead as it stands, for /metrics (any thread, never blocks): nullopt on SQLite.
  struct Lead {
    int64_t reign = 0;           // the leader key's create revision
    int64_t renewed_ms_ago = 0;  // since the lease was last renewed (counted from the renewal's sending)
    int ttl_s = 0;
  };
  virtual std::optional<Lead> lead() const = 0;
  // While awaitLead() waits: what this coordinator is ("standby: HOST:PORT leads", "standby: cannot reach
  // etcd: ..."), for its standby dashboard (any thread, never blocks).
  virtual std::string standbyStatus() const { return "standby"; }
  // While awaitLead() waits: the store, for reading only (a standby's dashboard reads the users from it),
  // once it could be opened; null before, and on SQLite (any thread).
  virtual state::Store* readableStore() const { return nullptr; }
};

// Copies a coordinator's SQLite state (sqlite_path, whose coordinator is stopped) into the etcd store that
// `config.store` names, which must hold no jobs and no nodes yet: every job (its spec, state, transitions and
// attempts) and every node, in batches. Says what it copied, or why not.
state::StatusOr<std::string> migrateSqliteToEtcd(const std::string& sqlite_path, const DaemonConfig& config);

}  // namespace ddl::coordinator
