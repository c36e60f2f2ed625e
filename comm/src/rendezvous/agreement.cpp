// agreeExcluded (agreement.h): the survivors' agreement on who is gone, through the store's first-write
// register.
#include "rendezvous/agreement.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>
#include <thread>

#include "error.h"

namespace ddl {

// The register is two keys: key/turn, the writers' tickets, and key/value, written by the holder of ticket 1.
std::string firstWriteWins(Store& store, const std::string& key, const std::string& value,
                           const Deadline& deadline) {
  if (store.add(key + "/turn", 1) == 1) {
    store.set(key + "/value", value);
    return value;
  }
  return firstWriteValue(store, key, deadline);
}

bool firstWriteTaken(Store& store, const std::string& key) { return store.add(key + "/turn", 0) > 0; }

std::string firstWriteValue(Store& store, const std::string& key, const Deadline& deadline) {
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

Agreement agreeExcluded(Store& store, const std::string& prefix, int nranks, int rank,
                        const std::vector<int>& suspects, const std::function<bool(int)>& dead,
                        const Deadline& deadline, const Deadline& read_deadline, AgreementTimes times) {
  const std::string decision = prefix + "decision";
  // What this rank holds gone itself (its suspects and the ranks it found dead): who leads, in its eyes. What
  // others propose joins only the decision (`out`), so a leader that others suspect still leads (and leaves
  // itself out), and the rank after it never waits for a leader that stopped leading.
  std::set<int> mine;
  for (int r : suspects)
    if (r != rank && r >= 0 && r < nranks) mine.insert(r);
  store.set(prefix + "prop/" + std::to_string(rank), formatRanks({mine.begin(), mine.end()}));
  store.add(prefix + "proposed/" + std::to_string(rank), 1);

  std::set<int> out = mine;            // leading: the decision so far
  std::vector<char> heard(nranks, 0);  // leading: whose proposal is in `out`
  heard[rank] = 1;
  std::string agreed;
  while (agreed.empty()) {
    if (firstWriteTaken(store, decision)) {
      agreed = firstWriteValue(store, decision, read_deadline);
      break;
    }
    int leader = 0;
    while (leader < rank && mine.count(leader)) ++leader;  // at most this rank, which it never holds gone
    if (leader != rank) {
      if (dead(leader)) {
        mine.insert(leader);
        out.insert(leader);
      }
    } else {
      // Lead: hear every rank that no one holds gone; the silent ones are probed, and at the deadline left
      // out.
      bool waiting = false;
      for (int r = 0; r < nranks; ++r) {
        if (heard[r] || out.count(r)) continue;
        if (raised(store, prefix + "proposed/" + std::to_string(r))) {
          heard[r] = 1;
          for (int g : parseRanks(store.get(prefix + "prop/" + std::to_string(r), read_deadline), nranks)) {
            out.insert(g);
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
        // The next generation's number, from the store's counter: never one an earlier attempt used.
        const int64_t generation = store.add("generation", 1);
        agreed = firstWriteWins(store, decision,
                                std::to_string(generation) + " " + formatRanks({out.begin(), out.end()}),
                                read_deadline);
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
  const size_t space = agreed.find(' ');
  Agreement result;
  if (space == std::string::npos || !(result.generation = std::atoi(agreed.c_str()))) {
    fail(ddlInternalError, "agreement: a malformed decision in the store: '" + agreed + "'");
  }
  result.excluded = parseRanks(agreed.substr(space + 1), nranks);
  std::sort(result.excluded.begin(), result.excluded.end());
  if (std::binary_search(result.excluded.begin(), result.excluded.end(), rank)) {
    fail(ddlRemoteError,
         "the survivors agreed to go on without rank " + std::to_string(rank) +
             " (a peer found it failed, or it came after the others had stopped waiting for it)");
  }
  return result;
}

}  // namespace ddl
