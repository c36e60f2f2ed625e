#!/usr/bin/env bash
# The dashboard end to end: a coordinator and two agents on 127.0.0.1 over mutual TLS (a PKI made with init-pki
# in the scratch directory, a node certificate per agent), a running 4-rank job submitted with a user's token
# (a ddlctl user made with the admin token; as root, also a throwaway account of the same name, ddlt-<pid>, that
# the ranks can run as, removed on exit), then
#  - the job's series (/api/v1/jobs/ID/series) fills with every rank's throughput, and the cluster's series
#    (/api/v1/cluster/series, a point per 5 s) with a few points;
#  - headless Chromium renders / (nodes, the job, the cluster charts, drawn by the page's own JavaScript) and
#    /jobs/ID (ranks, per-rank charts, slow rank, ring picture), and takes screenshots (into $DDL_SCREENSHOT_DIR
#    when set, e.g. docs/);
#  - /metrics is parsed with the Prometheus client library's parser and checked against the cluster (the per-job
#    ddl_job_* families too);
#  - bad URLs and methods get 404/405 and the server stays healthy;
#  - 80 clients that never finish a request header do not keep /healthz, /metrics or a job page from answering.
# Skips (exit 77) with a reason when chromium or python3-prometheus-client is missing.
#
#   tests/e2e/dashboard_test.sh BIN_DIR
set -euo pipefail
unset DDL_TOKEN DDL_TOKEN_FILE DDL_CA DDL_COORDINATOR  # the caller's ddlctl settings ($DDL_TOKEN beats --token-file)
bin=$(cd "${1:-$(dirname "$0")/../../build/bin}" && pwd)
command -v chromium >/dev/null || { echo "skipped: chromium is not installed (scripts/bootstrap installs it)"; exit 77; }
# Debian's python3 (which has python3-prometheus-client), not one that a user's PATH may put first.
py=/usr/bin/python3
[[ -x "$py" ]] || py=python3
"$py" -c 'import prometheus_client' 2>/dev/null ||
  { echo "skipped: python3-prometheus-client is not installed"; exit 77; }

tmp=$(mktemp -d /tmp/ddl-dash-test.XXXXXX)
chmod 755 "$tmp"
pids=()
user=
made_user=0
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do timeout 15 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null || true; done
  if ((made_user)) && ! userdel "$user" 2>/dev/null && ! userdel -f "$user"; then
    echo "could not remove the account $user" >&2
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$tmp"/*.log; do echo "--- $f" >&2; tail -20 "$f" >&2; done
  exit 1
}
wait_file() { for _ in $(seq 100); do [[ -s "$1" ]] && return 0; sleep 0.1; done; return 1; }

# The job's user: the ranks run as the account named like the token's user (as the agent's own user until the
# agent switches users), so as root that is a throwaway account whose home is the job's workdir; otherwise
# whoever runs the test.
mkdir "$tmp/work"
if [[ $(id -u) -eq 0 ]]; then
  command -v useradd >/dev/null || { echo "skipped: useradd is missing (Debian package passwd)"; exit 77; }
  user=ddlt-$$
  useradd --home-dir "$tmp/work" --no-create-home --shell /usr/sbin/nologin \
    --comment "ddl dashboard_e2e, removed on exit" "$user" || fail "useradd $user failed"
  made_user=1
  runuser -u "$user" -- test -x "$bin/ddl-bench" ||
    fail "$user cannot run $bin/ddl-bench (a directory above it is private)"
else
  user=$(id -un)
fi
chown "$user:" "$tmp/work"

pki=$tmp/pki
"$bin/ddl-coordinator" init-pki "$pki" >"$tmp/init-pki.log" 2>&1 || fail "ddl-coordinator init-pki failed"
for i in 1 2; do
  "$bin/ddl-coordinator" --pki-dir "$pki" issue-node "n$i" --out "$tmp/pki-n$i" >>"$tmp/init-pki.log" 2>&1 ||
    fail "ddl-coordinator issue-node n$i failed"
done
"$bin/ddl-coordinator" --pki-dir "$pki" --listen 127.0.0.1:0 --http 127.0.0.1:0 --data-dir "$tmp/c" \
  >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
wait_file "$tmp/c/coordinator.addr" || fail "the coordinator did not start"
wait_file "$tmp/c/coordinator.http" || fail "the coordinator wrote no http address"
grpc=$(cat "$tmp/c/coordinator.addr")
web=http://$(cat "$tmp/c/coordinator.http")
echo "coordinator $grpc (TLS), dashboard $web"
admin() { "$bin/ddlctl" --coordinator "$grpc" --ca "$pki/ca.crt" --token-file "$pki/admin.token" "$@"; }
ctl() { "$bin/ddlctl" --coordinator "$grpc" --ca "$pki/ca.crt" --token-file "$tmp/user.token" "$@"; }
(umask 077 && admin -o json admin add-user "$user" | "$py" -c 'import json, sys; print(json.load(sys.stdin)["token"])' \
  >"$tmp/user.token") || fail "ddlctl admin add-user $user failed"
[[ $(ctl whoami) == "$user user"* ]] || fail "whoami with $user's token: $(ctl whoami 2>&1)"
for i in 1 2; do
  "$bin/ddl-agent" --coordinator "$grpc" --node "n$i" --pki-dir "$tmp/pki-n$i" --address 127.0.0.1 \
    --labels "rack=r1,switch=s$i" --virtual-gpus 2 --force-virtual --data-dir "$tmp/n$i" \
    --port-range "3$((3 + i))000-3$((3 + i))099" --stop-ranks-on-exit >"$tmp/agent-n$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 100); do [[ $(admin nodes | grep -c ' UP ') == 2 ]] && break; sleep 0.1; done
[[ $(admin nodes | grep -c ' UP ') == 2 ]] || fail "the agents did not register"
job=$(ctl submit --name dash-bench --nodes 2 --gpus-per-node 2 --workdir "$tmp/work" -- \
  "$bin/ddl-bench" -b 256K -e 256K -n 200000 -w 1 -a mdring)
grep -q "^User: *$user\$" <<<"$(ctl status "$job")" || fail "job $job is not $user's"
for _ in $(seq 200); do ctl status "$job" | grep -q 'State: *RUNNING' && break; sleep 0.1; done
ctl status "$job" | grep -q 'State: *RUNNING' || fail "job $job is not running"
# Every rank must have reported its progress at least once (a '-' in COLLECTIVES means not yet).
for _ in $(seq 100); do
  [[ $(ctl status "$job" | sed -n '/^Ranks/,/^Transitions/p' | awk '$2 == "RUNNING" && $4 != "-"' | wc -l) == 4 ]] && break
  sleep 0.1
done

# The plots need a few samples: every rank 3 intervals (a sample a second or so), the cluster 3 points (one per 5 s).
series_ready() {
  "$py" - "$web" "$job" <<'PY'
import json, sys, urllib.request
web, job = sys.argv[1], sys.argv[2]
s = json.load(urllib.request.urlopen(web + "/api/v1/jobs/" + job + "/series", timeout=5))
c = json.load(urllib.request.urlopen(web + "/api/v1/cluster/series", timeout=5))
ok = len(s["ranks"]) == 4 and all(len(r["t_ms"]) >= 3 and r["bytes_per_s"][-1] > 0 for r in s["ranks"])
# Ranks of one ddl-bench are alike: a slow rank is named only where one stands out; the reason is there always.
sys.exit(0 if ok and len(c["t_ms"]) >= 3 and c["gpus_used"][-1] == 4 and s["slow_why"] else 1)
PY
}
for _ in $(seq 150); do series_ready && break; sleep 0.2; done
series_ready || fail "the series of $job or of the cluster did not fill"

chrome() { timeout 60 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars \
  --virtual-time-budget=5000 "$@" 2>/dev/null; }
index=$(chrome --dump-dom "$web/")
for want in "n1" "n2" "$job" "dash-bench" "2/2" "<polyline" "in use" "RUNNING"; do
  grep -q -- "$want" <<<"$index" || fail "/ as rendered by Chromium lacks '$want'"
done
page=$(chrome --dump-dom "$web/jobs/$job")
for want in "<svg" ">r3<" "Ring layout" "crosses switches" "low rank" "Using ranks" "<polyline" \
  "class=\"log\""; do
  grep -q -- "$want" <<<"$page" || fail "/jobs/$job lacks '$want'"
done
shots=${DDL_SCREENSHOT_DIR:-$tmp}
chrome --window-size=1400,1000 --screenshot="$shots/dashboard.png" "$web/" >/dev/null
chrome --window-size=1400,1000 --screenshot="$shots/dashboard-job.png" "$web/jobs/$job" >/dev/null
[[ -s "$shots/dashboard.png" && -s "$shots/dashboard-job.png" ]] || fail "no screenshot"
echo "pages render; screenshots in $shots"

"$py" - "$web" "$job" <<'PY' || fail "metrics or HTTP checks"
import sys, urllib.request, urllib.error
from prometheus_client.parser import text_string_to_metric_families
web, job = sys.argv[1], sys.argv[2]
text = urllib.request.urlopen(web + "/metrics", timeout=10).read().decode()
samples = {}
for family in text_string_to_metric_families(text):
    assert family.name.startswith("ddl_"), family.name
    for s in family.samples:
        samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
def get(name, **labels):
    return samples[(name, tuple(sorted(labels.items())))]
checks = [("ddl_nodes", {"state": "UP"}, 2), ("ddl_nodes", {"state": "DOWN"}, 0), ("ddl_gpus", {}, 4),
          ("ddl_gpus_allocated", {}, 4), ("ddl_jobs", {"state": "RUNNING"}, 1), ("ddl_jobs", {"state": "FAILED"}, 0),
          ("ddl_jobs_submitted_total", {}, 1), ("ddl_scheduling_latency_seconds_count", {}, 1),
          ("ddl_coordinator_store_healthy", {}, 1)]
for name, labels, want in checks:
    got = get(name, **labels)
    assert got == want, f"{name}{labels} = {got}, want {want}"
assert get("ddl_collective_bytes_total") > 0, "no collective bytes reported by the ranks"
assert get("ddl_job_collective_bytes_total", job=job) > 0, "no per-job collective bytes"
assert get("ddl_job_collective_seconds_total", job=job) > 0, "no per-job collective seconds"
assert get("ddl_job_gpus", job=job) == 4
assert get("ddl_job_ranks_reporting", job=job) == 4
assert get("ddl_heartbeat_lag_seconds") < 5
def status(method, path):
    req = urllib.request.Request(web + path, method=method)
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
for method, path, want in [("GET", "/nope", 404), ("GET", "/jobs/j-999999", 404), ("GET", "/jobs/../../etc/passwd", 404),
                           ("GET", "/api/v1/jobs/xyz", 404), ("GET", "/api/v1/jobs?state=BOGUS", 400),
                           ("GET", "/api/v1/jobs?state=running", 200), ("GET", "/api/v1/cluster/series", 200),
                           ("GET", "/api/v1/usage?days=2", 200),
                           ("GET", "/api/v1/jobs/" + job + "/series", 200),
                           ("POST", "/", 405), ("GET", "/api/v1/jobs/" + job, 200), ("GET", "/healthz", 200)]:
    got = status(method, path)
    assert got == want, f"{method} {path}: {got}, want {want}"
import socket
host, port = web[len("http://"):].rsplit(":", 1)
s = socket.create_connection((host, int(port)), timeout=5)
s.sendall(b"GARBAGE \x00\x01 HTTP/9.9\r\n\r\n")
s.close()
assert status("GET", "/healthz") == 200, "the server did not survive a malformed request"
# 80 clients that never finish their request header (more than the 64 connections the dashboard keeps open):
# probes and a job page (log tails read from the agents) are still answered, each within urlopen's 10 s.
slow = []
for i in range(80):
    c = socket.create_connection((host, int(port)), timeout=5)
    c.sendall(b"GET /healthz HTTP/1.1\r\nX-Slow: 1\r\n")
    slow.append(c)
for path in ["/healthz", "/metrics", "/jobs/" + job, "/api/v1/nodes"]:
    got = status("GET", path)
    assert got == 200, f"GET {path} beside 80 slow clients: {got}"
for c in slow:
    c.close()
print("metrics parse and match the cluster; bad URLs get 404/405/400; slow clients do not lock probes out")
PY
ctl cancel "$job" >/dev/null
echo "ok"
