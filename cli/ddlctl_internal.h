// ddlctl's insides that its source files share, and nothing more: the parsed command line (CommandLine), the
// connection every verb calls through (Session), and the small text helpers used in more than one file. Not
// installed and not a contract: ddlctl.h is the one tests and main.cpp rely on. The files of cli/, the first
// three along ddlctl.h's sections:
//
//   arguments.cpp     the argument checks (no I/O)
//   connection.cpp    RPC failures, credentials, and Session
//   format.cpp        the tables, detail views and JSON
//   command_line.cpp  CommandLine's flags (CLI11) and the parse errors said for a person
//   verbs.cpp         one function per verb, and the polling of the verbs that wait
//   logs.cpp          ddlctl logs, -f's following of a job through its attempts
//   ddlctl.cpp        runDdlctl(): the job command after "--", a job script's #DDL lines, the checks before
//                     any RPC
//
// Threads: as ddlctl.h; a Session belongs to the one runDdlctl() call that made it.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/host_port.h"
#include "ddl/v1/ddl.grpc.pb.h"
#include "ddlctl.h"

namespace ddl::cli {

// ---- Text helpers -----------------------------------------------------------------------------------------

inline bool isDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

inline std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

inline std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? "" : std::string(s.substr(b, e - b + 1));
}

inline std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

// Splits "KEY=VALUE"; nullopt when there is no '=' or the key is empty.
inline std::optional<std::pair<std::string, std::string>> splitKeyValue(const std::string& s) {
  size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0) return std::nullopt;
  return std::make_pair(s.substr(0, eq), s.substr(eq + 1));
}

// An environment variable's name: letters, digits and '_', not starting with a digit (arguments.cpp).
bool isEnvName(std::string_view name);

// The formatting helpers the verbs use too (format.cpp).
std::string formatSeconds(double s);  // "10" rather than "10.000000"
std::string stateName(v1::JobState s);
int requestedGpus(const v1::JobSpec& spec);  // the job's GPUs, from either shape of request
std::string nodeState(const v1::Node& n);    // "UP", "DRAINING", "DOWN", or "DOWN (drained)"

// This process's environment, for --export (verbs.cpp).
std::vector<std::string> processEnvironment();

// What a failed call's status says of the call (connection.cpp): the coordinator could not be reached and
// nothing was sent; or it was not answered (no answer in time, a lost connection, a coordinator shutting
// down: the call may or may not have been done), which the verbs that wait ride out.
bool neverSent(const grpc::Status& status);
bool outage(const grpc::Status& status);
// The coordinator's answer that it cannot store its state (common/status.h kCannotStoreState): nothing was
// done.
bool isStoreRefusal(const grpc::Status& status);

// Prints "ddlctl: <message>" and where to find the usage (the verb's own --help when `verb` is given);
// returns kExitUsage (command_line.cpp).
int usageError(std::ostream& err, const std::string& message, const std::string& verb = "");

// ---- The command line (command_line.cpp) ------------------------------------------------------------------

// Everything the command line said; CLI11 fills it while parsing.
struct CommandLine {
  std::string coordinator;  // "" = not given
  std::string ca;           // "" = not given
  std::string tokenFile;    // "" = not given
  bool insecure = false;
  std::string adminVerb;  // admin's subcommand
  std::string role = "user";
  bool rotate = false;
  std::string account;  // admin add-user --account
  std::string parent;   // admin add-account --parent
  int64_t share = 0;    // admin add-account --share; 0: not given
  bool update = false;  // admin add-account --update
  std::string limitAccount, limitUser;                       // admin set-limit --account / --user
  std::optional<int> limitGpus, limitRunning, limitPending;  // admin set-limit: the limits given
  std::optional<double> limitGpuHours;
  std::string limitPeriod;
  // admin add-qos: the fields given (preempt and accounts comma-separated; "" clears them)
  std::optional<int64_t> qosPriority, qosGraceS;
  std::optional<int> qosGpus;
  std::optional<std::string> qosPreempt, qosAccounts;
  // admin user-accounts --add / --remove / --default
  std::string joinAccounts, leaveAccounts, defaultAccount;
  std::string outDir;
  int days = 0;
  int ttlS = 3600;
  std::string output = "text";
  double timeoutS = kDefaultTimeoutS;
  std::string verb;
  SubmitArgs submit;
  std::vector<std::string> states;
  std::string user;
  bool userGiven = false;   // cancel: --user was given (else the filter is the caller's own jobs)
  std::string cancelArray;  // cancel --array
  bool all = false;
  std::string name;                  // list --name
  std::string since;                 // list --since, as given
  std::string until;                 // list --until, as given
  int pageSize = 0;                  // list --page-size; 0 = the coordinator's default
  std::string nodesVerb;             // "" (list nodes) or "remove"
  bool verbose = false;              // nodes -v: each node's GPUs, where they sit, and its NICs
  std::string target;                // the JOB or NODE argument
  std::optional<int> rank;           // logs: one rank only
  int attempt = 0;                   // logs: 0 = the latest launch
  bool follow = false;               // logs -f
  std::optional<int> tail;           // logs --tail N
  bool timestamps = false;           // logs --timestamps
  std::vector<std::string> targets;  // wait, cancel, hold, release, requeue: JOB...
  bool wait = false;                 // submit --wait
  double waitTimeoutS = 0;           // --wait-timeout; 0 = until the job ends
  double reconnectS = 600;           // --reconnect-timeout: how long wait/logs -f ride out a lost coordinator
  std::string array;                 // submit --array
  std::string requestId;             // submit --request-id; "" = ddlctl makes one
  std::string signal;                // cancel --signal, as given
  std::string reason;                // drain --reason
  int gpu = -1;                      // admin gpu-ok NODE GPU
  bool byAccount = false;            // usage --by-account
  bool daily = false;                // usage --daily
};

struct ParseResult {
  int rc = -1;        // -1: parsed, go on; else the exit status (help and --version print and give 0)
  std::string error;  // a usage error, unprinted
  std::string verb;   // with an error: the verb it is about ("submit", "admin add-user"), "" for ddlctl's own
  std::vector<std::string> rest;  // submit: the command words given without "--" (a script and its args)
};

// Parses `words` (words[0] is the program) into `cl`. `inSubmit`: the words are submit's flags only (a
// script's directives), checked on their own.
ParseResult parseWords(const std::vector<std::string>& words, CommandLine& cl, bool inSubmit,
                       std::ostream& out, std::ostream& err);

// ---- The connection (connection.cpp) ----------------------------------------------------------------------

// One channel to the coordinator and the per-call deadline; every verb makes exactly one call through it.
// The channel connects lazily, on the first call. Several addresses (coordinators sharing an etcd store, of
// which only the leader listens): the call goes to the first one a connection can be made to (within 3 s),
// from the one that answered last; it is never sent twice.
class Session {
 public:
  using Rpc = std::function<grpc::Status(v1::UserService::Stub&, grpc::ClientContext*)>;

  Session(const CommandLine& cl, const Credentials& credentials, std::ostream& out, std::ostream& err)
      : address_(cl.coordinator),
        timeoutS_(cl.timeoutS),
        json_(cl.output == "json"),
        insecure_(cl.insecure),
        reconnectS_(cl.reconnectS),
        credentials_(credentials),
        addresses_(splitAddressList(cl.coordinator)),
        out_(out),
        err_(err) {}

  std::ostream& out() { return out_; }

  // Runs `rpc` under the deadline; on failure prints the error and returns its exit status. The channel is
  // made on the first call, so the verb's own checks come before a missing CA certificate is reported.
  int call(const Rpc& rpc);

  // As call(), but a failure is returned, not printed: the verbs that wait decide what a refusal means.
  // `usage` is set to kExitUsage (already printed) when there is no CA certificate to connect with.
  grpc::Status callQuiet(const Rpc& rpc, int* usage);

  // For the verbs that wait (wait, submit --wait, logs -f): as callQuiet, but once the coordinator has
  // answered in this session, a call it cannot answer (UNAVAILABLE or no answer in time: a restart, an
  // upgrade, its machine rebooting) is tried again, 0.2 s apart doubling to 5 s, for up to
  // --reconnect-timeout seconds, said on stderr when the outage starts and ends. Jobs run on meanwhile; only
  // reads are repeated.
  grpc::Status callRidingOut(const Rpc& rpc, int* usage);
  // callRidingOut, then report() as call() does.
  int callWaiting(const Rpc& rpc);
  // For a call that its request id makes safe to repeat (submit): as callRidingOut, from the first call on,
  // except where nothing can have been sent and there is nowhere else to try (a refused connection to the one
  // coordinator given: a wrong address, or none running). An answer, a refusal included, is never repeated.
  // `again` says on stderr what the repeats do.
  grpc::Status callIdempotent(const Rpc& rpc, int* usage, const std::string& again);
  // Whether any call of this session may have reached a coordinator (it was not refused a connection): a
  // submit that ends in an outage may then have made its job.
  bool maybeSent() const { return maybeSent_; }

  // Prints a failed call's error as call() does and returns its exit status; kExitOk for an OK status.
  int report(const grpc::Status& status);

  bool json() const { return json_; }

  // Prints the answer: the message as JSON, or `text` for people.
  int print(const google::protobuf::Message& message, const std::string& text);

 private:
  // The stub toward addresses_[i]; null (usage set) when there is no usable CA certificate.
  v1::UserService::Stub* stub(size_t i, int* usage);
  // Repeats `rpc` after an outage (`first`, said on stderr with `again`) until it is answered or
  // --reconnect-timeout has passed; each try on new channels, so a connection (and its TLS handshake) is
  // made afresh: a channel that lost its coordinator may take many seconds to try again, or never finish a
  // handshake with the one that took over.
  grpc::Status rideOut(const Rpc& rpc, int* usage, const grpc::Status& first, const std::string& again);

  std::string address_;
  double timeoutS_;
  bool json_;
  bool insecure_;
  double reconnectS_;
  bool reached_ = false;    // a call was answered: later outages are ridden out by callRidingOut
  bool maybeSent_ = false;  // a call may have reached a coordinator (maybeSent())
  Credentials credentials_;
  std::vector<std::string> addresses_;
  size_t current_ = 0;                                         // the address that answered last
  std::vector<std::shared_ptr<grpc::Channel>> channels_;       // one per address, made on first use
  std::vector<std::unique_ptr<v1::UserService::Stub>> stubs_;  // over them
  std::ostream& out_;
  std::ostream& err_;
};

// ---- The verbs (verbs.cpp, logs.cpp) ----------------------------------------------------------------------

// The pace and the bound of the verbs that wait (wait, submit --wait, logs -f): a poll every 200 ms at first,
// doubling to 1 s while nothing changes, until --wait-timeout (0: a year, so that no loop is unbounded). The
// rounds are counted too (the limit over the shortest sleep), so a clock that stands still ends the loop.
class Pacer {
 public:
  static constexpr int64_t kMinDelayMs = 200, kMaxDelayMs = 1000;
  static constexpr double kMaxWaitS = 366.0 * 86400;
  // Waits of kMinDelayMs doubling up to maxDelayMs, for at most limitS (<= 0: kMaxWaitS).
  explicit Pacer(double limitS, int64_t maxDelayMs = kMaxDelayMs)
      : maxDelayMs_(maxDelayMs),
        limitS_(limitS > 0 ? std::min(limitS, kMaxWaitS) : kMaxWaitS),
        deadlineMs_(steadyNowMs() + static_cast<int64_t>(limitS_ * 1000)),
        roundsLeft_(static_cast<int64_t>(limitS_ * 1000) / kMinDelayMs + 2) {}
  // False once the time or the rounds are spent; else sleeps (never past the deadline) and says true.
  bool sleep() {
    const int64_t left = deadlineMs_ - steadyNowMs();
    if (left <= 0 || --roundsLeft_ <= 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(delayMs_, left)));
    delayMs_ = std::min(delayMs_ * 2, maxDelayMs_);
    return true;
  }
  void reset() { delayMs_ = kMinDelayMs; }  // something changed: look again soon
  std::string limit() const { return formatSeconds(limitS_); }

 private:
  int64_t maxDelayMs_;
  double limitS_;
  int64_t deadlineMs_;
  int64_t roundsLeft_;
  int64_t delayMs_ = kMinDelayMs;
};

// The verb's one RPC and its output; local checks first, so a usage error sends nothing.
int runVerb(CommandLine& cl, Session& s, std::ostream& err);
// ddlctl logs (logs.cpp).
int runLogs(CommandLine& cl, Session& s, std::ostream& err);

}  // namespace ddl::cli
