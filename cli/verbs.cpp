// ddlctl's verbs: one function each, from the parsed CommandLine to the RPCs (through Session) and the
// output. Each makes its local checks first, so that a usage error sends nothing. Most verbs are one call;
// list and cancel with a filter page through ListJobs (bounded by kMaxListPages); cancel, hold, release and
// requeue make one call per job; wait and submit --wait poll at the pace of a Pacer until the jobs end or
// --wait-timeout, and exit with the jobs' own result (see ddlctl.h). logs, which follows a job through its
// attempts, has a file of its own (logs.cpp).
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <sstream>
#include <tuple>

#include "common/clock.h"
#include "common/job_id.h"
#include "common/pki.h"
#include "common/signals.h"
#include "common/utc_day.h"
#include "ddlctl_internal.h"

namespace ddl::cli {
namespace {

// A request id for one submit: "ddlctl-" and 128 random bits in hex.
std::string newRequestId() {
  std::random_device random;  // /dev/urandom
  std::string id = "ddlctl-";
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 4; ++i) {
    const uint32_t word = random();
    for (int b = 0; b < 8; ++b) id += kHex[(word >> (4 * b)) & 0xf];
  }
  return id;
}

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

// --since and --until (list, usage) as unix ms, 0 where not given: "" or why they are refused (a TIME that
// does not parse, a period that ends before it starts). utc_dates (usage, whose days are UTC days): a date
// alone ("2026-12-01") is that day's UTC midnight rather than local, and a period given only --since ends
// now.
std::string periodOf(const CommandLine& cl, int64_t now, bool utc_dates, int64_t* since, int64_t* until) {
  for (auto [flag, text, out] :
       {std::tuple{"--since", &cl.since, since}, std::tuple{"--until", &cl.until, until}}) {
    *out = 0;
    if (text->empty()) continue;
    if (utc_dates && text->size() == 10 && (*text)[4] == '-') {  // a date alone: YYYY-MM-DD
      const std::optional<int64_t> day = parseUtcDay(*text);
      if (!day) return std::string(flag) + " " + *text + " is not a date";
      *out = *day * 86400000;
      continue;
    }
    Parsed<int64_t> at = parseTimeBound(*text, now);
    if (!at.ok()) return std::string(flag) + " " + at.error;
    *out = *at.value;
  }
  const int64_t end = *until > 0 ? *until : utc_dates ? now : 0;
  if (*since > 0 && end > 0 && *since >= end) {
    return "--since " + cl.since + " is not before " +
           (cl.until.empty() ? std::string("now") : "--until " + cl.until);
  }
  return "";
}

// ddlctl usage: GetUsage over --since/--until (the coordinator's default: the last 7 days), as a table, JSON
// or CSV.
int runUsage(CommandLine& cl, Session& s, std::ostream& err) {
  v1::GetUsageRequest req;
  int64_t since = 0, until = 0;
  if (std::string why = periodOf(cl, unixNowMs(), true, &since, &until); !why.empty())
    return usageError(err, why);
  req.set_since_ms(since);
  req.set_until_ms(until);
  req.set_account(cl.account);
  req.set_user(cl.user);
  req.set_by_account(cl.byAccount);
  req.set_daily(cl.daily);
  if (cl.byAccount && !cl.user.empty()) return usageError(err, "--by-account adds users up; drop --user");
  v1::GetUsageResponse resp;
  if (int rc = s.call(
          [&](v1::UserService::Stub& stub, grpc::ClientContext* c) { return stub.GetUsage(c, req, &resp); }))
    return rc;
  return s.print(resp, cl.output == "csv" ? formatUsageCsv(resp) : formatUsage(resp));
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
  int64_t since = 0, until = 0;
  if (std::string why = periodOf(cl, now, false, &since, &until); !why.empty()) return usageError(err, why);
  req.set_since_ms(since);
  req.set_until_ms(until);
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

// "a,b,,c" -> {a, b, c}.
std::vector<std::string> commaList(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// A user's accounts as ddlctl prints them: "physics (default), chem".
std::string userAccounts(const v1::Identity& who) {
  std::string text = escapeForTerminal(who.account()) + (who.accounts_size() ? " (default)" : "");
  for (const std::string& a : who.accounts()) text += ", " + escapeForTerminal(a);
  return text;
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
    req.set_account(cl.account);
    v1::AddUserResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.AddUser(c, req, &resp); })) return rc;
    return s.print(resp, "user " + escapeForTerminal(resp.name()) + " (" + escapeForTerminal(resp.role()) +
                             ", account " + escapeForTerminal(resp.account()) + "), token:\n" +
                             escapeForTerminal(resp.token()) +
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
    for (const auto& u : resp.users()) {
      text += escapeForTerminal(u.name()) + " " + escapeForTerminal(u.role()) + " " + userAccounts(u) +
              (u.limits().ByteSizeLong() > 0 ? " (" + formatLimits(u.limits()) + ")" : "") + "\n";
    }
    return s.print(resp, text);
  }
  if (cl.adminVerb == "user-accounts") {
    if (cl.joinAccounts.empty() && cl.leaveAccounts.empty() && cl.defaultAccount.empty()) {
      return usageError(err, "user-accounts: give --add, --remove or --default", "admin user-accounts");
    }
    v1::SetUserAccountsRequest req;
    req.set_name(cl.target);
    for (const std::string& a : commaList(cl.joinAccounts)) req.add_add(a);
    for (const std::string& a : commaList(cl.leaveAccounts)) req.add_remove(a);
    req.set_default_account(cl.defaultAccount);
    v1::Identity resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.SetUserAccounts(c, req, &resp); })) return rc;
    return s.print(resp,
                   "user " + escapeForTerminal(resp.name()) + ": accounts " + userAccounts(resp) + "\n");
  }
  if (cl.adminVerb == "add-account") {
    v1::AddAccountRequest req;
    req.set_name(cl.target);
    req.set_parent(cl.parent);
    req.set_share(cl.share);
    req.set_update(cl.update);
    v1::Account resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.AddAccount(c, req, &resp); })) return rc;
    return s.print(resp, std::string(cl.update ? "changed" : "made") + " account " +
                             escapeForTerminal(resp.name()) + " under " + escapeForTerminal(resp.parent()) +
                             ", share " + std::to_string(resp.share()) + "\n");
  }
  if (cl.adminVerb == "set-limit") {
    if (cl.limitAccount.empty() == cl.limitUser.empty()) {
      return usageError(err, "set-limit: give --account A or --user U", "admin set-limit");
    }
    if (!cl.limitGpus && !cl.limitRunning && !cl.limitPending && !cl.limitGpuHours &&
        cl.limitPeriod.empty()) {
      return usageError(err, "set-limit: give --gpus, --running, --pending or --gpu-hours (0 lifts a limit)",
                        "admin set-limit");
    }
    v1::SetLimitRequest req;
    req.set_account(cl.limitAccount);
    req.set_user(cl.limitUser);
    if (cl.limitGpus) req.set_gpus(*cl.limitGpus);
    if (cl.limitRunning) req.set_running_jobs(*cl.limitRunning);
    if (cl.limitPending) req.set_pending_jobs(*cl.limitPending);
    if (cl.limitGpuHours) req.set_gpu_hours(*cl.limitGpuHours);
    req.set_period(cl.limitPeriod);
    v1::Limits resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.SetLimit(c, req, &resp); })) return rc;
    return s.print(resp, (cl.limitAccount.empty() ? "user " + escapeForTerminal(cl.limitUser)
                                                  : "account " + escapeForTerminal(cl.limitAccount)) +
                             ": " + formatLimits(resp) + "\n");
  }
  if (cl.adminVerb == "add-qos") {
    v1::AddQosRequest req;
    req.set_name(cl.target);
    req.set_update(cl.update);
    if (cl.qosPriority) req.set_priority(*cl.qosPriority);
    if (cl.qosGraceS) req.set_grace_s(*cl.qosGraceS);
    if (cl.qosGpus) req.set_gpus(*cl.qosGpus);
    if (cl.qosPreempt) {
      req.set_preempt_given(true);
      for (const std::string& n : commaList(*cl.qosPreempt)) req.add_preempt(n);
    }
    if (cl.qosAccounts) {
      req.set_accounts_given(true);
      for (const std::string& n : commaList(*cl.qosAccounts)) req.add_accounts(n);
    }
    v1::Qos resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.AddQos(c, req, &resp); })) return rc;
    v1::ListQosResponse one;
    *one.add_qos() = resp;
    return s.print(resp, std::string(cl.update ? "changed" : "made") + " QoS " +
                             escapeForTerminal(resp.name()) + "\n" + formatQos(one));
  }
  if (cl.adminVerb == "remove-qos") {
    v1::RemoveQosRequest req;
    req.set_name(cl.target);
    v1::RemoveQosResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.RemoveQos(c, req, &resp); })) return rc;
    return s.print(resp, "removed QoS " + escapeForTerminal(cl.target) + "\n");
  }
  if (cl.adminVerb == "gpu-ok") {
    v1::ClearGpuFaultRequest req;
    req.set_node(cl.target);
    req.set_gpu(cl.gpu);
    v1::Node node;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.ClearGpuFault(c, req, &node); })) return rc;
    return s.print(node, "node " + escapeForTerminal(cl.target) + " GPU " + std::to_string(cl.gpu) +
                             ": cleared; jobs may be placed on it\n");
  }
  if (cl.adminVerb == "remove-account") {
    v1::RemoveAccountRequest req;
    req.set_name(cl.target);
    v1::RemoveAccountResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.RemoveAccount(c, req, &resp); })) return rc;
    return s.print(resp, "removed account " + escapeForTerminal(cl.target) + "\n");
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
  if (std::string why = requestIdProblem(cl.requestId); !why.empty())
    return usageError(err, "--request-id '" + escapeForTerminal(cl.requestId) + "': " + why);
  const bool ownId = !cl.requestId.empty();
  v1::SubmitRequest req;
  *req.mutable_spec() = *spec.value;
  req.set_array(cl.array);
  req.set_request_id(ownId ? cl.requestId : newRequestId());
  v1::SubmitResponse resp;
  int usage = kExitOk;
  // The request id makes a repeat safe: an answer lost to a restart or a failover is asked for again.
  const grpc::Status st =
      s.callIdempotent([&](Stub& stub, Ctx* c) { return stub.Submit(c, req, &resp); }, &usage,
                       "submitting again with request id " + req.request_id() + " (never a second job)");
  if (usage != kExitOk) return usage;
  if (!st.ok()) {
    const int rc = s.report(st);
    // The last try's status says little of the first ones: one that was cut may have made the job.
    if (!s.maybeSent()) {
      err << "note: nothing was submitted (no connection was made): the same command is safe to run again\n";
    } else if (outage(st)) {
      err << "note: the job may have been submitted: 'ddlctl list' shows it; 'ddlctl submit --request-id "
          << req.request_id() << " ...' with the same job submits it only if it was not\n";
    }
    return rc;
  }
  if (resp.existing() && ownId) {
    err << "ddlctl: request id " << escapeForTerminal(cl.requestId)
        << " was submitted before: " << escapeForTerminal(resp.job().id()) << " is what it made ("
        << stateName(resp.job().state()) << "); nothing new was submitted\n";
  }
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
                            " " + escapeForTerminal(who.role()) + " (" + escapeForTerminal(who.via()) + ")" +
                            (who.account().empty() ? "" : ", account " + userAccounts(who)) + "\n");
  }
  if (cl.verb == "shares") {
    v1::GetSharesResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.GetShares(c, {}, &resp); })) return rc;
    return s.print(resp, formatShares(resp));
  }
  if (cl.verb == "usage") return runUsage(cl, s, err);
  if (cl.verb == "accounts") {
    v1::ListAccountsResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.ListAccounts(c, {}, &resp); })) return rc;
    return s.print(resp, formatAccountTree(resp));
  }
  if (cl.verb == "qos") {
    v1::ListQosResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.ListQos(c, {}, &resp); })) return rc;
    return s.print(resp, formatQos(resp));
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
    return s.print(resp, formatNodeTable(resp, now) + (cl.verbose ? formatNodeInsides(resp) : ""));
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
