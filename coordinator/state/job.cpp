// The job model's rules: see job.h.
#include "state/job.h"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace ddl::state {

const char* toString(JobState s) {
  switch (s) {
    case JobState::kPending:
      return "PENDING";
    case JobState::kScheduled:
      return "SCHEDULED";
    case JobState::kStarting:
      return "STARTING";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
    case JobState::kTimeout:
      return "TIMEOUT";
  }
  return "UNKNOWN";
}

std::optional<JobState> parseJobState(std::string_view text) {
  for (JobState s : kAllJobStates) {
    if (text == toString(s)) return s;
  }
  return std::nullopt;
}

bool allowedTransition(JobState from, JobState to) {
  using S = JobState;
  if (isTerminal(from) || from == to) return false;
  if (to == S::kFailed || to == S::kCancelled) return true;
  if (to == S::kTimeout) return from == S::kStarting || from == S::kRunning;
  switch (from) {
    case S::kPending:
      return to == S::kScheduled;
    case S::kScheduled:
      return to == S::kStarting || to == S::kPending;
    case S::kStarting:
      return to == S::kRunning || to == S::kPending;
    case S::kRunning:
      return to == S::kSucceeded || to == S::kPending;
    default:
      return false;
  }
}

const char* toString(NodeState s) {
  switch (s) {
    case NodeState::kUp:
      return "UP";
    case NodeState::kDown:
      return "DOWN";
    case NodeState::kDraining:
      return "DRAINING";
  }
  return "UNKNOWN";
}

std::optional<NodeState> parseNodeState(std::string_view text) {
  for (NodeState s : {NodeState::kUp, NodeState::kDown, NodeState::kDraining}) {
    if (text == toString(s)) return s;
  }
  return std::nullopt;
}

size_t findControlCharacter(std::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) return i;
    if (c == 0xc2 && i + 1 < text.size()) {
      const auto next = static_cast<unsigned char>(text[i + 1]);
      if (next >= 0x80 && next <= 0x9f) return i;
    }
  }
  return std::string_view::npos;
}

std::string withoutControlCharacters(std::string_view text) {
  std::string out;
  for (size_t at; (at = findControlCharacter(text)) != std::string_view::npos;) {
    out.append(text.substr(0, at)).push_back(' ');
    text.remove_prefix(at + (static_cast<unsigned char>(text[at]) == 0xc2 ? 2 : 1));
  }
  return out.append(text);
}

std::string quoteForMessage(std::string_view text, size_t max) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < max; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f ||
        (c >= 0x80 && c <= 0x9f && i > 0 && static_cast<unsigned char>(text[i - 1]) == 0xc2)) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > max) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

Status validateJobSpec(const JobSpec& spec) {
  // The name is echoed in every refusal, so only a name that passes its own checks is echoed whole.
  const bool name_ok =
      spec.name.size() <= kMaxJobNameBytes && findControlCharacter(spec.name) == std::string::npos;
  auto bad = [&](const std::string& what) {
    return Status::invalidArgument(
        "job spec" + (spec.name.empty() ? "" : " '" + quoteForMessage(spec.name, kMaxJobNameBytes) + "'") +
        ": " + what);
  };
  auto size = [](size_t n) { return std::to_string(n); };
  auto controlAt = [](std::string_view text) {
    const size_t at = findControlCharacter(text);
    return "a control character (" + quoteForMessage(text.substr(at, text[at] == '\xc2' ? 2 : 1)) +
           ") at byte " + std::to_string(at);
  };
  if (!name_ok) {
    if (spec.name.size() > kMaxJobNameBytes)
      return bad("the name is " + size(spec.name.size()) + " bytes; the limit is " + size(kMaxJobNameBytes));
    return bad("the name contains " + controlAt(spec.name) + "; names may not contain control characters");
  }
  if (spec.user.size() > kMaxUserBytes)
    return bad("the user name is " + size(spec.user.size()) + " bytes; the limit is " + size(kMaxUserBytes));
  if (findControlCharacter(spec.user) != std::string::npos)
    return bad("the user name contains " + controlAt(spec.user) +
               "; user names may not contain control characters");
  if (spec.command.empty() || spec.command[0].empty())
    return bad("command is empty; give the program to run");
  if (spec.command.size() > kMaxArgs)
    return bad("the command has " + size(spec.command.size()) + " arguments; the limit is " + size(kMaxArgs));
  size_t argv_bytes = 0;
  for (const std::string& arg : spec.command) argv_bytes += arg.size();
  if (argv_bytes > kMaxArgvBytes)
    return bad("the command's arguments total " + size(argv_bytes) + " bytes; the limit is " +
               size(kMaxArgvBytes) + " (pass large inputs in a file)");
  if (spec.nodes < 0 || spec.gpus_per_node < 0 || spec.total_gpus < 0)
    return bad("GPU and node counts must be >= 0");
  if (spec.max_restarts < 0) return bad("max_restarts must be >= 0");
  if (spec.min_nodes < 0 || spec.min_gpus < 0) return bad("the elastic minimum must be >= 0");
  if (spec.min_nodes > 0 && spec.min_gpus > 0)
    return bad("an elastic job gives a minimum of nodes or of GPUs, not both");
  if (spec.min_nodes > 0 && (spec.nodes <= 0 || spec.gpus_per_node <= 0 || spec.min_nodes >= spec.nodes))
    return bad("an elastic minimum of " + std::to_string(spec.min_nodes) +
               " nodes needs nodes and GPUs per node, and fewer nodes than the " +
               std::to_string(spec.nodes) + " asked for (--nodes MIN:MAX with MIN < MAX)");
  if ((spec.min_nodes > 0 || spec.min_gpus > 0) && !spec.topology_override.empty())
    return bad("an elastic job's ring changes size as it shrinks and grows: give no --topology");
  if (spec.min_gpus > 0 && (spec.total_gpus <= 0 || spec.min_gpus >= spec.total_gpus))
    return bad("an elastic minimum of " + std::to_string(spec.min_gpus) + " GPUs needs fewer than the " +
               std::to_string(spec.total_gpus) + " GPUs asked for (--gpus MIN:MAX with MIN < MAX)");
  if (spec.cpus_per_rank < 0 || spec.cpus_per_rank > kMaxCpusPerRank)
    return bad("cpus_per_rank is " + std::to_string(spec.cpus_per_rank) + "; give 1 to " +
               std::to_string(kMaxCpusPerRank) + " (0: not asked for)");
  if (spec.memory_per_rank_bytes < 0 || spec.memory_per_rank_bytes > kMaxMemoryPerRankBytes)
    return bad("memory_per_rank is " + std::to_string(spec.memory_per_rank_bytes) +
               " bytes; give 1 byte to 1 PiB (0: not asked for)");
  if (std::string why = requestIdProblem(spec.request_id); !why.empty()) return bad(why);
  if (spec.qos.size() > 32 || findControlCharacter(spec.qos) != std::string::npos)
    return bad("QoS '" + quoteForMessage(spec.qos) + "' is not a QoS name (at most 32 characters)");
  if (spec.account.size() > 32 || findControlCharacter(spec.account) != std::string::npos)
    return bad("account '" + quoteForMessage(spec.account) +
               "' is not an account name (at most 32 characters)");
  if (spec.time_limit_s < 0 || spec.time_limit_s > kMaxTimeLimitS)
    return bad("the time limit is " + std::to_string(spec.time_limit_s) +
               " s; give 1 s to 365 days (0: none)");
  if (spec.warn_signal != 0) {
    if (spec.warn_signal < 1 || spec.warn_signal > 64)
      return bad("the warning signal is " + std::to_string(spec.warn_signal) +
                 "; give a signal number 1 to 64");
    if (spec.time_limit_s <= 0) return bad("a warning signal needs a time limit to be sent before");
    if (spec.warn_before_s < 1 || spec.warn_before_s >= spec.time_limit_s)
      return bad("the warning signal is to be sent " + std::to_string(spec.warn_before_s) +
                 " s before the time limit of " + std::to_string(spec.time_limit_s) +
                 " s; give 1 s to less than the limit");
  } else if (spec.warn_before_s != 0) {
    return bad("a warning time needs a warning signal");
  }
  if (spec.after_ok.size() + spec.after_any.size() > kMaxDependencies)
    return bad("the job depends on " + size(spec.after_ok.size() + spec.after_any.size()) +
               " jobs; the limit is " + size(kMaxDependencies));
  for (const auto* deps : {&spec.after_ok, &spec.after_any}) {
    for (const std::string& dep : *deps) {
      if (!jobIdNumber(dep))
        return bad("dependency '" + quoteForMessage(dep) + "' is not a job id (like j-000042)");
    }
  }
  if (spec.array_index < 0 || spec.array_max_running < 0) return bad("array index and limit must be >= 0");
  if (spec.workdir.size() > kMaxWorkdirBytes)
    return bad("the workdir is " + size(spec.workdir.size()) + " bytes; the limit is " +
               size(kMaxWorkdirBytes));
  if (spec.topology_override.size() > kMaxTopologyBytes)
    return bad("the topology is " + size(spec.topology_override.size()) + " bytes; the limit is " +
               size(kMaxTopologyBytes));
  if (spec.env.size() > kMaxEnvEntries)
    return bad("the environment has " + size(spec.env.size()) + " entries; the limit is " +
               size(kMaxEnvEntries));
  size_t env_bytes = 0;
  for (const std::string& kv : spec.env) {
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return bad("env entry '" + quoteForMessage(kv) + "' is not KEY=VALUE");
    if (kv.size() > kMaxEnvEntryBytes)
      return bad("env entry " + quoteForMessage(kv.substr(0, eq)) + " is " + size(kv.size()) +
                 " bytes; the limit is " + size(kMaxEnvEntryBytes));
    env_bytes += kv.size();
  }
  if (env_bytes > kMaxEnvBytes)
    return bad("the environment totals " + size(env_bytes) + " bytes; the limit is " + size(kMaxEnvBytes));
  if (spec.required_labels.size() > kMaxLabels)
    return bad("the job requires " + size(spec.required_labels.size()) + " labels; the limit is " +
               size(kMaxLabels));
  // Labels are written out as comma-separated key=value lists (placement's messages do), so '=', ',' or
  // whitespace in a key or value would make that text ambiguous; refuse them at submit, not misread later.
  constexpr std::string_view kLabelSeparators = "=, \t\n\v\f\r";
  for (const auto& [key, value] : spec.required_labels) {
    if (key.empty()) return bad("label with value '" + quoteForMessage(value) + "' has an empty key");
    if (key.size() > kMaxLabelKeyBytes)
      return bad("label key '" + quoteForMessage(key) + "' is " + size(key.size()) + " bytes; the limit is " +
                 size(kMaxLabelKeyBytes));
    if (key.find_first_of(kLabelSeparators) != std::string::npos)
      return bad("label '" + quoteForMessage(key) + "': the key may not contain '=', ',' or whitespace");
    if (findControlCharacter(key) != std::string::npos)
      return bad("label '" + quoteForMessage(key) + "': the key contains " + controlAt(key));
    if (value.size() > kMaxLabelValueBytes)
      return bad("label '" + key + "': the value is " + size(value.size()) + " bytes; the limit is " +
                 size(kMaxLabelValueBytes));
    if (value.find_first_of(kLabelSeparators) != std::string::npos)
      return bad("label '" + key + "': the value '" + quoteForMessage(value) +
                 "' may not contain '=', ',' or whitespace");
    if (findControlCharacter(value) != std::string::npos)
      return bad("label '" + key + "': the value contains " + controlAt(value));
  }
  return Status::ok();
}

Status validateFailure(const Failure& f) {
  if (f.rank < 0) return Status::invalidArgument("failure: rank must be >= 0");
  if (f.exit_code.has_value() == f.signal.has_value()) {
    return Status::invalidArgument("failure of rank " + std::to_string(f.rank) +
                                   ": give exactly one of exit_code and signal");
  }
  return Status::ok();
}

int launchAttempts(const Job& job) {
  return static_cast<int>(std::count_if(job.transitions.begin(), job.transitions.end(),
                                        [](const Transition& t) { return t.to == JobState::kScheduled; }));
}

namespace {

// When the current attempt was placed (its latest SCHEDULED); 0 never. Its GPUs are counted from here.
int64_t placedAtMs(const Job& job) {
  int64_t at = 0;
  for (const Transition& t : job.transitions)
    if (t.to == JobState::kScheduled) at = t.at_ms;
  return at;
}

// The usage of `job`'s current attempt, ending now_ms by a move to `to` (the job is still as placed).
AttemptUsage endedAttempt(const Job& job, JobState to, int64_t now_ms) {
  AttemptUsage u;
  u.attempt = launchAttempts(job);
  u.start_ms = placedAtMs(job);
  u.end_ms = std::max(now_ms, u.start_ms);
  for (const NodeAllocation& a : job.allocation) u.gpus += static_cast<int>(a.gpus.size());
  u.gpu_s = std::max(0.0, u.gpus * ((u.end_ms - u.start_ms) / 1000.0) + job.elastic_gpu_s);
  for (const RankResult& r : job.ranks) {
    if (r.attempt != u.attempt) continue;
    u.cpu_s += r.cpu_s;
    u.max_rss_bytes = std::max(u.max_rss_bytes, r.max_rss_bytes);
  }
  u.end = to != JobState::kPending ? toString(to) : job.preempted_by.empty() ? "REQUEUED" : kPreemptedEnd;
  return u;
}

}  // namespace

Status applyTransition(Job& job, JobState to, std::string reason, std::optional<Failure> failure,
                       int64_t now_ms, bool counts_as_restart) {
  const JobState from = job.state;
  if (!allowedTransition(from, to)) {
    std::string msg = "job " + job.id + ": cannot go from " + toString(from) + " to " + toString(to);
    if (isTerminal(from)) msg += " (" + std::string(toString(from)) + " is final)";
    return Status::failedPrecondition(std::move(msg));
  }
  if (failure) {
    if (to != JobState::kFailed && !isRequeue(from, to)) {
      return Status::invalidArgument("job " + job.id + ": failure info given for " + toString(from) + " -> " +
                                     toString(to) + "; only FAILED or a requeue carries one");
    }
    Status st = validateFailure(*failure);
    if (!st) return Status::invalidArgument("job " + job.id + ": " + st.message());
  }
  if (isRequeue(from, to) && counts_as_restart && job.restarts >= job.spec.max_restarts) {
    return Status::failedPrecondition("job " + job.id + ": cannot requeue, " + std::to_string(job.restarts) +
                                      " restarts already used of max_restarts " +
                                      std::to_string(job.spec.max_restarts) + "; fail the job instead");
  }
  if (endsAttempt(from, to)) {
    job.attempts.push_back(endedAttempt(job, to, now_ms));
    if (job.attempts.size() > kMaxAttemptsKept) job.attempts.erase(job.attempts.begin());
    job.preempted_by.clear();
    job.preempt_deadline_ms = 0;
    job.elastic_gpu_s = 0;
  }
  job.state = to;
  if (isRequeue(from, to) && counts_as_restart) job.restarts++;
  if (to == JobState::kPending) {
    job.allocation.clear();
    job.topology.clear();
    job.root_port = 0;
    job.failure.reset();
  }
  if (to == JobState::kFailed) job.failure = failure;
  job.transitions.push_back(Transition{from, to, now_ms, std::move(reason), std::move(failure)});
  return Status::ok();
}

Status applyMembershipChange(Job& job, std::vector<NodeAllocation> allocation, std::string reason,
                             std::optional<Failure> failure, int64_t now_ms) {
  if (!isElastic(job.spec) || job.state != JobState::kRunning)
    return Status::failedPrecondition(
        "job " + job.id + ": only a RUNNING elastic job changes its ranks (it is " + toString(job.state) +
        (isElastic(job.spec) ? "" : ", not elastic") + ")");
  if (failure) {
    Status st = validateFailure(*failure);
    if (!st) return Status::invalidArgument("job " + job.id + ": " + st.message());
  }
  const int64_t start_ms = placedAtMs(job);  // as endedAttempt counts
  auto count = [](const std::vector<NodeAllocation>& a) {
    int n = 0;
    for (const NodeAllocation& x : a) n += static_cast<int>(x.gpus.size());
    return n;
  };
  // GPUs given back were held since the placement; GPUs added were not held before now.
  const int delta = count(job.allocation) - count(allocation);
  job.elastic_gpu_s += delta * (std::max<int64_t>(0, now_ms - start_ms) / 1000.0);
  job.allocation = std::move(allocation);
  // Its ranks now form one flat ring (a communicator that shrank or grew takes no DDL_TOPOLOGY), and the
  // layout rebuilt from the allocation (a restarted coordinator's) must have as many.
  job.topology = std::to_string(count(job.allocation));
  job.transitions.push_back(
      Transition{JobState::kRunning, JobState::kRunning, now_ms, std::move(reason), std::move(failure)});
  return Status::ok();
}

int64_t endedAtMs(const Job& job) {
  return isTerminal(job.state) && !job.transitions.empty() ? job.transitions.back().at_ms : 0;
}

Status checkAllocationAllowed(const Job& job) {
  if (job.state == JobState::kPending || job.state == JobState::kScheduled) return Status::ok();
  return Status::failedPrecondition("job " + job.id + ": cannot set an allocation while " +
                                    toString(job.state) + "; only a PENDING or SCHEDULED job is placed");
}

Job newJob(std::string id, JobSpec spec, int64_t now_ms, std::string reason) {
  Job job;
  job.id = std::move(id);
  job.spec = std::move(spec);
  job.state = JobState::kPending;
  job.submit_ms = now_ms;
  job.transitions.push_back(
      Transition{JobState::kPending, JobState::kPending, now_ms, std::move(reason), {}});
  return job;
}

}  // namespace ddl::state
