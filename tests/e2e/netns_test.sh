#!/usr/bin/env bash
# End-to-end test across three "hosts" made of Linux network namespaces (ctest label netns).
#
#   ddl-<pid>-br     bridge br0 joining the three veths below (no address of its own)
#   ddl-<pid>-coord  eth0 198.18.0.1/24  ddl-coordinator --listen 198.18.0.1:7070
#   ddl-<pid>-host1  eth0 198.18.0.2/24  ddl-agent --node host1 (2 virtual GPUs)
#   ddl-<pid>-host2  eth0 198.18.0.3/24  ddl-agent --node host2 (2 virtual GPUs)
#
# The namespaces are built by scripts/lib/netns.sh (shared with bench/hierarchy.sh). The hosts' links are
# shaped on egress with "netem delay 0.5ms rate 1gbit", or where the kernel has no sch_netem with "tbf rate
# 1gbit"; with neither they stay unshaped (said so, not a failure).
#
# A 4-rank ddl-bench job (2 nodes x 2 GPUs) is submitted through ddlctl; it must end SUCCEEDED and rank 0's log
# must say "# Out of bounds values : 0 OK". The agents run as root, so they run each rank as its job's user and
# never as root (the coordinator does not allow root jobs): the job is submitted by a throwaway account,
# ddlt-<pid>-n (useradd, deleted at the end), as a user would.
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

ID=$$
NS_BR=ddl-$ID-br
NS_C=ddl-$ID-coord
NS_H1=ddl-$ID-host1
NS_H2=ddl-$ID-host2
COORD=198.18.0.1:7070
UCX_TLS_JOB=${DDL_NETNS_UCX_TLS:-tcp,sm,self}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddl-netns.XXXXXX")
chmod 755 "$tmp"
declare -A PIDS=()   # role -> pid of a daemon this script started
JOB=
JOB_USER=            # the job's user, once made
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
  if [[ ${DDL_NETNS_KEEP:-0} == 1 ]]; then
    log "kept $tmp"
  else
    rm -rf "$tmp"
  fi
  [[ -n $JOB_USER ]] && userdel "$JOB_USER" 2>/dev/null
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

{ command -v useradd && command -v runuser; } >/dev/null || skip "needs useradd and runuser to submit as a user"
useradd --no-create-home --home-dir /nonexistent --shell /bin/sh "ddlt-$$-n" || fail "cannot make the user ddlt-$$-n"
JOB_USER=ddlt-$$-n

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

# ---- daemons ------------------------------------------------------------------------------------------------
mkdir -p "$tmp/coord" "$tmp/host1" "$tmp/host2"
ctl() { ip netns exec "$NS_C" "$BIN/ddlctl" --coordinator "$COORD" --timeout 5 "$@"; }

log "starting ddl-coordinator in $NS_C on $COORD"
ip netns exec "$NS_C" "$BIN/ddl-coordinator" --listen "$COORD" --data-dir "$tmp/coord" --heartbeat-grace 5 \
  >"$tmp/coordinator.log" 2>&1 &
PIDS[coordinator]=$!
# Start the agents only once the coordinator answers: an agent that finds it not yet listening keeps getting
# "connection refused" from its gRPC channel for several seconds after it is (seen: 6-8 s), which would only
# slow the test down.
t=$(date +%s.%N)
deadline=$((SECONDS + 20))
answers=0
for ((i = 0; i < 100 && SECONDS < deadline; i++)); do
  alive "${PIDS[coordinator]}" || fail "ddl-coordinator exited early"
  if ctl nodes >/dev/null 2>&1; then answers=1; break; fi
  sleep 0.2
done
((answers)) || fail "ddl-coordinator does not answer on $COORD after 20 s"
log "ddl-coordinator answers after $(elapsed "$t") s"
# Each agent host also gets its own IPC namespace, and keeps the machine's host name on purpose (see
# scripts/lib/netns.sh).
netns_host_prefix
for n in 1 2; do
  ns_var=NS_H$n
  log "starting ddl-agent host$n in ${!ns_var} at 198.18.0.$((n + 1))"
  ip netns exec "${!ns_var}" "${NETNS_HOST_PREFIX[@]}" "$BIN/ddl-agent" --coordinator "$COORD" --node "host$n" \
    --address "198.18.0.$((n + 1))" --labels switch=s1 --virtual-gpus 2 --force-virtual --data-dir "$tmp/host$n" --stop-ranks-on-exit \
    >"$tmp/agent-host$n.log" 2>&1 &
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
  if out=$(ctl -o json nodes 2>/dev/null); then
    up=$(printf '%s' "$out" | count_up) || up=0
    [[ $up -ge 2 ]] && break
  fi
  sleep 0.5
done
[[ $up -ge 2 ]] || fail "only $up of 2 nodes UP after 20 s"
log "both nodes UP after $(elapsed "$t") s:"
ctl nodes

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
log "submitting a 4-rank job (2 nodes x 2 GPUs, ${envs[*]}): ${bench[*]}"
t=$(date +%s.%N)
JOB=$(ip netns exec "$NS_C" runuser -u "$JOB_USER" -- "$BIN/ddlctl" --coordinator "$COORD" --timeout 5 \
  submit --nodes 2 --gpus-per-node 2 "${envs[@]}" --workdir "$tmp" -- "${bench[@]}")
JOB=$(printf '%s' "$JOB" | tr -d '[:space:]')
[[ -n $JOB ]] || fail "ddlctl submit printed no job id"
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
