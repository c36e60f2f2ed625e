// Tests of ddlctl with no coordinator: the argument checks and formatters are called directly on hand-built
// Job and Node messages, and runDdlctl() runs either against nothing (an unreachable address) or against an
// in-process fake UserService on a free loopback port, so exit statuses, stdout and stderr are checked the
// way a script sees them. The fake answers from fixed data and records the last request it got.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddl/v1/ddl.grpc.pb.h"
#include "ddlctl.h"
#include "gtest/gtest.h"

namespace {

using namespace ddl;
using namespace ddl::cli;

constexpr int64_t kNow = 1'700'000'000'000;  // 2023-11-14 22:13:20 UTC

struct Result {
  int rc = -1;
  std::string out;
  std::string err;
};

// Runs ddlctl with `args` (no argv[0]) and captures what it prints. Plaintext (--insecure): these are unit tests
// of the command line against loopback; ddlctl_test and security_test cover TLS.
Result ddlctl(std::vector<std::string> args, bool insecure = true) {
  if (insecure) args.insert(args.begin(), "--insecure");
  args.insert(args.begin(), "ddlctl");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::ostringstream out, err;
  Result r;
  r.rc = runDdlctl(static_cast<int>(args.size()), argv.data(), out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

v1::Job makeJob(const std::string& id, const std::string& name, const std::string& user, v1::JobState state,
                int64_t submitMs) {
  v1::Job job;
  job.set_id(id);
  job.mutable_spec()->set_name(name);
  job.mutable_spec()->set_user(user);
  job.set_state(state);
  job.set_submit_ms(submitMs);
  return job;
}

void allocate(v1::Job* job, const std::string& node, std::vector<int> gpus) {
  v1::NodeAllocation* a = job->add_allocation();
  a->set_node(node);
  for (int g : gpus) a->add_gpus(g);
}

v1::ListJobsResponse sampleJobs() {
  v1::ListJobsResponse resp;
  v1::Job* running = resp.add_jobs();
  *running = makeJob("j-000001", "train", "alice", v1::RUNNING, kNow - 125'000);
  running->mutable_spec()->set_nodes(2);
  running->mutable_spec()->set_gpus_per_node(2);
  running->set_gpus(4);
  allocate(running, "n1", {0, 1});
  allocate(running, "n2", {0, 1});
  v1::Job* pending = resp.add_jobs();
  *pending = makeJob("j-000002", "eval", "bob", v1::PENDING, kNow - 5'000);
  pending->mutable_spec()->set_total_gpus(6);
  pending->set_gpus(6);
  pending->set_reason("waiting for 6 free GPUs");
  v1::Job* failed = resp.add_jobs();
  *failed = makeJob("j-000003", "bad", "alice", v1::FAILED, kNow - 3 * 3'600'000 - 59'000);
  failed->mutable_spec()->set_total_gpus(1);
  allocate(failed, "n3", {0});
  failed->set_reason("rank 0 on n3 exited with code 1");
  return resp;
}

v1::ListNodesResponse sampleNodes() {
  v1::ListNodesResponse resp;
  v1::Node* n1 = resp.add_nodes();
  n1->set_name("n1");
  n1->set_state("UP");
  n1->set_address("10.0.0.1");
  for (int i = 0; i < 4; ++i) n1->add_gpus()->set_index(i);
  n1->add_gpus_used(0);
  n1->add_gpus_used(1);
  (*n1->mutable_labels())["switch"] = "s1";
  (*n1->mutable_labels())["rack"] = "r1";
  n1->set_last_heartbeat_ms(kNow - 2'000);
  n1->add_jobs("j-000001");
  v1::Node* n2 = resp.add_nodes();
  n2->set_name("n2");
  n2->set_state("DRAINING");
  n2->set_address("10.0.0.2");
  for (int i = 0; i < 4; ++i) n2->add_gpus()->set_index(i);
  return resp;
}

// The value after "Key:" on the line of formatJobDetail() that starts with it; "" if there is none.
std::string field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      size_t start = line.find_first_not_of(' ', key.size() + 1);
      return start == std::string::npos ? "" : line.substr(start);
    }
  }
  return "";
}

// ---- Pure parts -------------------------------------------------------------------------------------------

TEST(DdlctlFormat, Age) {
  EXPECT_EQ(formatAge(-5), "0s");
  EXPECT_EQ(formatAge(0), "0s");
  EXPECT_EQ(formatAge(5'999), "5s");
  EXPECT_EQ(formatAge(59'999), "59s");
  EXPECT_EQ(formatAge(60'000), "1m");
  EXPECT_EQ(formatAge(3 * 60'000 + 59'000), "3m");
  EXPECT_EQ(formatAge(2 * 3'600'000 + 1), "2h");
  EXPECT_EQ(formatAge(23 * 3'600'000 + 3'599'999), "23h");
  EXPECT_EQ(formatAge(4 * 86'400'000 + 5), "4d");
}

TEST(DdlctlFormat, Duration) {
  EXPECT_EQ(formatDuration(850), "850ms");
  EXPECT_EQ(formatDuration(12'345), "12.3s");
  EXPECT_EQ(formatDuration(5 * 60'000 + 7'000), "5m07s");
  EXPECT_EQ(formatDuration(2 * 3'600'000 + 3 * 60'000), "2h03m");
  EXPECT_EQ(formatDuration(3 * 86'400'000 + 4 * 3'600'000), "3d04h");
}

TEST(DdlctlFormat, SignalsFailuresAndRequests) {
  EXPECT_EQ(signalName(9), "SIGKILL");
  EXPECT_EQ(signalName(15), "SIGTERM");
  EXPECT_EQ(signalName(77), "signal 77");
  v1::Failure f;
  f.set_rank(3);
  f.set_host("n2");
  f.set_signal(9);
  EXPECT_EQ(describeFailure(f), "rank 3 on n2: killed by SIGKILL");
  f.clear_signal();
  f.set_exit_code(0);  // an explicit 0 is still reported: presence, not value, says which one it was
  EXPECT_EQ(describeFailure(f), "rank 3 on n2: exit code 0");
  v1::JobSpec spec;
  spec.set_nodes(2);
  spec.set_gpus_per_node(4);
  EXPECT_EQ(describeRequest(spec), "2 nodes x 4 GPUs");
  spec.set_nodes(1);
  spec.set_gpus_per_node(1);
  EXPECT_EQ(describeRequest(spec), "1 node x 1 GPU");
  EXPECT_EQ(describeRequest(v1::JobSpec()), "0 GPUs");
  EXPECT_EQ(shellJoin({"python", "-c", "print('hi there')", "--lr=0.1", ""}),
            "python -c 'print('\\''hi there'\\'')' --lr=0.1 ''");
}

TEST(DdlctlFormat, States) {
  auto s = parseStates({"running", "Pending,FAILED", " cancelled ", "RUNNING,"});
  ASSERT_TRUE(s.ok()) << s.error;
  EXPECT_EQ(*s.value, (std::vector<v1::JobState>{v1::RUNNING, v1::PENDING, v1::FAILED, v1::CANCELLED}));
  EXPECT_TRUE(parseStates({}).value->empty());
  auto bad = parseStates({"running,runing"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(
      bad.error,
      "unknown job state 'runing'; valid states: PENDING, SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED, "
      "CANCELLED");
  EXPECT_FALSE(parseStates({"job_state_unspecified"}).ok());
}

TEST(DdlctlFormat, CoordinatorAddress) {
  for (const char* ok : {"127.0.0.1:7070", "head-node:1", "[::1]:7070", "ctl.example.org:65535"}) {
    EXPECT_EQ(checkCoordinatorAddress(ok), "") << ok;
  }
  struct Case {
    const char* address;
    const char* why;
  };
  for (Case c :
       {Case{"", "empty"}, Case{"head", "no port"}, Case{"head:", "no port"}, Case{":7070", "no host"},
        Case{"head:0", "port 0 is out of range 1-65535"}, Case{"head:70000", "out of range"},
        Case{"head:7o70", "is not a number"}, Case{"::1:7070", "brackets"}, Case{"[::1]", "no port"},
        Case{"http://head:7070", "scheme"}}) {
    std::string why = checkCoordinatorAddress(c.address);
    EXPECT_NE(why.find(c.why), std::string::npos) << c.address << " -> " << why;
    EXPECT_NE(why.find("expected HOST:PORT"), std::string::npos) << why;
  }
}

TEST(DdlctlFormat, JobSpec) {
  SubmitArgs a;
  a.command = {"/usr/bin/python3", "train.py"};
  a.nodes = 2;
  a.user = "alice";
  a.workdir = "/tmp";
  a.env = {"A=1", "EMPTY="};
  a.labels = {"gpu=a100"};
  auto spec = buildJobSpec(a);
  ASSERT_TRUE(spec.ok()) << spec.error;
  EXPECT_EQ(spec.value->name(), "python3");
  EXPECT_EQ(spec.value->nodes(), 2);
  EXPECT_EQ(spec.value->gpus_per_node(), 1);  // --nodes alone: one GPU per node, as documented
  EXPECT_EQ(spec.value->total_gpus(), 0);
  EXPECT_EQ(spec.value->env_size(), 2);
  EXPECT_EQ(spec.value->required_labels().at("gpu"), "a100");

  SubmitArgs total = a;
  total.nodes.reset();
  total.gpus = 6;
  total.name = "big";
  total.topology = "3x2";
  spec = buildJobSpec(total);
  ASSERT_TRUE(spec.ok()) << spec.error;
  EXPECT_EQ(spec.value->total_gpus(), 6);
  EXPECT_EQ(spec.value->nodes(), 0);
  EXPECT_EQ(spec.value->name(), "big");

  auto error = [&](auto edit) {
    SubmitArgs b = a;
    edit(b);
    auto r = buildJobSpec(b);
    EXPECT_FALSE(r.ok());
    return r.error;
  };
  EXPECT_NE(error([](SubmitArgs& b) { b.command.clear(); }).find("needs a command after --"),
            std::string::npos);
  EXPECT_EQ(error([](SubmitArgs& b) { b.nodes = 0; }), "--nodes must be at least 1, got 0");
  EXPECT_EQ(error([](SubmitArgs& b) { b.gpusPerNode = -2; }), "--gpus-per-node must be at least 1, got -2");
  EXPECT_NE(error([](SubmitArgs& b) { b.gpus = 4; }).find("cannot be combined"), std::string::npos);
  EXPECT_NE(error([](SubmitArgs& b) {
              b.nodes.reset();
              b.gpus = 4;
              b.gpusPerNode = 2;
            }).find("cannot be combined"),
            std::string::npos);
  EXPECT_NE(error([](SubmitArgs& b) { b.nodes.reset(); }).find("say how many GPUs"), std::string::npos);
  EXPECT_NE(error([](SubmitArgs& b) {
              b.nodes.reset();
              b.gpusPerNode = 2;
            }).find("--gpus-per-node needs --nodes"),
            std::string::npos);
  EXPECT_EQ(error([](SubmitArgs& b) { b.env.push_back("NOEQUALS"); }), "--env 'NOEQUALS' is not KEY=VALUE");
  EXPECT_EQ(error([](SubmitArgs& b) { b.env.push_back("=x"); }), "--env '=x' is not KEY=VALUE");
  EXPECT_EQ(error([](SubmitArgs& b) { b.labels.push_back("rack"); }), "--label 'rack' is not KEY=VALUE");
  EXPECT_EQ(error([](SubmitArgs& b) { b.labels.push_back("gpu=h100"); }), "--label gpu given twice");
  EXPECT_EQ(error([](SubmitArgs& b) { b.maxRestarts = -1; }), "--max-restarts must be 0 or more, got -1");
  for (const char* topology : {"4*2", "4x", "x4", "4x0", "a"}) {
    EXPECT_NE(error([&](SubmitArgs& b) { b.topology = topology; }).find("like 4x2"), std::string::npos);
  }
}

TEST(DdlctlFormat, RpcErrors) {
  RpcError e =
      describeRpcError(grpc::StatusCode::UNAVAILABLE,
                       "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7070: "
                       "Failed to connect to remote host: Connection refused",
                       "127.0.0.1:7070", 10);
  EXPECT_EQ(e.exitCode, kExitUnreachable);
  EXPECT_EQ(e.message, "cannot reach coordinator at 127.0.0.1:7070: connection refused");
  EXPECT_EQ(e.hint, "is ddl-coordinator running? set --coordinator or DDL_COORDINATOR");
  e = describeRpcError(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded", "h:1", 10);
  EXPECT_EQ(e.exitCode, kExitUnreachable);
  EXPECT_EQ(e.message, "cannot reach coordinator at h:1: no answer within 10 s");
  e = describeRpcError(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down", "h:1", 2.5);
  EXPECT_EQ(e.message, "cannot reach coordinator at h:1: coordinator shutting down");
  e = describeRpcError(grpc::StatusCode::NOT_FOUND, "job j-000404 not found", "h:1", 10);
  EXPECT_EQ(e.exitCode, kExitRefused);
  EXPECT_EQ(e.message, "job j-000404 not found");
  EXPECT_EQ(e.hint, "");
  EXPECT_EQ(describeRpcError(grpc::StatusCode::FAILED_PRECONDITION, "", "h:1", 10).exitCode, kExitRefused);
}

TEST(DdlctlFormat, JobTable) {
  EXPECT_EQ(formatJobTable(sampleJobs(), kNow),
            "ID        NAME   USER   STATE    AGE  NODES  GPUS  NODELIST(REASON)\n"
            "j-000001  train  alice  RUNNING  2m   2      4     n1,n2\n"
            "j-000002  eval   bob    PENDING  5s   -      6     (waiting for 6 free GPUs)\n"
            "j-000003  bad    alice  FAILED   3h   1      1     (rank 0 on n3 exited with code 1)\n");
  EXPECT_EQ(formatJobTable(v1::ListJobsResponse(), kNow),
            "ID  NAME  USER  STATE  AGE  NODES  GPUS  NODELIST(REASON)\n");
}

// Control characters from the server never reach the terminal raw; printable UTF-8 passes unchanged. Fails
// without escapeForTerminal() in the table renderer (the newline and ESC were printed as they came).
TEST(DdlctlFormat, ControlCharactersAreEscaped) {
  EXPECT_EQ(escapeForTerminal("plain name-1.2_x"), "plain name-1.2_x");
  EXPECT_EQ(escapeForTerminal("a\nb\tc\rd"), "a\\nb\\tc\\rd");
  EXPECT_EQ(escapeForTerminal("\x1b[2Jgone"), "\\x1b[2Jgone");
  EXPECT_EQ(escapeForTerminal(std::string("nul\0del\x7f", 8)), "nul\\x00del\\x7f");
  EXPECT_EQ(escapeForTerminal("c1\xc2\x9b"
                              "31m"),
            "c1\\u009b31m");  // CSI as UTF-8
  EXPECT_EQ(escapeForTerminal("raw\x9b"
                              "31m\xff"),
            "raw\\x9b31m\\xff");  // bytes that are not UTF-8
  EXPECT_EQ(escapeForTerminal("bidi\xe2\x80\xae"
                              "evil"),
            "bidi\\u202eevil");  // right-to-left override
  EXPECT_EQ(escapeForTerminal("r\xc3\xa9sum\xc3\xa9 \xe6\x97\xa5\xf0\x9f\x98\x80"),
            "r\xc3\xa9sum\xc3\xa9 \xe6\x97\xa5\xf0\x9f\x98\x80");  // é, 日 and an emoji are kept
  EXPECT_EQ(escapeForTerminal("\xc0\xaf\xed\xa0\x80"), "\\xc0\\xaf\\xed\\xa0\\x80");  // overlong, surrogate
  EXPECT_EQ(escapeForTerminal("\xe6\x97"), "\\xe6\\x97");                             // cut short
  const std::string once = escapeForTerminal("a\n\x1b\xc2\x85z");
  EXPECT_EQ(escapeForTerminal(once), once) << "escaping is idempotent, so a cell may be escaped twice";

  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = makeJob("j-000001", "evil\n\x1b]0;pwned\x07", "bob\r", v1::PENDING, kNow);
  jobs.mutable_jobs(0)->set_reason("waiting\nfor GPUs");
  const std::string table = formatJobTable(jobs, kNow);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 2) << table;  // header and one row
  EXPECT_EQ(table.find('\x1b'), std::string::npos) << table;
  EXPECT_NE(table.find("evil\\n\\x1b]0;pwned\\x07"), std::string::npos) << table;
  EXPECT_NE(table.find("bob\\r"), std::string::npos) << table;
  EXPECT_NE(table.find("(waiting\\nfor GPUs)"), std::string::npos) << table;

  v1::ListNodesResponse nodes;
  v1::Node* n = nodes.add_nodes();
  n->set_name("n\x1b[31m1");
  n->set_state("UP");
  (*n->mutable_labels())["rack"] = "r\n1";
  const std::string nodeTable = formatNodeTable(nodes, kNow);
  EXPECT_EQ(nodeTable.find('\x1b'), std::string::npos) << nodeTable;
  EXPECT_NE(nodeTable.find("n\\x1b[31m1"), std::string::npos) << nodeTable;
  EXPECT_NE(nodeTable.find("rack=r\\n1"), std::string::npos) << nodeTable;

  v1::Job detail = makeJob("j-000001", "x\ny", "u", v1::RUNNING, kNow);
  detail.mutable_spec()->add_command("python");
  detail.mutable_spec()->add_command(
      "a\x1b"
      "b");
  const std::string text = formatJobDetail(detail, kNow);
  EXPECT_EQ(text.find('\x1b'), std::string::npos) << text;
  EXPECT_EQ(field(text, "Name"), "x\\ny");
}

// A 100 KB name takes at most kMaxNameColumn characters of its column, so it pads no other row. Fails without
// the cut (every row was padded to the long name's width).
TEST(DdlctlFormat, LongValuesAreTruncatedInTables) {
  EXPECT_EQ(truncateCell("short", 10), "short");
  EXPECT_EQ(truncateCell("exactly10!", 10), "exactly10!");
  EXPECT_EQ(truncateCell("abcdefghijk", 10), "abcdefghi\u2026");
  EXPECT_EQ(truncateCell("\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9", 3),
            "\xc3\xa9\xc3\xa9\u2026");  // cut between characters
  v1::ListJobsResponse jobs = sampleJobs();
  jobs.mutable_jobs(1)->mutable_spec()->set_name(std::string(100'000, 'n'));
  jobs.mutable_jobs(2)->set_reason(std::string(100'000, 'r'));
  const std::string table = formatJobTable(jobs, kNow);
  std::istringstream in(table);
  std::string line;
  while (std::getline(in, line)) EXPECT_LT(line.size(), 220u) << line.substr(0, 200);
  EXPECT_NE(table.find(std::string(kMaxNameColumn - 1, 'n') + "\u2026"), std::string::npos);
  EXPECT_NE(table.find("(" + std::string(kMaxWideColumn - 2, 'r') + "\u2026"), std::string::npos);

  // Pages printed one by one: the header once, widths never shrink.
  JobTableWriter writer;
  v1::ListJobsResponse first, second;
  *first.add_jobs() = makeJob("j-000001", "a-long-name", "alice", v1::RUNNING, kNow);
  *second.add_jobs() = makeJob("j-000002", "b", "bob", v1::RUNNING, kNow);
  const std::string p1 = writer.page(first, kNow), p2 = writer.page(second, kNow);
  EXPECT_EQ(p1.rfind("ID        NAME         USER   STATE", 0), 0u) << p1;
  EXPECT_EQ(p2.rfind("j-000002  b            bob    RUNNING", 0), 0u) << p2;
}

// --since / --until: local dates and times, and ages before now.
TEST(DdlctlFormat, TimeBounds) {
  EXPECT_EQ(parseTimeBound("90s", kNow).value, kNow - 90'000);
  EXPECT_EQ(parseTimeBound("30m", kNow).value, kNow - 30 * 60'000);
  EXPECT_EQ(parseTimeBound("1h", kNow).value, kNow - 3'600'000);
  EXPECT_EQ(parseTimeBound("2d", kNow).value, kNow - 2 * 86'400'000);
  EXPECT_EQ(parseTimeBound("1w", kNow).value, kNow - 7 * 86'400'000LL);
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 10;
  tm.tm_mday = 24;
  tm.tm_isdst = -1;
  const int64_t midnight = static_cast<int64_t>(std::mktime(&tm)) * 1000;
  EXPECT_EQ(parseTimeBound("2026-11-24", kNow).value, midnight);
  EXPECT_EQ(parseTimeBound("2026-11-24T10:00", kNow).value, midnight + 10 * 3'600'000);
  EXPECT_EQ(parseTimeBound("2026-11-24 10:00:05", kNow).value, midnight + 10 * 3'600'000 + 5'000);
  for (const char* bad :
       {"", "yesterday", "1y", "h", "-1h", "2026-13-01", "2026-02-30", "2026-11-24T25:00", "2026-11-24T10",
        "2026-11-24T10:00:", "2026-11-24x", "26-11-24", "1969-12-31", "99999999999h", "1h\n"}) {
    Parsed<int64_t> p = parseTimeBound(bad, kNow);
    EXPECT_FALSE(p.ok()) << bad;
    EXPECT_NE(p.error.find("is not a time"), std::string::npos) << bad << ": " << p.error;
  }
}

TEST(DdlctlFormat, NodeListOrReason) {
  v1::Job job = makeJob("j-1", "x", "u", v1::PENDING, kNow);
  EXPECT_EQ(nodeListOrReason(job), "(queued)");
  job.set_state(v1::SUCCEEDED);
  allocate(&job, "a", {0});
  allocate(&job, "b", {1});
  job.set_reason("all ranks exited 0");
  EXPECT_EQ(nodeListOrReason(job), "a,b");  // only FAILED (and PENDING) show their reason over the nodes
  job.clear_allocation();
  job.set_state(v1::CANCELLED);
  job.set_reason("cancelled by alice");
  EXPECT_EQ(nodeListOrReason(job), "(cancelled by alice)");  // nothing else to show
}

TEST(DdlctlFormat, NodeTable) {
  EXPECT_EQ(formatNodeTable(sampleNodes(), kNow),
            "NAME  STATE     GPUS  ADDRESS   LABELS             HEARTBEAT  JOBS\n"
            "n1    UP        2/4   10.0.0.1  rack=r1,switch=s1  2s         j-000001\n"
            "n2    DRAINING  0/4   10.0.0.2  -                  never      -\n");
}

TEST(DdlctlFormat, NodeTableSaysWhenADownNodeIsDrained) {
  v1::ListNodesResponse nodes = sampleNodes();
  nodes.mutable_nodes(1)->set_state("DOWN");
  nodes.mutable_nodes(1)->set_drained(true);
  v1::Node* n3 = nodes.add_nodes();
  n3->set_name("n3");
  n3->set_state("DOWN");
  EXPECT_EQ(formatNodeTable(nodes, kNow),
            "NAME  STATE           GPUS  ADDRESS   LABELS             HEARTBEAT  JOBS\n"
            "n1    UP              2/4   10.0.0.1  rack=r1,switch=s1  2s         j-000001\n"
            "n2    DOWN (drained)  0/4   10.0.0.2  -                  never      -\n"
            "n3    DOWN            0/0   -         -                  never      -\n");
}

TEST(DdlctlFormat, JobDetail) {
  const char* tz = getenv("TZ");
  const std::string savedTz = tz != nullptr ? tz : "";
  setenv("TZ", "UTC", 1);  // local time, made the same on every machine
  tzset();
  const int64_t t0 = kNow - 100'000;
  v1::Job job = makeJob("j-000009", "train", "alice", v1::FAILED, t0);
  v1::JobSpec* spec = job.mutable_spec();
  spec->set_nodes(2);
  spec->set_gpus_per_node(2);
  spec->set_max_restarts(1);
  spec->set_workdir("/home/alice");
  for (const char* w : {"python", "train.py", "--name", "my run"}) spec->add_command(w);
  allocate(&job, "n1", {0, 1});
  allocate(&job, "n2", {2, 3});
  job.set_topology("2x2");
  job.set_reason("rank 3 on n2 was killed by SIGKILL");
  job.mutable_failure()->set_rank(3);
  job.mutable_failure()->set_host("n2");
  job.mutable_failure()->set_signal(9);
  struct Step {
    v1::JobState from, to;
    int64_t atMs;
    const char* reason;
  };
  for (Step s :
       {Step{v1::JOB_STATE_UNSPECIFIED, v1::PENDING, t0, "submitted"},
        Step{v1::PENDING, v1::SCHEDULED, t0 + 1'500, "placed on n1[0,1] n2[2,3]"},
        Step{v1::SCHEDULED, v1::STARTING, t0 + 1'600, ""}, Step{v1::STARTING, v1::RUNNING, t0 + 2'000, ""},
        Step{v1::RUNNING, v1::FAILED, t0 + 62'000, "rank 3 failed"}}) {
    v1::Transition* t = job.add_transitions();
    t->set_from(s.from);
    t->set_to(s.to);
    t->set_at_ms(s.atMs);
    t->set_reason(s.reason);
  }
  *job.mutable_transitions(4)->mutable_failure() = job.failure();

  std::string text = formatJobDetail(job, kNow);
  EXPECT_EQ(field(text, "Job"), "j-000009");
  EXPECT_EQ(field(text, "State"), "FAILED");
  EXPECT_EQ(field(text, "Command"), "python train.py --name 'my run'");
  EXPECT_EQ(field(text, "Request"), "2 nodes x 2 GPUs (4 GPUs)");
  EXPECT_EQ(field(text, "Topology"), "2x2");
  EXPECT_EQ(field(text, "Allocation"), "n1[0,1] n2[2,3]");
  EXPECT_EQ(field(text, "Restarts"), "0 of 1 allowed");
  EXPECT_EQ(field(text, "Failure"), "rank 3 on n2: killed by SIGKILL");
  EXPECT_EQ(field(text, "Submitted"), "2023-11-14 22:11:40.000 (1m ago)");
  EXPECT_EQ(field(text, "Queued"), "1.5s");
  EXPECT_EQ(field(text, "Running"), "1m00s");  // a final job's time stops at its last transition
  EXPECT_NE(text.find("  2023-11-14 22:11:41.500  PENDING -> SCHEDULED   placed on n1[0,1] n2[2,3]\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("RUNNING -> FAILED      rank 3 failed [rank 3 on n2: killed by SIGKILL]\n"),
            std::string::npos)
      << text;

  // A live job's current state runs until now.
  job.set_state(v1::RUNNING);
  job.mutable_transitions()->RemoveLast();
  EXPECT_EQ(field(formatJobDetail(job, kNow), "Running"), "1m38s");
  if (tz != nullptr) {
    setenv("TZ", savedTz.c_str(), 1);
  } else {
    unsetenv("TZ");
  }
  tzset();
}

TEST(DdlctlFormat, JsonKeepsProtoNamesAndDefaults) {
  v1::Job job = makeJob("j-000001", "train", "alice", v1::PENDING, kNow);
  std::string json = toJson(job);
  EXPECT_EQ(json.back(), '\n');
  EXPECT_NE(json.find("\"submit_ms\":"), std::string::npos) << json;
  EXPECT_NE(json.find("\"max_restarts\":0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"state\":\"PENDING\""), std::string::npos) << json;
}

// ---- The command line, no server --------------------------------------------------------------------------

TEST(DdlctlCli, UsageErrorsExit2WithoutSending) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{}, "say what to do: submit, list"},
      {{"frobnicate"}, "unknown verb 'frobnicate'; use one of: submit, list"},
      {{"submit", "--gpus", "2"}, "submit needs a command after --"},
      {{"submit", "--gpus", "2", "--"}, "submit needs a command after --"},
      {{"submit", "--gpus", "2", "python", "x.py"}, "put the job's command after --"},
      {{"submit", "--nodes", "0", "--", "true"}, "--nodes must be at least 1, got 0"},
      {{"submit", "--gpus", "-1", "--", "true"}, "--gpus must be at least 1"},
      {{"submit", "--gpus", "two", "--", "true"}, "--gpus"},
      {{"submit", "--gpus", "2", "--nodes", "1", "--", "true"}, "cannot be combined"},
      {{"submit", "--gpus", "2", "--env", "FOO", "--", "true"}, "--env 'FOO' is not KEY=VALUE"},
      {{"submit", "--", "true"}, "say how many GPUs"},
      {{"list", "--state", "runing"}, "valid states: PENDING, SCHEDULED"},
      {{"list", "--all", "--state", "running"}, "--state excludes --all"},
      {{"list", "--", "x"}, "only submit takes a command after --"},
      {{"status"}, "JOB is required"},
      {{"drain"}, "NODE is required"},
      {{"-o", "yaml", "list"}, "yaml"},
      {{"--timeout", "0", "list"}, "--timeout must be a positive number of seconds"},
      {{"--coordinator", "head", "list"}, "invalid coordinator address 'head': no port"},
      {{"--coordinator", "head:99999", "nodes"}, "out of range"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--coordinator", "127.0.0.1:1"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    Result r = ddlctl(args);
    std::string shown;
    for (const std::string& a : c.args) shown += a + " ";
    EXPECT_EQ(r.rc, kExitUsage) << shown << r.err;
    EXPECT_EQ(r.out, "") << shown;
    EXPECT_EQ(r.err.rfind("ddlctl: ", 0), 0u) << shown << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << shown << "\n" << r.err;
  }
}

TEST(DdlctlCli, SecurityMistakesAreUsageErrors) {
  // Plaintext only toward loopback.
  Result r = ddlctl({"--coordinator", "198.18.0.1:7070", "nodes"});
  EXPECT_EQ(r.rc, kExitUsage) << r.err;
  EXPECT_NE(r.err.find("only on a loopback address"), std::string::npos) << r.err;
  // TLS needs the CA; a missing one is named before anything is sent.
  r = ddlctl({"--coordinator", "127.0.0.1:1", "--ca", "/nonexistent/ca.crt", "nodes"}, /*insecure=*/false);
  EXPECT_EQ(r.rc, kExitUsage) << r.err;
  EXPECT_NE(r.err.find("no CA certificate at /nonexistent/ca.crt"), std::string::npos) << r.err;
  // A token file that cannot be read is not silently replaced by no token.
  r = ddlctl({"--coordinator", "127.0.0.1:1", "--token-file", "/nonexistent/token", "nodes"});
  EXPECT_EQ(r.rc, kExitUsage) << r.err;
  EXPECT_NE(r.err.find("cannot read the token file /nonexistent/token"), std::string::npos) << r.err;
}

TEST(DdlctlCli, RefusalsHaveTheirOwnExitCodes) {
  RpcError e = describeRpcError(grpc::StatusCode::UNAUTHENTICATED, "no token: ...", "h:1", 10);
  EXPECT_EQ(e.exitCode, kExitUnauthenticated);
  EXPECT_EQ(e.message, "no token: ...");
  e = describeRpcError(grpc::StatusCode::PERMISSION_DENIED, "job j-1 belongs to bob", "h:1", 10);
  EXPECT_EQ(e.exitCode, kExitDenied);
  e = describeRpcError(grpc::StatusCode::UNAVAILABLE,
                       "failed to connect to all addresses; last error: UNKNOWN: Tls handshake failed", "h:1", 10);
  EXPECT_EQ(e.exitCode, kExitUnreachable);
  EXPECT_NE(e.message.find("the TLS handshake failed"), std::string::npos) << e.message;
  EXPECT_NE(e.hint.find("--ca"), std::string::npos) << e.hint;
}

TEST(DdlctlCli, HelpDocumentsExitStatuses) {
  Result r = ddlctl({"--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("3  cannot reach the coordinator"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4  not authenticated"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("5  permission denied"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DDL_TOKEN"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DDL_COORDINATOR"), std::string::npos);
  r = ddlctl({"submit", "--help"});
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("--gpus-per-node"), std::string::npos) << r.out;
  // After "--" a --help belongs to the job's command.
  r = ddlctl(
      {"--coordinator", "127.0.0.1:1", "--timeout", "2", "submit", "--gpus", "1", "--", "prog", "--help"});
  EXPECT_EQ(r.rc, kExitUnreachable) << r.err;
}

TEST(DdlctlCli, UnreachableCoordinatorExits3Quickly) {
  auto start = std::chrono::steady_clock::now();
  Result r = ddlctl({"--coordinator", "127.0.0.1:1", "--timeout", "2", "list"});
  auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(r.rc, kExitUnreachable);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "ddlctl: cannot reach coordinator at 127.0.0.1:1: connection refused\n"
            "hint: is ddl-coordinator running? set --coordinator or DDL_COORDINATOR\n");
  // Refused connections fail at once; taking the whole deadline would mean we waited for nothing.
  EXPECT_LT(elapsed, std::chrono::seconds(2));
}

TEST(DdlctlCli, CoordinatorFromEnvironment) {
  setenv("DDL_COORDINATOR", "127.0.0.1:1", 1);
  Result r = ddlctl({"--timeout", "2", "nodes"});
  EXPECT_EQ(r.rc, kExitUnreachable);
  EXPECT_NE(r.err.find("at 127.0.0.1:1:"), std::string::npos) << r.err;
  r = ddlctl({"--coordinator", "127.0.0.1:2", "--timeout", "2", "nodes"});  // the flag wins
  EXPECT_NE(r.err.find("at 127.0.0.1:2:"), std::string::npos) << r.err;
  setenv("DDL_COORDINATOR", "nohost", 1);
  r = ddlctl({"nodes"});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find("(from DDL_COORDINATOR)"), std::string::npos) << r.err;
  unsetenv("DDL_COORDINATOR");
}

// ---- The command line against a fake coordinator ----------------------------------------------------------

class FakeUserService final : public v1::UserService::Service {
 public:
  grpc::Status Submit(grpc::ServerContext*, const v1::SubmitRequest* req, v1::SubmitResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    lastSpec_ = req->spec();
    v1::Job* job = resp->mutable_job();
    *job = makeJob("j-000007", req->spec().name(), req->spec().user(), v1::PENDING, kNow);
    *job->mutable_spec() = req->spec();
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::Job* resp) override {
    if (req->id() == "j-slow") {  // answers only after the client gave up
      for (int i = 0; i < 500 && !ctx->IsCancelled(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return grpc::Status(grpc::StatusCode::INTERNAL, "too late");
    }
    if (req->id() != "j-000001") return {grpc::StatusCode::NOT_FOUND, "job " + req->id() + " not found"};
    *resp = sampleJobs().jobs(0);
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* req,
                        v1::ListJobsResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    lastList_ = *req;
    listCalls_++;
    if (!paging_) {  // one page and no token, as before paging
      *resp = sampleJobs();
      return grpc::Status::OK;
    }
    pageTokens_.push_back(req->page_token());
    if (endless_) {  // a coordinator that never says "last page"
      resp->set_next_page_token("t" + std::to_string(listCalls_));
      return grpc::Status::OK;
    }
    size_t offset = req->page_token().empty() ? 0 : std::stoul(req->page_token());
    size_t size = req->page_size() > 0 ? static_cast<size_t>(req->page_size()) : 500;
    for (size_t i = offset; i < pagedJobs_.size() && i < offset + size; ++i)
      *resp->add_jobs() = pagedJobs_[i];
    if (offset + size < pagedJobs_.size()) resp->set_next_page_token(std::to_string(offset + size));
    if (stuckToken_ && !req->page_token().empty()) resp->set_next_page_token(req->page_token());
    return grpc::Status::OK;
  }
  grpc::Status RemoveNode(grpc::ServerContext* ctx, const v1::RemoveNodeRequest* req,
                          v1::RemoveNodeResponse* resp) override {
    if (req->node() == "gone") return grpc::Status::OK;
    if (req->node() == "n1")
      return {grpc::StatusCode::FAILED_PRECONDITION, "node n1 is UP; only a DOWN node can be removed"};
    return v1::UserService::Service::RemoveNode(ctx, req, resp);  // UNIMPLEMENTED, as before the server side
  }

  // Switches ListJobs to pages over `jobs` (page_size, default 500, tokens are offsets).
  void page(std::vector<v1::Job> jobs, bool endless = false, bool stuckToken = false) {
    std::lock_guard<std::mutex> lock(mu_);
    pagedJobs_ = std::move(jobs);
    endless_ = endless;
    stuckToken_ = stuckToken;
    pageTokens_.clear();
    listCalls_ = 0;
    paging_ = true;
  }
  std::vector<std::string> pageTokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return pageTokens_;
  }
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* req, v1::Job* resp) override {
    if (req->id() != "j-000001") {
      return {grpc::StatusCode::FAILED_PRECONDITION, "job " + req->id() + " already finished (SUCCEEDED)"};
    }
    *resp = sampleJobs().jobs(0);
    resp->set_state(v1::CANCELLED);
    return grpc::Status::OK;
  }
  grpc::Status ListNodes(grpc::ServerContext*, const v1::ListNodesRequest*,
                         v1::ListNodesResponse* resp) override {
    *resp = sampleNodes();
    return grpc::Status::OK;
  }
  grpc::Status DrainNode(grpc::ServerContext*, const v1::DrainNodeRequest* req, v1::Node* resp) override {
    if (req->node() != "n3") return {grpc::StatusCode::NOT_FOUND, "no node named " + req->node()};
    resp->set_name("n3");
    resp->set_state(req->drain() ? "DRAINING" : "UP");
    return grpc::Status::OK;
  }
  grpc::Status GetRing(grpc::ServerContext*, const v1::GetRingRequest* req, v1::RingLayout* resp) override {
    resp->set_job_id(req->id());
    resp->set_topology("2x2");
    resp->set_text("ring 2x2: n1[0,1] -> n2[0,1]");  // no trailing newline: ddlctl adds it
    return grpc::Status::OK;
  }

  v1::JobSpec lastSpec() {
    std::lock_guard<std::mutex> lock(mu_);
    return lastSpec_;
  }
  v1::ListJobsRequest lastList() {
    std::lock_guard<std::mutex> lock(mu_);
    return lastList_;
  }

 private:
  std::mutex mu_;
  v1::JobSpec lastSpec_;
  v1::ListJobsRequest lastList_;
  std::vector<v1::Job> pagedJobs_;
  std::vector<std::string> pageTokens_;  // the token of every paged request, in order
  bool paging_ = false;
  bool endless_ = false;
  bool stuckToken_ = false;
  int listCalls_ = 0;
};

class DdlctlServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr);
    ASSERT_GT(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }

  Result run(std::vector<std::string> args) {
    args.insert(args.begin(), {"--coordinator", address_});
    return ddlctl(args);
  }

  FakeUserService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(DdlctlServerTest, SubmitPrintsTheIdAndSendsTheSpec) {
  Result r = run({"submit",     "--nodes",    "2",     "--gpus-per-node", "4",
                  "--env",      "A=1",        "--env", "B=x=y",           "--label",
                  "gpu=a100",   "--priority", "5",     "--max-restarts",  "2",
                  "--topology", "4x2",        "--",    "python",          "t.py",
                  "--lr",       "0.1"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "j-000007\n");
  EXPECT_EQ(r.err, "");
  v1::JobSpec spec = service_.lastSpec();
  EXPECT_EQ(spec.name(), "python");
  EXPECT_FALSE(spec.user().empty());
  EXPECT_EQ(spec.workdir(), std::filesystem::current_path().string());
  EXPECT_EQ(spec.nodes(), 2);
  EXPECT_EQ(spec.gpus_per_node(), 4);
  EXPECT_EQ(spec.priority(), 5);
  EXPECT_EQ(spec.max_restarts(), 2);
  EXPECT_EQ(spec.topology(), "4x2");
  EXPECT_EQ(std::vector<std::string>(spec.env().begin(), spec.env().end()),
            (std::vector<std::string>{"A=1", "B=x=y"}));
  EXPECT_EQ(std::vector<std::string>(spec.command().begin(), spec.command().end()),
            (std::vector<std::string>{"python", "t.py", "--lr", "0.1"}));
  EXPECT_EQ(spec.required_labels().at("gpu"), "a100");
}

TEST_F(DdlctlServerTest, SubmitJsonIsOneJobDocument) {
  Result r = run({"-o", "json", "submit", "--gpus", "3", "--name", "n", "--workdir", "/w", "--", "true"});
  ASSERT_EQ(r.rc, 0) << r.err;
  v1::Job job;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &job).ok()) << r.out;
  EXPECT_EQ(job.id(), "j-000007");
  EXPECT_EQ(job.spec().total_gpus(), 3);
  EXPECT_EQ(job.spec().workdir(), "/w");
  EXPECT_NE(r.out.find("\"total_gpus\":3"), std::string::npos) << r.out;
}

TEST_F(DdlctlServerTest, ListFiltersAndFormats) {
  Result r = run({"list"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("ID        NAME   USER   STATE", 0), 0u) << r.out;
  v1::ListJobsRequest req = service_.lastList();
  EXPECT_EQ(std::vector<int>(req.states().begin(), req.states().end()),
            (std::vector<int>{v1::PENDING, v1::SCHEDULED, v1::STARTING, v1::RUNNING}));
  EXPECT_EQ(req.user(), "");

  ASSERT_EQ(run({"list", "--all"}).rc, 0);
  EXPECT_EQ(service_.lastList().states_size(), 0);

  ASSERT_EQ(run({"list", "--state", "running,Failed", "--state", "pending", "--user", "bob"}).rc, 0);
  req = service_.lastList();
  EXPECT_EQ(std::vector<int>(req.states().begin(), req.states().end()),
            (std::vector<int>{v1::RUNNING, v1::FAILED, v1::PENDING}));
  EXPECT_EQ(req.user(), "bob");

  r = run({"list", "-o", "json"});  // global options also work after the verb
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("{\"jobs\":[", 0), 0u) << r.out;
  v1::ListJobsResponse resp;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &resp).ok());
  EXPECT_EQ(resp.jobs_size(), 3);
}

TEST_F(DdlctlServerTest, StatusAndRefusals) {
  Result r = run({"status", "j-000001"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(field(r.out, "Job"), "j-000001");
  EXPECT_EQ(field(r.out, "Allocation"), "n1[0,1] n2[0,1]");

  r = run({"status", "j-000404"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "ddlctl: job j-000404 not found\n");

  r = run({"-o", "json", "status", "j-000404"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.out, "");  // errors never reach stdout, even as JSON
}

TEST_F(DdlctlServerTest, DeadlineExits3) {
  Result r = run({"--timeout", "0.3", "status", "j-slow"});
  EXPECT_EQ(r.rc, kExitUnreachable);
  EXPECT_EQ(r.err.rfind("ddlctl: cannot reach coordinator at " + address_ + ": no answer within 0.3 s\n", 0),
            0u)
      << r.err;
}

TEST_F(DdlctlServerTest, Cancel) {
  Result r = run({"cancel", "j-000001"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "j-000001 CANCELLED\n");
  r = run({"cancel", "j-000002"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.err, "ddlctl: job j-000002 already finished (SUCCEEDED)\n");
  r = run({"--output", "json", "cancel", "j-000001"});
  EXPECT_NE(r.out.find("\"state\":\"CANCELLED\""), std::string::npos) << r.out;
}

TEST_F(DdlctlServerTest, NodesRingDrain) {
  Result r = run({"nodes"});
  EXPECT_EQ(r.rc, 0) << r.err;
  // Heartbeat ages are taken against the real clock here, so only the columns before them are compared.
  EXPECT_EQ(r.out.rfind("NAME  STATE     GPUS  ADDRESS   LABELS", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("n2    DRAINING  0/4   10.0.0.2"), std::string::npos) << r.out;
  r = run({"nodes", "-o", "json"});
  EXPECT_EQ(r.out.rfind("{\"nodes\":[", 0), 0u) << r.out;

  r = run({"ring", "j-000001"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "ring 2x2: n1[0,1] -> n2[0,1]\n");
  r = run({"-o", "json", "ring", "j-000001"});
  EXPECT_NE(r.out.find("\"job_id\":\"j-000001\""), std::string::npos) << r.out;

  EXPECT_EQ(run({"drain", "n3"}).out, "n3 DRAINING\n");
  EXPECT_EQ(run({"undrain", "n3"}).out, "n3 UP\n");
  r = run({"drain", "n9"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.err, "ddlctl: no node named n9\n");
}

// ddlctl list follows next_page_token to the end, printing the header once, and sends its filters with every
// page. Fails without the paging loop (only the first page of 7 jobs was printed).
TEST_F(DdlctlServerTest, ListFetchesEveryPage) {
  std::vector<v1::Job> jobs;
  for (int i = 1; i <= 7; ++i) {
    char id[16];
    std::snprintf(id, sizeof(id), "j-%06d", i);
    jobs.push_back(makeJob(id, "job" + std::to_string(i), "alice", v1::SUCCEEDED, kNow));
  }
  service_.page(jobs);
  Result r = run({"list", "--all", "--page-size", "3", "--name", "job", "--since", "2d", "--until", "1h",
                  "--user", "alice"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(service_.pageTokens(), (std::vector<std::string>{"", "3", "6"}));
  v1::ListJobsRequest last = service_.lastList();
  EXPECT_EQ(last.page_size(), 3);
  EXPECT_EQ(last.name(), "job");
  EXPECT_EQ(last.user(), "alice");
  EXPECT_GT(last.since_ms(), 0);
  EXPECT_EQ(last.until_ms() - last.since_ms(), 2 * 86'400'000 - 3'600'000);
  EXPECT_EQ(r.out.rfind("ID        NAME  USER   STATE", 0), 0u) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 8) << r.out;  // one header, seven jobs
  EXPECT_EQ(r.out.find("ID ", 1), std::string::npos) << "one header: " << r.out;
  for (int i = 1; i <= 7; ++i)
    EXPECT_NE(r.out.find("job" + std::to_string(i) + " "), std::string::npos) << r.out;

  r = run({"list", "--all", "--page-size", "2", "-o", "json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  v1::ListJobsResponse all;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &all).ok()) << r.out;
  EXPECT_EQ(all.jobs_size(), 7);
  EXPECT_EQ(all.next_page_token(), "");
  EXPECT_EQ(service_.pageTokens().size(), 3u + 4u);

  service_.page({});  // an empty history: the header only
  r = run({"list"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "ID  NAME  USER  STATE  AGE  NODES  GPUS  NODELIST(REASON)\n");
}

// A coordinator that never ends the list, or repeats a token, cannot keep ddlctl looping.
TEST_F(DdlctlServerTest, ListPagingIsBounded) {
  service_.page({}, /*endless=*/true);
  Result r = run({"list", "--all", "-o", "json"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(service_.pageTokens().size(), 1000u);
  EXPECT_NE(r.err.find("stopped after 1000 pages"), std::string::npos) << r.err;
  v1::ListJobsResponse all;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &all).ok()) << r.out;
  EXPECT_EQ(all.next_page_token(), "t1000") << "the JSON says where the list goes on";

  std::vector<v1::Job> jobs(5, makeJob("j-000001", "x", "alice", v1::RUNNING, kNow));
  service_.page(jobs, /*endless=*/false, /*stuckToken=*/true);
  r = run({"list", "--page-size", "2"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(service_.pageTokens(), (std::vector<std::string>{"", "2"}));
  EXPECT_NE(r.err.find("same page token twice"), std::string::npos) << r.err;
}

TEST_F(DdlctlServerTest, ListRefusesBadTimeBoundsWithoutSending) {
  service_.page({});
  for (std::vector<std::string> args : {std::vector<std::string>{"list", "--since", "yesterday"},
                                        {"list", "--until", "2026-02-30"},
                                        {"list", "--since", "1h", "--until", "2h"},
                                        {"list", "--page-size", "0"},
                                        {"list", "--page-size", "5001"}}) {
    Result r = run(args);
    EXPECT_EQ(r.rc, kExitUsage) << args[2] << ": " << r.err;
  }
  EXPECT_TRUE(service_.pageTokens().empty()) << "nothing was sent";
}

// A server's message is escaped too: a refusal that quotes a hostile name cannot drive the terminal.
TEST_F(DdlctlServerTest, NodesRemove) {
  Result r = run({"nodes", "remove", "gone"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "removed node gone\n");
  r = run({"nodes", "remove", "n1"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.err, "ddlctl: node n1 is UP; only a DOWN node can be removed\n");
  r = run({"nodes", "remove", "other"});  // the coordinator before RemoveNode is implemented
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.out, "");
  r = run({"-o", "json", "nodes", "remove", "gone"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "{}\n");
  r = run({"nodes", "remove"});
  EXPECT_EQ(r.rc, kExitUsage);
  r = run({"drain", "n\x1b[2J"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.err, "ddlctl: no node named n\\x1b[2J\n");
}

}  // namespace
