// ddlctl's verbs: one function each, from the parsed CommandLine to the RPCs (through Session) and the
// output. Each makes its local checks first, so that a usage error sends nothing. Most verbs are one call;
// list and cancel with a filter page through ListJobs (bounded by kMaxListPages); cancel, hold, release and
// requeue make one call per job; wait, submit --wait and logs -f poll at the pace of a Pacer until the jobs
// end or --wait-timeout, and exit with the jobs' own result (see ddlctl.h).
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <functional>
#include <thread>
#include <tuple>

#include "common/clock.h"
#include "common/pki.h"
#include "common/signals.h"
#include "ddlctl_internal.h"

namespace ddl::cli {
namespace {

// The submitting user as the coordinator should record it: the effective uid's name, as ps and squeue show.
// getpwuid_r, not getpwuid: runDdlctl() may run on several threads at once.
std::string invokingUser() {
  passwd pw{};
  passwd* found = nullptr;
  std::vector<char> buf(16384);
  if (getpwuid_r(geteuid(), &pw, buf.data(), buf.size(), &found) == 0 && found != nullptr && *pw.pw_name) {
    return pw.pw_name;
  }
  if (const char* user = std::getenv("USER"); user != nullptr && *user) return user;
  return std::to_string(geteuid());
}

// The pace and the bound of the verbs that wait (wait, submit --wait, logs -f): a poll every 200 ms at first,
// doubling to 1 s while nothing changes, until --wait-timeout (0: a year, so that no loop is unbounded). The
// rounds are counted too (the limit over the shortest sleep), so a clock that stands still ends the loop.
class Pacer {
 public:
  static constexpr int64_t kMinDelayMs = 200, kMaxDelayMs = 1000;
  static constexpr double kMaxWaitS = 366.0 * 86400;
  explicit Pacer(double limitS)
      : limitS_(limitS > 0 ? std::min(limitS, kMaxWaitS) : kMaxWaitS),
        deadlineMs_(steadyNowMs() + static_cast<int64_t>(limitS_ * 1000)),
        roundsLeft_(static_cast<int64_t>(limitS_ * 1000) / kMinDelayMs + 2) {}
  // False once the time or the rounds are spent; else sleeps (never past the deadline) and says true.
  bool sleep() {
    const int64_t left = deadlineMs_ - steadyNowMs();
    if (left <= 0 || --roundsLeft_ <= 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(delayMs_, left)));
    delayMs_ = std::min(delayMs_ * 2, kMaxDelayMs);
    return true;
  }
  void reset() { delayMs_ = kMinDelayMs; }  // something changed: look again soon
  std::string limit() const { return formatSeconds(limitS_); }

 private:
  double limitS_;
  int64_t deadlineMs_;
  int64_t roundsLeft_;
  int64_t delayMs_ = kMinDelayMs;
};

// "j-000001 FAILED (rank 3 on n2: exit code 2)": one job's end, for people.
std::string describeEnd(const v1::Job& job) {
  std::string line = escapeForTerminal(job.id()) + " " + stateName(job.state());
  if (job.state() == v1::FAILED && job.has_failure()) {
    // A rank that could not start (a missing account, an unreadable workdir) "exits" 127: its reason says
    // what happened, the exit code would not.
    const bool not_started = job.reason().find(" could not start: ") != std::string::npos;
    line += " (" + escapeForTerminal(not_started ? job.reason() : describeFailure(job.failure())) + ")";
  } else if (job.state() != v1::SUCCEEDED && !job.reason().empty()) {
    line += " (" + escapeForTerminal(job.reason()) + ")";
  }
  return line + "\n";
}

// Polls GetJob for each of `ids` until every one is final, printing (text) one line per job as it ends.
// Returns an RPC failure's exit status, kExitWaitTimeout when the pacer ran out, else kExitOk; `jobs` holds
// the last answer for each id either way.
int waitForJobs(Session& s, const std::vector<std::string>& ids, Pacer& pacer, std::vector<v1::Job>* jobs,
                std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  jobs->assign(ids.size(), v1::Job{});
  std::vector<bool> done(ids.size(), false);
  while (true) {
    std::vector<std::string> live;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (done[i]) continue;
      v1::GetJobRequest req;
      req.set_id(ids[i]);
      if (int rc = s.callWaiting([&](Stub& stub, Ctx* c) { return stub.GetJob(c, req, &(*jobs)[i]); }))
        return rc;
      if (isFinalState((*jobs)[i].state())) {
        done[i] = true;
        if (!s.json()) s.out() << describeEnd((*jobs)[i]);
        s.out().flush();
        pacer.reset();
      } else {
        live.push_back(ids[i]);
      }
    }
    if (live.empty()) return kExitOk;
    if (!pacer.sleep()) {
      err << "ddlctl: gave up waiting after " << pacer.limit()
          << " s; still live: " << escapeForTerminal(join(live, " ")) << "\n";
      return kExitWaitTimeout;
    }
  }
}

// A FAILED job's failing rank: its last lines (at most 10, from the last 4 KiB of its log), on `err`, so that
// whoever waited sees why without a second command. Best effort: a log that cannot be read (its node down)
// is skipped silently; two GetLogs calls at most.
void printFailingRankTail(Session& s, const v1::Job& job, std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  if (job.state() != v1::FAILED || !job.has_failure()) return;
  if (job.reason().find(" could not start: ") != std::string::npos) return;  // no output: the reason says why
  constexpr int64_t kTailBytes = 4096;
  constexpr size_t kTailLines = 10;
  v1::GetLogsRequest req;
  req.set_id(job.id());
  req.set_rank(job.failure().rank());
  req.set_max_bytes(1);
  v1::GetLogsResponse probe;
  int usage = kExitOk;
  if (!s.callQuiet([&](Stub& stub, Ctx* c) { return stub.GetLogs(c, req, &probe); }, &usage).ok()) return;
  if (probe.size() <= 0) return;
  req.set_attempt(probe.attempt());
  req.set_offset(std::max<int64_t>(0, probe.size() - kTailBytes));
  req.set_max_bytes(static_cast<int32_t>(kTailBytes));
  v1::GetLogsResponse tail;
  if (!s.callQuiet([&](Stub& stub, Ctx* c) { return stub.GetLogs(c, req, &tail); }, &usage).ok()) return;
  std::vector<std::string> lines;
  std::string_view data = tail.data();
  while (!data.empty()) {
    const size_t nl = data.find('\n');
    lines.emplace_back(data.substr(0, nl));
    data = nl == std::string_view::npos ? std::string_view() : data.substr(nl + 1);
  }
  if (req.offset() > 0 && !lines.empty()) lines.erase(lines.begin());  // cut mid-line
  if (lines.size() > kTailLines) lines.erase(lines.begin(), lines.end() - kTailLines);
  if (lines.empty()) return;
  err << "--- the last lines of rank " << job.failure().rank() << " of " << escapeForTerminal(job.id())
      << " (ddlctl logs " << escapeForTerminal(job.id()) << " --rank " << job.failure().rank()
      << " for all):\n";
  for (const std::string& l : lines) err << "  " << escapeForTerminal(l) << "\n";
  err.flush();
}

// Waits for the jobs to end (submit --wait, wait) and exits with their result (worstJobExit); -o json prints
// the final jobs as one list; text also shows each failed job's failing rank's last lines.
int waitAndReport(const CommandLine& cl, Session& s, const std::vector<std::string>& ids, std::ostream& err) {
  Pacer pacer(cl.waitTimeoutS);
  std::vector<v1::Job> jobs;
  int rc = waitForJobs(s, ids, pacer, &jobs, err);
  if (rc != kExitOk && rc != kExitWaitTimeout) return rc;
  if (s.json()) {
    v1::ListJobsResponse all;
    for (const v1::Job& j : jobs) *all.add_jobs() = j;
    s.print(all, "");
  } else {
    for (const v1::Job& j : jobs) printFailingRankTail(s, j, err);
  }
  return rc == kExitWaitTimeout ? rc : worstJobExit(jobs);
}

// ddlctl wait JOB...
int runWait(CommandLine& cl, Session& s, std::ostream& err) {
  std::vector<std::string> ids;
  for (const std::string& t : cl.targets) ids.push_back(normalizeJobId(t));
  return waitAndReport(cl, s, ids, err);
}

// ddlctl logs: reads every rank's log in pieces (GetLogs) and prints whole lines, each prefixed by its rank
// when several ranks are shown. With --follow: waits through PENDING and SCHEDULED, then polls (Pacer) until
// the job has ended and nothing is left, moving to each new attempt from its start when the job is
// restarted or requeued, and exits with the job's result. One LogReader serves one `ddlctl logs`; its state
// is what the rounds of reads share: the job as last read, the attempt being read, and per rank the offset,
// the partial line and the --tail window.
class LogReader {
 public:
  LogReader(const CommandLine& cl, Session& s, std::ostream& err)
      : cl_(cl),
        s_(s),
        err_(err),
        id_(normalizeJobId(cl.target)),
        pacer_(cl.waitTimeoutS),
        attempt_(cl.attempt),
        everyAttempt_(cl.follow && cl.attempt == 0) {}

  int run();

 private:
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;

  // What one round of reads over the ranks found.
  struct Round {
    bool any = false;          // some output
    bool ended = true;         // every rank read said the job has ended
    bool notLaunched = false;  // -f: no launched attempt to read just now
    bool moved = false;        // -f: moved to a newer attempt midway
  };
  // What -f does after a round: read again, stop (the job ended), or exit with `rc`.
  struct Next {
    enum Kind { kRead, kStop, kExit } kind = kRead;
    int rc = kExitOk;
  };

  grpc::Status quiet(const Session::Rpc& rpc, int* usage);
  int getJob();
  int gaveUp();
  int waitUntilLaunched();
  void chooseRanks();
  void line(size_t i, std::string_view text);
  void catchUp(size_t i);
  void emit(size_t i, bool flush);
  int latestAttempt(int* rc);
  int switchTo(int next);
  int followNewer();
  std::optional<int> readRank(size_t i, Round& round);
  std::optional<int> readFailed(const grpc::Status& st, Round& round);
  Next afterNotLaunched();
  Next afterRound(const Round& round);
  int finish();

  const CommandLine& cl_;
  Session& s_;
  std::ostream& err_;
  const std::string id_;
  Pacer pacer_;
  v1::Job job_;
  std::vector<int> ranks_;
  bool prefix_ = false;
  std::vector<int64_t> offsets_;
  std::vector<std::string> partial_;
  // --tail: until a rank's first read reaches the end of its log, its lines go to a window of the last N.
  std::vector<bool> caughtUp_;
  std::vector<std::deque<std::string>> window_;
  int attempt_;  // 0 until the first answer names the latest attempt
  const bool everyAttempt_;
  int restarts_ = 0;  // at the attempt being read: a newer attempt without more is a requeue
};

int LogReader::run() {
  if (int rc = getJob()) return rc;
  if (cl_.follow) {
    if (int rc = waitUntilLaunched()) return rc;
  }
  chooseRanks();
  restarts_ = job_.restarts();
  while (true) {
    Round round;
    for (size_t i = 0; i < ranks_.size() && !round.notLaunched && !round.moved; ++i) {
      if (std::optional<int> rc = readRank(i, round)) return *rc;
    }
    s_.out().flush();
    if (!cl_.follow) break;
    if (round.moved) continue;
    const Next next = round.notLaunched ? afterNotLaunched() : afterRound(round);
    if (next.kind == Next::kExit) return next.rc;
    if (next.kind == Next::kStop) break;
  }
  return finish();
}

// -f rides out a coordinator restart (Session::callRidingOut); a single read does not.
grpc::Status LogReader::quiet(const Session::Rpc& rpc, int* usage) {
  return cl_.follow ? s_.callRidingOut(rpc, usage) : s_.callQuiet(rpc, usage);
}

int LogReader::getJob() {
  v1::GetJobRequest get;
  get.set_id(id_);
  auto rpc = [&](Stub& stub, Ctx* c) { return stub.GetJob(c, get, &job_); };
  return cl_.follow ? s_.callWaiting(rpc) : s_.call(rpc);
}

int LogReader::gaveUp() {
  err_ << "ddlctl: gave up waiting after " << pacer_.limit() << " s; " << escapeForTerminal(id_) << " is "
       << stateName(job_.state()) << "\n";
  return kExitWaitTimeout;
}

// -f: a job not launched yet has no logs; wait for it (one line on stderr), or for its end.
int LogReader::waitUntilLaunched() {
  bool announced = false;
  while (job_.state() == v1::PENDING || job_.state() == v1::SCHEDULED) {
    if (!announced) {
      err_ << "waiting for " << escapeForTerminal(id_) << " (" << stateName(job_.state())
           << (job_.reason().empty() ? "" : ": " + escapeForTerminal(job_.reason())) << ")\n";
      err_.flush();
      announced = true;
    }
    if (!pacer_.sleep()) return gaveUp();
    if (int rc = getJob()) return rc;
  }
  return kExitOk;
}

void LogReader::chooseRanks() {
  if (cl_.rank) {
    ranks_.push_back(*cl_.rank);
  } else {
    // At least rank 0, so that a job the coordinator cannot size still gets its answer (its refusal).
    const int n = std::max(1, job_.gpus() > 0 ? job_.gpus() : requestedGpus(job_.spec()));
    for (int r = 0; r < n; ++r) ranks_.push_back(r);
  }
  prefix_ = ranks_.size() > 1;
  offsets_.assign(ranks_.size(), 0);
  partial_.resize(ranks_.size());
  caughtUp_.assign(ranks_.size(), !cl_.tail.has_value());
  window_.resize(ranks_.size());
}

void LogReader::line(size_t i, std::string_view text) {
  std::string out;
  if (cl_.timestamps) out += formatLocalTime(unixNowMs()) + " ";  // when ddlctl received it
  if (prefix_) out += "[" + std::to_string(ranks_[i]) + "] ";
  out += text;
  if (caughtUp_[i]) {
    s_.out() << out;
    return;
  }
  if (*cl_.tail == 0) return;
  window_[i].push_back(std::move(out));
  if (window_[i].size() > static_cast<size_t>(*cl_.tail)) window_[i].pop_front();
}

void LogReader::catchUp(size_t i) {
  if (caughtUp_[i]) return;
  for (const std::string& l : window_[i]) s_.out() << l;
  window_[i].clear();
  caughtUp_[i] = true;
}

void LogReader::emit(size_t i, bool flush) {
  size_t start = 0, nl;
  while ((nl = partial_[i].find('\n', start)) != std::string::npos) {
    line(i, std::string_view(partial_[i]).substr(start, nl + 1 - start));
    start = nl + 1;
  }
  partial_[i].erase(0, start);
  if (flush && !partial_[i].empty()) {
    line(i, partial_[i] + "\n");
    partial_[i].clear();
  }
}

// The latest attempt, from a 1-byte read of the first rank: 0 while the job is not launched
// (FAILED_PRECONDITION), -1 when the read failed otherwise (the caller goes on as if there were none);
// `rc` is set only when there is no CA certificate to connect with (already printed).
int LogReader::latestAttempt(int* rc) {
  v1::GetLogsRequest probe;
  probe.set_id(id_);
  probe.set_rank(ranks_.front());
  probe.set_max_bytes(1);
  v1::GetLogsResponse latest;
  int usage = kExitOk;
  grpc::Status st = quiet([&](Stub& stub, Ctx* c) { return stub.GetLogs(c, probe, &latest); }, &usage);
  *rc = usage;
  if (st.ok()) return latest.attempt();
  return st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ? 0 : -1;
}

// Moves to `next` from its start: what is left of this attempt's lines first, then a marker on stderr. The
// new attempt may run on other nodes, so the offsets of the old one mean nothing there.
int LogReader::switchTo(int next) {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    emit(i, true);
    catchUp(i);
    offsets_[i] = 0;
  }
  s_.out().flush();
  if (int rc = getJob()) return rc;
  attempt_ = next;
  err_ << "==> attempt " << attempt_;
  if (job_.restarts() > restarts_) {
    err_ << " (restart " << job_.restarts() << " of " << job_.spec().max_restarts() << ")";
  } else {
    err_ << " (requeued)";
  }
  err_ << " <==\n";
  err_.flush();
  restarts_ = job_.restarts();
  pacer_.reset();
  return kExitOk;
}

// Has a newer attempt started (a restart, a requeue)? Follows it: -1 when there is none, 0 once switched,
// else the exit status to end with.
int LogReader::followNewer() {
  int rc = kExitOk;
  const int latest = latestAttempt(&rc);
  if (rc != kExitOk) return rc;
  if (latest <= attempt_) return -1;
  return switchTo(latest);
}

// Reads rank `i` of the attempt being read from where it was left, piece after piece until it has no more,
// into `round`. The exit status to end with, or nullopt to go on.
std::optional<int> LogReader::readRank(size_t i, Round& round) {
  for (int piece = 0; piece < 4096; ++piece) {  // at most 1 GiB per rank per round
    v1::GetLogsRequest req;
    req.set_id(id_);
    req.set_rank(ranks_[i]);
    req.set_attempt(attempt_);
    req.set_offset(offsets_[i]);
    v1::GetLogsResponse resp;
    int usage = kExitOk;
    grpc::Status st = quiet([&](Stub& stub, Ctx* c) { return stub.GetLogs(c, req, &resp); }, &usage);
    if (usage != kExitOk) return usage;
    if (!st.ok()) return readFailed(st, round);
    if (attempt_ == 0) attempt_ = resp.attempt();
    round.ended = round.ended && resp.job_ended();
    if (resp.data().empty()) {
      catchUp(i);
      break;
    }
    round.any = true;
    partial_[i] += resp.data();
    offsets_[i] = resp.next_offset();
    emit(i, false);
  }
  return std::nullopt;
}

// A read that failed: with -f, the job not launched just now, or its attempt gone to a newer one, is noted in
// `round` (nullopt: go on); anything else is reported and is the exit status.
std::optional<int> LogReader::readFailed(const grpc::Status& st, Round& round) {
  // Requeued and waiting again: the coordinator has no launched attempt to read from just now.
  if (cl_.follow && st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
    round.notLaunched = true;
    return std::nullopt;
  }
  // Following the latest attempt, the old one may be gone from where it ran (a requeue or restart
  // placed the job elsewhere): NOT_FOUND. Move to the newer attempt if there is one.
  if (everyAttempt_ && attempt_ > 0 && st.error_code() == grpc::StatusCode::NOT_FOUND) {
    int rc = kExitOk;
    const int latest = latestAttempt(&rc);
    if (rc != kExitOk) return rc;
    if (latest > attempt_) {
      if (int switched = switchTo(latest)) return switched;
      round.moved = true;
      return std::nullopt;
    }
    if (latest == 0) {  // not launched again yet
      round.notLaunched = true;
      return std::nullopt;
    }
  }
  return s_.report(st);
}

// -f, after a round that found no launched attempt: the job ended before it was launched again (stop), or
// wait until it is and follow its new attempt.
LogReader::Next LogReader::afterNotLaunched() {
  if (int rc = getJob()) return {Next::kExit, rc};
  if (isFinalState(job_.state())) {
    err_ << "ddlctl: " << escapeForTerminal(id_) << " ended " << stateName(job_.state())
         << " before it was launched"
         << (job_.reason().empty() ? "" : ": " + escapeForTerminal(job_.reason())) << "\n";
    return {Next::kStop};
  }
  // Launched but no logs yet (STARTING): look again after a pause, not at once.
  if (job_.state() != v1::PENDING && job_.state() != v1::SCHEDULED && !pacer_.sleep()) {
    return {Next::kExit, gaveUp()};
  }
  if (int rc = waitUntilLaunched()) return {Next::kExit, rc};
  if (everyAttempt_ && attempt_ > 0) {  // launched again: most likely a new attempt, maybe on other nodes
    if (int rc = followNewer(); rc > 0) return {Next::kExit, rc};
  }
  return {Next::kRead};
}

// -f, after a round of reads: stop once the job has ended and nothing was left, follow a newer attempt once
// this one is read to its end, else pause (less after output) before the next round.
LogReader::Next LogReader::afterRound(const Round& round) {
  if (round.ended && !round.any) return {Next::kStop};
  if (!round.any && everyAttempt_ && attempt_ > 0) {  // everything of this attempt has been read
    const int rc = followNewer();
    if (rc > 0) return {Next::kExit, rc};
    if (rc == 0) return {Next::kRead};
  }
  if (round.any) pacer_.reset();
  if (!pacer_.sleep()) {
    for (size_t i = 0; i < ranks_.size(); ++i) emit(i, true);
    s_.out().flush();
    return {Next::kExit, gaveUp()};
  }
  return {Next::kRead};
}

// The last lines of every rank (a last one without its newline too); -f exits with the job's result.
int LogReader::finish() {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    emit(i, true);
    catchUp(i);
  }
  s_.out().flush();
  if (!cl_.follow) return kExitOk;
  if (!isFinalState(job_.state())) {
    if (int rc = getJob()) return rc;
  }
  return jobExitCode(job_).value_or(kExitOk);
}

int runLogs(CommandLine& cl, Session& s, std::ostream& err) {
  if (cl.output == "json")
    return usageError(err, "logs prints the ranks' output as text; -o json does not apply");
  return LogReader(cl, s, err).run();
}

// The ids a verb acts on: JOB arguments, normalized.
std::vector<std::string> targetIds(const CommandLine& cl) {
  std::vector<std::string> ids;
  for (const std::string& t : cl.targets) ids.push_back(normalizeJobId(t));
  return ids;
}

// One RPC per job (cancel, hold, release, requeue), each answered on its own line; a refusal is printed
// and the rest go on. The exit status is the first failure's, else 0. -o json: the Job for one id, else
// {"jobs": [...]} with every job that was answered.
int forEachJob(Session& s, const std::vector<std::string>& ids, bool list,
               const std::function<int(const std::string&, v1::Job*)>& rpc,
               const std::function<std::string(const v1::Job&)>& text) {
  int rc = kExitOk;
  v1::ListJobsResponse answered;
  for (const std::string& id : ids) {
    v1::Job job;
    if (int failed = rpc(id, &job)) {
      if (rc == kExitOk) rc = failed;
      continue;
    }
    if (!s.json()) {
      s.out() << text(job);
      s.out().flush();
    }
    *answered.add_jobs() = std::move(job);
  }
  if (s.json()) {
    if (!list && answered.jobs_size() == 1) {
      s.print(answered.jobs(0), "");
    } else if (list || answered.jobs_size() > 0) {
      s.print(answered, "");
    }
  }
  return rc;
}

std::string stateLine(const v1::Job& job) {
  return escapeForTerminal(job.id()) + " " + stateName(job.state()) + (job.held() ? " (held)" : "") + "\n";
}

constexpr int kMaxListPages = 1000;

// ddlctl cancel: JOB..., or every job a filter lists: the caller's own unless --user says otherwise, in the
// live states (RUNNING with --signal) unless --state says otherwise, of one array with --array.
int runCancel(CommandLine& cl, Session& s, std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  int signal = 0;
  if (!cl.signal.empty()) {
    std::optional<int> n = signalNumber(cl.signal);
    if (!n) {
      return usageError(err, "--signal '" + escapeForTerminal(cl.signal) +
                                 "' is not a signal: give a name (USR1, SIGUSR1, TERM) or a number 1..64");
    }
    signal = *n;
  }
  const bool filtered = cl.userGiven || !cl.states.empty() || !cl.name.empty() || !cl.cancelArray.empty();
  if (cl.targets.empty() && !filtered) {
    return usageError(
        err, "cancel needs job ids, or a filter: --state STATE, --name NAME, --array ID or --user USER");
  }
  if (!cl.targets.empty() && filtered) {
    return usageError(err, "give job ids or a filter (--user, --state, --name, --array), not both");
  }
  std::vector<std::string> ids = targetIds(cl);
  if (filtered) {
    Parsed<std::vector<v1::JobState>> states = parseStates(cl.states);
    if (!states.ok()) return usageError(err, "--state: " + states.error);
    // Without --user a filter matches the caller's own jobs only: an admin's "cancel --state pending" must
    // not end everyone's, nor a user's draw one refusal per foreign job. An anonymous caller (a coordinator
    // run --insecure) has no name: then no user filter.
    std::string user = cl.user;
    if (!cl.userGiven) {
      v1::Identity who;
      if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.WhoAmI(c, {}, &who); })) return rc;
      user = who.name();
    }
    v1::ListJobsRequest req;
    req.set_user(user);
    req.set_name(cl.name);
    if (states.value->empty() && signal != 0) {
      req.add_states(v1::RUNNING);  // the coordinator signals RUNNING jobs only
    } else if (states.value->empty()) {
      for (v1::JobState st : {v1::PENDING, v1::SCHEDULED, v1::STARTING, v1::RUNNING}) req.add_states(st);
    }
    for (v1::JobState st : *states.value) req.add_states(st);
    // ListJobs has no array filter: the array's jobs are picked from the listed ones.
    const std::string array = cl.cancelArray.empty() ? "" : normalizeJobId(cl.cancelArray);
    for (int page = 0; page < kMaxListPages; ++page) {
      v1::ListJobsResponse resp;
      if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.ListJobs(c, req, &resp); })) return rc;
      for (const v1::Job& j : resp.jobs()) {
        if (array.empty() || j.spec().array_id() == array) ids.push_back(j.id());
      }
      if (resp.next_page_token().empty() || resp.next_page_token() == req.page_token()) break;
      req.set_page_token(resp.next_page_token());
    }
    if (ids.empty()) {
      std::vector<std::string> what;
      if (!array.empty()) what.push_back("--array " + array);
      if (!user.empty()) what.push_back("--user " + user + (cl.userGiven ? "" : " (yours, by default)"));
      if (!cl.states.empty()) what.push_back("--state " + join(cl.states, ","));
      if (!cl.name.empty()) what.push_back("--name " + cl.name);
      if (what.empty()) what.push_back("--user ''");
      const std::string kind = !cl.states.empty() ? "" : signal != 0 ? "running " : "live ";
      err << "ddlctl: no " << kind << "job matches " << escapeForTerminal(join(what, " ")) << "; nothing was "
          << (signal != 0 ? "signalled" : "cancelled") << "\n";
      return kExitRefused;
    }
  }
  return forEachJob(
      s, ids, filtered || ids.size() > 1,
      [&](const std::string& id, v1::Job* job) {
        v1::CancelJobRequest req;
        req.set_id(id);
        req.set_signal(signal);
        return s.call([&](Stub& stub, Ctx* c) { return stub.CancelJob(c, req, job); });
      },
      [&](const v1::Job& job) {
        if (signal == 0) return escapeForTerminal(job.id()) + " " + stateName(job.state()) + "\n";
        return escapeForTerminal(job.id()) + " sent " + signalName(signal) + " (" + stateName(job.state()) +
               ")\n";
      });
}

// ddlctl list: ListJobs page after page, each printed as it arrives (text), or gathered into one document (-o
// json). Bounded: at most kMaxListPages requests; past that ddlctl says so on stderr and, in JSON, leaves the
// next page's token in next_page_token. The coordinator may answer everything in one page with no token.

int runList(CommandLine& cl, Session& s, std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  const int64_t now = unixNowMs();
  Parsed<std::vector<v1::JobState>> states = parseStates(cl.states);
  if (!states.ok()) return usageError(err, states.error);
  v1::ListJobsRequest req;
  req.set_user(cl.user);
  req.set_name(cl.name);
  req.set_page_size(cl.pageSize);
  if (!states.value->empty()) {
    for (v1::JobState st : *states.value) req.add_states(st);
  } else if (!cl.all) {
    for (v1::JobState st : {v1::PENDING, v1::SCHEDULED, v1::STARTING, v1::RUNNING}) req.add_states(st);
  }
  for (auto [flag, text, field] : {std::tuple{"--since", &cl.since, &v1::ListJobsRequest::set_since_ms},
                                   std::tuple{"--until", &cl.until, &v1::ListJobsRequest::set_until_ms}}) {
    if (text->empty()) continue;
    Parsed<int64_t> at = parseTimeBound(*text, now);
    if (!at.ok()) return usageError(err, std::string(flag) + " " + at.error);
    (req.*field)(*at.value);
  }
  if (req.since_ms() > 0 && req.until_ms() > 0 && req.since_ms() >= req.until_ms()) {
    return usageError(err, "--since " + cl.since + " is not before --until " + cl.until);
  }
  const bool json = cl.output == "json";
  v1::ListJobsResponse all;  // -o json: every page's jobs
  JobTableWriter table;
  for (int page = 0;; ++page) {
    if (page == kMaxListPages) {
      err << "ddlctl: stopped after " << kMaxListPages
          << " pages; narrow the list with --state, --user, --name, "
          << "--since or --until\n";
      all.set_next_page_token(req.page_token());
      break;
    }
    v1::ListJobsResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.ListJobs(c, req, &resp); })) return rc;
    if (json) {
      for (v1::Job& job : *resp.mutable_jobs()) *all.add_jobs() = std::move(job);
    } else {
      s.out() << table.page(resp, now);
      s.out().flush();
    }
    if (resp.next_page_token().empty()) break;
    if (resp.next_page_token() == req.page_token()) {
      err << "ddlctl: the coordinator gave the same page token twice; stopping\n";
      return kExitRefused;
    }
    req.set_page_token(resp.next_page_token());
  }
  if (json) return s.print(all, "");
  return kExitOk;
}

// ddlctl admin VERB: one RPC each; what it makes (a token, a node's files) is printed or written once.
int runAdmin(CommandLine& cl, Session& s, std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  if (cl.adminVerb == "add-user") {
    v1::AddUserRequest req;
    req.set_name(cl.target);
    req.set_role(cl.role);
    req.set_rotate(cl.rotate);
    v1::AddUserResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.AddUser(c, req, &resp); })) return rc;
    return s.print(resp, "user " + escapeForTerminal(resp.name()) + " (" + escapeForTerminal(resp.role()) +
                             "), token:\n" + escapeForTerminal(resp.token()) +
                             "\n(shown once; the user puts it in ~/.config/ddl/token, mode 0600)\n");
  }
  if (cl.adminVerb == "remove-user") {
    v1::RemoveUserRequest req;
    req.set_name(cl.target);
    v1::RemoveUserResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.RemoveUser(c, req, &resp); })) return rc;
    return s.print(resp, "removed user " + cl.target + "\n");
  }
  if (cl.adminVerb == "users") {
    v1::ListUsersResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.ListUsers(c, {}, &resp); })) return rc;
    std::string text;
    for (const auto& u : resp.users())
      text += escapeForTerminal(u.name()) + " " + escapeForTerminal(u.role()) + "\n";
    return s.print(resp, text);
  }
  if (cl.adminVerb == "issue-node") {
    v1::IssueNodeCertificateRequest req;
    req.set_node(cl.target);
    req.set_days(cl.days);
    v1::IssueNodeCertificateResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.IssueNodeCertificate(c, req, &resp); }))
      return rc;
    std::string error;
    if (!pki::makePrivateDir(cl.outDir, &error) ||
        !pki::writeFile(cl.outDir + "/" + pki::kCaCert, resp.ca_pem(), 0644, &error) ||
        !pki::writeFile(cl.outDir + "/" + pki::kNodeKey, resp.private_key_pem(), 0600, &error) ||
        !pki::writeFile(cl.outDir + "/" + pki::kNodeCert, resp.certificate_pem(), 0644, &error)) {
      err << "ddlctl: " << error << "\n";
      return kExitRefused;
    }
    v1::IssueNodeCertificateResponse shown = resp;
    shown.clear_private_key_pem();  // never on stdout
    return s.print(shown, "wrote " + cl.outDir + "/{ca.crt,node.crt,node.key} for node " + cl.target +
                              ", valid until " + formatLocalTime(resp.not_after_ms()) + "\n");
  }
  // join-token
  v1::CreateJoinTokenRequest req;
  req.set_node(cl.target);
  req.set_ttl_s(cl.ttlS);
  v1::CreateJoinTokenResponse resp;
  if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.CreateJoinToken(c, req, &resp); })) return rc;
  (void)err;
  return s.print(resp, "on node " + cl.target + ", before " + formatLocalTime(resp.expires_ms()) +
                           ", with the token below in FILE (mode 0600):\n  ddl-agent --node " + cl.target +
                           " --coordinator " + cl.coordinator + " join --ca-sha256 " + resp.ca_sha256() +
                           " --token-file FILE\n" + resp.token() + "\n");
}

// ddlctl submit: the spec (local checks first), one Submit, the id(s); with --wait, then as ddlctl wait.
int runSubmit(CommandLine& cl, Session& s, std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  cl.submit.user = invokingUser();
  std::error_code ec;
  cl.submit.cwd = std::filesystem::current_path(ec).string();
  if (cl.submit.exportSpec != "NONE") cl.submit.environ = processEnvironment();
  Parsed<v1::JobSpec> spec = buildJobSpec(cl.submit);
  if (!spec.ok()) return usageError(err, spec.error);
  if (!cl.array.empty()) {
    Parsed<int> count = checkArraySpec(cl.array);
    if (!count.ok()) return usageError(err, count.error);
  }
  if (cl.waitTimeoutS > 0 && !cl.wait) return usageError(err, "--wait-timeout goes with --wait");
  v1::SubmitRequest req;
  *req.mutable_spec() = *spec.value;
  req.set_array(cl.array);
  v1::SubmitResponse resp;
  if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.Submit(c, req, &resp); })) return rc;
  std::vector<std::string> ids(resp.array_jobs().begin(), resp.array_jobs().end());
  if (ids.empty()) ids.push_back(resp.job().id());
  if (!s.json()) {
    // Every id of a small array; the first, the last and the count of a large one. The first line is always
    // the first job's id, so $(ddlctl submit ... | head -1) works for both.
    constexpr size_t kListedIds = 16;
    if (ids.size() <= kListedIds) {
      for (const std::string& id : ids) s.out() << escapeForTerminal(id) << "\n";
    } else {
      s.out() << escapeForTerminal(ids.front()) << "\n... " << escapeForTerminal(ids.back()) << " ("
              << ids.size() << " jobs in array "
              << escapeForTerminal(resp.job().spec().array_id().empty() ? ids.front()
                                                                        : resp.job().spec().array_id())
              << ")\n";
    }
    s.out().flush();
  }
  if (!cl.wait) {
    if (!s.json()) return kExitOk;
    if (resp.array_jobs_size() > 0) return s.print(resp, "");
    return s.print(resp.job(), "");
  }
  return waitAndReport(cl, s, ids, err);
}

}  // namespace

// This process's environment, for --export.
std::vector<std::string> processEnvironment() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

// The verb's one RPC and its output; local checks first, so a usage error sends nothing.
int runVerb(CommandLine& cl, Session& s, std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  int64_t now = unixNowMs();
  if (cl.verb == "submit") return runSubmit(cl, s, err);
  if (cl.verb == "list") return runList(cl, s, err);
  if (cl.verb == "status") {
    v1::GetJobRequest req;
    req.set_id(normalizeJobId(cl.target));
    v1::Job job;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.GetJob(c, req, &job); })) return rc;
    s.print(job, formatJobDetail(job, now));
    if (!s.json()) printFailingRankTail(s, job, err);
    return kExitOk;
  }
  if (cl.verb == "cancel") return runCancel(cl, s, err);
  if (cl.verb == "wait") return runWait(cl, s, err);
  if (cl.verb == "hold" || cl.verb == "release") {
    return forEachJob(
        s, targetIds(cl), cl.targets.size() > 1,
        [&](const std::string& id, v1::Job* job) {
          v1::HoldJobRequest req;
          req.set_id(id);
          req.set_hold(cl.verb == "hold");
          return s.call([&](Stub& stub, Ctx* c) { return stub.HoldJob(c, req, job); });
        },
        stateLine);
  }
  if (cl.verb == "requeue") {
    return forEachJob(
        s, targetIds(cl), cl.targets.size() > 1,
        [&](const std::string& id, v1::Job* job) {
          v1::RequeueJobRequest req;
          req.set_id(id);
          return s.call([&](Stub& stub, Ctx* c) { return stub.RequeueJob(c, req, job); });
        },
        stateLine);
  }
  if (cl.verb == "ring") {
    v1::GetRingRequest req;
    req.set_id(normalizeJobId(cl.target));
    v1::RingLayout ring;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.GetRing(c, req, &ring); })) return rc;
    std::string text = ring.text();
    if (!text.empty() && text.back() != '\n') text += "\n";
    return s.print(ring, text);
  }
  if (cl.verb == "logs") return runLogs(cl, s, err);
  if (cl.verb == "whoami") {
    v1::Identity who;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.WhoAmI(c, {}, &who); })) return rc;
    return s.print(who, (who.name().empty() ? std::string("(anonymous)") : escapeForTerminal(who.name())) +
                            " " + escapeForTerminal(who.role()) + " (" + escapeForTerminal(who.via()) +
                            ")\n");
  }
  if (cl.verb == "admin") return runAdmin(cl, s, err);
  if (cl.verb == "nodes" && cl.nodesVerb == "remove") {
    v1::RemoveNodeRequest req;
    req.set_node(cl.target);
    v1::RemoveNodeResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.RemoveNode(c, req, &resp); })) return rc;
    return s.print(resp, "removed node " + escapeForTerminal(cl.target) + "\n");
  }
  if (cl.verb == "nodes") {
    v1::ListNodesResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.ListNodes(c, {}, &resp); })) return rc;
    return s.print(resp, formatNodeTable(resp, now));
  }
  // drain or undrain: declareCommandLine() declares no other verb.
  v1::DrainNodeRequest req;
  req.set_node(cl.target);
  req.set_drain(cl.verb == "drain");
  if (!cl.reason.empty() && cl.verb != "drain") return usageError(err, "--reason goes with drain");
  if (cl.reason.size() > 256) {
    return usageError(err, "--reason is " + std::to_string(cl.reason.size()) + " bytes; the limit is 256");
  }
  req.set_reason(cl.reason);
  v1::Node node;
  if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.DrainNode(c, req, &node); })) return rc;
  return s.print(node, escapeForTerminal(node.name()) + " " + escapeForTerminal(nodeState(node)) + "\n");
}

}  // namespace ddl::cli
