// The dashboard's renderings (pages.h): Prometheus text, the API's JSON, the HTML pages and the ring's SVG.
#include "http/pages.h"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>

#include "common/signals.h"
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
.muted{color:#777;font-size:.85em}h3{font-size:.95em;margin:.3em 0}.charts{display:flex;flex-wrap:wrap;gap:1.5em}
.chart{flex:1 1 560px;min-width:320px;max-width:900px}.legend span{margin-right:.9em;font-size:.8em;white-space:nowrap}
.legend i{display:inline-block;width:.8em;height:.8em;margin-right:.25em;vertical-align:middle}
.slowline{background:#fde8e8;padding:.3em .6em;display:inline-block}form input,form select{margin-right:.6em}
.TIMEOUT,.CANCELLED{color:#6b7280}td:first-child{white-space:nowrap}</style>)";

// The charts' script, shared by both pages: plot(el, lines, opts) draws lines of [t_ms, value] points as an
// inline SVG (no library, no network), with a value axis, the time span, and a legend (24 names at most).
const char* kChartScript = R"(<script>
function esc(s){return String(s).replace(/[&<>"']/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));}
function hdur(ms){ms=Math.max(0,Math.round(ms));if(ms<1000)return (ms/1000).toFixed(2)+'s';const s=Math.floor(ms/1000),p=n=>String(n).padStart(2,'0');
 if(s<60)return s+'s';if(s<3600)return Math.floor(s/60)+'m '+p(s%60)+'s';if(s<86400)return Math.floor(s/3600)+'h '+p(Math.floor(s%3600/60))+'m';
 return Math.floor(s/86400)+'d '+p(Math.floor(s%86400/3600))+'h';}
function fmtRate(v){return v>=1e9?(v/1e9).toFixed(2)+' GB/s':v>=1e6?(v/1e6).toFixed(1)+' MB/s':v>=1e3?(v/1e3).toFixed(0)+' kB/s':v.toFixed(0)+' B/s';}
const PAL=['#2563eb','#16a34a','#d97706','#9333ea','#0891b2','#db2777','#65a30d','#7c3aed','#0d9488','#ea580c'];
function plot(el,lines,o){
 const W=Math.max(320,el.clientWidth||640),H=o.h||180,L=68,R=12,T=8,B=22;
 let t0=Infinity,t1=-Infinity,top=o.max||0;
 for(const l of lines)for(const p of l.pts){t0=Math.min(t0,p[0]);t1=Math.max(t1,p[0]);if(!o.max)top=Math.max(top,p[1]);}
 if(!isFinite(t0)){el.innerHTML='<div class="muted">'+esc(o.empty||'no samples yet')+'</div>';return;}
 if(t1<=t0)t1=t0+1000;if(top<=0)top=1;if(!o.max)top*=1.1;if(o.counts)top=Math.max(4,Math.ceil(top/4)*4);
 const X=t=>(L+(t-t0)/(t1-t0)*(W-L-R)).toFixed(1),Y=v=>(T+(1-v/top)*(H-T-B)).toFixed(1);
 let s='<svg width="'+W+'" height="'+H+'" font-size="10" font-family="sans-serif">';
 for(let i=0;i<=4;i++){const v=top*i/4,y=Y(v);s+='<line x1="'+L+'" x2="'+(W-R)+'" y1="'+y+'" y2="'+y+'" stroke="#e5e7eb"/>'+
  '<text x="'+(L-5)+'" y="'+(+y+3)+'" text-anchor="end" fill="#555">'+esc(o.fmt(v))+'</text>';}
 const tf=o.tfmt||(t=>new Date(t).toLocaleTimeString());
 s+='<text x="'+L+'" y="'+(H-5)+'" fill="#555">'+esc(tf(t0))+'</text><text x="'+(W-R)+'" y="'+(H-5)+
  '" fill="#555" text-anchor="end">'+esc(tf(t1))+' ('+esc(hdur(t1-t0))+' shown)</text>';
 for(const l of lines){if(!l.pts.length)continue;s+='<polyline fill="none" stroke="'+l.color+'" stroke-width="'+(l.bold?2.8:1.4)+'"'+
  (l.dash?' stroke-dasharray="5 3"':'')+' points="'+l.pts.map(p=>X(p[0])+','+Y(p[1])).join(' ')+'"><title>'+esc(l.name)+'</title></polyline>';}
 s+='</svg><div class="legend">';
 lines.slice(0,24).forEach(l=>{s+='<span><i style="background:'+l.color+'"></i>'+esc(l.name)+'</span>';});
 if(lines.length>24)s+='<span>and '+(lines.length-24)+' more</span>';
 el.innerHTML=s+'</div>';
}
</script>)";

// A Prometheus label value: backslash, quote and newline escaped (job ids never hold them; a bug must not
// break the exposition).
std::string labelValue(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '"') out += '\\';
    out += c == '\n' ? std::string("\\n") : std::string(1, c);
  }
  return out;
}

}  // namespace

std::string humanDuration(int64_t ms) {
  char buf[64];
  if (ms < 0) ms = 0;
  if (ms < 1000) {
    std::snprintf(buf, sizeof(buf), "%.2fs", ms / 1000.0);
    return buf;
  }
  const int64_t s = ms / 1000;
  if (s < 60) {
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  } else if (s < 3600) {
    std::snprintf(buf, sizeof(buf), "%lldm %02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else if (s < 86400) {
    std::snprintf(buf, sizeof(buf), "%lldh %02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lldd %02lldh", static_cast<long long>(s / 86400),
                  static_cast<long long>(s % 86400 / 3600));
  }
  return buf;
}

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
  // Every coordinator answers a scrape; only the leader has a cluster to tell of (sum or max over targets).
  const bool standby = m.state && m.state->standby;
  head("ddl_coordinator_leader", "gauge",
       "1 on the coordinator that leads (always, on SQLite), 0 on a standby waiting to take over.");
  o << "ddl_coordinator_leader " << (standby ? 0 : 1) << "\n";
  if (standby) {
    head("ddl_coordinator_store_info", "gauge", "Where the state lives (label store); always 1.");
    o << "ddl_coordinator_store_info{store=\"" << labelValue(m.state->store) << "\"} 1\n";
    return o.str();
  }
  head("ddl_nodes", "gauge", "Nodes by state.");
  for (const auto& [state, n] : m.nodes_by_state) o << "ddl_nodes{state=\"" << state << "\"} " << n << "\n";
  head("ddl_gpus", "gauge", "GPUs on UP and DRAINING nodes.");
  o << "ddl_gpus " << m.gpus_total << "\n";
  head("ddl_gpus_allocated", "gauge", "GPUs held by live jobs or by ranks still running.");
  o << "ddl_gpus_allocated " << m.gpus_allocated << "\n";
  head("ddl_gpus_faulted", "gauge", "GPUs taken out of placement by a fault until an admin clears them.");
  o << "ddl_gpus_faulted " << m.gpus_faulted.size() << "\n";
  head("ddl_gpu_faulted", "gauge", "1 for each faulted GPU, by node and index.");
  for (const auto& [node, gpu] : m.gpus_faulted)
    o << "ddl_gpu_faulted{node=\"" << node << "\",gpu=\"" << gpu << "\"} 1\n";
  head("ddl_jobs", "gauge", "Jobs by state.");
  for (const auto& [state, n] : m.jobs_by_state) o << "ddl_jobs{state=\"" << state << "\"} " << n << "\n";
  head("ddl_jobs_submitted_total", "counter", "Jobs accepted at submit since the coordinator started.");
  o << "ddl_jobs_submitted_total " << m.jobs_submitted_total << "\n";
  head("ddl_jobs_failed_total", "counter", "Jobs that ended FAILED since the coordinator started.");
  o << "ddl_jobs_failed_total " << m.jobs_failed_total << "\n";
  head("ddl_preemptions_total", "counter",
       "Running jobs preempted for a job of a higher QoS since the coordinator started.");
  o << "ddl_preemptions_total " << m.preemptions_total << "\n";
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
  if (m.state) {
    head("ddl_coordinator_store_info", "gauge", "Where the state lives (label store); always 1.");
    o << "ddl_coordinator_store_info{store=\"" << labelValue(m.state->store) << "\"} 1\n";
    if (m.state->reign > 0) {
      head("ddl_coordinator_leader_reign", "gauge",
           "The etcd revision that made this coordinator the leader (changes with every failover).");
      o << "ddl_coordinator_leader_reign " << m.state->reign << "\n";
      head("ddl_coordinator_etcd_lease_age_seconds", "gauge",
           "Seconds since the leader's etcd lease was renewed; near the lease means etcd is unreachable.");
      o << "ddl_coordinator_etcd_lease_age_seconds " << num(m.state->lease_age_s) << "\n";
      head("ddl_coordinator_etcd_lease_seconds", "gauge", "The leader's etcd lease.");
      o << "ddl_coordinator_etcd_lease_seconds " << m.state->lease_ttl_s << "\n";
    }
  }
  // Per account (the admins' tree: a bounded label set), since this coordinator started.
  head("ddl_account_gpu_seconds_total", "counter", "GPU-seconds held by an account's launched jobs.");
  for (const auto& [account, s] : m.account_gpu_seconds) {
    o << "ddl_account_gpu_seconds_total{account=\"" << labelValue(account) << "\"} " << num(s) << "\n";
  }
  head("ddl_account_attempts_total", "counter",
       "Launch attempts of an account's jobs that ended, by how (SUCCEEDED, FAILED, CANCELLED, TIMEOUT, "
       "REQUEUED).");
  for (const auto& [key, n] : m.account_attempts) {
    o << "ddl_account_attempts_total{account=\"" << labelValue(key.first) << "\",end=\""
      << labelValue(key.second) << "\"} " << n << "\n";
  }
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
      {"ddl_job_collective_bytes_total", "counter", "Bytes of collectives of a placed job's current attempt.",
       [](const JobFigures& f) { return num(f.bytes); }},
      {"ddl_job_collective_seconds_total", "counter",
       "Time a placed job's ranks spent in collectives (this attempt).",
       [](const JobFigures& f) { return num(f.seconds); }},
      {"ddl_job_gpus", "gauge", "GPUs a placed job asks for.",
       [](const JobFigures& f) { return std::to_string(f.gpus); }},
      {"ddl_job_ranks_reporting", "gauge", "Ranks of a placed job that reported in the last 30 s.",
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
  return std::string(R"(<!doctype html><html><head><meta charset="utf-8"><title>ddl cluster</title>)") +
         kStyle + kChartScript +
         R"(</head><body><h1>ddl cluster</h1><div class="muted" id="updated">loading...</div><div class="muted" id="state"></div>
<div class="charts"><div class="chart"><h3>GPUs in use</h3><div id="chart-gpus"></div></div>
<div class="chart"><h3>Jobs by state</h3><div id="chart-jobs"></div></div>
<div class="chart"><h3>GPU-hours per account and day (30 days, UTC)</h3><div id="chart-usage"></div></div></div>
<h2>Nodes</h2><table id="nodes"><thead><tr><th>NAME</th><th>STATE</th><th>GPUS USED/TOTAL</th><th>CPUS</th><th>MEMORY</th><th>LABELS</th>
<th>LAST HEARTBEAT</th><th>JOBS</th></tr></thead><tbody></tbody></table>
<h2>Live jobs</h2><table id="live"><thead><tr><th>ID</th><th>NAME</th><th>USER</th><th>STATE</th><th>SUBMITTED</th>
<th>RUNNING FOR</th><th>GPUS</th><th>NODES OR REASON</th></tr></thead><tbody></tbody></table>
<h2>Job history</h2><form id="filters" method="get" action="/"><select name="state"><option value="">any state</option>
</select><input name="user" placeholder="user" size="12"><input name="name" placeholder="name" size="16">
<button>Filter</button> <a href="/">clear</a></form>
<table id="jobs"><thead><tr><th>ID</th><th>NAME</th><th>USER</th><th>STATE</th><th>SUBMITTED</th><th>RAN FOR</th>
<th>GPUS</th><th>NODES OR REASON</th></tr></thead><tbody></tbody></table><p id="pager"></p>
<p class="muted">JSON: <a href="/api/v1/nodes">/api/v1/nodes</a> <a href="/api/v1/jobs">/api/v1/jobs</a>
<a href="/api/v1/cluster/series">/api/v1/cluster/series</a> <a href="/api/v1/state">/api/v1/state</a>
<a href="/api/v1/usage">/api/v1/usage</a> &middot;
<a href="/metrics">/metrics</a></p>
<script>
const STATES=['PENDING','SCHEDULED','STARTING','RUNNING','SUCCEEDED','FAILED','CANCELLED','TIMEOUT'];
const SCOLOR={PENDING:'#d97706',SCHEDULED:'#0891b2',STARTING:'#7c3aed',RUNNING:'#16a34a',SUCCEEDED:'#2563eb',FAILED:'#dc2626',CANCELLED:'#6b7280',TIMEOUT:'#db2777'};
const q=new URLSearchParams(location.search);
const sel=document.querySelector('#filters select');
STATES.forEach(s=>{const o=document.createElement('option');o.value=s.toLowerCase();o.textContent=s.toLowerCase();sel.appendChild(o);});
sel.value=(q.get('state')||'').toLowerCase();
for(const k of ['user','name'])document.querySelector('#filters [name='+k+']').value=q.get(k)||'';
function hbytes(b){b=Number(b)||0;const u=['B','KiB','MiB','GiB','TiB','PiB'];let i=0;while(i<5&&b>=1024){b/=1024;i++;}
 return (i&&Math.abs(b-Math.round(b))>=0.05?b.toFixed(1):Math.round(b))+' '+u[i];}
function ago(ms){return ms>0?hdur(Date.now()-ms)+' ago':'-';}
function started(x){if(Number(x.start_ms||0)>0)return Number(x.start_ms);const t=(x.transitions||[]).filter(t=>t.to==='RUNNING').pop();return t?Number(t.at_ms):0;}
function ran(x){const s=started(x),e=Number(x.end_ms||0);return s>0?hdur((e>0?e:Date.now())-s):'-';}
function row(cells){return '<tr>'+cells.map(c=>'<td>'+c+'</td>').join('')+'</tr>';}
function jobRow(x){return row(['<a href="/jobs/'+esc(x.id)+'">'+esc(x.id)+'</a>',esc(x.spec.name),esc(x.spec.user),
 '<span class="'+esc(x.state)+'">'+esc(x.state)+(x.held?' (held)':'')+'</span>',ago(Number(x.submit_ms)),ran(x),x.gpus,
 (x.allocation||[]).length&&x.state!=='FAILED'?esc(x.allocation.map(a=>a.node).join(',')):'('+esc((x.reason_code?x.reason_code+': ':'')+x.reason)+')']);}
function historyQuery(token){const p=new URLSearchParams();for(const k of ['state','user','name'])if(q.get(k))p.set(k,q.get(k));
 if(token)p.set('page_token',token);return p;}
async function refresh(){
 try{
  const h=historyQuery(q.get('page_token'));h.set('page_size','50');h.set('order','newest');
  const [n,live,hist,cs]=await Promise.all([fetch('/api/v1/nodes').then(r=>r.json()),
   fetch('/api/v1/jobs?state=pending,scheduled,starting,running').then(r=>r.json()),
   fetch('/api/v1/jobs?'+h).then(r=>r.json()),fetch('/api/v1/cluster/series').then(r=>r.json())]);
  document.querySelector('#nodes tbody').innerHTML=(n.nodes||[]).map(x=>row([esc(x.name),
   '<span class="'+esc(x.state)+'">'+esc(x.state)+(x.drained&&x.state==='DOWN'?' (drained)':'')+(x.connected?'':' (disconnected)')+'</span>'+
    (x.warning?' <span class="FAILED" title="'+esc(x.warning)+'">(warning: '+esc(x.warning.split(':')[0])+')</span>':''),
   (x.gpus_used||[]).length+'/'+(x.gpus||[]).length+((x.gpu_faults||[]).length?' <span class="FAILED" title="'+
    esc((x.gpu_faults||[]).map(f=>'gpu'+(f.gpu||0)+': '+f.reason).join('\n'))+'">('+(x.gpu_faults||[]).length+' faulted)</span>':'')+((x.gpus||[]).some(g=>g.island!==undefined||g.numa_node!==undefined)?
    ' <span class="muted" title="'+esc((x.gpus||[]).map(g=>'gpu'+(g.index||0)+': numa '+(g.numa_node??'-')+', NVLink island '+(g.island??'-')+
    ', nic '+(g.nic||'-')).join('\n'))+'">('+new Set((x.gpus||[]).map(g=>g.island)).size+' NVLink islands)</span>':''),
   ((x.cpus||[]).length?(x.cpus_used||[]).length+'/'+(x.cpus||[]).length:'-')+
    (x.confinement&&!x.confinement.startsWith('cgroups v2')?' <span class="muted" title="'+esc(x.confinement)+'">(no cgroups)</span>':''),
   Number(x.memory_bytes)>0?hbytes(x.memory_used_bytes)+'/'+hbytes(x.memory_bytes):'-',
   esc(Object.entries(x.labels||{}).sort((a,b)=>a[0]<b[0]?-1:a[0]>b[0]?1:0).map(([k,v])=>k+'='+v).join(',')),
   x.last_heartbeat_ms>0?ago(Number(x.last_heartbeat_ms)):'never',
   (x.jobs||[]).map(id=>'<a href="/jobs/'+esc(id)+'">'+esc(id)+'</a>').join(' ')])).join('');
  document.querySelector('#live tbody').innerHTML=(live.jobs||[]).slice().reverse().map(jobRow).join('')||
   '<tr><td colspan="8" class="muted">no live jobs</td></tr>';
  if(hist.error){document.querySelector('#jobs tbody').innerHTML='<tr><td colspan="8">'+esc(hist.error)+'</td></tr>';}
  else{document.querySelector('#jobs tbody').innerHTML=(hist.jobs||[]).map(jobRow).join('')||'<tr><td colspan="8" class="muted">no jobs match</td></tr>';
   let pager='';if(q.get('page_token'))pager+='<a href="/?'+esc(historyQuery('').toString())+'">&#8676; first page</a> ';
   if(hist.next_page_token)pager+='<a id="next" href="/?'+esc(historyQuery(hist.next_page_token).toString())+'">next page &#8594;</a>';
   document.getElementById('pager').innerHTML=pager;}
  const t=(cs.t_ms||[]).map(Number);
  plot(document.getElementById('chart-gpus'),[{name:'in use',color:'#16a34a',bold:true,pts:t.map((x,i)=>[x,cs.gpus_used[i]])},
   {name:'total (nodes not DOWN)',color:'#6b7280',dash:true,pts:t.map((x,i)=>[x,cs.gpus_total[i]])}],{fmt:v=>v.toFixed(0),counts:true,empty:'the first point comes within 5 s'});
  const js=cs.jobs||{};
  plot(document.getElementById('chart-jobs'),Object.keys(js).sort((a,b)=>STATES.indexOf(a)-STATES.indexOf(b)).filter(k=>js[k].some(v=>v>0))
   .map(k=>({name:k,color:SCOLOR[k]||'#111',bold:k==='RUNNING',pts:t.map((x,i)=>[x,js[k][i]])})),{fmt:v=>v.toFixed(0),counts:true,empty:'the first point comes within 5 s'});
  fetch('/api/v1/usage?days=30').then(r=>r.json()).then(u=>{const by={};
   for(const r of (u.rows||[])){const d=Date.parse(r.day+'T00:00:00Z');(by[r.account]=by[r.account]||{})[d]=(Number(r.gpu_seconds)||0)/3600;}
   const d0=Date.parse((u.first_day||'1970-01-01')+'T00:00:00Z'),d1=Date.parse((u.last_day||'1970-01-01')+'T00:00:00Z'),days=[];
   for(let d=d0;d<=d1&&days.length<400;d+=86400000)days.push(d);
   plot(document.getElementById('chart-usage'),Object.keys(by).sort().map((a,i)=>({name:a,color:PAL[i%PAL.length],pts:days.map(d=>[d,by[a][d]||0])})),
    {fmt:v=>v.toFixed(1),tfmt:t=>new Date(t).toISOString().slice(0,10),empty:u.error||'no attempt has ended in 30 days'});}).catch(()=>{});
  document.getElementById('updated').textContent='updated '+new Date().toLocaleTimeString();
  fetch('/api/v1/state').then(r=>r.json()).then(st=>{document.getElementById('state').textContent='state: '+(st.store||'')+
   (st.leader_reign?', leading (reign '+st.leader_reign+'), etcd lease renewed '+Number(st.lease_age_s).toFixed(1)+' s ago of '+st.lease_s:'')+
   (st.store_healthy?'':' - cannot store: '+st.store_error);}).catch(()=>{});
 }catch(e){document.getElementById('updated').textContent='cannot reach the coordinator: '+e;}
}
refresh();setInterval(refresh,3000);
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

namespace {

std::string bytesText(double bytes) {
  char buf[64];
  if (bytes >= 1e12) {
    std::snprintf(buf, sizeof(buf), "%.2f TB", bytes / 1e12);
  } else if (bytes >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2f GB", bytes / 1e9);
  } else if (bytes >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.1f MB", bytes / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.0f B", bytes);
  }
  return buf;
}

bool isFinal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED || s == v1::TIMEOUT;
}

// The page's script: the charts from /api/v1/jobs/ID/series, the logs kept at their end, and while the job is
// live the page's own parts re-read and swapped in place.
const char* kJobScript = R"(<script>
const JOB=document.body.dataset.job;let SLOW=-1;
// The ranks table marks the rank the series name (once they do), so the page names one slow rank.
function markSlow(){if(SLOW<0)return;document.querySelectorAll('#ranks tr').forEach(tr=>{const c=tr.cells[0];if(!c||tr.querySelector('th'))return;
 const me=c.textContent===String(SLOW);tr.classList.toggle('slow',me);if(me)tr.title='slowest rank';else tr.removeAttribute('title');});}
function logsState(){const m={};document.querySelectorAll('pre.log').forEach(p=>{m[p.id]={end:p.scrollTop+p.clientHeight>=p.scrollHeight-8,top:p.scrollTop};});return m;}
function restoreLogs(m){document.querySelectorAll('pre.log').forEach(p=>{const k=m[p.id];p.scrollTop=!k||k.end?p.scrollHeight:k.top;});}
async function series(){
 try{
  const s=await fetch('/api/v1/jobs/'+encodeURIComponent(JOB)+'/series').then(r=>r.json());
  if(s.error)throw s.error;
  const ranks=(s.ranks||[]).slice().sort((a,b)=>a.rank-b.rank);
  const lines=key=>{const l=ranks.map((r,i)=>({slow:r.rank===s.slow_rank,name:'rank '+r.rank+(r.rank===s.slow_rank?' (slow)':''),
   color:r.rank===s.slow_rank?'#dc2626':PAL[i%PAL.length],bold:r.rank===s.slow_rank,pts:r.t_ms.map((t,j)=>[Number(t),r[key][j]])}));
   return l.filter(x=>!x.slow).concat(l.filter(x=>x.slow));};
  const none=ranks.length?'waiting for a second report':document.body.dataset.live==='1'?
   'no telemetry from this job yet (ranks report through libddl)':'no series kept (the coordinator keeps those of the last 64 ended jobs, in memory)';
  plot(document.getElementById('chart-bw'),lines('bytes_per_s'),{fmt:fmtRate,empty:none});
  plot(document.getElementById('chart-busy'),lines('busy_fraction'),{fmt:v=>(v*100).toFixed(0)+'%',max:1,empty:none});
  const slow=document.getElementById('slow');
  slow.className=s.slow_rank>=0?'slowline':'muted';
  slow.textContent=s.slow_rank>=0?'Slow rank: '+s.slow_why:'No slow rank named: '+(s.slow_why||'fewer than two ranks have figures.');
  SLOW=s.slow_rank;markSlow();
 }catch(e){document.getElementById('slow').textContent='series not available: '+e;}
}
async function reload(){
 try{
  const d=new DOMParser().parseFromString(await fetch(location.pathname).then(r=>r.text()),'text/html');
  const m=logsState();
  for(const id of ['top','bottom']){const n=d.getElementById(id);if(n)document.getElementById(id).replaceWith(n);}
  document.body.dataset.live=d.body.dataset.live||'0';
  restoreLogs(m);markSlow();
 }catch(e){}
}
restoreLogs({});series();
setInterval(()=>{if(document.body.dataset.live==='1'){series();reload();}},4000);
</script>)";

}  // namespace

namespace {

constexpr const char* kHidden = "<span class='muted'>(shown to the job's owner and admins only)</span>";

// The page's head and the job's summary: state, the first failure, user, command, GPUs, times.
void writeJobSummary(std::ostream& o, const v1::Job& job, int64_t now_ms, bool details_hidden) {
  const std::string state = v1::JobState_Name(job.state());
  o << "<!doctype html><html><head><meta charset='utf-8'><title>" << htmlEscape(job.id()) << "</title>"
    << kStyle << kChartScript << "</head><body data-job='" << htmlEscape(job.id()) << "' data-live='"
    << (isFinal(job.state()) ? 0 : 1) << "'><p><a href='/'>&#8592; cluster</a></p><div id='top'><h1>"
    << htmlEscape(job.id()) << " " << htmlEscape(job.spec().name()) << " <span class='" << state << "'>"
    << state << (job.held() ? " (held)" : "") << "</span></h1>";
  if (job.has_failure()) {
    const auto& f = job.failure();
    o << "<div class='fail'><b>first failing rank " << f.rank() << "</b> on host <b>" << htmlEscape(f.host())
      << "</b>: "
      << (f.has_signal() ? "killed by " + signalName(f.signal())
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
    << htmlEscape(job.topology()) << "</td></tr><tr><th>account</th><td>" << htmlEscape(job.spec().account())
    << "</td></tr><tr><th>reason</th><td>"
    << htmlEscape(job.reason_code().empty() ? job.reason() : job.reason_code() + ": " + job.reason())
    << "</td></tr><tr><th>submitted</th><td>" << humanDuration(now_ms - job.submit_ms()) << " ago</td></tr>";
  // Job.start_ms where the coordinator fills it, else the latest move to RUNNING.
  int64_t start_ms = job.start_ms();
  for (const auto& t : job.transitions()) {
    if (job.start_ms() == 0 && t.to() == v1::RUNNING) start_ms = t.at_ms();
  }
  if (start_ms > 0) {
    o << "<tr><th>started</th><td>" << humanDuration(start_ms - job.submit_ms()) << " after submit</td></tr>"
      << "<tr><th>" << (job.end_ms() > 0 ? "ran for" : "running for") << "</th><td>"
      << humanDuration((job.end_ms() > 0 ? job.end_ms() : now_ms) - start_ms) << "</td></tr>";
  }
  if (job.end_ms() > 0)
    o << "<tr><th>ended</th><td>" << humanDuration(now_ms - job.end_ms()) << " ago</td></tr>";
  o << "</table></div>";
}

// Ranks by node and GPU, with what libddl last reported; the straggler (slowestRank) is highlighted.
void writeRankFigures(std::ostream& o, const v1::Job& job, const v1::RingLayout& ring,
                      const std::map<int, const v1::RankStatus*>& status) {
  const int slowest = slowestRank(job);
  o << "<h2>Ranks</h2><table id='ranks'><tr><th>rank</th><th>node</th><th>GPU</th><th>state</th>"
    << "<th>collectives</th><th>last</th><th>time</th><th>busbw GB/s</th><th>per dim (us)</th></tr>";
  for (const auto& slot : ring.ranks()) {
    auto it = status.find(slot.rank());
    const v1::RankStatus* st = it == status.end() ? nullptr : it->second;
    o << "<tr"
      << (slot.rank() == slowest ? " class='slow' title='the straggler: least time in collectives'" : "")
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
  o << "</table>";
}

// The rank processes as the coordinator keeps them (after the job ended too): whatever fields are there.
void writeRankProcesses(std::ostream& o, const v1::Job& job, const v1::RingLayout* ring,
                        const std::map<int, const v1::RankStatus*>& status, int64_t now_ms) {
  std::map<int, std::string> ring_node;  // where Job.ranks has no node yet
  if (ring) {
    for (const auto& slot : ring->ranks()) ring_node[slot.rank()] = slot.node();
  }
  if (job.ranks_size() > 0) {
    o << "<h2>Rank processes</h2><table id='processes'><tr><th>rank</th><th>node</th><th>GPU</th><th>pid</th>"
      << "<th>program pid</th><th>state</th><th>exit</th><th>started</th><th>ended</th><th>ran for</th>"
      << "<th>collectives</th><th>bytes</th><th>in collectives</th></tr>";
    for (const auto& [rank, r] : status) {
      std::string exit = "-";
      if (r->has_signal()) {
        exit = signalName(r->signal());
      } else if (r->has_exit_code()) {
        exit = "exit " + std::to_string(r->exit_code());
      }
      if (!r->error().empty()) exit += " (" + r->error() + ")";
      auto since_submit = [&](int64_t ms) {
        return ms > 0 ? "+" + humanDuration(ms - job.submit_ms()) : "-";
      };
      const bool bad = r->has_signal() || (r->has_exit_code() && r->exit_code() != 0);
      o << "<tr" << (bad ? " class='slow'" : "") << "><td>" << rank << "</td><td>"
        << htmlEscape(r->node().empty() ? ring_node[rank] : r->node()) << "</td><td>" << r->gpu()
        << "</td><td>" << (r->pid() > 0 ? std::to_string(r->pid()) : "-") << "</td><td>"
        << (r->program_pid() > 0 ? std::to_string(r->program_pid()) : "-") << "</td><td>"
        << v1::RankStatus::State_Name(r->state()) << "</td><td>" << htmlEscape(exit) << "</td><td>"
        << since_submit(r->started_ms()) << "</td><td>" << since_submit(r->exited_ms()) << "</td><td>"
        << (r->started_ms() > 0
                ? humanDuration((r->exited_ms() > 0 ? r->exited_ms() : now_ms) - r->started_ms())
                : "-")
        << "</td>";
      if (r->has_progress()) {
        o << "<td>" << r->progress().collectives() << "</td><td>"
          << bytesText(static_cast<double>(r->progress().bytes())) << "</td><td>"
          << humanDuration(static_cast<int64_t>(r->progress().seconds() * 1000)) << "</td>";
      } else {
        o << "<td colspan='3' class='muted'>no report</td>";
      }
      o << "</tr>";
    }
    o << "</table>";
  } else if (isFinal(job.state())) {
    o << "<h2>Rank processes</h2><p class='muted'>no rank records were kept for this job</p>";
  }
}

}  // namespace

std::string renderJobPage(const v1::Job& job, const v1::RingLayout* ring,
                          const std::map<int, std::string>& logs, int64_t now_ms, bool details_hidden) {
  std::ostringstream o;
  writeJobSummary(o, job, now_ms, details_hidden);
  o << "<h2>Collectives over time</h2><div class='charts'><div class='chart'><h3>Throughput per rank "
       "(collective "
       "bytes per second)</h3><div id='chart-bw'></div></div><div class='chart'><h3>Time in collectives per "
       "rank"
       "</h3><div id='chart-busy'></div></div></div><p id='slow' class='muted'>loading the series...</p>";

  o << "<div id='bottom'>";
  std::map<int, const v1::RankStatus*> status;
  for (const auto& r : job.ranks()) status[r.rank()] = &r;
  if (ring && ring->ranks_size() > 0) {
    // The ring's ranks by where they run: an elastic job that shrank or grew numbers its ranks by launch (a
    // joiner is rank 4 of a job of 4), and its ring, rebuilt from what it holds, counts from 0. Each GPU's
    // latest rank.
    std::map<std::pair<std::string, int>, const v1::RankStatus*> at;
    for (const auto& r : job.ranks()) at[{r.node(), r.gpu()}] = &r;
    std::map<int, const v1::RankStatus*> by_slot;
    for (const auto& slot : ring->ranks())
      if (auto it = at.find({slot.node(), slot.gpu()}); it != at.end()) by_slot[slot.rank()] = it->second;
    writeRankFigures(o, job, *ring, by_slot);
  }
  writeRankProcesses(o, job, ring, status, now_ms);
  if (ring && ring->ranks_size() > 0) o << "<h2>Ring layout</h2>" << renderRingSvg(*ring);
  if (details_hidden) o << "<h2>Logs</h2><p>" << kHidden << "</p>";
  for (const auto& [rank, text] : logs) {
    o << "<h2>Log of rank " << rank << " (tail)</h2><pre class='log' id='log-" << rank << "'>"
      << htmlEscape(text) << "</pre>";
  }
  o << "<h2>Transitions</h2><table>";
  for (const auto& t : job.transitions()) {
    o << "<tr><td>+" << humanDuration(t.at_ms() - job.submit_ms()) << "</td><td>" << v1::JobState_Name(t.to())
      << "</td><td>" << htmlEscape(t.reason()) << "</td></tr>";
  }
  o << "</table></div><p class='muted'>JSON: <a href='/api/v1/jobs/" << htmlEscape(job.id())
    << "'>/api/v1/jobs/" << htmlEscape(job.id()) << "</a> <a href='/api/v1/jobs/" << htmlEscape(job.id())
    << "/series'>/api/v1/jobs/" << htmlEscape(job.id()) << "/series</a></p>" << kJobScript
    << "</body></html>\n";
  return o.str();
}

}  // namespace ddl::coordinator::http
