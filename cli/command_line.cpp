// ddlctl's command line: every verb and flag declared for CLI11 (declareCommandLine), the words rewritten
// first where CLI11 alone would read them wrong (several values after one --env or --after-ok; a job
// script's own arguments), and CLI11's parse errors said for a person: which flag of which verb, the nearest
// real flag or verb ("did you mean"), what a value must be. The values are checked in arguments.cpp; this
// file only says which flags exist and fills a CommandLine.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <iterator>
#include <sstream>

#include "common/flag_errors.h"
#include "common/version.h"
#include "ddlctl_internal.h"

namespace ddl::cli {

int usageError(std::ostream& err, const std::string& message, const std::string& verb) {
  err << "ddlctl: " << message << "\n"
      << (verb.empty() ? "run 'ddlctl --help' for usage" : "run 'ddlctl " + verb + " --help' for its options")
      << "\n";
  return kExitUsage;
}

namespace {

// A count ("4") or an elastic range ("2:4", torchrun's --nnodes MIN:MAX): *count is the MAX, *min the MIN
// (none for a plain count, or MIN equal to MAX). A bad value is the flag's usage error.
void countOrRange(const char* flag, const std::string& text, std::optional<int>* count,
                  std::optional<int>* min) {
  auto number = [&](const std::string& part) {
    // A sign is taken ("-1" is then refused as below 1, by checkSubmitValues); spaces and "+" are not.
    int n = 0;
    const char* end = part.data() + part.size();
    auto [at, ec] = std::from_chars(part.data(), end, n);
    if (part.empty() || ec != std::errc() || at != end)
      throw CLI::ValidationError(std::string(flag) +
                                 " takes a whole number N or an elastic range MIN:MAX, got '" +
                                 escapeForTerminal(text) + "'");
    return n;
  };
  const size_t colon = text.find(':');
  *count = number(text.substr(colon == std::string::npos ? 0 : colon + 1));
  min->reset();
  if (colon == std::string::npos) return;
  const int low = number(text.substr(0, colon));
  if (low < 1 || low > **count)
    throw CLI::ValidationError(std::string(flag) + " " + escapeForTerminal(text) +
                               ": an elastic range MIN:MAX needs 1 <= MIN <= MAX");
  if (low < **count) *min = low;
}

constexpr const char* kFooter = R"(Exit status:
  0  success
  1  the coordinator refused the request (unknown job or node, invalid request, wrong state); its message
     is printed on stderr as "ddlctl: <message>"
  2  usage error: bad flags or arguments (nothing was sent)
  3  cannot reach the coordinator (connection refused, no answer within --timeout, shutting down, a failed
     TLS handshake)
  4  not authenticated: no token, or a token the coordinator does not know
  5  permission denied: another user's job, or a verb for admins
 wait, submit --wait and logs -f exit with the job's result once it ended (the worst of several jobs):
  0  SUCCEEDED
  N  FAILED: the first failing rank's exit code N, or 128+S when signal S killed it (1 when unknown)
  6  CANCELLED
  7  TIMEOUT: the job ran past its --time limit
  8  --wait-timeout passed while a job was still live
 (a job's own exit code may be any number; `ddlctl status JOB` tells them apart)

Environment:
  DDL_COORDINATOR  HOST:PORT of the coordinator when --coordinator is not given (default 127.0.0.1:7070);
                   HOST:PORT,HOST:PORT,... for several that share an etcd store (the leader answers)
  DDL_CA           the cluster's CA certificate when --ca is not given (default ~/.config/ddl/ca.crt if it
                   exists, else /etc/ddl/pki/ca.crt)
  DDL_TOKEN        your token when --token-file is not given (else read from $DDL_TOKEN_FILE or
                   ~/.config/ddl/token)

Job ids may be short: 5, 000005 and j-5 all mean j-000005.

Output: text for people; -o json prints exactly one JSON document on stdout (proto field names).)";

constexpr const char* kJobHelp = "job id (j-000005, or just 5)";

// ddlctl's own options, given before or after the verb, and the help's footer.
void declareGlobalOptions(CLI::App& app, CommandLine& cl) {
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();  // so global options work after the verb too: ddlctl list -o json
  // A global given twice: the last one wins, so wrapper scripts can set a default that users override.
  app.add_option(
         "--coordinator", cl.coordinator,
         "the coordinator's HOST:PORT, or several as HOST:PORT,HOST:PORT (default: $DDL_COORDINATOR, else "
         "127.0.0.1:7070)")
      ->type_name("HOST:PORT")
      ->take_last();
  app.add_option("-o,--output", cl.output, "text or json (usage: csv too)")
      ->check(CLI::IsMember({"text", "json", "csv"}))
      ->take_last();
  app.add_option("--timeout", cl.timeoutS, "deadline of the request, in seconds (default 10)")
      ->type_name("SECONDS")
      ->take_last();
  app.add_option("--ca", cl.ca,
                 "the cluster's CA certificate (default: $DDL_CA, ~/.config/ddl/ca.crt, "
                 "/etc/ddl/pki/ca.crt)")
      ->type_name("FILE")
      ->take_last();
  app.add_option("--token-file", cl.tokenFile,
                 "file holding your token (default: $DDL_TOKEN, else "
                 "$DDL_TOKEN_FILE, else ~/.config/ddl/token)")
      ->type_name("FILE")
      ->take_last();
  app.add_flag("--insecure", cl.insecure, "plaintext, for a coordinator run with --insecure on loopback");
}

// submit: the job's shape, resources, environment, dependencies, and --wait.
void declareSubmit(CLI::App& app, CommandLine& cl) {
  SubmitArgs& s = cl.submit;
  CLI::App* submit = app.add_subcommand(
      "submit",
      "submit a job: ddlctl submit [options] -- COMMAND ARGS..., or ddlctl submit [options] SCRIPT ARGS...");
  submit->footer(
      "Say how many GPUs: --gpus T (a total, placed on as few nodes as possible) or --nodes N with\n"
      "--gpus-per-node G (G defaults to 1). Prints the job id (or the Job as JSON).\n"
      "SCRIPT (no --): a file starting with #! whose '#DDL --flag value' lines, before its first command,\n"
      "are submit options (the command line's win); the job runs SCRIPT by its absolute path with ARGS.");
  // A flag given twice takes its last value, so a script's #DDL line can be overridden on the command line.
  submit->add_option("--name", s.name, "job name (default: the command's basename)")->take_last();
  // Functions, not plain ints: "given" must be told apart from any value, 0 included.
  submit
      ->add_option_function<std::string>(
          "--nodes", [&s](const std::string& t) { countOrRange("--nodes", t, &s.nodes, &s.minNodes); },
          "number of nodes; MIN:MAX: elastic, goes on with at least MIN when nodes are lost")
      ->type_name("N|MIN:MAX")
      ->take_last();
  submit
      ->add_option_function<int>(
          "--gpus-per-node", [&s](const int& g) { s.gpusPerNode = g; }, "GPUs on each node (default 1)")
      ->type_name("G")
      ->take_last();
  submit
      ->add_option_function<std::string>(
          "--gpus", [&s](const std::string& t) { countOrRange("--gpus", t, &s.gpus, &s.minGpus); },
          "total GPUs, on any nodes; MIN:MAX: elastic, goes on with at least MIN when ranks are lost")
      ->type_name("T|MIN:MAX")
      ->take_last();
  submit
      ->add_option_function<int>(
          "--cpus-per-rank,--cpus-per-gpu", [&s](const int& c) { s.cpusPerRank = c; },
          "CPUs for each rank (a rank is a GPU), counted by placement and enforced on the node")
      ->type_name("C")
      ->take_last();
  submit
      ->add_option("--mem-per-rank,--mem-per-gpu", s.memPerRank,
                   "memory for each rank, such as 8G (binary units); a rank that uses more is killed")
      ->type_name("SIZE")
      ->take_last();
  submit->add_option("--topology", s.topology, "ring dims override, e.g. 4x2")->take_last();
  submit
      ->add_option("--priority", s.priority,
                   "orders your own jobs: higher first (default 0); the queue is "
                   "ordered by fair-share (ddlctl shares)")
      ->take_last();
  submit
      ->add_option("--account", s.account,
                   "the account to charge (default: your default account; another you are in; admins: any)")
      ->take_last();
  submit->add_option("--qos", s.qos, "quality of service (default normal; ddlctl qos lists them)")
      ->take_last();
  submit->add_option("--max-restarts", s.maxRestarts, "requeue after a failure up to R times (default 0)")
      ->take_last();
  // One value per flag (allow_extra_args(false)): a vector option would otherwise swallow the words after it.
  submit->add_option("--env", s.env, "KEY=VALUE for every rank (repeatable; several after one --env)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  submit->add_option("--label", s.labels, "KEY=VALUE a node must carry (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  submit
      ->add_option("--workdir", s.workdir,
                   "working directory of the ranks (default: here; a relative one is taken from here)")
      ->take_last();
  submit
      ->add_option("--time", s.timeLimit,
                   "time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or 90s, 30m, 2h, 1d; the job "
                   "is stopped and ends TIMEOUT past it")
      ->type_name("LIMIT")
      ->take_last();
  submit
      ->add_option("--signal", s.warnSignal,
                   "send SIG to the running ranks SECONDS (default 60) before the --time limit, so they can "
                   "checkpoint: USR1@120, SIGTERM, 10@30")
      ->type_name("SIG[@SECONDS]")
      ->take_last();
  submit
      ->add_option(
          "--after-ok", s.afterOk,
          "start only after JOB succeeded (repeatable; several after one --after-ok, or comma-separated)")
      ->type_name("JOB")
      ->allow_extra_args(false);
  submit
      ->add_option(
          "--after-any", s.afterAny,
          "start only after JOB ended, however (repeatable; several after one flag, or comma-separated)")
      ->type_name("JOB")
      ->allow_extra_args(false);
  submit
      ->add_option("--array", cl.array,
                   "a job array, one job per index (DDL_ARRAY_INDEX): 0-15, 1,3,5, 0-15:4; %N runs at most N "
                   "at once (0-15%4); at most 10000 jobs")
      ->type_name("SPEC")
      ->take_last();
  submit->add_flag("--hold", s.hold, "submit held: the job waits until 'ddlctl release'");
  submit
      ->add_option("--export", s.exportSpec,
                   "environment sent to the ranks besides --env: NONE (default), ALL (yours, but DDL_* "
                   "variables, credentials and what ddl sets itself), or VAR[,VAR=value...]")
      ->type_name("WHAT")
      ->take_last();
  submit
      ->add_option(
          "--request-id", cl.requestId,
          "this submit's id (at most 128 letters, digits and . _ : -): a submit repeating it gets the "
          "job it made back, never a second one (default: a new one each time)")
      ->type_name("ID")
      ->take_last();
  submit->add_flag("--wait", cl.wait, "wait until the job ended and exit with its result (see Exit status)");
  submit->add_option("--wait-timeout", cl.waitTimeoutS, "with --wait: give up after SECONDS (exit 8)")
      ->type_name("SECONDS")
      ->check(CLI::NonNegativeNumber)
      ->take_last();
  submit
      ->add_option("--reconnect-timeout", cl.reconnectS,
                   "ride out a coordinator that stops answering (a restart, a new leader) for up to SECONDS "
                   "(default 600): the submit itself, which its request id makes safe to repeat, and with "
                   "--wait the waiting")
      ->check(CLI::Range(0.0, 86400.0));
  // The command arrives through the split at "--" in runDdlctl(), or as a script: the first word that is not
  // a flag or a flag's value ends submit's flags (expandEnvValues() splits there, before CLI11 parses).
}

// list: which jobs, and how many a page.
void declareList(CLI::App& app, CommandLine& cl) {
  CLI::App* list = app.add_subcommand("list", "list jobs (default: PENDING, SCHEDULED, STARTING, RUNNING)");
  list->add_option("--state", cl.states, "only jobs in these states (repeatable, comma-separated)")
      ->type_name("STATE")
      ->allow_extra_args(false);
  list->add_option("--user", cl.user, "only this user's jobs");
  // With --state, --all changes nothing: "list --all --state failed --since 10m" is a natural thing to type.
  list->add_flag("--all", cl.all, "every job, finished ones too (with --state: the states given)");
  list->add_option("--name", cl.name, "only jobs with exactly this name");
  list->add_option(
          "--since", cl.since,
          "only jobs submitted at or after TIME: 2026-11-24, 2026-11-24T10:00 (local time), 06:55 (today) "
          "or an age such as 30m, 1h, 2d")
      ->type_name("TIME");
  list->add_option("--until", cl.until, "only jobs submitted before TIME (same forms as --since)")
      ->type_name("TIME");
  list->add_option("--page-size", cl.pageSize,
                   "jobs per request (default: the coordinator's, 500); ddlctl fetches page after page")
      ->type_name("N")
      ->check(CLI::Range(1, 5000));
}

// The verbs on jobs by id (logs aside): status, cancel (or by filter), wait, hold, release, requeue, ring.
void declareJobVerbs(CLI::App& app, CommandLine& cl) {
  const std::string jobHelp = kJobHelp;
  app.add_subcommand("status", "one job in detail, with its transitions")
      ->add_option("JOB", cl.target, jobHelp)
      ->required();
  CLI::App* cancel = app.add_subcommand(
      "cancel",
      "cancel jobs: by id, or every live job of yours matching --state/--name/--array (--user for another "
      "user's); --signal only signals");
  cancel->add_option("JOB", cl.targets, jobHelp + " (several allowed)");
  cancel
      ->add_option_function<std::string>(
          "--user",
          [&cl](const std::string& u) {
            cl.user = u;
            cl.userGiven = true;
          },
          "only this user's jobs (default with a filter: your own; '' for every user's)")
      ->type_name("USER");
  cancel
      ->add_option("--array", cl.cancelArray, "every live job of the job array ID (the id of its first job)")
      ->type_name("ID");
  cancel
      ->add_option("--state", cl.states,
                   "only jobs in these states (default: every live state; with --signal, RUNNING)")
      ->type_name("STATE")
      ->allow_extra_args(false);
  cancel->add_option("--name", cl.name, "only jobs with exactly this name");
  cancel
      ->add_option("--signal", cl.signal,
                   "send this signal (USR1, SIGUSR1 or a number) to the job's running ranks instead; the job "
                   "goes on")
      ->type_name("SIG");
  CLI::App* wait =
      app.add_subcommand("wait", "wait until the jobs ended; exit with their result (see Exit status)");
  wait->add_option("JOB", cl.targets, jobHelp + " (several allowed)")->required();
  wait->add_option("--wait-timeout", cl.waitTimeoutS, "give up after SECONDS (exit 8)")
      ->type_name("SECONDS")
      ->check(CLI::NonNegativeNumber);
  wait->add_option("--reconnect-timeout", cl.reconnectS,
                   "ride out a coordinator that stops answering (a restart) for up to SECONDS (default 600)")
      ->check(CLI::Range(0.0, 86400.0));
  app.add_subcommand("hold", "keep pending jobs from being placed until released")
      ->add_option("JOB", cl.targets, jobHelp + " (several allowed)")
      ->required();
  app.add_subcommand("release", "let held jobs be placed again")
      ->add_option("JOB", cl.targets, jobHelp + " (several allowed)")
      ->required();
  app.add_subcommand("requeue", "stop live jobs' ranks and put the jobs back in the queue (not a restart)")
      ->add_option("JOB", cl.targets, jobHelp + " (several allowed)")
      ->required();
  app.add_subcommand("ring", "a job's ring layout (rank order and dims)")
      ->add_option("JOB", cl.target, jobHelp)
      ->required();
}

// logs: which rank and attempt, how much, and -f's waiting.
void declareLogs(CLI::App& app, CommandLine& cl) {
  const std::string jobHelp = kJobHelp;
  CLI::App* logs =
      app.add_subcommand("logs", "the ranks' output, read from their nodes (lines prefixed [rank])");
  logs->add_option("JOB", cl.target, jobHelp)->required();
  logs->add_option("--rank", cl.rank, "only this rank (no prefix)")->check(CLI::NonNegativeNumber);
  logs->add_option("--attempt", cl.attempt, "launch attempt (default: the latest; -f follows every attempt)")
      ->check(CLI::PositiveNumber);
  logs->add_flag("-f,--follow", cl.follow,
                 "wait for the job to start, print every attempt's output as it comes (a line '==> attempt "
                 "N ... <==' on stderr at a restart) until the job ends; exit with its result");
  logs->add_option("--tail", cl.tail, "only the last N lines of each rank (then follow, with -f)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber);
  logs->add_flag("--timestamps", cl.timestamps,
                 "prefix each line with the local time ddlctl received it (not when the rank wrote it)");
  logs->add_option("--wait-timeout", cl.waitTimeoutS, "with -f: give up after SECONDS (exit 8)")
      ->type_name("SECONDS")
      ->check(CLI::NonNegativeNumber);
  logs->add_option(
          "--reconnect-timeout", cl.reconnectS,
          "with -f: ride out a coordinator that stops answering (a restart) for up to SECONDS (default 600)")
      ->check(CLI::Range(0.0, 86400.0));
}

// nodes (and nodes remove), drain, undrain.
void declareNodeVerbs(CLI::App& app, CommandLine& cl) {
  CLI::App* nodes =
      app.add_subcommand("nodes", "list nodes; 'nodes remove NAME' forgets a node that is gone");
  nodes->add_flag(
      "-v,--verbose", cl.verbose,
      "also each node's GPUs (NUMA node, CPUs, NVLink island and peers, nearest NIC, PCI address) "
      "and NICs");
  nodes->add_subcommand("remove", "forget node NAME for good (admins only; it must be DOWN with no live job)")
      ->add_option("NAME", cl.target, "node name")
      ->required();
  CLI::App* drain = app.add_subcommand("drain", "stop placing new jobs on a node (running jobs stay)");
  drain->add_option("NODE", cl.target, "node name")->required();
  drain->add_option("--reason", cl.reason, "why, shown with the node in 'ddlctl nodes' (at most 256 bytes)")
      ->type_name("TEXT");
  app.add_subcommand("undrain", "place jobs on a drained node again")
      ->add_option("NODE", cl.target, "node name")
      ->required();
}

// whoami, and admin's verbs on users and node certificates.
void declareAccountVerbs(CLI::App& app, CommandLine& cl) {
  app.add_subcommand("whoami", "who the coordinator takes you for (user, role and accounts)");
  app.add_subcommand("accounts", "the accounts jobs are charged to: their tree, shares and users");
  app.add_subcommand("qos", "the qualities of service: priority, what each preempts, grace and limits");
  app.add_subcommand("shares", "each account's share, decayed GPU usage and fair-share factor (as sshare)");
  CLI::App* usage = app.add_subcommand(
      "usage",
      "GPU- and CPU-hours each account and user used over a period, from daily rollups (as sreport)");
  usage
      ->add_option(
          "--since", cl.since,
          "from TIME (default 7d): 2026-11-24, 2026-11-24T10:00 (local time), 06:55 (today) or an age "
          "such as 30d; days are UTC days, and a day the period touches counts whole")
      ->type_name("TIME");
  usage->add_option("--until", cl.until, "to TIME (default now; same forms as --since)")->type_name("TIME");
  usage->add_option("--account", cl.account, "only this account (its own jobs, not its sub-accounts')");
  usage->add_option("--user", cl.user, "only this user");
  usage->add_flag("--by-account", cl.byAccount, "one row per account, its users added up");
  usage->add_flag("--daily", cl.daily, "one row per day too");

  CLI::App* admin = app.add_subcommand("admin", "users, accounts, QoS and node certificates (admins only)");
  admin->require_subcommand(1);
  CLI::App* add = admin->add_subcommand("add-user", "make a user and print its token (shown once)");
  add->add_option("NAME", cl.target, "user name (the account ranks run as on the nodes)")->required();
  add->add_option("--role", cl.role, "user, admin or viewer (default user)")
      ->check(CLI::IsMember({"user", "admin", "viewer"}));
  add->add_flag("--rotate", cl.rotate, "give an existing user a new token (the old one stops working)");
  add->add_option("--account", cl.account,
                  "the account the user's jobs are charged to (default root; with "
                  "--rotate, the user's own)");
  CLI::App* member = admin->add_subcommand(
      "user-accounts", "the accounts a user is in, whose names its jobs may give (submit --account)");
  member->add_option("NAME", cl.target, "user name")->required();
  member->add_option("--add", cl.joinAccounts, "join these accounts (comma-separated)")
      ->type_name("ACCOUNT,...");
  member->add_option("--remove", cl.leaveAccounts, "leave these accounts (comma-separated; not the default)")
      ->type_name("ACCOUNT,...");
  member->add_option("--default", cl.defaultAccount,
                     "the account its jobs are charged to unless they name another (it joins it; the old "
                     "default stays one of its accounts)");
  CLI::App* account = admin->add_subcommand("add-account", "make an account (or, with --update, change one)");
  account->add_option("NAME", cl.target, "account name")->required();
  account->add_option("--parent", cl.parent, "the account it lies under (default root)");
  account->add_option("--share", cl.share, "its share against its siblings' (default 1)")
      ->check(CLI::Range(1, 1000000));
  account->add_flag("--update", cl.update, "change an existing account's share or parent");
  CLI::App* limit = admin->add_subcommand(
      "set-limit", "what an account (with its sub-accounts) or a user may hold at once; 0 lifts a limit");
  limit->add_option("--account", cl.limitAccount, "the account");
  limit->add_option("--user", cl.limitUser, "the user");
  limit->add_option("--gpus", cl.limitGpus, "GPUs its running jobs hold")->check(CLI::Range(0, 10000000));
  limit->add_option("--running", cl.limitRunning, "jobs running at once")->check(CLI::Range(0, 10000000));
  limit->add_option("--pending", cl.limitPending, "jobs waiting in the queue (a submit past it is refused)")
      ->check(CLI::Range(0, 10000000));
  limit
      ->add_option("--gpu-hours", cl.limitGpuHours,
                   "GPU-hours its jobs may use each --period: once used, its jobs wait for the next period "
                   "(running ones run on)")
      ->check(CLI::Range(0.0, 1e9));
  limit
      ->add_option("--period", cl.limitPeriod,
                   "what --gpu-hours counts over: day, week or month (UTC; default month)")
      ->check(CLI::IsMember({"day", "week", "month"}));
  CLI::App* qos =
      admin->add_subcommand("add-qos", "make a quality of service (or, with --update, change one)");
  qos->add_option("NAME", cl.target, "QoS name")->required();
  qos->add_option("--priority", cl.qosPriority,
                  "its tier (0 to 1000000; default 0): jobs of a higher one are tried first")
      ->check(CLI::Range(int64_t{0}, int64_t{1000000}));
  qos->add_option("--preempt", cl.qosPreempt,
                  "the QoS (comma-separated, each of lower priority) whose running jobs its jobs may preempt")
      ->type_name("QOS,...");
  qos->add_option("--grace", cl.qosGraceS,
                  "seconds a preempted job of this QoS gets between its signal and SIGKILL (default 60)")
      ->check(CLI::Range(int64_t{0}, int64_t{7 * 86400}));
  qos->add_option("--gpus", cl.qosGpus, "GPUs its jobs may hold together (0: no limit)")
      ->check(CLI::Range(0, 10000000));
  qos->add_option(
         "--accounts", cl.qosAccounts,
         "the accounts (comma-separated; and those under them) that may use it (default: all; a QoS that "
         "preempts must name them, root for all)")
      ->type_name("ACCOUNT,...");
  qos->add_flag("--update", cl.update, "change the fields given of an existing QoS");
  admin->add_subcommand("remove-qos", "remove a QoS that no other QoS preempts")
      ->add_option("NAME", cl.target, "QoS name")
      ->required();
  admin->add_subcommand("remove-account", "remove an account that holds no users and no accounts")
      ->add_option("NAME", cl.target, "account name")
      ->required();
  admin->add_subcommand("remove-user", "remove a user (its token stops working)")
      ->add_option("NAME", cl.target, "user name")
      ->required();
  admin->add_subcommand("users", "list users, roles and accounts");
  CLI::App* gpuOk = admin->add_subcommand(
      "gpu-ok", "a faulted GPU is fit for work again (reset or replaced): jobs may be placed on it");
  gpuOk->add_option("NODE", cl.target, "node name")->required();
  gpuOk->add_option("GPU", cl.gpu, "the GPU's index on the node (ddlctl nodes -v)")
      ->required()
      ->check(CLI::NonNegativeNumber);
  CLI::App* issue = admin->add_subcommand("issue-node",
                                          "a certificate for a node, written to --out as ca.crt, "
                                          "node.crt and node.key (install them in the node's "
                                          "/etc/ddl/pki)");
  issue->add_option("NAME", cl.target, "node name")->required();
  issue->add_option("--out", cl.outDir, "directory to write the node's files to")->required();
  issue->add_option("--days", cl.days, "validity (default: the coordinator's node_cert_days)")
      ->check(CLI::Range(1, 3650));
  CLI::App* join = admin->add_subcommand("join-token",
                                         "a one-time token with which node NAME gets its own "
                                         "certificate (ddl-agent join)");
  join->add_option("NAME", cl.target, "node name")->required();
  join->add_option("--ttl", cl.ttlS, "seconds the token stays valid (default 3600)")
      ->check(CLI::Range(1, 604800));
}

// Every verb and flag, in the order --help lists them.
void declareCommandLine(CLI::App& app, CommandLine& cl) {
  declareGlobalOptions(app, cl);
  declareSubmit(app, cl);
  declareList(app, cl);
  declareJobVerbs(app, cl);
  declareLogs(app, cl);
  declareNodeVerbs(app, cl);
  declareAccountVerbs(app, cl);
}

// "--env A=1 B=2" becomes "--env A=1 --env B=2" in submit's flags: several values may follow one --env, and
// the first word that is not NAME=VALUE ends them; so with --after-ok and --after-any and job ids ("5",
// "j-6", "7,8"). CLI11 itself takes one value per flag, so that the job's command or script is never
// swallowed. Walks the words as CLI11 will, skipping each option's value, and stops at submit's first
// positional word: a script's own arguments are left alone.
std::vector<std::string> expandEnvValues(CLI::App& app, const std::vector<std::string>& words, bool inSubmit,
                                         std::vector<std::string>* rest) {
  std::vector<std::string> out;
  CLI::App* current = inSubmit ? app.get_subcommand("submit") : &app;
  if (words.empty()) return out;
  out.push_back(words[0]);  // the program
  size_t i = 1;
  bool (*isAssignment)(const std::string&) = [](const std::string& w) {
    const size_t eq = w.find('=');
    return eq != std::string::npos && eq > 0 && isEnvName(std::string_view(w).substr(0, eq));
  };
  // "67", "j-67", "5,6": job ids as --after-ok takes them (a script's name is none of these).
  bool (*looksLikeJobIds)(const std::string&) = [](const std::string& w) {
    std::istringstream in(w);
    std::string piece;
    bool any = false;
    while (std::getline(in, piece, ',')) {
      const std::string_view id = std::string_view(piece).substr(piece.rfind("j-", 0) == 0 ? 2 : 0);
      if (!piece.empty() && !isDigits(id)) return false;
      any = any || !piece.empty();
    }
    return any;
  };
  for (; i < words.size(); ++i) {
    const std::string& w = words[i];
    out.push_back(w);
    if (w.size() > 1 && w[0] == '-') {
      if (w.find('=') != std::string::npos) continue;  // --flag=value
      const CLI::Option* opt = current->get_option_no_throw(w);
      if (opt == nullptr && current != &app) opt = app.get_option_no_throw(w);
      if (opt == nullptr || opt->get_items_expected_max() == 0 || i + 1 >= words.size()) continue;
      out.push_back(words[++i]);
      if (current->get_name() != "submit") continue;
      // --env A=1 B=2, --after-ok 5 6: the values that follow while they have the flag's form.
      const auto more = w == "--env"                              ? isAssignment
                        : w == "--after-ok" || w == "--after-any" ? looksLikeJobIds
                                                                  : nullptr;
      while (more != nullptr && i + 1 < words.size() && more(words[i + 1])) {
        out.push_back(w);
        out.push_back(words[++i]);
      }
      continue;
    }
    if (current == &app) {
      for (CLI::App* sub : app.get_subcommands([&](CLI::App* a) { return a->check_name(w); })) current = sub;
      continue;
    }
    if (current->get_name() == "submit") {  // the command (a script) starts here
      out.pop_back();
      rest->assign(words.begin() + static_cast<std::ptrdiff_t>(i), words.end());
      break;
    }
  }
  return out;
}

// "did you mean": common/flag_errors.h, shared with the daemons.
std::string nearest(const std::string& given, const std::vector<std::string>& candidates) {
  return nearestWord(given, candidates);
}

// Every long flag of the verb and of ddlctl itself ("--gpus"), for "did you mean".
std::vector<std::string> flagNames(const CLI::App& app, const CLI::App* verb) {
  std::vector<std::string> names;
  for (const CLI::App* scope : {verb, &app}) {
    if (scope == nullptr) continue;
    for (const CLI::Option* option : scope->get_options()) {
      for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    }
  }
  return names;
}

constexpr const char* kVerbs[] = {"submit",   "list",   "status", "wait",  "cancel", "hold",    "release",
                                  "requeue",  "ring",   "logs",   "nodes", "drain",  "undrain", "whoami",
                                  "accounts", "shares", "usage",  "admin", "qos"};

// What CLI11 reports, said for a person: which flag of which verb, the nearest real flag, what a value must
// be.
std::string describeParseError(const CLI::App& app, const CLI::App* verb, const CLI::ParseError& e) {
  const std::string of = verb != nullptr ? " for " + verb->get_name() : "";
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    std::vector<std::string> extras = verb != nullptr ? verb->remaining() : app.remaining();
    if (verb != nullptr)
      for (const std::string& w : app.remaining()) extras.push_back(w);
    for (const std::string& word : extras) {
      if (word.size() > 1 && word[0] == '-') {
        const std::string name = word.substr(0, word.find('='));
        const std::string guess = nearest(name, flagNames(app, verb));
        const std::vector<std::string> own = flagNames(app, nullptr);  // ddlctl's, before the verb
        const bool global = std::find(own.begin(), own.end(), guess) != own.end();
        return "unknown option " + escapeForTerminal(name) + (global ? "" : of) +
               (guess.empty() ? "" : "; did you mean " + guess + "?");
      }
    }
    if (!extras.empty()) {
      return "unexpected argument '" + escapeForTerminal(extras.front()) + "'" + of +
             (verb != nullptr && verb->get_name() == "submit" ? " (the job's command goes after --)" : "");
    }
  }
  const std::string what = e.what();
  if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    // "Could not convert: --nodes = two"
    const size_t colon = what.find(": "), equals = what.find(" = ");
    if (colon != std::string::npos && equals != std::string::npos && equals > colon) {
      return what.substr(colon + 2, equals - colon - 2) + " takes a whole number, got '" +
             escapeForTerminal(what.substr(equals + 3)) + "'";
    }
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    // "--gpus: 1 required T missing"
    const size_t colon = what.find(": ");
    if (colon != std::string::npos && what.find(" missing") != std::string::npos)
      return what.substr(0, colon) + " needs a value" + of;
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && verb != nullptr) {
    // "JOB is required"
    const size_t is = what.find(" is required");
    if (is != std::string::npos) return verb->get_name() + " needs " + what.substr(0, is);
  }
  return escapeForTerminal(what);
}

}  // namespace

// Parses `words` (words[0] is the program) into `cl`. `inSubmit`: the words are submit's flags only (a
// script's directives), checked on their own.
ParseResult parseWords(const std::vector<std::string>& words, CommandLine& cl, bool inSubmit,
                       std::ostream& out, std::ostream& err) {
  CLI::App app{"ddlctl: submit, watch and cancel ddl jobs and manage nodes, through the ddl coordinator.",
               "ddlctl"};
  declareCommandLine(app, cl);
  app.set_version_flag("--version", std::string("ddlctl ") + ddl::kVersion,
                       "print ddlctl's version and exit");
  ParseResult result;
  if (inSubmit) {
    // A script's directive sets submit's own flags only, never ddlctl's (--coordinator, --token-file, ...):
    // a shared script must not send the user's token elsewhere. Refused by name here, and CLI11 passes
    // nothing up to the globals either.
    CLI::App* submit = app.get_subcommand("submit");
    submit->fallthrough(false);
    for (size_t i = 1; i < words.size(); ++i) {
      const std::string& w = words[i];
      if (w.size() < 2 || w[0] != '-' || w == "--") continue;
      const std::string name = w[1] == '-' ? w.substr(0, w.find('=')) : w.substr(0, 2);
      if (submit->get_option_no_throw(name) == nullptr && app.get_option_no_throw(name) != nullptr) {
        result.rc = kExitUsage;
        result.error = "#DDL may set only submit's flags, not ddlctl's own " + escapeForTerminal(name) +
                       " (give that on the command line or in the environment)";
        return result;
      }
      if (name == "--export") {  // it would send the submitter's own environment (keys, tokens) into the job
        result.rc = kExitUsage;
        result.error =
            "#DDL may not set --export: what of your environment a job gets is yours to say on the "
            "command line";
        return result;
      }
    }
  }
  std::vector<std::string> expanded = expandEnvValues(app, words, inSubmit, &result.rest);
  if (inSubmit) expanded.insert(expanded.begin() + 1, "submit");
  std::vector<char*> argv;
  for (std::string& w : expanded) argv.push_back(w.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {  // --help, --version
      app.exit(e, out, err);
      result.rc = kExitOk;
      return result;
    }
    result.rc = kExitUsage;
    // The innermost verb the words reached (admin's verbs are one level down).
    const CLI::App* verb = app.get_subcommands().empty() ? nullptr : app.get_subcommands().front();
    if (verb != nullptr && !verb->get_subcommands().empty()) verb = verb->get_subcommands().front();
    if (verb != nullptr) {
      result.verb = verb->get_name();
      if (verb->get_parent() != nullptr && verb->get_parent() != &app)
        result.verb = verb->get_parent()->get_name() + " " + result.verb;
    }
    if (app.get_subcommands().empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      std::vector<std::string> rest = app.remaining();
      std::string guess = rest.empty() ? "" : nearest(rest.front(), {std::begin(kVerbs), std::end(kVerbs)});
      std::string what = rest.empty()
                             ? "say what to do"
                             : "unknown verb '" + escapeForTerminal(rest.front()) + "'" +
                                   (guess.empty() ? "" : " (did you mean " + guess + "?)") + "; use one of";
      result.error =
          what +
          ": submit, list, status, wait, cancel, hold, release, requeue, ring, logs, nodes, drain, "
          "undrain, whoami, accounts, shares, usage or admin";
    } else {
      result.error = describeParseError(app, verb, e);
    }
    return result;
  }
  CLI::App* verb = app.get_subcommands().front();
  cl.verb = verb->get_name();
  if (cl.output == "csv" && cl.verb != "usage") {
    result.rc = kExitUsage;
    result.verb = cl.verb;
    result.error = "-o csv goes with usage only; " + cl.verb + " prints text or json";
    return result;
  }
  if (cl.verb == "admin") cl.adminVerb = verb->get_subcommands().front()->get_name();
  if (cl.verb == "nodes" && !verb->get_subcommands().empty()) {
    cl.nodesVerb = verb->get_subcommands().front()->get_name();
  }
  return result;
}

}  // namespace ddl::cli
