// Accounting: ended attempts in daily rollups per account and user (usage_book.h).
#include "service/usage_book.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cassert>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "placement/fair_share.h"
#include "service/actor.h"

namespace ddl::coordinator {

namespace {

constexpr const char* kDailyTable = "usage_daily";
constexpr int64_t kDayMs = 86400000;

// A name in an entry key: '%', ':' and what a key may not hold ('/', control bytes) as %XX, so that the key
// splits back at its two ':' whatever the names hold (registry names never need it; an insecure
// coordinator's users, named by the requests, might).
std::string keyPart(const std::string& name) {
  std::string out;
  for (unsigned char c : name) {
    if (c == '%' || c == ':' || c == '/' || c < 0x20 || c == 0x7f) {
      char hex[4];
      std::snprintf(hex, sizeof(hex), "%%%02X", c);
      out += hex;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

std::string nameOf(const std::string& part) {
  std::string out;
  for (size_t i = 0; i < part.size(); ++i) {
    unsigned hex = 0;
    if (part[i] == '%' && i + 2 < part.size() && std::sscanf(part.c_str() + i + 1, "%2x", &hex) == 1) {
      out += static_cast<char>(hex);
      i += 2;
    } else {
      out += part[i];
    }
  }
  return out;
}

std::string rowKey(int64_t day, const std::string& account, const std::string& user) {
  return utcDayText(day) + ":" + keyPart(account) + ":" + keyPart(user);
}

// The day an attempt's counts go to: the one its last moment falls in.
int64_t endDay(const state::AttemptUsage& u) {
  return utcDayOf(u.end_ms > u.start_ms ? u.end_ms - 1 : u.end_ms);
}

nlohmann::json toJson(const UsageFigures& f) {
  return {{"gpu_s", f.gpu_s},
          {"cpu_s", f.cpu_s},
          {"attempts", f.attempts},
          {"jobs", f.jobs},
          {"failed", f.failed},
          {"requeued", f.requeued},
          {"max_rss_bytes", f.max_rss_bytes},
          {"preempted", f.preempted}};
}

}  // namespace

void UsageFigures::add(const UsageFigures& o) {
  gpu_s += o.gpu_s;
  cpu_s += o.cpu_s;
  attempts += o.attempts;
  jobs += o.jobs;
  failed += o.failed;
  requeued += o.requeued;
  preempted += o.preempted;
  max_rss_bytes = std::max(max_rss_bytes, o.max_rss_bytes);
}

std::vector<std::pair<int64_t, double>> spreadOverDays(int64_t start_ms, int64_t end_ms) {
  if (end_ms <= start_ms) return {{utcDayOf(end_ms), 1.0}};
  std::vector<std::pair<int64_t, double>> out;
  const double total = static_cast<double>(end_ms - start_ms);
  for (int64_t day = utcDayOf(start_ms); day <= utcDayOf(end_ms - 1); ++day) {
    const int64_t from = std::max(start_ms, day * kDayMs), to = std::min(end_ms, (day + 1) * kDayMs);
    out.push_back({day, (to - from) / total});
  }
  return out;
}

UsageBook::UsageBook(Actor& actor, UsageOptions options) : actor_(actor), options_(options) {}

state::Status UsageBook::loadOnLoop(state::Store& store) {
  assert(actor_.onLoop());
  auto entries = store.listEntries(kDailyTable);
  if (!entries) return entries.status();
  rows_.clear();
  ++generation_;
  for (const state::Entry& e : *entries) {
    const size_t a = e.key.find(':'), u = a == std::string::npos ? a : e.key.find(':', a + 1);
    const auto day = a == std::string::npos ? std::nullopt : parseUtcDay(e.key.substr(0, a));
    const auto j = nlohmann::json::parse(e.value, nullptr, false);
    if (!day || u == std::string::npos || !j.is_object()) {
      spdlog::warn("usage_daily entry {} is not a daily rollup; it is ignored", e.key);
      continue;
    }
    auto num = [&j](const char* name) {
      return j.contains(name) && j[name].is_number() ? j[name].get<double>() : 0;
    };
    UsageFigures f;
    f.gpu_s = num("gpu_s");
    f.cpu_s = num("cpu_s");
    f.attempts = static_cast<int64_t>(num("attempts"));
    f.jobs = static_cast<int64_t>(num("jobs"));
    f.failed = static_cast<int64_t>(num("failed"));
    f.requeued = static_cast<int64_t>(num("requeued"));
    f.preempted = static_cast<int64_t>(num("preempted"));
    f.max_rss_bytes = static_cast<int64_t>(num("max_rss_bytes"));
    // The store lists keys in order, mostly the map's: the end is the right place for nearly every one.
    rows_.insert_or_assign(rows_.end(),
                           Key{*day, nameOf(e.key.substr(a + 1, u - a - 1)), nameOf(e.key.substr(u + 1))}, f);
  }
  return state::Status::ok();
}

const UsageBook::SpentByUser& UsageBook::gpuSecondsSinceOnLoop(int64_t first_day) const {
  assert(actor_.onLoop());
  // Periods that passed go, oldest first (at most three are in use at once); never the one asked for.
  for (auto it = spent_since_.begin(); spent_since_.size() > 8 && it != spent_since_.end();) {
    it = it->first == first_day ? std::next(it) : spent_since_.erase(it);
  }
  auto [at, fresh] = spent_since_.try_emplace(first_day);
  SpentCache& cache = at->second;
  if (fresh || cache.generation != generation_) {
    cache = {generation_, {}};
    for (auto it = rows_.lower_bound(Key{first_day, "", ""}); it != rows_.end(); ++it) {
      cache.spent[{std::get<1>(it->first), std::get<2>(it->first)}] += it->second.gpu_s;
    }
  }
  return cache.spent;
}

void UsageBook::addOnLoop(const Key& key, const UsageFigures& f, std::vector<state::Write>* writes) {
  ++generation_;
  auto [it, added] = rows_.try_emplace(key);
  it->second.add(f);
  const auto& [day, account, user] = key;
  state::Entry e{kDailyTable, rowKey(day, account, user), toJson(it->second).dump()};
  if (const std::string why = state::checkEntry(e); why.empty()) {
    writes->push_back(state::Write::putEntry(std::move(e)));
  } else {
    spdlog::warn("the usage of {} in {} on {} is kept in memory only: {}", user, account, utcDayText(day),
                 why);
  }
  // Over the bound: the oldest day's rows go (never the one just written: it is the newest or close to it).
  while (rows_.size() > options_.max_rows && rows_.begin() != it) {
    capped_through_ = std::max(capped_through_, std::get<0>(rows_.begin()->first));
    dropOnLoop(rows_.begin());
  }
}

void UsageBook::dropOnLoop(std::map<Key, UsageFigures>::iterator it) {
  ++generation_;
  const auto& [day, account, user] = it->first;
  actor_.put(state::Write::deleteEntry(kDailyTable, rowKey(day, account, user)));
  rows_.erase(it);
}

std::vector<state::Write> UsageBook::bookOnLoop(const std::string& account_given, const std::string& user,
                                                const state::AttemptUsage& u, state::JobState to) {
  assert(actor_.onLoop());
  const std::string account = account_given.empty() ? placement::kRootAccount : account_given;
  ended_[{account, u.end}]++;
  std::vector<state::Write> writes;
  for (const auto& [day, part] : spreadOverDays(u.start_ms, u.end_ms)) {
    UsageFigures f;
    f.gpu_s = u.gpu_s * part;
    f.cpu_s = u.cpu_s * part;
    if (day == endDay(u)) {
      f.attempts = 1;
      f.jobs = state::isTerminal(to);
      f.failed = to == state::JobState::kFailed || to == state::JobState::kTimeout;
      f.preempted = u.end == state::kPreemptedEnd;
      f.requeued = to == state::JobState::kPending && !f.preempted;
      f.max_rss_bytes = u.max_rss_bytes;
    }
    addOnLoop({day, account, user}, f, &writes);
  }
  return writes;
}

std::vector<state::Write> UsageBook::bookLateOnLoop(const std::string& account_given, const std::string& user,
                                                    const state::AttemptUsage& ended, double cpu_s,
                                                    int64_t max_rss_bytes) {
  assert(actor_.onLoop());
  std::vector<state::Write> writes;
  if (cpu_s == 0 && max_rss_bytes == 0) return writes;
  UsageFigures f;
  f.cpu_s = cpu_s;
  f.max_rss_bytes = max_rss_bytes;
  addOnLoop({endDay(ended), account_given.empty() ? placement::kRootAccount : account_given, user}, f,
            &writes);
  return writes;
}

void UsageBook::chargeOnLoop(const std::string& account, double gpu_s) {
  assert(actor_.onLoop());
  if (gpu_s > 0) live_gpu_s_[account.empty() ? placement::kRootAccount : account] += gpu_s;
}

void UsageBook::trimOnLoop(int64_t now_ms) {
  assert(actor_.onLoop());
  const int64_t today = utcDayOf(now_ms);
  if (today == trimmed_day_) return;
  trimmed_day_ = today;
  while (!rows_.empty() && std::get<0>(rows_.begin()->first) <= today - options_.retention_days) {
    dropOnLoop(rows_.begin());
  }
}

std::vector<UsageBook::Row> UsageBook::reportOnLoop(const Query& q) const {
  assert(actor_.onLoop());
  std::map<std::tuple<int64_t, std::string, std::string>, UsageFigures> sums;
  for (auto it = rows_.lower_bound({q.first_day, "", ""}); it != rows_.end(); ++it) {
    const auto& [day, account, user] = it->first;
    if (day > q.last_day) break;
    if ((!q.account.empty() && account != q.account) || (!q.user.empty() && user != q.user)) continue;
    sums[{q.daily ? day : -1, account, q.by_account ? "" : user}].add(it->second);
  }
  std::vector<Row> out;
  out.reserve(sums.size());
  for (auto& [key, f] : sums) out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), f});
  return out;
}

}  // namespace ddl::coordinator
