// Tests of ddlctl with no coordinator: the argument checks and formatters are called directly on hand-built
// Job and Node messages, and runDdlctl() runs either against nothing (an unreachable address) or against an
// in-process fake UserService on a free loopback port, so exit statuses, stdout and stderr are checked the
// way a script sees them. The fake answers from fixed data and records the last request it got.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../unit/topology_cases.h"
#include "common/version.h"
#include "ddl/v1/ddl.grpc.pb.h"
#include "ddlctl.h"
#include "ddlctl_internal.h"
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
      "CANCELLED, TIMEOUT");
  // TIMEOUT is a state --state accepts, and a final one.
  EXPECT_EQ(*parseStates({"timeout"}).value, (std::vector<v1::JobState>{v1::TIMEOUT}));
  EXPECT_TRUE(isFinalState(v1::TIMEOUT));
  EXPECT_FALSE(isFinalState(v1::RUNNING));
  EXPECT_FALSE(parseStates({"job_state_unspecified"}).ok());
}

TEST(DdlctlFormat, CoordinatorAddress) {
  for (const char* ok : {"127.0.0.1:7070", "head-node:1", "[::1]:7070", "ctl.example.org:65535",
                         "ctl-1:7070,ctl-2:7070,[::1]:7070"}) {
    EXPECT_EQ(checkCoordinatorAddress(ok), "") << ok;
  }
  struct Case {
    const char* address;
    const char* why;
  };
  for (Case c : {Case{"", "empty"}, Case{"head", "no port"}, Case{"head:", "no port"},
                 Case{":7070", "no host"}, Case{"head:0", "port 0 is out of range 1-65535"},
                 Case{"head:70000", "out of range"}, Case{"head:7o70", "is not a number"},
                 Case{"::1:7070", "brackets"}, Case{"[::1]", "no port"}, Case{"http://head:7070", "scheme"},
                 Case{"ctl-1:7070,ctl-2", "'ctl-2': no port"}, Case{"ctl-1:7070,", "'': it is empty"}}) {
    std::string why = checkCoordinatorAddress(c.address);
    EXPECT_NE(why.find(c.why), std::string::npos) << c.address << " -> " << why;
    EXPECT_NE(why.find("expected HOST:PORT"), std::string::npos) << why;
  }
}

// ddlctl's side of the one topology grammar (tests/unit/topology_cases.h): --gpus is the rank count.
TEST(DdlctlFormat, TheSharedTopologyCases) {
  for (const TopologyCase& c : kTopologyCases) {
    SubmitArgs a;
    a.command = {"/bin/true"};
    a.gpus = c.ranks;
    a.topology = c.text;
    const std::string why = checkSubmitValues(a);
    EXPECT_EQ(why.empty(), c.ok) << "'" << c.text << "' for " << c.ranks << " GPUs: " << why;
  }
  SubmitArgs shape;  // --nodes x --gpus-per-node is the rank count too
  shape.command = {"/bin/true"};
  shape.nodes = 2;
  shape.gpusPerNode = 4;
  shape.topology = "4X2";
  EXPECT_EQ(checkSubmitValues(shape), "");
  shape.topology = "4x4";
  EXPECT_EQ(checkSubmitValues(shape),
            "--topology 4x4 has 16 ranks but the job has 8 GPUs; the dims must multiply to the GPU count");
  shape.topology = "4x";
  EXPECT_EQ(
      checkSubmitValues(shape),
      "--topology '4x': '' is not a positive integer (expected positive numbers joined by x, like 4x2)");
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

  SubmitArgs resources = a;
  resources.cpusPerRank = 6;
  resources.memPerRank = "1.5G";
  spec = buildJobSpec(resources);
  ASSERT_TRUE(spec.ok()) << spec.error;
  EXPECT_EQ(spec.value->cpus_per_rank(), 6);
  EXPECT_EQ(spec.value->memory_per_rank_bytes(), int64_t{3} << 29);

  auto error = [&](auto edit) {
    SubmitArgs b = a;
    edit(b);
    auto r = buildJobSpec(b);
    EXPECT_FALSE(r.ok());
    return r.error;
  };
  EXPECT_EQ(error([](SubmitArgs& b) { b.cpusPerRank = 0; }), "--cpus-per-rank must be 1 to 4096, got 0");
  EXPECT_EQ(error([](SubmitArgs& b) { b.memPerRank = "8X"; }),
            "--mem-per-rank '8X': give a size such as 512M, 8G or 1.5T (binary units, as Slurm's --mem)");
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
  // The coordinator answered UNAVAILABLE itself (its store failing): running, not unreachable.
  e = describeRpcError(grpc::StatusCode::UNAVAILABLE, "store: database or disk is full", "h:1", 10);
  EXPECT_EQ(e.message,
            "the coordinator at h:1 is running but could not do it: store: database or disk is full");
  EXPECT_EQ(e.hint.find("is ddl-coordinator running"), std::string::npos) << e.hint;
  // --insecure against a TLS coordinator: it closes the plaintext connection.
  e = describeRpcError(grpc::StatusCode::UNAVAILABLE, "Socket closed", "h:1", 10, /*insecure=*/true);
  EXPECT_NE(e.hint.find("drop --insecure"), std::string::npos) << e.hint;
  EXPECT_FALSE(isTransportFailure("store: database or disk is full"));
  EXPECT_TRUE(isTransportFailure("Socket closed"));
  EXPECT_TRUE(isTransportFailure(""));
}

// Which failures the verbs that wait ride out (issue 39: a coordinator stopped by SIGTERM cuts the calls in
// flight with CANCELLED, which used to end every waiting command), and which prove nothing was sent.
TEST(DdlctlFormat, OutagesAndCallsNeverSent) {
  using grpc::Status;
  using grpc::StatusCode;
  EXPECT_TRUE(outage(Status(StatusCode::CANCELLED, "Cancelled")));
  EXPECT_TRUE(outage(Status(StatusCode::UNAVAILABLE, "Socket closed")));
  EXPECT_TRUE(outage(Status(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded")));
  EXPECT_TRUE(outage(Status(StatusCode::UNAVAILABLE,
                            "failed to connect to all addresses; last error: "
                            "UNKNOWN: Handshake timed out")));
  EXPECT_FALSE(outage(Status(StatusCode::UNAVAILABLE,
                             "failed to connect to all addresses; last error: "
                             "UNKNOWN: SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED")));
  EXPECT_FALSE(outage(Status(StatusCode::NOT_FOUND, "job j-000001 not found")));
  EXPECT_FALSE(outage(Status(StatusCode::PERMISSION_DENIED, "no")));
  EXPECT_TRUE(neverSent(Status(StatusCode::UNAVAILABLE,
                               "failed to connect to all addresses; last error: "
                               "UNAVAILABLE: ipv4:127.0.0.1:1: Connection refused")));
  EXPECT_FALSE(neverSent(Status(StatusCode::UNAVAILABLE, "Socket closed")));
  EXPECT_FALSE(neverSent(Status(StatusCode::CANCELLED, "Cancelled")));
  EXPECT_FALSE(neverSent(Status(StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded")));
  // The coordinator's own answer that it cannot store (a full disk) is no outage, whatever its store said.
  const Status refused(StatusCode::UNAVAILABLE,
                       "job refused: cannot store the coordinator's state (etcd: failed to connect to all "
                       "addresses; Socket closed)");
  EXPECT_TRUE(isStoreRefusal(refused));
  EXPECT_FALSE(outage(refused));
  EXPECT_FALSE(isStoreRefusal(Status(StatusCode::UNAVAILABLE, "Socket closed")));
}

// A submit whose first try was cut (it may have made the job) and whose later tries were refused a connection
// (the coordinator still down) must not be said to have sent nothing: the same command would make a second
// job. callIdempotent rides the outage out on its own clock (--reconnect-timeout) and remembers the first
// try.
TEST(DdlctlFormat, ASubmitCutMidCallMayHaveBeenSentWhateverItsLastTrySaid) {
  CommandLine cl;
  cl.coordinator = "127.0.0.1:1";
  cl.insecure = true;
  cl.reconnectS = 0.5;
  std::ostringstream out, err;
  Session s(cl, Credentials{}, out, err);
  int tries = 0;
  int usage = kExitOk;
  const grpc::Status last = s.callIdempotent(
      [&](v1::UserService::Stub&, grpc::ClientContext*) {
        return ++tries == 1 ? grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded")
                            : grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                           "failed to connect to all addresses; Connection refused");
      },
      &usage, "submitting again");
  EXPECT_EQ(usage, kExitOk);
  EXPECT_GE(tries, 2) << err.str();
  EXPECT_TRUE(neverSent(last));
  EXPECT_TRUE(s.maybeSent()) << "the first try may have made the job";
  EXPECT_NE(err.str().find("lost the coordinator"), std::string::npos) << err.str();
  // A session whose every try was refused a connection sent nothing; one refused by the store is not
  // repeated.
  Session refusedAll(cl, Credentials{}, out, err);
  tries = 0;
  refusedAll.callIdempotent(
      [&](v1::UserService::Stub&, grpc::ClientContext*) {
        ++tries;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "failed to connect to all addresses; Connection refused");
      },
      &usage, "submitting again");
  EXPECT_FALSE(refusedAll.maybeSent());
  EXPECT_EQ(tries, 1) << "one coordinator refusing connections: nothing to ride out";
  Session full(cl, Credentials{}, out, err);
  tries = 0;
  const grpc::Status answer = full.callIdempotent(
      [&](v1::UserService::Stub&, grpc::ClientContext*) {
        ++tries;
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "job refused: cannot store the coordinator's state (disk full)");
      },
      &usage, "submitting again");
  EXPECT_EQ(tries, 1);
  EXPECT_TRUE(isStoreRefusal(answer));
}

TEST(DdlctlFormat, JobTable) {
  EXPECT_EQ(formatJobTable(sampleJobs(), kNow),
            "ID        NAME   USER   STATE    AGE  TIME  START  NODES  GPUS  NODELIST(REASON)\n"
            "j-000001  train  alice  RUNNING  2m   -     -      2      4     n1,n2\n"
            "j-000002  eval   bob    PENDING  5s   -     -      -      6     (waiting for 6 free GPUs)\n"
            "j-000003  bad    alice  FAILED   3h   -     -      1      1     (rank 0 on n3 exited with code 1)\n");
  EXPECT_EQ(formatJobTable(v1::ListJobsResponse(), kNow),
            "ID  NAME  USER  STATE  AGE  TIME  START  NODES  GPUS  NODELIST(REASON)\n");
}

// TIME is the latest attempt's run time (to now, or to the end) and START its local start time. Fails
// without the two columns.
TEST(DdlctlFormat, JobTableRunTimeAndStart) {
  const char* tz = getenv("TZ");
  const std::string savedTz = tz != nullptr ? tz : "";
  setenv("TZ", "UTC", 1);
  tzset();
  v1::ListJobsResponse jobs = sampleJobs();
  jobs.mutable_jobs(0)->set_start_ms(kNow - 65'000);  // running for 1m05s
  jobs.mutable_jobs(2)->set_start_ms(kNow - 3 * 3'600'000);
  jobs.mutable_jobs(2)->set_end_ms(kNow - 3 * 3'600'000 + 12'300);  // ran 12.3 s
  const std::string text = formatJobTable(jobs, kNow);
  EXPECT_NE(text.find("RUNNING  2m   1m05s  2023-11-14T22:12:15  2"), std::string::npos) << text;
  EXPECT_NE(text.find("FAILED   3h   12.3s  2023-11-14T19:13:20  1"), std::string::npos) << text;
  EXPECT_NE(text.find("PENDING  5s   -      -                    -"), std::string::npos) << text;
  if (tz != nullptr) {
    setenv("TZ", savedTz.c_str(), 1);
  } else {
    unsetenv("TZ");
  }
  tzset();
}

// Job.start_ms is when the latest attempt was launched (STARTING), not when it began RUNNING: "Started" and
// list's TIME/START count from the launch, while "Running" is the time spent RUNNING, from the transitions.
TEST(DdlctlFormat, StartedIsTheLaunchAndRunningTheTimeRunning) {
  v1::Job job = makeJob("j-000009", "t", "alice", v1::RUNNING, kNow - 100'000);
  for (auto [from, to, agoMs] :
       {std::tuple{v1::PENDING, v1::SCHEDULED, 90'000}, std::tuple{v1::SCHEDULED, v1::STARTING, 80'000},
        std::tuple{v1::STARTING, v1::RUNNING, 50'000}}) {
    v1::Transition* t = job.add_transitions();
    t->set_from(from);
    t->set_to(to);
    t->set_at_ms(kNow - agoMs);
  }
  job.set_start_ms(kNow - 80'000);
  const std::string text = formatJobDetail(job, kNow);
  EXPECT_EQ(field(text, "Started"), formatLocalTime(kNow - 80'000));
  EXPECT_EQ(field(text, "Queued"), "10.0s");
  EXPECT_EQ(field(text, "Running"), "50.0s");
  v1::ListJobsResponse jobs;
  *jobs.add_jobs() = job;
  EXPECT_NE(formatJobTable(jobs, kNow).find("RUNNING  1m   1m20s  "), std::string::npos)
      << formatJobTable(jobs, kNow);
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
  // A time of day, as Slurm takes it: today (kNow's local date) at that time. Fails without that form.
  const std::time_t now = static_cast<std::time_t>(kNow / 1000);
  std::tm today{};
  localtime_r(&now, &today);
  today.tm_hour = 6;
  today.tm_min = 55;
  today.tm_sec = 0;
  today.tm_isdst = -1;
  const int64_t at0655 = static_cast<int64_t>(std::mktime(&today)) * 1000;
  EXPECT_EQ(parseTimeBound("06:55", kNow).value, at0655);
  EXPECT_EQ(parseTimeBound("6:55", kNow).value, at0655);
  EXPECT_EQ(parseTimeBound("06:55:30", kNow).value, at0655 + 30'000);
  for (const char* bad : {"",
                          "yesterday",
                          "1y",
                          "h",
                          "-1h",
                          "2026-13-01",
                          "2026-02-30",
                          "2026-11-24T25:00",
                          "2026-11-24T10",
                          "2026-11-24T10:00:",
                          "2026-11-24x",
                          "26-11-24",
                          "1969-12-31",
                          "99999999999h",
                          "1h\n",
                          "24:00",
                          "06:60",
                          "06:55:60",
                          "6:5",
                          "06:55:",
                          ":55",
                          "1:02:03:04",
                          "006:55",
                          "06:55x"}) {
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
            "NAME  STATE     GPUS  CPUS  MEMORY  ADDRESS   LABELS             HEARTBEAT  JOBS\n"
            "n1    UP        2/4   -     -       10.0.0.1  rack=r1,switch=s1  2s         j-000001\n"
            "n2    DRAINING  0/4   -     -       10.0.0.2  -                  never      -\n");
  // The operator's reason with a drain, in its own column once some node has one.
  v1::ListNodesResponse nodes = sampleNodes();
  nodes.mutable_nodes(1)->set_drain_reason("bad DIMM\x1b[2J");
  EXPECT_EQ(formatNodeTable(nodes, kNow),
            "NAME  STATE     GPUS  CPUS  MEMORY  ADDRESS   LABELS             HEARTBEAT  JOBS      REASON\n"
            "n1    UP        2/4   -     -       10.0.0.1  rack=r1,switch=s1  2s         j-000001  -\n"
            "n2    DRAINING  0/4   -     -       10.0.0.2  -                  never      -         bad "
            "DIMM\\x1b[2J\n");
}

TEST(DdlctlFormat, NodeTableShowsCpusAndMemoryAndWhereRanksAreNotConfined) {
  v1::ListNodesResponse nodes = sampleNodes();
  v1::Node* n1 = nodes.mutable_nodes(0);
  for (int c = 0; c < 32; ++c) n1->add_cpus(c);
  for (int c = 0; c < 8; ++c) n1->add_cpus_used(c);
  n1->set_memory_bytes(int64_t{256} << 30);
  n1->set_memory_used_bytes(int64_t{64} << 30);
  n1->set_confinement(
      "cgroups v2 under /sys/fs/cgroup/system.slice/ddl-agent.service/ranks: cpuset, memory.max");
  nodes.mutable_nodes(1)->set_confinement("not confined by cgroups: no cgroup2 file system is mounted");
  nodes.mutable_nodes(0)->set_warning("the rank logs' disk is full (0 MiB free in /l, under 256 MiB)");
  EXPECT_EQ(formatNodeTable(nodes, kNow),
            "NAME  STATE     GPUS  CPUS  MEMORY          ADDRESS   LABELS             HEARTBEAT  JOBS\n"
            "n1    UP        2/4   8/32  64 GiB/256 GiB  10.0.0.1  rack=r1,switch=s1  2s         j-000001\n"
            "n2    DRAINING  0/4   -     -               10.0.0.2  -                  never      -\n"
            "warning: n1: the rank logs' disk is full (0 MiB free in /l, under 256 MiB)\n"
            "note: n2: not confined by cgroups: no cgroup2 file system is mounted\n");
}

TEST(DdlctlFormat, NodeTableSaysWhenADownNodeIsDrained) {
  v1::ListNodesResponse nodes = sampleNodes();
  nodes.mutable_nodes(1)->set_state("DOWN");
  nodes.mutable_nodes(1)->set_drained(true);
  v1::Node* n3 = nodes.add_nodes();
  n3->set_name("n3");
  n3->set_state("DOWN");
  EXPECT_EQ(formatNodeTable(nodes, kNow),
            "NAME  STATE           GPUS  CPUS  MEMORY  ADDRESS   LABELS             HEARTBEAT  JOBS\n"
            "n1    UP              2/4   -     -       10.0.0.1  rack=r1,switch=s1  2s         j-000001\n"
            "n2    DOWN (drained)  0/4   -     -       10.0.0.2  -                  never      -\n"
            "n3    DOWN            0/0   -     -       -         -                  never      -\n");
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

// The words, space-separated, for a failure message.
std::string words(const std::vector<std::string>& args) {
  std::string out;
  for (const std::string& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

// ddlctl with `args` toward a coordinator nobody listens on; a usage error (exit 2) is expected, and
// returned.
Result usageError(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"--coordinator", "127.0.0.1:1"};
  all.insert(all.end(), args.begin(), args.end());
  Result r = ddlctl(all);
  EXPECT_EQ(r.rc, kExitUsage) << words(args) << ": " << r.err;
  return r;
}

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
      {{"list", "--", "x"}, "only submit takes a command after --"},
      {{"status"}, "status needs JOB"},
      {{"drain"}, "drain needs NODE"},
      {{"-o", "yaml", "list"}, "yaml"},
      {{"--timeout", "0", "list"}, "--timeout must be a positive number of seconds"},
      {{"--coordinator", "head", "list"}, "invalid coordinator address 'head': no port"},
      {{"--coordinator", "head:99999", "nodes"}, "out of range"},
  };
  for (const Case& c : cases) {
    const std::string shown = words(c.args) + " ";
    const Result r = usageError(c.args);
    EXPECT_EQ(r.out, "") << shown;
    EXPECT_EQ(r.err.rfind("ddlctl: ", 0), 0u) << shown << r.err;
    EXPECT_NE(r.err.find(c.message), std::string::npos) << shown << "\n" << r.err;
  }
}

// Issue 28 item 5: CLI11's own words ("The following argument was not expected", "Could not convert") become
// what went wrong, the nearest real flag or verb, and the help of the verb at hand.
TEST(DdlctlCli, UsageErrorsNameTheVerbAndTheNearestFlag) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
    const char* help;
  };
  const std::vector<Case> cases = {
      {{"submit", "--gpu", "2", "--", "true"},
       "unknown option --gpu for submit; did you mean --gpus?",
       "run 'ddlctl submit --help' for its options"},
      {{"submit", "--gpus-per", "2", "--", "true"}, "did you mean --gpus-per-node?", "ddlctl submit --help"},
      {{"submit", "--mem-per-rnak", "8G", "--", "true"},
       "did you mean --mem-per-rank?",
       "ddlctl submit --help"},
      {{"list", "--stat", "running"},
       "unknown option --stat for list; did you mean --state?",
       "run 'ddlctl list --help' for its options"},
      {{"sumbit", "--gpus", "1"},
       "unknown verb 'sumbit' (did you mean submit?)",
       "run 'ddlctl --help' for usage"},
      {{"canel", "3"}, "unknown verb 'canel' (did you mean cancel?)", "ddlctl --help"},
      {{"submit", "--nodes", "two", "--", "true"},
       "--nodes takes a whole number N or an elastic range MIN:MAX, got 'two'",
       "ddlctl submit --help"},
      {{"submit", "--gpus", "4:2", "--", "true"},
       "--gpus 4:2: an elastic range MIN:MAX needs 1 <= MIN <= MAX",
       "ddlctl submit --help"},
      {{"submit", "--nodes", "1:x", "--", "true"}, "got '1:x'", "ddlctl submit --help"},
      {{"submit", "--gpus"}, "--gpus needs a value for submit", "ddlctl submit --help"},
      {{"logs"}, "logs needs JOB", "run 'ddlctl logs --help' for its options"},
      {{"status", "j-1", "extra"}, "unexpected argument 'extra' for status", "ddlctl status --help"},
      {{"admin", "add-user"}, "add-user needs NAME", "run 'ddlctl admin add-user --help' for its options"},
      {{"--tiemout", "5", "list"}, "unknown option --tiemout; did you mean --timeout?", "ddlctl list --help"},
      {{"nodes", "--frobnicate"}, "unknown option --frobnicate for nodes\n", "ddlctl nodes --help"},
  };
  for (const Case& c : cases) {
    const std::string shown = words(c.args) + " ";
    const Result r = usageError(c.args);
    EXPECT_NE(r.err.find(c.message), std::string::npos) << shown << "\n" << r.err;
    EXPECT_NE(r.err.find(c.help), std::string::npos) << shown << "\n" << r.err;
    EXPECT_EQ(r.err.find("The following"), std::string::npos) << "CLI11's own words: " << r.err;
  }
}

TEST(DdlctlCli, SecurityMistakesAreNamedBeforeAnythingIsSent) {
  // Plaintext only toward loopback.
  Result r = ddlctl({"--coordinator", "198.18.0.1:7070", "nodes"});
  EXPECT_EQ(r.rc, kExitUsage) << r.err;
  EXPECT_NE(r.err.find("only on a loopback address"), std::string::npos) << r.err;
  // TLS needs the CA; a missing one is named before anything is sent.
  r = ddlctl({"--coordinator", "127.0.0.1:1", "--ca", "/nonexistent/ca.crt", "nodes"}, /*insecure=*/false);
  EXPECT_EQ(r.rc, kExitUsage) << r.err;
  EXPECT_NE(r.err.find("no CA certificate at /nonexistent/ca.crt"), std::string::npos) << r.err;
  // A token file that cannot be read is not silently replaced by no token: an identity problem (exit 4), with
  // the reason.
  r = ddlctl({"--coordinator", "127.0.0.1:1", "--token-file", "/nonexistent/token", "nodes"});
  EXPECT_EQ(r.rc, kExitUnauthenticated) << r.err;
  EXPECT_NE(r.err.find("cannot read the token file /nonexistent/token: No such file or directory"),
            std::string::npos)
      << r.err;
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

// ---- Waiting, submit flags, scripts: pure parts ----------------------------------------------------------

TEST(DdlctlFormat, NormalizeJobId) {
  EXPECT_EQ(normalizeJobId("5"), "j-000005");
  EXPECT_EQ(normalizeJobId("000005"), "j-000005");
  EXPECT_EQ(normalizeJobId("j-5"), "j-000005");
  EXPECT_EQ(normalizeJobId("j-000005"), "j-000005");
  EXPECT_EQ(normalizeJobId("1234567"), "j-1234567");
  for (const char* other : {"", "j-", "j-5x", "job5", "-5", "5 ", "j-slow", "1234567890123456789"}) {
    EXPECT_EQ(normalizeJobId(other), other) << "passed through for the coordinator to refuse";
  }
}

// The exit status of a waited-for job. Fails without jobExitCode()'s mapping (every job exited 0).
TEST(DdlctlFormat, JobExitCodes) {
  v1::Job job = makeJob("j-000001", "x", "alice", v1::SUCCEEDED, kNow);
  EXPECT_EQ(jobExitCode(job), 0);
  job.set_state(v1::FAILED);
  EXPECT_EQ(jobExitCode(job), 1) << "FAILED with no failure recorded";
  job.mutable_failure()->set_exit_code(3);
  EXPECT_EQ(jobExitCode(job), 3);
  job.mutable_failure()->set_exit_code(0);
  EXPECT_EQ(jobExitCode(job), 1) << "a FAILED job never exits 0";
  job.mutable_failure()->clear_exit_code();
  job.mutable_failure()->set_signal(9);
  EXPECT_EQ(jobExitCode(job), 137);
  job.set_state(v1::CANCELLED);
  EXPECT_EQ(jobExitCode(job), kExitJobCancelled);
  job.set_state(v1::TIMEOUT);
  EXPECT_EQ(jobExitCode(job), kExitJobTimeout);
  for (v1::JobState live : {v1::PENDING, v1::SCHEDULED, v1::STARTING, v1::RUNNING}) {
    job.set_state(live);
    EXPECT_FALSE(jobExitCode(job).has_value());
  }
  // Distinct from each other and from the RPC statuses 0..5.
  std::vector<int> codes = {kExitOk, kExitRefused, kExitUsage, kExitUnreachable, kExitUnauthenticated,
                            kExitDenied, kExitJobCancelled, kExitJobTimeout, kExitWaitTimeout};
  std::sort(codes.begin(), codes.end());
  EXPECT_EQ(std::unique(codes.begin(), codes.end()), codes.end());

  auto with = [](v1::JobState state, int exitCode) {
    v1::Job j = makeJob("j-1", "x", "a", state, kNow);
    if (state == v1::FAILED) j.mutable_failure()->set_exit_code(exitCode);
    return j;
  };
  EXPECT_EQ(worstJobExit({}), 0);
  EXPECT_EQ(worstJobExit({with(v1::SUCCEEDED, 0), with(v1::SUCCEEDED, 0)}), 0);
  EXPECT_EQ(worstJobExit({with(v1::SUCCEEDED, 0), with(v1::CANCELLED, 0)}), kExitJobCancelled);
  EXPECT_EQ(worstJobExit({with(v1::CANCELLED, 0), with(v1::TIMEOUT, 0)}), kExitJobTimeout);
  EXPECT_EQ(worstJobExit({with(v1::TIMEOUT, 0), with(v1::FAILED, 4), with(v1::FAILED, 9)}), 4);
  EXPECT_EQ(worstJobExit({with(v1::FAILED, 4), with(v1::RUNNING, 0)}), kExitWaitTimeout);
}

TEST(DdlctlFormat, TimeLimits) {
  struct Case {
    const char* text;
    int seconds;
  };
  for (Case c : {Case{"30", 1800}, Case{"30:15", 1815}, Case{"2:00:01", 7201}, Case{"1-2", 93600},
                 Case{"1-2:30", 95400}, Case{"1-02:30:05", 95405}, Case{"90s", 90}, Case{"30m", 1800},
                 Case{"2h", 7200}, Case{"1d", 86400}, Case{" 45 ", 2700}, Case{"0:01", 1}}) {
    Parsed<int> p = parseTimeLimit(c.text);
    ASSERT_TRUE(p.ok()) << c.text << ": " << p.error;
    EXPECT_EQ(*p.value, c.seconds) << c.text;
  }
  for (const char* bad : {"", "0", "0s", "00:00", "-5", "1.5h", "abc", "1:2:3:4", "1-", "1-2:3:4:5", "5x",
                          "30:", ":30", "366d", "400-0"}) {
    Parsed<int> p = parseTimeLimit(bad);
    EXPECT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.error.rfind("--time '", 0), 0u) << p.error;
  }
}

TEST(DdlctlFormat, ArraySpecs) {
  struct Case {
    const char* spec;
    int jobs;
  };
  for (Case c : {Case{"0-15", 16}, Case{"1,3,5", 3}, Case{"0-15:4", 4}, Case{"0-15%4", 16}, Case{"7", 1},
                 Case{"0-9999", 10000}, Case{"1,3,10-12:2%2", 4}, Case{"1000000", 1}}) {
    Parsed<int> p = checkArraySpec(c.spec);
    ASSERT_TRUE(p.ok()) << c.spec << ": " << p.error;
    EXPECT_EQ(*p.value, c.jobs) << c.spec;
  }
  for (const char* bad : {"", "%4", "0-15%0", "0-15%", "5-1", "0-10000", "1000001", "a", "1,", ",1", "1-",
                          "0-15:0", "3:2", "1;2", "-1", "0-15%4%2"}) {
    Parsed<int> p = checkArraySpec(bad);
    EXPECT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.error.rfind("--array '", 0), 0u) << p.error;
  }
}

// --export: NONE sends nothing, ALL the environment without credentials or ddl's own variables. Fails if
// DDL_TOKEN could leave the machine in a job's environment.
TEST(DdlctlFormat, ExportedEnv) {
  const std::vector<std::string> env = {"PATH=/bin", "HOME=/home/a", "DDL_TOKEN=ddl_secret",
                                        "DDL_TOKEN_FILE=/t", "DDL_COORDINATOR=h:1", "CUDA_VISIBLE_DEVICES=0",
                                        "RANK=3", "BASH_FUNC_f%%=() {}", "X=a=b"};
  EXPECT_TRUE(exportedEnv("NONE", env).value->empty());
  EXPECT_TRUE(exportedEnv("none", env).value->empty());
  EXPECT_EQ(*exportedEnv("ALL", env).value, (std::vector<std::string>{"PATH=/bin", "HOME=/home/a", "X=a=b"}));
  EXPECT_EQ(*exportedEnv("ALL,PATH=/x,Y=1", env).value,
            (std::vector<std::string>{"PATH=/x", "HOME=/home/a", "X=a=b", "Y=1"}));
  EXPECT_EQ(*exportedEnv("HOME,Z=2", env).value, (std::vector<std::string>{"HOME=/home/a", "Z=2"}));
  for (const char* bad : {"DDL_TOKEN", "DDL_TOKEN_FILE=x", "NOPE", "NONE,PATH", "1X=2", "A B"}) {
    auto p = exportedEnv(bad, env);
    EXPECT_FALSE(p.ok()) << bad;
    EXPECT_EQ(p.error.rfind("--export '", 0), 0u) << p.error;
  }
  EXPECT_NE(exportedEnv("DDL_TOKEN", env).error.find("credential"), std::string::npos);
}

TEST(DdlctlFormat, JobSpecNewFields) {
  SubmitArgs a;
  a.command = {"python", "t.py"};
  a.gpus = 1;
  a.cwd = "/home/alice/proj";
  a.timeLimit = "1-00:00:30";
  a.afterOk = {"5,j-000006", "7"};
  a.afterAny = {"j-slow"};
  a.hold = true;
  a.exportSpec = "ALL";
  a.environ = {"A=from-shell", "B=2", "DDL_TOKEN=t"};
  a.env = {"A=1"};
  auto spec = buildJobSpec(a);
  ASSERT_TRUE(spec.ok()) << spec.error;
  EXPECT_EQ(spec.value->time_limit_s(), 86430);
  EXPECT_EQ(std::vector<std::string>(spec.value->after_ok().begin(), spec.value->after_ok().end()),
            (std::vector<std::string>{"j-000005", "j-000006", "j-000007"}));
  EXPECT_EQ(spec.value->after_any(0), "j-slow");
  EXPECT_TRUE(spec.value->hold());
  EXPECT_EQ(std::vector<std::string>(spec.value->env().begin(), spec.value->env().end()),
            (std::vector<std::string>{"B=2", "A=1"}))
      << "--env wins over the exported value";
  EXPECT_EQ(spec.value->workdir(), "/home/alice/proj") << "the default: where ddlctl runs";
  a.workdir = "../data";
  EXPECT_EQ(buildJobSpec(a).value->workdir(), "/home/alice/data");
  a.workdir = "/scratch";
  EXPECT_EQ(buildJobSpec(a).value->workdir(), "/scratch");
  a.timeLimit = "0";
  EXPECT_EQ(buildJobSpec(a).error.rfind("--time '0'", 0), 0u);
  a.timeLimit = "";
  a.afterOk = {","};
  EXPECT_EQ(buildJobSpec(a).error, "--after-ok needs a job id");
}

// Issue 41: --signal SIG[@SECONDS] as sbatch's: a name or number, 60 s by default, only with --time and
// before it.
TEST(DdlctlFormat, WarningSignalBeforeTheTimeLimit) {
  EXPECT_EQ(*parseWarnSignal("USR1@120").value, (std::pair<int, int>{SIGUSR1, 120}));
  EXPECT_EQ(*parseWarnSignal("SIGTERM").value, (std::pair<int, int>{SIGTERM, 60}));
  EXPECT_EQ(*parseWarnSignal("10@30").value, (std::pair<int, int>{10, 30}));
  for (const char* bad : {"", "FOO", "USR1@", "USR1@0", "USR1@65536", "USR1@1m", "@30", "65@10"}) {
    EXPECT_FALSE(parseWarnSignal(bad).ok()) << bad;
  }
  EXPECT_EQ(parseWarnSignal("USR1@x").error,
            "--signal 'USR1@x': the seconds after @ are a whole number from 1 to 65535");
  SubmitArgs a;
  a.command = {"python", "t.py"};
  a.gpus = 1;
  a.warnSignal = "USR1@120";
  EXPECT_EQ(buildJobSpec(a).error, "--signal USR1@120 is sent before the time limit: give --time too");
  a.timeLimit = "2m";
  EXPECT_NE(buildJobSpec(a).error.find("give fewer seconds or a longer --time"), std::string::npos);
  a.timeLimit = "1h";
  auto spec = buildJobSpec(a);
  ASSERT_TRUE(spec.ok()) << spec.error;
  EXPECT_EQ(spec.value->warn_signal(), SIGUSR1);
  EXPECT_EQ(spec.value->warn_before_s(), 120);
  a.warnSignal = "";
  EXPECT_EQ(buildJobSpec(a).value->warn_signal(), 0);
}

TEST(DdlctlFormat, ScriptDirectives) {
  auto d = parseScriptDirectives(
      "#!/bin/bash\n"
      "#DDL --gpus 4\n"
      "\n"
      "# a comment\n"
      "#DDL --name 'my run' --env \"A=x y\" # trailing\n"
      "#DDLX --not-mine\n"
      "#SBATCH --time 5\n"
      "echo hi\n"
      "#DDL --nodes 9\n");
  ASSERT_TRUE(d.ok()) << d.error;
  ASSERT_EQ(d.value->size(), 2u);
  EXPECT_EQ((*d.value)[0].line, 2);
  EXPECT_EQ((*d.value)[0].args, (std::vector<std::string>{"--gpus", "4"}));
  EXPECT_EQ((*d.value)[1].line, 5);
  EXPECT_EQ((*d.value)[1].args, (std::vector<std::string>{"--name", "my run", "--env", "A=x y"}));
  auto bad = parseScriptDirectives("#!/bin/sh\n#DDL --name 'open\n");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.error, "line 2: unterminated ' quote");
  EXPECT_TRUE(parseScriptDirectives("#!/bin/sh").value->empty());
}

TEST(DdlctlFormat, JobDetailShowsRanksHoldLimitsDependencies) {
  const char* tz = getenv("TZ");
  const std::string savedTz = tz != nullptr ? tz : "";
  setenv("TZ", "UTC", 1);
  tzset();
  v1::Job job = makeJob("j-000010", "train", "alice", v1::FAILED, kNow - 100'000);
  job.mutable_spec()->set_total_gpus(2);
  job.mutable_spec()->set_time_limit_s(5400);
  job.mutable_spec()->add_after_ok("j-000008");
  job.mutable_spec()->add_after_any("j-000009");
  job.mutable_spec()->set_array_id("j-000005");
  job.mutable_spec()->set_array_index(5);
  job.mutable_spec()->set_array_max_running(2);
  job.set_held(true);
  job.set_start_ms(kNow - 60'000);
  job.set_end_ms(kNow - 10'000);
  for (int r = 0; r < 2; ++r) {
    v1::RankStatus* rank = job.add_ranks();
    rank->set_rank(r);
    rank->set_node(r == 0 ? "n1" : "n2");
    rank->set_state(v1::RankStatus::EXITED);
    rank->set_pid(1000 + r);
    rank->set_started_ms(kNow - 60'000);
    rank->set_exited_ms(kNow - 10'000);
    rank->mutable_progress()->set_collectives(42);
    rank->mutable_progress()->set_last_op("allreduce");
  }
  job.mutable_ranks(0)->set_program_pid(2000);
  job.mutable_ranks(0)->set_exit_code(0);
  job.mutable_ranks(1)->set_signal(9);
  const std::string text = formatJobDetail(job, kNow);
  EXPECT_EQ(field(text, "Held"), "yes (ddlctl release j-000010)");
  EXPECT_EQ(field(text, "Time limit"), "1h30m");
  EXPECT_EQ(field(text, "After OK"), "j-000008");
  EXPECT_EQ(field(text, "After any"), "j-000009");
  EXPECT_EQ(field(text, "Array"), "j-000005 index 5 (at most 2 running)");
  EXPECT_EQ(field(text, "Started"), "2023-11-14 22:12:20.000");
  EXPECT_EQ(field(text, "Ended"), "2023-11-14 22:13:10.000");
  EXPECT_NE(text.find("RANK  NODE  STATE   PID   EXIT     START     END       COLLECTIVES"), std::string::npos)
      << text;
  EXPECT_NE(text.find("  0     n1    EXITED  2000  0        22:12:20  22:13:10  42"), std::string::npos)
      << "the program's pid, not the shim's: " << text;
  EXPECT_NE(text.find("  1     n2    EXITED  1001  SIGKILL  22:12:20  22:13:10  42"), std::string::npos) << text;
  if (tz != nullptr) {
    setenv("TZ", savedTz.c_str(), 1);
  } else {
    unsetenv("TZ");
  }
  tzset();
}

TEST(DdlctlCli, VersionAndNewExitStatusesInHelp) {
  Result r = ddlctl({"--version"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, std::string("ddlctl ") + ddl::kVersion + "\n");
  r = ddlctl({"--help"});
  for (const char* line : {"6  CANCELLED", "7  TIMEOUT", "8  --wait-timeout passed",
                           "the first failing rank's exit code"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << " missing in\n" << r.out;
  }
  for (const char* verb : {"wait", "hold", "release", "requeue"}) {
    EXPECT_NE(r.out.find(std::string("  ") + verb), std::string::npos) << verb;
  }
}

// Usage errors of the new flags name the flag and send nothing.
TEST(DdlctlCli, NewFlagsUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{"submit", "--gpus", "1", "--time", "0", "--", "x"}, "--time '0'"},
      {{"submit", "--gpus", "1", "--time", "soon", "--", "x"}, "--time 'soon' is not a time limit"},
      {{"submit", "--gpus", "1", "--array", "5-1", "--", "x"}, "--array '5-1'"},
      {{"submit", "--gpus", "1", "--array", "0-20000", "--", "x"}, "--array"},
      {{"submit", "--gpus", "1", "--export", "DDL_TOKEN", "--", "x"}, "credential"},
      {{"submit", "--gpus", "1", "--wait-timeout", "5", "--", "x"}, "--wait-timeout goes with --wait"},
      {{"cancel"}, "cancel needs job ids, or a filter"},
      {{"cancel", "5", "--array", "80"}, "not both"},
      {{"cancel", "5", "--user", "bob"}, "not both"},
      {{"cancel", "5", "--signal", "USR9"}, "--signal 'USR9' is not a signal"},
      {{"cancel", "--state", "runing"}, "--state: unknown job state"},
      {{"wait"}, "wait needs JOB"},
      {{"hold"}, "hold needs JOB"},
      {{"requeue"}, "requeue needs JOB"},
      {{"logs", "5", "--tail", "-1"}, "--tail"},
      {{"undrain", "n1", "--reason", "x"}, "--reason"},
  };
  for (const Case& c : cases) {
    const std::string shown = words(c.args) + " ";
    const Result r = usageError(c.args);
    EXPECT_NE(r.err.find(c.message), std::string::npos) << shown << "\n" << r.err;
  }
}

// ---- The command line against a fake coordinator ----------------------------------------------------------

class FakeUserService final : public v1::UserService::Service {
 public:
  grpc::Status GetUsage(grpc::ServerContext*, const v1::GetUsageRequest* req,
                        v1::GetUsageResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    lastUsage_ = *req;
    return grpc::Status::OK;
  }
  v1::GetUsageRequest lastUsage() {
    std::lock_guard<std::mutex> lock(mu_);
    return lastUsage_;
  }
  grpc::Status Submit(grpc::ServerContext*, const v1::SubmitRequest* req, v1::SubmitResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    lastSpec_ = req->spec();
    lastSubmit_ = *req;
    v1::Job* job = resp->mutable_job();
    *job = makeJob("j-000007", req->spec().name(), req->spec().user(), v1::PENDING, kNow);
    *job->mutable_spec() = req->spec();
    if (!req->array().empty()) {  // j-000007 onwards, one per index
      const int n = *checkArraySpec(req->array()).value;
      for (int i = 0; i < n; ++i) {
        char id[16];
        std::snprintf(id, sizeof(id), "j-%06d", 7 + i);
        resp->add_array_jobs(id);
      }
      job->mutable_spec()->set_array_id("j-000007");
    }
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext* ctx, const v1::GetJobRequest* req, v1::Job* resp) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      getJobCalls_++;
      if (req->id() == "j-000060") {  // the logs scenario: PENDING once, then as the logs say
        *resp = logsJob(getJobCalls_ == 1);
        return grpc::Status::OK;
      }
      if (moving_.count(req->id()) > 0) {
        *resp = movingJob(req->id());
        return grpc::Status::OK;
      }
      auto it = scripted_.find(req->id());
      if (it != scripted_.end()) {  // the next answer of the script; the last one stays
        *resp = it->second.front();
        if (it->second.size() > 1) it->second.pop_front();
        return grpc::Status::OK;
      }
    }
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
    if (!paging_) {  // one page and no token, as before paging; the user and name filters apply
      const v1::ListJobsResponse sample = sampleJobs();
      for (const v1::Job& j : sample.jobs()) {
        if ((req->user().empty() || j.spec().user() == req->user()) &&
            (req->name().empty() || j.spec().name() == req->name()))
          *resp->add_jobs() = j;
      }
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancels_.push_back(*req);
    }
    if (req->id() != "j-000001") {
      return {grpc::StatusCode::FAILED_PRECONDITION, "job " + req->id() + " already finished (SUCCEEDED)"};
    }
    *resp = sampleJobs().jobs(0);
    if (req->signal() == 0) resp->set_state(v1::CANCELLED);
    return grpc::Status::OK;
  }
  grpc::Status WhoAmI(grpc::ServerContext*, const v1::WhoAmIRequest*, v1::Identity* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    resp->set_name(whoami_);
    resp->set_role(whoami_.empty() ? "insecure" : "user");
    return grpc::Status::OK;
  }
  void setWhoAmI(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    whoami_ = name;
  }
  grpc::Status HoldJob(grpc::ServerContext*, const v1::HoldJobRequest* req, v1::Job* resp) override {
    if (req->id() != "j-000002") return {grpc::StatusCode::NOT_FOUND, "job " + req->id() + " not found"};
    std::lock_guard<std::mutex> lock(mu_);
    holds_.push_back(*req);
    *resp = sampleJobs().jobs(1);
    resp->set_held(req->hold());
    return grpc::Status::OK;
  }
  grpc::Status RequeueJob(grpc::ServerContext* ctx, const v1::RequeueJobRequest* req, v1::Job* resp) override {
    if (req->id() != "j-000001") return v1::UserService::Service::RequeueJob(ctx, req, resp);  // UNIMPLEMENTED
    *resp = sampleJobs().jobs(0);
    resp->set_state(v1::PENDING);
    return grpc::Status::OK;
  }
  // The logs scenario of j-000060 (one rank, max_restarts 3): attempt 1 writes three lines; from the 3rd
  // GetLogs call on, attempt 2 is the latest (restart 1) and writes one; from the 6th the job has FAILED
  // with exit code 3.
  grpc::Status GetLogs(grpc::ServerContext*, const v1::GetLogsRequest* req, v1::GetLogsResponse* resp) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (req->id() == "j-000061") {  // never launched
      return {grpc::StatusCode::FAILED_PRECONDITION, "job j-000061 is PENDING and has not been launched"};
    }
    if (moving_.count(req->id()) > 0) return movingLogs(*req, resp);
    logsCalls_++;
    const int latest = logsCalls_ >= 3 ? 2 : 1;
    const int attempt = req->attempt() == 0 ? latest : req->attempt();
    const std::string text = attempt == 1 ? "one\ntwo\nthree\n" : "again\n";
    const size_t offset = std::min<size_t>(static_cast<size_t>(req->offset()), text.size());
    const size_t n = req->max_bytes() > 0 ? static_cast<size_t>(req->max_bytes()) : text.size();
    resp->set_data(text.substr(offset, n));
    resp->set_next_offset(static_cast<int64_t>(offset + resp->data().size()));
    resp->set_size(static_cast<int64_t>(text.size()));
    resp->set_attempt(attempt);
    resp->set_job_ended(logsCalls_ >= 6);
    return grpc::Status::OK;
  }
  v1::Job logsJob(bool pending) {  // under mu_
    v1::Job job = makeJob("j-000060", "t", "alice", v1::RUNNING, kNow);
    job.set_gpus(1);
    job.mutable_spec()->set_max_restarts(3);
    if (pending) {
      job.set_state(v1::PENDING);
      job.set_reason("waiting for 2 free GPUs");
    } else if (logsCalls_ >= 6) {
      job.set_state(v1::FAILED);
      job.mutable_failure()->set_exit_code(3);
    }
    job.set_restarts(logsCalls_ >= 3 ? 1 : 0);
    return job;
  }
  // The jobs that move to other nodes (one rank): attempt 1 writes "a1\npartial" (no newline at the end);
  // from the 3rd GetLogs call on, j-000062 is requeued (PENDING: FAILED_PRECONDITION, for one GetJob
  // answer) and j-000063 restarted, and attempt 2 runs elsewhere: attempt 1's log is NOT_FOUND there.
  // Attempt 2 writes "b2\n"; once it was read to its end the job has SUCCEEDED.
  struct Moving {
    int logsCalls = 0;
    int phase = 0;  // 0: attempt 1 runs; 1: PENDING again; 2: attempt 2 runs
    int pendingAnswers = 0;
    bool ended = false;
  };
  void moving(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    moving_[id] = Moving{};
  }
  v1::Job movingJob(const std::string& id) {  // under mu_
    Moving& m = moving_[id];
    v1::Job job = makeJob(id, "t", "alice", v1::RUNNING, kNow);
    job.set_gpus(1);
    const bool restart = id == "j-000063";
    job.mutable_spec()->set_max_restarts(restart ? 2 : 0);
    if (m.phase == 1) {
      if (m.pendingAnswers++ == 0)
        job.set_state(v1::PENDING);
      else
        m.phase = 2;
    }
    job.set_restarts(restart && m.phase == 2 ? 1 : 0);
    if (m.ended) job.set_state(v1::SUCCEEDED);
    return job;
  }
  grpc::Status movingLogs(const v1::GetLogsRequest& req, v1::GetLogsResponse* resp) {  // under mu_
    Moving& m = moving_[req.id()];
    if (m.phase == 0 && ++m.logsCalls >= 3) m.phase = req.id() == "j-000063" ? 2 : 1;
    if (m.phase == 1)
      return {grpc::StatusCode::FAILED_PRECONDITION, "job is PENDING and has not been launched"};
    const int latest = m.phase == 0 ? 1 : 2;
    const int attempt = req.attempt() == 0 ? latest : req.attempt();
    if (attempt != latest) return {grpc::StatusCode::NOT_FOUND, "no log of attempt 1 on node n2"};
    const std::string text = attempt == 1 ? "a1\npartial" : "b2\n";
    const size_t offset = std::min<size_t>(static_cast<size_t>(req.offset()), text.size());
    const size_t n = req.max_bytes() > 0 ? static_cast<size_t>(req.max_bytes()) : text.size();
    if (attempt == 2 && offset == text.size()) m.ended = true;
    resp->set_data(text.substr(offset, n));
    resp->set_next_offset(static_cast<int64_t>(offset + resp->data().size()));
    resp->set_size(static_cast<int64_t>(text.size()));
    resp->set_attempt(attempt);
    resp->set_job_ended(m.ended);
    return grpc::Status::OK;
  }
  // GetJob answers for `id`, one per call, the last repeated.
  void script(const std::string& id, std::vector<v1::Job> answers) {
    std::lock_guard<std::mutex> lock(mu_);
    scripted_[id] = std::deque<v1::Job>(answers.begin(), answers.end());
  }
  std::vector<v1::CancelJobRequest> cancels() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancels_;
  }
  std::vector<v1::HoldJobRequest> holds() {
    std::lock_guard<std::mutex> lock(mu_);
    return holds_;
  }
  v1::SubmitRequest lastSubmit() {
    std::lock_guard<std::mutex> lock(mu_);
    return lastSubmit_;
  }
  v1::DrainNodeRequest lastDrain() {
    std::lock_guard<std::mutex> lock(mu_);
    return lastDrain_;
  }
  grpc::Status ListNodes(grpc::ServerContext*, const v1::ListNodesRequest*,
                         v1::ListNodesResponse* resp) override {
    *resp = sampleNodes();
    return grpc::Status::OK;
  }
  grpc::Status DrainNode(grpc::ServerContext*, const v1::DrainNodeRequest* req, v1::Node* resp) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      lastDrain_ = *req;
    }
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
  v1::GetUsageRequest lastUsage_;
  v1::JobSpec lastSpec_;
  v1::ListJobsRequest lastList_;
  std::vector<v1::Job> pagedJobs_;
  std::vector<std::string> pageTokens_;  // the token of every paged request, in order
  bool paging_ = false;
  bool endless_ = false;
  bool stuckToken_ = false;
  int listCalls_ = 0;
  v1::SubmitRequest lastSubmit_;
  std::map<std::string, std::deque<v1::Job>> scripted_;
  std::vector<v1::CancelJobRequest> cancels_;
  std::vector<v1::HoldJobRequest> holds_;
  v1::DrainNodeRequest lastDrain_;
  int getJobCalls_ = 0;
  int logsCalls_ = 0;
  std::string whoami_ = "alice";
  std::map<std::string, Moving> moving_;
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

// CPUs and memory per rank, under ddl's names and under Slurm's (a rank is a GPU).
TEST_F(DdlctlServerTest, SubmitSendsCpusAndMemoryPerRank) {
  Result r = run({"submit", "--gpus", "2", "--cpus-per-rank", "4", "--mem-per-rank", "1.5G", "--", "true"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(service_.lastSpec().cpus_per_rank(), 4);
  EXPECT_EQ(service_.lastSpec().memory_per_rank_bytes(), int64_t{3} << 29);
  r = run({"submit", "--gpus", "2", "--cpus-per-gpu", "8", "--mem-per-gpu", "64G", "--", "true"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(service_.lastSpec().cpus_per_rank(), 8);
  EXPECT_EQ(service_.lastSpec().memory_per_rank_bytes(), int64_t{64} << 30);
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
  // With --state, --all changes nothing. Fails while --all excludes --state (exit 2).
  r = run({"list", "--all", "--state", "failed", "--since", "10m"});
  ASSERT_EQ(r.rc, 0) << r.err;
  req = service_.lastList();
  EXPECT_EQ(std::vector<int>(req.states().begin(), req.states().end()), (std::vector<int>{v1::FAILED}));
  EXPECT_GT(req.since_ms(), 0);

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
  EXPECT_EQ(r.out.rfind("NAME  STATE     GPUS  CPUS  MEMORY  ADDRESS   LABELS", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("n2    DRAINING  0/4   -     -       10.0.0.2"), std::string::npos) << r.out;
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
  EXPECT_EQ(r.out, "ID  NAME  USER  STATE  AGE  TIME  START  NODES  GPUS  NODELIST(REASON)\n");
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

// ---- Waiting, cancelling by filter, hold/release/requeue, logs -f against the fake --------------------------

v1::Job jobIn(const std::string& id, v1::JobState state, int exitCode = 0) {
  v1::Job job = makeJob(id, "t", "alice", state, kNow);
  if (state == v1::FAILED) job.mutable_failure()->set_exit_code(exitCode);
  return job;
}

// ddlctl wait polls until the jobs end and exits with the worst result. Fails without the wait verb (exit 2)
// or without the mapping (exit 0).
TEST_F(DdlctlServerTest, WaitExitsWithTheJobsResult) {
  service_.script("j-000050", {jobIn("j-000050", v1::PENDING), jobIn("j-000050", v1::RUNNING),
                               jobIn("j-000050", v1::FAILED, 3)});
  service_.script("j-000051", {jobIn("j-000051", v1::SUCCEEDED)});
  Result r = run({"wait", "50", "j-000051"});
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_EQ(r.out, "j-000051 SUCCEEDED\nj-000050 FAILED (rank 0: exit code 3)\n");
  service_.script("j-000052", {jobIn("j-000052", v1::CANCELLED)});
  EXPECT_EQ(run({"wait", "51", "52"}).rc, kExitJobCancelled);
  service_.script("j-000053", {jobIn("j-000053", v1::TIMEOUT)});
  EXPECT_EQ(run({"wait", "53"}).rc, kExitJobTimeout);
  r = run({"-o", "json", "wait", "51"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out.rfind("{\"jobs\":[{\"id\":\"j-000051\"", 0), 0u) << r.out;
  // A job that stays live: --wait-timeout ends the wait with its own status.
  service_.script("j-000054", {jobIn("j-000054", v1::RUNNING)});
  const auto start = std::chrono::steady_clock::now();
  r = run({"wait", "54", "--wait-timeout", "0.5"});
  EXPECT_EQ(r.rc, kExitWaitTimeout);
  EXPECT_NE(r.err.find("gave up waiting after 0.5 s; still live: j-000054"), std::string::npos) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  r = run({"wait", "404"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.err, "ddlctl: job j-000404 not found\n");
}

TEST_F(DdlctlServerTest, SubmitWaitAndNewFlags) {
  service_.script("j-000007", {jobIn("j-000007", v1::RUNNING), jobIn("j-000007", v1::SUCCEEDED)});
  Result r = run({"submit", "--gpus", "1", "--wait", "--time", "2h", "--after-ok", "5,6", "--after-any", "j-9",
                  "--hold", "--env", "A=1", "B=2", "C=3", "--workdir", "sub", "--", "python", "B=4"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "j-000007\nj-000007 SUCCEEDED\n");
  v1::JobSpec spec = service_.lastSpec();
  EXPECT_EQ(spec.time_limit_s(), 7200);
  EXPECT_EQ(std::vector<std::string>(spec.after_ok().begin(), spec.after_ok().end()),
            (std::vector<std::string>{"j-000005", "j-000006"}));
  EXPECT_EQ(spec.after_any(0), "j-000009");
  EXPECT_TRUE(spec.hold());
  EXPECT_EQ(std::vector<std::string>(spec.env().begin(), spec.env().end()),
            (std::vector<std::string>{"A=1", "B=2", "C=3"}))
      << "several values after one --env";
  EXPECT_EQ(std::vector<std::string>(spec.command().begin(), spec.command().end()),
            (std::vector<std::string>{"python", "B=4"}));
  EXPECT_EQ(spec.workdir(), (std::filesystem::current_path() / "sub").string());

  service_.script("j-000007", {jobIn("j-000007", v1::FAILED, 42)});
  EXPECT_EQ(run({"submit", "--gpus", "1", "--wait", "--", "x"}).rc, 42);

  // Several job ids after one --after-ok / --after-any, as with --env. Fails when each flag took one value
  // ("67" was then taken for the command).
  r = run({"submit", "--gpus", "1", "--after-ok", "1", "67", "--after-any", "8", "j-9,10", "--name", "d",
           "--", "true"});
  EXPECT_EQ(r.rc, 0) << r.err;
  spec = service_.lastSpec();
  EXPECT_EQ(std::vector<std::string>(spec.after_ok().begin(), spec.after_ok().end()),
            (std::vector<std::string>{"j-000001", "j-000067"}));
  EXPECT_EQ(std::vector<std::string>(spec.after_any().begin(), spec.after_any().end()),
            (std::vector<std::string>{"j-000008", "j-000009", "j-000010"}));
  EXPECT_EQ(spec.name(), "d");

  // --export ALL sends the environment, but never the token.
  setenv("DDLCTL_TEST_VAR", "v", 1);
  setenv("DDL_TOKEN", "ddl_secret", 1);
  r = run({"submit", "--gpus", "1", "--export", "ALL", "--env", "DDLCTL_TEST_VAR=w", "--", "x"});
  unsetenv("DDL_TOKEN");
  unsetenv("DDLCTL_TEST_VAR");
  EXPECT_EQ(r.rc, 0) << r.err;
  spec = service_.lastSpec();
  std::vector<std::string> env(spec.env().begin(), spec.env().end());
  EXPECT_EQ(std::count(env.begin(), env.end(), "DDLCTL_TEST_VAR=w"), 1);
  EXPECT_EQ(std::count(env.begin(), env.end(), "DDLCTL_TEST_VAR=v"), 0);
  for (const std::string& e : env) EXPECT_EQ(e.find("ddl_secret"), std::string::npos) << e;
  EXPECT_GT(env.size(), 1u);
  // Without --export, only --env (today's behaviour).
  ASSERT_EQ(run({"submit", "--gpus", "1", "--", "x"}).rc, 0);
  EXPECT_EQ(service_.lastSpec().env_size(), 0);
}

TEST_F(DdlctlServerTest, SubmitArrayPrintsItsIds) {
  Result r = run({"submit", "--gpus", "1", "--array", "0-2", "--", "x"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(service_.lastSubmit().array(), "0-2");
  EXPECT_EQ(r.out, "j-000007\nj-000008\nj-000009\n");
  r = run({"submit", "--gpus", "1", "--array", "0-99%4", "--", "x"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "j-000007\n... j-000106 (100 jobs in array j-000007)\n");
  r = run({"-o", "json", "submit", "--gpus", "1", "--array", "1,3", "--", "x"});
  EXPECT_NE(r.out.find("\"array_jobs\":[\"j-000007\",\"j-000008\"]"), std::string::npos) << r.out;
}

// `ddlctl submit script.sh args`: #DDL lines are flags, the command line wins, the command is the script's
// absolute path. Fails without the script form ("put the job's command after --").
TEST_F(DdlctlServerTest, SubmitScriptWithDirectives) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ddlctl-script-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string script = (dir / "train.sh").string();
  {
    std::ofstream f(script);
    f << "#!/bin/bash\n#DDL --gpus 2 --name fromscript\n#DDL --env \"A=x y\" --time 10\n\npython train.py\n";
  }
  // Not executable: refused here, not with 126 on the node. Fails without the check (exit 0).
  Result r = run({"submit", script});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(
      r.err.find(script + " is not executable: chmod +x " + script + ", or submit -- /bin/bash " + script),
      std::string::npos)
      << r.err;
  std::filesystem::permissions(script, std::filesystem::perms::owner_exec,
                               std::filesystem::perm_options::add);
  r = run({"submit", "--name", "fromcli", script, "--epochs", "3", "--gpus", "9"});
  EXPECT_EQ(r.rc, 0) << r.err;
  v1::JobSpec spec = service_.lastSpec();
  EXPECT_EQ(spec.name(), "fromcli");
  EXPECT_EQ(spec.total_gpus(), 2);
  EXPECT_EQ(spec.time_limit_s(), 600);
  EXPECT_EQ(spec.env(0), "A=x y");
  EXPECT_EQ(std::vector<std::string>(spec.command().begin(), spec.command().end()),
            (std::vector<std::string>{script, "--epochs", "3", "--gpus", "9"}))
      << "words after the script are its own";
  // A shape on the command line replaces the script's.
  r = run({"submit", "--nodes", "2", script});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(service_.lastSpec().nodes(), 2);
  EXPECT_EQ(service_.lastSpec().total_gpus(), 0);
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n#DDL --gpus 1\n#DDL --frobnicate 3\necho\n";
  }
  r = run({"submit", script});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find(script + " line 3: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--frobnicate"), std::string::npos) << r.err;
  // A bad value names the line too. Fails without the per-line value check (no file or line in the error).
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n#DDL --gpus 1\n#DDL --time 0\necho\n";
  }
  r = run({"submit", script});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find(script + " line 3: --time '0' is no time at all"), std::string::npos) << r.err;
  {
    std::ofstream f(script);
    f << "#!/bin/sh\n#DDL --gpus 1 --env NOVALUE\necho\n";
  }
  r = run({"submit", script});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find(script + " line 2: --env 'NOVALUE' is not KEY=VALUE"), std::string::npos) << r.err;
  {
    std::ofstream f(script);
    f << "echo no shebang\n";
  }
  r = run({"submit", "--gpus", "1", script});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find("put the job's command after --"), std::string::npos) << r.err;
  std::filesystem::remove_all(dir);
}

// SECURITY: a shared script's #DDL line cannot set ddlctl's own flags, or it could send the user's token to
// another server. Here the directive points at the (reachable) fake while the command line names a dead
// address: without the refusal the directive's --coordinator wins and the job is submitted (exit 0).
TEST_F(DdlctlServerTest, SecurityScriptDirectivesSetSubmitFlagsOnly) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ddlctl-script-sec-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string script = (dir / "shared.sh").string();
  for (const std::string& directive :
       std::vector<std::string>{"--coordinator " + address_, "--coordinator=" + address_,
                                "--gpus 1 --token-file /dev/null", "--ca /dev/null", "--insecure", "-o json",
                                "-ojson", "--output=json", "--timeout 1", "--version"}) {
    {
      std::ofstream f(script);
      f << "#!/bin/sh\n#DDL --gpus 1\n#DDL " << directive << "\necho\n";
    }
    std::filesystem::permissions(script, std::filesystem::perms::owner_all);
    Result r = ddlctl({"--coordinator", "127.0.0.1:1", "submit", script});
    EXPECT_EQ(r.rc, kExitUsage) << directive << ": " << r.err;
    EXPECT_NE(r.err.find(script + " line 3: #DDL may set only submit's flags"), std::string::npos)
        << directive << ": " << r.err;
  }
  EXPECT_EQ(service_.lastSpec().command_size(), 0) << "nothing reached the directive's coordinator";
  std::filesystem::remove_all(dir);
}

TEST_F(DdlctlServerTest, CancelSeveralByFilterAndSignal) {
  Result r = run({"cancel", "1", "2", "000001"});
  EXPECT_EQ(r.rc, kExitRefused) << "the first failure's status";
  EXPECT_EQ(r.out, "j-000001 CANCELLED\nj-000001 CANCELLED\n") << "a refusal does not stop the rest";
  EXPECT_EQ(r.err, "ddlctl: job j-000002 already finished (SUCCEEDED)\n");
  // By filter: alice's live jobs are listed, then each is cancelled; a refusal does not stop the rest.
  r = run({"cancel", "--user", "alice", "--state", "running,failed"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.out, "j-000001 CANCELLED\n");
  EXPECT_EQ(r.err, "ddlctl: job j-000003 already finished (SUCCEEDED)\n");
  EXPECT_EQ(service_.lastList().user(), "alice");
  r = run({"cancel", "--user", "nobody"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "ddlctl: no live job matches --user nobody; nothing was cancelled\n");
  const v1::ListJobsRequest listed = service_.lastList();
  EXPECT_EQ(std::vector<int>(listed.states().begin(), listed.states().end()),
            (std::vector<int>{v1::PENDING, v1::SCHEDULED, v1::STARTING, v1::RUNNING}));
  // --signal: the job goes on.
  r = run({"cancel", "1", "--signal", "usr1"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "j-000001 sent SIGUSR1 (RUNNING)\n");
  EXPECT_EQ(service_.cancels().back().signal(), SIGUSR1);
  ASSERT_EQ(run({"cancel", "1", "--signal", "15"}).rc, 0);
  EXPECT_EQ(service_.cancels().back().signal(), 15);
  r = run({"-o", "json", "cancel", "1"});  // one id: the Job, as before
  EXPECT_EQ(r.out.rfind("{\"id\":\"j-000001\"", 0), 0u) << r.out;
}

// A filter without --user matches the caller's own jobs (WhoAmI); an anonymous caller's, everyone's. Fails
// without the default (the request's user was "", every user's jobs).
TEST_F(DdlctlServerTest, CancelByFilterIsTheCallersOwnUnlessUserIsGiven) {
  Result r = run({"cancel", "--state", "running", "--name", "train"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(service_.lastList().user(), "alice");
  EXPECT_EQ(r.out, "j-000001 CANCELLED\n");
  r = run({"cancel", "--name", "nothing"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.err,
            "ddlctl: no live job matches --user alice (yours, by default) --name nothing; nothing was "
            "cancelled\n");
  service_.setWhoAmI("");  // a coordinator run --insecure: no name, no user filter
  ASSERT_EQ(run({"cancel", "--name", "train"}).rc, 0);
  EXPECT_EQ(service_.lastList().user(), "");
  service_.setWhoAmI("alice");
  ASSERT_EQ(run({"cancel", "--name", "eval", "--user", "bob"}).rc,
            kExitRefused);  // the fake refuses j-000002
  EXPECT_EQ(service_.lastList().user(), "bob");
}

// --signal with a filter and no --state: RUNNING jobs only (the coordinator signals no other), and a miss
// says nothing was signalled. Fails without it (every live state listed; "nothing was cancelled").
TEST_F(DdlctlServerTest, CancelSignalByFilterListsRunningJobsOnly) {
  Result r = run({"cancel", "--signal", "usr1", "--name", "train"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "j-000001 sent SIGUSR1 (RUNNING)\n");
  v1::ListJobsRequest listed = service_.lastList();
  EXPECT_EQ(std::vector<int>(listed.states().begin(), listed.states().end()),
            (std::vector<int>{v1::RUNNING}));
  EXPECT_EQ(service_.cancels().back().signal(), SIGUSR1);
  r = run({"cancel", "--signal", "usr1", "--name", "nothing"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.err,
            "ddlctl: no running job matches --user alice (yours, by default) --name nothing; nothing was "
            "signalled\n");
  ASSERT_EQ(run({"cancel", "--signal", "usr1", "--state", "pending,running", "--name", "train"}).rc, 0);
  listed = service_.lastList();
  EXPECT_EQ(std::vector<int>(listed.states().begin(), listed.states().end()),
            (std::vector<int>{v1::PENDING, v1::RUNNING}))
      << "--state given: as given";
}

// cancel --array ID: every live job whose array_id is ID (a short id too), picked from the listed pages.
// Fails without --array (exit 2: unknown option).
// ddlctl usage: a date alone is a UTC day (the rollups' days), other forms as list takes them; a period with
// only --since ends now, and one that ends before it starts is refused before anything is sent.
TEST_F(DdlctlServerTest, UsagePeriodsAreUtcDays) {
  ASSERT_EQ(run({"usage", "--since", "2026-12-01", "--until", "2026-12-03", "--by-account"}).rc, 0);
  v1::GetUsageRequest sent = service_.lastUsage();
  EXPECT_EQ(sent.since_ms(), 1796083200000);  // 2026-12-01T00:00:00Z
  EXPECT_EQ(sent.until_ms(), 1796256000000);  // 2026-12-03T00:00:00Z
  EXPECT_TRUE(sent.by_account());
  ASSERT_EQ(run({"usage", "--since", "2d", "--account", "lab", "--daily"}).rc, 0);
  sent = service_.lastUsage();
  EXPECT_NEAR(static_cast<double>(sent.since_ms()), static_cast<double>(unixNowMs() - 2 * 86400000LL), 60000);
  EXPECT_EQ(sent.until_ms(), 0);
  EXPECT_EQ(sent.account(), "lab");
  EXPECT_TRUE(sent.daily());
  Result r = run({"usage", "--since", "2026-02-30"});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find("--since 2026-02-30 is not a date"), std::string::npos) << r.err;
  r = run({"usage", "--since", "2999-01-01"});
  EXPECT_EQ(r.rc, kExitUsage);
  EXPECT_NE(r.err.find("is not before now"), std::string::npos) << r.err;
  EXPECT_EQ(run({"usage", "--by-account", "--user", "dora"}).rc, kExitUsage);
  // list keeps its own reading: --since in the future alone is no error (nothing matches yet).
  EXPECT_EQ(run({"list", "--since", "2999-01-01"}).rc, 0);
}

TEST_F(DdlctlServerTest, CancelArray) {
  std::vector<v1::Job> jobs;
  for (int i = 78; i <= 83; ++i) {
    char id[16];
    std::snprintf(id, sizeof(id), "j-%06d", i);
    jobs.push_back(makeJob(id, "a", "alice", v1::RUNNING, kNow));
    jobs.back().mutable_spec()->set_array_id(i < 80 ? "j-000078" : i < 83 ? "j-000080" : "");
  }
  service_.page(jobs);
  Result r = run({"cancel", "--array", "80"});
  EXPECT_EQ(r.rc, kExitRefused) << "the fake cancels j-000001 only: " << r.err;
  std::vector<std::string> cancelled;
  for (const v1::CancelJobRequest& c : service_.cancels()) cancelled.push_back(c.id());
  EXPECT_EQ(cancelled, (std::vector<std::string>{"j-000080", "j-000081", "j-000082"}));
  const v1::ListJobsRequest listed = service_.lastList();
  EXPECT_EQ(std::vector<int>(listed.states().begin(), listed.states().end()),
            (std::vector<int>{v1::PENDING, v1::SCHEDULED, v1::STARTING, v1::RUNNING}));
  EXPECT_EQ(listed.user(), "alice");
  r = run({"cancel", "--array", "j-99", "--signal", "TERM"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.err,
            "ddlctl: no running job matches --array j-000099 --user alice (yours, by default); nothing "
            "was signalled\n");
  EXPECT_EQ(service_.cancels().size(), 3u);
}

TEST_F(DdlctlServerTest, HoldReleaseRequeueAndDrainReason) {
  Result r = run({"hold", "2"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "j-000002 PENDING (held)\n");
  r = run({"release", "000002"});
  EXPECT_EQ(r.out, "j-000002 PENDING\n");
  ASSERT_EQ(service_.holds().size(), 2u);
  EXPECT_TRUE(service_.holds()[0].hold());
  EXPECT_FALSE(service_.holds()[1].hold());
  r = run({"hold", "2", "77"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_EQ(r.out, "j-000002 PENDING (held)\n");
  EXPECT_EQ(r.err, "ddlctl: job j-000077 not found\n");
  r = run({"requeue", "1"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "j-000001 PENDING\n");
  r = run({"requeue", "3"});  // a coordinator without RequeueJob
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_NE(r.err.find("hint: the coordinator is older than this ddlctl"), std::string::npos) << r.err;
  r = run({"drain", "n3", "--reason", "bad DIMM"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(service_.lastDrain().reason(), "bad DIMM");
  EXPECT_TRUE(service_.lastDrain().drain());
}

// logs -f waits through PENDING, prints the last line only (--tail 1) with a receive time, moves to the
// second attempt with a marker, and exits with the job's code. Fails without each part: the first GetLogs
// was a refusal ("has not been launched"), every line was printed, the second attempt was never read, or
// the exit was 0.
TEST_F(DdlctlServerTest, LogsFollowWaitsTailsAndFollowsEveryAttempt) {
  Result r = run({"logs", "60", "-f", "--tail", "1", "--timestamps"});
  EXPECT_EQ(r.rc, 3) << r.err;
  EXPECT_NE(r.err.find("waiting for j-000060 (PENDING: waiting for 2 free GPUs)\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("==> attempt 2 (restart 1 of 3) <==\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("one"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("two"), std::string::npos) << r.out;
  ASSERT_NE(r.out.find(" three\n"), std::string::npos) << r.out;
  ASSERT_NE(r.out.find(" again\n"), std::string::npos) << r.out;
  EXPECT_LT(r.out.find("three"), r.out.find("again"));
  // "2026-11-24 10:00:00.123 three": a local time first.
  EXPECT_EQ(r.out[4], '-') << r.out;
  EXPECT_EQ(r.out[23], ' ') << r.out;
  // Without -f a job that has not been launched is the coordinator's refusal, as before.
  service_.script("j-000061", {jobIn("j-000061", v1::PENDING)});
  r = run({"logs", "61"});
  EXPECT_EQ(r.rc, kExitRefused);
  EXPECT_NE(r.err.find("has not been launched"), std::string::npos) << r.err;
}

// logs -f after a requeue (PENDING again) or a restart that lands on other nodes: the latest attempt is
// probed again, the old attempt's partial line is flushed, the offsets start over, and the marker says
// "(requeued)" when Job.restarts did not grow. Fails without it: the old attempt is read on, NOT_FOUND
// there ends ddlctl with exit 1, and the marker said "(restart 0 of 0)".
TEST_F(DdlctlServerTest, LogsFollowMovesToTheNewAttemptOnOtherNodes) {
  service_.moving("j-000062");
  Result r = run({"logs", "62", "-f"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "a1\npartial\nb2\n");
  EXPECT_NE(r.err.find("waiting for j-000062 (PENDING)\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("==> attempt 2 (requeued) <==\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("ddlctl:"), std::string::npos) << r.err;

  service_.moving("j-000063");
  r = run({"logs", "63", "-f"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.out, "a1\npartial\nb2\n");
  EXPECT_EQ(r.err, "==> attempt 2 (restart 1 of 2) <==\n");
}

// ddlctl accounts and shares: each account under its parent, the normalised shares worked out down the tree.
TEST(DdlctlFormat, AccountTreeAndShares) {
  v1::ListAccountsResponse accounts;
  auto add = [&](const std::string& name, const std::string& parent, int64_t share, int users) {
    v1::Account* a = accounts.add_accounts();
    a->set_name(name);
    a->set_parent(parent);
    a->set_share(share);
    a->set_users(users);
  };
  add("root", "", 1, 0);
  add("ops", "root", 1, 2);
  add("science", "root", 2, 0);
  add("physics", "science", 3, 5);
  const std::string tree = formatAccountTree(accounts);
  EXPECT_NE(tree.find("\n    physics  3      0.667  5      -\n"), std::string::npos) << tree;
  EXPECT_NE(tree.find("\n  ops        1      0.333  2      -\n"), std::string::npos) << tree;

  v1::GetSharesResponse shares;
  shares.set_half_life_s(7 * 86400);
  v1::ShareRow* root = shares.add_accounts();
  root->set_account("root");
  root->set_norm_share(1);
  root->set_usage_gpu_s(7200);
  root->set_norm_usage(1);
  root->set_factor(0.5);
  v1::ShareRow* a = shares.add_accounts();
  a->set_account("a");
  a->set_parent("root");
  a->set_depth(1);
  a->set_share(2);
  a->set_norm_share(2.0 / 3);
  a->set_usage_gpu_s(3600);
  a->set_norm_usage(0.5);
  a->set_factor(0.595);
  const std::string table = formatShares(shares);
  EXPECT_NE(table.find("\n  a      2      0.667       1.00       0.500       0.595\n"), std::string::npos)
      << table;
  EXPECT_NE(table.find("(usage halves every 7 days)"), std::string::npos) << table;
}

// ddlctl usage: hours with two decimals, peak memory in units, a TOTAL line, the period; DAY and USER columns
// only when the rows have them; CSV with plain numbers.
TEST(DdlctlFormat, Usage) {
  v1::GetUsageResponse usage;
  usage.set_first_day("2026-11-30");
  usage.set_last_day("2026-12-06");
  usage.set_first_day_kept("2026-12-01");
  auto add = [&](const std::string& day, const std::string& account, const std::string& user, double gpu_s) {
    v1::UsageRow* r = usage.add_rows();
    r->set_day(day);
    r->set_account(account);
    r->set_user(user);
    r->set_gpu_seconds(gpu_s);
    r->set_cpu_seconds(gpu_s / 2);
    r->set_attempts(2);
    r->set_jobs(1);
    r->set_requeued(1);
    r->set_preempted(3);
    r->set_max_rss_bytes(int64_t{3} << 30);
  };
  add("2026-12-05", "lab", "dora", 5400);
  add("2026-12-06", "lab", "dora", 1800);
  const std::string table = formatUsage(usage);
  EXPECT_EQ(
      table,
      "DAY         ACCOUNT  USER  GPU-HOURS  CPU-HOURS  ATTEMPTS  JOBS  FAILED  REQUEUED  PREEMPTED  PEAK "
      "MEM\n"
      "2026-12-05  lab      dora  1.50       0.75       2         1     0       1         3          3 GiB\n"
      "2026-12-06  lab      dora  0.50       0.25       2         1     0       1         3          3 GiB\n"
      "            TOTAL          2.00       1.00       4         2     0       2         6          3 GiB\n"
      "(2026-11-30 to 2026-12-06, UTC days; nothing is kept before 2026-12-01)\n");
  EXPECT_EQ(formatUsageCsv(usage),
            "day,account,user,gpu_hours,cpu_hours,attempts,jobs,failed,requeued,max_rss_bytes,preempted\n"
            "2026-12-05,lab,dora,1.500000,0.750000,2,1,0,1,3221225472,3\n"
            "2026-12-06,lab,dora,0.500000,0.250000,2,1,0,1,3221225472,3\n");
  v1::GetUsageResponse empty;
  empty.set_first_day("2026-12-06");
  empty.set_last_day("2026-12-06");
  EXPECT_EQ(formatUsage(empty),
            "ACCOUNT  GPU-HOURS  CPU-HOURS  ATTEMPTS  JOBS  FAILED  REQUEUED  PREEMPTED  PEAK MEM\n"
            "TOTAL    0.00       0.00       0         0     0       0         0          -\n"
            "(2026-12-06 to 2026-12-06, UTC days)\n");
}

// ddlctl qos: one row per QoS, "-" for nothing preempted and no limit, "(all)" for every account; submit
// --qos reaches the spec.
TEST(DdlctlFormat, QosAndSubmitQos) {
  v1::ListQosResponse qos;
  v1::Qos* normal = qos.add_qos();
  normal->set_name("normal");
  normal->set_grace_s(60);
  v1::Qos* urgent = qos.add_qos();
  urgent->set_name("urgent");
  urgent->set_priority(100);
  urgent->add_preempt("normal");
  urgent->add_preempt("scavenger");
  urgent->set_grace_s(30);
  urgent->set_gpus(8);
  urgent->add_accounts("ml");
  EXPECT_EQ(formatQos(qos),
            "QOS     PRIORITY  PREEMPTS          GRACE  GPUS  ACCOUNTS\n"
            "normal  0         -                 1m00s  -     (all)\n"
            "urgent  100       normal,scavenger  30.0s  8     ml\n");
  SubmitArgs a;
  a.gpus = 2;
  a.qos = "urgent";
  a.command = {"/usr/bin/python3", "train.py"};
  EXPECT_EQ(buildJobSpec(a).value->qos(), "urgent");
}

}  // namespace
