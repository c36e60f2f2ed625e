// Fair-share priority (fair_share.h): normalised shares down the account tree, decayed usage up it, the
// factor 2^(-U/S) per user, and the queue's order from it and age, with each user's --priority as nice.
#include "placement/fair_share.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <set>

#include "common/resources.h"
#include "common/utc_day.h"

namespace ddl::placement {

const char* periodName(Period period) {
  switch (period) {
    case Period::kDay:
      return "day";
    case Period::kWeek:
      return "week";
    case Period::kMonth:
      return "month";
  }
  return "?";
}

std::optional<Period> parsePeriod(const std::string& name) {
  for (Period p : {Period::kDay, Period::kWeek, Period::kMonth}) {
    if (name == periodName(p)) return p;
  }
  return std::nullopt;
}

int64_t periodStart(Period period, int64_t day) {
  switch (period) {
    case Period::kDay:
      return day;
    case Period::kWeek:
      return utcWeekStart(day);
    case Period::kMonth:
      return utcMonthStart(day);
  }
  return day;
}

int64_t periodEnd(Period period, int64_t day) {
  switch (period) {
    case Period::kDay:
      return day + 1;
    case Period::kWeek:
      return utcWeekStart(day) + 7;
    case Period::kMonth:
      return utcNextMonthStart(day);
  }
  return day + 1;
}

namespace {

// Usage this small (a GPU-millisecond) counts as none: such figures are what decay leaves behind.
constexpr double kNoUsage = 1e-3;

// The account a job or a figure is charged to: its own where the tree knows it, else root.
std::string chargedAccount(const ShareTree& tree, const std::string& account) {
  return tree.accounts.count(account) ? account : kRootAccount;
}

// Each account's sub-accounts (names in order), by parent: an account whose parent is unknown hangs under
// root. `keep`: only the accounts it says yes to (nullptr: all).
std::map<std::string, std::vector<std::string>> childrenOf(const ShareTree& tree,
                                                           const std::set<std::string>* keep = nullptr) {
  std::map<std::string, std::vector<std::string>> children;
  for (const auto& [name, account] : tree.accounts) {
    if (!keep || keep->count(name))
      children[tree.accounts.count(account.parent) ? account.parent : kRootAccount].push_back(name);
  }
  return children;
}

// An account's weight among its siblings: its share, at least 1.
int64_t shareOf(const ShareTree& tree, const std::string& account) {
  return std::max<int64_t>(tree.accounts.at(account).share, 1);
}

// Users with work or usage in each account: the members an account's share is split among.
std::map<std::string, std::set<std::string>> activeUsers(const std::vector<JobRequest>& queue,
                                                         const ShareTree& tree, const UsageLedger& usage) {
  std::map<std::string, std::set<std::string>> users;
  for (const JobRequest& job : queue) users[chargedAccount(tree, job.account)].insert(job.user);
  for (const auto& [key, used] : usage.by_user) {
    if (used > kNoUsage) users[chargedAccount(tree, key.first)].insert(key.second);
  }
  return users;
}

std::vector<ShareRow> sharesWith(const ShareTree& tree, const UsageLedger& usage,
                                 const std::map<std::string, std::set<std::string>>& users) {
  const std::map<std::string, std::vector<std::string>> children = childrenOf(tree);
  std::map<std::string, double> own;  // each account's users' usage
  for (const auto& [key, used] : usage.by_user) own[chargedAccount(tree, key.first)] += used;

  std::vector<ShareRow> rows;
  std::set<std::string> seen;
  // Depth first; returns the subtree's usage. Rows are filled in on the way down (shares) and up (usage).
  std::function<double(const std::string&, const std::string&, int, int64_t, double)> walk =
      [&](const std::string& name, const std::string& parent, int depth, int64_t share, double norm) {
        const size_t at = rows.size();
        rows.push_back({name, parent, depth, share, norm, 0, 0, 1, norm});
        double used = own[name];
        auto kids = children.find(name);
        if (kids != children.end()) {
          // Users directly in an account that also has sub-accounts count as one more member of share 1.
          auto direct = users.find(name);
          int64_t total = direct != users.end() && !direct->second.empty() ? 1 : 0;
          for (const std::string& kid : kids->second) total += shareOf(tree, kid);
          rows[at].users_share = norm / std::max<int64_t>(total, 1);
          for (const std::string& kid : kids->second) {
            if (!seen.insert(kid).second) continue;
            const int64_t kid_share = shareOf(tree, kid);
            used += walk(kid, name, depth + 1, kid_share, norm * kid_share / total);
          }
        }
        rows[at].usage = used;
        return used;
      };
  const double total = walk(kRootAccount, "", 0, 1, 1.0);
  for (ShareRow& row : rows) {
    row.norm_usage = total > kNoUsage ? row.usage / total : 0;
    row.factor = row.norm_share > 0 ? std::exp2(-row.norm_usage / row.norm_share) : 0;
  }
  return rows;
}

}  // namespace

std::vector<std::string> ShareTree::chain(const std::string& account) const {
  std::vector<std::string> out;
  std::string at = accounts.count(account) ? account : kRootAccount;
  for (size_t depth = 0; depth <= accounts.size() && at != kRootAccount; ++depth) {
    out.push_back(at);
    auto it = accounts.find(at);
    at = it != accounts.end() && accounts.count(it->second.parent) ? it->second.parent : kRootAccount;
  }
  out.push_back(kRootAccount);
  return out;
}

const Qos* ShareTree::findQos(const std::string& name) const {
  static const Qos normal;
  auto it = qos.find(qosName(name));
  if (it != qos.end()) return &it->second;
  return qosName(name) == kNormalQos ? &normal : nullptr;
}

std::string ShareTree::qosProblem(const JobRequest& job) const {
  const Qos* q = findQos(job.qos);
  if (!q) {
    std::string known = kNormalQos;
    for (const auto& [name, entry] : qos) {
      if (name != kNormalQos) known += ", " + name;
    }
    return "there is no QoS '" + job.qos + "' (there are: " + known + ")";
  }
  if (q->accounts.empty()) return "";
  for (const std::string& a : chain(job.account)) {
    if (std::find(q->accounts.begin(), q->accounts.end(), a) != q->accounts.end()) return "";
  }
  std::string allowed;
  for (const std::string& a : q->accounts) allowed += (allowed.empty() ? "" : ", ") + a;
  return "account " + (job.account.empty() ? std::string(kRootAccount) : job.account) + " may not use QoS " +
         job.qos + " (it is for " + allowed + " and the accounts under them)";
}

bool ShareTree::mayPreempt(const std::string& by, const std::string& victim) const {
  const Qos* q = findQos(by);
  const Qos* v = findQos(victim);
  if (!q || !v || q->priority <= v->priority) return false;
  return std::find(q->preempt.begin(), q->preempt.end(), qosName(victim)) != q->preempt.end();
}

LimitTracker::LimitTracker(const ShareTree& tree) : tree_(tree) {
  for (const auto& [name, account] : tree.accounts) {
    limited_ =
        limited_ || account.limits.gpus > 0 || account.limits.running > 0 || account.limits.gpu_hours > 0;
  }
  for (const auto& [name, limits] : tree.users) {
    limited_ = limited_ || limits.gpus > 0 || limits.running > 0 || limits.gpu_hours > 0;
  }
  for (const auto& [name, q] : tree.qos) limited_ = limited_ || q.gpus > 0;
}

void LimitTracker::hold(const std::string& account, const std::string& user, int gpus,
                        const std::string& qos) {
  if (!limited_) return;  // nothing is counted against
  for (const std::string& a : tree_.chain(account)) {
    account_[a].first += gpus;
    account_[a].second += 1;
  }
  user_[user].first += gpus;
  user_[user].second += 1;
  qos_[qosName(qos)] += gpus;
}

std::vector<Period> LimitTracker::periods() const {
  std::set<Period> out;
  for (const auto& [name, account] : tree_.accounts) {
    if (account.limits.gpu_hours > 0) out.insert(account.limits.period);
  }
  for (const auto& [name, limits] : tree_.users) {
    if (limits.gpu_hours > 0) out.insert(limits.period);
  }
  return {out.begin(), out.end()};
}

void LimitTracker::spent(Period period, const std::string& account, const std::string& user,
                         double gpu_seconds) {
  if (!limited_ || gpu_seconds <= 0) return;
  for (const std::string& a : tree_.chain(account)) account_spent_[{period, a}] += gpu_seconds;
  user_spent_[{period, user}] += gpu_seconds;
}

std::string LimitTracker::blocks(const JobRequest& job, std::string* code) const {
  if (!limited_) return "";
  auto spentIn = [](const std::map<std::pair<Period, std::string>, double>& spent, Period period,
                    const std::string& who) {
    auto it = spent.find({period, who});
    return it != spent.end() ? it->second : 0.0;
  };
  auto over = [&](const Limits& limits, const std::pair<int, int>& held, const std::string& who,
                  double used_s) -> std::string {
    if (limits.gpu_hours > 0 && used_s >= limits.gpu_hours * 3600) {
      char text[200];
      std::snprintf(text, sizeof(text), " used %s of its %s GPU-hours %s",
                    formatGpuHours(used_s / 3600).c_str(), formatGpuHours(limits.gpu_hours).c_str(),
                    limits.period == Period::kDay    ? "today"
                    : limits.period == Period::kWeek ? "this week"
                                                     : "this month");
      std::string why = who + text;
      if (today_ >= 0)
        why += "; its jobs start again on " + utcDayText(periodEnd(limits.period, today_)) + " (UTC)";
      return why + " (ddlctl admin set-limit)";
    }
    if (limits.gpus > 0 && held.first + job.gpuCount() > limits.gpus) {
      return who + " holds " + std::to_string(held.first) + " of its " + std::to_string(limits.gpus) +
             " GPUs (ddlctl admin set-limit); this job needs " + std::to_string(job.gpuCount()) + " more";
    }
    if (limits.running > 0 && held.second + 1 > limits.running) {
      return who + " runs " + std::to_string(held.second) +
             " jobs, as many as its limit allows (ddlctl admin " + "set-limit)";
    }
    return "";
  };
  if (const Qos* q = tree_.findQos(job.qos); q && q->gpus > 0) {
    auto held = qos_.find(qosName(job.qos));
    const int used = held != qos_.end() ? held->second : 0;
    if (used + job.gpuCount() > q->gpus) {
      *code = "QoS";
      return "QoS " + qosName(job.qos) + " holds " + std::to_string(used) + " of its " +
             std::to_string(q->gpus) + " GPUs (ddlctl admin add-qos --update); this job needs " +
             std::to_string(job.gpuCount()) + " more";
    }
  }
  if (auto it = tree_.users.find(job.user); it != tree_.users.end()) {
    auto held = user_.find(job.user);
    std::string why = over(it->second, held != user_.end() ? held->second : std::make_pair(0, 0),
                           "user " + job.user, spentIn(user_spent_, it->second.period, job.user));
    if (!why.empty()) {
      *code = "UserLimit";
      return why;
    }
  }
  for (const std::string& a : tree_.chain(job.account)) {
    auto it = tree_.accounts.find(a);
    if (it == tree_.accounts.end()) continue;
    auto held = account_.find(a);
    std::string why = over(it->second.limits, held != account_.end() ? held->second : std::make_pair(0, 0),
                           "account " + a, spentIn(account_spent_, it->second.limits.period, a));
    if (!why.empty()) {
      *code = "AccountLimit";
      return why;
    }
  }
  return "";
}

std::string LimitTracker::never(const JobRequest& job) const {
  if (const Qos* q = tree_.findQos(job.qos); q && q->gpus > 0 && job.gpuCount() > q->gpus) {
    return "job asks for " + std::to_string(job.gpuCount()) + " GPUs and QoS " + qosName(job.qos) +
           " may hold at most " + std::to_string(q->gpus) + " (ddlctl admin add-qos --update)";
  }
  auto it = tree_.users.find(job.user);
  if (it != tree_.users.end() && it->second.gpus > 0 && job.gpuCount() > it->second.gpus) {
    return "job asks for " + std::to_string(job.gpuCount()) + " GPUs and user " + job.user +
           " may hold at most " + std::to_string(it->second.gpus) + " (ddlctl admin set-limit)";
  }
  for (const std::string& a : tree_.chain(job.account)) {
    auto acc = tree_.accounts.find(a);
    if (acc != tree_.accounts.end() && acc->second.limits.gpus > 0 &&
        job.gpuCount() > acc->second.limits.gpus) {
      return "job asks for " + std::to_string(job.gpuCount()) + " GPUs and account " + a +
             " may hold at most " + std::to_string(acc->second.limits.gpus) + " (ddlctl admin set-limit)";
    }
  }
  return "";
}

ShareBalance::ShareBalance(const ShareTree& tree, const std::map<std::string, int>& held,
                           const std::set<std::string>& waiting)
    : tree_(&tree) {
  std::set<std::string> contenders;
  for (const auto& [account, gpus] : held) {
    if (gpus <= 0) continue;
    held_[chargedAccount(tree, account)] += gpus;
    contenders.insert(chargedAccount(tree, account));
  }
  for (const std::string& account : waiting) contenders.insert(chargedAccount(tree, account));
  contenders.erase(kRootAccount);
  std::set<std::string> on_path;  // the contenders and every account above one
  for (const std::string& c : contenders) {
    for (const std::string& a : tree.chain(c)) on_path.insert(a);
  }
  const std::map<std::string, std::vector<std::string>> children = childrenOf(tree, &on_path);
  // Down the tree from root (each account is some one parent's child, so the walk is bounded by the tree).
  std::vector<std::pair<std::string, double>> walk = {{kRootAccount, 1.0}};
  for (size_t i = 0; i < walk.size() && i <= tree.accounts.size(); ++i) {
    const auto [name, part] = walk[i];
    const bool own = contenders.count(name) > 0;
    auto kids = children.find(name);
    if (kids == children.end()) {
      if (own) weight_[name] = part;
      continue;
    }
    double total = own ? 1 : 0;
    for (const std::string& kid : kids->second) total += shareOf(tree, kid);
    if (own) weight_[name] = part / total;
    for (const std::string& kid : kids->second) walk.push_back({kid, part * shareOf(tree, kid) / total});
  }
}

bool ShareBalance::takesPart(const std::string& account) const {
  return weight_.count(chargedAccount(*tree_, account)) > 0;
}

double ShareBalance::weight(const std::string& account) const {
  auto it = weight_.find(chargedAccount(*tree_, account));
  return it != weight_.end() ? it->second : 0;
}

double ShareBalance::value(const std::string& account, int delta) const {
  const std::string charged = chargedAccount(*tree_, account);
  auto h = held_.find(charged);
  return ((h != held_.end() ? h->second : 0) + delta) / weight_.at(charged);
}

bool ShareBalance::fair(const std::string& account, int gpus,
                        const std::vector<std::pair<std::string, int>>& victims) const {
  if (!takesPart(account)) return false;
  std::map<std::string, int> lost;  // by charged account
  for (const auto& [a, g] : victims) lost[chargedAccount(*tree_, a)] += g;
  const double mine = value(account, gpus);
  for (const auto& [a, g] : lost) {
    if (a == chargedAccount(*tree_, account) || !takesPart(a) || mine > value(a, -g) + 1e-9) return false;
  }
  return true;
}

void UsageLedger::decayTo(int64_t now_ms) {
  if (at_ms == 0 || now_ms <= at_ms || half_life_s <= 0) {
    at_ms = std::max(at_ms, now_ms);
    return;
  }
  const double keep = std::exp2(-(now_ms - at_ms) / 1000.0 / half_life_s);
  for (auto& [key, used] : by_user) used *= keep;
  at_ms = now_ms;
}

void UsageLedger::charge(const std::string& account, const std::string& user, double gpu_seconds) {
  if (gpu_seconds > 0) by_user[{account, user}] += gpu_seconds;
}

std::vector<std::pair<std::string, std::string>> UsageLedger::trim(size_t max_entries) {
  std::vector<std::pair<std::string, std::string>> dropped;
  if (by_user.size() <= max_entries) return dropped;
  std::vector<std::pair<double, std::pair<std::string, std::string>>> smallest;
  for (const auto& [key, used] : by_user) smallest.push_back({used, key});
  const size_t excess = by_user.size() - max_entries;
  std::nth_element(smallest.begin(), smallest.begin() + excess, smallest.end());
  for (size_t i = 0; i < excess; ++i) {
    by_user.erase(smallest[i].second);
    dropped.push_back(smallest[i].second);
  }
  return dropped;
}

std::vector<ShareRow> shares(const ShareTree& tree, const UsageLedger& usage) {
  return sharesWith(tree, usage, activeUsers({}, tree, usage));
}

void prioritize(std::vector<JobRequest>& queue, const ShareTree& tree, const UsageLedger& usage,
                const PriorityWeights& weights, int64_t now_ms) {
  const auto users = activeUsers(queue, tree, usage);
  std::map<std::string, const ShareRow*> row_of;
  const std::vector<ShareRow> rows = sharesWith(tree, usage, users);
  for (const ShareRow& row : rows) row_of[row.account] = &row;
  const double total = rows.empty() ? 0 : rows.front().usage;
  // Each user's factor: the part of its account's share that the account's users split, split evenly.
  auto userFactor = [&](const std::string& account, const std::string& user) {
    const size_t n = std::max<size_t>(users.count(account) ? users.at(account).size() : 1, 1);
    const double share = row_of.at(account)->users_share / n;
    auto used = usage.by_user.find({account, user});
    const double u = total > kNoUsage && used != usage.by_user.end() ? used->second / total : 0;
    return share > 0 ? std::exp2(-u / share) : 0.0;
  };
  std::map<std::pair<std::string, std::string>, double> factor;  // per (account, user), computed once
  std::map<std::string, std::vector<JobRequest*>> by_user;
  for (JobRequest& job : queue) {
    const std::string account = chargedAccount(tree, job.account);
    auto [it, fresh] = factor.try_emplace({account, job.user}, 0.0);
    if (fresh) it->second = userFactor(account, job.user);
    const double age = weights.age_max_ms > 0 && now_ms > job.submitMs
                           ? std::min(1.0, double(now_ms - job.submitMs) / weights.age_max_ms)
                           : 0.0;
    const Qos* q = tree.findQos(job.qos);
    job.tier = q ? q->priority : 0;
    job.order = weights.fairshare * it->second + weights.age * age;
    // A user's jobs in one account and of one QoS: a user who works in several accounts has a factor in
    // each, and its jobs in one must not take the priorities its jobs in another were given.
    by_user[job.user + '\n' + account + '\n' + qosName(job.qos)].push_back(&job);
  }
  // Nice: a user's jobs (in one account, of one QoS) keep the set of priorities they were given, handed out
  // in their --priority order.
  for (auto& [user, jobs] : by_user) {
    std::vector<double> orders;
    for (const JobRequest* job : jobs) orders.push_back(job->order);
    std::sort(orders.rbegin(), orders.rend());
    std::stable_sort(jobs.begin(), jobs.end(), [](const JobRequest* a, const JobRequest* b) {
      if (a->priority != b->priority) return a->priority > b->priority;
      return a->submitSeq < b->submitSeq;
    });
    for (size_t i = 0; i < jobs.size(); ++i) jobs[i]->order = orders[i];
  }
}

}  // namespace ddl::placement
