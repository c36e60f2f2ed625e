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
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <tuple>

#include "common/clock.h"
#include "common/host_port.h"
#include "common/pki.h"
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

bool isFinal(v1::JobState s) { return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED; }

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

bool isTopology(const std::string& s) {
  std::istringstream in(s);
  std::string dim;
  int dims = 0;
  while (std::getline(in, dim, 'x')) {
    if (!isDigits(dim) || dim.size() > 6 || std::stoi(dim) < 1) {
      return false;
    }
    ++dims;
  }
  return dims > 0 && s.back() != 'x';
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

Parsed<v1::JobSpec> buildJobSpec(const SubmitArgs& args) {
  auto fail = [](std::string why) { return Parsed<v1::JobSpec>{std::nullopt, std::move(why)}; };
  if (args.command.empty()) {
    return fail("submit needs a command after --, as in: ddlctl submit --gpus 4 -- python train.py");
  }
  for (auto [flag, value] : {std::pair{"--nodes", args.nodes}, std::pair{"--gpus-per-node", args.gpusPerNode},
                             std::pair{"--gpus", args.gpus}}) {
    if (value && *value < 1) {
      return fail(std::string(flag) + " must be at least 1, got " + std::to_string(*value));
    }
  }
  if (args.gpus && (args.nodes || args.gpusPerNode)) {
    return fail(
        "--gpus asks for a total and cannot be combined with --nodes or --gpus-per-node; give either "
        "--gpus T or --nodes N [--gpus-per-node G]");
  }
  if (!args.gpus && !args.nodes) {
    if (args.gpusPerNode) return fail("--gpus-per-node needs --nodes N (or ask for a total with --gpus T)");
    return fail("say how many GPUs the job needs: --gpus T, or --nodes N [--gpus-per-node G]");
  }
  if (args.maxRestarts < 0) {
    return fail("--max-restarts must be 0 or more, got " + std::to_string(args.maxRestarts));
  }
  if (!args.topology.empty() && !isTopology(args.topology)) {
    return fail("--topology '" + args.topology + "' is not a list of positive numbers joined by x, like 4x2");
  }

  v1::JobSpec spec;
  for (const std::string& e : args.env) {
    if (!splitKeyValue(e)) return fail("--env '" + e + "' is not KEY=VALUE");
    spec.add_env(e);
  }
  for (const std::string& l : args.labels) {
    auto kv = splitKeyValue(l);
    if (!kv) return fail("--label '" + l + "' is not KEY=VALUE");
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
  spec.set_workdir(args.workdir);
  for (const std::string& c : args.command) spec.add_command(c);
  return {spec, ""};
}

Parsed<int64_t> parseTimeBound(std::string_view text, int64_t nowMs) {
  auto fail = [&] {
    return Parsed<int64_t>{std::nullopt,
                           "'" + escapeForTerminal(text) +
                               "' is not a time: give a date (2026-11-24), a local time "
                               "(2026-11-24T10:00 or 2026-11-24T10:00:05) or an age (90s, 30m, 1h, "
                               "2d, 1w)"};
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

RpcError describeRpcError(grpc::StatusCode code, const std::string& message, const std::string& address,
                          double timeoutS) {
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
    if (lower.find("HANDSHAKE") != std::string::npos || lower.find("SSL") != std::string::npos ||
        lower.find("CERTIFICATE") != std::string::npos) {
      return {kExitUnreachable, "cannot reach coordinator at " + address + ": the TLS handshake failed (" + why + ")",
              "give the cluster's CA with --ca or DDL_CA; a coordinator run with --insecure needs --insecure here"};
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
  if (!in) return given ? "cannot read the token file " + file : "";  // no default file: call without a token
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
std::vector<std::vector<std::string>> jobRows(const v1::ListJobsResponse& jobs, int64_t nowMs, bool header) {
  std::vector<std::vector<std::string>> rows;
  if (header) rows.push_back({"ID", "NAME", "USER", "STATE", "AGE", "NODES", "GPUS", "NODELIST(REASON)"});
  for (const v1::Job& j : jobs.jobs()) {
    std::string nodes = j.allocation_size() > 0 ? std::to_string(j.allocation_size())
                        : j.spec().nodes() > 0  ? std::to_string(j.spec().nodes())
                                                : "-";
    int gpus = j.gpus() > 0 ? j.gpus() : requestedGpus(j.spec());
    rows.push_back({cell(j.id(), kMaxNameColumn), cell(j.spec().name(), kMaxNameColumn),
                    cell(j.spec().user(), kMaxNameColumn), stateName(j.state()),
                    formatAge(nowMs - j.submit_ms()), nodes, gpus > 0 ? std::to_string(gpus) : "-",
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
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "STATE", "GPUS", "ADDRESS", "LABELS", "HEARTBEAT", "JOBS"}};
  for (const v1::Node& n : nodes.nodes()) {
    std::string labels = formatLabels(n.labels());
    std::vector<std::string> jobs(n.jobs().begin(), n.jobs().end());
    rows.push_back({cell(n.name(), kMaxNameColumn), cell(nodeState(n), kMaxNameColumn),
                    std::to_string(n.gpus_used_size()) + "/" + std::to_string(n.gpus_size()),
                    n.address().empty() ? "-" : cell(n.address(), kMaxNameColumn + 24),
                    labels.empty() ? "-" : cell(labels, kMaxWideColumn),
                    n.last_heartbeat_ms() > 0 ? formatAge(nowMs - n.last_heartbeat_ms()) : "never",
                    jobs.empty() ? "-" : cell(join(jobs, ","), kMaxWideColumn)});
  }
  return renderTable(rows);
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
  add("Request", request);
  if (!spec.required_labels().empty()) add("Labels", formatLabels(spec.required_labels()));
  if (!spec.env().empty()) add("Env", shellJoin({spec.env().begin(), spec.env().end()}));
  add("Priority", std::to_string(spec.priority()));
  std::string topology = !job.topology().empty()    ? job.topology()
                         : !spec.topology().empty() ? spec.topology() + " (requested)"
                                                    : "-";
  add("Topology", topology);
  add("Allocation", job.allocation().empty() ? "-" : formatAllocation(job));
  add("Restarts", std::to_string(job.restarts()) + " of " + std::to_string(spec.max_restarts()) + " allowed");
  if (!job.reason().empty()) add("Reason", job.reason());
  if (job.has_failure()) add("Failure", describeFailure(job.failure()));
  add("Submitted", formatLocalTime(job.submit_ms()) + " (" + formatAge(nowMs - job.submit_ms()) + " ago)");

  // Time in each state, replayed from the transitions; a live job's current state runs until now.
  std::map<v1::JobState, int64_t> spent;
  v1::JobState current = v1::PENDING;
  int64_t since = job.submit_ms();
  for (const v1::Transition& t : job.transitions()) {
    spent[current] += t.at_ms() - since;
    current = t.to();
    since = t.at_ms();
  }
  if (!isFinal(current)) spent[current] += nowMs - since;
  add("Queued", formatDuration(spent[v1::PENDING]));
  add("Running", formatDuration(spent[v1::RUNNING]));
  std::string out = renderTable(rows);

  if (job.ranks_size() > 0) {
    // What libddl last reported per rank; the slowest last collective is marked, it sets everyone's pace.
    const int slowest = slowestRank(job);
    std::vector<std::vector<std::string>> ranks = {
        {"  RANK", "STATE", "PID", "COLLECTIVES", "LAST", "BUSBW(GB/s)", "DIMS(us)", ""}};
    for (const v1::RankStatus& r : job.ranks()) {
      std::vector<std::string> row = {"  " + std::to_string(r.rank()), v1::RankStatus::State_Name(r.state()),
                                      std::to_string(r.pid())};
      if (r.has_progress()) {
        const v1::RankProgress& p = r.progress();
        std::vector<std::string> dims;
        for (double d : p.dims_us()) dims.push_back(std::to_string(static_cast<int64_t>(d)));
        char last[96];
        std::snprintf(last, sizeof(last), "%s %lld B %.1f us", p.last_op().c_str(),
                      static_cast<long long>(p.last_bytes()), p.last_us());
        char bw[32];
        std::snprintf(bw, sizeof(bw), "%.2f", lastBusBwGBps(p));
        row.insert(row.end(), {std::to_string(p.collectives()), last, bw, dims.empty() ? "-" : join(dims, ","),
                               r.rank() == slowest && job.ranks_size() > 1 ? "<- slowest" : ""});
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

Environment:
  DDL_COORDINATOR  HOST:PORT of the coordinator when --coordinator is not given (default 127.0.0.1:7070)
  DDL_CA           the cluster's CA certificate when --ca is not given (default ~/.config/ddl/ca.crt if it
                   exists, else /etc/ddl/pki/ca.crt)
  DDL_TOKEN        your token when --token-file is not given (else read from $DDL_TOKEN_FILE or
                   ~/.config/ddl/token)

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
  std::vector<std::string> stray;  // submit: words given without "--" before them
  std::vector<std::string> states;
  std::string user;
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
  CLI::App* submit = app.add_subcommand("submit", "submit a job: ddlctl submit [options] -- COMMAND ARGS...");
  submit->footer(
      "Say how many GPUs: --gpus T (a total, placed on as few nodes as possible) or --nodes N with\n"
      "--gpus-per-node G (G defaults to 1). Prints the job id (or the Job as JSON).");
  submit->add_option("--name", s.name, "job name (default: the command's basename)");
  // Functions, not plain ints: "given" must be told apart from any value, 0 included.
  submit
      ->add_option_function<int>(
          "--nodes", [&s](const int& n) { s.nodes = n; }, "number of nodes")
      ->type_name("N");
  submit
      ->add_option_function<int>(
          "--gpus-per-node", [&s](const int& g) { s.gpusPerNode = g; }, "GPUs on each node (default 1)")
      ->type_name("G");
  submit
      ->add_option_function<int>(
          "--gpus", [&s](const int& t) { s.gpus = t; }, "total GPUs, on any nodes")
      ->type_name("T");
  submit->add_option("--topology", s.topology, "ring dims override, e.g. 4x2");
  submit->add_option("--priority", s.priority, "higher runs first (default 0)");
  submit->add_option("--max-restarts", s.maxRestarts, "requeue after a failure up to R times (default 0)");
  // One value per flag (allow_extra_args(false)): a vector option would otherwise swallow the words after it.
  submit->add_option("--env", s.env, "KEY=VALUE for every rank (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  submit->add_option("--label", s.labels, "KEY=VALUE a node must carry (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  submit->add_option("--workdir", s.workdir, "working directory of the ranks (default: here)");
  // The command really arrives through the split at "--" in runDdlctl(); this positional documents it and
  // catches words given without "--", to say where they belong.
  submit->add_option("COMMAND", cl.stray, "the job's command and its arguments, after --");

  CLI::App* list = app.add_subcommand("list", "list jobs (default: PENDING, SCHEDULED, STARTING, RUNNING)");
  CLI::Option* state =
      list->add_option("--state", cl.states, "only jobs in these states (repeatable, comma-separated)")
          ->type_name("STATE")
          ->allow_extra_args(false);
  list->add_option("--user", cl.user, "only this user's jobs");
  list->add_flag("--all", cl.all, "every job, finished ones too")->excludes(state);
  list->add_option("--name", cl.name, "only jobs with exactly this name");
  list->add_option(
          "--since", cl.since,
          "only jobs submitted at or after TIME: 2026-11-24, 2026-11-24T10:00 (local time) or an age "
          "such as 30m, 1h, 2d")
      ->type_name("TIME");
  list->add_option("--until", cl.until, "only jobs submitted before TIME (same forms as --since)")
      ->type_name("TIME");
  list->add_option("--page-size", cl.pageSize,
                   "jobs per request (default: the coordinator's, 500); ddlctl fetches page after page")
      ->type_name("N")
      ->check(CLI::Range(1, 5000));

  app.add_subcommand("status", "one job in detail, with its transitions")
      ->add_option("JOB", cl.target, "job id")
      ->required();
  app.add_subcommand("cancel", "cancel a job")->add_option("JOB", cl.target, "job id")->required();
  app.add_subcommand("ring", "a job's ring layout (rank order and dims)")
      ->add_option("JOB", cl.target, "job id")
      ->required();
  CLI::App* logs = app.add_subcommand("logs", "the ranks' output, read from their nodes (lines prefixed [rank])");
  logs->add_option("JOB", cl.target, "job id")->required();
  logs->add_option("--rank", cl.rank, "only this rank (no prefix)")->check(CLI::NonNegativeNumber);
  logs->add_option("--attempt", cl.attempt, "launch attempt (default: the latest)")->check(CLI::PositiveNumber);
  logs->add_flag("-f,--follow", cl.follow, "keep printing new output until the job ends");
  CLI::App* nodes =
      app.add_subcommand("nodes", "list nodes; 'nodes remove NAME' forgets a node that is gone");
  nodes->add_subcommand("remove", "forget node NAME for good (admins only; it must be DOWN with no live job)")
      ->add_option("NAME", cl.target, "node name")
      ->required();
  app.add_subcommand("drain", "stop placing new jobs on a node (running jobs stay)")
      ->add_option("NODE", cl.target, "node name")
      ->required();
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

int usageError(std::ostream& err, const std::string& message) {
  err << "ddlctl: " << message << "\nrun 'ddlctl --help' for usage\n";
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
        credentials_(credentials),
        out_(out),
        err_(err) {}

  std::ostream& out() { return out_; }

  // Runs `rpc` under the deadline; on failure prints the error and returns its exit status. The channel is
  // made on the first call, so the verb's own checks come before a missing CA certificate is reported.
  int call(const std::function<grpc::Status(v1::UserService::Stub&, grpc::ClientContext*)>& rpc) {
    if (!stub_) {
      grpc::ChannelArguments args;
      std::shared_ptr<grpc::ChannelCredentials> channel_credentials;
      if (insecure_) {
        channel_credentials = grpc::InsecureChannelCredentials();
      } else {
        std::error_code ec;
        if (!std::filesystem::exists(credentials_.ca, ec)) {
          return usageError(err_, "no CA certificate at " + credentials_.ca +
                                      ": give the cluster's ca.crt with --ca or DDL_CA (--insecure for a "
                                      "development coordinator on loopback)");
        }
        tls::addChannelArgs(&args);
        channel_credentials = tls::channelCredentials({credentials_.ca, "", ""});
      }
      stub_ = v1::UserService::NewStub(grpc::CreateCustomChannel(address_, channel_credentials, args));
    }
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(timeoutS_ * 1000)));
    if (!credentials_.token.empty()) context.AddMetadata("authorization", "Bearer " + credentials_.token);
    grpc::Status status = rpc(*stub_, &context);
    if (status.ok()) return kExitOk;
    RpcError e = describeRpcError(status.error_code(), status.error_message(), address_, timeoutS_);
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED && e.hint.empty()) {
      e.hint = "the answer was larger than gRPC allows; for list, ask for smaller pages with --page-size";
    }
    err_ << "ddlctl: " << escapeForTerminal(e.message) << "\n";
    if (!e.hint.empty()) err_ << "hint: " << e.hint << "\n";
    return e.exitCode;
  }

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
  Credentials credentials_;
  std::unique_ptr<v1::UserService::Stub> stub_;
  std::ostream& out_;
  std::ostream& err_;
};

// ddlctl logs: reads every rank's log in pieces (GetLogs) and prints whole lines, each prefixed by its rank
// when several ranks are shown. With --follow, polls every 0.5 s until the job has ended and nothing is left.
int runLogs(CommandLine& cl, Session& s, std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  if (cl.output == "json") return usageError(err, "logs prints the ranks' output as text; -o json does not apply");
  v1::GetJobRequest get;
  get.set_id(cl.target);
  v1::Job job;
  if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.GetJob(c, get, &job); })) return rc;
  std::vector<int> ranks;
  if (cl.rank) {
    ranks.push_back(*cl.rank);
  } else {
    for (int r = 0; r < job.gpus(); ++r) ranks.push_back(r);
  }
  const bool prefix = ranks.size() > 1;
  std::vector<int64_t> offsets(ranks.size(), 0);
  std::vector<std::string> partial(ranks.size());
  auto emit = [&](size_t i, bool flush) {
    size_t start = 0, nl;
    while ((nl = partial[i].find('\n', start)) != std::string::npos) {
      if (prefix) s.out() << "[" << ranks[i] << "] ";
      s.out() << std::string_view(partial[i]).substr(start, nl + 1 - start);
      start = nl + 1;
    }
    partial[i].erase(0, start);
    if (flush && !partial[i].empty()) {
      s.out() << (prefix ? "[" + std::to_string(ranks[i]) + "] " : "") << partial[i] << "\n";
      partial[i].clear();
    }
  };
  while (true) {
    bool any = false, ended = true;
    for (size_t i = 0; i < ranks.size(); ++i) {
      for (int piece = 0; piece < 4096; ++piece) {  // at most 1 GiB per rank per round
        v1::GetLogsRequest req;
        req.set_id(cl.target);
        req.set_rank(ranks[i]);
        req.set_attempt(cl.attempt);
        req.set_offset(offsets[i]);
        v1::GetLogsResponse resp;
        if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.GetLogs(c, req, &resp); })) return rc;
        ended = ended && resp.job_ended();
        if (resp.data().empty()) break;
        any = true;
        partial[i] += resp.data();
        offsets[i] = resp.next_offset();
        emit(i, false);
      }
    }
    s.out().flush();
    if (!cl.follow || (ended && !any)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  for (size_t i = 0; i < ranks.size(); ++i) emit(i, true);
  return kExitOk;
}

// ddlctl list: ListJobs page after page, each printed as it arrives (text), or gathered into one document (-o
// json). Bounded: at most kMaxListPages requests; past that ddlctl says so on stderr and, in JSON, leaves the
// next page's token in next_page_token. The coordinator may answer everything in one page with no token.
constexpr int kMaxListPages = 1000;

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

// The verb's one RPC and its output; local checks first, so a usage error sends nothing.
int runVerb(CommandLine& cl, Session& s, std::ostream& err) {
  using Stub = v1::UserService::Stub;
  using Ctx = grpc::ClientContext;
  int64_t now = unixNowMs();
  if (cl.verb == "submit") {
    if (!cl.stray.empty()) {
      return usageError(
          err, "put the job's command after --, as in: ddlctl submit --gpus 4 -- " + shellJoin(cl.stray));
    }
    cl.submit.user = invokingUser();
    if (cl.submit.workdir.empty()) {
      std::error_code ec;
      cl.submit.workdir = std::filesystem::current_path(ec).string();
    }
    Parsed<v1::JobSpec> spec = buildJobSpec(cl.submit);
    if (!spec.ok()) return usageError(err, spec.error);
    v1::SubmitRequest req;
    *req.mutable_spec() = *spec.value;
    v1::SubmitResponse resp;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.Submit(c, req, &resp); })) return rc;
    return s.print(resp.job(), escapeForTerminal(resp.job().id()) + "\n");
  }
  if (cl.verb == "list") return runList(cl, s, err);
  if (cl.verb == "status") {
    v1::GetJobRequest req;
    req.set_id(cl.target);
    v1::Job job;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.GetJob(c, req, &job); })) return rc;
    return s.print(job, formatJobDetail(job, now));
  }
  if (cl.verb == "cancel") {
    v1::CancelJobRequest req;
    req.set_id(cl.target);
    v1::Job job;
    if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.CancelJob(c, req, &job); })) return rc;
    return s.print(job, escapeForTerminal(job.id()) + " " + stateName(job.state()) + "\n");
  }
  if (cl.verb == "ring") {
    v1::GetRingRequest req;
    req.set_id(cl.target);
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
  v1::Node node;
  if (int rc = s.call([&](Stub& stub, Ctx* c) { return stub.DrainNode(c, req, &node); })) return rc;
  return s.print(node, escapeForTerminal(node.name()) + " " + escapeForTerminal(nodeState(node)) + "\n");
}

}  // namespace

int runDdlctl(int argc, char** argv, std::ostream& out, std::ostream& err) {
  // Everything after the first "--" is the job's command, never ddlctl's flags: a "--help" there is the
  // program's own.
  int cliArgc = argc;
  bool sawDashDash = false;
  CommandLine cl;
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]) == "--") {
      cliArgc = i;
      sawDashDash = true;
      cl.submit.command.assign(argv + i + 1, argv + argc);
      break;
    }
  }

  CLI::App app{"ddlctl: submit, watch and cancel ddl jobs and manage nodes, through the ddl coordinator.",
               "ddlctl"};
  declareCommandLine(app, cl);
  try {
    app.parse(cliArgc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {  // --help
      app.exit(e, out, err);
      return kExitOk;
    }
    if (app.get_subcommands().empty() && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
      std::vector<std::string> rest = app.remaining();
      std::string what = rest.empty() ? "say what to do" : "unknown verb '" + rest.front() + "'; use one of";
      return usageError(err, what + ": submit, list, status, cancel, ring, logs, nodes, drain, undrain, whoami or admin");
    }
    return usageError(err, e.what());
  }
  cl.verb = app.get_subcommands().front()->get_name();
  if (cl.verb == "admin") cl.adminVerb = app.get_subcommands().front()->get_subcommands().front()->get_name();
  if (cl.verb == "nodes" && !app.get_subcommands().front()->get_subcommands().empty()) {
    cl.nodesVerb = app.get_subcommands().front()->get_subcommands().front()->get_name();
  }

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
  if (std::string why = findCredentials(cl.ca, cl.tokenFile, &credentials); !why.empty()) return usageError(err, why);
  Session session(cl, credentials, out, err);
  return runVerb(cl, session, err);
}

}  // namespace ddl::cli
