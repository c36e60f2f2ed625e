// ddlctl's argument checks: the half of ddlctl.h's contract that needs no coordinator. Each function takes
// what the user typed (and, where it matters, the environment or the clock as an argument) and returns the
// value or the sentence that names the flag and says what it takes, so that a typo costs no round trip and
// is reported with exit 2 before anything is sent. The coordinator checks everything again; the parsers that
// must agree with it (array specs, byte sizes, topology dims, HOST:PORT, job ids) are its own, from common/.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iterator>
#include <map>
#include <sstream>

#include "common/array_spec.h"
#include "common/host_port.h"
#include "common/job_id.h"
#include "common/rank_env.h"
#include "common/resources.h"
#include "common/signals.h"
#include "common/topology_dims.h"
#include "ddlctl_internal.h"

namespace ddl::cli {

std::string checkCoordinatorAddress(std::string_view address) {
  auto bad = [&](const std::string& why) {
    return "invalid coordinator address '" + std::string(address) + "': " + why +
           " (expected HOST:PORT, e.g. 127.0.0.1:7070, or several: HOST:PORT,HOST:PORT)";
  };
  for (const std::string& one : splitAddressList(address)) {
    StatusOr<HostPort> parsed = parseHostPort(one, 1);
    if (!parsed) return bad((one == address ? "" : "'" + one + "': ") + parsed.status().message());
  }
  return "";
}

std::string validStateNames() {
  std::vector<std::string> names;
  for (int s = v1::JobState_MIN; s <= v1::JobState_MAX; ++s) {
    if (s != v1::JOB_STATE_UNSPECIFIED && v1::JobState_IsValid(s)) {
      names.push_back(stateName(static_cast<v1::JobState>(s)));
    }
  }
  return join(names, ", ");
}

Parsed<std::vector<v1::JobState>> parseStates(const std::vector<std::string>& args) {
  std::vector<v1::JobState> states;
  for (const std::string& arg : args) {
    std::istringstream in(arg);
    std::string piece;
    while (std::getline(in, piece, ',')) {
      std::string name = upper(trim(piece));
      if (name.empty()) continue;  // "running," is a harmless slip
      v1::JobState s;
      if (!v1::JobState_Parse(name, &s) || s == v1::JOB_STATE_UNSPECIFIED) {
        return {std::nullopt, "unknown job state '" + trim(piece) + "'; valid states: " + validStateNames()};
      }
      if (std::find(states.begin(), states.end(), s) == states.end()) states.push_back(s);
    }
  }
  return {states, ""};
}

bool isFinalState(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED || s == v1::TIMEOUT;
}

std::string normalizeJobId(std::string_view id) { return canonicalJobId(id).value_or(std::string(id)); }

std::optional<int> jobExitCode(const v1::Job& job) {
  switch (job.state()) {
    case v1::SUCCEEDED:
      return kExitOk;
    case v1::CANCELLED:
      return kExitJobCancelled;
    case v1::TIMEOUT:
      return kExitJobTimeout;
    case v1::FAILED: {
      const v1::Failure& f = job.failure();
      if (f.has_signal() && f.signal() > 0) return std::min(128 + f.signal(), 255);
      if (f.has_exit_code() && f.exit_code() > 0 && f.exit_code() <= 255) return f.exit_code();
      return 1;
    }
    default:
      return std::nullopt;
  }
}

int worstJobExit(const std::vector<v1::Job>& jobs) {
  // Severity: SUCCEEDED 0, CANCELLED 1, TIMEOUT 2, FAILED 3, live 4; the first job of the worst kind decides.
  auto severity = [](const v1::Job& j) {
    switch (j.state()) {
      case v1::SUCCEEDED:
        return 0;
      case v1::CANCELLED:
        return 1;
      case v1::TIMEOUT:
        return 2;
      case v1::FAILED:
        return 3;
      default:
        return 4;
    }
  };
  int worst = -1, code = kExitOk;
  for (const v1::Job& j : jobs) {
    if (severity(j) > worst) {
      worst = severity(j);
      code = jobExitCode(j).value_or(kExitWaitTimeout);
    }
  }
  return code;
}

Parsed<int> parseTimeLimit(std::string_view text) {
  const std::string t = trim(text);
  auto fail = [&](const std::string& why) {
    return Parsed<int>{std::nullopt, "--time '" + escapeForTerminal(text) + "' " + why};
  };
  const std::string forms =
      "is not a time limit: give MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or a number with a unit "
      "(90s, 30m, 2h, 1d)";
  constexpr int64_t kMaxS = 365LL * 86400;
  int64_t seconds = 0;
  if (t.size() >= 2 && t.size() <= 10 && isDigits(std::string_view(t).substr(0, t.size() - 1)) &&
      std::string_view("smhd").find(t.back()) != std::string_view::npos) {
    const int64_t n = std::stoll(t.substr(0, t.size() - 1));
    const int64_t unit = t.back() == 's' ? 1 : t.back() == 'm' ? 60 : t.back() == 'h' ? 3600 : 86400;
    seconds = n * unit;  // at most 9 digits times 86400: no overflow
  } else {
    // Slurm: "D-" then HH[:MM[:SS]]; without a day, MM, MM:SS or HH:MM:SS.
    std::string rest = t;
    int64_t days = -1;
    if (size_t dash = t.find('-'); dash != std::string::npos) {
      if (!isDigits(std::string_view(t).substr(0, dash)) || dash > 4) return fail(forms);
      days = std::stoll(t.substr(0, dash));
      rest = t.substr(dash + 1);
    }
    std::vector<int64_t> parts;
    std::istringstream in(rest);
    std::string piece;
    while (std::getline(in, piece, ':')) {
      if (!isDigits(piece) || piece.size() > 6) return fail(forms);
      parts.push_back(std::stoll(piece));
    }
    if (parts.empty() || parts.size() > 3 || rest.back() == ':') return fail(forms);
    if (days >= 0) {  // D-HH, D-HH:MM, D-HH:MM:SS
      seconds = days * 86400 + parts[0] * 3600 + (parts.size() > 1 ? parts[1] * 60 : 0) +
                (parts.size() > 2 ? parts[2] : 0);
    } else if (parts.size() == 1) {  // MM
      seconds = parts[0] * 60;
    } else if (parts.size() == 2) {  // MM:SS
      seconds = parts[0] * 60 + parts[1];
    } else {  // HH:MM:SS
      seconds = parts[0] * 3600 + parts[1] * 60 + parts[2];
    }
  }
  if (seconds <= 0) return fail("is no time at all; give a limit of at least 1 second");
  if (seconds > kMaxS) return fail("is longer than 365 days");
  return {static_cast<int>(seconds), ""};
}

Parsed<int> checkArraySpec(std::string_view spec) {
  ArraySpec array;  // common/array_spec.h: the coordinator's own parser
  if (std::string why = parseArraySpec(spec, &array); !why.empty())
    return {std::nullopt, "--array '" + escapeForTerminal(spec) + "': " + why + " (" + kArrayForms + ")"};
  return {static_cast<int>(array.indices.size()), ""};
}

namespace {
// Variables --export ALL leaves out: ddlctl's credentials, and what the rank environment sets itself
// (common/rank_env.h), which a copy of the submitter's shell (say, inside another job) would clobber.
bool neverExported(std::string_view name) {
  return name == "DDL_TOKEN" || name == "DDL_TOKEN_FILE" || isRankVariable(name);
}
bool isCredential(std::string_view name) { return name == "DDL_TOKEN" || name == "DDL_TOKEN_FILE"; }
}  // namespace

bool isEnvName(std::string_view name) {
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
         std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}

Parsed<std::vector<std::string>> exportedEnv(std::string_view spec, const std::vector<std::string>& environ) {
  auto fail = [&](const std::string& why) {
    return Parsed<std::vector<std::string>>{std::nullopt,
                                            "--export '" + escapeForTerminal(spec) + "': " + why};
  };
  const std::string all = upper(trim(spec));
  if (all == "NONE" || all.empty()) return {std::vector<std::string>{}, ""};
  std::vector<std::string> out;
  std::istringstream in{std::string(spec)};
  std::string item;
  for (int items = 0; std::getline(in, item, ','); ++items) {
    item = trim(item);
    if (items >= 10000) return fail("too many items");
    if (item.empty()) continue;
    if (upper(item) == "ALL") {
      for (const std::string& e : environ) {
        auto kv = splitKeyValue(e);
        if (kv && isEnvName(kv->first) && !neverExported(kv->first)) out.push_back(e);
      }
      continue;
    }
    if (upper(item) == "NONE") return fail("NONE cannot be combined with other items");
    auto kv = splitKeyValue(item);
    const std::string name = kv ? kv->first : item;
    if (!isEnvName(name)) return fail("'" + escapeForTerminal(name) + "' is not a variable name");
    if (isCredential(name)) return fail(name + " is a credential and is never exported");
    if (kv) {
      out.push_back(item);
      continue;
    }
    auto found = std::find_if(environ.begin(), environ.end(),
                              [&](const std::string& e) { return e.rfind(name + "=", 0) == 0; });
    if (found == environ.end()) return fail(name + " is not set in your environment");
    out.push_back(*found);
  }
  // One entry per name, the last given winning ("ALL,PATH=/x" sends PATH=/x).
  std::vector<std::string> unique;
  std::map<std::string, size_t> at;
  for (const std::string& e : out) {
    const std::string name = e.substr(0, e.find('='));
    if (auto it = at.find(name); it != at.end()) {
      unique[it->second] = e;
    } else {
      at[name] = unique.size();
      unique.push_back(e);
    }
  }
  return {unique, ""};
}

Parsed<std::vector<Directive>> parseScriptDirectives(std::string_view script) {
  std::vector<Directive> out;
  size_t pos = script.find('\n');  // the first line is the #! line
  for (int line = 2; pos != std::string_view::npos && line <= 100000; ++line) {
    const size_t start = pos + 1;
    pos = script.find('\n', start);
    const std::string text =
        trim(script.substr(start, pos == std::string_view::npos ? std::string_view::npos : pos - start));
    if (text.empty()) continue;
    if (text[0] != '#') break;  // the first command: directives end
    if (text.rfind("#DDL", 0) != 0 || (text.size() > 4 && text[4] != ' ' && text[4] != '\t')) continue;
    Directive d{line, {}};
    std::string word;
    bool inWord = false;
    char quote = 0;
    for (size_t i = 4; i < text.size(); ++i) {
      const char c = text[i];
      if (quote == '\'') {
        if (c == '\'')
          quote = 0;
        else
          word += c;
      } else if (quote == '"') {
        if (c == '"')
          quote = 0;
        else if (c == '\\' && i + 1 < text.size() &&
                 std::string_view("\\\"$`").find(text[i + 1]) != std::string_view::npos)
          word += text[++i];
        else
          word += c;
      } else if (c == '\'' || c == '"') {
        quote = c;
        inWord = true;
      } else if (c == '\\' && i + 1 < text.size()) {
        word += text[++i];
        inWord = true;
      } else if (c == ' ' || c == '\t') {
        if (inWord) d.args.push_back(word);
        word.clear();
        inWord = false;
      } else if (c == '#' && !inWord) {
        break;  // a comment after the directive
      } else {
        word += c;
        inWord = true;
      }
    }
    if (quote != 0) {
      return {std::nullopt,
              "line " + std::to_string(line) + ": unterminated " + std::string(1, quote) + " quote"};
    }
    if (inWord) d.args.push_back(word);
    if (!d.args.empty()) out.push_back(std::move(d));
  }
  return {out, ""};
}

std::string checkSubmitValues(const SubmitArgs& args) {
  for (auto [flag, value] : {std::pair{"--nodes", args.nodes}, std::pair{"--gpus-per-node", args.gpusPerNode},
                             std::pair{"--gpus", args.gpus}}) {
    if (value && *value < 1) return std::string(flag) + " must be at least 1, got " + std::to_string(*value);
  }
  if (args.maxRestarts < 0)
    return "--max-restarts must be 0 or more, got " + std::to_string(args.maxRestarts);
  if (args.cpusPerRank && (*args.cpusPerRank < 1 || *args.cpusPerRank > 4096))
    return "--cpus-per-rank must be 1 to 4096, got " + std::to_string(*args.cpusPerRank);
  if (!args.memPerRank.empty()) {
    int64_t bytes = 0;
    if (std::string why = parseByteSize(args.memPerRank, &bytes); !why.empty())
      return "--mem-per-rank '" + args.memPerRank + "': " + why;
  }
  if (!args.topology.empty()) {
    std::vector<int> dims;
    if (std::string why = parseTopologyDims(args.topology, &dims); !why.empty()) {
      return "--topology '" + args.topology + "': " + why +
             " (expected positive numbers joined by x, like 4x2)";
    }
    // The ranks are the job's GPUs: --gpus, or --nodes x --gpus-per-node (default 1).
    const long long ranks = topologyRanks(dims);
    const long long gpus = args.gpus    ? *args.gpus
                           : args.nodes ? static_cast<long long>(*args.nodes) * args.gpusPerNode.value_or(1)
                                        : ranks;
    if (ranks != gpus) {
      return "--topology " + args.topology + " has " + std::to_string(ranks) + " ranks but the job has " +
             std::to_string(gpus) + " GPUs; the dims must multiply to the GPU count";
    }
  }
  if (Parsed<std::vector<std::string>> exported = exportedEnv(args.exportSpec, args.environ);
      !exported.ok()) {
    return exported.error;
  }
  for (const std::string& e : args.env) {
    if (!splitKeyValue(e)) return "--env '" + e + "' is not KEY=VALUE";
  }
  for (const std::string& l : args.labels) {
    if (!splitKeyValue(l)) return "--label '" + l + "' is not KEY=VALUE";
  }
  if (!args.timeLimit.empty()) {
    if (Parsed<int> limit = parseTimeLimit(args.timeLimit); !limit.ok()) return limit.error;
  }
  if (!args.warnSignal.empty()) {
    if (auto warn = parseWarnSignal(args.warnSignal); !warn.ok()) return warn.error;
  }
  for (auto [flag, given] :
       {std::pair{"--after-ok", &args.afterOk}, std::pair{"--after-any", &args.afterAny}}) {
    size_t ids = 0;
    for (const std::string& arg : *given) {
      std::istringstream in(arg);
      std::string piece;
      while (std::getline(in, piece, ',')) ids += trim(piece).empty() ? 0 : 1;
    }
    if (!given->empty() && ids == 0) return std::string(flag) + " needs a job id";
    if (ids > 1000) return std::string(flag) + ": more than 1000 jobs";
  }
  return "";
}

Parsed<std::pair<int, int>> parseWarnSignal(std::string_view text) {
  auto fail = [text](const std::string& why) {
    return Parsed<std::pair<int, int>>{std::nullopt, "--signal '" + std::string(text) + "': " + why};
  };
  const size_t at = text.find('@');
  const std::optional<int> signal = signalNumber(text.substr(0, at));
  if (!signal) return fail("give a signal name (USR1, SIGUSR1, TERM) or a number 1..64, then @SECONDS");
  int before = 60;
  if (at != std::string_view::npos) {
    const std::string_view seconds = text.substr(at + 1);
    if (seconds.empty() || seconds.size() > 5 ||
        seconds.find_first_not_of("0123456789") != std::string_view::npos ||
        std::stoi(std::string(seconds)) < 1 || std::stoi(std::string(seconds)) > 65535) {
      return fail("the seconds after @ are a whole number from 1 to 65535");
    }
    before = std::stoi(std::string(seconds));
  }
  return {std::pair{*signal, before}, ""};
}

Parsed<v1::JobSpec> buildJobSpec(const SubmitArgs& args) {
  auto fail = [](std::string why) { return Parsed<v1::JobSpec>{std::nullopt, std::move(why)}; };
  if (args.command.empty()) {
    return fail("submit needs a command after --, as in: ddlctl submit --gpus 4 -- python train.py");
  }
  if (std::string why = checkSubmitValues(args); !why.empty()) return fail(why);
  if (args.gpus && (args.nodes || args.gpusPerNode)) {
    return fail(
        "--gpus asks for a total and cannot be combined with --nodes or --gpus-per-node; give either "
        "--gpus T or --nodes N [--gpus-per-node G]");
  }
  if (!args.gpus && !args.nodes) {
    if (args.gpusPerNode) return fail("--gpus-per-node needs --nodes N (or ask for a total with --gpus T)");
    return fail("say how many GPUs the job needs: --gpus T, or --nodes N [--gpus-per-node G]");
  }

  // Every value was checked above; what follows builds the spec.
  v1::JobSpec spec;
  std::vector<std::string> explicitNames;
  for (const std::string& e : args.env) explicitNames.push_back(splitKeyValue(e)->first);
  const Parsed<std::vector<std::string>> exported = exportedEnv(args.exportSpec, args.environ);
  for (const std::string& e : *exported.value) {  // --env wins over an exported value
    const std::string name = e.substr(0, e.find('='));
    if (std::find(explicitNames.begin(), explicitNames.end(), name) == explicitNames.end()) spec.add_env(e);
  }
  for (const std::string& e : args.env) spec.add_env(e);
  if (!args.timeLimit.empty()) spec.set_time_limit_s(*parseTimeLimit(args.timeLimit).value);
  if (!args.warnSignal.empty()) {
    const auto [signal, before] = *parseWarnSignal(args.warnSignal).value;
    if (spec.time_limit_s() == 0) {
      return fail("--signal " + args.warnSignal + " is sent before the time limit: give --time too");
    }
    if (before >= spec.time_limit_s()) {
      return fail("--signal " + args.warnSignal + " would come " + std::to_string(before) +
                  " s before a time limit of " + std::to_string(spec.time_limit_s()) +
                  " s, before the job starts; give fewer seconds or a longer --time");
    }
    spec.set_warn_signal(signal);
    spec.set_warn_before_s(before);
  }
  if (args.cpusPerRank) spec.set_cpus_per_rank(*args.cpusPerRank);
  if (!args.memPerRank.empty()) {
    int64_t bytes = 0;
    parseByteSize(args.memPerRank, &bytes);
    spec.set_memory_per_rank_bytes(bytes);
  }
  for (auto [given, field] : {std::pair{&args.afterOk, spec.mutable_after_ok()},
                              std::pair{&args.afterAny, spec.mutable_after_any()}}) {
    for (const std::string& arg : *given) {
      std::istringstream in(arg);
      std::string piece;
      while (std::getline(in, piece, ',')) {
        piece = trim(piece);
        if (!piece.empty()) *field->Add() = normalizeJobId(piece);
      }
    }
  }
  spec.set_hold(args.hold);
  for (const std::string& l : args.labels) {
    auto kv = splitKeyValue(l);
    auto [it, inserted] = spec.mutable_required_labels()->insert({kv->first, kv->second});
    if (!inserted && it->second != kv->second) return fail("--label " + kv->first + " given twice");
  }
  spec.set_name(args.name.empty() ? std::filesystem::path(args.command.front()).filename().string()
                                  : args.name);
  spec.set_user(args.user);
  if (args.gpus) {
    spec.set_total_gpus(*args.gpus);
    spec.set_min_gpus(args.minGpus.value_or(0));
  } else {
    spec.set_nodes(*args.nodes);
    spec.set_gpus_per_node(args.gpusPerNode.value_or(1));
    spec.set_min_nodes(args.minNodes.value_or(0));
  }
  spec.set_topology(args.topology);
  spec.set_priority(args.priority);
  spec.set_account(args.account);
  spec.set_qos(args.qos);
  spec.set_max_restarts(args.maxRestarts);
  std::filesystem::path workdir =
      args.workdir.empty() ? std::filesystem::path(args.cwd) : std::filesystem::path(args.workdir);
  if (workdir.is_relative() && !args.cwd.empty()) workdir = std::filesystem::path(args.cwd) / workdir;
  spec.set_workdir(workdir.empty() ? "" : workdir.lexically_normal().string());
  for (const std::string& c : args.command) spec.add_command(c);
  return {spec, ""};
}

Parsed<int64_t> parseTimeBound(std::string_view text, int64_t nowMs) {
  auto fail = [&] {
    return Parsed<int64_t>{std::nullopt,
                           "'" + escapeForTerminal(text) +
                               "' is not a time: give a date (2026-11-24), a local time "
                               "(2026-11-24T10:00 or 2026-11-24T10:00:05), a time today (06:55 or "
                               "06:55:30) or an age (90s, 30m, 1h, 2d, 1w)"};
  };
  const std::string t = trim(text);
  // An age: digits and one unit.
  if (t.size() >= 2 && t.size() <= 10 && isDigits(std::string_view(t).substr(0, t.size() - 1))) {
    static const std::map<char, int64_t> kUnitMs = {
        {'s', 1000}, {'m', 60'000}, {'h', 3'600'000}, {'d', 86'400'000}, {'w', 7 * 86'400'000LL}};
    auto unit = kUnitMs.find(t.back());
    if (unit == kUnitMs.end()) return fail();
    const int64_t n = std::stoll(t.substr(0, t.size() - 1));  // at most 9 digits: no overflow below
    const int64_t at = nowMs - n * unit->second;
    if (at <= 0) return {std::nullopt, "'" + t + "' ago is before 1970"};
    return {at, ""};
  }
  // A time of day, as Slurm takes it: HH:MM or HH:MM:SS today (local time).
  if (t.find('-') == std::string::npos && t.find(':') != std::string::npos) {
    std::vector<std::string> parts;
    std::istringstream in(t);
    std::string piece;
    while (parts.size() < 4 && std::getline(in, piece, ':')) parts.push_back(piece);
    if (parts.size() < 2 || parts.size() > 3 || t.back() == ':' || !isDigits(parts[0]) || parts[0].size() > 2)
      return fail();
    for (size_t i = 1; i < parts.size(); ++i) {
      if (!isDigits(parts[i]) || parts[i].size() != 2) return fail();
    }
    const int h = std::stoi(parts[0]), m = std::stoi(parts[1]),
              sec = parts.size() > 2 ? std::stoi(parts[2]) : 0;
    if (h > 23 || m > 59 || sec > 59) return fail();
    const std::time_t now = static_cast<std::time_t>(nowMs / 1000);
    std::tm tm{};
    localtime_r(&now, &tm);
    tm.tm_hour = h;
    tm.tm_min = m;
    tm.tm_sec = sec;
    tm.tm_isdst = -1;
    const std::time_t at = std::mktime(&tm);
    if (at == static_cast<std::time_t>(-1)) return fail();
    return {static_cast<int64_t>(at) * 1000, ""};
  }
  // A local date and time.
  int year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0, used = 0;
  const char* c = t.c_str();
  if (std::sscanf(c, "%4d-%2d-%2d%n", &year, &month, &day, &used) != 3 || used != 10) return fail();
  if (t.size() > 10) {
    if (t[10] != 'T' && t[10] != ' ') return fail();
    int more = 0;
    if (std::sscanf(c + 11, "%2d:%2d%n", &hour, &minute, &more) != 2 || more != 5) return fail();
    if (t.size() > 16) {
      int secs = 0;
      if (std::sscanf(c + 16, ":%2d%n", &second, &secs) != 1 || secs != 3) return fail();
      if (t.size() != 19) return fail();
    } else if (t.size() != 16) {
      return fail();
    }
  }
  if (year < 1970 || month < 1 || month > 12 || day < 1 || day > 31 || hour > 23 || minute > 59 ||
      second > 59)
    return fail();
  std::tm tm{};
  tm.tm_year = year - 1900;
  tm.tm_mon = month - 1;
  tm.tm_mday = day;
  tm.tm_hour = hour;
  tm.tm_min = minute;
  tm.tm_sec = second;
  tm.tm_isdst = -1;
  const std::time_t at = std::mktime(&tm);
  if (at == static_cast<std::time_t>(-1) || tm.tm_mday != day) return fail();  // 2026-02-30 rolls over
  return {static_cast<int64_t>(at) * 1000, ""};
}

}  // namespace ddl::cli
