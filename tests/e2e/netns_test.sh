#!/usr/bin/env bash
# End-to-end test across three "hosts" made of Linux network namespaces (ctest label netns).
#
#   ddl-<pid>-br     bridge br0 joining the three veths below (no address of its own)
#   ddl-<pid>-coord  eth0 198.18.0.1/24  ddl-coordinator --listen 198.18.0.1:7070
#   ddl-<pid>-host1  eth0 198.18.0.2/24  ddl-agent --node host1 (2 virtual GPUs)
#   ddl-<pid>-host2  eth0 198.18.0.3/24  ddl-agent --node host2 (2 virtual GPUs)
#
# Every gRPC link is mutual TLS: a PKI made with init-pki in the scratch directory (the coordinator's certificate
# also names 198.18.0.1), a node certificate per agent (issue-node). The job is submitted with the token of a
# ddlctl user made with the admin token, named like a throwaway account ddlt-<pid> (useradd, removed on exit)
# that the ranks can run as. Before the job, from host1: a client trusting another CA fails to verify the
# coordinator (openssl s_client, where installed), one trusting ours verifies it for 198.18.0.1, and a
# plaintext HTTP/2 connection preface gets no HTTP/2 answer; ddlctl without a token exits 4.
#
# The namespaces are built by scripts/lib/netns.sh (shared with bench/hierarchy.sh). The hosts' links are
# shaped on egress with "netem delay 0.5ms rate 1gbit", or where the kernel has no sch_netem with "tbf rate
# 1gbit"; with neither they stay unshaped (said so, not a failure).
#
# A 4-rank ddl-bench job (2 nodes x 2 GPUs) is submitted through ddlctl; it must end SUCCEEDED and rank 0's log
# must say "# Out of bounds values : 0 OK".
#
# Usage: netns_test.sh [BIN_DIR]   (BIN_DIR holds ddl-coordinator, ddl-agent, ddlctl, ddl-bench;
#                                    default: ../../build/bin next to this script)
# Environment (optional):
#   DDL_NETNS_UCX_TLS   UCX_TLS for the ranks (default tcp,sm,self)
#   DDL_NETNS_DEBUG=1   pass DDL_DEBUG=1 to the ranks (each endpoint's UCX lanes go to the rank logs, and are
#                       printed at the end)
#   DDL_NETNS_KEEP=1    keep the temporary directory (logs) after the run
# Exit status: 0 passed, 1 failed, 77 skipped (not root, or network namespaces not usable here).
set -euo pipefail

SKIP=77
unset DDL_TOKEN DDL_TOKEN_FILE DDL_CA DDL_COORDINATOR  # the caller's ddlctl settings ($DDL_TOKEN beats --token-file)
log() { printf '[netns %s] %s\n' "$(date +%T)" "$*"; }
skip() { log "skipped: $*"; exit "$SKIP"; }
fail() { log "FAIL: $*" >&2; exit 1; }

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=../../scripts/lib/netns.sh
source "$script_dir/../../scripts/lib/netns.sh"
BIN=${1:-$script_dir/../../build/bin}
BIN=$(cd "$BIN" 2>/dev/null && pwd) || fail "no binary directory ${1:-$script_dir/../../build/bin}"
for b in ddl-coordinator ddl-agent ddlctl ddl-bench; do
  [[ -x $BIN/$b ]] || fail "$BIN/$b is missing (build it first)"
done

# ---- can we run at all? ----------------------------------------------------------------------------------
netns_preflight "ddl-$$-probe" || skip "$NETNS_WHY"
# Reading ddlctl's JSON: jq where there is one, else python3.
if command -v jq >/dev/null; then
  json() { jq -r "$1"; }                                                   # a simple path: .a.b[0].c
  count_up() { jq '[.nodes[]? | select(.state == "UP" and .connected)] | length'; }
elif command -v python3 >/dev/null; then
  json() {
    python3 -c 'import json,re,sys
v=json.load(sys.stdin)
for k in re.findall(r"\.(\w+)|\[(\d+)\]", sys.argv[1]):
    v = v[k[0]] if k[0] else v[int(k[1])]
print(v)' "$1"
  }
  count_up() {
    python3 -c 'import json,sys
print(sum(n.get("state") == "UP" and n.get("connected", False) for n in json.load(sys.stdin).get("nodes", [])))'
  }
else
  skip "needs jq or python3 to read ddlctl's JSON"
fi
command -v useradd >/dev/null || skip "needs useradd (Debian package passwd) for the job's throwaway account"

ID=$$
NS_BR=ddl-$ID-br
NS_C=ddl-$ID-coord
NS_H1=ddl-$ID-host1
NS_H2=ddl-$ID-host2
COORD=198.18.0.1:7070
UCX_TLS_JOB=${DDL_NETNS_UCX_TLS:-tcp,sm,self}
JOB_USER=ddlt-$ID
MADE_USER=0

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddl-netns.XXXXXX")
chmod 755 "$tmp"
declare -A PIDS=()   # role -> pid of a daemon this script started
JOB=
T0=$(date +%s.%N)

elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
alive() { kill -0 "$1" 2>/dev/null; }

print_logs() {
  local f
  for f in "$tmp/coordinator.log" "$tmp/agent-host1.log" "$tmp/agent-host2.log"; do
    [[ -f $f ]] || continue
    echo "----- $(basename "$f") (last 200 lines)"
    tail -n 200 "$f"
  done
  if [[ -n $JOB ]]; then
    for f in "$tmp"/host*/logs/"$JOB"/attempt-*/rank-*.log; do
      [[ -f $f ]] || continue
      echo "----- ${f#"$tmp"/} (last 60 lines)"
      tail -n 60 "$f"
    done
  fi
  echo "-----"
}

cleanup() {
  local rc=$? role pid ns pids i
  set +e
  trap - EXIT INT TERM
  if [[ $rc -ne 0 ]]; then
    log "exit status $rc; logs:"
    print_logs
  fi
  log "cleaning up: stopping daemons, deleting namespaces, removing $tmp"
  # Agents first (they stop their ranks), then the coordinator: SIGTERM, then SIGKILL after 10 s.
  for role in agent-host1 agent-host2 coordinator; do
    pid=${PIDS[$role]:-}
    [[ -n $pid ]] && alive "$pid" && kill -TERM "$pid" 2>/dev/null
  done
  for ((i = 0; i < 100; i++)); do
    pids=
    for pid in "${PIDS[@]}"; do alive "$pid" && pids+=" $pid"; done
    [[ -z $pids ]] && break
    sleep 0.1
  done
  for role in "${!PIDS[@]}"; do
    pid=${PIDS[$role]}
    if alive "$pid"; then
      log "$role (pid $pid) still running after 10 s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null
  done
  # Anything still inside our namespaces (stray ranks) was started by these daemons: netns_teardown kills it by
  # pid, then deletes the namespaces (and the veths with them).
  netns_teardown
  if ((MADE_USER)) && ! userdel "$JOB_USER" 2>/dev/null && ! userdel -f "$JOB_USER"; then
    log "could not remove the account $JOB_USER"
  fi
  if [[ ${DDL_NETNS_KEEP:-0} == 1 ]]; then
    log "kept $tmp"
  else
    rm -rf "$tmp"
  fi
  case $rc in
    0) log "PASSED in $(elapsed "$T0") s" ;;
    "$SKIP") ;;
    *) log "FAILED (status $rc) after $(elapsed "$T0") s" ;;
  esac
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- topology ----------------------------------------------------------------------------------------------
HOSTS=("$NS_C" 198.18.0.1 "$NS_H1" 198.18.0.2 "$NS_H2" 198.18.0.3)
log "building namespaces $NS_C $NS_H1 $NS_H2 $NS_BR (bridge br0 in $NS_BR, 198.18.0.0/24)"
netns_build "$NS_BR" "${HOSTS[@]}"
n=1
for ns in "$NS_C" "$NS_H1" "$NS_H2"; do
  log "  $ns: eth0 198.18.0.$n/24 <-> $NS_BR:veth$n"
  n=$((n + 1))
done
shaped=0
for ns in "$NS_H1" "$NS_H2"; do
  netns_shape "$ns" eth0 1gbit 0.5ms && shaped=$((shaped + 1))
done
if [[ $shaped -eq 2 ]]; then
  ((NETNS_DELAYED)) || NETNS_SHAPING+=" (no sch_netem in this kernel: no added delay)"
  log "host links shaped on each host's eth0 egress: $NETNS_SHAPING"
else
  log "host links not shaped: neither tc netem nor tbf is usable here"
fi
# The links must be up (carrier on both ends, bridge ports forwarding) before anything starts on them; where
# ping exists, the hosts must also answer each other.
netns_wait_up 10 "$NS_BR" "${HOSTS[@]}" || { ip -n "$NS_BR" link; fail "the links did not come up within 10 s"; }
log "network up$(command -v ping >/dev/null && echo ': host1 -> coord and host2 -> host1 answer pings')"

# ---- the job's account and the PKI ---------------------------------------------------------------------------
# The account's home is the job's workdir.
mkdir -p "$tmp/coord" "$tmp/host1" "$tmp/host2" "$tmp/work"
useradd --home-dir "$tmp/work" --no-create-home --shell /usr/sbin/nologin \
  --comment "ddl netns_cluster, removed on exit" "$JOB_USER" || fail "useradd $JOB_USER failed"
MADE_USER=1
chown "$JOB_USER:" "$tmp/work"
runuser -u "$JOB_USER" -- test -x "$BIN/ddl-bench" ||
  fail "$JOB_USER cannot run $BIN/ddl-bench (a directory above it is private)"
PKI=$tmp/pki
"$BIN/ddl-coordinator" init-pki "$PKI" --name "${COORD%:*}" >"$tmp/pki.log" 2>&1 ||
  { cat "$tmp/pki.log"; fail "ddl-coordinator init-pki failed"; }
for n in 1 2; do
  "$BIN/ddl-coordinator" --pki-dir "$PKI" issue-node "host$n" --out "$tmp/pki-host$n" >>"$tmp/pki.log" 2>&1 ||
    { cat "$tmp/pki.log"; fail "ddl-coordinator issue-node host$n failed"; }
done
log "PKI in $PKI (coordinator certificate for ${COORD%:*}), node certificates for host1 and host2"

# ---- daemons ------------------------------------------------------------------------------------------------
# ddlctl as the admin (nodes, add-user) and as the job's user (submit, status).
admin() {
  ip netns exec "$NS_C" "$BIN/ddlctl" --coordinator "$COORD" --timeout 5 --ca "$PKI/ca.crt" \
    --token-file "$PKI/admin.token" "$@"
}
ctl() {
  ip netns exec "$NS_C" "$BIN/ddlctl" --coordinator "$COORD" --timeout 5 --ca "$PKI/ca.crt" \
    --token-file "$tmp/user.token" "$@"
}

log "starting ddl-coordinator in $NS_C on $COORD (TLS)"
ip netns exec "$NS_C" "$BIN/ddl-coordinator" --listen "$COORD" --pki-dir "$PKI" --data-dir "$tmp/coord" \
  --heartbeat-grace 5 >"$tmp/coordinator.log" 2>&1 &
PIDS[coordinator]=$!
# Start the agents only once the coordinator answers: an agent that finds it not yet listening keeps getting
# "connection refused" from its gRPC channel for several seconds after it is (seen: 6-8 s), which would only
# slow the test down.
t=$(date +%s.%N)
deadline=$((SECONDS + 20))
answers=0
for ((i = 0; i < 100 && SECONDS < deadline; i++)); do
  alive "${PIDS[coordinator]}" || fail "ddl-coordinator exited early"
  if admin nodes >/dev/null 2>&1; then answers=1; break; fi
  sleep 0.2
done
((answers)) || fail "ddl-coordinator does not answer on $COORD after 20 s"
log "ddl-coordinator answers after $(elapsed "$t") s"
(umask 077 && admin -o json admin add-user "$JOB_USER" | json '.token' >"$tmp/user.token") ||
  fail "ddlctl admin add-user $JOB_USER failed"
[[ $(ctl whoami) == "$JOB_USER user"* ]] || fail "ddlctl whoami with $JOB_USER's token: $(ctl whoami 2>&1)"
log "ddlctl user $JOB_USER made; its token is $tmp/user.token"
# Each agent host also gets its own IPC namespace, and keeps the machine's host name on purpose (see
# scripts/lib/netns.sh).
netns_host_prefix
for n in 1 2; do
  ns_var=NS_H$n
  log "starting ddl-agent host$n in ${!ns_var} at 198.18.0.$((n + 1))"
  ip netns exec "${!ns_var}" "${NETNS_HOST_PREFIX[@]}" "$BIN/ddl-agent" --coordinator "$COORD" --node "host$n" \
    --pki-dir "$tmp/pki-host$n" --address "198.18.0.$((n + 1))" --labels switch=s1 --virtual-gpus 2 --force-virtual \
    --data-dir "$tmp/host$n" --stop-ranks-on-exit >"$tmp/agent-host$n.log" 2>&1 &
  PIDS[agent-host$n]=$!
done

log "waiting (at most 20 s) for both nodes to be UP"
t=$(date +%s.%N)
up=0
deadline=$((SECONDS + 20))
for ((i = 0; i < 40 && SECONDS < deadline; i++)); do
  for role in "${!PIDS[@]}"; do
    alive "${PIDS[$role]}" || fail "$role exited early"
  done
  if out=$(admin -o json nodes 2>/dev/null); then
    up=$(printf '%s' "$out" | count_up) || up=0
    [[ $up -ge 2 ]] && break
  fi
  sleep 0.5
done
[[ $up -ge 2 ]] || fail "only $up of 2 nodes UP after 20 s"
log "both nodes UP after $(elapsed "$t") s:"
admin nodes

# ---- no way around TLS ------------------------------------------------------------------------------------
rc=0
ip netns exec "$NS_C" env HOME="$tmp/work" "$BIN/ddlctl" --coordinator "$COORD" --timeout 5 --ca "$PKI/ca.crt" nodes \
  >"$tmp/notoken.log" 2>&1 </dev/null || rc=$?
[[ $rc -eq 4 ]] || { cat "$tmp/notoken.log"; fail "ddlctl without a token exited $rc (wanted 4, not authenticated)"; }
log "ddlctl without a token: exit 4 ($(head -c 100 "$tmp/notoken.log")...)"
# The next probes come from host1, as a client elsewhere on the network would.
if command -v openssl >/dev/null; then
  "$BIN/ddl-coordinator" init-pki "$tmp/other-pki" >/dev/null 2>&1 || fail "init-pki of a second CA failed"
  s_client() {  # CA_FILE: a TLS handshake with the coordinator that verifies its certificate for 198.18.0.1
    ip netns exec "$NS_H1" timeout 10 openssl s_client -connect "$COORD" -alpn h2 -CAfile "$1" \
      -verify_return_error -verify_ip "${COORD%:*}" </dev/null >"$tmp/s_client.log" 2>&1
  }
  if ! s_client "$PKI/ca.crt" || ! grep -aq 'Verify return code: 0 (ok)' "$tmp/s_client.log"; then
    cat "$tmp/s_client.log"
    fail "openssl s_client does not verify the coordinator's certificate with our CA"
  fi
  if s_client "$tmp/other-pki/ca.crt"; then
    cat "$tmp/s_client.log"
    fail "openssl s_client trusting another CA verified the coordinator's certificate"
  fi
  log "openssl s_client: the coordinator's certificate verifies for ${COORD%:*} with our CA, not with another one"
else
  log "note: openssl is not installed, the coordinator's certificate is not checked with s_client"
fi
# A plaintext HTTP/2 client: the connection preface and an empty SETTINGS frame. A plaintext gRPC server answers
# with its own SETTINGS frame (a 9-byte header whose 4th byte, the type, is 04); a TLS one sends nothing back
# (or a TLS alert) and closes.
# shellcheck disable=SC2016 # expanded by the inner bash
answer=$(ip netns exec "$NS_H1" timeout 10 bash -c 'trap "" PIPE
  exec 3<>"/dev/tcp/$0/$1" || exit 3
  printf "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00" >&3 2>/dev/null
  timeout 3 cat <&3 2>/dev/null | od -An -v -tx1 | tr -d " \n"' "${COORD%:*}" "${COORD##*:}") ||
  fail "the plaintext probe could not connect to $COORD"
[[ ! $answer =~ ^[0-9a-f]{6}04 ]] || fail "$COORD answered a plaintext HTTP/2 preface with an HTTP/2 frame: $answer"
log "a plaintext HTTP/2 preface gets no HTTP/2 answer (${#answer} hex digits back: ${answer:0:20})"

# ---- the job -------------------------------------------------------------------------------------------------
envs=(--env "UCX_TLS=$UCX_TLS_JOB")
[[ ${DDL_NETNS_DEBUG:-0} == 1 ]] && envs+=(--env DDL_DEBUG=1)
bench=("$BIN/ddl-bench" -b 8 -e 4M -f 4 -n 3 -w 1 -c 1)
# Bytes host1 sent and received on its link (its eth0, as seen from inside its namespace).
link_bytes() {
  # shellcheck disable=SC2016 # expanded by the inner sh
  ip netns exec "$NS_H1" sh -c 'echo $(( $(cat /sys/class/net/eth0/statistics/tx_bytes) +
                                          $(cat /sys/class/net/eth0/statistics/rx_bytes) ))'
}
bytes_before=$(link_bytes)
log "submitting a 4-rank job as $JOB_USER (2 nodes x 2 GPUs, ${envs[*]}): ${bench[*]}"
t=$(date +%s.%N)
JOB=$(ctl submit --nodes 2 --gpus-per-node 2 "${envs[@]}" --workdir "$tmp/work" -- "${bench[@]}")
JOB=$(printf '%s' "$JOB" | tr -d '[:space:]')
[[ -n $JOB ]] || fail "ddlctl submit printed no job id"
owner=$(ctl -o json status "$JOB" | json '.spec.user') || fail "ddlctl status $JOB failed"
[[ $owner == "$JOB_USER" ]] || fail "job $JOB is $owner's, not $JOB_USER's (the token's user)"
log "job $JOB submitted; waiting (at most 120 s) for it to end"

state=
final=0
deadline=$((SECONDS + 120))
for ((i = 0; i < 240 && SECONDS < deadline; i++)); do
  if out=$(ctl -o json status "$JOB" 2>/dev/null); then
    state=$(printf '%s' "$out" | json '.state')
    case $state in SUCCEEDED | FAILED | CANCELLED) final=1 && break ;; esac
  fi
  for role in "${!PIDS[@]}"; do
    alive "${PIDS[$role]}" || fail "$role exited while job $JOB was $state"
  done
  sleep 0.5
done
job_s=$(elapsed "$t")
((final)) || { ctl status "$JOB" || true; fail "job $JOB did not end within 120 s (last state: ${state:-unknown})"; }
log "job $JOB: $state after $job_s s"
ctl status "$JOB" || true
[[ $state == SUCCEEDED ]] || fail "job $JOB ended $state (wanted SUCCEEDED)"

root=$(printf '%s' "$out" | json '.allocation[0].node')
rank0=$tmp/$root/logs/$JOB/attempt-1/rank-0.log
[[ -f $rank0 ]] || fail "no rank 0 log at $rank0"
log "rank 0 ran on $root; its table ($rank0):"
sed -n '/^# ddl-bench /,/^# Avg bus bandwidth/p' "$rank0"
grep -q '# Out of bounds values : 0 OK' "$rank0" || fail "rank 0 does not report '# Out of bounds values : 0 OK'"
grep -Eq '^ +2097152 ' "$rank0" || fail "rank 0's table has no row for its largest size (2097152 bytes)"

# Half the ranks are on each host, so a good part of every allreduce crosses host1's link: tens of MiB in all
# (the largest size, 2 MiB, alone runs 8 times: 1 warm-up and 3 timed iterations, out-of-place and in-place).
# Require at least 8 MiB, so a job whose ranks talked through anything but the network fails.
moved=$(( $(link_bytes) - bytes_before ))
log "host1's link carried $((moved / 1024)) KiB during the job"
((moved >= 8 * 1024 * 1024)) || fail "host1's link carried only $moved bytes: the ranks did not talk over the network"

if [[ ${DDL_NETNS_DEBUG:-0} == 1 ]]; then
  log "UCX endpoints (DDL_DEBUG=1), per rank log:"
  for f in "$tmp"/host*/logs/"$JOB"/attempt-1/rank-*.log; do
    echo "== ${f#"$tmp"/}"
    grep -E '^ddl: rank .* endpoint|lane\[' "$f" || true
  done
fi
log "ok: job ran across namespaces (UCX_TLS=$UCX_TLS_JOB), SUCCEEDED, results correct"
