// Coordinator: the cluster's brain as a plain C++ object. It keeps the node registry and the jobs, decides
// placement (placement/), writes every job change through a state::Store before acting on it, and sends
// commands to agents through AgentLink. The gRPC handlers in rpc/ only translate calls to these methods;
// tests drive this object directly with a fake clock and fake links.
//
// Requests and answers are ddl.v1 protobuf messages (plain values; nothing here depends on gRPC). Errors are
// state::Status values whose codes map one to one onto gRPC's.
//
// Lifecycle of a job (each step durable before the next action):
//   submit: validated, refused at once when it can never fit, else stored PENDING and acknowledged (a
//   submit that repeats its caller's request id gets the job that id made instead; one whose batch the store
//   cannot take is refused at once and its jobs withdrawn, CANCELLED; a job is placed only once its submit is
//   durable, so a withdrawn one never ran);
//   schedule pass (tick): placement picks GPUs -> setAllocation -> SCHEDULED -> StartRanks sent to each
//   node -> STARTING; every rank reported RUNNING -> RUNNING; every rank exited 0 -> SUCCEEDED; the first
//   rank that exits non-zero or by a signal -> FAILED naming it (or requeued while restarts remain), and the
//   other ranks are stopped; cancel -> CANCELLED and ranks stopped; a node that misses heartbeats past the
//   grace period -> DOWN, its jobs FAILED with reason node_lost (or requeued); a RUNNING job past its time
//   limit -> TIMEOUT and ranks stopped (SIGTERM, SIGKILL after stop_grace_ms).
// A PENDING job is not placed while it is held (hold/release), while a job it depends on has not ended
// (after_any) or succeeded (after_ok; a dependency that ends otherwise cancels it, naming the dependency), or
// while its array already runs array_max_running of its jobs. Each rank of the latest attempt is kept with
// the job (node, GPU, pids, exit, times, last collective figures), stored when it starts and when it ends.
// Launch attempts are numbered (the job's count of SCHEDULED transitions, so it survives restarts); reports
// about an older attempt, or about a job that has ended, are answered with a StopJob so nothing is orphaned.
//
// Restart: recover() reloads jobs and nodes from the store. Nodes count as connected to nobody; jobs that
// were SCHEDULED go back to PENDING (their ranks were never confirmed). No new job is placed until every
// node that was UP has reconnected or the grace period has passed, so GPUs still held by running ranks are
// not handed out twice. Agents re-register with the ranks they run; those reports reconcile the jobs.
//
// Threads: the coordinator is an actor (actor.h: the loop and the group commit). All of its state belongs to
// one event-loop thread, started by the constructor; every public method posts its work there and answers
// through a callback. Methods named *OnLoop run on that thread only (they assert it). Nothing on the loop
// touches the disk: changes are collected per turn of the loop and handed to a GroupCommitter thread
// (persistence.h) that stores them in batches; answers to the callers and commands to agents that depend on
// a change leave only once its batch is durable, in the order they were made. Reads answer from memory at
// once; jobs that left memory are read from the store on a StoreReader thread. A failed commit is retried
// until it works; meanwhile health() says why and new submits are refused (a submit already waiting for the
// failed batch is refused too, at the first failure: Actor::replyUnlessLost).
//
// Rooms: the loop and the group commit are an Actor (actor.h); the nodes and their agents' sessions a
// NodeRegistry (node_registry.h), which owns node state and tells this job side when a node is lost; the
// launch plan (launch_plan.h) and the log reads waiting for agents (log_relay.h) are parts of their own. The
// Coordinator itself is the job side, and wires the rooms: its methods are in coordinator.cpp (lifecycle,
// recovery, transitions, scheduling, launch), agents.cpp (what the agents' reports mean for jobs: ranks
// reconciled, jobs of lost nodes, the usage and snapshot placement reads) and user_calls.cpp (the users'
// calls and queries).
//
// Bounds: live jobs stay in memory; final ones leave after max_finished_in_memory of them or
// finished_in_memory_ms, and leave the store after history_retention_ms. Log reads in flight are capped.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "ddl/v1/ddl.pb.h"
#include "placement/cluster.h"
#include "placement/placement.h"
#include "placement/ring_layout.h"
#include "service/node_registry.h"
#include "service/persistence.h"
#include "service/share_keeper.h"
#include "service/telemetry_history.h"
#include "service/usage_book.h"
#include "state/store.h"

namespace ddl::coordinator {

class Actor;
class LogRelay;
using state::Status;
using state::StatusOr;

// Where the state lives and, on etcd, this coordinator's lead (daemon/state_backend.h), for /metrics and the
// dashboard.
struct StoreInfo {
  std::string store;        // "SQLite /var/lib/ddl/coordinator/state.db", "etcd a:2379,b:2379 (/ddl/)"
  int64_t reign = 0;        // etcd: the leader key's create revision; 0 on SQLite
  double lease_age_s = -1;  // etcd: seconds since the leader's lease was last renewed; -1 on SQLite
  int64_t lease_ttl_s = 0;  // etcd: the lease
  bool standby = false;     // a standby's dashboard: it leads nothing yet
};

struct CoordinatorOptions {
  int64_t heartbeat_grace_ms = 10000;    // a node silent this long is DOWN
  int64_t heartbeat_interval_ms = 1000;  // what agents are told to use
  int64_t stop_grace_ms = 10000;         // SIGTERM -> SIGKILL for ranks being stopped
  int64_t tick_ms = 200;                 // ticker period (start())
  int port_first = 29500;                // default rendezvous port range for agents that give none
  int port_last = 29999;
  int64_t log_timeout_ms = 5000;  // how long readLog waits for the agent
  bool allow_root_jobs = false;   // jobs of the user "root" are refused, and agents refuse uid 0 ranks
  size_t max_nodes = 100000;      // nodes the coordinator knows; a new one beyond is refused
  size_t max_finished_in_memory = 10000;    // final jobs kept in memory (the rest are read from the store)
  int64_t finished_in_memory_ms = 3600000;  // and for at most this long after they end
  int64_t history_retention_ms = 30LL * 24 * 3600000;  // final jobs leave the store after this; 0: never
  int64_t store_retry_max_ms = 5000;            // longest wait between attempts to store after a failure
  static constexpr size_t kMaxLogReads = 1024;  // log reads waiting for agents at once
  // What MetricsSnapshot::state says; called from the loop, so it must not block. Unset: nothing is said.
  std::function<StoreInfo()> store_info;
  ShareOptions shares;  // fair-share: usage half-life and the priority's weights (share_keeper.h)
  UsageOptions accounting;  // the daily usage rollups' retention (usage_book.h)
};

// How the drains of a node's health check begin ("health check: exit 1: ..."): those the check ends when it
// passes again. An operator's drain reason may not begin so.
inline constexpr std::string_view kHealthCheckDrain = "health check:";

// What /metrics exposes, copied under the lock (counters count since this coordinator process started).
struct MetricsSnapshot {
  std::map<std::string, int> nodes_by_state;  // UP, DOWN, DRAINING (all three present)
  int gpus_total = 0;                         // on UP and DRAINING nodes
  int gpus_allocated = 0;
  std::vector<std::pair<std::string, int>>
      gpus_faulted;                          // (node, GPU) of each faulted GPU on a node not DOWN
  std::map<std::string, int> jobs_by_state;  // every state present
  uint64_t jobs_submitted_total = 0;
  uint64_t jobs_failed_total = 0;
  uint64_t preemptions_total = 0;  // running jobs preempted for a higher QoS
  // Time from entering the queue (submit or requeue) to SCHEDULED, as a histogram.
  std::vector<double> scheduling_bounds_s;
  std::vector<uint64_t> scheduling_buckets;  // not cumulative; one more than bounds (+Inf)
  double scheduling_sum_s = 0;
  uint64_t scheduling_count = 0;
  double heartbeat_lag_max_s = 0;     // the longest silence among nodes that are not DOWN
  double collective_bytes_total = 0;  // reported by ranks through their agents
  double collective_seconds_total = 0;
  bool store_healthy = true;  // the last attempt to store state worked
  size_t store_backlog = 0;   // writes waiting to be stored
  size_t jobs_in_memory = 0;  // open jobs and the recent final ones (jobs_by_state counts these)
  std::optional<StoreInfo> state;  // CoordinatorOptions::store_info's answer
  // Placed jobs' (SCHEDULED, STARTING, RUNNING) collective totals for ddl_job_*, in job id order; at most
  // kMaxJobFigures of them, the oldest first, so the label set stays bounded.
  static constexpr size_t kMaxJobFigures = 500;
  std::vector<JobFigures> jobs;
  // Per account since this coordinator started (usage_book.h): GPU-seconds held, and ended attempts by how
  // they ended (SUCCEEDED, FAILED, CANCELLED, TIMEOUT, REQUEUED).
  std::map<std::string, double> account_gpu_seconds;
  std::map<std::pair<std::string, std::string>, int64_t> account_attempts;
};

class Coordinator {
 public:
  // now_ms: the clock of heartbeat grace and recovery, in milliseconds; by default monotonic, so that a step
  // of the system clock (NTP, an operator's date) marks no node DOWN. wall_ms: unix milliseconds, for the
  // heartbeat times users see; by default the system clock, or now_ms where only that is given. Tests pass
  // fakes. The store must outlive the coordinator.
  Coordinator(state::Store& store, CoordinatorOptions options, std::function<int64_t()> now_ms = nullptr,
              std::function<int64_t()> wall_ms = nullptr);
  ~Coordinator();

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Loads jobs and nodes from the store (see the file comment). Call once, before anything else.
  Status recover();
  // Ticks every tick_ms on the loop until stop(). stop() also closes every agent link and stores what is
  // left to store.
  void start();
  // Closes every agent stream and stops the ticker; calls are still answered (the daemon calls this before it
  // shuts its gRPC server down, then stop()).
  void closeAgents();
  void stop();

  // One round of housekeeping: nodes past the heartbeat grace go DOWN, the recovery window ends, pending
  // jobs are placed. Called by the ticker; tests call it directly.
  void tick();

  // ---- Agents ---- (answers as for users, below)
  using StatusDone = std::function<void(Status)>;
  void registerAgent(const v1::RegisterRequest& request,
                     std::function<void(StatusOr<v1::RegisterResponse>)> done);
  // The agent's stream said hello: commands for the node go to `link` from now on.
  void attachAgent(const std::string& node, const std::string& session, std::shared_ptr<AgentLink> link,
                   StatusDone done);
  // The stream that carried `link` ended. The node is not DOWN yet: that takes the heartbeat grace. A link
  // that has already been replaced (the agent connected again) is ignored. Returns at once.
  void detachAgent(const std::string& node, const std::string& session,
                   const std::shared_ptr<AgentLink>& link);
  void heartbeat(const std::string& node, const std::string& session, const v1::Heartbeat& heartbeat,
                 StatusDone done);
  void rankEvent(const std::string& node, const std::string& session, const v1::RankStatus& rank,
                 StatusDone done);
  void logData(const std::string& node, const std::string& session, const v1::LogData& data, StatusDone done);

  // ---- Users ----
  // No call blocks its caller: `done` is called exactly once, on a coordinator thread, and must not block
  // (hand the answer to your own executor). A success is answered once every change the call made is durable;
  // the agents' calls above that change nothing users wait for (attach, heartbeat, rank events, log data) are
  // answered at once. blocking_coordinator.h has a synchronous form of each call, for tests and tools.
  template <class T>
  using Done = std::function<void(StatusOr<T>)>;

  void submit(const v1::JobSpec& spec, Done<v1::Job> done);
  // A job or a job array (SubmitRequest.array), all or nothing.
  void submit(const v1::SubmitRequest& request, Done<v1::SubmitResponse> done);
  void getJob(const std::string& id, Done<v1::Job> done);
  // A page of jobs in submit order (see ListJobsRequest).
  void listJobs(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done);
  // signal 0 cancels; 1..64 only sends that signal to the running ranks (CancelJobRequest).
  void cancel(const std::string& id, int signal, Done<v1::Job> done);
  // Holds a PENDING job (hold = true) or releases it. An admin's hold on another user's job (by_admin) is
  // released only by an admin.
  void hold(const std::string& id, bool hold, bool by_admin, Done<v1::Job> done);
  // Stops a live job's ranks and puts it back in the queue, without using one of its max_restarts.
  void requeue(const std::string& id, Done<v1::Job> done);
  // The accounts and their shares, as the user registry has them now (auth/users.h); the queue is ordered by
  // them from the next pass on.
  void setAccounts(placement::ShareTree tree);
  // Every account's share, decayed usage and fair-share factor (ddlctl shares).
  void shares(Done<v1::GetSharesResponse> done);
  // Usage over a period from the daily rollups (ddlctl usage); INVALID_ARGUMENT for a period that ends before
  // it starts.
  void usage(const v1::GetUsageRequest& request, Done<v1::GetUsageResponse> done);
  void listNodes(Done<std::vector<v1::Node>> done);
  void drain(const std::string& node, bool drain, const std::string& reason, Done<v1::Node> done);
  // An admin's word that a faulted GPU is fit again (ddlctl admin gpu-ok): jobs may be placed on it.
  void clearGpuFault(const std::string& node, int gpu, Done<v1::Node> done);
  // Forgets a DOWN node with no live job placed on it (RemoveNodeRequest); the answer is the removed node.
  void removeNode(const std::string& node, Done<v1::Node> done);
  void ring(const std::string& id, Done<v1::RingLayout> done);
  // Reads a piece of a rank's log from its node: sends ReadLog on the agent's stream; the answer comes when
  // the agent's LogData does, or UNAVAILABLE after log_timeout_ms.
  void readLog(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done);
  void metrics(std::function<void(MetricsSnapshot)> done);
  // What the dashboard plots (telemetry_history.h): one job's per-rank series (empty when none is kept), and
  // the cluster's GPUs and jobs by state over time.
  void jobSeries(const std::string& id, Done<JobSeries> done);
  void clusterSeries(Done<ClusterSeries> done);

  // Calls `done` once every change made before this call is durable and the commands that waited for those
  // changes have been sent: a barrier, for tools and tests.
  void whenDurable(std::function<void()> done);

  // Whether the coordinator can store its state. Any thread; never blocks. While !ok, /healthz fails, new
  // submits are refused, and the unstored changes are retried until the store works again.
  StoreHealth health() const;

 private:
  // What a request id's submit made: jobs first..last (by number; one job, or an array's), `in_memory` of
  // them still in jobs_. The entry goes when the last of them leaves memory: bounded by the jobs in memory.
  struct Submitted {
    int64_t first = 0;
    int64_t last = 0;
    int in_memory = 0;
  };
  using Node = NodeRegistry::Node;
  struct JobRuntime {
    int attempt = 0;
    int port = 0;           // rendezvous port on rank 0's node (DDL_ROOT), port + 1 for MASTER_PORT
    std::string root_node;  // rank 0's node
    std::map<int, std::string> rank_node;  // every rank of the layout -> its node
    std::map<int, v1::RankStatus> ranks;   // the current attempt's ranks as reported
    bool warned = false;                   // JobSpec.warn_signal was sent to this attempt
    // Elastic jobs (elastic.cpp): the ranks (launch slots) the job went on without, which count no more, and
    // what a grow needs: the attempt's secret (in memory only: a restarted coordinator grows no job back)
    // and when to try next.
    std::set<int> gone;
    std::string secret;
    int64_t next_grow_ms = 0;
    std::set<int> joiners;  // the slots grows started, until they report collectives (joined): a loss of
                            // such slots alone backs the next grow off
    int64_t grow_backoff_ms = 0;  // doubles with each loss of joiners only
    // The slots that count: rank_node's without the gone ones.
    std::vector<int> members() const;
    // Whether every slot that counts has reported and `pred` holds for its latest report. Runs with every
    // rank report (maybeCompleteOnLoop): no copy, no allocation.
    template <typename Pred>
    bool allMembers(Pred pred) const {
      for (const auto& [slot, node] : rank_node) {
        if (gone.count(slot)) continue;
        auto it = ranks.find(slot);
        if (it == ranks.end() || !pred(it->second)) return false;
      }
      return true;
    }
  };

  // The *OnLoop methods run on the loop thread only.
  Status recordTransitionOnLoop(const std::string& id, state::JobState to, const std::string& reason,
                                const std::optional<state::Failure>& failure = std::nullopt,
                                bool counts_as_restart = true);
  // Dependencies: the jobs waiting for `id`, now final, are let go or cancelled (a worklist, not recursion:
  // a cancelled dependent may have dependents of its own).
  void resolveDependentsOnLoop(const std::string& id);
  // Why a PENDING job may not be placed now (held, dependencies, its array's limit), or "".
  std::string notYetOnLoop(const state::Job& job, const std::map<std::string, int>& array_running) const;
  // notYetOnLoop's reason in a word (v1::Job.reason_code), for a job it holds back.
  static std::string notYetCode(const state::Job& job);
  // A rank's report into the job's kept results (stored when it starts or ends; figures in memory).
  void recordRankResultOnLoop(const std::string& node, const v1::RankStatus& report);
  void enforceTimeLimitsOnLoop();
  // Preemption (placement/preemption.h: QoS tiers, and accounts' shares where the config turns it on): after
  // a scheduling pass, the first waiting job that may preempt running ones, where freeing the fewest of them
  // lets it start, has them preempted; one such job at a time. Its reason is Preempting until they are gone.
  void preemptForWaitingOnLoop(const placement::ScheduleResult& result,
                               const std::vector<placement::JobRequest>& queue);
  // Orders job `id` first in its tier in the passes until it starts or its victims (their deadline
  // `deadline_ms`) have surely stopped: favored_.
  void favorOnLoop(const std::string& id, int64_t deadline_ms);
  // Signals a running job's ranks (its --signal's signal, else SIGTERM) with the deadline its QoS's grace
  // gives; they are killed then. `for_share`: for job `by`'s account's share, not its QoS (the log says
  // which).
  void preemptOnLoop(const std::string& id, const std::string& by, int64_t now_ms, bool for_share);
  // Ends a preemption: requeues the job (as PREEMPTED, not a restart) and stops what is left of its ranks
  // (at once, grace_ms 0, past the deadline).
  void endPreemptionOnLoop(const std::string& id, const std::string& why, int grace_ms);
  void enforcePreemptionsOnLoop();
  // Whether every rank of the job's current attempt has reported its exit.
  bool allRanksExitedOnLoop(const std::string& id) const;
  void readMissingDependenciesOnLoop();
  // One scheduling pass: placement (a pure function over a snapshot) runs on the loop.
  void schedulePassOnLoop();
  void launchOnLoop(const std::string& id, const placement::Allocation& allocation,
                    const placement::RingLayout& layout);
  // Fails live jobs placed on a node that is DOWN or unknown (a crash between marking the node DOWN and
  // failing its jobs, or a failed write, must not leave a job running forever).
  void sweepLostJobsOnLoop();
  // A node's ranks are lost (node DOWN, or the agent restarted without them): fail or requeue its jobs.
  // A heartbeat's GPU faults (their jobs fail) and health check (the node drained, or undrained).
  void nodeHealthOnLoop(Node& entry, const v1::Heartbeat& heartbeat);
  // only_rank >= 0 (with only_job): that rank alone is lost, not the job's others on the node.
  void loseNodeJobsOnLoop(const std::string& node, const std::string& reason,
                          const std::string& only_job = "", int only_rank = -1);
  // ---- Elastic jobs (elastic.cpp) ----
  // Job `id` loses the ranks `lost` (launch slots; `why` says how, `failure` names the first): an elastic job
  // with enough ranks left goes on without them (and, placed by whole nodes, without the rest of their nodes'
  // ranks, which are stopped), recorded as a membership change: returns nullopt. Otherwise returns what the
  // failure's reason adds ("" for a job that is not elastic) and the caller fails or requeues the job.
  std::optional<std::string> shrinkOnLoop(const std::string& id, std::set<int> lost, const std::string& why,
                                          const std::optional<state::Failure>& failure);
  // Each RUNNING elastic job short of its ranks, where free capacity (left over by the queue) fits the ranks
  // it lacks: starts them with DDL_JOIN=1 and records the membership change.
  void growElasticOnLoop();
  // Fails (or requeues) job `id` for the loss of `lost`, unless it is elastic and shrinks (shrinkOnLoop).
  void loseRanksOnLoop(const std::string& id, const std::set<int>& lost, const std::string& why,
                       const std::optional<state::Failure>& failure);
  // Ends (or requeues) a live job after a rank failure; stops the ranks that remain.
  void failJobOnLoop(const std::string& id, const std::string& reason, std::optional<state::Failure> failure);
  // grace_ms < 0: the configured stop grace (stop_grace_ms).
  v1::Command stopCommand(const std::string& id, int attempt, const std::string& reason,
                          int grace_ms = -1) const;
  // Sends the job's StopJob to every node of `allocation` (passed in: a requeue clears the job's own).
  // Sends `signal` to the running ranks of the job's current attempt (cancel --signal, --signal SIG@SECONDS,
  // a preemption, with its deadline).
  void signalRanksOnLoop(const state::Job& job, int signal, int64_t preempt_deadline_ms = 0);
  void stopJobEverywhereOnLoop(const std::string& id, int attempt, const std::string& reason,
                               const std::vector<state::NodeAllocation>& allocation, int grace_ms = -1);
  // Records a rank report. A report about an ended job or an older attempt goes into `stale` (job, attempt)
  // so the caller sends one StopJob for it.
  void applyRankReportOnLoop(Node& node, const v1::RankStatus& rank,
                             std::set<std::pair<std::string, int>>* stale);
  void stopStaleOnLoop(const std::string& node, const std::set<std::pair<std::string, int>>& stale);
  // Fills runtime_[id] from the job's allocation (rank order, root node, port).
  void buildRuntimeOnLoop(const state::Job& job, const placement::RingLayout& layout);
  void maybeCompleteOnLoop(const std::string& id);
  // stopping_ranks: whether the GPUs (and CPUs and memory) of ranks still stopping count as used; without,
  // the cluster as the live jobs hold it (what preemption weighs).
  placement::Cluster snapshotOnLoop(bool for_scheduling, bool stopping_ranks = true) const;
  // Per node: the GPUs held by live jobs or (stopping_ranks) by ranks still running there, and the live jobs
  // placed there. One pass over jobs and nodes, so listings and snapshots stay linear in the cluster's size.
  std::map<std::string, NodeUsage> usageOnLoop(bool stopping_ranks = true) const;
  // Applying a decision re-checks that its GPUs are free (a cheap guard against a placement bug).
  bool stillFreeOnLoop(const placement::Allocation& allocation,
                       std::map<std::string, NodeUsage>& usage) const;
  int pickPortOnLoop(const std::string& node, const std::string& job) const;
  static int attemptOf(const state::Job& job);
  v1::Job toProtoOnLoop(const state::Job& job) const;
  // The ring layout a placed job's ranks were given; "" or why it cannot be rebuilt.
  std::string layoutOfOnLoop(const state::Job& job, placement::RingLayout* layout) const;
  void housekeepingOnLoop();  // heartbeat grace and the end of recovery
  void chargeUsageOnLoop();   // the GPUs of launched live jobs, to their users' accounts
  std::vector<ShareKeeper::Holder> holdersOnLoop() const;  // what launched live jobs hold, and whose
  // Gives `limits` the GPU-seconds each (account, user) used in the current period of each GPU-hours limit:
  // the ended attempts' rollups and the launched jobs (`holders`) so far.
  void spentOnLoop(placement::LimitTracker& limits, const std::vector<ShareKeeper::Holder>& holders) const;
  // A submit of `count` jobs like `spec` within the limits of its user and account (never more GPUs than one
  // allows; pending jobs within theirs), else why not.
  Status withinLimitsOnLoop(const state::JobSpec& spec, size_t count) const;

  // ---- The loop (actor.h) ----
  bool onLoop() const;
  void post(std::function<void()> fn);
  // Stores the job as it is now; `with`: writes that go with it (its attempt's usage rollups), in the same
  // batch where they fit one transaction together, else in the batches after the job's, never before it.
  void putJobOnLoop(const state::Job& job, bool new_job = false, std::vector<state::Write> with = {});
  // Final jobs leave memory past the count or age limit, once their last change is durable.
  void evictFinishedOnLoop();
  // The job from memory, or from the store (read on the reader thread) for one that left memory; `fn` runs on
  // the loop either way.
  void withJobOnLoop(const std::string& id, std::function<void(StatusOr<state::Job>)> fn);
  void listJobsOnLoop(const v1::ListJobsRequest& request, Done<v1::ListJobsResponse> done);
  void readLogOnLoop(const v1::GetLogsRequest& request, Done<v1::GetLogsResponse> done);
  // After each durable batch: final jobs leave memory, submits now stored may be placed.
  void committedOnLoop();
  // A submit whose batch could not be stored: its jobs are CANCELLED (never placed, so nothing ran) and
  // their request id forgotten, so that the caller, refused with `why`, may submit again.
  void withdrawSubmitOnLoop(const std::vector<std::string>& ids, const Status& why);
  // What a submit that repeats a request id gets: the jobs its first submit made, as they are now; refused
  // when the repeat asks for another job (a request id used twice by mistake).
  StatusOr<v1::SubmitResponse> existingSubmitOnLoop(const Submitted& made, const state::JobSpec& asked) const;
  // Whether a submit of `count` jobs of `spec` fits the store: all of them in one transaction, and each job's
  // record, ranks and all, in one; room is made for them in the current batch.
  Status fitsTheStoreOnLoop(const state::JobSpec& spec, size_t count, int64_t now);
  // `known` holds the final states of after_ok dependencies that had left memory (read from the store).
  StatusOr<v1::SubmitResponse> submitOnLoop(const v1::SubmitRequest& request,
                                            const std::map<std::string, state::JobState>& known);
  void submitAsyncOnLoop(const v1::SubmitRequest& request, Done<v1::SubmitResponse> done);
  StatusOr<v1::Job> cancelOnLoop(const state::Job& job, int signal = 0);
  StatusOr<v1::Job> holdOnLoop(const state::Job& job, bool hold, bool by_admin);
  StatusOr<v1::Job> requeueOnLoop(const state::Job& job);
  // A STARTING job none of whose ranks was ever reported, found missing on `node` as it registers: placed
  // again (its start was lost with the coordinator that stored it). False, doing nothing, otherwise.
  bool placeAgainIfNeverStartedOnLoop(const std::string& id, const std::string& node);
  // Runs `fn` (on the loop) with the job, if it is known, and replies with its answer after the commit.
  void jobCallOnLoop(const std::string& id, Done<v1::Job> done,
                     std::function<StatusOr<v1::Job>(const state::Job&)> fn);
  std::vector<v1::Node> listNodesOnLoop();
  StatusOr<v1::Node> drainOnLoop(const std::string& node, bool drain, const std::string& reason);
  StatusOr<v1::Node> clearGpuFaultOnLoop(const std::string& node, int gpu);
  StatusOr<v1::Node> removeNodeOnLoop(const std::string& node);
  StatusOr<v1::RingLayout> ringOnLoop(const state::Job& job);
  MetricsSnapshot metricsOnLoop();
  Status recoverOnLoop();
  StatusOr<v1::RegisterResponse> registerAgentOnLoop(const v1::RegisterRequest& request);
  Status attachAgentOnLoop(const std::string& node, const std::string& session,
                           std::shared_ptr<AgentLink> link);
  Status heartbeatOnLoop(const std::string& node, const std::string& session, const v1::Heartbeat& heartbeat);
  Status rankEventOnLoop(const std::string& node, const std::string& session, const v1::RankStatus& rank);
  Status logDataOnLoop(const std::string& node, const std::string& session, const v1::LogData& data);

  state::Store& store_;
  // The loop and the group commit. First of the members that hold loop state, so it is destroyed after them;
  // the destructor stops its thread before any of them goes.
  std::unique_ptr<Actor> actor_;
  const CoordinatorOptions options_;
  std::function<int64_t()> now_ms_;   // monotonic: the registry's liveness and recovery window, housekeeping
  std::function<int64_t()> wall_ms_;  // NodeRecord::last_heartbeat_ms, transitions
  // The nodes and their agents' sessions: a room of its own on the loop, which tells this job side of a node
  // lost through its listener.
  std::unique_ptr<NodeRegistry> registry_;
  // The account tree and the usage charged to it; orders the queue (fair-share).
  std::unique_ptr<ShareKeeper> shares_;
  // Each ended attempt's usage in daily rollups per account and user (accounting).
  std::unique_ptr<UsageBook> usage_book_;

  // Loop state: touched on the loop thread only.
  std::map<std::string, state::Job> jobs_;             // live jobs and the most recent final ones
  std::map<std::string, JobRuntime> runtime_;          // live jobs that have been launched
  struct Waiting {
    std::string code;  // v1::Job.reason_code
    std::string text;
  };
  std::map<std::string, Waiting> pending_reason_;  // from the last schedule pass
  // The job that preempted for its share: ordered first in its tier (placement::favor) until it starts,
  // leaves the queue, or favored_until_ms_ (wall clock) passes. In memory: a coordinator that takes over
  // favors the job of a preemption still in flight (preempted_by), but one whose victims are already requeued
  // is forgotten; their jobs may then take the GPUs back, and the job preempts once more.
  std::string favored_;
  int64_t favored_until_ms_ = 0;
  // dependency -> the PENDING jobs waiting for it (their waiting_for); at most 64 entries per pending job.
  std::map<std::string, std::set<std::string>> dependents_;
  std::deque<std::string> ended_for_dependents_;  // final jobs whose dependents are still to be resolved
  bool resolving_dependents_ = false;
  bool schedule_wanted_ = true;
  int64_t limits_day_ = -1;  // the UTC day of the last housekeeping: a new one may start a GPU-hours period
  int64_t last_job_number_ = 0;  // the highest job number handed out
  uint64_t feasibility_epoch_ = 0;
  std::unique_ptr<placement::Cluster>
      feasibility_cluster_;  // submit's "could it ever fit" view, at that epoch
  struct Finished {
    std::string id;
    uint64_t seq = 0;  // the batch that holds its final state
    int64_t ended_ms = 0;
  };
  std::deque<Finished> finished_;  // final jobs in memory, oldest first
  std::map<std::pair<std::string, std::string>, Submitted> request_ids_;  // by (user, request id)
  // A job leaves the request id index (it left memory, or its submit was withdrawn: `forget` all of it).
  void dropRequestIdOnLoop(const state::Job& job, bool forget);
  // Jobs whose submit is not known durable yet -> the batch holding it. They are not placed until it is: a
  // submit the store cannot take is withdrawn, and nothing of it may have run. Bounded by the submits in
  // flight; erased once their batch is durable (committedOnLoop) or they are withdrawn.
  std::map<std::string, uint64_t> unstored_submits_;
  // Final jobs written again after their end (a rank's exit after a cancel): the batch holding that write, so
  // that they leave memory only once it is durable. At most one entry per final job in memory.
  std::map<std::string, uint64_t> rewritten_final_;

  MetricsSnapshot counters_;  // the counters and the histogram; the gauges are filled by metrics()
  TelemetryHistory telemetry_;  // the dashboard's plots; bounded (its header)
  std::unique_ptr<LogRelay>
      logs_;  // reads of rank logs waiting for agents (log_relay.h); at most kMaxLogReads

  bool stopping_ = false;  // closeAgents() ran: no ticker starts again
  std::unique_ptr<StoreReader> reader_;
};

}  // namespace ddl::coordinator
