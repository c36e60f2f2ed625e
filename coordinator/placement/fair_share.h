// Fair-share priority: the order in which the queue is tried, from what each account was given and what it
// used.
//
// This is Slurm's multifactor priority with its classic fair-share factor, reduced to what ddl keeps:
//  - Accounts form a tree under root (auth/users.h); each has a share of its parent's. Its normalised share
//    S is its share over its siblings' times its parent's S (root: 1), what sshare calls NormShares.
//  - Usage is GPU-seconds (CPUs and memory weighted in where the coordinator's config says), charged to the
//    job's user in the job's account while it holds them, and decayed with a half-life (default 7 days), so
//    last month's heavy user is not punished forever. An account's usage is
//    its own users' plus its sub-accounts'; its normalised usage U is that over the whole cluster's.
//  - The fair-share factor is F = 2^(-U/S): 1 for an account that used nothing, 0.5 for one that used exactly
//    its share, towards 0 for one far over it. Inside an account the users split its share evenly among those
//    with work or usage, and a user's factor is 2^(-U_user / S_user) with S_user = S_account / users.
//  - A job's priority is w_fairshare * F + w_age * min(1, age / age_max) (weights 10,000 and 1,000 by
//    default), so fairness leads and age breaks ties and, in time, lifts a job nobody else wants to run.
//  - Its QoS (Qos below) is a strict tier above that: prioritize() sets JobRequest::tier to the QoS's
//    priority, and schedule() tries a higher tier first whatever the priorities, so the GPUs a preemption
//    frees go to a job of the preemptor's tier or above, never back to its victims' tier.
//  - A user's own --priority only orders that user's jobs (as nice): each user's jobs in one account (and of
//    one QoS) take the priorities those jobs were given, in their --priority order, so no user can overtake
//    another by asking, and a user in several accounts cannot lend one account's factor to another.
// prioritize() sets JobRequest::order; placement::schedule() tries the queue in that order, then --priority,
// then submit order. With no usage anywhere every factor is 1 and the queue is the age order: first come,
// first served, as before accounts.
//
// Pure functions over values; no I/O. Cost: O(A + J log J) for A accounts and J queued jobs.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "placement/cluster.h"

namespace ddl::placement {

inline constexpr const char* kRootAccount = "root";
inline constexpr const char* kNormalQos = "normal";
// The name a job's QoS goes by: "" (none asked for) is normal.
inline const std::string& qosName(const std::string& name) {
  static const std::string normal = kNormalQos;
  return name.empty() ? normal : name;
}

// A quality of service (Slurm's QOS): an admin-defined tier a job asks for with --qos. Jobs of a QoS of a
// higher priority are tried first (JobRequest::tier), it may preempt jobs of the QoS it names (each of lower
// priority), and a job of it that is preempted gets grace_s seconds to stop. "normal" always exists (priority
// 0, preempts nothing, 60 s of grace); an admin may change it but not remove it.
struct Qos {
  int64_t priority = 0;
  std::vector<std::string> preempt;   // the QoS whose jobs this one may preempt
  int64_t grace_s = 60;               // a job of this QoS, preempted, is killed this long after the signal
  int gpus = 0;                       // GPUs all jobs of this QoS may hold together (GrpTRES); 0: no limit
  std::vector<std::string> accounts;  // who may use it: these accounts and those under them; empty: everyone
  bool operator==(const Qos&) const = default;
};

// The calendar period (UTC) a GPU-hours limit counts over: the day, the week from Monday, the month.
enum class Period { kDay, kWeek, kMonth };
const char* periodName(Period period);  // "day", "week", "month"
std::optional<Period> parsePeriod(const std::string& name);
// The first UTC day (days since 1970-01-01) of the period holding `day`, and of the period after it.
int64_t periodStart(Period period, int64_t day);
int64_t periodEnd(Period period, int64_t day);

// What an account (with everything under it) or a user may hold at once (Slurm's GrpTRES=gres/gpu, GrpJobs
// and MaxSubmitJobs; MaxTRESPerUser, MaxJobsPerUser, MaxSubmitJobsPerUser), and the GPU-hours it may use in a
// period (GrpTRESMins=gres/gpu, counted over a calendar period rather than decayed). 0: no limit.
struct Limits {
  int gpus = 0;     // GPUs held by launched live jobs
  int running = 0;  // launched live jobs
  int pending = 0;  // jobs waiting in the queue (checked at submit)
  double gpu_hours = 0;  // GPU-hours its jobs used in the current period: none starts past it
  Period period = Period::kMonth;

  bool any() const { return gpus > 0 || running > 0 || pending > 0 || gpu_hours > 0; }
  bool operator==(const Limits&) const = default;
};

// The accounts as the user registry keeps them, with the limits of accounts and users; root is implied.
struct ShareTree {
  struct Account {
    Account(std::string parent = kRootAccount, int64_t share = 1, Limits limits = {})
        : parent(std::move(parent)), share(share), limits(limits) {}
    std::string parent;  // an account of the tree, or root
    int64_t share = 1;
    Limits limits;
  };
  std::map<std::string, Account> accounts;  // by name; never root
  std::map<std::string, Limits> users;      // by user name, where a user has limits
  std::map<std::string, Qos> qos;           // by name; "normal" is implied where absent
  // Fair-share preemption (preemption.h's planPreemption): a job may preempt jobs of accounts served more
  // over their share than its own would be with it. Off unless the coordinator's config turns it on
  // (fairshare_preemption).
  bool share_preemption = false;
  // The account and every account above it (root last), bounded by the tree's size.
  std::vector<std::string> chain(const std::string& account) const;
  // The QoS named `name` ("" is normal), or nullptr when there is none.
  const Qos* findQos(const std::string& name) const;
  // Why `job` may not ask for its QoS (there is no such QoS, or its account may not use it), or "".
  std::string qosProblem(const JobRequest& job) const;
  // Whether a job of QoS `by` may preempt one of QoS `victim`: `by` names it and has a higher priority.
  bool mayPreempt(const std::string& by, const std::string& victim) const;
};

// What launched jobs hold against the limits, as a scheduling pass starts more: GPUs and jobs per account
// (its own jobs and its sub-accounts') and per user; and the GPU-seconds used in the current period of each
// GPU-hours limit. A job starts only while its account (and each above it) and its user have used less than
// their GPU-hours in the period: jobs running when a limit is reached run on (they are not killed), so usage
// may pass the limit by what they use meanwhile.
class LimitTracker {
 public:
  explicit LimitTracker(const ShareTree& tree);
  // A job that holds `gpus` now (launched and live), or one the pass starts.
  void hold(const std::string& account, const std::string& user, int gpus, const std::string& qos = "");
  // The periods some GPU-hours limit counts over (the caller gives spent() for these only).
  std::vector<Period> periods() const;
  // GPU-seconds (account, user) used in the current `period`: ended attempts and running ones, so far.
  void spent(Period period, const std::string& account, const std::string& user, double gpu_seconds);
  // The UTC day (days since 1970-01-01) it is, so that a job held back by GPU-hours is told when the next
  // period starts; -1 (the default): not told.
  void setToday(int64_t day) { today_ = day; }
  // "" when the job may start within every limit; else why not, and *code is AccountLimit, UserLimit or QoS.
  std::string blocks(const JobRequest& job, std::string* code) const;
  // Why the job could never start within its limits (it asks for more GPUs than a limit allows), or "".
  std::string never(const JobRequest& job) const;

 private:
  const ShareTree& tree_;
  bool limited_ = false;  // some account or user has a GPU or running-jobs limit: else nothing blocks
  std::map<std::string, std::pair<int, int>> account_;  // GPUs, jobs
  std::map<std::string, std::pair<int, int>> user_;
  std::map<std::string, int> qos_;  // GPUs held per QoS that has a GPU limit
  // GPU-seconds used in the current period, per period, by account (with its subtree) and by user.
  std::map<std::pair<Period, std::string>, double> account_spent_, user_spent_;
  int64_t today_ = -1;
};

// Decayed GPU-seconds by account and user. The coordinator charges running jobs and decays as time passes.
struct UsageLedger {
  double half_life_s = 7 * 86400.0;
  int64_t at_ms = 0;                                              // when the figures below were last decayed
  std::map<std::pair<std::string, std::string>, double> by_user;  // (account, user) -> decayed GPU-seconds

  // Decays every figure from at_ms to now_ms (at_ms 0: starts the clock).
  void decayTo(int64_t now_ms);
  void charge(const std::string& account, const std::string& user, double gpu_seconds);
  // Keeps at most max_entries figures, dropping the smallest (usage that has decayed to nearly nothing);
  // returns the keys it dropped.
  std::vector<std::pair<std::string, std::string>> trim(size_t max_entries);
};

struct PriorityWeights {
  double fairshare = 10000;
  double age = 1000;
  int64_t age_max_ms = 7 * 86400 * 1000LL;
};

// One account as `ddlctl shares` shows it (Slurm's sshare columns).
struct ShareRow {
  std::string account;
  std::string parent;     // "" for root
  int depth = 0;          // 0 for root
  int64_t share = 1;      // raw, against its siblings
  double norm_share = 1;  // S
  double usage = 0;       // decayed GPU-seconds of the account and everything under it
  double norm_usage = 0;  // U
  double factor = 1;      // F = 2^(-U/S)
  // The part of S its own users split among them: S itself without sub-accounts; beside them, what their
  // one member of share 1 gets (prioritize() divides it by the users with work or usage).
  double users_share = 1;
};
// Every account of the tree, root first, each followed by its sub-accounts (by name): a depth-first walk. An
// account whose parent is unknown hangs under root.
std::vector<ShareRow> shares(const ShareTree& tree, const UsageLedger& usage);

// Fair-share preemption's view of the cluster (preemption.h's planPreemption; Kueue's
// LessThanOrEqualToFinalShare). The contenders are the accounts whose jobs hold GPUs or wait for them; the
// cluster is split among them alone, down the tree as shares() splits it among all accounts: an account's
// part among its contending sub-accounts by their shares, its own jobs counting as one more member of share 1
// where it has such sub-accounts. An account's value is the GPUs its jobs hold over its part: how far over
// its share it is served. Accounts are charged as prioritize() charges them (one the tree does not know is
// root's); root takes no part. `tree` must outlive the balance.
class ShareBalance {
 public:
  // `held`: the GPUs each account's launched jobs hold; `waiting`: the accounts with jobs waiting for GPUs.
  ShareBalance(const ShareTree& tree, const std::map<std::string, int>& held,
               const std::set<std::string>& waiting);
  // Whether `account` takes part (a contender of the tree; not root).
  bool takesPart(const std::string& account) const;
  // Whether `account`, once a job of `gpus` GPUs of it runs, is served no more than each account of `victims`
  // ((account, GPUs) of each) once it lost them: then none of those accounts can preempt back.
  bool fair(const std::string& account, int gpus,
            const std::vector<std::pair<std::string, int>>& victims) const;
  // The part of the cluster `account` is owed among the contenders (0 where it takes no part).
  double weight(const std::string& account) const;

 private:
  double value(const std::string& account, int delta) const;  // with `delta` GPUs more (or fewer)
  const ShareTree* tree_;
  std::map<std::string, double> weight_;  // by charged account
  std::map<std::string, int> held_;       // by charged account
};

// Sets `order` of every job in the queue (JobRequest::user, account, submitMs) as the file comment says. A
// job whose account is not in the tree is charged and ranked as root's.
void prioritize(std::vector<JobRequest>& queue, const ShareTree& tree, const UsageLedger& usage,
                const PriorityWeights& weights, int64_t now_ms);

}  // namespace ddl::placement
