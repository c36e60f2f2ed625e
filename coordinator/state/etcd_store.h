// EtcdStore: the Store in etcd (v3 API over gRPC), for several coordinators that share their state.
//
// Layout under a prefix (default "/ddl/"):
//   meta/schema          the layout's version ("1"); a newer one is refused, as SqliteStore refuses a newer
//   file meta/last_job        the highest job number ever stored, so numbers are never reused after a purge
//   jobs/<20 digits>     one job, its whole record (record_codec.h); the zero-padded number sorts as a number
//   nodes/<name>         one node
//   <table>/<key>        one entry (store.h: users/alice, accounts/physics, join_tokens/<hash>), its value as
//                        given
// A batch is one etcd transaction, so every write the coordinator acknowledges is replicated by the cluster's
// quorum first, and a batch is there whole or not at all, however its leader dies. etcd refuses a transaction
// of more than --max-txn-ops operations (128 unless its operator raised it) or --max-request-bytes (1.5 MiB);
// batchLimits() says what is left of that for the coordinator's writes (max_txn_ops and max_txn_bytes, less
// the store's own operation and bytes), the group commit builds batches within it, and a larger batch is
// refused whole, never split. The same transaction raises meta/last_job when it stores a higher job number:
// the leader knows the number it last stored (read once per reign), so that costs no request of its own.
//
// etcd has no secondary index: listJobsPage and purgeFinished read the jobs in key order, a page at a time,
// and filter here. What is fast is what the coordinator does often: batches, and reading one job.
//
// Several coordinators: one leads (etcd_election.h) and fences its writes with its reign (fence()), so a
// deposed leader writes nothing. TLS and client certificates to etcd: etcd_tls.h.
// Endpoints are tried in turn; the first that answers serves the call.
//
// Threads: thread-safe (gRPC stubs are); calls may run concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "state/etcd_tls.h"
#include "state/store.h"

namespace ddl::state {

class EtcdClient;

class EtcdStore : public Store {
 public:
  static constexpr int kSchemaVersion = 1;

  struct Options {
    std::vector<std::string> endpoints;  // HOST:PORT of etcd's client URLs
    EtcdTls tls;                         // plaintext unless it names a CA
    std::string prefix = "/ddl/";
    int max_txn_ops = 128;      // etcd's --max-txn-ops
    // Under etcd's --max-request-bytes (1.5 MiB unless its operator raised it), leaving room for gRPC's own.
    size_t max_txn_bytes = (3 << 19) - (32 << 10);
    int64_t timeout_ms = 5000;  // per call
    int page_jobs = 256;        // jobs read per range request when scanning
    // Called (on the writing thread, before the refusal returns) when the fence refused a write: the
    // daemon stops at once, since another coordinator leads.
    std::function<void(const std::string& why)> on_fenced;
    // Crash tests only: called before every request to etcd; false and it is not sent (UNAVAILABLE).
    std::function<bool()> gate;
  };

  // Connects, then reads (or, on an empty prefix, writes) the layout's version. UNAVAILABLE when no endpoint
  // answers; DATA_LOSS for a newer layout.
  static StatusOr<std::unique_ptr<EtcdStore>> open(Options options);
  ~EtcdStore() override;

  Status applyBatch(const std::vector<Write>& batch) override;
  BatchLimits batchLimits() const override;
  size_t writeBytes(const Write& w) const override;
  // Only a batch refused before it was sent (a malformed write) or by the fence is known unapplied: a request
  // that timed out or lost its connection may have been applied by etcd.
  bool knownUnapplied(const Status& failure) const override {
    return failure.code() == StatusCode::kInvalidArgument ||
           failure.code() == StatusCode::kFailedPrecondition;
  }
  StatusOr<Job> getJob(const std::string& id) override;
  StatusOr<std::vector<NodeRecord>> listNodes() override;
  StatusOr<std::vector<Entry>> listEntries(const std::string& table) override;
  StatusOr<int64_t> lastJobNumber() override;
  StatusOr<std::vector<Job>> listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                          bool newest_first = false) override;
  StatusOr<int> purgeFinished(int64_t ended_before_ms, int limit) override;

  // Fences every later write with a reign (etcd_election.h): each transaction also checks that `key` still
  // has create revision `revision`, and is refused with FAILED_PRECONDITION, writing nothing, when it does
  // not (another coordinator leads now). revision 0 lifts the fence.
  void fence(const std::string& key, int64_t revision);

  // Raises meta/last_job to n if it is lower (fenced as every write): for a migration whose newest jobs were
  // purged before it, so that their numbers are not handed out again.
  Status raiseLastJobNumber(int64_t n);

  // Transactions applyBatch has sent, and requests to etcd of every kind (store-bench: one per batch).
  int64_t batchRequests() const { return requests_.load(); }
  int64_t requests() const;

  // The key of job number n and of node `name` (for tests and tools).
  std::string jobKey(int64_t n) const;
  std::string nodeKey(const std::string& name) const;
  std::string entryKey(const Entry& e) const { return options_.prefix + e.table + "/" + e.key; }

 private:
  explicit EtcdStore(Options options);
  // Reads the job keys in [from, to) in key order, a page at a time, calling each(number, value) until it
  // returns false.
  Status scanJobs(std::string from, const std::string& to,
                  const std::function<bool(int64_t number, const std::string& value)>& each);

  // The refusal of a fenced write (mu_ held); tells on_fenced.
  Status fenced();

  // What of max_txn_bytes a transaction's own parts take: meta/last_job's put and the fence's compare.
  static constexpr size_t kOwnBytes = 1024;

  Options options_;
  std::unique_ptr<EtcdClient> client_;
  std::mutex mu_;  // serialises applyBatch, so meta/last_job only grows; guards the fence and last_job_
  std::string fence_key_;
  int64_t fence_revision_ = 0;
  std::optional<int64_t> last_job_;  // meta/last_job as this store last stored or read it; unknown: read
  std::atomic<int64_t> requests_{0};
};

}  // namespace ddl::state
