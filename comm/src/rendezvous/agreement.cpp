// agreeExcluded (agreement.h): the survivors' agreement on who is gone, through the store's first-write
// register.
#include "rendezvous/agreement.h"

#include <algorithm>
#include <charconv>
#include <set>
#include <thread>

#include "error.h"

namespace ddl {

std::string firstWriteWins(Store& store, const std::string& key, const std::string& value,
                           const Deadline& deadline) {
  if (store.add(key + "/turn", 1) == 1) {
    store.set(key + "/value", value);
    return value;
  }
  return store.get(key + "/value", deadline);
}

std::string formatRanks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ",") + std::to_string(r);
  return s;
}

std::vector<int> parseRanks(const std::string& text, int nranks) {
  std::vector<int> out;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    int r = -1;
    auto [next, ec] = std::from_chars(p, end, r);
    if (ec != std::errc() || r < 0 || r >= nranks || (next < end && *next != ',')) {
      fail(ddlInternalError, "agreement: a malformed set of ranks in the store: '" + text + "'");
    }
    out.push_back(r);
    p = next < end ? next + 1 : next;
  }
  return out;
}

namespace {

// Whether key holds a counter above 0, without waiting (add 0 reads it).
bool raised(Store& store, const std::string& key) { return store.add(key, 0) > 0; }

}  // namespace

std::vector<int> agreeExcluded(Store& store, const std::string& prefix, int nranks, int rank,
                               const std::vector<int>& suspects, const std::function<bool(int)>& dead,
                               const Deadline& deadline, const Deadline& read_deadline,
                               AgreementTimes times) {
  const std::string decision = prefix + "decision";
  std::set<int>
      out;  // what this rank holds gone: its suspects, dead leaders, and (leading) what others propose
  for (int r : suspects)
    if (r != rank && r >= 0 && r < nranks) out.insert(r);
  store.set(prefix + "prop/" + std::to_string(rank), formatRanks({out.begin(), out.end()}));
  store.add(prefix + "proposed/" + std::to_string(rank), 1);

  std::vector<char> heard(nranks, 0);  // leading: whose proposal is in `out`
  heard[rank] = 1;
  std::string agreed;
  for (bool have = false; !have;) {
    if (raised(store, decision + "/turn")) {
      agreed = store.get(decision + "/value", read_deadline);
      break;
    }
    int leader = 0;
    while (out.count(leader)) ++leader;
    if (leader != rank) {
      if (dead(leader)) out.insert(leader);
    } else {
      // Lead: hear every rank that no one holds gone; the silent ones are probed, and at the deadline left
      // out.
      bool waiting = false;
      for (int r = 0; r < nranks; ++r) {
        if (heard[r] || out.count(r)) continue;
        if (raised(store, prefix + "proposed/" + std::to_string(r))) {
          heard[r] = 1;
          for (int s : parseRanks(store.get(prefix + "prop/" + std::to_string(r), read_deadline), nranks)) {
            out.insert(s);
          }
        } else if (dead(r)) {
          out.insert(r);
        } else {
          waiting = true;
        }
      }
      if (!waiting || deadline.expired()) {
        for (int r = 0; r < nranks; ++r)
          if (!heard[r]) out.insert(r);
        agreed = firstWriteWins(store, decision, formatRanks({out.begin(), out.end()}), read_deadline);
        have = true;
        continue;
      }
    }
    if (read_deadline.expired()) {
      fail(ddlTimeout, "the survivors did not agree on who is gone within " +
                           std::to_string(read_deadline.timeoutMs()) + " ms (no decision from rank " +
                           std::to_string(leader) + ", the lowest rank this rank did not know gone)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(times.poll_ms));
  }
  std::vector<int> excluded = parseRanks(agreed, nranks);
  std::sort(excluded.begin(), excluded.end());
  if (std::binary_search(excluded.begin(), excluded.end(), rank)) {
    fail(ddlRemoteError,
         "the survivors agreed to go on without rank " + std::to_string(rank) +
             " (a peer found it failed, or it came after the others had stopped waiting for it)");
  }
  return excluded;
}

}  // namespace ddl
