// ShareKeeper: the coordinator's room for sharing the cluster. It owns the account tree (given by the user
// registry, auth/users.h, through Coordinator::setAccounts) and the decayed GPU-seconds of every user in
// every account (placement/fair_share.h's UsageLedger), charges the jobs that hold GPUs as time passes, and
// orders the queue from them (placement::prioritize).
//
// Usage outlives restarts and failovers: each user's figure is a Store entry usage/<account>:<user> holding
// the decayed GPU-seconds and when they were decayed to; figures charged since the last save are put through
// the actor's group commit every save_interval_ms (no write on the heartbeat path, none per charge), and read
// back at recovery, decayed to the time of reading. At most max_users figures are kept: beyond that the
// smallest (usage decayed to next to nothing) leave memory and the store.
//
// Threads: the coordinator's loop only (every method asserts it through the actor, except load(), which runs
// in recovery on the loop too).
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "placement/fair_share.h"
#include "state/store.h"

namespace ddl::coordinator {

class Actor;

struct ShareOptions {
  double half_life_s = 7 * 86400.0;  // usage halves in this time
  // What a job is charged per second, in GPU-seconds (Slurm's TRESBillingWeights): each GPU 1, each CPU
  // cpu_weight, each GiB of memory mem_weight_per_gib. 0 (the default): GPUs alone.
  double cpu_weight = 0;
  double mem_weight_per_gib = 0;
  placement::PriorityWeights weights;
  int64_t charge_interval_ms = 1000;  // usage is charged at most this often
  int64_t save_interval_ms = 60000;   // and stored at most this often
  size_t max_users = 100000;          // (account, user) figures kept
};

class ShareKeeper {
 public:
  ShareKeeper(Actor& actor, ShareOptions options);

  // Reads the stored usage (recovery), decayed to now_ms (unix ms).
  state::Status loadOnLoop(state::Store& store, int64_t now_ms);
  void setTreeOnLoop(placement::ShareTree tree) { tree_ = std::move(tree); }
  const placement::ShareTree& tree() const { return tree_; }

  // What holds GPUs now: the account and user charged and how many GPUs.
  struct Holder {
    std::string account;
    std::string user;
    int gpus = 0;
    std::string qos;  // its QoS ("" normal), for the QoS' GPU limits
    int cpus = 0;     // held for its ranks (--cpus-per-rank), all nodes together
    int64_t memory_bytes = 0;
    int64_t placed_ms = 0;  // since when (its attempt's placement, as its usage rollup counts it); 0: unknown
    double elastic_gpu_s = 0;  // an elastic job's GPU-seconds that gpus x the time since placed_ms misses
  };
  // What `h` is charged per second it holds its resources: GPU-seconds, CPUs and memory weighted in.
  double billedPerSecond(const Holder& h) const;
  // Charges the holders for the time since the last charge (billedPerSecond each; at most every
  // charge_interval_ms; the first call starts the clock) and stores the changed figures every
  // save_interval_ms. now_ms: unix ms. Returns the seconds each holder was charged for (0: none).
  double chargeOnLoop(int64_t now_ms, const std::vector<Holder>& holders);
  // Sets each job's order (placement::prioritize) as of now_ms.
  void prioritizeOnLoop(std::vector<placement::JobRequest>& queue, int64_t now_ms);
  // Every account's share, usage and factor as of now_ms (ddlctl shares).
  std::vector<placement::ShareRow> sharesOnLoop(int64_t now_ms);
  // Whether chargeOnLoop(now_ms) would charge (a caller may then skip gathering the holders).
  bool chargeDue(int64_t now_ms) const;
  // Stores the figures charged since the last save (chargeOnLoop does, every save_interval_ms; a clean stop
  // calls it once more).
  void saveOnLoop(int64_t now_ms);

 private:
  Actor& actor_;
  const ShareOptions options_;
  placement::ShareTree tree_;
  placement::UsageLedger ledger_;
  int64_t charged_ms_ = 0;  // when holders were last charged; 0: not yet
  int64_t saved_ms_ = 0;
  std::set<std::pair<std::string, std::string>> dirty_;  // figures charged since the last save
};

}  // namespace ddl::coordinator
