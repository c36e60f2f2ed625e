// Where the coordinator's state lives (state_backend.h): SQLite, or etcd with the lead (awaitLead, the
// keeper and the watchdog); and the copy of a SQLite state into etcd.
#include "daemon/state_backend.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>
#include <utility>

#include "common/clock.h"
#include "common/job_id.h"
#include "state/direct_store.h"
#include "state/sqlite_store.h"
#ifdef DDL_HAVE_ETCD
#include "state/etcd_election.h"
#include "state/etcd_store.h"
#endif

namespace ddl::coordinator {

namespace {

// One coordinator on its own file: it always leads.
class SqliteBackend : public StateBackend {
 public:
  explicit SqliteBackend(std::unique_ptr<state::SqliteStore> store, std::string path)
      : store_(std::move(store)), path_(std::move(path)) {}
  state::Store& store() override { return *store_; }
  std::string describe() const override { return "SQLite " + path_; }
  state::StatusOr<bool> awaitLead(const std::function<bool(int64_t)>&) override { return true; }
  bool shared() const override { return false; }
  void keepLeading() override {}
  void resign() override {}
  std::optional<Lead> lead() const override { return std::nullopt; }

 private:
  std::unique_ptr<state::SqliteStore> store_;
  std::string path_;
};

#ifdef DDL_HAVE_ETCD
class EtcdBackend : public StateBackend {
 public:
  EtcdBackend(state::EtcdStore::Options store_options, std::unique_ptr<state::EtcdElection> election,
              std::string where, int ttl_s, LostLead lost_lead)
      : store_options_(std::move(store_options)),
        election_(std::move(election)),
        where_(std::move(where)),
        ttl_ms_(ttl_s * 1000),
        lost_lead_(std::move(lost_lead)) {}
  ~EtcdBackend() override { stopKeeping(); }

  state::Store& store() override { return *store_; }
  std::string describe() const override { return where_; }

  state::StatusOr<bool> awaitLead(const std::function<bool(int64_t)>& wait) override {
    std::string last;
    while (true) {
      std::string now;
      if (!store_) {
        auto store = state::EtcdStore::open(store_options_);
        if (store) {
          store_ = std::move(*store);
          readable_.store(store_.get());
        } else if (store.status().code() != state::StatusCode::kUnavailable) {
          return state::Status(store.status().code(), where_ + ": " + store.status().message());
        } else {
          now = "cannot reach etcd: " + store.status().message();
        }
      }
      if (store_) {
        state::StatusOr<bool> won = election_->campaign();
        // Renewed at once: the lease may be one an earlier campaign took (its answer lost), so its time left
        // is known only from a renewal sent now.
        const int64_t sent = steadyNowMs();
        if (won && *won && election_->keepAlive()) {
          renewed_ms_ = sent;
          reign_ = election_->revision();
          store_->fence(election_->key(), reign_);
          spdlog::info("leading the coordinators on {} (reign {})", where_, reign_.load());
          return true;
        }
        if (!won) {
          now = "cannot campaign: " + won.status().message();
        } else {
          auto leader = election_->leader();
          now = leader && !leader->id.empty() ? "standby: " + leader->id + " leads" : "standby: campaigning";
        }
      }
      if (now != last) {
        {
          std::lock_guard<std::mutex> lock(status_mu_);
          status_ = now;
        }
        spdlog::info("{}; trying again every {} ms", now, campaignPauseMs());
      }
      last = now;
      if (wait(campaignPauseMs())) return false;
    }
  }

  bool shared() const override { return true; }

  void keepLeading() override {
    stop_ = false;
    keeper_ = std::thread([this] { renewUntilStopped(); });
    watchdog_ = std::thread([this] { watchUntilStopped(); });
  }

  void resign() override {
    stopKeeping();
    if (state::Status st = election_->resign(); !st) spdlog::warn("giving up the lead: {}", st.message());
  }

  state::Store* readableStore() const override { return readable_.load(); }

  std::string standbyStatus() const override {
    std::lock_guard<std::mutex> lock(status_mu_);
    return status_;
  }

  std::optional<Lead> lead() const override {
    return Lead{reign_.load(), steadyNowMs() - renewed_ms_.load(), static_cast<int>(ttl_ms_ / 1000)};
  }

 private:
  // A standby campaigns a few times per lease, so it takes over soon after the lease runs out.
  int64_t campaignPauseMs() const { return std::max<int64_t>(ttl_ms_ / 6, 100); }
  // The leader renews three times per lease; it stops one renewal interval before the lease can run out.
  int64_t renewIntervalMs() const { return std::max<int64_t>(ttl_ms_ / 3, 200); }

  // The keeper: a renewal every interval, counted from when the last one was sent.
  void renewUntilStopped() {
    std::unique_lock<std::mutex> lock(mu_);
    int64_t next = renewed_ms_ + renewIntervalMs();
    while (!stop_) {
      if (cv_.wait_for(lock, std::chrono::milliseconds(std::max<int64_t>(0, next - steadyNowMs())),
                       [&] { return stop_; })) {
        return;
      }
      lock.unlock();
      const int64_t sent = steadyNowMs();
      next = sent + renewIntervalMs();
      state::Status st = election_->keepAlive();
      lock.lock();
      if (st) {
        renewed_ms_ = sent;  // etcd counts the lease from when it got the renewal, never before it was sent
        last_error_.clear();
      } else if (st.code() == state::StatusCode::kFailedPrecondition) {
        lock.unlock();
        lost_lead_(st.message());  // ends the process
        return;
      } else {
        last_error_ = st.message();
        spdlog::warn("renewing the leader's lease: {} ({} ms since the last renewal)", st.message(),
                     steadyNowMs() - renewed_ms_);
      }
    }
  }

  // The watchdog: whatever the keeper is blocked in, no renewal for the lease minus one interval ends the
  // lead, so that nothing this coordinator does overlaps a successor's reign.
  void watchUntilStopped() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(50), [&] { return stop_; })) {
      const int64_t since = steadyNowMs() - renewed_ms_;
      if (since >= ttl_ms_ - renewIntervalMs()) {
        const std::string why = "cannot renew the leader's lease for " + std::to_string(since) +
                                " ms of its " + std::to_string(ttl_ms_) +
                                (last_error_.empty() ? std::string() : " (" + last_error_ + ")");
        lock.unlock();
        lost_lead_(why);  // ends the process
        return;
      }
    }
  }

  void stopKeeping() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (keeper_.joinable()) keeper_.join();
    if (watchdog_.joinable()) watchdog_.join();
  }

  state::EtcdStore::Options store_options_;
  std::unique_ptr<state::EtcdStore> store_;  // opened by awaitLead()
  std::atomic<state::Store*> readable_{nullptr};  // store_, published to other threads once opened
  std::unique_ptr<state::EtcdElection> election_;
  std::string where_;
  int64_t ttl_ms_;
  LostLead lost_lead_;
  std::atomic<int64_t> renewed_ms_{0};  // steady clock, when the last renewal that worked was sent
  std::atomic<int64_t> reign_{0};
  mutable std::mutex status_mu_;
  std::string status_ = "standby: campaigning";  // awaitLead's last word
  std::mutex mu_;  // guards stop_ and last_error_; the keeper's and the watchdog's waits
  std::condition_variable cv_;
  bool stop_ = false;
  std::string last_error_;  // of the renewals failing since the last that worked
  std::thread keeper_, watchdog_;
};
#endif

}  // namespace

namespace {

#ifdef DDL_HAVE_ETCD
state::EtcdStore::Options etcdOptions(const StoreUrl& url, const DaemonConfig& config) {
  state::EtcdStore::Options options;
  options.endpoints = url.endpoints;
  options.tls = {config.etcd_ca, config.etcd_cert, config.etcd_key};
  options.prefix = url.prefix;
  options.max_txn_ops = config.etcd_max_txn_ops;
  options.max_txn_bytes = static_cast<size_t>(config.etcd_max_txn_bytes);
  return options;
}
#endif

[[maybe_unused]] const char* kNoEtcd =
    "this ddl-coordinator was built without the etcd client (scripts/bootstrap unpacks etcd's protocol "
    "files; "
    "rebuild)";

}  // namespace

state::StatusOr<std::string> migrateSqliteToEtcd(const std::string& sqlite_path, const DaemonConfig& config) {
  state::StatusOr<StoreUrl> url = parseStoreUrl(config.store);
  if (!url) return url.status();
  if (!url->etcd)
    return state::Status::invalidArgument("give the etcd store to copy into: --store etcd://...");
#ifdef DDL_HAVE_ETCD
  std::error_code ec;
  if (!std::filesystem::exists(sqlite_path, ec))
    return state::Status::notFound("no state file at " + sqlite_path);
  state::SqliteStore::Options from_options;
  from_options.path = sqlite_path;
  auto from = state::SqliteStore::open(from_options);
  if (!from) return from.status();
  auto to = state::EtcdStore::open(etcdOptions(*url, config));
  if (!to) return to.status();
  auto last = (*to)->lastJobNumber();
  auto nodes = (*to)->listNodes();
  if (!last || !nodes) return !last ? last.status() : nodes.status();
  if (*last > 0 || !nodes->empty()) {
    return state::Status::failedPrecondition(
        config.store + " holds a state already (" + std::to_string(*last) + " jobs numbered, " +
        std::to_string(nodes->size()) + " nodes): copy only into an empty prefix");
  }
  // The copy goes in as many transactions as the store's limits need (an offline copy into an empty prefix:
  // one that fails part-way leaves a prefix to clear, as the docs say).
  auto apply = [&](std::vector<state::Write>& writes) {
    return state::applyInBatches(**to, std::move(writes));
  };
  size_t jobs = 0;
  for (int64_t after = 0;;) {
    auto page = (*from)->listJobsPage({}, after, 500);
    if (!page) return page.status();
    if (page->empty()) break;
    std::vector<state::Write> batch;
    for (state::Job& job : *page) {
      state::Write w;
      w.kind = state::Write::Kind::kPutJob;
      w.new_job = true;
      w.job = std::move(job);
      batch.push_back(std::move(w));
    }
    after = jobIdNumber(batch.back().job.id).value_or(after + 1);
    const size_t copied = batch.size();
    if (state::Status st = apply(batch); !st) {
      return state::Status(st.code(), "after " + std::to_string(jobs) + " jobs: " + st.message());
    }
    jobs += copied;
  }
  auto from_nodes = (*from)->listNodes();
  if (!from_nodes) return from_nodes.status();
  std::vector<state::Write> batch;
  for (state::NodeRecord& node : *from_nodes) {
    state::Write w;
    w.kind = state::Write::Kind::kPutNode;
    w.node = std::move(node);
    batch.push_back(std::move(w));
  }
  const size_t node_count = batch.size();
  if (state::Status st = apply(batch); !st) return st;
  // Users, accounts and join tokens.
  auto entries = (*from)->listEntries("");
  if (!entries) return entries.status();
  batch.clear();
  for (state::Entry& e : *entries) batch.push_back(state::Write::putEntry(std::move(e)));
  const size_t entry_count = batch.size();
  if (state::Status st = apply(batch); !st) return st;
  // Numbers of jobs purged from SQLite are used up too.
  auto from_last = (*from)->lastJobNumber();
  if (!from_last) return from_last.status();
  if (state::Status st = (*to)->raiseLastJobNumber(*from_last); !st) return st;
  return "copied " + std::to_string(jobs) + " jobs, " + std::to_string(node_count) + " nodes and " +
         std::to_string(entry_count) + " entries (users, accounts, join tokens) from " + sqlite_path +
         " into " + config.store + "; job numbers go on after " + std::to_string(*from_last);
#else
  (void)sqlite_path;
  return state::Status::invalidArgument(kNoEtcd);
#endif
}

state::StatusOr<std::unique_ptr<StateBackend>> StateBackend::open(const DaemonConfig& config,
                                                                  const std::string& self,
                                                                  LostLead lost_lead) {
  state::StatusOr<StoreUrl> url = parseStoreUrl(config.store);
  if (!url) return url.status();
  if (!url->etcd) {
    state::SqliteStore::Options options;
    options.path = config.data_dir + "/state.db";
    auto store = state::SqliteStore::open(options);
    if (!store) return store.status();
    return std::unique_ptr<StateBackend>(new SqliteBackend(std::move(*store), options.path));
  }
#ifdef DDL_HAVE_ETCD
  std::string where = "etcd ";
  for (size_t i = 0; i < url->endpoints.size(); ++i) where += (i ? "," : "") + url->endpoints[i];
  where += " (" + url->prefix + ")";
  state::EtcdStore::Options store_options = etcdOptions(*url, config);
  store_options.on_fenced = lost_lead;
  state::EtcdElection::Options election_options;
  election_options.endpoints = url->endpoints;
  election_options.tls = store_options.tls;
  election_options.prefix = url->prefix;
  election_options.id = self;
  election_options.ttl_s = config.leader_lease_s;
  // A renewal must be settled within its interval, whichever members answer: each gets its share.
  election_options.timeout_ms =
      std::max<int64_t>(100, config.leader_lease_s * 1000 / 3 / static_cast<int64_t>(url->endpoints.size()));
  auto election = state::EtcdElection::create(election_options);
  if (!election) return election.status();
  return std::unique_ptr<StateBackend>(new EtcdBackend(std::move(store_options), std::move(*election), where,
                                                       config.leader_lease_s, std::move(lost_lead)));
#else
  (void)self;
  (void)lost_lead;
  return state::Status::invalidArgument("store '" + config.store + "': " + kNoEtcd);
#endif
}

}  // namespace ddl::coordinator
