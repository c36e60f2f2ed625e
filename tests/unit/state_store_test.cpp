// Tests of the coordinator's state store (coordinator/state/).
//
// The same typed tests run against MemoryStore and SqliteStore: create/get/list with filters, the job state
// machine (legal and illegal moves and their messages, failure info, requeue and the restart budget),
// allocations, nodes, and concurrent callers. SqliteStore alone: the schema is created on first start,
// everything survives a close and reopen, every acknowledged submit survives kill -9 at a random point, a
// process killed between the write and the acknowledgement (or before the commit) leaves a consistent
// database, and files that are not ours or are damaged give clear errors instead of crashes. Child processes
// are bounded by deadlines; temporary directories are removed.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "state/direct_store.h"
#ifdef DDL_HAVE_ETCD
#include "etcd_for_test.h"
#include "state/etcd_store.h"
#endif
#include "state/job.h"
#include "state/memory_store.h"
#include "state/record_codec.h"
#include "state/sqlite_store.h"
#include "state/store.h"

namespace ddl::state {
namespace {

namespace fs = std::filesystem;

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "ddl-state-test-XXXXXX").string();
    if (!::mkdtemp(tmpl.data())) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// A clock that advances 1 s per reading, so every stamp is distinct and predictable.
struct FakeClock {
  std::shared_ptr<std::atomic<int64_t>> now = std::make_shared<std::atomic<int64_t>>(1'700'000'000'000);
  std::function<int64_t()> fn() const {
    auto n = now;
    return [n] { return n->fetch_add(1000); };
  }
};

// A spec whose strings carry the bytes an encoding could get wrong.
JobSpec sampleSpec(const std::string& name = "resnet50", const std::string& user = "alice") {
  JobSpec s;
  s.name = name;
  s.user = user;
  s.nodes = 2;
  s.gpus_per_node = 4;
  s.total_gpus = 8;
  s.topology_override = "2x4";
  s.priority = 5;
  s.max_restarts = 2;
  s.env = {"A=1", "B=x=y", "MULTI=line1\nline2", std::string("NUL=a\0b", 7), "EMPTY="};
  s.workdir = "/home/alice/run 1";
  s.command = {"python3",   "train.py",
               "--opt=a,b", "",
               "new\nline", std::string("\0zero", 5),
               "\xff\xfe",  "quote'\"; DROP TABLE jobs; --"};
  // Labels cannot carry such bytes (validateJobSpec refuses them); present so every round trip, reopen and
  // crash test below checks them too.
  s.required_labels = {{"gpu", "a100"}, {"zone", "eu-1/\xc3\xa9"}};
  return s;
}

SqliteStore::Options sqliteOptions(const std::string& path) {
  SqliteStore::Options o;
  o.path = path;
  return o;
}

// An SQLite store as these tests use it: the one-change calls of DirectStore, and the SQLite store's own
// checks.
class OpenSqlite : public DirectStore {
 public:
  OpenSqlite(std::unique_ptr<SqliteStore> sqlite, std::function<int64_t()> clock)
      : DirectStore(*sqlite, std::move(clock)), sqlite_(std::move(sqlite)) {}
  Status integrityCheck() { return sqlite_->integrityCheck(); }
  int schemaVersion() { return sqlite_->schemaVersion(); }
  const std::string& path() const { return sqlite_->path(); }

 private:
  std::unique_ptr<SqliteStore> sqlite_;
};

std::unique_ptr<OpenSqlite> openOrDie(const std::string& path, std::function<int64_t()> clock = nullptr) {
  auto s = SqliteStore::open(sqliteOptions(path));
  EXPECT_TRUE(s.isOk()) << s.status().toString();
  return s.isOk() ? std::make_unique<OpenSqlite>(std::move(s).value(), std::move(clock)) : nullptr;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ---- Pure rules (no store) --------------------------------------------------------------------------------

// Words from an agent made fit for a drain reason: every control character findControlCharacter finds (a C1
// control's two bytes as one) becomes a space; other UTF-8 stays.
TEST(JobRules, ControlCharactersAreMadeSpaces) {
  const std::string text = std::string("exit 1:\tGPU\x1b[31m 1\x7f ") + "\xc2\x9b" + "x \xc3\xa9t\xc3\xa9";
  const std::string clean = withoutControlCharacters(text);
  EXPECT_EQ(clean, "exit 1: GPU [31m 1   x \xc3\xa9t\xc3\xa9");
  EXPECT_EQ(findControlCharacter(clean), std::string::npos);
  EXPECT_EQ(withoutControlCharacters("fine"), "fine");
}

TEST(JobRules, StateNamesRoundTrip) {
  for (JobState s : kAllJobStates) EXPECT_EQ(parseJobState(toString(s)), s);
  EXPECT_FALSE(parseJobState("running"));
  EXPECT_FALSE(parseJobState(""));
  for (NodeState s : {NodeState::kUp, NodeState::kDown, NodeState::kDraining}) {
    EXPECT_EQ(parseNodeState(toString(s)), s);
  }
}

TEST(JobRules, AllowedTransitionsAreExactlyTheDocumentedOnes) {
  using S = JobState;
  const std::set<std::pair<S, S>> allowed = {
      {S::kPending, S::kScheduled},   {S::kPending, S::kFailed},     {S::kPending, S::kCancelled},
      {S::kScheduled, S::kStarting},  {S::kScheduled, S::kPending},  {S::kScheduled, S::kFailed},
      {S::kScheduled, S::kCancelled}, {S::kStarting, S::kRunning},   {S::kStarting, S::kPending},
      {S::kStarting, S::kFailed},     {S::kStarting, S::kCancelled}, {S::kRunning, S::kSucceeded},
      {S::kRunning, S::kPending},     {S::kRunning, S::kFailed},     {S::kRunning, S::kCancelled},
      {S::kStarting, S::kTimeout},    {S::kRunning, S::kTimeout},
  };
  for (S from : kAllJobStates) {
    for (S to : kAllJobStates) {
      EXPECT_EQ(allowedTransition(from, to), allowed.count({from, to}) > 0)
          << toString(from) << " -> " << toString(to);
    }
  }
  EXPECT_TRUE(isRequeue(S::kRunning, S::kPending));
  EXPECT_TRUE(isRequeue(S::kStarting, S::kPending));
  EXPECT_FALSE(isRequeue(S::kScheduled, S::kPending));
}

// Issue 41: every move that ends a launch attempt (a requeue, an end) records its usage: numbered as launches
// are, GPUs from the allocation counted from placement, the latest kMaxAttemptsKept kept.
TEST(JobRules, EndedAttemptsRecordTheirUsage) {
  using S = JobState;
  Job job = newJob("j-000001", sampleSpec(), 0);
  job.spec.max_restarts = 1000;
  auto place = [&job](int64_t at) {
    ASSERT_TRUE(applyTransition(job, S::kScheduled, "placed", std::nullopt, at).isOk());
    job.allocation = {{"a", {0, 1}, {}, 0}, {"b", {0, 1}, {}, 0}};
  };
  place(1000);
  ASSERT_TRUE(applyTransition(job, S::kStarting, "sent", std::nullopt, 2000).isOk());
  EXPECT_TRUE(job.attempts.empty()) << "a launch ends no attempt";
  ASSERT_TRUE(applyTransition(job, S::kPending, "node lost", std::nullopt, 11000).isOk());
  ASSERT_EQ(job.attempts.size(), 1u);
  EXPECT_EQ(job.attempts[0], (AttemptUsage{1, 1000, 11000, 4, 40.0, 0, 0, "REQUEUED"}));
  place(20000);
  ASSERT_TRUE(applyTransition(job, S::kCancelled, "by alice", std::nullopt, 20500).isOk());
  ASSERT_EQ(job.attempts.size(), 2u);
  EXPECT_EQ(job.attempts[1], (AttemptUsage{2, 20000, 20500, 4, 2.0, 0, 0, "CANCELLED"}));

  Job many = newJob("j-000002", sampleSpec(), 0);
  many.spec.max_restarts = 1000;
  for (int i = 0; i < 70; ++i) {
    ASSERT_TRUE(applyTransition(many, S::kScheduled, "placed", std::nullopt, i * 10).isOk());
    ASSERT_TRUE(applyTransition(many, S::kPending, "node lost", std::nullopt, i * 10 + 5).isOk());
  }
  ASSERT_EQ(many.attempts.size(), kMaxAttemptsKept);
  EXPECT_EQ(many.attempts.front().attempt, 70 - static_cast<int>(kMaxAttemptsKept) + 1);
  EXPECT_EQ(many.attempts.back().attempt, 70);
}

TEST(JobRules, AnElasticJobsMembershipChangesAreTransitionsAndChargedAsHeld) {
  using S = JobState;
  JobSpec spec = sampleSpec();
  spec.total_gpus = 0;
  spec.min_nodes = 1;
  Job fixed = newJob("j-000001", spec, 0);
  fixed.spec.min_nodes = 0;
  ASSERT_TRUE(applyTransition(fixed, S::kScheduled, "placed", std::nullopt, 0).isOk());
  ASSERT_TRUE(applyTransition(fixed, S::kStarting, "sent", std::nullopt, 0).isOk());
  ASSERT_TRUE(applyTransition(fixed, S::kRunning, "up", std::nullopt, 0).isOk());
  Status refused = applyMembershipChange(fixed, {}, "lost", std::nullopt, 10);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(refused.message(), "not elastic")) << refused.message();
  EXPECT_FALSE(allowedTransition(S::kRunning, S::kRunning))
      << "a change of ranks is not a move of the machine";

  Job job = newJob("j-000002", spec, 0);  // 2 nodes x 4 GPUs, at least 1 node
  ASSERT_TRUE(applyTransition(job, S::kScheduled, "placed", std::nullopt, 1000).isOk());
  job.allocation = {{"a", {0, 1, 2, 3}, {}, 0}, {"b", {0, 1, 2, 3}, {}, 0}};
  ASSERT_TRUE(applyTransition(job, S::kStarting, "sent", std::nullopt, 1000).isOk());
  EXPECT_EQ(applyMembershipChange(job, {}, "lost", std::nullopt, 1000).code(),
            StatusCode::kFailedPrecondition)
      << "only while RUNNING";
  ASSERT_TRUE(applyTransition(job, S::kRunning, "up", std::nullopt, 2000).isOk());
  // Node b lost at 11 s, then back at 21 s; the attempt ends at 31 s.
  ASSERT_TRUE(
      applyMembershipChange(job, {{"a", {0, 1, 2, 3}, {}, 0}}, "b lost", Failure{4, "b", 1, {}}, 11000)
          .isOk());
  EXPECT_EQ(job.state, S::kRunning);
  EXPECT_EQ(job.topology, "4");
  ASSERT_EQ(job.transitions.back(),
            (Transition{S::kRunning, S::kRunning, 11000, "b lost", Failure{4, "b", 1, {}}}));
  ASSERT_TRUE(applyMembershipChange(job, {{"a", {0, 1, 2, 3}, {}, 0}, {"c", {0, 1, 2, 3}, {}, 0}}, "grown",
                                    std::nullopt, 21000)
                  .isOk());
  EXPECT_DOUBLE_EQ(job.elastic_gpu_s, 4 * 10.0 - 4 * 20.0);
  // The codec keeps what the sum needs.
  auto back = record_codec::decodeJob(job.id, record_codec::encodeJob(job));
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(*back, job);
  ASSERT_TRUE(applyTransition(job, S::kSucceeded, "done", std::nullopt, 31000).isOk());
  // a: 30 s x 4; b: 10 s x 4; c: 10 s x 4.
  EXPECT_EQ(job.attempts.back(), (AttemptUsage{1, 1000, 31000, 8, 200.0, 0, 0, "SUCCEEDED"}));
  EXPECT_EQ(job.elastic_gpu_s, 0);
}

TEST(JobRules, JobIds) {
  EXPECT_EQ(formatJobId(42), "j-000042");
  EXPECT_EQ(formatJobId(1234567), "j-1234567");
  EXPECT_EQ(jobIdNumber("j-000042"), 42);
  EXPECT_EQ(jobIdNumber("j-1234567"), 1234567);
  for (const char* bad :
       {"", "j-", "42", "x-000042", "j-00004a", "j-000000", "j--1", "j-99999999999999999999"}) {
    EXPECT_FALSE(jobIdNumber(bad)) << bad;
  }
}

// Each bound of validateJobSpec: a spec at the limit is accepted, one past it is refused with a message that
// names the limit and the actual size. Fails without the limits (every oversized spec was accepted).
TEST(JobRules, SpecLimitsAreEnforcedAndNamed) {
  struct Case {
    std::string what;
    std::function<void(JobSpec&, size_t)> grow;  // makes the bounded quantity exactly n
    size_t limit;
    std::string message;  // part of the refusal, before the sizes
  };
  const std::vector<Case> cases = {
      {"name", [](JobSpec& s, size_t n) { s.name = std::string(n, 'n'); }, kMaxJobNameBytes, "the name is"},
      {"user", [](JobSpec& s, size_t n) { s.user = std::string(n, 'u'); }, kMaxUserBytes, "the user name is"},
      {"args", [](JobSpec& s, size_t n) { s.command.assign(n, "a"); }, kMaxArgs, "arguments"},
      {"argv bytes",
       [](JobSpec& s, size_t n) {
         s.command = {"python3", std::string(n - 7, 'x')};
       },
       kMaxArgvBytes, "the command's arguments total"},
      {"env entries", [](JobSpec& s, size_t n) { s.env.assign(n, "K=v"); }, kMaxEnvEntries, "entries"},
      {"env entry", [](JobSpec& s, size_t n) { s.env = {"BIG=" + std::string(n - 4, 'v')}; },
       kMaxEnvEntryBytes, "env entry BIG is"},
      {"env bytes",
       [](JobSpec& s, size_t n) {
         s.env.clear();
         for (size_t left = n; left > 0;) {
           size_t take = std::min(left, size_t{1000});
           s.env.push_back("K=" + std::string(take - 2, 'v'));
           left -= take;
         }
       },
       kMaxEnvBytes, "the environment totals"},
      {"labels",
       [](JobSpec& s, size_t n) {
         s.required_labels.clear();
         for (size_t i = 0; i < n; ++i) s.required_labels["k" + std::to_string(i)] = "v";
       },
       kMaxLabels, "labels; the limit"},
      {"label key",
       [](JobSpec& s, size_t n) {
         s.required_labels = {{std::string(n, 'k'), "v"}};
       },
       kMaxLabelKeyBytes, "label key"},
      {"label value",
       [](JobSpec& s, size_t n) {
         s.required_labels = {{"gpu", std::string(n, 'v')}};
       },
       kMaxLabelValueBytes, "the value is"},
      {"workdir", [](JobSpec& s, size_t n) { s.workdir = std::string(n, 'w'); }, kMaxWorkdirBytes,
       "the workdir is"},
      {"topology", [](JobSpec& s, size_t n) { s.topology_override = std::string(n, '2'); }, kMaxTopologyBytes,
       "the topology is"},
  };
  for (const Case& c : cases) {
    JobSpec at = sampleSpec();
    c.grow(at, c.limit);
    Status st = validateJobSpec(at);
    EXPECT_TRUE(st.isOk()) << c.what << " at the limit " << c.limit << ": " << st.toString();
    JobSpec over = sampleSpec();
    c.grow(over, c.limit + 1);
    st = validateJobSpec(over);
    ASSERT_FALSE(st.isOk()) << c.what << " past the limit was accepted";
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(st.message(), c.message)) << c.what << ": " << st.message();
    EXPECT_TRUE(contains(st.message(), std::to_string(c.limit + 1))) << c.what << ": " << st.message();
    EXPECT_TRUE(contains(st.message(), "the limit is " + std::to_string(c.limit)))
        << c.what << ": " << st.message();
    EXPECT_LT(st.message().size(), 400u) << c.what << ": a refusal stays short whatever the input";
  }
}

// Names and users with C0 controls, DEL or C1 controls (as UTF-8) are refused and the refusal shows the byte
// escaped; other UTF-8, including its 0x80-0x9f continuation bytes, is fine.
TEST(JobRules, ControlCharactersInNamesAreRefused) {
  for (const std::string& bad : {std::string("a\nb"), std::string("\x1b[2J"), std::string("tab\there"),
                                 std::string("del\x7f"), std::string("nul\0x", 5),
                                 std::string("c1\xc2\x9b"
                                             "31m"),
                                 std::string("nel\xc2\x85")}) {
    JobSpec name = sampleSpec(bad);
    Status st = validateJobSpec(name);
    ASSERT_FALSE(st.isOk()) << quoteForMessage(bad) << " accepted as a name";
    EXPECT_TRUE(contains(st.message(), "the name contains a control character")) << st.message();
    EXPECT_EQ(findControlCharacter(st.message()), std::string::npos) << "the refusal itself is printable";
    JobSpec user = sampleSpec("ok", bad);
    st = validateJobSpec(user);
    ASSERT_FALSE(st.isOk()) << quoteForMessage(bad) << " accepted as a user";
    EXPECT_TRUE(contains(st.message(), "the user name contains a control character")) << st.message();
    EXPECT_EQ(findControlCharacter(st.message()), std::string::npos);
  }
  EXPECT_TRUE(contains(validateJobSpec(sampleSpec("a\nb")).message(), "(\\x0a) at byte 1"));
  EXPECT_TRUE(contains(validateJobSpec(sampleSpec("c1\xc2\x9b")).message(), "(\xc2\\x9b) at byte 2"));
  for (const std::string& good : {std::string("résumé-\xe6\x97\xa5\xe6\x9c\xac"), std::string("a b/c_d.e"),
                                  std::string("\xe2\x80\x94 dash")}) {
    EXPECT_TRUE(validateJobSpec(sampleSpec(good)).isOk()) << good;
    EXPECT_TRUE(validateJobSpec(sampleSpec("ok", good)).isOk()) << good;
  }
  // A refusal for another reason does not echo a 100 KB name whole.
  JobSpec huge = sampleSpec(std::string(100000, 'x'));
  EXPECT_LT(validateJobSpec(huge).message().size(), 400u);
}

// ---- Both stores ------------------------------------------------------------------------------------------

struct MemoryKind {
  static std::unique_ptr<Store> make(const TempDir&) { return std::make_unique<MemoryStore>(); }
};
struct SqliteKind {
  static std::unique_ptr<Store> make(const TempDir& dir) {
    auto s = SqliteStore::open(sqliteOptions(dir.file("state.db")));
    EXPECT_TRUE(s.isOk()) << s.status().toString();
    return s.isOk() ? std::move(s).value() : nullptr;
  }
};
#ifdef DDL_HAVE_ETCD
// An EtcdStore over an etcd member of its own, which goes with it.
class EtcdBacked : public Store {
 public:
  // Starts etcd and connects (bounded: 10 s); nullptr with *why set when it cannot.
  static std::unique_ptr<EtcdBacked> start(std::string* why, EtcdStore::Options options = {},
                                           int members = 1) {
    auto backed = std::make_unique<EtcdBacked>();
    if (std::string err = backed->etcd_.start(members); !err.empty()) {
      *why = err;
      return nullptr;
    }
    options.endpoints = backed->etcd_.endpoints();
    options.timeout_ms = 1000;
    for (int attempt = 0; attempt < 100; ++attempt) {
      auto store = EtcdStore::open(options);
      if (store) {
        backed->store_ = std::move(*store);
        return backed;
      }
      *why = store.status().toString();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return nullptr;
  }
  Status applyBatch(const std::vector<Write>& batch) override { return store_->applyBatch(batch); }
  BatchLimits batchLimits() const override { return store_->batchLimits(); }
  size_t writeBytes(const Write& w) const override { return store_->writeBytes(w); }
  bool knownUnapplied(const Status& failure) const override { return store_->knownUnapplied(failure); }
  StatusOr<Job> getJob(const std::string& id) override { return store_->getJob(id); }
  StatusOr<std::vector<NodeRecord>> listNodes() override { return store_->listNodes(); }
  StatusOr<std::vector<Entry>> listEntries(const std::string& table) override {
    return store_->listEntries(table);
  }
  StatusOr<int64_t> lastJobNumber() override { return store_->lastJobNumber(); }
  StatusOr<std::vector<Job>> listJobsPage(const JobFilter& filter, int64_t after_number, int limit,
                                          bool newest_first) override {
    return store_->listJobsPage(filter, after_number, limit, newest_first);
  }
  StatusOr<int> purgeFinished(int64_t ended_before_ms, int limit) override {
    return store_->purgeFinished(ended_before_ms, limit);
  }
  EtcdStore& etcd() { return *store_; }
  std::string endpoint() const { return etcd_.endpoint(); }
  void killMember(size_t i) { etcd_.kill(i); }

 private:
  test_util::EtcdForTest etcd_;
  std::unique_ptr<EtcdStore> store_;
};

struct EtcdKind {
  static std::unique_ptr<Store> make(const TempDir&) {
    std::string why;
    auto backed = EtcdBacked::start(&why);
    if (!backed) skip_reason() = why;
    return backed;
  }
  static std::string& skip_reason() {
    static std::string reason;
    return reason;
  }
};
#endif

struct KindName {
  template <typename T>
  static std::string GetName(int) {
    if (std::is_same_v<T, MemoryKind>) return "Memory";
    if (std::is_same_v<T, SqliteKind>) return "Sqlite";
    return "Etcd";
  }
};

template <typename Kind>
class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backing_ = Kind::make(dir_);
#ifdef DDL_HAVE_ETCD
    if constexpr (std::is_same_v<Kind, EtcdKind>) {
      if (!backing_ && test_util::EtcdForTest::binary().empty()) GTEST_SKIP() << EtcdKind::skip_reason();
    }
#endif
    ASSERT_NE(backing_, nullptr);
    store_ = std::make_unique<DirectStore>(*backing_, clock_.fn());
  }
  // Creates a job and walks it to `state` along the forward path.
  Job jobIn(JobState state, JobSpec spec = sampleSpec()) {
    auto job = store_->createJob(spec);
    EXPECT_TRUE(job.isOk()) << job.status().toString();
    for (JobState s : {JobState::kScheduled, JobState::kStarting, JobState::kRunning}) {
      if (job->state == state) break;
      job = store_->transition(job->id, s, "test");
      EXPECT_TRUE(job.isOk()) << job.status().toString();
    }
    return *job;
  }

  TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<Store> backing_;
  std::unique_ptr<DirectStore> store_;  // The store under test, one change at a time.
};

#ifdef DDL_HAVE_ETCD
using Kinds = ::testing::Types<MemoryKind, SqliteKind, EtcdKind>;
#else
using Kinds = ::testing::Types<MemoryKind, SqliteKind>;
#endif
TYPED_TEST_SUITE(StoreTest, Kinds, KindName);

TYPED_TEST(StoreTest, CreateThenGetRoundTripsEveryField) {
  const int64_t t0 = this->clock_.now->load();
  JobSpec elastic = sampleSpec();
  elastic.min_nodes = 1;  // its fields since the first schema, too
  elastic.topology_override.clear();  // (an elastic job's ring changes size: no override)
  auto created = this->store_->createJob(elastic);
  ASSERT_TRUE(created.isOk()) << created.status().toString();
  EXPECT_EQ(created->id, "j-000001");
  EXPECT_EQ(created->spec, elastic);
  EXPECT_EQ(created->state, JobState::kPending);
  EXPECT_EQ(created->restarts, 0);
  EXPECT_EQ(created->submit_ms, t0);
  ASSERT_EQ(created->transitions.size(), 1u);
  EXPECT_EQ(created->transitions[0].to, JobState::kPending);
  EXPECT_EQ(created->transitions[0].at_ms, t0);
  EXPECT_FALSE(created->failure);
  EXPECT_TRUE(created->allocation.empty());

  auto got = this->store_->getJob(created->id);
  ASSERT_TRUE(got.isOk()) << got.status().toString();
  EXPECT_EQ(*got, *created);
}

TYPED_TEST(StoreTest, IdsAreSequential) {
  for (int i = 1; i <= 5; ++i) {
    auto job = this->store_->createJob(sampleSpec("j" + std::to_string(i)));
    ASSERT_TRUE(job.isOk());
    EXPECT_EQ(job->id, formatJobId(i));
  }
}

TYPED_TEST(StoreTest, CreateRejectsInvalidSpecs) {
  JobSpec no_command = sampleSpec();
  no_command.command.clear();
  auto r = this->store_->createJob(no_command);
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(r.status().message(), "command is empty")) << r.status().toString();
  EXPECT_TRUE(contains(r.status().message(), "resnet50")) << r.status().toString();

  JobSpec bad_env = sampleSpec();
  bad_env.env.push_back("NOEQUALS");
  r = this->store_->createJob(bad_env);
  ASSERT_FALSE(r.isOk());
  EXPECT_TRUE(contains(r.status().message(), "NOEQUALS")) << r.status().toString();

  JobSpec negative = sampleSpec();
  negative.max_restarts = -1;
  EXPECT_EQ(this->store_->createJob(negative).status().code(), StatusCode::kInvalidArgument);

  auto all = this->store_->listJobs();
  ASSERT_TRUE(all.isOk());
  EXPECT_TRUE(all->empty()) << "a refused spec must not be stored";
}

TYPED_TEST(StoreTest, RequiredLabelsRoundTripPerJob) {
  JobSpec none = sampleSpec("none", "alice");
  none.required_labels.clear();
  JobSpec one = sampleSpec("one", "bob");
  one.required_labels = {{"gpu", "v100"}};
  JobSpec many = sampleSpec("many", "alice");
  many.required_labels = {{"rack", "r7"}, {"gpu", "h100"}, {"ib", ""}, {"a.b/c-d_e", "X.y-z_0"}};
  std::vector<Job> created;
  for (const JobSpec& spec : {none, one, many, sampleSpec()}) {
    auto job = this->store_->createJob(spec);
    ASSERT_TRUE(job.isOk()) << job.status().toString();
    EXPECT_EQ(job->spec.required_labels, spec.required_labels);
    created.push_back(*job);
  }
  for (const Job& job : created) EXPECT_EQ(*this->store_->getJob(job.id), job);
  // Listing many jobs (the batched child-table reads) gives each job its own labels, filtered or not.
  EXPECT_EQ(*this->store_->listJobs(), created);
  auto alice = this->store_->listJobs({{}, "alice"});
  ASSERT_TRUE(alice.isOk()) << alice.status().toString();
  EXPECT_EQ(*alice, (std::vector<Job>{created[0], created[2], created[3]}));
  // Labels are part of the spec: transitions and allocations leave them alone.
  ASSERT_TRUE(this->store_->setAllocation(created[2].id, {{"n1", {0}}}, "t", 29500).isOk());
  ASSERT_TRUE(this->store_->transition(created[2].id, JobState::kScheduled, "").isOk());
  EXPECT_EQ(this->store_->getJob(created[2].id)->spec, many);
}

TYPED_TEST(StoreTest, CreateRejectsBadLabels) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "a100"},       {"gpu=type", "a100"}, {"gpu,type", "a100"}, {"gpu type", "a100"},
      {"gpu\ttype", "x"}, {"gpu\n", "x"},       {"gpu", "a=100"},     {"gpu", "a100,v100"},
      {"gpu", "a 100"},   {"gpu", "a100\n"},    {"gpu", "\ra100"},
  };
  for (const auto& [key, value] : bad) {
    JobSpec spec = sampleSpec();
    spec.required_labels[key] = value;
    auto r = this->store_->createJob(spec);
    ASSERT_FALSE(r.isOk()) << "label '" << key << "'='" << value << "' was accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(contains(r.status().message(), "job spec 'resnet50': label")) << r.status().toString();
    if (key.empty()) {
      EXPECT_TRUE(contains(r.status().message(), "empty key")) << r.status().toString();
    } else {
      EXPECT_TRUE(contains(r.status().message(), "label '" + quoteForMessage(key) + "'"))
          << r.status().toString();
      EXPECT_TRUE(contains(r.status().message(), "may not contain '=', ',' or whitespace"))
          << r.status().toString();
    }
  }
  EXPECT_TRUE(validateJobSpec(sampleSpec()).isOk());
  auto all = this->store_->listJobs();
  ASSERT_TRUE(all.isOk());
  EXPECT_TRUE(all->empty()) << "a refused spec must not be stored";
}

TYPED_TEST(StoreTest, UnknownJobsAreNotFound) {
  for (const char* id : {"j-000007", "bogus", ""}) {
    auto r = this->store_->getJob(id);
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
    EXPECT_TRUE(contains(r.status().message(), "job " + std::string(id) + " not found"))
        << r.status().toString();
    EXPECT_EQ(this->store_->transition(id, JobState::kCancelled, "x").status().code(), StatusCode::kNotFound);
    EXPECT_EQ(this->store_->setAllocation(id, {}, "", 0).code(), StatusCode::kNotFound);
  }
}

TYPED_TEST(StoreTest, ListFiltersByStateAndUser) {
  Job a1 = this->jobIn(JobState::kPending, sampleSpec("a1", "alice"));
  Job a2 = this->jobIn(JobState::kRunning, sampleSpec("a2", "alice"));
  Job b1 = this->jobIn(JobState::kRunning, sampleSpec("b1", "bob"));
  Job b2 = this->jobIn(JobState::kScheduled, sampleSpec("b2", "bob"));
  auto ids = [&](const JobFilter& f) {
    auto r = this->store_->listJobs(f);
    EXPECT_TRUE(r.isOk()) << r.status().toString();
    std::vector<std::string> out;
    if (r.isOk()) {
      for (const Job& j : *r) out.push_back(j.id);
    }
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(ids({}), (V{a1.id, a2.id, b1.id, b2.id}));
  EXPECT_EQ(ids({{}, "alice"}), (V{a1.id, a2.id}));
  EXPECT_EQ(ids({{JobState::kRunning}, std::nullopt}), (V{a2.id, b1.id}));
  EXPECT_EQ(ids({{JobState::kRunning, JobState::kScheduled}, "bob"}), (V{b1.id, b2.id}));
  EXPECT_EQ(ids({{JobState::kSucceeded}, std::nullopt}), V{});
  EXPECT_EQ(ids({{}, "carol"}), V{});

  // Listed jobs are complete, not summaries.
  auto all = this->store_->listJobs();
  ASSERT_TRUE(all.isOk());
  EXPECT_EQ((*all)[1], *this->store_->getJob(a2.id));
  EXPECT_EQ((*all)[1].transitions.size(), 4u);
}

TYPED_TEST(StoreTest, LegalLifecycleIsRecorded) {
  auto job = this->store_->createJob(sampleSpec());
  ASSERT_TRUE(job.isOk());
  const std::vector<std::pair<JobState, std::string>> path = {{JobState::kScheduled, "placed on n1,n2"},
                                                              {JobState::kStarting, "agents launching"},
                                                              {JobState::kRunning, "all 8 ranks up"},
                                                              {JobState::kSucceeded, "all ranks exited 0"}};
  for (const auto& [to, reason] : path) {
    auto r = this->store_->transition(job->id, to, reason);
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(r->state, to);
  }
  auto got = this->store_->getJob(job->id);
  ASSERT_TRUE(got.isOk());
  ASSERT_EQ(got->transitions.size(), 5u);
  for (size_t i = 1; i < got->transitions.size(); ++i) {
    const Transition& t = got->transitions[i];
    EXPECT_EQ(t.from, got->transitions[i - 1].to);
    EXPECT_EQ(t.to, path[i - 1].first);
    EXPECT_EQ(t.reason, path[i - 1].second);
    EXPECT_GT(t.at_ms, got->transitions[i - 1].at_ms);
  }
  EXPECT_EQ(got->state, JobState::kSucceeded);
  EXPECT_FALSE(got->failure);
}

TYPED_TEST(StoreTest, IllegalTransitionsFailWithAClearMessageAndChangeNothing) {
  Job job = this->jobIn(JobState::kPending);
  auto r = this->store_->transition(job.id, JobState::kRunning, "skipping ahead");
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message(), "job j-000001: cannot go from PENDING to RUNNING");
  EXPECT_EQ(*this->store_->getJob(job.id), job);

  ASSERT_TRUE(this->store_->transition(job.id, JobState::kCancelled, "user asked").isOk());
  for (JobState to : kAllJobStates) {
    r = this->store_->transition(job.id, to, "after the end");
    ASSERT_FALSE(r.isOk()) << toString(to);
    EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
    EXPECT_TRUE(contains(r.status().message(), "CANCELLED is final")) << r.status().toString();
  }
  EXPECT_EQ(this->store_->getJob(job.id)->transitions.size(), 2u);
}

TYPED_TEST(StoreTest, FailureInfoIsKept) {
  Job job = this->jobIn(JobState::kRunning);
  const Failure f{3, "node-7", 137, std::nullopt};
  auto r = this->store_->transition(job.id, JobState::kFailed, "rank 3 exited 137", f);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  auto got = this->store_->getJob(job.id);
  ASSERT_TRUE(got.isOk());
  EXPECT_EQ(got->state, JobState::kFailed);
  EXPECT_EQ(got->failure, f);
  EXPECT_EQ(got->transitions.back().failure, f);
  EXPECT_EQ(got->transitions.back().reason, "rank 3 exited 137");

  Job other = this->jobIn(JobState::kRunning);
  const Failure by_signal{0, "node-1", std::nullopt, 11};
  ASSERT_TRUE(this->store_->transition(other.id, JobState::kFailed, "segfault", by_signal).isOk());
  EXPECT_EQ(this->store_->getJob(other.id)->failure, by_signal);
}

TYPED_TEST(StoreTest, MisplacedOrMalformedFailureInfoIsRefused) {
  Job job = this->jobIn(JobState::kRunning);
  auto r = this->store_->transition(job.id, JobState::kSucceeded, "ok", Failure{0, "h", 1, std::nullopt});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(r.status().message(), "job " + job.id)) << r.status().toString();
  r = this->store_->transition(job.id, JobState::kFailed, "both", Failure{0, "h", 1, 9});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(r.status().message(), "exactly one of exit_code and signal")) << r.status().toString();
  r = this->store_->transition(job.id, JobState::kFailed, "neither",
                               Failure{0, "h", std::nullopt, std::nullopt});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*this->store_->getJob(job.id), job);
}

TYPED_TEST(StoreTest, RequeueCountsRestartsUpToTheBudget) {
  JobSpec spec = sampleSpec();
  spec.max_restarts = 1;
  Job job = this->jobIn(JobState::kScheduled, spec);
  ASSERT_TRUE(this->store_->setAllocation(job.id, {{"n1", {0, 1}}}, "ring:n1", 29502).isOk());
  EXPECT_EQ(this->store_->getJob(job.id)->root_port, 29502);
  ASSERT_TRUE(this->store_->transition(job.id, JobState::kStarting, "").isOk());
  ASSERT_TRUE(this->store_->transition(job.id, JobState::kRunning, "").isOk());

  const Failure lost{1, "n1", std::nullopt, 9};
  auto r = this->store_->transition(job.id, JobState::kPending, "node n1 lost; requeue 1 of 1", lost);
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->restarts, 1);
  EXPECT_TRUE(r->allocation.empty());
  EXPECT_EQ(r->topology, "");
  EXPECT_EQ(r->root_port, 0);  // placed again, perhaps elsewhere: a new port then
  EXPECT_FALSE(r->failure);
  EXPECT_EQ(r->transitions.back().failure, lost);
  EXPECT_EQ(*this->store_->getJob(job.id), *r);

  for (JobState s : {JobState::kScheduled, JobState::kStarting, JobState::kRunning}) {
    ASSERT_TRUE(this->store_->transition(job.id, s, "").isOk());
  }
  r = this->store_->transition(job.id, JobState::kPending, "again");
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(
      r.status().message(),
      "job " + job.id + ": cannot requeue, 1 restarts already used of max_restarts 1; fail the job instead");

  // Giving back an allocation that never launched is not a restart.
  Job other = this->jobIn(JobState::kScheduled, spec);
  r = this->store_->transition(other.id, JobState::kPending, "node went away before launch");
  ASSERT_TRUE(r.isOk()) << r.status().toString();
  EXPECT_EQ(r->restarts, 0);
}

TYPED_TEST(StoreTest, AllocationIsSetBeforeLaunchOnly) {
  Job job = this->jobIn(JobState::kPending);
  const std::vector<NodeAllocation> alloc = {{"n1", {0, 1, 2, 3}}, {"n2", {4, 5, 6, 7}}};
  ASSERT_TRUE(this->store_->setAllocation(job.id, alloc, "2x4 ring: n1 n2", 29500).isOk());
  auto got = this->store_->getJob(job.id);
  EXPECT_EQ(got->allocation, alloc);
  EXPECT_EQ(got->topology, "2x4 ring: n1 n2");
  EXPECT_EQ(got->root_port, 29500);

  // Replaces, and an empty GPU list survives.
  const std::vector<NodeAllocation> alloc2 = {{"n3", {}}};
  ASSERT_TRUE(this->store_->setAllocation(job.id, alloc2, "t2", 29502).isOk());
  EXPECT_EQ(this->store_->getJob(job.id)->allocation, alloc2);

  ASSERT_TRUE(this->store_->transition(job.id, JobState::kScheduled, "").isOk());
  ASSERT_TRUE(this->store_->setAllocation(job.id, alloc, "t3", 29504).isOk());
  ASSERT_TRUE(this->store_->transition(job.id, JobState::kStarting, "").isOk());
  Status st = this->store_->setAllocation(job.id, alloc2, "late", 29506);
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(st.message(),
            "job " + job.id +
                ": cannot set an allocation while STARTING; only a PENDING or SCHEDULED job is placed");
  got = this->store_->getJob(job.id);
  EXPECT_EQ(got->allocation, alloc);
  EXPECT_EQ(got->topology, "t3");
  EXPECT_EQ(got->root_port, 29504);

  // Kept once the job is final, for the record.
  ASSERT_TRUE(this->store_->transition(job.id, JobState::kCancelled, "").isOk());
  EXPECT_EQ(this->store_->getJob(job.id)->allocation, alloc);
}

NodeRecord sampleNode(const std::string& name, int gpus = 2) {
  NodeRecord n;
  n.name = name;
  n.address = name + ".cluster:7070";
  for (int i = 0; i < gpus; ++i) {
    n.gpus.push_back(
        GpuInfo{i, "GPU-" + name + "-" + std::to_string(i), "Tesla P100-SXM2-16GB", 17071734784});
  }
  n.labels = {{"rack", "r1"}, {"switch", "sw=2\nx"}};
  n.state = NodeState::kUp;
  n.last_heartbeat_ms = 1'700'000'123'456;
  return n;
}

// Where each GPU sits, each CPU's NUMA node and the faulted GPUs are kept with the node, in every store.
TYPED_TEST(StoreTest, NodeTopologyAndGpuFaultsRoundTrip) {
  NodeRecord n = sampleNode("n1", 4);
  n.cpus = {0, 1, 2, 3};
  n.cpu_numa = {0, 0, 1, 1};
  n.gpus[1].pci_bus_id = "0000:3b:00.0";
  n.gpus[1].numa_node = 0;
  n.gpus[1].island = 0;
  n.gpus[1].nvlink_peers = {0};
  n.gpus[1].p2p_peers = {0, 2, 3};
  n.gpus[1].nic = "mlx5_0:1";
  n.gpus[1].cpus = "0-1";
  n.gpu_faults[2] = state::GpuFault{"Xid 79 (fallen off the bus)", 79, 1234};
  ASSERT_TRUE(this->store_->upsertNode(n).isOk());
  EXPECT_EQ(*this->store_->getNode("n1"), n);
  n.gpu_faults.clear();
  ASSERT_TRUE(this->store_->upsertNode(n).isOk());
  EXPECT_EQ(*this->store_->getNode("n1"), n);
}

TYPED_TEST(StoreTest, NodesUpsertGetListAndState) {
  ASSERT_TRUE(this->store_->upsertNode(sampleNode("n2")).isOk());
  ASSERT_TRUE(this->store_->upsertNode(sampleNode("n1", 4)).isOk());
  EXPECT_EQ(*this->store_->getNode("n1"), sampleNode("n1", 4));

  auto list = this->store_->listNodes();
  ASSERT_TRUE(list.isOk());
  EXPECT_EQ(*list, (std::vector<NodeRecord>{sampleNode("n1", 4), sampleNode("n2")}));

  // Upsert replaces the whole record: fewer GPUs, different labels.
  NodeRecord n1 = sampleNode("n1", 1);
  n1.labels = {{"rack", "r9"}};
  n1.address = "10.0.0.1:7070";
  ASSERT_TRUE(this->store_->upsertNode(n1).isOk());
  EXPECT_EQ(*this->store_->getNode("n1"), n1);

  ASSERT_TRUE(this->store_->setNodeState("n1", NodeState::kDraining).isOk());
  n1.state = NodeState::kDraining;
  EXPECT_EQ(*this->store_->getNode("n1"), n1);
  EXPECT_EQ(this->store_->getNode("n2")->state, NodeState::kUp);

  // The operator's drain is its own field: setting the state (DOWN, as heartbeats do) leaves it alone.
  n1.drained = true;
  ASSERT_TRUE(this->store_->upsertNode(n1).isOk());
  ASSERT_TRUE(this->store_->setNodeState("n1", NodeState::kDown).isOk());
  n1.state = NodeState::kDown;
  EXPECT_EQ(*this->store_->getNode("n1"), n1);
  EXPECT_FALSE(this->store_->getNode("n2")->drained);

  auto missing = this->store_->getNode("n9");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(contains(missing.status().message(), "node n9")) << missing.status().toString();
  EXPECT_EQ(this->store_->setNodeState("n9", NodeState::kDown).code(), StatusCode::kNotFound);
  EXPECT_EQ(this->store_->upsertNode(NodeRecord{}).code(), StatusCode::kInvalidArgument);
}

// Entries (users, accounts, join tokens above the store): put, replace and delete in batches with jobs and
// nodes, listed by table in key order, every table at once without the jobs and nodes, bad names refused
// whole.
TYPED_TEST(StoreTest, EntriesArePutReplacedDeletedAndListedByTable) {
  Store& store = *this->backing_;
  ASSERT_TRUE(this->store_->upsertNode(sampleNode("n1")).isOk());
  ASSERT_TRUE(this->store_->createJob(sampleSpec()).isOk());
  const std::string binary("v\0\n{\"x\":1}\xff", 12);
  ASSERT_TRUE(
      store
          .applyBatch({Write::putEntry({"users", "bob", "b1"}), Write::putEntry({"users", "alice", binary}),
                       Write::putEntry({"accounts", "root", "r"}), Write::putEntry({"zeta", "k", "z"})})
          .isOk());
  EXPECT_EQ(*store.listEntries("users"),
            (std::vector<Entry>{{"users", "alice", binary}, {"users", "bob", "b1"}}));
  EXPECT_EQ(*store.listEntries("user"), std::vector<Entry>{});  // a table's name is whole, not a prefix
  // A later put replaces; a delete of a missing key is no error.
  ASSERT_TRUE(
      store
          .applyBatch({Write::putEntry({"users", "bob", "b2"}), Write::deleteEntry("accounts", "root"),
                       Write::deleteEntry("accounts", "nobody")})
          .isOk());
  EXPECT_EQ(*store.listEntries(""),
            (std::vector<Entry>{{"users", "alice", binary}, {"users", "bob", "b2"}, {"zeta", "k", "z"}}));
  // Refused whole: nothing of the batch is stored.
  for (const Entry& bad : std::vector<Entry>{{"jobs", "x", "v"},
                                             {"Users", "x", "v"},
                                             {"users", "a/b", "v"},
                                             {"users", "", "v"},
                                             {"users", "big", std::string(kMaxEntryValueBytes + 1, 'x')}}) {
    Status st = store.applyBatch({Write::putEntry({"users", "carol", "c"}), Write::putEntry(bad)});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument)
        << bad.table << "/" << bad.key << ": " << st.toString();
  }
  EXPECT_EQ(store.listEntries("users")->size(), 2u);
  EXPECT_EQ(store.listNodes()->size(), 1u);
}

TYPED_TEST(StoreTest, ConcurrentCallersGetUniqueIdsAndOneWinnerPerRace) {
  constexpr int kThreads = 4, kPerThread = 25;
  std::vector<std::vector<std::string>> ids(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        auto job = this->store_->createJob(sampleSpec("t" + std::to_string(t)));
        if (job.isOk()) ids[t].push_back(job->id);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<std::string> unique;
  for (const auto& v : ids) unique.insert(v.begin(), v.end());
  EXPECT_EQ(unique.size(), size_t{kThreads * kPerThread});
  EXPECT_EQ(this->store_->listJobs()->size(), size_t{kThreads * kPerThread});

  // Every thread tries PENDING -> SCHEDULED on the same jobs: exactly one wins each.
  std::atomic<int> wins{0}, refusals{0};
  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (const std::string& id : ids[0]) {
        auto r = this->store_->transition(id, JobState::kScheduled, "race");
        (r.isOk() ? wins : refusals)++;
        if (!r.isOk()) {
          EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wins.load(), kPerThread);
  EXPECT_EQ(refusals.load(), kPerThread * (kThreads - 1));
  for (const std::string& id : ids[0]) EXPECT_EQ(this->store_->getJob(id)->transitions.size(), 2u);
}

#ifdef DDL_HAVE_ETCD
// ---- etcd only
// ---------------------------------------------------------------------------------------------

// Starts etcd for one test, or skips it (no binary) with the reason.
#define START_ETCD(var, options, members)                                          \
  std::string why_##var;                                                           \
  auto var = EtcdBacked::start(&why_##var, options, members);                      \
  if (!var && test_util::EtcdForTest::binary().empty()) GTEST_SKIP() << why_##var; \
  ASSERT_NE(var, nullptr) << why_##var

// `writes` as batches of at most what one transaction of `store` takes, in order; the first failure.
Status applyWithinLimits(Store& store, const std::vector<Write>& writes) {
  const Store::BatchLimits limits = store.batchLimits();
  std::vector<Write> part;
  size_t bytes = 0;
  for (const Write& w : writes) {
    const size_t b = store.writeBytes(w);
    if (!part.empty() && (part.size() + 1 > limits.max_writes || bytes + b > limits.max_bytes)) {
      if (Status st = store.applyBatch(part); !st) return st;
      part.clear();
      bytes = 0;
    }
    part.push_back(w);
    bytes += b;
  }
  return part.empty() ? Status::ok() : store.applyBatch(part);
}

// One batch is one transaction: a batch larger than etcd takes in one is refused whole, with nothing of it
// stored, never split (a leader that died between two parts left half a batch for the next); batches within
// the limits land; pages cross the store's read chunks; job numbers never go back after a purge.
TEST(EtcdStore, LargeBatchesPagesAndPurgesKeepEveryRule) {
  EtcdStore::Options options;
  options.max_txn_ops = 16;
  options.page_jobs = 7;
  START_ETCD(backed, options, 1);
  FakeClock clock;
  DirectStore store(*backed, clock.fn());
  EXPECT_EQ(backed->batchLimits().max_writes, 15u);  // one operation is the store's own (meta/last_job)
  std::vector<Write> batch;
  for (int n = 1; n <= 100; ++n) {
    Write w;
    w.job = newJob(formatJobId(n), sampleSpec("b" + std::to_string(n)), 1000 + n);
    w.new_job = true;
    batch.push_back(w);
  }
  const Status whole = store.applyBatch(batch);
  EXPECT_EQ(whole.code(), StatusCode::kInvalidArgument) << whole.toString();
  EXPECT_TRUE(contains(whole.message(), "never split")) << whole.message();
  EXPECT_EQ(*store.lastJobNumber(), 0);
  EXPECT_TRUE(store.listJobs()->empty()) << "part of a refused batch was stored";
  ASSERT_TRUE(applyWithinLimits(*backed, batch));
  EXPECT_EQ(*store.lastJobNumber(), 100);
  auto all = store.listJobs();
  ASSERT_TRUE(all) << all.status().toString();
  ASSERT_EQ(all->size(), 100u);
  EXPECT_EQ(all->front().spec, sampleSpec("b1"));
  EXPECT_EQ(all->back().id, "j-000100");
  // Pages in both directions, with a filter that skips most jobs.
  auto up = store.listJobsPage({}, 40, 5);
  ASSERT_TRUE(up);
  ASSERT_EQ(up->size(), 5u);
  EXPECT_EQ(up->front().id, "j-000041");
  auto down = store.listJobsPage({}, 40, 5, /*newest_first=*/true);
  ASSERT_TRUE(down);
  ASSERT_EQ(down->size(), 5u);
  EXPECT_EQ(down->front().id, "j-000035");
  EXPECT_EQ(down->back().id, "j-000039");
  JobFilter named;
  named.name = "b77";
  auto found = store.listJobsPage(named, 0, 10);
  ASSERT_TRUE(found);
  ASSERT_EQ(found->size(), 1u);
  EXPECT_EQ(found->front().id, "j-000077");
  // End the first 30 and purge them: the numbers stay used.
  for (int n = 1; n <= 30; ++n) ASSERT_TRUE(store.transition(formatJobId(n), JobState::kCancelled, "done"));
  auto purged = store.purgeFinished(std::numeric_limits<int64_t>::max(), 1000);
  ASSERT_TRUE(purged);
  EXPECT_EQ(*purged, 30);
  EXPECT_EQ(store.listJobs()->size(), 70u);
  for (int n = 71; n <= 100; ++n) ASSERT_TRUE(store.transition(formatJobId(n), JobState::kCancelled, "done"));
  // The newest cancelled ones, newest first (as recovery reads recent final jobs), in ascending order.
  JobFilter cancelled;
  cancelled.states = {JobState::kCancelled};
  auto recent = store.listJobsPage(cancelled, 0, 5, /*newest_first=*/true);
  ASSERT_TRUE(recent) << recent.status().toString();
  ASSERT_EQ(recent->size(), 5u);
  EXPECT_EQ(recent->front().id, "j-000096");
  EXPECT_EQ(recent->back().id, "j-000100");
  auto older = store.listJobsPage(cancelled, 71, 100, /*newest_first=*/true);  // below 71: none left
  ASSERT_TRUE(older);
  EXPECT_TRUE(older->empty());
  EXPECT_EQ(*store.purgeFinished(std::numeric_limits<int64_t>::max(), 1000), 30);
  EXPECT_EQ(*store.lastJobNumber(), 100);  // the newest job is gone; meta/last_job keeps its number
  EXPECT_EQ(store.createJob(sampleSpec())->id, "j-000101");
}

// A layout written by a newer ddl is refused, not rewritten; so is a schema key holding something else. The
// keys are set with etcdctl, as an operator (or a newer coordinator) would.
TEST(EtcdStore, ANewerOrForeignLayoutIsRefused) {
  START_ETCD(backed, EtcdStore::Options{}, 1);
  const std::string etcdctl =
      std::filesystem::path(test_util::EtcdForTest::binary()).parent_path().string() + "/etcdctl";
  if (::access(etcdctl.c_str(), X_OK) != 0)
    GTEST_SKIP() << "no etcdctl beside " << test_util::EtcdForTest::binary();
  auto put = [&](const std::string& key, const std::string& value) {
    const std::string cmd = "ETCDCTL_API=3 " + etcdctl + " --endpoints=" + backed->endpoint() + " put '" +
                            key + "' '" + value + "' >/dev/null";
    return std::system(cmd.c_str()) == 0;
  };
  EtcdStore::Options o;
  o.endpoints = {backed->endpoint()};
  for (const auto& [prefix, value, message] :
       {std::tuple<std::string, std::string, std::string>{"/newer/", "2", "has layout version 2, newer than"},
        {"/foreign/", "hello", "holds 'hello', not a ddl layout version"}}) {
    ASSERT_TRUE(put(prefix + "meta/schema", value));
    o.prefix = prefix;
    auto refused = EtcdStore::open(o);
    ASSERT_FALSE(refused) << prefix;
    EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss);
    EXPECT_TRUE(contains(refused.status().message(), message)) << refused.status().message();
  }
  // A prefix of its own is initialised, and a second store on it agrees.
  o.prefix = "/fresh/";
  ASSERT_TRUE(EtcdStore::open(o));
  ASSERT_TRUE(EtcdStore::open(o));
  // No etcd at the endpoint: UNAVAILABLE naming it, within the timeout.
  EtcdStore::Options nobody;
  nobody.endpoints = {"127.0.0.1:1"};
  nobody.timeout_ms = 500;
  auto none = EtcdStore::open(nobody);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(contains(none.status().message(), "127.0.0.1:1")) << none.status().message();
}

// Records near the spec's limits: a batch of them is more than etcd takes in one request (1.5 MiB), so it is
// refused whole; in batches within the limits they land; a page of them is more than gRPC's default 4 MiB
// answer, and is read whole.
TEST(EtcdStore, LargeRecordsAreRefusedWholeAndFitInBatchesWithinTheLimits) {
  START_ETCD(backed, EtcdStore::Options{}, 1);
  DirectStore store(*backed);
  JobSpec big = sampleSpec("big");
  big.env.clear();
  for (int i = 0; i < 4; ++i) big.env.push_back("V" + std::to_string(i) + "=" + std::string(30000, 'a' + i));
  std::vector<Write> batch;
  for (int n = 1; n <= 60; ++n) {  // about 7 MB
    Write w;
    w.job = newJob(formatJobId(n), big, 1000);
    w.new_job = true;
    batch.push_back(w);
  }
  EXPECT_EQ(store.applyBatch(batch).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(store.listJobs()->empty());
  // What writeBytes counts is an upper bound of what is sent: a batch built within the limits is taken.
  for (const Write& w : batch) EXPECT_GE(backed->writeBytes(w), record_codec::encodeJob(w.job).size());
  ASSERT_TRUE(applyWithinLimits(*backed, batch));
  auto all = store.listJobs();
  ASSERT_TRUE(all) << all.status().toString();
  ASSERT_EQ(all->size(), 60u);
  for (const Job& j : *all) EXPECT_EQ(j.spec, big) << j.id;
  auto newest = store.listJobsPage({}, 0, 60, /*newest_first=*/true);
  ASSERT_TRUE(newest) << newest.status().toString();
  EXPECT_EQ(newest->size(), 60u);
}

// A batch that stores a new job raises meta/last_job in its own transaction: the leader knows the number it
// last stored (read once per reign), so each such batch is one request to etcd, not two.
TEST(EtcdStore, TheJobCounterCostsNoRequestOfItsOwn) {
  START_ETCD(backed, EtcdStore::Options{}, 1);
  EtcdStore& etcd = backed->etcd();
  auto one = [&](int n) {
    Write w;
    w.job = newJob(formatJobId(n), sampleSpec("c" + std::to_string(n)), 1000 + n);
    w.new_job = true;
    return std::vector<Write>{w};
  };
  ASSERT_TRUE(etcd.applyBatch(one(1)));  // reads meta/last_job once
  for (int n = 2; n <= 11; ++n) {
    const int64_t before = etcd.requests();
    ASSERT_TRUE(etcd.applyBatch(one(n)));
    EXPECT_EQ(etcd.requests() - before, 1) << "batch " << n;
  }
  EXPECT_EQ(*etcd.lastJobNumber(), 11);
  etcd.fence("", 0);  // a new reign reads it again, once
  const int64_t before = etcd.requests();
  ASSERT_TRUE(etcd.applyBatch(one(12)));
  EXPECT_EQ(etcd.requests() - before, 2);
  EXPECT_EQ(*etcd.lastJobNumber(), 12);
}

// Three members: every acknowledged batch is on a quorum, so kill -9 of the member the store talks to loses
// nothing, and the store goes on through the others.
TEST(EtcdStore, AThreeMemberClusterLosesNothingWhenAMemberDies) {
  START_ETCD(backed, EtcdStore::Options{}, 3);
  DirectStore store(*backed);
  std::vector<std::string> acked;
  for (int i = 0; i < 20; ++i) {
    auto job = store.createJob(sampleSpec("before-" + std::to_string(i)));
    ASSERT_TRUE(job) << job.status().toString();
    acked.push_back(job->id);
  }
  backed->killMember(0);  // the endpoint every call went to so far
  // Calls go on through the other members (the first may wait out an election: bounded by the timeouts).
  for (int i = 0; i < 20; ++i) {
    StatusOr<Job> job = Status::unavailable("not tried");
    for (int attempt = 0; attempt < 20 && !job; ++attempt)
      job = store.createJob(sampleSpec("after-" + std::to_string(i)));
    ASSERT_TRUE(job) << job.status().toString();
    acked.push_back(job->id);
  }
  auto all = store.listJobs();
  ASSERT_TRUE(all) << all.status().toString();
  std::set<std::string> present;
  for (const Job& j : *all) present.insert(j.id);
  // Every acknowledged job is there. (There may be more: a commit whose answer was lost in the election is
  // stored, and the retry made another job.)
  for (const std::string& id : acked) EXPECT_TRUE(present.count(id)) << "acknowledged job " << id << " lost";
}

#endif

// ---- SQLite only ------------------------------------------------------------------------------------------

// Runs a query through a separate raw connection and returns the first column of the first row as text.
std::string rawQuery(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string out = "<error>";
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) == SQLITE_OK) {
    sqlite3_stmt* s = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s, nullptr) == SQLITE_OK) {
      int rc = sqlite3_step(s);
      if (rc == SQLITE_ROW) {
        const unsigned char* t = sqlite3_column_text(s, 0);
        out = t ? reinterpret_cast<const char*>(t) : "<null>";
      } else if (rc == SQLITE_DONE) {
        out = "<done>";
      }
    }
    sqlite3_finalize(s);
  }
  sqlite3_close_v2(db);
  return out;
}

TEST(SqliteStore, SchemaIsCreatedOnFirstStart) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  ASSERT_FALSE(fs::exists(path));
  auto store = openOrDie(path);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(store->schemaVersion(), SqliteStore::kSchemaVersion);
  EXPECT_TRUE(store->integrityCheck().isOk());
  EXPECT_EQ(store->path(), path);
  EXPECT_EQ(rawQuery(path, "PRAGMA journal_mode"), "wal");
  EXPECT_EQ(rawQuery(path, "SELECT version FROM schema_version"),
            std::to_string(SqliteStore::kSchemaVersion));
  EXPECT_EQ(rawQuery(path,
                     "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('jobs', "
                     "'job_env', 'job_argv', 'job_labels', 'job_transitions', 'job_allocation', 'nodes', "
                     "'node_gpus', 'node_labels')"),
            "9");
  EXPECT_TRUE(store->listJobs()->empty());
  EXPECT_TRUE(store->listNodes()->empty());

  // A second start finds the schema in place and changes nothing.
  store.reset();
  store = openOrDie(path);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->schemaVersion(), SqliteStore::kSchemaVersion);
  EXPECT_EQ(rawQuery(path, "SELECT count(*) FROM schema_version"), "1");
}

TEST(SqliteStore, ReopenKeepsEveryJobAndNode) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  FakeClock clock;
  std::vector<Job> jobs;
  std::vector<NodeRecord> nodes = {sampleNode("a", 8), sampleNode("b", 0)};
  nodes[1].state = NodeState::kDown;
  nodes[0].cpus = {0, 1, 2, 3, 8, 9};
  nodes[0].memory_bytes = int64_t{512} << 30;
  {
    auto store = openOrDie(path, clock.fn());
    ASSERT_NE(store, nullptr);
    for (const NodeRecord& n : nodes) ASSERT_TRUE(store->upsertNode(n).isOk());
    JobSpec spec = sampleSpec();
    spec.max_restarts = 3;
    spec.cpus_per_rank = 2;
    spec.memory_per_rank_bytes = int64_t{8} << 30;
    spec.request_id = "ci-42:build_7.1";
    for (int i = 0; i < 6; ++i) ASSERT_TRUE(store->createJob(spec).isOk());
    ASSERT_TRUE(store
                    ->setAllocation("j-000002", {{"a", {0, 1}, {0, 1, 2, 3}, int64_t{16} << 30}, {"b", {7}}},
                                    "ring a b", 29500)
                    .isOk());
    ASSERT_TRUE(store->transition("j-000002", JobState::kScheduled, "placed").isOk());
    for (JobState s : {JobState::kScheduled, JobState::kStarting, JobState::kRunning}) {
      ASSERT_TRUE(store->transition("j-000003", s, "").isOk());
      ASSERT_TRUE(store->transition("j-000004", s, "").isOk());
      ASSERT_TRUE(store->transition("j-000005", s, "").isOk());
    }
    ASSERT_TRUE(
        store->transition("j-000003", JobState::kFailed, "rank 5 died", Failure{5, "b", std::nullopt, 9})
            .isOk());
    ASSERT_TRUE(store->transition("j-000004", JobState::kPending, "requeue", Failure{0, "a", 1, std::nullopt})
                    .isOk());
    ASSERT_TRUE(store->transition("j-000005", JobState::kSucceeded, "done").isOk());
    ASSERT_TRUE(store->transition("j-000006", JobState::kCancelled, "user").isOk());
    jobs = *store->listJobs();
  }
  ASSERT_EQ(jobs.size(), 6u);
  ASSERT_EQ(jobs[0].spec.required_labels, sampleSpec().required_labels);
  ASSERT_EQ(jobs[1].allocation.at(0).cpus,
            (std::vector<int>{0, 1, 2, 3}));  // read back before the reopen too
  ASSERT_EQ(jobs[1].spec.cpus_per_rank, 2);
  ASSERT_EQ(jobs[1].spec.request_id, "ci-42:build_7.1");
  auto store = openOrDie(path, clock.fn());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->listJobs(), jobs);
  EXPECT_EQ(*store->listNodes(), nodes);
  for (const Job& j : jobs) EXPECT_EQ(*store->getJob(j.id), j);
  // Ids continue after the last one; nothing is reused.
  EXPECT_EQ(store->createJob(sampleSpec())->id, "j-000007");
  // The restored jobs keep following the rules.
  EXPECT_EQ(store->transition("j-000005", JobState::kRunning, "").status().code(),
            StatusCode::kFailedPrecondition);
  EXPECT_TRUE(store->transition("j-000004", JobState::kScheduled, "").isOk());
}

// A database written at schema version 1 (before job labels) is migrated in place on open: its jobs and
// nodes are kept, with no labels, and new jobs store theirs.
TEST(SqliteStore, VersionOneDatabaseIsUpgradedInPlace) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  FakeClock clock;
  JobSpec v1_spec = sampleSpec();
  v1_spec.required_labels.clear();  // Version 1 had no labels.
  std::vector<Job> jobs;
  {
    auto store = openOrDie(path, clock.fn());
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->upsertNode(sampleNode("a", 4)).isOk());
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->createJob(v1_spec).isOk());
    ASSERT_TRUE(store->setAllocation("j-000002", {{"a", {0, 1}}}, "ring a", 0).isOk());
    ASSERT_TRUE(store->transition("j-000002", JobState::kScheduled, "placed").isOk());
    ASSERT_TRUE(store->transition("j-000003", JobState::kCancelled, "user").isOk());
    jobs = *store->listJobs();
  }
  // Turn the file into exactly what version 1 wrote: version 2 added the job_labels table, version 3 the nodes'
  // drained column, version 4 the jobs' root_port, version 5 their end_ms and its index.
  EXPECT_EQ(rawQuery(path, "DROP TABLE job_labels"), "<done>");
  EXPECT_EQ(rawQuery(path, "ALTER TABLE nodes DROP COLUMN drained"), "<done>");
  EXPECT_EQ(rawQuery(path, "ALTER TABLE jobs DROP COLUMN root_port"), "<done>");
  EXPECT_EQ(rawQuery(path, "DROP INDEX jobs_by_end"), "<done>");
  EXPECT_EQ(rawQuery(path, "ALTER TABLE jobs DROP COLUMN end_ms"), "<done>");
  EXPECT_EQ(rawQuery(path, "ALTER TABLE jobs DROP COLUMN extra"), "<done>");
  EXPECT_EQ(rawQuery(path, "ALTER TABLE nodes DROP COLUMN drain_reason"), "<done>");
  for (const char* v7 :
       {"ALTER TABLE job_allocation DROP COLUMN cpus", "ALTER TABLE job_allocation DROP COLUMN memory_bytes",
        "ALTER TABLE nodes DROP COLUMN cpus", "ALTER TABLE nodes DROP COLUMN memory_bytes"})
    ASSERT_EQ(rawQuery(path, v7), "<done>");  // version 7's columns
  ASSERT_EQ(rawQuery(path, "DROP TABLE entries"), "<done>");  // version 8's
  for (const char* v9 :
       {"ALTER TABLE node_gpus DROP COLUMN topology", "ALTER TABLE nodes DROP COLUMN cpu_numa",
        "ALTER TABLE nodes DROP COLUMN gpu_faults"})
    ASSERT_EQ(rawQuery(path, v9), "<done>");  // version 9's
  EXPECT_EQ(rawQuery(path, "UPDATE schema_version SET version = 1"), "<done>");
  ASSERT_EQ(rawQuery(path, "SELECT version FROM schema_version"), "1");
  ASSERT_EQ(rawQuery(path, "SELECT count(*) FROM sqlite_master WHERE name = 'job_labels'"), "0");

  {
    auto store = openOrDie(path, clock.fn());
    ASSERT_NE(store, nullptr);
    EXPECT_EQ(store->schemaVersion(), SqliteStore::kSchemaVersion);
    EXPECT_TRUE(store->integrityCheck().isOk());
    EXPECT_EQ(*store->listJobs(), jobs);
    EXPECT_EQ(*store->listNodes(), std::vector<NodeRecord>{sampleNode("a", 4)});
    auto job = store->createJob(sampleSpec());
    ASSERT_TRUE(job.isOk()) << job.status().toString();
    EXPECT_EQ(job->id, "j-000004");
    jobs.push_back(*job);
  }
  // The migration was committed, and the new job's labels are on disk.
  EXPECT_EQ(rawQuery(path, "SELECT version FROM schema_version"),
            std::to_string(SqliteStore::kSchemaVersion));
  EXPECT_EQ(rawQuery(path, "SELECT count(*) FROM job_labels WHERE job_seq = 4"), "2");
  auto store = openOrDie(path, clock.fn());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(*store->listJobs(), jobs);
  EXPECT_EQ(store->getJob("j-000004")->spec, sampleSpec());
  EXPECT_TRUE(store->transition("j-000002", JobState::kStarting, "").isOk());
  // Version 5 gave the job cancelled under version 1 its end time, so the retention purges it (and only it).
  EXPECT_EQ(*store->purgeFinished(std::numeric_limits<int64_t>::max(), 100), 1);
  EXPECT_EQ(store->getJob("j-000003").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(*store->lastJobNumber(), 4);
}

// Version 2 knew a drain only as the DRAINING state: migrated, such a node is drained, so that it comes back
// DRAINING after going DOWN; the others are not.
TEST(SqliteStore, VersionTwoDrainingNodesAreDrainedAfterTheUpgrade) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  FakeClock clock;
  NodeRecord draining = sampleNode("a", 2), up = sampleNode("b", 2), down = sampleNode("c", 1);
  draining.state = NodeState::kDraining;
  down.state = NodeState::kDown;
  {
    auto store = openOrDie(path, clock.fn());
    ASSERT_NE(store, nullptr);
    for (const NodeRecord& n : {draining, up, down}) ASSERT_TRUE(store->upsertNode(n).isOk());
  }
  EXPECT_EQ(rawQuery(path, "ALTER TABLE nodes DROP COLUMN drained"), "<done>");
  EXPECT_EQ(rawQuery(path, "ALTER TABLE jobs DROP COLUMN root_port"), "<done>");
  EXPECT_EQ(rawQuery(path, "DROP INDEX jobs_by_end"), "<done>");
  EXPECT_EQ(rawQuery(path, "ALTER TABLE jobs DROP COLUMN end_ms"), "<done>");
  EXPECT_EQ(rawQuery(path, "ALTER TABLE jobs DROP COLUMN extra"), "<done>");
  EXPECT_EQ(rawQuery(path, "ALTER TABLE nodes DROP COLUMN drain_reason"), "<done>");
  for (const char* v7 :
       {"ALTER TABLE job_allocation DROP COLUMN cpus", "ALTER TABLE job_allocation DROP COLUMN memory_bytes",
        "ALTER TABLE nodes DROP COLUMN cpus", "ALTER TABLE nodes DROP COLUMN memory_bytes"})
    ASSERT_EQ(rawQuery(path, v7), "<done>");  // version 7's columns
  ASSERT_EQ(rawQuery(path, "DROP TABLE entries"), "<done>");  // version 8's
  for (const char* v9 :
       {"ALTER TABLE node_gpus DROP COLUMN topology", "ALTER TABLE nodes DROP COLUMN cpu_numa",
        "ALTER TABLE nodes DROP COLUMN gpu_faults"})
    ASSERT_EQ(rawQuery(path, v9), "<done>");  // version 9's
  EXPECT_EQ(rawQuery(path, "UPDATE schema_version SET version = 2"), "<done>");

  auto store = openOrDie(path, clock.fn());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->schemaVersion(), SqliteStore::kSchemaVersion);
  EXPECT_TRUE(store->integrityCheck().isOk());
  draining.drained = true;
  EXPECT_EQ(*store->listNodes(), (std::vector<NodeRecord>{draining, up, down}));
}

TEST(SqliteStore, UnopenablePathGivesAClearError) {
  TempDir dir;
  const std::string path = dir.file("no/such/dir/state.db");
  auto r = SqliteStore::open(sqliteOptions(path));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(contains(r.status().message(), path)) << r.status().toString();
  EXPECT_TRUE(contains(r.status().message(), "directory exists")) << r.status().toString();
  EXPECT_FALSE(fs::exists(dir.file("no")));

  EXPECT_EQ(SqliteStore::open(sqliteOptions("")).status().code(), StatusCode::kInvalidArgument);
}

TEST(SqliteStore, NonDatabaseFileGivesAClearErrorAndIsLeftAlone) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  std::string garbage;
  for (int i = 0; i < 300; ++i) garbage += "this is not a database, it is a text file\n";
  { std::ofstream(path, std::ios::binary) << garbage; }
  auto r = SqliteStore::open(sqliteOptions(path));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(r.status().message(), path)) << r.status().toString();
  EXPECT_TRUE(contains(r.status().message(), "not a database")) << r.status().toString();
  std::ifstream in(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), garbage);
}

TEST(SqliteStore, ForeignSqliteDatabaseIsRefused) {
  TempDir dir;
  const std::string path = dir.file("other.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE photos (id INTEGER)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  auto r = SqliteStore::open(sqliteOptions(path));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(r.status().message(), "not a ddl state database")) << r.status().toString();
  EXPECT_EQ(rawQuery(path, "SELECT count(*) FROM sqlite_master"), "1") << "must not have been migrated";
}

TEST(SqliteStore, NewerSchemaIsRefused) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  ASSERT_NE(openOrDie(path), nullptr);
  rawQuery(path, "UPDATE schema_version SET version = 99");
  auto r = SqliteStore::open(sqliteOptions(path));
  ASSERT_FALSE(r.isOk());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_TRUE(contains(r.status().message(), "schema version 99, newer")) << r.status().toString();
}

TEST(SqliteStore, DamagedDatabaseGivesErrorsNotCrashes) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  {
    auto store = openOrDie(path);
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(store->createJob(sampleSpec()).isOk());
  }  // Closing checkpoints the WAL into the main file.
  const auto size = fs::file_size(path);
  ASSERT_GT(size, 8 * 4096u);
  {
    // Overwrite everything after the first page (the header and schema) with junk.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    std::mt19937 rng(7);
    for (uintmax_t i = 4096; i < size; ++i) f.put(static_cast<char>(rng()));
  }
  auto r = SqliteStore::open(sqliteOptions(path));
  std::vector<Status> errors;
  if (!r.isOk()) {
    errors.push_back(r.status());
  } else {
    auto& store = *r;
    if (Status st = store->integrityCheck(); !st) errors.push_back(st);
    if (auto l = DirectStore(*store).listJobs(); !l) errors.push_back(l.status());
    if (auto g = store->getJob("j-000150"); !g) errors.push_back(g.status());
  }
  ASSERT_FALSE(errors.empty()) << "damage went unnoticed";
  for (const Status& st : errors) {
    EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st.toString();
    EXPECT_TRUE(contains(st.message(), path)) << st.toString();
  }
}

// ---- Crashes: real processes killed with SIGKILL ----------------------------------------------------------

// Reads '\n'-terminated lines from fd into lines until `want` lines, EOF, or the deadline. Returns false on
// timeout.
bool readLines(int fd, std::string& buf, std::vector<std::string>& lines, size_t want,
               std::chrono::steady_clock::time_point deadline) {
  while (lines.size() < want) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char chunk[512];
    ssize_t n = ::read(fd, chunk, sizeof(chunk));
    if (n <= 0) return true;  // EOF: the child is gone.
    buf.append(chunk, n);
    for (size_t nl; (nl = buf.find('\n')) != std::string::npos; buf.erase(0, nl + 1)) {
      lines.push_back(buf.substr(0, nl));
    }
  }
  return true;
}

// Forks a child that opens the store at path (with hook) and creates up to `count` jobs named "<tag>-<i>",
// writing each acknowledged id to a pipe after createJob returns. Returns the child's pid and the read end.
std::pair<pid_t, int> spawnSubmitter(const std::string& path, const std::string& tag, int count,
                                     std::function<void(std::string_view)> hook = nullptr) {
  int fds[2];
  if (::pipe(fds) != 0) std::abort();
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    SqliteStore::Options o = sqliteOptions(path);
    o.test_hook = std::move(hook);
    auto sqlite = SqliteStore::open(o);
    if (!sqlite.isOk()) ::_exit(3);
    DirectStore store(**sqlite);
    for (int i = 0; i < count; ++i) {
      auto job = store.createJob(sampleSpec(tag + "-" + std::to_string(i)));
      if (!job.isOk()) ::_exit(4);
      std::string line = job->id + "\n";
      if (::write(fds[1], line.data(), line.size()) != static_cast<ssize_t>(line.size())) ::_exit(5);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  return {pid, fds[0]};
}

// Waits for pid with a deadline; SIGKILLs it if it overstays. Returns the wait status.
int reap(pid_t pid, std::chrono::seconds limit = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "child " << pid << " did not finish in time";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status;
}

// Checks that the database opens cleanly and every job in it is complete and consistent.
void expectConsistent(OpenSqlite& store) {
  ASSERT_TRUE(store.integrityCheck().isOk());
  auto jobs = store.listJobs();
  ASSERT_TRUE(jobs.isOk()) << jobs.status().toString();
  for (const Job& j : *jobs) {
    JobSpec expected = sampleSpec(j.spec.name);
    EXPECT_EQ(j.spec, expected) << j.id << " is incomplete";
    ASSERT_EQ(j.transitions.size(), 1u) << j.id;
    EXPECT_EQ(j.state, JobState::kPending);
  }
}

TEST(SqliteStoreCrash, AcknowledgedSubmitsSurviveKillDashNineAtRandomPoints) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  std::mt19937 rng(::testing::UnitTest::GetInstance()->random_seed());
  std::set<std::string> acked;
  constexpr int kRounds = 6, kJobsPerChild = 150;
  for (int round = 0; round < kRounds; ++round) {
    const size_t kill_after = std::uniform_int_distribution<size_t>(1, kJobsPerChild - 1)(rng);
    const int extra_us = std::uniform_int_distribution<int>(0, 3000)(rng);
    auto [pid, fd] = spawnSubmitter(path, "round" + std::to_string(round), kJobsPerChild);
    std::string buf;
    std::vector<std::string> lines;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    EXPECT_TRUE(readLines(fd, buf, lines, kill_after, deadline)) << "child too slow";
    // Land somewhere inside a later createJob: mid-transaction, mid-fsync, or between calls.
    std::this_thread::sleep_for(std::chrono::microseconds(extra_us));
    ::kill(pid, SIGKILL);
    int status = reap(pid);
    EXPECT_TRUE(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == 0))
        << "child failed before the kill, status " << status;
    // Everything the child wrote before it died was acknowledged.
    readLines(fd, buf, lines, SIZE_MAX, std::chrono::steady_clock::now() + std::chrono::seconds(5));
    ::close(fd);
    acked.insert(lines.begin(), lines.end());

    auto store = openOrDie(path);
    ASSERT_NE(store, nullptr) << "database does not open after kill -9 in round " << round;
    expectConsistent(*store);
    auto jobs = store->listJobs();
    ASSERT_TRUE(jobs.isOk());
    std::set<std::string> present;
    for (const Job& j : *jobs) present.insert(j.id);
    for (const std::string& id : acked)
      EXPECT_TRUE(present.count(id)) << "acknowledged job " << id << " lost";
  }
  EXPECT_GE(acked.size(), size_t{kRounds});
}

// Runs a child whose hook kills it at `point` during its third createJob; returns what it acknowledged.
std::vector<std::string> crashAt(const std::string& path, const std::string& point) {
  auto calls = std::make_shared<int>(0);
  auto [pid, fd] = spawnSubmitter(path, "c", 5, [calls, point](std::string_view p) {
    if (p == point && ++*calls == 3) ::raise(SIGKILL);
  });
  std::string buf;
  std::vector<std::string> lines;
  readLines(fd, buf, lines, SIZE_MAX, std::chrono::steady_clock::now() + std::chrono::seconds(30));
  ::close(fd);
  int status = reap(pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  return lines;
}

TEST(SqliteStoreCrash, KilledAfterTheWriteBeforeTheAcknowledgement) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  EXPECT_EQ(crashAt(path, "applyBatch:after-commit"), (std::vector<std::string>{"j-000001", "j-000002"}));
  auto store = openOrDie(path);
  ASSERT_NE(store, nullptr);
  expectConsistent(*store);
  // The third job was committed but never acknowledged; it is there, whole.
  auto jobs = store->listJobs();
  ASSERT_EQ(jobs->size(), 3u);
  EXPECT_EQ(jobs->back().id, "j-000003");
  EXPECT_EQ(jobs->back().spec, sampleSpec("c-2"));
  EXPECT_EQ(store->createJob(sampleSpec())->id, "j-000004");
}

TEST(SqliteStoreCrash, KilledBeforeTheCommitLeavesNoTrace) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  EXPECT_EQ(crashAt(path, "applyBatch:before-commit"), (std::vector<std::string>{"j-000001", "j-000002"}));
  auto store = openOrDie(path);
  ASSERT_NE(store, nullptr);
  expectConsistent(*store);
  auto jobs = store->listJobs();
  ASSERT_EQ(jobs->size(), 2u);
  EXPECT_EQ(rawQuery(path, "SELECT count(*) FROM job_argv WHERE job_seq = 3"), "0");
  EXPECT_EQ(rawQuery(path, "SELECT count(*) FROM job_labels WHERE job_seq = 3"), "0");
  // The id was never acknowledged, so handing it out again is safe.
  EXPECT_EQ(store->createJob(sampleSpec())->id, "j-000003");
}

TEST(SqliteStoreCrash, KilledMidTransitionLeavesTheOldState) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  {
    auto store = openOrDie(path);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->createJob(sampleSpec()).isOk());
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    SqliteStore::Options o = sqliteOptions(path);
    o.test_hook = [](std::string_view p) {
      if (p == "applyBatch:before-commit") ::raise(SIGKILL);
    };
    auto sqlite = SqliteStore::open(o);
    if (sqlite.isOk())
      (void)DirectStore(**sqlite).transition("j-000001", JobState::kScheduled, "never lands");
    ::_exit(0);
  }
  int status = reap(pid);
  EXPECT_TRUE(WIFSIGNALED(status)) << "status " << status;
  auto store = openOrDie(path);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->integrityCheck().isOk());
  auto job = store->getJob("j-000001");
  ASSERT_TRUE(job.isOk());
  EXPECT_EQ(job->state, JobState::kPending);
  EXPECT_EQ(job->transitions.size(), 1u);
}


// The jobs table exactly as versions 1 to 5 declared its state column (without TIMEOUT).
constexpr const char* kVersion5JobsTable = R"sql(
CREATE TABLE jobs_v5 (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, user_name TEXT NOT NULL, nodes INTEGER NOT NULL,
  gpus_per_node INTEGER NOT NULL, total_gpus INTEGER NOT NULL, topology_override TEXT NOT NULL,
  priority INTEGER NOT NULL, max_restarts INTEGER NOT NULL, workdir TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('PENDING', 'SCHEDULED', 'STARTING', 'RUNNING', 'SUCCEEDED', 'FAILED',
                                       'CANCELLED')),
  restarts INTEGER NOT NULL, submit_ms INTEGER NOT NULL, fail_rank INTEGER, fail_host TEXT,
  fail_exit_code INTEGER, fail_signal INTEGER, topology TEXT NOT NULL, root_port INTEGER NOT NULL DEFAULT 0,
  end_ms INTEGER NOT NULL DEFAULT 0);
INSERT INTO jobs_v5 SELECT seq, name, user_name, nodes, gpus_per_node, total_gpus, topology_override, priority,
  max_restarts, workdir, state, restarts, submit_ms, fail_rank, fail_host, fail_exit_code, fail_signal, topology,
  root_port, end_ms FROM jobs;
DROP TABLE jobs;
ALTER TABLE jobs_v5 RENAME TO jobs;
)sql";

// Version 6 rebuilds the jobs table for the TIMEOUT state: every job survives, the id counter is kept (the
// newest job, purged before the upgrade, is not handed out again), and a job can then end TIMEOUT and keep
// its time limit, dependencies and rank results.
TEST(SqliteStore, VersionFiveDatabaseGetsTimeoutAndKeepsItsIdCounter) {
  TempDir dir;
  const std::string path = dir.file("state.db");
  FakeClock clock;
  std::vector<Job> jobs;
  {
    auto store = openOrDie(path, clock.fn());
    ASSERT_NE(store, nullptr);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(store->createJob(sampleSpec()).isOk());
    ASSERT_TRUE(store->transition("j-000001", JobState::kCancelled, "user").isOk());
    jobs = *store->listJobs();
  }
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, kVersion5JobsTable, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
    sqlite3_free(err);
    sqlite3_close_v2(db);
  }
  ASSERT_EQ(rawQuery(path, "DELETE FROM jobs WHERE seq = 3"), "<done>");  // purged by the retention
  jobs.pop_back();
  ASSERT_EQ(rawQuery(path, "UPDATE sqlite_sequence SET seq = 3 WHERE name = 'jobs'"), "<done>");
  ASSERT_EQ(rawQuery(path, "ALTER TABLE nodes DROP COLUMN drain_reason"), "<done>");
  for (const char* v7 :
       {"ALTER TABLE job_allocation DROP COLUMN cpus", "ALTER TABLE job_allocation DROP COLUMN memory_bytes",
        "ALTER TABLE nodes DROP COLUMN cpus", "ALTER TABLE nodes DROP COLUMN memory_bytes"})
    ASSERT_EQ(rawQuery(path, v7), "<done>");  // version 7's columns
  ASSERT_EQ(rawQuery(path, "DROP TABLE entries"), "<done>");  // version 8's
  for (const char* v9 :
       {"ALTER TABLE node_gpus DROP COLUMN topology", "ALTER TABLE nodes DROP COLUMN cpu_numa",
        "ALTER TABLE nodes DROP COLUMN gpu_faults"})
    ASSERT_EQ(rawQuery(path, v9), "<done>");  // version 9's
  ASSERT_EQ(rawQuery(path, "UPDATE schema_version SET version = 5"), "<done>");

  auto store = openOrDie(path, clock.fn());
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->schemaVersion(), SqliteStore::kSchemaVersion);
  EXPECT_TRUE(store->integrityCheck().isOk());
  EXPECT_EQ(*store->listJobs(), jobs);
  EXPECT_EQ(*store->lastJobNumber(), 3);
  auto next = store->createJob(sampleSpec());
  ASSERT_TRUE(next.isOk()) << next.status().toString();
  EXPECT_EQ(next->id, "j-000004");

  Job job = *store->getJob("j-000002");
  job.spec.time_limit_s = 3600;
  job.spec.after_ok = {"j-000001"};
  job.spec.after_any = {"j-000004"};
  job.held = true;
  job.waiting_for = {"j-000004"};
  RankResult r;
  r.rank = 1;
  r.attempt = 1;
  r.node = "a";
  r.pid = 10;
  r.program_pid = 11;
  r.exited = true;
  r.signal = 15;
  r.error = "bad \xff byte";  // not UTF-8: stored with a replacement, never refused
  r.figures.seconds = 1.5;
  r.cpu_s = 2.5;
  r.max_rss_bytes = int64_t{1} << 30;
  job.ranks = {r};
  ASSERT_TRUE(applyTransition(job, JobState::kScheduled, "placed", std::nullopt, 1).isOk());
  ASSERT_TRUE(applyTransition(job, JobState::kStarting, "sent", std::nullopt, 2).isOk());
  ASSERT_TRUE(applyTransition(job, JobState::kRunning, "up", std::nullopt, 3).isOk());
  ASSERT_TRUE(applyTransition(job, JobState::kTimeout, "ran past 1h", std::nullopt, 4).isOk());
  Write w;
  w.kind = Write::Kind::kPutJob;
  w.job = job;
  ASSERT_TRUE(store->applyBatch({w}).isOk());
  Job back = *store->getJob("j-000002");
  EXPECT_EQ(back.state, JobState::kTimeout);
  EXPECT_EQ(back.spec.time_limit_s, 3600);
  EXPECT_EQ(back.spec.after_ok, job.spec.after_ok);
  EXPECT_EQ(back.spec.after_any, job.spec.after_any);
  EXPECT_TRUE(back.held);
  EXPECT_EQ(back.waiting_for, job.waiting_for);
  ASSERT_EQ(back.ranks.size(), 1u);
  EXPECT_EQ(back.ranks[0].program_pid, 11);
  EXPECT_EQ(back.ranks[0].signal, 15);
  EXPECT_FALSE(back.ranks[0].exit_code);
  EXPECT_DOUBLE_EQ(back.ranks[0].figures.seconds, 1.5);
  EXPECT_EQ(endedAtMs(back), 4);
  // The attempt's usage, recorded by the move that ended it, with its rank's CPU time and memory.
  ASSERT_EQ(back.attempts.size(), 1u);
  EXPECT_EQ(back.attempts, job.attempts);
  EXPECT_EQ(back.attempts[0].attempt, 1);
  EXPECT_EQ(back.attempts[0].start_ms, 1);
  EXPECT_EQ(back.attempts[0].end_ms, 4);
  EXPECT_DOUBLE_EQ(back.attempts[0].cpu_s, 2.5);
  EXPECT_EQ(back.attempts[0].max_rss_bytes, int64_t{1} << 30);
  EXPECT_EQ(back.attempts[0].end, "TIMEOUT");
}
}  // namespace
}  // namespace ddl::state

namespace ddl::state {
namespace {

// record_codec's size bounds (what a batch's bytes are counted by) are never below what the encoding makes,
// for records at their worst: every optional field, numbers at their widest, free texts that JSON escapes.
TEST(RecordCodec, TheSizeBoundsAreNeverBelowTheEncoding) {
  Job job = newJob("j-000001", sampleSpec(), 1000);
  job.spec.request_id = std::string(128, '-');
  job.spec.array_id = "j-000001";
  job.spec.after_ok = {"j-000002", "j-999999999999"};
  job.waiting_for = job.spec.after_ok;
  job.topology = "4x8x2";
  const std::string controls(200, '\x01');  // six bytes each in JSON
  for (int i = 0; i < 50; ++i) {
    RankResult r;
    r.rank = std::numeric_limits<int>::min();
    r.attempt = std::numeric_limits<int>::max();
    r.node = std::string(63, 'n');
    r.gpu = -1;
    r.pid = std::numeric_limits<int>::max();
    r.program_pid = std::numeric_limits<int>::min();
    r.exited = true;
    r.exit_code = std::numeric_limits<int>::min();
    r.signal = std::numeric_limits<int>::min();
    r.started_ms = std::numeric_limits<int64_t>::min();
    r.exited_ms = std::numeric_limits<int64_t>::min();
    r.error = controls;
    r.figures.collectives = std::numeric_limits<int64_t>::min();
    r.figures.bytes = std::numeric_limits<int64_t>::min();
    r.figures.seconds = -1.2345678901234567e+300;
    r.figures.last_op = controls;
    r.figures.last_bytes = std::numeric_limits<int64_t>::min();
    r.figures.last_us = -9.876543210987654e-300;
    r.figures.last_algo = controls;
    r.figures.dims_us = {-1.2345678901234567e+300, 2.5e-310, 3.0};
    r.figures.world_size = std::numeric_limits<int>::min();
    r.figures.updated_ms = std::numeric_limits<int64_t>::min();
    r.cpu_s = -1.2345678901234567e+300;
    r.max_rss_bytes = std::numeric_limits<int64_t>::min();
    job.ranks.push_back(r);
  }
  for (size_t i = 0; i < kMaxAttemptsKept; ++i) {
    const int64_t lo = std::numeric_limits<int64_t>::min();
    job.attempts.push_back(AttemptUsage{std::numeric_limits<int>::min(), lo, lo,
                                        std::numeric_limits<int>::min(), -1.2345678901234567e+300,
                                        -1.2345678901234567e+300, lo, "CANCELLED"});
  }
  for (int i = 0; i < 20; ++i) {
    Transition t;
    t.reason = controls;
    t.failure = Failure{std::numeric_limits<int>::min(), std::string(63, 'h'),
                        std::numeric_limits<int>::min(), std::nullopt};
    job.transitions.push_back(t);
  }
  job.allocation = {{std::string(63, 'a'), {0, 1, 2, 3, 4, 5, 6, 7}, std::vector<int>(64, 1 << 30), -1}};
  job.failure = Failure{1, std::string(63, 'h'), std::nullopt, 9};
  job.spec.min_nodes = std::numeric_limits<int>::min();
  job.spec.min_gpus = std::numeric_limits<int>::min();
  job.elastic_gpu_s = -1.2345678901234567e+300;
  EXPECT_GE(record_codec::jobBytesBound(job), record_codec::encodeJob(job).size());
  const Job plain = newJob("j-000002", sampleSpec(), 1000);
  EXPECT_GE(record_codec::jobBytesBound(plain), record_codec::encodeJob(plain).size());
  NodeRecord node = sampleNode("n1", 8);
  node.drain_reason = std::string(256, 'd');
  node.cpus = std::vector<int>(256, 1 << 30);
  node.last_heartbeat_ms = std::numeric_limits<int64_t>::min();
  EXPECT_GE(record_codec::nodeBytesBound(node), record_codec::encodeNode(node).size());
}

}  // namespace
}  // namespace ddl::state
