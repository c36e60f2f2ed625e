// ddlctl: argument parsing (CLI11), one UserService RPC per verb (per page for list), and the text and JSON
// renderings. See ddlctl.h for the contract. Order of work in runDdlctl(): split off the job command at "--",
// parse, check everything that can be checked locally (exit 2), then make the RPC (list: one per page), each
// with its own deadline.
#include "ddlctl.h"

#include <grpcpp/grpcpp.h>
#include <pwd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <tuple>

#include "common/array_spec.h"
#include "common/clock.h"
#include "common/host_port.h"
#include "common/job_id.h"
#include "common/pki.h"
#include "common/resources.h"
#include "common/topology_dims.h"
#include "common/version.h"
#include "ddl/messages.h"
#include "ddl/tls.h"
#include "ddl/v1/ddl.grpc.pb.h"

namespace ddl::cli {
namespace {

bool isDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::string upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string_view::npos ? "" : std::string(s.substr(b, e - b + 1));
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

// "10" rather than "10.000000": the timeout is echoed back to the user in messages.
std::string formatSeconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::string stateName(v1::JobState s) { return v1::JobState_Name(s); }


int requestedGpus(const v1::JobSpec& spec) {
  return spec.nodes() > 0 || spec.gpus_per_node() > 0 ? spec.nodes() * spec.gpus_per_node()
                                                      : spec.total_gpus();
}

// Proto maps iterate in no fixed order; people and tests want the same text every time.
std::string formatLabels(const google::protobuf::Map<std::string, std::string>& labels) {
  std::map<std::string, std::string> sorted(labels.begin(), labels.end());
  std::vector<std::string> parts;
  for (const auto& [k, v] : sorted) parts.push_back(k + "=" + v);
  return join(parts, ",");
}

std::string formatAllocation(const v1::Job& job) {
  std::vector<std::string> parts;
  for (const v1::NodeAllocation& a : job.allocation()) {
    std::vector<std::string> gpus;
    for (int g : a.gpus()) gpus.push_back(std::to_string(g));
    parts.push_back(a.node() + "[" + join(gpus, ",") + "]");
  }
  return join(parts, " ");
}

// Characters, not bytes, so that UTF-8 names pad like ASCII ones (wide CJK glyphs still count as one).
size_t displayWidth(std::string_view s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xc0) != 0x80; }));
}

// Columns padded to their widest cell, two spaces apart; the last column is not padded (it may be long).
// Every cell is escaped for the terminal (idempotent: escaped text has no control characters left). `width`
// carries the column widths from one call to the next (JobTableWriter); they only grow.
std::string renderTable(std::vector<std::vector<std::string>> rows, std::vector<size_t>& width) {
  for (auto& row : rows) {
    for (std::string& cell : row) cell = escapeForTerminal(cell);
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], displayWidth(row[i]));
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - displayWidth(row[i]) + 2, ' ');
    }
    line.erase(line.find_last_not_of(' ') + 1);  // an empty last cell leaves no trailing blanks
    out += line + "\n";
  }
  return out;
}

std::string renderTable(std::vector<std::vector<std::string>> rows) {
  std::vector<size_t> width;
  return renderTable(std::move(rows), width);
}

// A table cell from the server: escaped, then cut to `maxChars`.
std::string cell(std::string_view text, size_t maxChars) {
  return truncateCell(escapeForTerminal(text), maxChars);
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

// Splits "KEY=VALUE"; nullopt when there is no '=' or the key is empty.
std::optional<std::pair<std::string, std::string>> splitKeyValue(const std::string& s) {
  size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0) return std::nullopt;
  return std::make_pair(s.substr(0, eq), s.substr(eq + 1));
}

}  // namespace

// ---- Argument checks --------------------------------------------------------------------------------------

std::string checkCoordinatorAddress(std::string_view address) {
  auto bad = [&](const std::string& why) {
    return "invalid coordinator address '" + std::string(address) + "': " + why +
           " (expected HOST:PORT, e.g. 127.0.0.1:7070)";
  };
  StatusOr<HostPort> parsed = parseHostPort(address, 1);
  if (!parsed) return bad(parsed.status().message());
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
      case v1::SUCCEEDED: return 0;
      case v1::CANCELLED: return 1;
      case v1::TIMEOUT: return 2;
      case v1::FAILED: return 3;
      default: return 4;
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
  static const char* const kNames[] = {"DDL_TOKEN", "DDL_TOKEN_FILE", "CUDA_VISIBLE_DEVICES", "RANK",
                                       "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                       "MASTER_PORT"};
  if (name.substr(0, 4) == "DDL_") return true;
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}
bool isCredential(std::string_view name) { return name == "DDL_TOKEN" || name == "DDL_TOKEN_FILE"; }
bool isEnvName(std::string_view name) {
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
         std::all_of(name.begin(), name.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
}
}  // namespace

Parsed<std::vector<std::string>> exportedEnv(std::string_view spec, const std::vector<std::string>& environ) {
  auto fail = [&](const std::string& why) {
    return Parsed<std::vector<std::string>>{std::nullopt, "--export '" + escapeForTerminal(spec) + "': " + why};
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
    const std::string text = trim(script.substr(start, pos == std::string_view::npos ? std::string_view::npos
                                                                                      : pos - start));
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
        if (c == '\'') quote = 0; else word += c;
      } else if (quote == '"') {
        if (c == '"') quote = 0;
        else if (c == '\\' && i + 1 < text.size() && std::string_view("\\\"$`").find(text[i + 1]) != std::string_view::npos) word += text[++i];
        else word += c;
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
      return {std::nullopt, "line " + std::to_string(line) + ": unterminated " + std::string(1, quote) + " quote"};
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
  } else {
    spec.set_nodes(*args.nodes);
    spec.set_gpus_per_node(args.gpusPerNode.value_or(1));
  }
  spec.set_topology(args.topology);
  spec.set_priority(args.priority);
  spec.set_max_restarts(args.maxRestarts);
  std::filesystem::path workdir = args.workdir.empty() ? std::filesystem::path(args.cwd)
                                                         : std::filesystem::path(args.workdir);
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

// ---- RPC failures -----------------------------------------------------------------------------------------

namespace {

// A TLS handshake that failed: it fails the same way on every try.
bool isTlsFailure(const std::string& message) {
  const std::string m = upper(message);
  return m.find("HANDSHAKE") != std::string::npos || m.find("SSL") != std::string::npos ||
         m.find("CERTIFICATE") != std::string::npos;
}

// A failure that a restarting coordinator gives, which the verbs that wait ride out.
bool outage(const grpc::Status& status) {
  return (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
          status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) &&
         !isTlsFailure(status.error_message());
}

}  // namespace

bool isTransportFailure(const std::string& message) {
  const std::string m = upper(message);
  for (const char* sign :
       {"FAILED TO CONNECT", "CONNECTION REFUSED", "SOCKET CLOSED", "CONNECTION RESET", "DNS RESOLUTION",
        "BROKEN PIPE", "TRANSPORT", "CONNECTIONS TO ALL BACKENDS", "GOAWAY", "ENDPOINT", "HANDSHAKE", "SSL",
        "CERTIFICATE", "CONNECTION CLOSED", "EOF", "SHUTTING DOWN", "GOING DOWN"}) {
    if (m.find(sign) != std::string::npos) return true;
  }
  return m.empty() || m == "UNAVAILABLE";
}

RpcError describeRpcError(grpc::StatusCode code, const std::string& message, const std::string& address,
                          double timeoutS, bool insecure) {
  if (code == grpc::StatusCode::UNAVAILABLE && !isTransportFailure(message)) {
    // The coordinator answered: it is running, but could not do it (its disk is full, its store failed).
    return {kExitUnreachable, "the coordinator at " + address + " is running but could not do it: " + message,
            "see its log (journalctl -u ddl-coordinator): a full disk or an unwritable data dir stops every "
            "change"};
  }
  if (code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED) {
    std::string why;
    if (code == grpc::StatusCode::DEADLINE_EXCEEDED) {
      why = "no answer within " + formatSeconds(timeoutS) + " s";
    } else if (upper(message).find("CONNECTION REFUSED") != std::string::npos) {
      why = "connection refused";  // gRPC's text buries this under "failed to connect to all addresses; ..."
    } else {
      why = message.empty() ? "unavailable" : message;
    }
    const std::string lower = upper(message);
    if (isTlsFailure(message)) {
      return {kExitUnreachable, "cannot reach coordinator at " + address + ": the TLS handshake failed (" + why + ")",
              "give the cluster's CA with --ca or DDL_CA; a coordinator run with --insecure needs --insecure here"};
    }
    if (insecure &&
        (lower.find("SOCKET CLOSED") != std::string::npos ||
         lower.find("CONNECTION RESET") != std::string::npos ||
         lower.find("CONNECTION CLOSED") != std::string::npos || lower.find("EOF") != std::string::npos)) {
      return {
          kExitUnreachable, "cannot reach coordinator at " + address + ": it closed the plaintext connection",
          "a coordinator that uses TLS (every one not started with --insecure) closes plaintext connections: "
          "drop --insecure and give its CA with --ca or DDL_CA"};
    }
    return {kExitUnreachable, "cannot reach coordinator at " + address + ": " + why,
            "is ddl-coordinator running? set --coordinator or DDL_COORDINATOR"};
  }
  if (code == grpc::StatusCode::UNAUTHENTICATED) {
    return {kExitUnauthenticated, message.empty() ? "not authenticated" : message, ""};
  }
  if (code == grpc::StatusCode::PERMISSION_DENIED) {
    return {kExitDenied, message.empty() ? "permission denied" : message, ""};
  }
  if (!message.empty()) return {kExitRefused, message, ""};
  return {kExitRefused, "the coordinator refused the request (gRPC status " + std::to_string(int(code)) + ")",
          ""};
}

std::string checkCa(const std::string& path) {
  std::string error;
  const auto pem = pki::readFile(path, &error);
  if (!pem) return "cannot read the CA certificate: " + error;
  const auto info = pki::inspectCertificate(*pem, &error);
  if (!info) return path + " is not a CA certificate (PEM): " + error;
  const int64_t now = static_cast<int64_t>(std::time(nullptr));
  if (now > info->not_after_s) {
    return "the CA certificate " + path + " expired on " +
           formatLocalTime(info->not_after_s * 1000).substr(0, 10);
  }
  if (now < info->not_before_s) {
    return "the CA certificate " + path + " is not valid before " +
           formatLocalTime(info->not_before_s * 1000).substr(0, 10) + " (is this machine's clock right?)";
  }
  return "";
}

std::string findCredentials(const std::string& ca_flag, const std::string& token_file_flag, Credentials* out) {
  auto env = [](const char* name) {
    const char* v = std::getenv(name);
    return std::string(v ? v : "");
  };
  const char* home_env = std::getenv("HOME");
  const std::string home = home_env && *home_env ? std::string(home_env) + "/.config/ddl/" : "";
  std::error_code ec;
  out->ca = !ca_flag.empty()       ? ca_flag
            : !env("DDL_CA").empty() ? env("DDL_CA")
            : !home.empty() && std::filesystem::exists(home + "ca.crt", ec) ? home + "ca.crt"
                                                                           : "/etc/ddl/pki/ca.crt";
  // An explicit --token-file wins, then $DDL_TOKEN, then $DDL_TOKEN_FILE, then the default file.
  std::string file = token_file_flag;
  if (file.empty()) {
    out->token = env("DDL_TOKEN");
    if (!out->token.empty()) return "";
    file = env("DDL_TOKEN_FILE");
  }
  const bool given = !file.empty();
  if (!given) file = home.empty() ? "" : home + "token";
  if (file.empty()) return "";
  std::ifstream in(file);
  if (!in) {
    // No default file: call without a token. A file the user named must be there and readable.
    return given ? "cannot read the token file " + file + ": " + std::strerror(errno) : "";
  }
  std::getline(in, out->token);
  while (!out->token.empty() && std::isspace(static_cast<unsigned char>(out->token.back()))) out->token.pop_back();
  if (out->token.empty()) return "the token file " + file + " is empty";
  return "";
}

// ---- Formatting -------------------------------------------------------------------------------------------

std::string escapeForTerminal(std::string_view text) {
  auto hex = [](const char* format, unsigned value) {
    char buf[16];
    std::snprintf(buf, sizeof(buf), format, value);
    return std::string(buf);
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c == '\n')
        out += "\\n";
      else if (c == '\t')
        out += "\\t";
      else if (c == '\r')
        out += "\\r";
      else if (c < 0x20 || c == 0x7f)
        out += hex("\\x%02x", c);
      else
        out += static_cast<char>(c);
      ++i;
      continue;
    }
    // One UTF-8 sequence, checked as RFC 3629 does: no overlong forms, no surrogates, nothing past U+10FFFF.
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool valid = len > 0 && i + len <= text.size();
    for (size_t k = 1; valid && k < len; ++k)
      valid = (static_cast<unsigned char>(text[i + k]) & 0xc0) == 0x80;
    if (valid && len > 2) {
      const auto second = static_cast<unsigned char>(text[i + 1]);
      if ((c == 0xe0 && second < 0xa0) || (c == 0xed && second > 0x9f) || (c == 0xf0 && second < 0x90) ||
          (c == 0xf4 && second > 0x8f)) {
        valid = false;
      }
    }
    if (!valid) {
      out += hex("\\x%02x", c);
      ++i;
      continue;
    }
    unsigned cp = c & (0xff >> (len + 1));
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    // C1 controls, and the line separators and bidirectional overrides that reorder or break what follows.
    if ((cp >= 0x80 && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 || (cp >= 0x202a && cp <= 0x202e) ||
        (cp >= 0x2066 && cp <= 0x2069)) {
      out += hex("\\u%04x", cp);
    } else {
      out.append(text.substr(i, len));
    }
    i += len;
  }
  return out;
}

std::string truncateCell(std::string_view text, size_t maxChars) {
  if (maxChars == 0) return "";
  size_t chars = 0;
  size_t cut = text.size();  // byte offset where character number maxChars (0-based maxChars-1) starts
  for (size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xc0) == 0x80) continue;
    if (chars == maxChars - 1) cut = i;
    if (++chars > maxChars) return std::string(text.substr(0, cut)) + "\u2026";
  }
  return std::string(text);
}

std::string formatAge(int64_t ms) {
  int64_t s = std::max<int64_t>(ms, 0) / 1000;
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "m";
  if (s < 86400) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

std::string formatDuration(int64_t ms) {
  ms = std::max<int64_t>(ms, 0);
  char buf[32];
  if (ms < 1000) {
    std::snprintf(buf, sizeof buf, "%lldms", static_cast<long long>(ms));
  } else if (ms < 60'000) {
    std::snprintf(buf, sizeof buf, "%lld.%llds", static_cast<long long>(ms / 1000),
                  static_cast<long long>(ms % 1000 / 100));
  } else {
    long long s = ms / 1000;
    if (s < 3600) {
      std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
    } else if (s < 86400) {
      std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, s % 3600 / 60);
    } else {
      std::snprintf(buf, sizeof buf, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
    }
  }
  return buf;
}

std::string formatLocalTime(int64_t unixMs) {
  std::time_t t = static_cast<std::time_t>(unixMs / 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  std::snprintf(buf + n, sizeof buf - n, ".%03lld", static_cast<long long>(unixMs % 1000));
  return buf;
}

std::string describeFailure(const v1::Failure& f) {
  std::string out = "rank " + std::to_string(f.rank());
  if (!f.host().empty()) out += " on " + f.host();
  if (f.has_signal()) {
    out += ": killed by " + signalName(f.signal());
  } else if (f.has_exit_code()) {
    out += ": exit code " + std::to_string(f.exit_code());
  }
  return out;
}

std::string describeRequest(const v1::JobSpec& spec) {
  auto count = [](int n, const char* one) { return std::to_string(n) + " " + one + (n == 1 ? "" : "s"); };
  if (spec.nodes() > 0 || spec.gpus_per_node() > 0) {
    return count(spec.nodes(), "node") + " x " + count(spec.gpus_per_node(), "GPU");
  }
  return count(spec.total_gpus(), "GPU");
}

std::string shellJoin(const std::vector<std::string>& argv) {
  static const std::string kSafe = "@%+=:,./-_";
  std::vector<std::string> words;
  for (const std::string& a : argv) {
    bool safe = !a.empty() && std::all_of(a.begin(), a.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || kSafe.find(c) != std::string::npos;
    });
    if (safe) {
      words.push_back(a);
      continue;
    }
    std::string q = "'";
    for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
    words.push_back(q + "'");
  }
  return join(words, " ");
}

std::string nodeListOrReason(const v1::Job& job) {
  std::vector<std::string> nodes;
  for (const v1::NodeAllocation& a : job.allocation()) nodes.push_back(a.node());
  bool showReason = job.state() == v1::PENDING || (job.state() == v1::FAILED && !job.reason().empty()) ||
                    (nodes.empty() && !job.reason().empty());
  if (showReason) return "(" + (job.reason().empty() ? std::string("queued") : job.reason()) + ")";
  return join(nodes, ",");
}

namespace {
// TIME: how long the latest attempt has run since it was launched (Job.start_ms: its move to STARTING), until
// the end for a finished job; "-" if it never started.
std::string runTime(const v1::Job& job, int64_t nowMs) {
  if (job.start_ms() <= 0) return "-";
  return formatDuration((job.end_ms() > 0 ? job.end_ms() : nowMs) - job.start_ms());
}
// START: when the latest attempt was launched, local time to the second ("2026-11-24T10:00:05"); "-".
std::string startTime(const v1::Job& job) {
  if (job.start_ms() <= 0) return "-";
  std::string t = formatLocalTime(job.start_ms()).substr(0, 19);
  t[10] = 'T';
  return t;
}

std::vector<std::vector<std::string>> jobRows(const v1::ListJobsResponse& jobs, int64_t nowMs, bool header) {
  std::vector<std::vector<std::string>> rows;
  if (header) {
    rows.push_back({"ID", "NAME", "USER", "STATE", "AGE", "TIME", "START", "NODES", "GPUS", "NODELIST(REASON)"});
  }
  for (const v1::Job& j : jobs.jobs()) {
    std::string nodes = j.allocation_size() > 0 ? std::to_string(j.allocation_size())
                        : j.spec().nodes() > 0  ? std::to_string(j.spec().nodes())
                                                : "-";
    int gpus = j.gpus() > 0 ? j.gpus() : requestedGpus(j.spec());
    rows.push_back({cell(j.id(), kMaxNameColumn), cell(j.spec().name(), kMaxNameColumn),
                    cell(j.spec().user(), kMaxNameColumn), stateName(j.state()),
                    formatAge(nowMs - j.submit_ms()), runTime(j, nowMs), startTime(j), nodes,
                    gpus > 0 ? std::to_string(gpus) : "-",
                    cell(nodeListOrReason(j), kMaxWideColumn)});
  }
  return rows;
}
}  // namespace

std::string formatJobTable(const v1::ListJobsResponse& jobs, int64_t nowMs) {
  return renderTable(jobRows(jobs, nowMs, true));
}

std::string JobTableWriter::page(const v1::ListJobsResponse& jobs, int64_t nowMs) {
  std::string out = renderTable(jobRows(jobs, nowMs, !headerDone_), width_);
  headerDone_ = true;
  return out;
}

namespace {
// "UP", "DRAINING", "DOWN", or "DOWN (drained)": a DOWN node the operator drained comes back DRAINING.
std::string nodeState(const v1::Node& n) {
  return n.drained() && n.state() == "DOWN" ? n.state() + " (drained)" : n.state();
}
}  // namespace

std::string formatNodeTable(const v1::ListNodesResponse& nodes, int64_t nowMs) {
  // REASON (the operator's words with a drain) only when some node has one.
  const bool reasons = std::any_of(nodes.nodes().begin(), nodes.nodes().end(),
                                   [](const v1::Node& n) { return !n.drain_reason().empty(); });
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "GPUS", "CPUS", "MEMORY", "ADDRESS", "LABELS", "HEARTBEAT", "JOBS"}};
  if (reasons) rows[0].push_back("REASON");
  for (const v1::Node& n : nodes.nodes()) {
    std::string labels = formatLabels(n.labels());
    std::vector<std::string> jobs(n.jobs().begin(), n.jobs().end());
    rows.push_back(
        {cell(n.name(), kMaxNameColumn), cell(nodeState(n), kMaxNameColumn),
         std::to_string(n.gpus_used_size()) + "/" + std::to_string(n.gpus_size()),
         n.cpus_size() ? std::to_string(n.cpus_used_size()) + "/" + std::to_string(n.cpus_size()) : "-",
         n.memory_bytes() > 0 ? formatBytes(n.memory_used_bytes()) + "/" + formatBytes(n.memory_bytes())
                              : "-",
         n.address().empty() ? "-" : cell(n.address(), kMaxNameColumn + 24),
         labels.empty() ? "-" : cell(labels, kMaxWideColumn),
         n.last_heartbeat_ms() > 0 ? formatAge(nowMs - n.last_heartbeat_ms()) : "never",
         jobs.empty() ? "-" : cell(join(jobs, ","), kMaxWideColumn)});
    if (reasons) rows.back().push_back(n.drain_reason().empty() ? "-" : cell(n.drain_reason(), kMaxWideColumn));
  }
  // Under the table, once per distinct text: what is wrong on a node now (a full log disk), and where ranks
  // that ask for CPUs or memory are not held to them by cgroups.
  std::vector<std::pair<std::string, std::vector<std::string>>> warnings, unconfined;
  auto note = [](auto& list, const std::string& text, const std::string& name) {
    auto it = std::find_if(list.begin(), list.end(), [&](const auto& u) { return u.first == text; });
    if (it == list.end()) it = list.insert(list.end(), {text, {}});
    it->second.push_back(name);
  };
  for (const v1::Node& n : nodes.nodes()) {
    if (!n.warning().empty()) note(warnings, n.warning(), n.name());
    if (!n.confinement().empty() && n.confinement().rfind("cgroups v2", 0) != 0)
      note(unconfined, n.confinement(), n.name());
  }
  std::string out = renderTable(rows);
  for (const auto& [why, names] : warnings)
    out += "warning: " + escapeForTerminal(join(names, ", ")) + ": " + escapeForTerminal(why) + "\n";
  for (const auto& [why, names] : unconfined)
    out += "note: " + escapeForTerminal(join(names, ", ")) + ": " + escapeForTerminal(why) + "\n";
  return out;
}

std::string formatJobDetail(const v1::Job& job, int64_t nowMs) {
  const v1::JobSpec& spec = job.spec();
  std::vector<std::vector<std::string>> rows;
  auto add = [&](const std::string& key, const std::string& value) { rows.push_back({key + ":", value}); };
  add("Job", job.id());
  add("Name", spec.name());
  add("User", spec.user());
  add("State", stateName(job.state()));
  add("Command", shellJoin({spec.command().begin(), spec.command().end()}));
  add("Workdir", spec.workdir());
  std::string request = describeRequest(spec);
  if (spec.total_gpus() == 0) request += " (" + std::to_string(requestedGpus(spec)) + " GPUs)";
  if (spec.cpus_per_rank() > 0 || spec.memory_per_rank_bytes() > 0) {
    std::string each;
    if (spec.cpus_per_rank() > 0)
      each = std::to_string(spec.cpus_per_rank()) + (spec.cpus_per_rank() == 1 ? " CPU" : " CPUs");
    if (spec.memory_per_rank_bytes() > 0)
      each += (each.empty() ? "" : " and ") + formatBytes(spec.memory_per_rank_bytes());
    request += ", " + each + " per rank";
  }
  add("Request", request);
  if (!spec.required_labels().empty()) add("Labels", formatLabels(spec.required_labels()));
  if (!spec.env().empty()) add("Env", shellJoin({spec.env().begin(), spec.env().end()}));
  add("Priority", std::to_string(spec.priority()));
  if (job.held()) {
    add("Held", job.held_by_admin() ? "yes, by an admin (an admin releases it: ddlctl release " + job.id() + ")"
                                    : "yes (ddlctl release " + job.id() + ")");
  }
  if (spec.time_limit_s() > 0) add("Time limit", formatDuration(int64_t{spec.time_limit_s()} * 1000));
  if (!spec.after_ok().empty()) add("After OK", join({spec.after_ok().begin(), spec.after_ok().end()}, ","));
  if (!spec.after_any().empty()) add("After any", join({spec.after_any().begin(), spec.after_any().end()}, ","));
  if (!spec.array_id().empty()) {
    add("Array", spec.array_id() + " index " + std::to_string(spec.array_index()) +
                     (spec.array_max_running() > 0
                          ? " (at most " + std::to_string(spec.array_max_running()) + " running)"
                          : ""));
  }
  std::string topology = !job.topology().empty()    ? job.topology()
                         : !spec.topology().empty() ? spec.topology() + " (requested)"
                                                    : "-";
  add("Topology", topology);
  add("Allocation", job.allocation().empty() ? "-" : formatAllocation(job));
  add("Restarts", std::to_string(job.restarts()) + " of " + std::to_string(spec.max_restarts()) + " allowed");
  if (!job.reason().empty()) add("Reason", job.reason());
  if (job.has_failure()) add("Failure", describeFailure(job.failure()));
  add("Submitted", formatLocalTime(job.submit_ms()) + " (" + formatAge(nowMs - job.submit_ms()) + " ago)");
  if (job.start_ms() > 0) add("Started", formatLocalTime(job.start_ms()));
  if (job.end_ms() > 0) add("Ended", formatLocalTime(job.end_ms()));

  // Time in each state, replayed from the transitions; a live job's current state runs until now.
  std::map<v1::JobState, int64_t> spent;
  v1::JobState current = v1::PENDING;
  int64_t since = job.submit_ms();
  for (const v1::Transition& t : job.transitions()) {
    spent[current] += t.at_ms() - since;
    current = t.to();
    since = t.at_ms();
  }
  if (!isFinalState(current)) spent[current] += nowMs - since;
  add("Queued", formatDuration(spent[v1::PENDING]));
  add("Running", formatDuration(spent[v1::RUNNING]));
  std::string out = renderTable(rows);

  if (job.ranks_size() > 0) {
    // What libddl last reported per rank; the straggler is marked (the least time in collectives over the run:
    // the others wait for it there).
    const int slowest = slowestRank(job);
    // PID is the program's own when the agent knows it (else its ddl-rank-shim's); EXIT is the exit code or
    // the signal of an ended rank.
    std::vector<std::vector<std::string>> ranks = {{"  RANK", "NODE", "STATE", "PID", "EXIT", "START", "END",
                                                    "COLLECTIVES", "LAST", "BUSBW(GB/s)", "DIMS(us)", ""}};
    auto clock = [](int64_t ms) { return ms > 0 ? formatLocalTime(ms).substr(11, 8) : std::string("-"); };
    for (const v1::RankStatus& r : job.ranks()) {
      std::string exit = r.has_signal()      ? signalName(r.signal())
                         : r.has_exit_code() ? std::to_string(r.exit_code())
                                             : "-";
      std::vector<std::string> row = {"  " + std::to_string(r.rank()),
                                      r.node().empty() ? "-" : cell(r.node(), kMaxNameColumn),
                                      v1::RankStatus::State_Name(r.state()),
                                      std::to_string(r.program_pid() > 0 ? r.program_pid() : r.pid()),
                                      exit,
                                      clock(r.started_ms()),
                                      clock(r.exited_ms())};
      if (r.has_progress()) {
        const v1::RankProgress& p = r.progress();
        std::vector<std::string> dims;
        for (double d : p.dims_us()) {
          dims.push_back(std::to_string(static_cast<int64_t>(std::isfinite(d) ? std::clamp(d, -1e15, 1e15) : 0)));
        }
        char last[96];
        std::snprintf(last, sizeof(last), "%s %lld B %.1f us", p.last_op().c_str(),
                      static_cast<long long>(p.last_bytes()), p.last_us());
        char bw[32];
        std::snprintf(bw, sizeof(bw), "%.2f", lastBusBwGBps(p));
        row.insert(row.end(), {std::to_string(p.collectives()), last, bw, dims.empty() ? "-" : join(dims, ","),
                               r.rank() == slowest ? "<- straggler" : ""});
      } else {
        row.insert(row.end(), {"-", "-", "-", "-", ""});
      }
      ranks.push_back(row);
    }
    out += "Ranks (last reported by libddl):\n" + renderTable(ranks);
  }
  out += "Transitions:\n";
  std::vector<std::vector<std::string>> lines;
  for (const v1::Transition& t : job.transitions()) {
    std::string move = t.from() == v1::JOB_STATE_UNSPECIFIED
                           ? stateName(t.to())
                           : stateName(t.from()) + " -> " + stateName(t.to());
    std::string reason = t.reason();
    if (t.has_failure()) {
      reason += (reason.empty() ? "" : " ") + std::string("[") + describeFailure(t.failure()) + "]";
    }
    lines.push_back({"  " + formatLocalTime(t.at_ms()), move, reason});
  }
  if (lines.empty()) lines.push_back({"  (none)"});
  return out + renderTable(lines);
}

std::string toJson(const google::protobuf::Message& message) { return ddl::toJson(message) + "\n"; }

// ---- The command line -------------------------------------------------------------------------------------

namespace {

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
  DDL_COORDINATOR  HOST:PORT of the coordinator when --coordinator is not given (default 127.0.0.1:7070)
  DDL_CA           the cluster's CA certificate when --ca is not given (default ~/.config/ddl/ca.crt if it
                   exists, else /etc/ddl/pki/ca.crt)
  DDL_TOKEN        your token when --token-file is not given (else read from $DDL_TOKEN_FILE or
                   ~/.config/ddl/token)

Job ids may be short: 5, 000005 and j-5 all mean j-000005.

Output: text for people; -o json prints exactly one JSON document on stdout (proto field names).)";

// Everything the command line said; CLI11 fills it while parsing.
struct CommandLine {
  std::string coordinator;  // "" = not given
  std::string ca;           // "" = not given
  std::string tokenFile;    // "" = not given
  bool insecure = false;
  std::string adminVerb;    // admin's subcommand
  std::string role = "user";
  bool rotate = false;
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
  std::string name;       // list --name
  std::string since;      // list --since, as given
  std::string until;      // list --until, as given
  int pageSize = 0;       // list --page-size; 0 = the coordinator's default
  std::string nodesVerb;  // "" (list nodes) or "remove"
  std::string target;  // the JOB or NODE argument
  std::optional<int> rank;  // logs: one rank only
  int attempt = 0;          // logs: 0 = the latest launch
  bool follow = false;      // logs -f
  std::optional<int> tail;  // logs --tail N
  bool timestamps = false;  // logs --timestamps
  std::vector<std::string> targets;  // wait, cancel, hold, release, requeue: JOB...
  bool wait = false;                 // submit --wait
  double waitTimeoutS = 0;           // --wait-timeout; 0 = until the job ends
  double reconnectS = 600;           // --reconnect-timeout: how long wait/logs -f ride out a lost coordinator
  std::string array;                 // submit --array
  std::string signal;                // cancel --signal, as given
  std::string reason;                // drain --reason
};

void declareCommandLine(CLI::App& app, CommandLine& cl) {
  app.footer(kFooter);
  app.require_subcommand(1);
  app.fallthrough();  // so global options work after the verb too: ddlctl list -o json
  // A global given twice: the last one wins, so wrapper scripts can set a default that users override.
  app.add_option("--coordinator", cl.coordinator,
                 "the coordinator (default: $DDL_COORDINATOR, else 127.0.0.1:7070)")
      ->type_name("HOST:PORT")
      ->take_last();
  app.add_option("-o,--output", cl.output, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->take_last();
  app.add_option("--timeout", cl.timeoutS, "deadline of the request, in seconds (default 10)")
      ->type_name("SECONDS")
      ->take_last();
  app.add_option("--ca", cl.ca, "the cluster's CA certificate (default: $DDL_CA, ~/.config/ddl/ca.crt, "
                                "/etc/ddl/pki/ca.crt)")
      ->type_name("FILE")
      ->take_last();
  app.add_option("--token-file", cl.tokenFile, "file holding your token (default: $DDL_TOKEN, else "
                                               "$DDL_TOKEN_FILE, else ~/.config/ddl/token)")
      ->type_name("FILE")
      ->take_last();
  app.add_flag("--insecure", cl.insecure, "plaintext, for a coordinator run with --insecure on loopback");

  SubmitArgs& s = cl.submit;
  CLI::App* submit = app.add_subcommand(
      "submit", "submit a job: ddlctl submit [options] -- COMMAND ARGS..., or ddlctl submit [options] SCRIPT ARGS...");
  submit->footer(
      "Say how many GPUs: --gpus T (a total, placed on as few nodes as possible) or --nodes N with\n"
      "--gpus-per-node G (G defaults to 1). Prints the job id (or the Job as JSON).\n"
      "SCRIPT (no --): a file starting with #! whose '#DDL --flag value' lines, before its first command,\n"
      "are submit options (the command line's win); the job runs SCRIPT by its absolute path with ARGS.");
  // A flag given twice takes its last value, so a script's #DDL line can be overridden on the command line.
  submit->add_option("--name", s.name, "job name (default: the command's basename)")->take_last();
  // Functions, not plain ints: "given" must be told apart from any value, 0 included.
  submit
      ->add_option_function<int>(
          "--nodes", [&s](const int& n) { s.nodes = n; }, "number of nodes")
      ->type_name("N")
      ->take_last();
  submit
      ->add_option_function<int>(
          "--gpus-per-node", [&s](const int& g) { s.gpusPerNode = g; }, "GPUs on each node (default 1)")
      ->type_name("G")
      ->take_last();
  submit
      ->add_option_function<int>(
          "--gpus", [&s](const int& t) { s.gpus = t; }, "total GPUs, on any nodes")
      ->type_name("T")
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
  submit->add_option("--priority", s.priority, "higher runs first (default 0)")->take_last();
  submit->add_option("--max-restarts", s.maxRestarts, "requeue after a failure up to R times (default 0)")
      ->take_last();
  // One value per flag (allow_extra_args(false)): a vector option would otherwise swallow the words after it.
  submit->add_option("--env", s.env, "KEY=VALUE for every rank (repeatable; several after one --env)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  submit->add_option("--label", s.labels, "KEY=VALUE a node must carry (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  submit->add_option("--workdir", s.workdir,
                     "working directory of the ranks (default: here; a relative one is taken from here)")
      ->take_last();
  submit->add_option("--time", s.timeLimit,
                     "time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or 90s, 30m, 2h, 1d; the job "
                     "is stopped and ends TIMEOUT past it")
      ->type_name("LIMIT")
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
  submit->add_option("--array", cl.array,
                     "a job array, one job per index (DDL_ARRAY_INDEX): 0-15, 1,3,5, 0-15:4; %N runs at most N "
                     "at once (0-15%4); at most 10000 jobs")
      ->type_name("SPEC")
      ->take_last();
  submit->add_flag("--hold", s.hold, "submit held: the job waits until 'ddlctl release'");
  submit->add_option("--export", s.exportSpec,
                     "environment sent to the ranks besides --env: NONE (default), ALL (yours, but DDL_* "
                     "variables, credentials and what ddl sets itself), or VAR[,VAR=value...]")
      ->type_name("WHAT")
      ->take_last();
  submit->add_flag("--wait", cl.wait, "wait until the job ended and exit with its result (see Exit status)");
  submit->add_option("--wait-timeout", cl.waitTimeoutS, "with --wait: give up after SECONDS (exit 8)")
      ->type_name("SECONDS")
      ->check(CLI::NonNegativeNumber)
      ->take_last();
  submit
      ->add_option("--reconnect-timeout", cl.reconnectS,
                   "with --wait: ride out a coordinator that stops answering (a restart) for up to SECONDS "
                   "(default 600)")
      ->check(CLI::Range(0.0, 86400.0));
  // The command arrives through the split at "--" in runDdlctl(), or as a script: the first word that is not
  // a flag or a flag's value ends submit's flags (expandEnvValues() splits there, before CLI11 parses).

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

  const std::string jobHelp = "job id (j-000005, or just 5)";
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
  cancel->add_option("--signal", cl.signal,
                     "send this signal (USR1, SIGUSR1 or a number) to the job's running ranks instead; the job "
                     "goes on")
      ->type_name("SIG");
  CLI::App* wait = app.add_subcommand("wait", "wait until the jobs ended; exit with their result (see Exit status)");
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
  CLI::App* logs = app.add_subcommand("logs", "the ranks' output, read from their nodes (lines prefixed [rank])");
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
  CLI::App* nodes =
      app.add_subcommand("nodes", "list nodes; 'nodes remove NAME' forgets a node that is gone");
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
  app.add_subcommand("whoami", "who the coordinator takes you for (user and role)");

  CLI::App* admin = app.add_subcommand("admin", "users and node certificates (admins only)");
  admin->require_subcommand(1);
  CLI::App* add = admin->add_subcommand("add-user", "make a user and print its token (shown once)");
  add->add_option("NAME", cl.target, "user name (the account ranks run as on the nodes)")->required();
  add->add_option("--role", cl.role, "user, admin or viewer (default user)")
      ->check(CLI::IsMember({"user", "admin", "viewer"}));
  add->add_flag("--rotate", cl.rotate, "give an existing user a new token (the old one stops working)");
  admin->add_subcommand("remove-user", "remove a user (its token stops working)")
      ->add_option("NAME", cl.target, "user name")
      ->required();
  admin->add_subcommand("users", "list users and roles");
  CLI::App* issue = admin->add_subcommand("issue-node", "a certificate for a node, written to --out as ca.crt, "
                                                        "node.crt and node.key (install them in the node's "
                                                        "/etc/ddl/pki)");
  issue->add_option("NAME", cl.target, "node name")->required();
  issue->add_option("--out", cl.outDir, "directory to write the node's files to")->required();
  issue->add_option("--days", cl.days, "validity (default: the coordinator's node_cert_days)")
      ->check(CLI::Range(1, 3650));
  CLI::App* join = admin->add_subcommand("join-token", "a one-time token with which node NAME gets its own "
                                                       "certificate (ddl-agent join)");
  join->add_option("NAME", cl.target, "node name")->required();
  join->add_option("--ttl", cl.ttlS, "seconds the token stays valid (default 3600)")->check(CLI::Range(1, 604800));
}

int usageError(std::ostream& err, const std::string& message, const std::string& verb = "") {
  err << "ddlctl: " << message << "\n"
      << (verb.empty() ? "run 'ddlctl --help' for usage" : "run 'ddlctl " + verb + " --help' for its options")
      << "\n";
  return kExitUsage;
}

// One channel to the coordinator and the per-call deadline; every verb makes exactly one call through it.
// The channel connects lazily, on the first call.
class Session {
 public:
  Session(const CommandLine& cl, const Credentials& credentials, std::ostream& out, std::ostream& err)
      : address_(cl.coordinator),
        timeoutS_(cl.timeoutS),
        json_(cl.output == "json"),
        insecure_(cl.insecure),
        reconnectS_(cl.reconnectS),
        credentials_(credentials),
        out_(out),
        err_(err) {}

  std::ostream& out() { return out_; }

  // Runs `rpc` under the deadline; on failure prints the error and returns its exit status. The channel is
  // made on the first call, so the verb's own checks come before a missing CA certificate is reported.
  int call(const std::function<grpc::Status(v1::UserService::Stub&, grpc::ClientContext*)>& rpc) {
    int usage = kExitOk;
    grpc::Status status = callQuiet(rpc, &usage);
    if (usage != kExitOk) return usage;
    return report(status);
  }

  // As call(), but a failure is returned, not printed: the verbs that wait decide what a refusal means.
  // `usage` is set to kExitUsage (already printed) when there is no CA certificate to connect with.
  grpc::Status callQuiet(const std::function<grpc::Status(v1::UserService::Stub&, grpc::ClientContext*)>& rpc,
                         int* usage) {
    if (!stub_) {
      grpc::ChannelArguments args;
      std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
      if (insecure_) {
        channel_credentials = grpc::InsecureChannelCredentials();
      } else {
        std::error_code ec;
        if (!std::filesystem::exists(credentials_.ca, ec)) {
          *usage = usageError(err_, "no CA certificate at " + credentials_.ca +
                                        ": give the cluster's ca.crt with --ca or DDL_CA (--insecure for a "
                                        "development coordinator on loopback)");
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "no CA certificate");
        }
        // A CA file that is not a certificate, or one that expired, fails every handshake with gRPC's own log
        // lines and "unavailable": say what is wrong with it instead, before connecting.
        if (std::string why = checkCa(credentials_.ca); !why.empty()) {
          *usage = kExitUnauthenticated;
          err_ << "ddlctl: " << why << "\nhint: give the cluster's ca.crt with --ca or DDL_CA\n";
          return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, why);
        }
        tls::addChannelArgs(&args);
        channel_credentials = tls::channelCredentials({credentials_.ca, "", ""});
      }
      // After a lost connection gRPC waits up to 2 minutes between reconnects by default: a coordinator that
      // is back after a restart would go unnoticed that long by the verbs that wait.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
      stub_ = v1::UserService::NewStub(grpc::CreateCustomChannel(address_, channel_credentials, args));
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(timeoutS_ * 1000)));
    if (!credentials_.token.empty()) context.AddMetadata("authorization", "Bearer " + credentials_.token);
    grpc::Status status = rpc(*stub_, &context);
    if (status.ok()) reached_ = true;
    return status;
  }

  // For the verbs that wait (wait, submit --wait, logs -f): as callQuiet, but once the coordinator has
  // answered in this session, a call it cannot answer (UNAVAILABLE or no answer in time: a restart, an
  // upgrade, its machine rebooting) is tried again, 0.2 s apart doubling to 5 s, for up to
  // --reconnect-timeout seconds, said on stderr when the outage starts and ends. Jobs run on meanwhile; only
  // reads are repeated.
  grpc::Status callRidingOut(
      const std::function<grpc::Status(v1::UserService::Stub&, grpc::ClientContext*)>& rpc, int* usage) {
    grpc::Status status = callQuiet(rpc, usage);
    if (!reached_ || !outage(status) || reconnectS_ <= 0) return status;
    const int64_t start = steadyNowMs();
    const int64_t deadline = start + static_cast<int64_t>(reconnectS_ * 1000);
    err_ << "ddlctl: lost the coordinator at " << address_ << " ("
         << escapeForTerminal(
                describeRpcError(status.error_code(), status.error_message(), address_, timeoutS_).message)
         << "); trying again for up to " << formatSeconds(reconnectS_) << " s (--reconnect-timeout)\n";
    err_.flush();
    int64_t delay = 200;
    for (int64_t rounds = static_cast<int64_t>(reconnectS_ * 1000) / 200 + 2; rounds > 0; --rounds) {
      const int64_t left = deadline - steadyNowMs();
      if (left <= 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(delay, left)));
      delay = std::min<int64_t>(delay * 2, 5000);
      status = callQuiet(rpc, usage);
      if (!outage(status)) {
        err_ << "ddlctl: the coordinator at " << address_ << " answers again (after "
             << formatSeconds((steadyNowMs() - start) / 1000.0) << " s)\n";
        err_.flush();
        return status;
      }
    }
    return status;  // still out: the caller reports it as any failure
  }
  // callRidingOut, then report() as call() does.
  int callWaiting(const std::function<grpc::Status(v1::UserService::Stub&, grpc::ClientContext*)>& rpc) {
    int usage = kExitOk;
    grpc::Status status = callRidingOut(rpc, &usage);
    if (usage != kExitOk) return usage;
    return report(status);
  }

  // Prints a failed call's error as call() does and returns its exit status; kExitOk for an OK status.
  int report(const grpc::Status& status) {
    if (status.ok()) return kExitOk;
    RpcError e =
        describeRpcError(status.error_code(), status.error_message(), address_, timeoutS_, insecure_);
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && e.hint.empty()) {
      e.hint = "the answer was larger than gRPC allows; for list, ask for smaller pages with --page-size";
    }
    if (status.error_code() == grpc::StatusCode::UNIMPLEMENTED && e.hint.empty()) {
      e.hint = "the coordinator is older than this ddlctl; upgrade it for this verb";
    }
    err_ << "ddlctl: " << escapeForTerminal(e.message) << "\n";
    if (!e.hint.empty()) err_ << "hint: " << e.hint << "\n";
    return e.exitCode;
  }

  bool json() const { return json_; }

  // Prints the answer: the message as JSON, or `text` for people.
  int print(const google::protobuf::Message& message, const std::string& text) {
    out_ << (json_ ? toJson(message) : text);
    return kExitOk;
  }

 private:
  std::string address_;
  double timeoutS_;
  bool json_;
  bool insecure_;
  double reconnectS_;
  bool reached_ = false;  // a call was answered: later outages are ridden out by callRidingOut
  Credentials credentials_;
  std::unique_ptr<v1::UserService::Stub> stub_;
  std::ostream& out_;
  std::ostream& err_;
};

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
      err << "ddlctl: gave up waiting after " << pacer.limit() << " s; still live: " << escapeForTerminal(join(live, " "))
          << "\n";
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
// restarted or requeued, and exits with the job's result.
int runLogs(CommandLine& cl, Session& s, std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  if (cl.output == "json") return usageError(err, "logs prints the ranks' output as text; -o json does not apply");
  const std::string id = normalizeJobId(cl.target);
  Pacer pacer(cl.waitTimeoutS);
  v1::Job job;
  // -f rides out a coordinator restart (Session::callRidingOut); a single read does not.
  auto quiet = [&](const std::function<grpc::Status(Stub&, Ctx*)>& rpc, int* usage) {
    return cl.follow ? s.callRidingOut(rpc, usage) : s.callQuiet(rpc, usage);
  };
  auto getJob = [&] {
    v1::GetJobRequest get;
    get.set_id(id);
    auto rpc = [&](Stub& stub, Ctx* c) { return stub.GetJob(c, get, &job); };
    return cl.follow ? s.callWaiting(rpc) : s.call(rpc);
  };
  auto gaveUp = [&] {
    err << "ddlctl: gave up waiting after " << pacer.limit() << " s; " << escapeForTerminal(id) << " is "
        << stateName(job.state()) << "\n";
    return kExitWaitTimeout;
  };
  // -f: a job not launched yet has no logs; wait for it (one line on stderr), or for its end.
  auto waitUntilLaunched = [&]() -> int {
    bool announced = false;
    while (job.state() == v1::PENDING || job.state() == v1::SCHEDULED) {
      if (!announced) {
        err << "waiting for " << escapeForTerminal(id) << " (" << stateName(job.state())
            << (job.reason().empty() ? "" : ": " + escapeForTerminal(job.reason())) << ")\n";
        err.flush();
        announced = true;
      }
      if (!pacer.sleep()) return gaveUp();
      if (int rc = getJob()) return rc;
    }
    return kExitOk;
  };
  if (int rc = getJob()) return rc;
  if (cl.follow) {
    if (int rc = waitUntilLaunched()) return rc;
  }
  std::vector<int> ranks;
  if (cl.rank) {
    ranks.push_back(*cl.rank);
  } else {
    // At least rank 0, so that a job the coordinator cannot size still gets its answer (its refusal).
    const int n = std::max(1, job.gpus() > 0 ? job.gpus() : requestedGpus(job.spec()));
    for (int r = 0; r < n; ++r) ranks.push_back(r);
  }
  const bool prefix = ranks.size() > 1;
  std::vector<int64_t> offsets(ranks.size(), 0);
  std::vector<std::string> partial(ranks.size());
  // --tail: until a rank's first read reaches the end of its log, its lines go to a window of the last N.
  std::vector<bool> caughtUp(ranks.size(), !cl.tail.has_value());
  std::vector<std::deque<std::string>> window(ranks.size());
  auto line = [&](size_t i, std::string_view text) {
    std::string out;
    if (cl.timestamps) out += formatLocalTime(unixNowMs()) + " ";  // when ddlctl received it
    if (prefix) out += "[" + std::to_string(ranks[i]) + "] ";
    out += text;
    if (caughtUp[i]) {
      s.out() << out;
      return;
    }
    if (*cl.tail == 0) return;
    window[i].push_back(std::move(out));
    if (window[i].size() > static_cast<size_t>(*cl.tail)) window[i].pop_front();
  };
  auto catchUp = [&](size_t i) {
    if (caughtUp[i]) return;
    for (const std::string& l : window[i]) s.out() << l;
    window[i].clear();
    caughtUp[i] = true;
  };
  auto emit = [&](size_t i, bool flush) {
    size_t start = 0, nl;
    while ((nl = partial[i].find('\n', start)) != std::string::npos) {
      line(i, std::string_view(partial[i]).substr(start, nl + 1 - start));
      start = nl + 1;
    }
    partial[i].erase(0, start);
    if (flush && !partial[i].empty()) {
      line(i, partial[i] + "\n");
      partial[i].clear();
    }
  };
  int attempt = cl.attempt;  // 0 until the first answer names the latest attempt
  const bool everyAttempt = cl.follow && cl.attempt == 0;
  int restarts = job.restarts();  // at the attempt being read: a newer attempt without more is a requeue
  // The latest attempt, from a 1-byte read of the first rank: 0 while the job is not launched
  // (FAILED_PRECONDITION), -1 when the read failed otherwise (the caller goes on as if there were none);
  // `rc` is set only when there is no CA certificate to connect with (already printed).
  auto latestAttempt = [&](int* rc) -> int {
    v1::GetLogsRequest probe;
    probe.set_id(id);
    probe.set_rank(ranks.front());
    probe.set_max_bytes(1);
    v1::GetLogsResponse latest;
    int usage = kExitOk;
    grpc::Status st = quiet([&](Stub& stub, Ctx* c) { return stub.GetLogs(c, probe, &latest); }, &usage);
    *rc = usage;
    if (st.ok()) return latest.attempt();
    return st.error_code() == grpc::StatusCode::FAILED_PRECONDITION ? 0 : -1;
  };
  // Moves to `next` from its start: what is left of this attempt's lines first, then a marker on stderr. The
  // new attempt may run on other nodes, so the offsets of the old one mean nothing there.
  auto switchTo = [&](int next) -> int {
    for (size_t i = 0; i < ranks.size(); ++i) {
      emit(i, true);
      catchUp(i);
      offsets[i] = 0;
    }
    s.out().flush();
    if (int rc = getJob()) return rc;
    attempt = next;
    err << "==> attempt " << attempt;
    if (job.restarts() > restarts) {
      err << " (restart " << job.restarts() << " of " << job.spec().max_restarts() << ")";
    } else {
      err << " (requeued)";
    }
    err << " <==\n";
    err.flush();
    restarts = job.restarts();
    pacer.reset();
    return kExitOk;
  };
  // Has a newer attempt started (a restart, a requeue)? Follows it: -1 when there is none, 0 once switched,
  // else the exit status to end with.
  auto followNewer = [&]() -> int {
    int rc = kExitOk;
    const int latest = latestAttempt(&rc);
    if (rc != kExitOk) return rc;
    if (latest <= attempt) return -1;
    return switchTo(latest);
  };
  while (true) {
    bool any = false, ended = true, notLaunched = false, moved = false;
    for (size_t i = 0; i < ranks.size() && !notLaunched && !moved; ++i) {
      for (int piece = 0; piece < 4096; ++piece) {  // at most 1 GiB per rank per round
        v1::GetLogsRequest req;
        req.set_id(id);
        req.set_rank(ranks[i]);
        req.set_attempt(attempt);
        req.set_offset(offsets[i]);
        v1::GetLogsResponse resp;
        int usage = kExitOk;
        grpc::Status st = quiet([&](Stub& stub, Ctx* c) { return stub.GetLogs(c, req, &resp); }, &usage);
        if (usage != kExitOk) return usage;
        if (!st.ok()) {
          // Requeued and waiting again: the coordinator has no launched attempt to read from just now.
          if (cl.follow && st.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
            notLaunched = true;
            break;
          }
          // Following the latest attempt, the old one may be gone from where it ran (a requeue or restart
          // placed the job elsewhere): NOT_FOUND. Move to the newer attempt if there is one.
          if (everyAttempt && attempt > 0 && st.error_code() == grpc::StatusCode::NOT_FOUND) {
            int rc = kExitOk;
            const int latest = latestAttempt(&rc);
            if (rc != kExitOk) return rc;
            if (latest > attempt) {
              if (int switched = switchTo(latest)) return switched;
              moved = true;
              break;
            }
            if (latest == 0) {  // not launched again yet
              notLaunched = true;
              break;
            }
          }
          return s.report(st);
        }
        if (attempt == 0) attempt = resp.attempt();
        ended = ended && resp.job_ended();
        if (resp.data().empty()) {
          catchUp(i);
          break;
        }
        any = true;
        partial[i] += resp.data();
        offsets[i] = resp.next_offset();
        emit(i, false);
      }
    }
    s.out().flush();
    if (!cl.follow) break;
    if (moved) continue;
    if (notLaunched) {
      if (int rc = getJob()) return rc;
      if (isFinalState(job.state())) {
        err << "ddlctl: " << escapeForTerminal(id) << " ended " << stateName(job.state())
            << " before it was launched" << (job.reason().empty() ? "" : ": " + escapeForTerminal(job.reason()))
            << "\n";
        break;
      }
      // Launched but no logs yet (STARTING): look again after a pause, not at once.
      if (job.state() != v1::PENDING && job.state() != v1::SCHEDULED && !pacer.sleep()) return gaveUp();
      if (int rc = waitUntilLaunched()) return rc;
      if (everyAttempt && attempt > 0) {  // launched again: most likely a new attempt, maybe on other nodes
        if (int rc = followNewer(); rc > 0) return rc;
      }
      continue;
    }
    if (ended && !any) break;
    if (!any && everyAttempt && attempt > 0) {  // everything of this attempt has been read
      const int rc = followNewer();
      if (rc > 0) return rc;
      if (rc == 0) continue;
    }
    if (any) pacer.reset();
    if (!pacer.sleep()) {
      for (size_t i = 0; i < ranks.size(); ++i) emit(i, true);
      s.out().flush();
      return gaveUp();
    }
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    emit(i, true);
    catchUp(i);
  }
  s.out().flush();
  if (!cl.follow) return kExitOk;
  if (!isFinalState(job.state())) {
    if (int rc = getJob()) return rc;
  }
  return jobExitCode(job).value_or(kExitOk);
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
        return escapeForTerminal(job.id()) + " sent " + signalName(signal) + " (" + stateName(job.state()) + ")\n";
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
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.IssueNodeCertificate(c, req, &resp); })) return rc;
    std::string error;
    if (!pki::makePrivateDir(cl.outDir, &error) || !pki::writeFile(cl.outDir + "/" + pki::kCaCert, resp.ca_pem(), 0644, &error) ||
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

// This process's environment, for --export.
std::vector<std::string> processEnvironment() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  return out;
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
      s.out() << escapeForTerminal(ids.front()) << "\n... " << escapeForTerminal(ids.back()) << " (" << ids.size()
              << " jobs in array " << escapeForTerminal(resp.job().spec().array_id().empty() ? ids.front()
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

}  // namespace

namespace {

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

struct ParseResult {
  int rc = -1;        // -1: parsed, go on; else the exit status (help and --version print and give 0)
  std::string error;  // a usage error, unprinted
  std::string verb;   // with an error: the verb it is about ("submit", "admin add-user"), "" for ddlctl's own
  std::vector<std::string> rest;  // submit: the command words given without "--" (a script and its args)
};

// Edit distance with a swap of neighbours counted as one (Damerau), for "did you mean".
size_t editDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// The candidate nearest to `given`: within 2 edits (1 for short words), or one that starts with it; "" if
// none.
std::string nearest(const std::string& given, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = given.size() <= 4 ? 2 : 3;
  for (const std::string& c : candidates) {
    size_t distance = editDistance(given, c);
    // A word cut short ("--gpus-per" for --gpus-per-node) is near too, but a closer spelling goes first.
    if (given.size() >= 3 && c.rfind(given, 0) == 0) distance = std::min<size_t>(distance, 2);
    if (distance < best_distance) {
      best = c;
      best_distance = distance;
    }
  }
  return best;
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

constexpr const char* kVerbs[] = {"submit", "list",    "status",  "wait",   "cancel",
                                  "hold",   "release", "requeue", "ring",   "logs",
                                  "nodes",  "drain",   "undrain", "whoami", "admin"};

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

// Parses `words` (words[0] is the program) into `cl`. `inSubmit`: the words are submit's flags only (a
// script's directives), checked on their own.
ParseResult parseWords(const std::vector<std::string>& words, CommandLine& cl, bool inSubmit, std::ostream& out,
                       std::ostream& err) {
  CLI::App app{"ddlctl: submit, watch and cancel ddl jobs and manage nodes, through the ddl coordinator.",
               "ddlctl"};
  declareCommandLine(app, cl);
  app.set_version_flag("--version", std::string("ddlctl ") + ddl::kVersion, "print ddlctl's version and exit");
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
        result.error = "#DDL may not set --export: what of your environment a job gets is yours to say on the "
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
      result.error = what +
                     ": submit, list, status, wait, cancel, hold, release, requeue, ring, logs, nodes, drain, "
                     "undrain, whoami or admin";
    } else {
      result.error = describeParseError(app, verb, e);
    }
    return result;
  }
  CLI::App* verb = app.get_subcommands().front();
  cl.verb = verb->get_name();
  if (cl.verb == "admin") cl.adminVerb = verb->get_subcommands().front()->get_name();
  if (cl.verb == "nodes" && !verb->get_subcommands().empty()) {
    cl.nodesVerb = verb->get_subcommands().front()->get_name();
  }
  return result;
}

// `ddlctl submit script.sh ARGS`: a script starts with "#!"; its "#DDL" lines are submit flags, put before
// the command line's own so that those win (a flag given once takes the last value; --env and --label add
// up, and a later --env of the same name wins on the rank). "" or the usage error, naming the file and line.
std::string readScriptDirectives(const std::string& path, std::vector<std::string>* flags, std::ostream& out,
                                 std::ostream& err) {
  std::ifstream in(path, std::ios::binary);
  std::string head(1 << 20, '\0');  // directives come first; 1 MiB is plenty and bounds the read
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(in.gcount()));
  Parsed<std::vector<Directive>> directives = parseScriptDirectives(head);
  if (!directives.ok()) return path + " " + directives.error;
  for (const Directive& d : *directives.value) {
    std::vector<std::string> words = {"ddlctl"};
    words.insert(words.end(), d.args.begin(), d.args.end());
    CommandLine scratch;
    ParseResult checked = parseWords(words, scratch, /*inSubmit=*/true, out, err);
    const std::string where = path + " line " + std::to_string(d.line) + ": ";
    if (checked.rc == kExitOk) return where + "#DDL takes submit's flags only";
    if (checked.rc != -1) return where + checked.error;
    if (!checked.rest.empty() || std::find(d.args.begin(), d.args.end(), "--") != d.args.end()) {
      return where + "#DDL takes submit's flags only, not '" + escapeForTerminal(shellJoin(d.args)) + "'";
    }
    if (scratch.submit.exportSpec != "NONE") scratch.submit.environ = processEnvironment();
    if (std::string why = checkSubmitValues(scratch.submit); !why.empty()) return where + why;
    if (!scratch.array.empty()) {
      if (Parsed<int> count = checkArraySpec(scratch.array); !count.ok()) return where + count.error;
    }
    flags->insert(flags->end(), d.args.begin(), d.args.end());
  }
  return "";
}

bool isScript(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[2] = {0, 0};
  return in.read(magic, 2) && magic[0] == '#' && magic[1] == '!';
}

// "" when the script may be run as a program, else the usage error: a script without x permission would be
// accepted and then fail on its node with 126. The hint runs it through its own #! interpreter.
std::string checkExecutable(const std::string& path) {
  if (access(path.c_str(), X_OK) == 0) return "";
  std::ifstream in(path, std::ios::binary);
  std::string shebang;
  std::getline(in, shebang);
  std::string interpreter = trim(std::string_view(shebang).substr(std::min<size_t>(2, shebang.size())));
  if (!interpreter.empty() && interpreter.back() == '\r') interpreter.pop_back();
  if (interpreter.empty()) interpreter = "/bin/sh";
  const std::string shown = escapeForTerminal(shellJoin({path}));
  return shown + " is not executable: chmod +x " + shown + ", or submit -- " +
         escapeForTerminal(interpreter) + " " + shown + " ...";
}

}  // namespace

int runDdlctl(int argc, char** argv, std::ostream& out, std::ostream& err) {
  // Everything after the first "--" is the job's command, never ddlctl's flags: a "--help" there is the
  // program's own.
  std::vector<std::string> words;
  std::vector<std::string> command;
  bool sawDashDash = false;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && !sawDashDash && std::string_view(argv[i]) == "--") {
      sawDashDash = true;
      continue;
    }
    (sawDashDash ? command : words).emplace_back(argv[i]);
  }

  CommandLine cl;
  ParseResult parsed = parseWords(words, cl, false, out, err);
  if (parsed.rc == kExitUsage) return usageError(err, parsed.error, parsed.verb);
  if (parsed.rc != -1) return parsed.rc;
  if (cl.verb == "submit" && !parsed.rest.empty()) {
    const std::string& first = parsed.rest.front();
    std::error_code missing;
    if (!sawDashDash && !std::filesystem::exists(first, missing) &&
        (first.find('/') != std::string::npos || first.find('.') != std::string::npos)) {
      // Meant as a job script, by its look (train.sh, ./run, jobs/a.sbatch): a typo, most likely.
      return usageError(err, "no such file: " + first +
                                 " (a job script must be an existing file that starts "
                                 "with #!; a command goes after --, as in: ddlctl submit --gpus 4 -- " +
                                 shellJoin(parsed.rest) + ")");
    }
    if (sawDashDash || !isScript(first)) {
      return usageError(err, "put the job's command after --, as in: ddlctl submit --gpus 4 -- " +
                                 shellJoin(parsed.rest) + " (or give a script that starts with #!)");
    }
    if (std::string why = checkExecutable(parsed.rest.front()); !why.empty()) return usageError(err, why);
    // A script: its directives go before the command line's flags, right after the verb.
    std::vector<std::string> directives;
    if (std::string why = readScriptDirectives(parsed.rest.front(), &directives, out, err); !why.empty()) {
      return usageError(err, why);
    }
    const std::vector<std::string> rest = parsed.rest;
    std::vector<std::string> flags(words.begin(), words.end() - static_cast<std::ptrdiff_t>(rest.size()));
    // The job's shape is one choice: one given on the command line replaces the script's whole.
    auto shapeFlag = [](const std::string& w) {
      const std::string name = w.substr(0, w.find('='));
      return name == "--gpus" || name == "--nodes" || name == "--gpus-per-node";
    };
    if (std::any_of(flags.begin(), flags.end(), shapeFlag)) {
      std::vector<std::string> kept;
      for (size_t i = 0; i < directives.size(); ++i) {
        if (!shapeFlag(directives[i])) {
          kept.push_back(directives[i]);
        } else if (directives[i].find('=') == std::string::npos) {
          ++i;  // its value
        }
      }
      directives = kept;
    }
    auto verbAt = std::find(flags.begin() + 1, flags.end(), "submit");
    flags.insert(verbAt + 1, directives.begin(), directives.end());
    cl = CommandLine{};
    parsed = parseWords(flags, cl, false, out, err);
    if (parsed.rc == kExitUsage) return usageError(err, parsed.error, parsed.verb);
    if (parsed.rc != -1) return parsed.rc;
    std::error_code ec;
    command = rest;
    command.front() = std::filesystem::absolute(rest.front(), ec).lexically_normal().string();
  }
  cl.submit.command = command;

  if (sawDashDash && cl.verb != "submit") return usageError(err, "only submit takes a command after --");
  // Checked here, not with CLI::PositiveNumber, whose message prints the largest double in full.
  if (!(cl.timeoutS > 0 && cl.timeoutS <= 86400 * 365)) {
    return usageError(err,
                      "--timeout must be a positive number of seconds, got " + formatSeconds(cl.timeoutS));
  }
  std::string from;
  if (cl.coordinator.empty()) {
    const char* env = std::getenv("DDL_COORDINATOR");
    cl.coordinator = env != nullptr && *env ? env : kDefaultCoordinator;
    if (env != nullptr && *env) from = " (from DDL_COORDINATOR)";
  }
  if (std::string why = checkCoordinatorAddress(cl.coordinator); !why.empty())
    return usageError(err, why + from);

  if (cl.insecure) {
    if (std::string why = tls::checkInsecure(cl.coordinator, "ddlctl"); !why.empty()) return usageError(err, why);
  }
  Credentials credentials;
  if (std::string why = findCredentials(cl.ca, cl.tokenFile, &credentials); !why.empty()) {
    err << "ddlctl: " << why << "\nhint: give your token with --token-file, DDL_TOKEN_FILE or DDL_TOKEN\n";
    return kExitUnauthenticated;
  }
  Session session(cl, credentials, out, err);
  return runVerb(cl, session, err);
}

}  // namespace ddl::cli
