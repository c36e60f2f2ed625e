// ddlctl: the user CLI of ddl. One command line becomes one UserService RPC to the coordinator (list: one per
// page, logs: one per piece; cancel, hold, release, requeue: one per job; wait, submit --wait and logs -f poll
// until the job ends), and the answer becomes a table, a detail view or one JSON document on stdout.
// Every string from the server is escaped for the terminal before it is printed as text.
//
// ddlctl keeps no state: the coordinator is the only source of truth, and it re-validates every request. The
// checks made here (counts, KEY=VALUE, state names, HOST:PORT) exist so that a typo costs no round trip and
// the message names the flag. The formatting functions are pure (the clock is an argument) so tests can
// build Job and Node messages by hand and compare text.
//
// Exit statuses are an interface scripts rely on; they are listed in `ddlctl --help` and the user guide.
//
// Threads: runDdlctl() blocks its calling thread for one RPC deadline per request it makes; the verbs that wait
// (wait, submit --wait, logs -f) poll until the job ends or --wait-timeout (at most a year). Nothing here is
// shared, so several threads may call it at once.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "common/signals.h"
#include "ddl/v1/ddl.pb.h"

namespace ddl::cli {

constexpr int kExitOk = 0;
constexpr int kExitRefused = 1;  // the coordinator answered with an error (NOT_FOUND, INVALID_ARGUMENT...)
constexpr int kExitUsage = 2;    // bad flags or arguments; nothing was sent
constexpr int kExitUnreachable = 3;  // no answer: connection refused, deadline passed, coordinator going down
constexpr int kExitUnauthenticated = 4;  // no token, or one the coordinator does not know
constexpr int kExitDenied = 5;           // the identity may not do this (another user's job, an admin verb)
// The verbs that wait for jobs to end (wait, submit --wait, logs -f) exit with the job's own result instead:
// 0 for SUCCEEDED, the failing rank's exit code for FAILED (128+N for signal N), and these for the rest. A
// job's own exit code can be any of 1..255, so scripts that must tell them apart read `ddlctl status`.
constexpr int kExitJobCancelled = 6;  // the job was CANCELLED
constexpr int kExitJobTimeout = 7;    // the job ran past its time limit (TIMEOUT)
constexpr int kExitWaitTimeout = 8;   // --wait-timeout passed while a job was still live
constexpr const char* kDefaultCoordinator = "127.0.0.1:7070";
constexpr double kDefaultTimeoutS = 10;

// The whole CLI: parses argv (argv[0] is the program name), makes the RPC, prints the answer to `out` and
// every error to `err` as "ddlctl: ...". Returns the exit status.
int runDdlctl(int argc, char** argv, std::ostream& out, std::ostream& err);

// A value, or the sentence saying why the input is wrong (a usage error: exit 2).
template <typename T>
struct Parsed {
  std::optional<T> value;
  std::string error;
  bool ok() const { return value.has_value(); }
};

// Where ddlctl finds its credentials: --ca, else $DDL_CA, else ~/.config/ddl/ca.crt if it exists, else
// /etc/ddl/pki/ca.crt; the token from --token-file, else $DDL_TOKEN, else $DDL_TOKEN_FILE or
// ~/.config/ddl/token (never from the command line, where ps would show it). Returns "" or why the token file cannot be read.
struct Credentials {
  std::string ca;
  std::string token;
};
std::string findCredentials(const std::string& ca_flag, const std::string& token_file_flag, Credentials* out);

// ---- Argument checks (no I/O) ----------------------------------------------------------------------------

// "" when `address` is HOST:PORT (IPv6 in brackets: [::1]:7070, port 1..65535), or several of them separated
// by commas (coordinators that share an etcd store: ddlctl finds the one that leads), else why not.
std::string checkCoordinatorAddress(std::string_view address);

// Job state names, case-insensitive, each argument repeatable and comma-separated ("running,pending").
// Duplicates are dropped; order is kept. An unknown name is an error that lists the valid ones.
Parsed<std::vector<v1::JobState>> parseStates(const std::vector<std::string>& args);
std::string validStateNames();  // "PENDING, SCHEDULED, STARTING, RUNNING, SUCCEEDED, FAILED, CANCELLED, TIMEOUT"
bool isFinalState(v1::JobState state);  // SUCCEEDED, FAILED, CANCELLED or TIMEOUT

// A job id as the user may type it: "5", "000005" and "j-5" all mean "j-000005". Anything else is returned
// unchanged, so the coordinator's NOT_FOUND names what was typed.
std::string normalizeJobId(std::string_view id);

// The exit status a final job stands for (see kExitJobCancelled): SUCCEEDED 0; FAILED the first failing
// rank's exit code (Job.failure), 128+signal for a signal, 1 when the failure says neither (or says 0);
// CANCELLED kExitJobCancelled; TIMEOUT kExitJobTimeout. nullopt while the job is live.
std::optional<int> jobExitCode(const v1::Job& job);
// The worst of several final jobs: a FAILED one's code (the first in order) over TIMEOUT over CANCELLED over
// SUCCEEDED. A live job counts as kExitWaitTimeout, worse than all. 0 for no jobs.
int worstJobExit(const std::vector<v1::Job>& jobs);

// --time: Slurm's forms "MM", "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM", "D-HH:MM:SS", or a number with one
// unit: "90s", "30m", "2h", "1d". Seconds, at least 1 and at most 365 days, or the usage error.
Parsed<int> parseTimeLimit(std::string_view text);

// --array, checked here with the coordinator's own parser (common/array_spec.h) so a typo costs no round
// trip. The number of jobs (duplicate indices count once), or the usage error.
Parsed<int> checkArraySpec(std::string_view spec);

// --export: "NONE" (nothing), "ALL" (the whole `environ` but credentials and the variables ddl sets itself),
// or comma-separated VAR (its value from `environ`) and VAR=value, possibly after ALL ("ALL,A=1"). KEY=VALUE
// strings, or the usage error. Credentials (DDL_TOKEN, DDL_TOKEN_FILE) are never exported.
Parsed<std::vector<std::string>> exportedEnv(std::string_view spec, const std::vector<std::string>& environ);

// What `ddlctl submit` was given. Absent optionals are flags not given.
struct SubmitArgs {
  std::string name;  // "" = the command's basename
  std::optional<int> nodes;
  std::optional<int> gpusPerNode;
  std::optional<int> gpus;
  // An elastic job's minimum (--nodes MIN:MAX, --gpus MIN:MAX; nodes or gpus hold the MAX).
  std::optional<int> minNodes;
  std::optional<int> minGpus;
  std::string topology;
  int priority = 0;
  std::string account;  // "": the user's own
  std::string qos;      // "": normal
  int maxRestarts = 0;
  std::vector<std::string> env;     // KEY=VALUE
  std::vector<std::string> labels;  // KEY=VALUE, required node labels
  std::string workdir;  // "" = cwd; relative: against cwd
  std::string user;
  std::vector<std::string> command;
  std::string timeLimit;              // --time, as given
  std::string warnSignal;             // --signal SIG[@SECONDS], as given
  std::vector<std::string> afterOk;   // --after-ok, as given (comma-separated, short ids)
  std::vector<std::string> afterAny;  // --after-any
  bool hold = false;
  std::string exportSpec = "NONE";    // --export
  std::vector<std::string> environ;   // the submitter's environment, for --export
  std::string cwd;                    // the submitter's current directory
  std::optional<int> cpusPerRank;     // --cpus-per-rank
  std::string memPerRank;             // --mem-per-rank, as given ("8G")
};

// --signal SIG[@SECONDS] (sbatch's, without its R: and B: options): the signal (a name or a number 1..64) and
// how long before the time limit (1..65535 s; 60 when not given), or the usage error.
Parsed<std::pair<int, int>> parseWarnSignal(std::string_view text);

// The JobSpec for a submit, or the usage error. Shapes: --gpus T alone (a total, placed on as few nodes as
// possible), or --nodes N with --gpus-per-node G (default 1). Neither, or both, is an error. The env is the
// exported variables (--export) with --env's after them; a variable in both is sent with --env's value only.
Parsed<v1::JobSpec> buildJobSpec(const SubmitArgs& args);
// The checks of buildJobSpec that need one flag's value only (counts, KEY=VALUE, --time, --export,
// --topology, --after-ok/--after-any), not how flags combine: a script's #DDL line is checked with these on
// its own, so that its error can name the line. "" or the usage error.
std::string checkSubmitValues(const SubmitArgs& args);

// --since / --until: an absolute local time ("2026-11-24", "2026-11-24T10:00", "2026-11-24 10:00:05"), a time
// of day ("06:55", "06:55:30": that time on `nowMs`'s local date, as Slurm takes it) or an age ("90s", "30m",
// "1h", "2d", "1w": that long before `nowMs`). Unix milliseconds, or the usage error.
Parsed<int64_t> parseTimeBound(std::string_view text, int64_t nowMs);

// `ddlctl submit script.sh`: the "#DDL --flag value" lines of a script (as sbatch's #SBATCH), each split
// into words as a shell would (quotes, backslashes; no expansion). Read from the second line up to the first
// line that is neither blank nor a comment. `line` is 1-based. Error: the line that cannot be split.
struct Directive {
  int line = 0;
  std::vector<std::string> args;
};
Parsed<std::vector<Directive>> parseScriptDirectives(std::string_view script);

// ---- RPC failures ----------------------------------------------------------------------------------------

struct RpcError {
  int exitCode = kExitRefused;
  std::string message;  // printed as "ddlctl: <message>"
  std::string hint;     // "" or printed as "hint: <hint>"
};

// Maps a failed RPC to what the user sees: UNAVAILABLE and DEADLINE_EXCEEDED mean the coordinator could not
// be reached (exit 3; a failed TLS handshake says so, and a plaintext connection closed by a TLS coordinator,
// with `insecure`, says to drop --insecure), except an UNAVAILABLE that the coordinator itself answered (its
// store failing: a full disk), which says it runs but could not do it (exit 3 too); UNAUTHENTICATED is exit 4
// and PERMISSION_DENIED exit 5; every other code is the coordinator refusing the request (exit 1, its own
// message).
RpcError describeRpcError(grpc::StatusCode code, const std::string& message, const std::string& address,
                          double timeoutS, bool insecure = false);
// True for an UNAVAILABLE message that gRPC's transport wrote (no connection, a closed socket, a failed
// handshake), false for one the coordinator answered with.
bool isTransportFailure(const std::string& message);
// "" when `path` holds a CA certificate valid now, else what is wrong with it (unreadable, not a certificate,
// expired, not yet valid).
std::string checkCa(const std::string& path);

// ---- Formatting (pure; `nowMs` is unix milliseconds) ------------------------------------------------------

// `text` safe for a terminal: control characters (C0, DEL, and C1 as UTF-8) are shown escaped (\n, \t, \r,
// \x1b, \u009b), as is every byte that is not part of valid UTF-8 (\xff); printable UTF-8 is unchanged. Every
// string from the server goes through this before ddlctl prints it as text (JSON escapes on its own).
std::string escapeForTerminal(std::string_view text);
// At most `maxChars` characters (UTF-8 code points) of `text`, the last one "…" when it was cut.
std::string truncateCell(std::string_view text, size_t maxChars);
// Table columns are cut to these widths so one long value cannot widen every row.
constexpr size_t kMaxNameColumn = 40;   // job and node names, users
constexpr size_t kMaxWideColumn = 100;  // labels, node lists, reasons

std::string formatAge(int64_t ms);       // coarse, one unit, floor: "5s", "3m", "2h", "4d"; negative -> "0s"
std::string formatDuration(int64_t ms);  // finer: "850ms", "12.3s", "5m07s", "2h03m", "3d04h"
std::string formatLocalTime(int64_t unixMs);              // "2024-05-01 12:03:04.123" in the local time zone
using ddl::signalName;                                    // common/signals.h: "SIGKILL"; "signal 77"
std::string describeFailure(const v1::Failure& failure);  // "rank 3 on n2: killed by SIGKILL"
std::string describeRequest(const v1::JobSpec& spec);     // "2 nodes x 4 GPUs" / "6 GPUs"
std::string shellJoin(const std::vector<std::string>& argv);  // quoted only where a shell would need it

// The NODELIST(REASON) cell: allocated node names for placed jobs, "(reason)" for PENDING and FAILED ones.
std::string nodeListOrReason(const v1::Job& job);

std::string formatJobTable(const v1::ListJobsResponse& jobs, int64_t nowMs);
// The job table a page at a time: the header comes with the first page, and a column's width only grows, so
// pages printed as they arrive line up unless a later page holds a wider (still capped) cell.
class JobTableWriter {
 public:
  std::string page(const v1::ListJobsResponse& jobs, int64_t nowMs);

 private:
  bool headerDone_ = false;
  std::vector<size_t> width_;
};
std::string formatNodeTable(const v1::ListNodesResponse& nodes, int64_t nowMs);
// `ddlctl nodes -v`'s part under the table: per node, a row per GPU (model, memory, NUMA node and its CPUs,
// NVLink island and peers, nearest NIC, PCI address, and the job holding it) and a line of its NICs.
std::string formatNodeInsides(const v1::ListNodesResponse& nodes);
// The account tree, each account under its parent, with its share, its normalised share (its part of the
// whole cluster: its share over its siblings' times its parent's part, as sshare's NormShares) and its users.
std::string formatAccountTree(const v1::ListAccountsResponse& accounts);
// `ddlctl qos`: each QoS's priority, what it preempts, its grace, GPU limit and accounts (sacctmgr show qos).
std::string formatQos(const v1::ListQosResponse& qos);
// "at most 8 GPUs, 4 running, 100 pending", "no limits".
std::string formatLimits(const v1::Limits& limits);
// ddlctl shares: each account's share, normalised share, decayed usage (GPU-hours), normalised usage and
// fair-share factor, indented under its parent (Slurm's sshare).
std::string formatShares(const v1::GetSharesResponse& shares);
// ddlctl usage: a table of the rows (GPU- and CPU-hours, attempts, jobs, failures, requeues, peak memory) and
// a TOTAL line; or CSV (-o csv) with a header line, hours as plain numbers and memory in bytes.
std::string formatUsage(const v1::GetUsageResponse& usage);
std::string formatUsageCsv(const v1::GetUsageResponse& usage);
std::string formatJobDetail(const v1::Job& job, int64_t nowMs);

// The message as JSON (proto field names, default values printed), with a trailing newline.
std::string toJson(const google::protobuf::Message& message);

}  // namespace ddl::cli
