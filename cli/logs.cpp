// ddlctl logs, the one verb with a state machine of its own (LogReader): the ranks' output is read through
// the coordinator (GetLogs) a piece at a time, and -f follows the job through its launch, restarts and
// requeues until it ends. A round reads at most 4096 pieces (1 GiB) per rank; -f polls at a Pacer's pace,
// bounded by --wait-timeout, and rides out a coordinator restart as the other verbs that wait do.
#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "ddlctl_internal.h"

namespace ddl::cli {
namespace {

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

}  // namespace

// -o json does not apply: the output is the ranks' own text.
int runLogs(CommandLine& cl, Session& s, std::ostream& err) {
  if (cl.output == "json")
    return usageError(err, "logs prints the ranks' output as text; -o json does not apply");
  return LogReader(cl, s, err).run();
}

}  // namespace ddl::cli
