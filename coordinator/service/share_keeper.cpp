// The coordinator's account tree and usage (share_keeper.h): charged on the loop, stored as entries, read
// back at recovery.
#include "service/share_keeper.h"

#include <spdlog/spdlog.h>

#include <cassert>
#include <cmath>
#include <nlohmann/json.hpp>

#include "service/actor.h"

namespace ddl::coordinator {

namespace {

constexpr const char* kUsageTable = "usage";

std::string usageKey(const std::string& account, const std::string& user) { return account + ":" + user; }

}  // namespace

ShareKeeper::ShareKeeper(Actor& actor, ShareOptions options) : actor_(actor), options_(std::move(options)) {
  ledger_.half_life_s = options_.half_life_s;
}

state::Status ShareKeeper::loadOnLoop(state::Store& store, int64_t now_ms) {
  assert(actor_.onLoop());
  auto entries = store.listEntries(kUsageTable);
  if (!entries) return entries.status();
  ledger_.by_user.clear();
  ledger_.at_ms = now_ms;
  for (const state::Entry& e : *entries) {
    const size_t colon = e.key.find(':');
    const auto j = nlohmann::json::parse(e.value, nullptr, false);
    const auto gpu_s = j.is_object() ? j.find("gpu_s") : j.end();
    const auto at = j.is_object() ? j.find("at_ms") : j.end();
    if (colon == std::string::npos || gpu_s == j.end() || !gpu_s->is_number() || at == j.end() ||
        !at->is_number_integer()) {
      spdlog::warn("usage entry {} is not a usage figure; it is ignored", e.key);
      continue;
    }
    const double age_s = std::max<double>(0, now_ms - at->get<int64_t>()) / 1000.0;
    const double decayed = gpu_s->get<double>() * std::exp2(-age_s / options_.half_life_s);
    ledger_.by_user[{e.key.substr(0, colon), e.key.substr(colon + 1)}] = decayed;
  }
  saved_ms_ = now_ms;
  return state::Status::ok();
}

double ShareKeeper::chargeOnLoop(int64_t now_ms, const std::vector<Holder>& holders) {
  assert(actor_.onLoop());
  if (charged_ms_ == 0) {
    charged_ms_ = now_ms;
    if (saved_ms_ == 0) saved_ms_ = now_ms;
    ledger_.decayTo(now_ms);
    return 0;
  }
  if (!chargeDue(now_ms)) return 0;
  const double seconds = (now_ms - charged_ms_) / 1000.0;
  charged_ms_ = now_ms;
  ledger_.decayTo(now_ms);
  for (const Holder& h : holders) {
    const std::string account = h.account.empty() ? placement::kRootAccount : h.account;
    ledger_.charge(account, h.user, billedPerSecond(h) * seconds);
    dirty_.insert({account, h.user});
  }
  if (now_ms - saved_ms_ >= options_.save_interval_ms) saveOnLoop(now_ms);
  return seconds;
}

void ShareKeeper::saveOnLoop(int64_t now_ms) {
  assert(actor_.onLoop());
  saved_ms_ = now_ms;
  for (const auto& key : ledger_.trim(options_.max_users)) {
    actor_.put(state::Write::deleteEntry(kUsageTable, usageKey(key.first, key.second)));
    dirty_.erase(key);
  }
  for (const auto& key : dirty_) {
    auto it = ledger_.by_user.find(key);
    if (it == ledger_.by_user.end()) continue;
    const nlohmann::json value = {{"gpu_s", it->second}, {"at_ms", ledger_.at_ms}};
    state::Entry e{kUsageTable, usageKey(key.first, key.second), value.dump()};
    if (!state::checkEntry(e).empty()) continue;  // a name the store cannot key: kept in memory only
    actor_.put(state::Write::putEntry(std::move(e)));
  }
  dirty_.clear();
}

void ShareKeeper::prioritizeOnLoop(std::vector<placement::JobRequest>& queue, int64_t now_ms) {
  assert(actor_.onLoop());
  ledger_.decayTo(now_ms);
  placement::prioritize(queue, tree_, ledger_, options_.weights, now_ms);
}

std::vector<placement::ShareRow> ShareKeeper::sharesOnLoop(int64_t now_ms) {
  assert(actor_.onLoop());
  ledger_.decayTo(now_ms);
  return placement::shares(tree_, ledger_);
}

double ShareKeeper::billedPerSecond(const Holder& h) const {
  return h.gpus + options_.cpu_weight * h.cpus +
         options_.mem_weight_per_gib * static_cast<double>(h.memory_bytes) / (1LL << 30);
}

bool ShareKeeper::chargeDue(int64_t now_ms) const {
  return charged_ms_ == 0 || now_ms - charged_ms_ >= options_.charge_interval_ms;
}

}  // namespace ddl::coordinator
