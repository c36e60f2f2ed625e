// Plain record types for the coordinator's durable state: jobs, their lifecycle, and nodes.
//
// A job moves through
//
//   PENDING -> SCHEDULED -> STARTING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED | TIMEOUT
//
// and every move is recorded as a Transition (from, to, unix time in ms, reason, and for failures the first
// failing rank, its host and its exit code or signal). The legal moves are decided in exactly one place,
// allowedTransition(); applyTransition() is the one routine that checks and applies a move, used by the
// coordinator on its working copy and by DirectStore (direct_store.h), so nothing else decides the machine.
//
// Job ids are strings "j-000042": the prefix makes them unmistakable in logs and on the command line, the
// number is a store-assigned sequence that is never reused (not even after a restart), and the zero padding
// makes the common case sort as text the way it sorts as a number. Past 999999 the number simply grows wider
// ("j-1000000"); compare ids with jobIdNumber(), not as text.
//
// These are values with no behaviour beyond validation and the state machine (job.cpp); any thread may use
// them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/job_id.h"
#include "common/status.h"

namespace ddl::state {

// ---- Job state machine ------------------------------------------------------------------------------------

// The order is the proto's (convert.cpp maps by number); new states go at the end.
enum class JobState { kPending, kScheduled, kStarting, kRunning, kSucceeded, kFailed, kCancelled, kTimeout };

inline constexpr JobState kAllJobStates[] = {JobState::kPending,  JobState::kScheduled, JobState::kStarting,
                                             JobState::kRunning,  JobState::kSucceeded, JobState::kFailed,
                                             JobState::kCancelled, JobState::kTimeout};

const char* toString(JobState s);

// Inverse of toString(JobState); exact, upper case. nullopt for anything else.
std::optional<JobState> parseJobState(std::string_view text);

inline bool isTerminal(JobState s) {
  return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled ||
         s == JobState::kTimeout;
}

// The whole state machine. Terminal states are final. Besides the forward path:
//  - any live state may go to FAILED or CANCELLED; STARTING and RUNNING to TIMEOUT (the time limit);
//  - SCHEDULED -> PENDING gives back an allocation that was never launched (a node went away before
//    STARTING); it does not count as a restart;
//  - STARTING | RUNNING -> PENDING is a requeue to restart the job (max_restarts); it counts as a restart and
//    applyTransition() refuses it once the job's restarts reach max_restarts.
bool allowedTransition(JobState from, JobState to);

// A move that ends a launch attempt (applyTransition then records its AttemptUsage): from placed to the queue
// or to an end.
inline bool endsAttempt(JobState from, JobState to) {
  const bool placed =
      from == JobState::kScheduled || from == JobState::kStarting || from == JobState::kRunning;
  return placed && (to == JobState::kPending || isTerminal(to));
}
// True for the moves that restart a job that was (being) launched, and so consume one of max_restarts.
inline bool isRequeue(JobState from, JobState to) {
  return to == JobState::kPending && (from == JobState::kStarting || from == JobState::kRunning);
}

// ---- Records ----------------------------------------------------------------------------------------------

// What a user asked for. Counts are requests; placement decides what they mean together (nodes x
// gpus_per_node, or total_gpus spread as placement sees fit; 0 means "not given").
struct JobSpec {
  std::string name;
  std::string user;
  int nodes = 0;
  int gpus_per_node = 0;
  int total_gpus = 0;
  std::string topology_override;  // Empty: derive the ring layout from the allocation.
  int priority = 0;               // Higher runs first.
  int max_restarts = 0;
  std::vector<std::string> env;  // "KEY=VALUE"; the value may contain anything, including '=' and newlines.
  std::string workdir;
  std::vector<std::string> command;  // argv; argv[0] is the program. Elements are arbitrary bytes.
  // Every one must equal the node's label (e.g. gpu=a100). No '=', ',' or whitespace: see validateJobSpec().
  std::map<std::string, std::string> required_labels;
  int64_t time_limit_s = 0;              // 0: none; else the job ends TIMEOUT this long after it started RUNNING
  std::vector<std::string> after_ok;     // job ids that must SUCCEED before this one starts
  std::vector<std::string> after_any;    // job ids that must end (any way) before this one starts
  bool hold = false;                     // submitted held
  std::string array_id;                  // the array's first job; "" for a job outside an array
  int array_index = 0;
  int array_max_running = 0;             // 0: no limit
  // Per rank (a rank is a GPU), counted by placement and enforced by the agent; 0: not asked for.
  int cpus_per_rank = 0;
  int64_t memory_per_rank_bytes = 0;
  // The submitter's request id (SubmitRequest.request_id): a submit that repeats it gets this job back
  // instead of a second one, while the job is in the coordinator's memory. "" when none was given.
  std::string request_id;
  // The account the job is charged to (auth/users.h), set at submit; "" for jobs stored before accounts.
  std::string account;
  // sbatch's --signal SIG@SECONDS: the running ranks get warn_signal warn_before_s before the time limit
  // (needs time_limit_s, and warn_before_s below it); 0: none.
  int warn_signal = 0;
  int64_t warn_before_s = 0;
  std::string qos;  // its quality of service (placement/fair_share.h's Qos); "" is normal
  // Elastic (ddlctl submit --nodes MIN:MAX, --gpus MIN:MAX): placed as asked (nodes or total_gpus, the MAX),
  // it goes on without lost ranks while at least min_nodes whole nodes (or min_gpus ranks) are left, and
  // grows back when capacity returns. 0: not elastic.
  int min_nodes = 0;
  int min_gpus = 0;

  bool operator==(const JobSpec&) const = default;
};

inline bool isElastic(const JobSpec& spec) { return spec.min_nodes > 0 || spec.min_gpus > 0; }
// The ranks an elastic job needs at least (0 for another job).
inline int minRanks(const JobSpec& spec) {
  return spec.min_nodes > 0 ? spec.min_nodes * spec.gpus_per_node : spec.min_gpus;
}
// The ranks it is placed with and grows back to.
inline int maxRanks(const JobSpec& spec) {
  return spec.nodes > 0 ? spec.nodes * spec.gpus_per_node : spec.total_gpus;
}

// The first rank that failed. Exactly one of exit_code and signal is set.
struct Failure {
  int rank = -1;
  std::string host;
  std::optional<int> exit_code;
  std::optional<int> signal;

  bool operator==(const Failure&) const = default;
};

struct Transition {
  JobState from = JobState::kPending;
  JobState to = JobState::kPending;
  int64_t at_ms = 0;  // Unix time, milliseconds.
  std::string reason;
  std::optional<Failure> failure;

  bool operator==(const Transition&) const = default;
};

// What a job holds on one node: GPUs by local index, the CPUs its ranks are confined to (cpus_per_rank per
// GPU, in the order of gpus) and the memory of all its ranks there.
struct NodeAllocation {
  std::string node;
  std::vector<int> gpus;
  std::vector<int> cpus;
  int64_t memory_bytes = 0;

  bool operator==(const NodeAllocation&) const = default;
};

// A rank's collectives as libddl last reported them (RankProgress), all finite.
struct RankFigures {
  int64_t collectives = 0;
  int64_t bytes = 0;
  double seconds = 0;
  std::string last_op;
  int64_t last_bytes = 0;
  double last_us = 0;
  std::string last_algo;
  std::vector<double> dims_us;  // at most kMaxRankDims
  int world_size = 0;
  int64_t updated_ms = 0;

  bool operator==(const RankFigures&) const = default;
};

// One rank of a job's latest attempt as its agent reported it, kept after the job ends (ddlctl status, the
// dashboard). Written to the store when the rank starts and when it ends, not with every progress report.
struct RankResult {
  int rank = 0;
  int attempt = 0;
  std::string node;
  int gpu = 0;
  int pid = 0;          // its ddl-rank-shim (the process group)
  int program_pid = 0;  // the program itself; 0 unknown
  bool exited = false;
  std::optional<int> exit_code;
  std::optional<int> signal;
  int64_t started_ms = 0;
  int64_t exited_ms = 0;
  std::string error;  // why it could not be started
  RankFigures figures;  // its collectives when it was last heard from
  // Once it exited, where its agent measured them (the process and what it waited for, from wait4): the CPU
  // time it used (user + system) and its peak resident memory; 0: not measured (a rank adopted after an
  // agent restart, an agent older than these fields).
  double cpu_s = 0;
  int64_t max_rss_bytes = 0;

  bool operator==(const RankResult&) const = default;
};

// What one launch attempt used, recorded when it ends (accounting: ddlctl status, ddlctl usage). GPUs count
// from placement (SCHEDULED: they are the job's from then on, as fair-share charges them) to the attempt's
// end.
struct AttemptUsage {
  int attempt = 0;       // 1 for the first launch
  int64_t start_ms = 0;  // placed
  int64_t end_ms = 0;
  int gpus = 0;
  double gpu_s = 0;           // gpus x (end_ms - start_ms)
  double cpu_s = 0;           // the ranks' CPU time, where their agents measured it (RankResult::cpu_s)
  int64_t max_rss_bytes = 0;  // the largest rank's peak resident memory; 0 unknown
  // How it ended: the job's final state (SUCCEEDED, FAILED, CANCELLED, TIMEOUT), REQUEUED (a rank failed
  // and a restart was left, its node was lost, or it was requeued by hand) or PREEMPTED (kPreemptedEnd).
  std::string end;

  bool operator==(const AttemptUsage&) const = default;
};
inline constexpr const char* kPreemptedEnd = "PREEMPTED";  // AttemptUsage::end of a preempted attempt
inline constexpr size_t kMaxAttemptsKept = 64;  // Job::attempts keeps the latest this many

struct Job {
  std::string id;  // "j-000042"; see the file comment.
  JobSpec spec;
  JobState state = JobState::kPending;
  int restarts = 0;
  int64_t submit_ms = 0;
  std::vector<Transition> transitions;  // Oldest first; the first is the submit (PENDING -> PENDING).
  // Set when the job ends FAILED with failure info. A failure that caused a requeue is kept only in its
  // Transition, so a job that later succeeds shows no failure.
  std::optional<Failure> failure;
  std::vector<NodeAllocation> allocation;  // Set while placed; cleared on requeue; kept once final.
  std::string topology;                    // The layout the job runs with (from placement or the override).
  // The rendezvous port (DDL_ROOT) on the first node of the ring, chosen at placement with the allocation, so
  // that a restarted coordinator knows which ports its running jobs hold. 0: not placed.
  int root_port = 0;
  bool held = false;  // PENDING and not placed until released
  bool held_by_admin = false;  // an admin's hold, which only an admin releases (Slurm's admin hold)
  // The dependencies (after_ok, after_any) not yet met, in the spec's order; a job waits while any is left.
  std::vector<std::string> waiting_for;
  std::vector<RankResult> ranks;  // by rank; the latest attempt's (cleared at each launch)
  // Each ended attempt's usage, oldest first: the latest kMaxAttemptsKept (ddl's daily rollups keep the
  // totals).
  std::vector<AttemptUsage> attempts;
  // Being preempted (a launched job): for job preempted_by, its ranks signalled and killed at
  // preempt_deadline_ms (unix ms) unless they have all exited first. Stored, so that a coordinator that
  // restarts meanwhile still requeues it (a preempted job whose ranks exit 0 has not succeeded); cleared when
  // the attempt ends, which is then PREEMPTED if it goes back to the queue.
  std::string preempted_by;
  int64_t preempt_deadline_ms = 0;
  // An elastic job's GPU-seconds that its current allocation does not tell: each GPU given back during the
  // attempt adds the seconds it was held, each GPU added subtracts the seconds before it came, so that the
  // attempt's gpu_s is the GPUs held at its end times its length plus this. 0 at each attempt's end.
  double elastic_gpu_s = 0;

  bool operator==(const Job&) const = default;
};

enum class NodeState { kUp, kDown, kDraining };

const char* toString(NodeState s);

std::optional<NodeState> parseNodeState(std::string_view text);

struct GpuInfo {
  int index = 0;
  std::string uuid;
  std::string model;
  int64_t memory_bytes = 0;
  // Where it sits in its node, as the agent reports it (v1::Gpu); the defaults where unknown.
  std::string pci_bus_id;
  int numa_node = -1;
  int island = -1;  // NVLink island: the lowest index of the GPUs NVLink joins it to
  std::vector<int> nvlink_peers;
  std::vector<int> p2p_peers;
  std::string nic;   // its nearest NIC, as UCX names it
  std::string cpus;  // its NUMA node's CPUs, a CPU list

  bool operator==(const GpuInfo&) const = default;
};

// A fault that made a GPU unfit for work (v1::GpuFault). Kept after an admin clears it, marked cleared, so
// that the agent's report of that same fault (sent before the clear reached it) is known for old news, even
// after a coordinator restart.
struct GpuFault {
  std::string reason;  // "Xid 79 (fallen off the bus)"
  int xid = 0;
  int64_t at_ms = 0;  // when the agent saw it
  bool cleared = false;

  bool operator==(const GpuFault&) const = default;
};

struct NodeRecord {
  std::string name;  // Unique; the key.
  std::string address;
  std::vector<GpuInfo> gpus;
  std::map<std::string, std::string> labels;  // e.g. rack, switch.
  NodeState state = NodeState::kUp;
  std::string drain_reason;  // the operator's words with the drain; "" when not drained
  // The operator's drain (ddlctl drain), kept while the node is DOWN: a drained node comes back DRAINING, not
  // UP, so a node drained for maintenance gets no jobs when it reboots.
  bool drained = false;
  int64_t last_heartbeat_ms = 0;
  std::vector<int> cpus;     // the CPU ids its agent offers ranks, ascending
  std::vector<int> cpu_numa;  // the NUMA node of each of cpus; empty when the agent does not know them all
  std::map<int, GpuFault>
      gpu_faults;            // faulted GPUs by index: placed on by no job until an admin clears them
  int64_t memory_bytes = 0;  // the memory its agent offers ranks

  bool operator==(const NodeRecord&) const = default;
};

// ---- Ids and validation -----------------------------------------------------------------------------------

// common/job_id.h, under the names this namespace always had.
using ddl::canonicalJobId;
using ddl::formatJobId;
using ddl::jobIdNumber;

// ---- Limits on a job spec ---------------------------------------------------------------------------------
//
// Every job is kept forever in the store's history and sent whole in every ListJobs page, so each part of a
// spec is bounded; these are generous for real jobs (a long torchrun command line with a few hundred flags, a
// container's environment). A typical job is well under 1 KiB, but one at every limit is about 270 KiB, so a
// page of jobs must also be bounded by bytes, not by count alone, to stay below gRPC's 4 MiB message limit.
// validateJobSpec() names the limit and the actual size in each refusal.
inline constexpr size_t kMaxJobNameBytes = 128;
inline constexpr size_t kMaxUserBytes = 64;  // Linux user names are at most 32 bytes
inline constexpr size_t kMaxArgs = 4096;
inline constexpr size_t kMaxArgvBytes = 128 * 1024;  // the sum of the argument lengths
inline constexpr size_t kMaxEnvEntries = 1024;
inline constexpr size_t kMaxEnvEntryBytes = 32 * 1024;  // one KEY=VALUE
inline constexpr size_t kMaxEnvBytes = 128 * 1024;      // the sum of the KEY=VALUE lengths
inline constexpr size_t kMaxLabels = 64;
inline constexpr size_t kMaxLabelKeyBytes = 128;
inline constexpr size_t kMaxLabelValueBytes = 256;
inline constexpr size_t kMaxWorkdirBytes = 4096;  // PATH_MAX
inline constexpr size_t kMaxTopologyBytes = 64;
inline constexpr size_t kMaxDependencies = 64;  // after_ok and after_any together
inline constexpr int64_t kMaxTimeLimitS = 365LL * 24 * 3600;
inline constexpr size_t kMaxDrainReasonBytes = 256;
inline constexpr int kMaxGpusPerNode =
    64;  // what a node may register (NVLink islands are placed quadratically)
inline constexpr size_t kMaxRankDims = 8;  // RankResult::dims_us kept
inline constexpr int kMaxCpusPerRank = 4096;
inline constexpr int64_t kMaxMemoryPerRankBytes = int64_t{1} << 50;  // 1 PiB

// The offset of the first control character in `text`, or npos: C0 (bytes 0x00-0x1f), DEL (0x7f), and the C1
// controls U+0080-U+009F in their UTF-8 form (0xc2 0x80-0x9f). Such bytes in a name would move a terminal's
// cursor, end a table row or start an escape sequence wherever the name is printed. Bytes 0x80-0x9f on their
// own are continuation bytes of ordinary UTF-8 characters and are allowed.
size_t findControlCharacter(std::string_view text);
// `text` with each control character findControlCharacter finds (a C1 control's two bytes as one) made a
// space: words from an agent (a GPU fault, a health check's output) as a drain reason or a log line may hold.
std::string withoutControlCharacters(std::string_view text);

// `text` as it may appear inside an error message: control characters as \xNN and at most `max` bytes (then
// "...(N bytes)"), so a refusal of a huge or hostile value is itself short and safe to print.
std::string quoteForMessage(std::string_view text, size_t max = 64);

// What a store refuses at submit. Placement decides later whether the request fits the cluster.
Status validateJobSpec(const JobSpec& spec);

Status validateFailure(const Failure& f);

// A job as it is submitted: PENDING, stamped now_ms, with its first transition (PENDING -> PENDING,
// `reason`). The id is the caller's (the coordinator counts them; Store::lastJobNumber() says where it left
// off).
Job newJob(std::string id, JobSpec spec, int64_t now_ms, std::string reason = "submitted");

// When a job ended (its last transition), or 0 while it is not final.
int64_t endedAtMs(const Job& job);

// OK while the job may be given an allocation (PENDING or SCHEDULED); FAILED_PRECONDITION naming its state
// otherwise.
Status checkAllocationAllowed(const Job& job);

// How many times the job was placed: its launch attempts, numbered from 1 (StartRanks.attempt,
// RankResult::attempt, AttemptUsage::attempt); it survives restarts, being counted from the transitions.
int launchAttempts(const Job& job);

// Checks a move of `job` to `to` and applies it in memory: state, restarts, failure, allocation, and a new
// Transition stamped now_ms. On error the job is unchanged. A requeue the user asked for (ddlctl requeue:
// counts_as_restart false) uses none of max_restarts.
Status applyTransition(Job& job, JobState to, std::string reason, std::optional<Failure> failure,
                       int64_t now_ms, bool counts_as_restart = true);

// An elastic job's membership change: the RUNNING job goes on with `allocation` (GPUs lost or added), which
// is recorded as a RUNNING -> RUNNING transition with `reason` (and `failure`: the lost rank, if one failed)
// and charged in elastic_gpu_s. FAILED_PRECONDITION for a job that is not elastic or not RUNNING.
Status applyMembershipChange(Job& job, std::vector<NodeAllocation> allocation, std::string reason,
                             std::optional<Failure> failure, int64_t now_ms);

}  // namespace ddl::state
