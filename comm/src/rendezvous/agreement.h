// agreeExcluded: how the survivors of a communicator agree on who is gone (ddlCommShrink), through the
// communicator's rendezvous store, so that every survivor ends with the same set and none can end with
// another.
//
// Why the store: an agreement over the ranks' own links cannot both finish and never split while a slow rank
// can look dead (a leader that sent its decision to some ranks and then died, or was only late, leaves the
// others to decide again, differently). The store is one server whose operations happen in one order, so one
// register in it that takes the first value written and keeps it is enough: whatever each rank believes, the
// first decision written is the one every rank reads.
//
// The protocol, under prefix (one per agreement: a communicator's generation):
//  1. Each participant publishes what it knows is gone (its suspects: the ranks its transport saw fail, and
//  the
//     ranks its caller excludes) as prop/<rank>, then raises the flag proposed/<rank>.
//  2. Its leader is the lowest rank it does not suspect. The leader waits until every rank that no proposal
//     suspects has proposed, probing the silent ones (a rank found dead joins the suspects), at most until
//     its deadline; then it decides: the union of the proposals, the dead, and the ranks still silent.
//  3. The decision goes into the first-write register "decision": a rank takes a ticket (add), and the holder
//  of
//     ticket 1 writes its value; every other writer and every reader reads ticket 1's value. Several leaders
//     (ranks that suspect different leaders) cannot split the ranks: only the first write counts.
//  4. A participant that is not a leader waits for the decision, probing its leader; a dead leader joins its
//     suspects, and the next lowest rank is its leader, which may be itself.
// A rank in the decision learns it was excluded (an error). A rank arriving after the decision reads it. The
// one way left to fail is a leader that dies between taking ticket 1 and writing (two store calls apart):
// then every rank times out alike, and none has a communicator the others lack.
//
// Threads: the calling thread; the store and the probe are called from it.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "deadline.h"
#include "rendezvous/store.h"

namespace ddl {

struct AgreementTimes {
  int poll_ms = 2;  // between looks at the store and probes
};

struct Agreement {
  int generation = 0;         // the new communicator's: a number of the store's counter "generation"
  std::vector<int> excluded;  // ascending
};

// Returns the agreed excluded ranks, ascending, and the next generation's number. nranks and rank are the
// communicator's; suspects what this rank knows is gone (any order); dead(r) a non-blocking probe of rank r
// (true once r is known dead). The leader stops waiting for silent ranks at deadline; the others wait for the
// decision until read_deadline (later: the leader may have come later). Throws ddlRemoteError when the
// decision excludes this rank, ddlTimeout when no decision comes by read_deadline, and what the store throws.
Agreement agreeExcluded(Store& store, const std::string& prefix, int nranks, int rank,
                        const std::vector<int>& suspects, const std::function<bool(int)>& dead,
                        const Deadline& deadline, const Deadline& read_deadline, AgreementTimes times = {});

// The first-write register under key: writes value unless another writer came first; returns the value that
// counts (this one, or the first writer's, waiting for it until deadline).
std::string firstWriteWins(Store& store, const std::string& key, const std::string& value,
                           const Deadline& deadline);
// Whether a writer has come to the register under key (without waiting), and the value that counts (waiting
// for it until deadline), for readers that do not write.
bool firstWriteTaken(Store& store, const std::string& key);
std::string firstWriteValue(Store& store, const std::string& key, const Deadline& deadline);

// A set of ranks as text ("1,4,7"; empty: none) and back; parseRanks throws ddlInternalError on text it did
// not write or ranks outside [0, nranks).
std::string formatRanks(const std::vector<int>& ranks);
std::vector<int> parseRanks(const std::string& text, int nranks);

}  // namespace ddl
