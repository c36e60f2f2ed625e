// Tests of the survivors' agreement (rendezvous/agreement.h) over the in-memory store, ranks as threads: a
// dead rank known to one survivor, a dead leader, a late rank left out that learns it, the union of
// exclusions and suspicions, a falsely suspected leader (still one decision), many writers of the first-write
// register, and no decision at all (a timeout naming the leader). Every wait is bounded by the deadlines
// given.
#include "rendezvous/agreement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "error.h"

namespace ddl {
namespace {

struct Outcome {
  std::optional<std::vector<int>> excluded;  // set when the call returned
  int generation = 0;
  ddlResult_t error = ddlSuccess;
  std::string message;
};

struct Participant {
  int rank;
  std::vector<int> suspects;
  int delay_ms = 0;  // comes this late
};

// Runs agreeExcluded for each participant on a thread of its own; ranks in `dead` never call and probe dead.
std::vector<Outcome> agree(int nranks, const std::vector<Participant>& ps, const std::set<int>& dead,
                           int lead_ms = 5000, int read_ms = 10000) {
  auto store = makeMemoryStore();
  std::vector<Outcome> out(ps.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < ps.size(); ++i) {
    threads.emplace_back([&, i] {
      const Participant& p = ps[i];
      std::this_thread::sleep_for(std::chrono::milliseconds(p.delay_ms));
      try {
        const Agreement a = agreeExcluded(
            *store, "t/", nranks, p.rank, p.suspects, [&](int r) { return dead.count(r) > 0; },
            Deadline(lead_ms), Deadline(read_ms));
        out[i].excluded = a.excluded;
        out[i].generation = a.generation;
      } catch (const Error& e) {
        out[i].error = e.code();
        out[i].message = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(Agreement, EverySurvivorGetsTheDeadRankOneOfThemSaw) {
  const auto out = agree(5, {{0, {}}, {1, {}}, {3, {2}}, {4, {}}}, {2});
  for (const Outcome& o : out) {
    ASSERT_TRUE(o.excluded) << o.message;
    EXPECT_EQ(*o.excluded, std::vector<int>({2}));
  }
}

TEST(Agreement, ADeadRankNoSurvivorSawIsFoundByTheLeadersProbe) {
  const auto out = agree(4, {{0, {}}, {1, {}}, {2, {}}}, {3});
  for (const Outcome& o : out) {
    ASSERT_TRUE(o.excluded) << o.message;
    EXPECT_EQ(*o.excluded, std::vector<int>({3}));
  }
}

TEST(Agreement, ADeadLeaderIsPassedOver) {
  const auto out = agree(4, {{1, {}}, {2, {}}, {3, {}}}, {0});
  for (const Outcome& o : out) {
    ASSERT_TRUE(o.excluded) << o.message;
    EXPECT_EQ(*o.excluded, std::vector<int>({0}));
  }
}

TEST(Agreement, ExclusionsAndSuspicionsAreJoined) {
  // Rank 1's caller excludes rank 4 (alive, it does not call); rank 2 saw rank 3 fail.
  const auto out = agree(5, {{0, {}}, {1, {4}}, {2, {3}}}, {3});
  for (const Outcome& o : out) {
    ASSERT_TRUE(o.excluded) << o.message;
    EXPECT_EQ(*o.excluded, std::vector<int>({3, 4}));
  }
}

TEST(Agreement, ARankLaterThanTheLeadersDeadlineIsLeftOutAndLearnsIt) {
  // Rank 3 is alive (its probe never says dead) but comes 600 ms late; the leader waits 200 ms.
  const auto out = agree(4, {{0, {}}, {1, {}}, {2, {}}, {3, {}, 600}}, {}, 200, 3000);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(out[i].excluded) << out[i].message;
    EXPECT_EQ(*out[i].excluded, std::vector<int>({3}));
  }
  EXPECT_FALSE(out[3].excluded);
  EXPECT_EQ(out[3].error, ddlRemoteError);
  EXPECT_NE(out[3].message.find("without rank 3"), std::string::npos) << out[3].message;
}

TEST(Agreement, AFalselySuspectedLeaderStillLeavesOneDecision) {
  // Rank 1 holds rank 0 gone (a broken link), so both lead; whichever writes first decides for all, and the
  // survivors' sets are equal. Rank 0 is in every proposal rank 1 makes, so the decision leaves it out.
  for (int round = 0; round < 20; ++round) {
    const auto out = agree(4, {{0, {}}, {1, {0}}, {2, {}}, {3, {}}}, {});
    std::optional<std::vector<int>> first;
    for (const Outcome& o : out) {
      if (!o.excluded) {
        EXPECT_EQ(o.error, ddlRemoteError) << o.message;
        continue;
      }
      if (!first) first = o.excluded;
      EXPECT_EQ(*o.excluded, *first);
    }
    ASSERT_TRUE(first) << "no rank went on";
    for (size_t i = 0; i < out.size(); ++i) {
      const bool left_out = std::find(first->begin(), first->end(), static_cast<int>(i)) != first->end();
      EXPECT_EQ(left_out, !out[i].excluded.has_value()) << "rank " << i;
    }
  }
}

TEST(Agreement, ALeaderOthersSuspectStillLeadsWhileALateRankComes) {
  // Rank 2 holds rank 0 gone (its caller excludes it, or a link broke); rank 3 is alive but 300 ms late. Rank
  // 0 goes on leading (it does not hold itself gone), waits for rank 3, and decides for everyone, itself left
  // out.
  const auto out = agree(4, {{0, {}}, {1, {}}, {2, {0}}, {3, {}, 300}}, {}, 5000, 10000);
  EXPECT_EQ(out[0].error, ddlRemoteError) << out[0].message;
  for (int i = 1; i < 4; ++i) {
    ASSERT_TRUE(out[i].excluded) << out[i].message;
    EXPECT_EQ(*out[i].excluded, std::vector<int>({0}));
    EXPECT_EQ(out[i].generation, out[1].generation);
    EXPECT_GT(out[i].generation, 0);
  }
}

TEST(Agreement, TheFirstWriteWinsForEveryWriter) {
  auto store = makeMemoryStore();
  std::vector<std::string> got(16);
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] { got[i] = firstWriteWins(*store, "k", std::to_string(i), Deadline(5000)); });
  }
  for (auto& t : threads) t.join();
  for (const std::string& g : got) EXPECT_EQ(g, got[0]);
}

TEST(Agreement, NoDecisionTimesOutNamingTheLeader) {
  // Rank 0 is alive to every probe but never comes; rank 1 waits for it.
  const auto out = agree(2, {{1, {}}}, {}, 200, 300);
  EXPECT_EQ(out[0].error, ddlTimeout);
  EXPECT_NE(out[0].message.find("rank 0"), std::string::npos) << out[0].message;
}

TEST(Agreement, RankSetsRoundTripAndMalformedTextIsRefused) {
  EXPECT_EQ(formatRanks({1, 4, 7}), "1,4,7");
  EXPECT_EQ(parseRanks("1,4,7", 8), std::vector<int>({1, 4, 7}));
  EXPECT_TRUE(parseRanks("", 8).empty());
  EXPECT_THROW(parseRanks("1,x", 8), Error);
  EXPECT_THROW(parseRanks("9", 8), Error);
}

}  // namespace
}  // namespace ddl
