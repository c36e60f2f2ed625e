#include "http/pages.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "ddl/messages.h"

namespace ddl::coordinator::http {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

const char* kStyle = R"(<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}h1{font-size:1.4em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse}td,th{padding:.25em .7em;border-bottom:1px solid #ddd;text-align:left;font-size:.9em}
th{background:#f4f4f4}.UP,.SUCCEEDED,.RUNNING{color:#17803d}.DOWN,.FAILED{color:#b91c1c}.DRAINING,.PENDING{color:#b45309}
.slow{background:#fde8e8}.fail{background:#fde8e8;border:1px solid #b91c1c;padding:.6em;margin:.5em 0}
pre{background:#f7f7f7;padding:.6em;max-height:18em;overflow:auto;font-size:.8em}a{color:#1d4ed8}
.muted{color:#777;font-size:.85em}</style>)";

// A Prometheus label value: backslash, quote and newline escaped (job ids never hold them; a bug must not break
// the exposition).
std::string labelValue(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

}  // namespace

std::string htmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string renderMetrics(const MetricsSnapshot& m, bool store_healthy) {
  std::ostringstream o;
  auto head = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  };
  head("ddl_nodes", "gauge", "Nodes by state.");
  for (const auto& [state, n] : m.nodes_by_state) o << "ddl_nodes{state=\"" << state << "\"} " << n << "\n";
  head("ddl_gpus", "gauge", "GPUs on UP and DRAINING nodes.");
  o << "ddl_gpus " << m.gpus_total << "\n";
  head("ddl_gpus_allocated", "gauge", "GPUs held by live jobs or by ranks still running.");
  o << "ddl_gpus_allocated " << m.gpus_allocated << "\n";
  head("ddl_jobs", "gauge", "Jobs by state.");
  for (const auto& [state, n] : m.jobs_by_state) o << "ddl_jobs{state=\"" << state << "\"} " << n << "\n";
  head("ddl_jobs_submitted_total", "counter", "Jobs accepted at submit since the coordinator started.");
  o << "ddl_jobs_submitted_total " << m.jobs_submitted_total << "\n";
  head("ddl_jobs_failed_total", "counter", "Jobs that ended FAILED since the coordinator started.");
  o << "ddl_jobs_failed_total " << m.jobs_failed_total << "\n";
  head("ddl_scheduling_latency_seconds", "histogram", "Time from entering the queue to SCHEDULED.");
  uint64_t cumulative = 0;
  for (size_t i = 0; i < m.scheduling_buckets.size(); ++i) {
    cumulative += m.scheduling_buckets[i];
    const std::string le = i < m.scheduling_bounds_s.size() ? num(m.scheduling_bounds_s[i]) : "+Inf";
    o << "ddl_scheduling_latency_seconds_bucket{le=\"" << le << "\"} " << cumulative << "\n";
  }
  o << "ddl_scheduling_latency_seconds_sum " << num(m.scheduling_sum_s) << "\n";
  o << "ddl_scheduling_latency_seconds_count " << m.scheduling_count << "\n";
  head("ddl_heartbeat_lag_seconds", "gauge", "Longest time since a heartbeat among nodes that are not DOWN.");
  o << "ddl_heartbeat_lag_seconds " << num(m.heartbeat_lag_max_s) << "\n";
  head("ddl_collective_bytes_total", "counter", "Bytes of collectives (mostly allreduce) reported by ranks.");
  o << "ddl_collective_bytes_total " << num(m.collective_bytes_total) << "\n";
  head("ddl_collective_seconds_total", "counter", "Time ranks spent in collectives, as they reported it.");
  o << "ddl_collective_seconds_total " << num(m.collective_seconds_total) << "\n";
  head("ddl_coordinator_store_healthy", "gauge", "1 while the coordinator can store its state, else 0 (see /healthz).");
  o << "ddl_coordinator_store_healthy " << (store_healthy ? 1 : 0) << "\n";
  // Per placed job (SCHEDULED, STARTING, RUNNING): one label, the job id, for at most
  // MetricsSnapshot::kMaxJobFigures (500) jobs, the oldest first, so a scrape
  // stays small and the series end with their job.
  struct PerJob {
    const char* name;
    const char* type;
    const char* help;
    std::string (*value)(const JobFigures&);
  };
  static const PerJob kPerJob[] = {
      {"ddl_job_collective_bytes_total", "counter", "Bytes of collectives of a live job's current attempt.",
       [](const JobFigures& f) { return num(f.bytes); }},
      {"ddl_job_collective_seconds_total", "counter", "Time a live job's ranks spent in collectives (this attempt).",
       [](const JobFigures& f) { return num(f.seconds); }},
      {"ddl_job_gpus", "gauge", "GPUs a live job asks for.", [](const JobFigures& f) { return std::to_string(f.gpus); }},
      {"ddl_job_ranks_reporting", "gauge", "Ranks of a live job that reported in the last 30 s.",
       [](const JobFigures& f) { return std::to_string(f.ranks_reporting); }},
  };
  for (const auto& metric : kPerJob) {
    head(metric.name, metric.type, metric.help);
    for (size_t i = 0; i < m.jobs.size() && i < MetricsSnapshot::kMaxJobFigures; ++i) {
      o << metric.name << "{job=\"" << labelValue(m.jobs[i].job) << "\"} " << metric.value(m.jobs[i]) << "\n";
    }
  }
  return o.str();
}

std::string renderIndexPage() {
  return std::string(R"(<!doctype html><html><head><meta charset="utf-8"><title>ddl cluster</title>)") + kStyle +
         R"(</head><body><h1>ddl cluster</h1><div class="muted" id="updated">loading...</div>
<h2>Nodes</h2><table id="nodes"><thead><tr><th>NAME</th><th>STATE</th><th>GPUS USED/TOTAL</th><th>LABELS</th>
<th>LAST HEARTBEAT</th><th>JOBS</th></tr></thead><tbody></tbody></table>
<h2>Jobs</h2><table id="jobs"><thead><tr><th>ID</th><th>NAME</th><th>USER</th><th>STATE</th><th>AGE</th>
<th>GPUS</th><th>NODES OR REASON</th></tr></thead><tbody></tbody></table>
<p class="muted">JSON: <a href="/api/v1/nodes">/api/v1/nodes</a> <a href="/api/v1/jobs">/api/v1/jobs</a>
&middot; <a href="/metrics">/metrics</a></p>
<script>
function esc(s){return String(s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));}
function age(ms){const s=Math.max(0,Math.floor((Date.now()-ms)/1000));return s<60?s+'s':s<3600?Math.floor(s/60)+'m':s<86400?Math.floor(s/3600)+'h':Math.floor(s/86400)+'d';}
function row(cells){return '<tr>'+cells.map(c=>'<td>'+c+'</td>').join('')+'</tr>';}
async function refresh(){
 try{
  const [n,j]=await Promise.all([fetch('/api/v1/nodes').then(r=>r.json()),fetch('/api/v1/jobs').then(r=>r.json())]);
  document.querySelector('#nodes tbody').innerHTML=(n.nodes||[]).map(x=>row([esc(x.name),
   '<span class="'+esc(x.state)+'">'+esc(x.state)+(x.drained&&x.state==='DOWN'?' (drained)':'')+(x.connected?'':' (disconnected)')+'</span>',
   (x.gpus_used||[]).length+'/'+(x.gpus||[]).length,
   esc(Object.entries(x.labels||{}).map(([k,v])=>k+'='+v).join(',')),
   x.last_heartbeat_ms>0?age(Number(x.last_heartbeat_ms))+' ago':'never',
   (x.jobs||[]).map(id=>'<a href="/jobs/'+esc(id)+'">'+esc(id)+'</a>').join(' ')])).join('');
  const jobs=(j.jobs||[]).slice().reverse();
  document.querySelector('#jobs tbody').innerHTML=jobs.map(x=>row(['<a href="/jobs/'+esc(x.id)+'">'+esc(x.id)+'</a>',
   esc(x.spec.name),esc(x.spec.user),'<span class="'+esc(x.state)+'">'+esc(x.state)+'</span>',
   age(Number(x.submit_ms)),x.gpus,
   (x.allocation||[]).length&&x.state!=='FAILED'?esc(x.allocation.map(a=>a.node).join(',')):'('+esc(x.reason)+')'])).join('');
  document.getElementById('updated').textContent='updated '+new Date().toLocaleTimeString();
 }catch(e){document.getElementById('updated').textContent='cannot reach the coordinator: '+e;}
}
refresh();setInterval(refresh,2000);
</script></body></html>
)";
}

std::string renderRingSvg(const v1::RingLayout& ring) {
  // Geometry: switches side by side, each a box of its nodes; a node is a box of GPU circles (one per rank).
  constexpr int kGpu = 44, kPad = 14, kNodeH = 64, kTop = 150;
  struct Pos {
    int x, y;
    std::string node, sw;
  };
  std::vector<Pos> pos(ring.ranks_size());
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::vector<int>>>>> switches;
  for (const auto& r : ring.ranks()) {
    if (switches.empty() || switches.back().first != r.switch_name()) switches.push_back({r.switch_name(), {}});
    auto& nodes = switches.back().second;
    if (nodes.empty() || nodes.back().first != r.node()) nodes.push_back({r.node(), {}});
    nodes.back().second.push_back(r.rank());
  }
  std::ostringstream boxes;
  int x = kPad;
  for (const auto& [sw, nodes] : switches) {
    const int sx = x;
    x += kPad;
    for (const auto& [node, ranks] : nodes) {
      const int w = static_cast<int>(ranks.size()) * kGpu + kPad;
      boxes << "<rect x='" << x << "' y='" << kTop - kNodeH / 2 << "' width='" << w << "' height='" << kNodeH
            << "' rx='6' fill='#eef2ff' stroke='#6366f1'/><text x='" << x + 4 << "' y='" << kTop + kNodeH / 2 - 5
            << "' font-size='10' fill='#3730a3'>" << htmlEscape(node) << "</text>";
      for (size_t i = 0; i < ranks.size(); ++i) {
        const int r = ranks[i];
        if (r >= 0 && r < static_cast<int>(pos.size())) {
          pos[r] = {x + kPad / 2 + static_cast<int>(i) * kGpu + kGpu / 2, kTop - 6, node, sw};
        }
      }
      x += w + kPad;
    }
    boxes << "<rect x='" << sx << "' y='" << kTop - kNodeH / 2 - 18 << "' width='" << x - sx << "' height='"
          << kNodeH + 36 << "' rx='10' fill='none' stroke='#94a3b8' stroke-dasharray='4 3'/>"
          << "<text x='" << sx + 6 << "' y='" << kTop - kNodeH / 2 - 6 << "' font-size='11' fill='#475569'>switch "
          << htmlEscape(sw.empty() ? "(none)" : sw) << "</text>";
    x += kPad;
  }
  const std::string title = "ring " + ring.topology() + " (DDL_TOPOLOGY) - " + ring.why();
  const int width = std::max({x, 420, 2 * kPad + 7 * static_cast<int>(title.size())});
  // Rings along each dim: rank r's neighbour along dim d differs from r only in coordinate d (dims[0] fastest).
  std::ostringstream arcs;
  const char* colors[] = {"#0891b2", "#c026d3", "#ea580c", "#16a34a"};
  int stride = 1;
  for (int d = 0; d < ring.dims_size(); ++d) {
    const int dk = ring.dims(d);
    const bool above = d % 2 == 0;
    const int lift = 26 + 22 * (d / 2);
    for (int r = 0; r < ring.ranks_size() && dk > 1; ++r) {
      const int coord = (r / stride) % dk;
      const int next = r + ((coord + 1) % dk - coord) * stride;
      if (next < 0 || next >= ring.ranks_size()) continue;
      const Pos& a = pos[r];
      const Pos& b = pos[next];
      const bool cross_switch = a.sw != b.sw, cross_node = a.node != b.node;
      const int y = above ? a.y - 18 : a.y + 18;
      const int cy = above ? y - lift : y + lift;
      arcs << "<path d='M" << a.x << "," << y << " Q" << (a.x + b.x) / 2 << "," << cy << " " << b.x << "," << y
           << "' fill='none' stroke='" << colors[d % 4] << "' stroke-width='" << (cross_switch ? 3 : cross_node ? 2 : 1.2)
           << "'" << (cross_switch ? " stroke-dasharray='6 3'" : "") << " marker-end='url(#arrow" << d % 4
           << ")'><title>dim " << d << ": rank " << r << " -> " << next
           << (cross_switch ? " (crosses switches)" : cross_node ? " (crosses nodes)" : " (inside a node)")
           << "</title></path>";
    }
    stride *= std::max(1, dk);
  }
  std::ostringstream svg;
  svg << "<svg xmlns='http://www.w3.org/2000/svg' width='" << width << "' height='" << kTop * 2 - 10
      << "' font-family='sans-serif'><defs>";
  for (int i = 0; i < 4; ++i) {
    svg << "<marker id='arrow" << i << "' viewBox='0 0 6 6' refX='5' refY='3' markerWidth='9' markerHeight='9' "
        << "orient='auto' markerUnits='userSpaceOnUse'><path d='M0,0 L6,3 L0,6 z' fill='" << colors[i] << "'/></marker>";
  }
  svg << "</defs><text x='" << kPad << "' y='18' font-size='13'>ring " << htmlEscape(ring.topology())
      << " (DDL_TOPOLOGY) &#8212; " << htmlEscape(ring.why()) << "</text>";
  for (int d = 0; d < ring.dims_size() && d < 8; ++d) {
    svg << "<text x='" << kPad + d * 120 << "' y='36' font-size='11' fill='" << colors[d % 4] << "'>dim " << d
        << " (size " << ring.dims(d) << ")</text>";
  }
  svg << "<text x='" << kPad << "' y='" << kTop * 2 - 18
      << "' font-size='10' fill='#555'>thin: inside a node &#183; thick: across nodes &#183; dashed: across "
         "switches</text>";
  svg << boxes.str() << arcs.str();
  for (int r = 0; r < ring.ranks_size(); ++r) {
    svg << "<circle cx='" << pos[r].x << "' cy='" << pos[r].y << "' r='13' fill='#fff' stroke='#334155'/>"
        << "<text x='" << pos[r].x << "' y='" << pos[r].y + 4 << "' font-size='11' text-anchor='middle'>r" << r
        << "</text>";
  }
  svg << "</svg>";
  return svg.str();
}

std::string renderJobPage(const v1::Job& job, const v1::RingLayout* ring, const std::map<int, std::string>& logs,
                          int64_t now_ms, bool details_hidden) {
  static const char* kHidden = "<span class='muted'>(shown to the job's owner and admins only)</span>";
  std::ostringstream o;
  const std::string state = v1::JobState_Name(job.state());
  o << "<!doctype html><html><head><meta charset='utf-8'><title>" << htmlEscape(job.id()) << "</title>" << kStyle
    << "</head><body><p><a href='/'>&#8592; cluster</a></p><h1>" << htmlEscape(job.id()) << " "
    << htmlEscape(job.spec().name()) << " <span class='" << state << "'>" << state << "</span></h1>";
  if (job.has_failure()) {
    const auto& f = job.failure();
    o << "<div class='fail'><b>first failing rank " << f.rank() << "</b> on host <b>" << htmlEscape(f.host())
      << "</b>: " << (f.has_signal() ? "killed by signal " + std::to_string(f.signal())
                                     : "exit code " + std::to_string(f.exit_code()))
      << "<br>" << htmlEscape(job.reason()) << "</div>";
  }
  o << "<table><tr><th>user</th><td>" << htmlEscape(job.spec().user()) << "</td></tr><tr><th>command</th><td>";
  if (details_hidden) {
    o << kHidden;
  } else {
    o << "<code>";
    for (const auto& a : job.spec().command()) o << htmlEscape(a) << " ";
    o << "</code>";
  }
  o << "</td></tr><tr><th>GPUs</th><td>" << job.gpus() << "</td></tr><tr><th>topology</th><td>"
    << htmlEscape(job.topology()) << "</td></tr><tr><th>reason</th><td>" << htmlEscape(job.reason())
    << "</td></tr><tr><th>submitted</th><td>" << (now_ms - job.submit_ms()) / 1000 << " s ago</td></tr></table>";

  // Ranks by node and GPU, with what libddl last reported; the slowest last collective is highlighted.
  std::map<int, const v1::RankStatus*> status;
  for (const auto& r : job.ranks()) status[r.rank()] = &r;
  const int slowest = slowestRank(job);
  if (ring && ring->ranks_size() > 0) {
    o << "<h2>Ranks</h2><table id='ranks'><tr><th>rank</th><th>node</th><th>GPU</th><th>state</th>"
      << "<th>collectives</th><th>last</th><th>time</th><th>busbw GB/s</th><th>per dim (us)</th></tr>";
    for (const auto& slot : ring->ranks()) {
      auto it = status.find(slot.rank());
      const v1::RankStatus* st = it == status.end() ? nullptr : it->second;
      o << "<tr" << (slot.rank() == slowest && job.ranks_size() > 1 ? " class='slow' title='slowest rank'" : "")
        << "><td>" << slot.rank() << "</td><td>" << htmlEscape(slot.node()) << "</td><td>" << slot.gpu()
        << "</td><td>" << (st ? v1::RankStatus::State_Name(st->state()) : "-") << "</td>";
      if (st && st->has_progress()) {
        const auto& p = st->progress();
        std::string dims;
        for (double d : p.dims_us()) dims += (dims.empty() ? "" : ", ") + fixed(d, 0);
        o << "<td>" << p.collectives() << "</td><td>" << htmlEscape(p.last_op()) << " " << p.last_bytes()
          << " B (" << htmlEscape(p.last_algo()) << ")</td><td>" << fixed(p.last_us(), 1) << " us</td><td>"
          << fixed(lastBusBwGBps(p), 2) << "</td><td>" << (dims.empty() ? "-" : dims) << "</td>";
      } else {
        o << "<td colspan='5' class='muted'>no report</td>";
      }
      o << "</tr>";
    }
    o << "</table><h2>Ring layout</h2>" << renderRingSvg(*ring);
  }
  if (details_hidden) o << "<h2>Logs</h2><p>" << kHidden << "</p>";
  for (const auto& [rank, text] : logs) {
    o << "<h2>Log of rank " << rank << " (tail)</h2><pre>" << htmlEscape(text) << "</pre>";
  }
  o << "<h2>Transitions</h2><table>";
  for (const auto& t : job.transitions()) {
    o << "<tr><td>" << (t.at_ms() - job.submit_ms()) << " ms</td><td>" << v1::JobState_Name(t.to()) << "</td><td>"
      << htmlEscape(t.reason()) << "</td></tr>";
  }
  o << "</table><p class='muted'>JSON: <a href='/api/v1/jobs/" << htmlEscape(job.id()) << "'>/api/v1/jobs/"
    << htmlEscape(job.id()) << "</a></p></body></html>\n";
  return o.str();
}

}  // namespace ddl::coordinator::http
