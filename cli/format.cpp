// ddlctl's renderings for people: job and node tables, a job's detail view, durations and local times, and
// the escaping every string from the server goes through before it reaches a terminal. Pure functions of
// their arguments (the clock is `nowMs`), so tests build Job and Node messages by hand and compare text. -o
// json prints the message itself (toJson), with proto field names.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "common/resources.h"
#include "ddl/messages.h"
#include "ddlctl_internal.h"

namespace ddl::cli {

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

// "UP", "DRAINING", "DOWN", or "DOWN (drained)": a DOWN node the operator drained comes back DRAINING.
std::string nodeState(const v1::Node& n) {
  return n.drained() && n.state() == "DOWN" ? n.state() + " (drained)" : n.state();
}

namespace {

// Seconds as hours with two decimals ("1.50").
std::string hoursText(double seconds) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.2f", seconds / 3600);
  return text;
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

}  // namespace

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
    return (spec.min_nodes() > 0 ? std::to_string(spec.min_nodes()) + " to " : "") +
           count(spec.nodes(), "node") + " x " + count(spec.gpus_per_node(), "GPU");
  }
  return (spec.min_gpus() > 0 ? std::to_string(spec.min_gpus()) + " to " : "") +
         count(spec.total_gpus(), "GPU");
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
  if (showReason) {
    const std::string code = job.state() == v1::PENDING ? job.reason_code() : "";
    return "(" + (code.empty() ? "" : code + (job.reason().empty() ? "" : ": ")) +
           (job.reason().empty() && code.empty() ? std::string("queued") : job.reason()) + ")";
  }
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
    rows.push_back(
        {"ID", "NAME", "USER", "STATE", "AGE", "TIME", "START", "NODES", "GPUS", "NODELIST(REASON)"});
  }
  for (const v1::Job& j : jobs.jobs()) {
    std::string nodes = j.allocation_size() > 0 ? std::to_string(j.allocation_size())
                        : j.spec().nodes() > 0  ? std::to_string(j.spec().nodes())
                                                : "-";
    int gpus = j.gpus() > 0 ? j.gpus() : requestedGpus(j.spec());
    rows.push_back({cell(j.id(), kMaxNameColumn), cell(j.spec().name(), kMaxNameColumn),
                    cell(j.spec().user(), kMaxNameColumn), stateName(j.state()),
                    formatAge(nowMs - j.submit_ms()), runTime(j, nowMs), startTime(j), nodes,
                    gpus > 0 ? std::to_string(gpus) : "-", cell(nodeListOrReason(j), kMaxWideColumn)});
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

std::string formatLimits(const v1::Limits& l) {
  std::vector<std::string> parts;
  if (l.gpus() > 0) parts.push_back(std::to_string(l.gpus()) + " GPUs");
  if (l.running_jobs() > 0) parts.push_back(std::to_string(l.running_jobs()) + " running");
  if (l.pending_jobs() > 0) parts.push_back(std::to_string(l.pending_jobs()) + " pending");
  if (l.gpu_hours() > 0) {
    parts.push_back(formatGpuHours(l.gpu_hours()) + " GPU-hours a " +
                    (l.period().empty() ? std::string("month") : l.period()));
  }
  if (parts.empty()) return "no limits";
  std::string out = "at most ";
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : "") + parts[i];
  return out;
}

std::string formatAccountTree(const v1::ListAccountsResponse& accounts) {
  std::map<std::string, std::vector<const v1::Account*>> children;  // by parent, in the listing's order
  for (const v1::Account& a : accounts.accounts()) children[a.parent()].push_back(&a);
  std::vector<std::vector<std::string>> rows = {{"ACCOUNT", "SHARE", "NORM", "USERS", "LIMITS"}};
  std::set<std::string> seen;  // a listing is a tree; this keeps a malformed one from looping
  std::function<void(const std::string&, int, double)> walk = [&](const std::string& parent, int depth,
                                                                  double part) {
    int64_t total = 0;
    for (const v1::Account* a : children[parent]) total += std::max<int64_t>(a->share(), 1);
    for (const v1::Account* a : children[parent]) {
      if (!seen.insert(a->name()).second) continue;
      const double norm = parent.empty() ? 1.0 : part * std::max<int64_t>(a->share(), 1) / total;
      char normText[32];
      std::snprintf(normText, sizeof(normText), "%.3f", norm);
      rows.push_back({std::string(2 * depth, ' ') + a->name(),
                      parent.empty() ? "-" : std::to_string(a->share()), normText, std::to_string(a->users()),
                      a->limits().ByteSizeLong() > 0 ? formatLimits(a->limits()) : "-"});
      walk(a->name(), depth + 1, norm);
    }
  };
  walk("", 0, 1.0);
  return renderTable(std::move(rows));
}

std::string formatShares(const v1::GetSharesResponse& shares) {
  std::vector<std::vector<std::string>> rows = {
      {"ACCOUNT", "SHARE", "NORM SHARE", "GPU-HOURS", "NORM USAGE", "FAIRSHARE"}};
  auto fixed = [](double v, int digits) {
    char text[48];
    std::snprintf(text, sizeof(text), "%.*f", digits, v);
    return std::string(text);
  };
  for (const v1::ShareRow& r : shares.accounts()) {
    rows.push_back({std::string(2 * std::clamp(r.depth(), 0, 32), ' ') + r.account(),
                    r.depth() == 0 ? "-" : std::to_string(r.share()), fixed(r.norm_share(), 3),
                    fixed(r.usage_gpu_s() / 3600, 2), fixed(r.norm_usage(), 3), fixed(r.factor(), 3)});
  }
  const std::string out = renderTable(std::move(rows));
  char half[64];
  std::snprintf(half, sizeof(half), "(usage halves every %.3g days)\n", shares.half_life_s() / 86400);
  return out + half;
}

std::string formatQos(const v1::ListQosResponse& qos) {
  std::vector<std::vector<std::string>> rows = {{"QOS", "PRIORITY", "PREEMPTS", "GRACE", "GPUS", "ACCOUNTS"}};
  auto list = [](const auto& names) {
    std::string out;
    for (const std::string& n : names) out += (out.empty() ? "" : ",") + escapeForTerminal(n);
    return out;
  };
  for (const v1::Qos& q : qos.qos()) {
    rows.push_back({escapeForTerminal(q.name()), std::to_string(q.priority()),
                    q.preempt().empty() ? "-" : list(q.preempt()), formatDuration(q.grace_s() * 1000),
                    q.gpus() > 0 ? std::to_string(q.gpus()) : "-",
                    q.accounts().empty() ? "(all)" : list(q.accounts())});
  }
  return renderTable(std::move(rows));
}

std::string formatUsage(const v1::GetUsageResponse& usage) {
  const bool daily = std::any_of(usage.rows().begin(), usage.rows().end(),
                                 [](const v1::UsageRow& r) { return !r.day().empty(); });
  const bool users = std::any_of(usage.rows().begin(), usage.rows().end(),
                                 [](const v1::UsageRow& r) { return !r.user().empty(); });
  std::vector<std::string> head;
  if (daily) head.push_back("DAY");
  head.push_back("ACCOUNT");
  if (users) head.push_back("USER");
  for (const char* h :
       {"GPU-HOURS", "CPU-HOURS", "ATTEMPTS", "JOBS", "FAILED", "REQUEUED", "PREEMPTED", "PEAK MEM"})
    head.push_back(h);
  std::vector<std::vector<std::string>> rows = {head};
  v1::UsageRow total;
  auto line = [&](const std::string& day, const std::string& account, const std::string& user,
                  const v1::UsageRow& r) {
    std::vector<std::string> row;
    if (daily) row.push_back(day);
    row.push_back(account);
    if (users) row.push_back(user);
    for (std::string v : {hoursText(r.gpu_seconds()), hoursText(r.cpu_seconds()),
                          std::to_string(r.attempts()), std::to_string(r.jobs()), std::to_string(r.failed()),
                          std::to_string(r.requeued()), std::to_string(r.preempted()),
                          r.max_rss_bytes() > 0 ? formatBytes(r.max_rss_bytes()) : std::string("-")})
      row.push_back(std::move(v));
    rows.push_back(std::move(row));
  };
  for (const v1::UsageRow& r : usage.rows()) {
    line(r.day(), escapeForTerminal(r.account()), escapeForTerminal(r.user()), r);
    total.set_gpu_seconds(total.gpu_seconds() + r.gpu_seconds());
    total.set_cpu_seconds(total.cpu_seconds() + r.cpu_seconds());
    total.set_attempts(total.attempts() + r.attempts());
    total.set_jobs(total.jobs() + r.jobs());
    total.set_failed(total.failed() + r.failed());
    total.set_requeued(total.requeued() + r.requeued());
    total.set_preempted(total.preempted() + r.preempted());
    total.set_max_rss_bytes(std::max(total.max_rss_bytes(), r.max_rss_bytes()));
  }
  line("", "TOTAL", "", total);
  std::string out = renderTable(std::move(rows));
  out += "(" + usage.first_day() + " to " + usage.last_day() + ", UTC days";
  if (!usage.first_day_kept().empty() && usage.first_day_kept() > usage.first_day()) {
    out += "; nothing is kept before " + usage.first_day_kept();
  }
  return out + ")\n";
}

std::string formatUsageCsv(const v1::GetUsageResponse& usage) {
  // RFC 4180: a field holding a comma, a quote or a line break is quoted, its quotes doubled (registry names
  // never need it; an insecure coordinator's users, named by the requests, might).
  auto field = [](const std::string& text) {
    if (text.find_first_of(",\"\r\n") == std::string::npos) return text;
    std::string out = "\"";
    for (char c : text) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
  };
  std::string out =
      "day,account,user,gpu_hours,cpu_hours,attempts,jobs,failed,requeued,max_rss_bytes,preempted\n";
  char numbers[192];
  for (const v1::UsageRow& r : usage.rows()) {
    std::snprintf(numbers, sizeof(numbers), "%.6f,%.6f,%lld,%lld,%lld,%lld,%lld,%lld", r.gpu_seconds() / 3600,
                  r.cpu_seconds() / 3600, static_cast<long long>(r.attempts()),
                  static_cast<long long>(r.jobs()), static_cast<long long>(r.failed()),
                  static_cast<long long>(r.requeued()), static_cast<long long>(r.max_rss_bytes()),
                  static_cast<long long>(r.preempted()));
    out += field(r.day()) + "," + field(r.account()) + "," + field(r.user()) + "," + numbers + "\n";
  }
  return out;
}

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
         std::to_string(n.gpus_used_size()) + "/" + std::to_string(n.gpus_size()) +
             (n.gpu_faults_size() ? " (" + std::to_string(n.gpu_faults_size()) + " faulted)" : ""),
         n.cpus_size() ? std::to_string(n.cpus_used_size()) + "/" + std::to_string(n.cpus_size()) : "-",
         n.memory_bytes() > 0 ? formatBytes(n.memory_used_bytes()) + "/" + formatBytes(n.memory_bytes())
                              : "-",
         n.address().empty() ? "-" : cell(n.address(), kMaxNameColumn + 24),
         labels.empty() ? "-" : cell(labels, kMaxWideColumn),
         n.last_heartbeat_ms() > 0 ? formatAge(nowMs - n.last_heartbeat_ms()) : "never",
         jobs.empty() ? "-" : cell(join(jobs, ","), kMaxWideColumn)});
    if (reasons)
      rows.back().push_back(n.drain_reason().empty() ? "-" : cell(n.drain_reason(), kMaxWideColumn));
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

std::string formatNodeInsides(const v1::ListNodesResponse& nodes) {
  auto list = [](const auto& ids) {
    std::string s;
    for (int i : ids) s += (s.empty() ? "" : ",") + std::to_string(i);
    return s.empty() ? std::string("-") : s;
  };
  auto orDash = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  std::string out;
  for (const v1::Node& n : nodes.nodes()) {
    out += "\nnode " + escapeForTerminal(n.name()) + "\n";
    std::vector<std::vector<std::string>> rows = {
        {"  GPU", "MODEL", "MEMORY", "NUMA", "CPUS", "ISLAND", "NVLINK", "NIC", "PCI", "USED", "HEALTH"}};
    for (const v1::Gpu& g : n.gpus()) {
      const bool used =
          std::find(n.gpus_used().begin(), n.gpus_used().end(), g.index()) != n.gpus_used().end();
      rows.push_back(
          {"  " + std::to_string(g.index()), cell(g.model(), kMaxNameColumn),
           g.memory_bytes() ? formatBytes(g.memory_bytes()) : "-",
           g.has_numa_node() ? std::to_string(g.numa_node()) : "-", cell(orDash(g.cpus()), kMaxNameColumn),
           g.has_island() ? std::to_string(g.island()) : "-", list(g.nvlink_peers()),
           cell(orDash(g.nic()), kMaxNameColumn), orDash(g.pci_bus_id()), used ? "yes" : "-", "ok"});
      for (const v1::GpuFault& f : n.gpu_faults())
        if (f.gpu() == g.index()) rows.back().back() = cell("FAULT: " + f.reason(), kMaxWideColumn);
    }
    if (n.gpus_size()) out += renderTable(rows);
    std::string nics;
    for (const v1::Nic& nic : n.nics()) {
      nics += (nics.empty() ? "" : ", ") + nic.name() + " (" + nic.transport() +
              (nic.has_numa_node() ? ", numa " + std::to_string(nic.numa_node()) : "") + ")";
    }
    out += "  NICs: " + escapeForTerminal(orDash(nics)) + "\n";
  }
  return out;
}

namespace {

// The detail view's Ranks section, for a job with ranks.
std::string rankTable(const v1::Job& job) {
  // What libddl last reported per rank; the straggler is marked (the least time in collectives over the
  // run: the others wait for it there).
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
        dims.push_back(
            std::to_string(static_cast<int64_t>(std::isfinite(d) ? std::clamp(d, -1e15, 1e15) : 0)));
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
  return "Ranks (last reported by libddl):\n" + renderTable(ranks);
}

// The detail view's Transitions section: one line each, or "(none)".
std::string transitionTable(const v1::Job& job) {
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
  return "Transitions:\n" + renderTable(lines);
}

// Each ended attempt's usage (accounting), with the totals when there are several.
std::string attemptTable(const v1::Job& job) {
  std::vector<std::vector<std::string>> lines = {
      {"  ATTEMPT", "GPUS", "WALL", "GPU-HOURS", "CPU-HOURS", "PEAK MEM", "END"}};
  double gpu_s = 0, cpu_s = 0;
  for (const v1::AttemptUsage& a : job.attempts()) {
    lines.push_back({"  " + std::to_string(a.attempt()), std::to_string(a.gpus()),
                     formatDuration(a.end_ms() - a.start_ms()), hoursText(a.gpu_seconds()),
                     hoursText(a.cpu_seconds()), a.max_rss_bytes() > 0 ? formatBytes(a.max_rss_bytes()) : "-",
                     escapeForTerminal(a.end())});
    gpu_s += a.gpu_seconds();
    cpu_s += a.cpu_seconds();
  }
  if (job.attempts_size() > 1) lines.push_back({"  all", "", "", hoursText(gpu_s), hoursText(cpu_s), "", ""});
  return "Usage:\n" + renderTable(lines);
}

}  // namespace

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
  if (!spec.account().empty()) add("Account", spec.account());
  if (!spec.qos().empty()) add("QoS", spec.qos());
  if (!job.preempted_by().empty()) {
    add("Preempted", "for job " + escapeForTerminal(job.preempted_by()) +
                         ": its ranks were signalled and are killed at " +
                         formatLocalTime(job.preempt_deadline_ms()) + " unless they exit first");
  }
  if (job.held()) {
    add("Held", job.held_by_admin()
                    ? "yes, by an admin (an admin releases it: ddlctl release " + job.id() + ")"
                    : "yes (ddlctl release " + job.id() + ")");
  }
  if (spec.time_limit_s() > 0) add("Time limit", formatDuration(int64_t{spec.time_limit_s()} * 1000));
  if (!spec.after_ok().empty()) add("After OK", join({spec.after_ok().begin(), spec.after_ok().end()}, ","));
  if (!spec.after_any().empty())
    add("After any", join({spec.after_any().begin(), spec.after_any().end()}, ","));
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
  if (!job.reason().empty()) {
    add("Reason", (job.state() == v1::PENDING && !job.reason_code().empty() ? job.reason_code() + ": " : "") +
                      job.reason());
  }
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

  if (job.ranks_size() > 0) out += rankTable(job);
  if (job.attempts_size() > 0) out += attemptTable(job);
  return out + transitionTable(job);
}

std::string toJson(const google::protobuf::Message& message) { return ddl::toJson(message) + "\n"; }

}  // namespace ddl::cli
