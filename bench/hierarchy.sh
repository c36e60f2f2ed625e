#!/usr/bin/env bash
# A real two-level hierarchy on one machine: 2 hosts x 2 ranks, hosts made of Linux network namespaces.
#
#   ddlh-<pid>-br     bridge br0 joining the three veths below (no address)
#   ddlh-<pid>-ctl    eth0 198.18.0.1/24  mpirun only (its daemons' control traffic; no allreduce data)
#   ddlh-<pid>-host1  eth0 198.18.0.2/24  ranks 0 and 1   egress shaped: --rate, --delay
#   ddlh-<pid>-host2  eth0 198.18.0.3/24  ranks 2 and 3   egress shaped: --rate, --delay
#
# Within a host the two ranks share an IPC namespace and talk over shared memory (UCX sm); between hosts they
# talk TCP over the shaped veths (scripts/lib/netns.sh builds all this; see there why each host is also an IPC
# namespace). It measures, per message size:
#   - ddl-bench -a ring, mdring, rhd, auto   (DDL_TOPOLOGY=2x2, as ddl-agent sets it: dim 0, the fastest, is
#     the pair of ranks on one host; dim 1 the two hosts)
#   - mpi-allreduce-bench under Open MPI: its default path (ob1: vader within a host, tcp between hosts) and
#     its UCX PML (same UCX_TLS as ddl). mpirun cannot enter namespaces itself: an rsh agent generated here
#     turns "ssh HOST orted ..." into "ip netns exec HOST unshare --ipc --uts orted ...".
#   - the link and shared memory with ucx_perftest (tag_lat 8 B, tag_bw 4 MiB, peer error handling on, as
#     libddl's endpoints have it), for the alpha-beta model of flat ring and mdring that the report sets next to the
#     measured times (bench/hierarchy_report.py; docs/benchmarks.md, "A real hierarchy", says how to read it).
#
# Where the kernel has no sch_netem (tc qdisc netem), the link is shaped with tbf, which limits the rate but
# cannot add delay: the run says so, runs without added delay, and the report also prints the model with the
# requested delay added to the measured link latency.
#
# Usage: bench/hierarchy.sh [options]           (as root)
#   --rate RATE        host link rate, tc syntax (default 1gbit)
#   --delay DELAY      one-way delay added on each host's egress, tc syntax (default 0.5ms; 0 for none)
#   --min SIZE         smallest message, bytes; suffix K, M, G (default 8)
#   --max SIZE         largest message (default 64M); sizes grow by --factor (default 4) while <= --max
#                      (so 8 x4 ends at 32M; --min 16 reaches 64M)
#   --iters N          timed calls per size from --small-below up (default 20)
#   --small-iters N    timed calls per size below --small-below (default 100)
#   --small-below SIZE (default 1M)
#   --warmup N         untimed calls before them (default 5)
#   --reps N           repetitions, systems in a new shuffled order each; the report takes medians (default 3)
#   --systems LIST     comma-separated, from ring,mdring,rhd,auto,openmpi,openmpi-ucx (default: all)
#   --out DIR          results (default: bench-results/hierarchy in the repository)
#   --bin DIR          ddl-bench and mpi-allreduce-bench (default: build/bin in the repository)
#   --timeout SECONDS  per program run (default 600)
#   --keep-going       after a failed run, go on with the others (the exit status is still 1)
# Results: OUT/table.txt (also printed), OUT/summary.json, OUT/raw/rep*/ (each run's --json, ucx_perftest's
# output, libddl's telemetry), OUT/logs/rep*/ (every rank's output).
# Exit status: 0 every run passed, 1 a run failed or gave wrong values, 2 bad usage, 77 skipped (not root, or
# network namespaces not usable here).
set -euo pipefail

SKIP=77
log() { printf '[hierarchy %s] %s\n' "$(date +%T)" "$*"; }
skip() { log "skipped: $*"; exit "$SKIP"; }
fail() { log "FAIL: $*" >&2; exit 1; }
# usage STATUS: the Usage paragraph of this header, on stdout for --help (0), else on stderr.
usage() {
  sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&"$(($1 ? 2 : 1))"
  exit "$1"
}

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/.." && pwd)
# shellcheck source-path=SCRIPTDIR source=../scripts/lib/netns.sh
source "$script_dir/../scripts/lib/netns.sh"

# ---- options -------------------------------------------------------------------------------------------------
RATE=1gbit DELAY=0.5ms MIN=8 MAX=64M FACTOR=4 ITERS=20 SMALL_ITERS=100 SMALL_BELOW=1M WARMUP=5 REPS=3
SYSTEMS=ring,mdring,rhd,auto,openmpi,openmpi-ucx
OUT=$repo/bench-results/hierarchy BIN=$repo/build/bin RUN_TIMEOUT=600 KEEP_GOING=0
ALL_SYSTEMS=(ring mdring rhd auto openmpi openmpi-ucx)
while (($#)); do
  opt=$1 val=
  case $opt in
    --keep-going) KEEP_GOING=1; shift; continue ;;
    -h | --help) usage 0 ;;
    --*=*) val=${opt#*=} opt=${opt%%=*}; shift ;;
    --rate | --delay | --min | --max | --factor | --iters | --small-iters | --small-below | --warmup | --reps | \
    --systems | --out | --bin | --timeout)
      (($# >= 2)) || { echo "hierarchy.sh: $opt needs a value" >&2; exit 2; }
      val=$2
      shift 2
      ;;
    *) echo "hierarchy.sh: unexpected argument '$opt'" >&2; usage 2 ;;
  esac
  case $opt in
    --rate) RATE=$val ;;
    --delay) DELAY=$val ;;
    --min) MIN=$val ;;
    --max) MAX=$val ;;
    --factor) FACTOR=$val ;;
    --iters) ITERS=$val ;;
    --small-iters) SMALL_ITERS=$val ;;
    --small-below) SMALL_BELOW=$val ;;
    --warmup) WARMUP=$val ;;
    --reps) REPS=$val ;;
    --systems) SYSTEMS=$val ;;
    --out) OUT=$val ;;
    --bin) BIN=$val ;;
    --timeout) RUN_TIMEOUT=$val ;;
    *) echo "hierarchy.sh: unknown option $opt" >&2; usage 2 ;;
  esac
done

# "64M" -> 67108864; empty when malformed.
bytes() {
  local t=${1^^} m=1
  case $t in *K) m=1024 t=${t%K} ;; *M) m=$((1 << 20)) t=${t%M} ;; *G) m=$((1 << 30)) t=${t%G} ;; esac
  [[ $t =~ ^[0-9]+$ ]] && echo $((t * m))
}
for v in MIN MAX SMALL_BELOW; do
  b=$(bytes "${!v}") || true
  if [[ -z $b || $b -eq 0 ]]; then
    echo "hierarchy.sh: --${v,,} '${!v}' is not a size" >&2
    exit 2
  fi
  printf -v "$v" '%s' "$b"
done
for v in FACTOR ITERS SMALL_ITERS WARMUP REPS RUN_TIMEOUT; do
  [[ ${!v} =~ ^[0-9]+$ && ${!v} -ge 1 ]] || { echo "hierarchy.sh: --${v,,} must be a positive integer" >&2; exit 2; }
done
((FACTOR >= 2)) || { echo "hierarchy.sh: --factor must be at least 2" >&2; exit 2; }
((MIN <= MAX)) || { echo "hierarchy.sh: --min is above --max" >&2; exit 2; }
IFS=, read -ra RUN_SYSTEMS <<<"$SYSTEMS"
for s in "${RUN_SYSTEMS[@]}"; do
  [[ " ${ALL_SYSTEMS[*]} " == *" $s "* ]] || { echo "hierarchy.sh: unknown system '$s' (use ${ALL_SYSTEMS[*]})" >&2; exit 2; }
done
WANT_MPI=0
[[ " ${RUN_SYSTEMS[*]} " == *" openmpi"* ]] && WANT_MPI=1

# The sweep, cut in two bands (each one run of a program): below --small-below with --small-iters calls.
BANDS=()   # "name first last iters"
small=() large=()
for ((s = MIN; s <= MAX; s *= FACTOR)); do
  if ((s < SMALL_BELOW)); then small+=("$s"); else large+=("$s"); fi
done
((${#small[@]})) && BANDS+=("small ${small[0]} ${small[-1]} $SMALL_ITERS")
((${#large[@]})) && BANDS+=("large ${large[0]} ${large[-1]} $ITERS")

# ---- can we run at all? ----------------------------------------------------------------------------------------
[[ -x $BIN/ddl-bench ]] || fail "$BIN/ddl-bench is missing (build it: ninja -C build ddl-bench)"
netns_preflight "ddlh-$$-probe" || skip "$NETNS_WHY"
if ! command -v unshare >/dev/null || ! unshare --ipc --uts true 2>/dev/null; then
  skip "needs unshare --ipc --uts: without an IPC namespace per host, UCX would use shared memory between hosts"
fi
[[ -x /usr/bin/python3 ]] || skip "needs /usr/bin/python3 for the report"
command -v timeout >/dev/null || skip "needs coreutils' timeout"
HAVE_PERFTEST=1
command -v ucx_perftest >/dev/null || { HAVE_PERFTEST=0; log "no ucx_perftest (ucx-utils): no link measurement, no model"; }
if ((WANT_MPI)); then
  if ! command -v mpirun >/dev/null; then
    log "no mpirun (openmpi-bin): leaving out the Open MPI columns"
    WANT_MPI=0
  elif [[ ! -x $BIN/mpi-allreduce-bench ]]; then
    log "no $BIN/mpi-allreduce-bench (built where MPI is found): leaving out the Open MPI columns"
    WANT_MPI=0
  fi
  if ((!WANT_MPI)); then
    keep=()
    for s in "${RUN_SYSTEMS[@]}"; do [[ $s == openmpi* ]] || keep+=("$s"); done
    RUN_SYSTEMS=("${keep[@]}")
  fi
fi

# ---- state and cleanup -----------------------------------------------------------------------------------------
ID=$$
NS_BR=ddlh-$ID-br NS_CTL=ddlh-$ID-ctl NS_H1=ddlh-$ID-host1 NS_H2=ddlh-$ID-host2
HOSTS=("$NS_CTL" 198.18.0.1 "$NS_H1" 198.18.0.2 "$NS_H2" 198.18.0.3)
ROOT_ADDR=198.18.0.2   # rank 0's host
work=$(mktemp -d "${TMPDIR:-/tmp}/ddl-hierarchy.XXXXXX")
chmod 755 "$work"
BG_PIDS=()   # launchers and listeners this script started and has not reaped yet
FAILED=()    # "rep system band: what"
PORT=$((29500 + RANDOM % 1000))
T0=$SECONDS

alive() { kill -0 "$1" 2>/dev/null; }
forget() {   # forget PID: drop it from BG_PIDS
  local keep=() p
  for p in "${BG_PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
  BG_PIDS=("${keep[@]}")
}

cleanup() {
  local rc=$? pid i
  set +e
  trap - EXIT INT TERM
  log "cleaning up: stopping what runs, deleting namespaces, removing $work"
  for pid in "${BG_PIDS[@]}"; do alive "$pid" && kill -TERM "$pid" 2>/dev/null; done
  for ((i = 0; i < 50; i++)); do
    local left=0
    for pid in "${BG_PIDS[@]}"; do alive "$pid" && left=1; done
    ((left)) || break
    sleep 0.1
  done
  for pid in "${BG_PIDS[@]}"; do
    alive "$pid" && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
  done
  netns_teardown   # whatever still runs inside the namespaces (ranks, orteds), then the namespaces
  rm -rf "$work"
  case $rc in
    0) log "done in $((SECONDS - T0)) s" ;;
    "$SKIP") ;;
    *) log "exit status $rc after $((SECONDS - T0)) s" ;;
  esac
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the hosts ---------------------------------------------------------------------------------------------------
log "building $NS_CTL (198.18.0.1), $NS_H1 (198.18.0.2), $NS_H2 (198.18.0.3) on bridge br0 in $NS_BR"
netns_build "$NS_BR" "${HOSTS[@]}"
shaped=0
for ns in "$NS_H1" "$NS_H2"; do
  netns_shape "$ns" eth0 "$RATE" "$DELAY" && shaped=$((shaped + 1))
done
DELAY_APPLIED=$NETNS_DELAYED
SHAPING=$NETNS_SHAPING
((shaped == 2)) || fail "cannot shape the host links with tc (neither netem nor tbf): the figures would mean nothing" \
  "(is iproute2's tc installed, and sch_tbf available: modprobe sch_tbf?)"
if ((DELAY_APPLIED)); then
  log "host links: $SHAPING on each host's egress"
elif [[ $DELAY == 0 || $DELAY == 0ms ]]; then
  log "host links: $SHAPING on each host's egress (no delay asked for)"
else
  log "host links: $SHAPING on each host's egress. NO ADDED DELAY: this kernel has no sch_netem (tc qdisc netem)," \
      "and tbf only limits the rate; the model also shows the requested $DELAY added to the measured latency"
fi
netns_wait_up 10 "$NS_BR" "${HOSTS[@]}" || { ip -n "$NS_BR" link; fail "the links did not come up within 10 s"; }
netns_host_prefix
((${#NETNS_HOST_PREFIX[@]})) || skip "unshare --ipc is not usable"

# Waits (at most 10 s) until nothing runs in the host namespaces any more (Open MPI's daemons linger a moment
# after mpirun), then kills what is left there, saying so: each run starts on idle hosts.
settle() {
  local ns i pids
  for ((i = 0; i < 50; i++)); do
    pids=
    for ns in "$NS_CTL" "$NS_H1" "$NS_H2"; do pids+=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' '); done
    [[ -z ${pids// /} ]] && return 0
    sleep 0.2
  done
  log "warning: still running in the hosts after 10 s, killed: $pids"
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null
  return 0
}

# wait_all PID...: waits for every pid (each bounded by its own timeout); when one fails, the others get SIGTERM,
# so that one rank's early failure does not leave the other host waiting out its timeout. Its own bound: the run
# timeout plus a minute, then SIGKILL and status 124. Status: the first failure's, else 0.
wait_all() {
  local rc=0 p q st left end=$((SECONDS + RUN_TIMEOUT + 60))
  while :; do
    if ((SECONDS > end)); then
      for q in "$@"; do alive "$q" && kill -KILL "$q" 2>/dev/null; done
      log "warning: still running after $((RUN_TIMEOUT + 60)) s, killed: $*"
      return 124
    fi
    left=0
    for p in "$@"; do
      [[ " ${BG_PIDS[*]} " == *" $p "* ]] || continue
      if alive "$p"; then left=1; continue; fi
      st=0
      wait "$p" || st=$?
      forget "$p"
      if ((st != 0 && rc == 0)); then
        rc=$st
        for q in "$@"; do alive "$q" && kill -TERM "$q" 2>/dev/null; done
      fi
    done
    ((left)) || break
    sleep 0.1
  done
  return "$rc"
}

# The ranks of one host, run by a shell in the host's namespaces: "host_ranks LOGDIR R,R VAR=VALUE... CMD..."
# starts `env DDL_RANK=R VAR=VALUE... CMD...` once per rank, each into LOGDIR/rank-R.log; passes SIGTERM on to
# them; exits with the first failure's status.
# shellcheck disable=SC2016 # expanded by the inner bash
HOST_RANKS='logs=$1 ranks=$2; shift 2
pids=()
trap "kill -TERM \${pids[*]} 2>/dev/null" TERM INT
for r in ${ranks//,/ }; do
  env DDL_RANK="$r" "$@" >"$logs/rank-$r.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
  for ((i = 0; i < 100; i++)); do   # each rank is bounded by its timeout; a wait ends early only on a signal
    wait "$p"; st=$?
    kill -0 "$p" 2>/dev/null || break   # wait was only interrupted by the trap
  done
  ((st != 0 && rc == 0)) && rc=$st
done
exit $rc'

# run_ddl ALGO FIRST LAST ITERS JSON LOGDIR TELEMETRY: ddl-bench's sweep, ranks 0,1 in host1 and 2,3 in host2.
run_ddl() {
  local algo=$1 first=$2 last=$3 iters=$4 json=$5 logs=$6 tele=$7 sock=$work/telemetry.sock listener h1 h2 rc=0 i
  PORT=$((PORT + 1))
  # shellcheck disable=SC2054 # the commas are UCX_TLS's
  local envs=(UCX_TLS=tcp,sm,self UCX_NET_DEVICES=eth0 DDL_WORLD_SIZE=4 "DDL_ROOT=$ROOT_ADDR:$PORT"
              DDL_TOPOLOGY=2x2 DDL_TIMEOUT_MS=120000 "DDL_AGENT_SOCKET=$sock")
  local cmd=("$BIN/ddl-bench" -b "$first" -e "$last" -f "$FACTOR" -n "$iters" -w "$WARMUP" -c 1 -a "$algo"
             --json "$json")
  mkdir -p "$logs"
  # libddl reports each rank's latest collective (with mdring's time per dimension) to an agent's socket every
  # 200 ms: this listener plays the agent and keeps the reports, for the per-dimension split in the report.
  rm -f "$sock"
  timeout -k 5 $((RUN_TIMEOUT + 30)) /usr/bin/python3 -c '
import signal, socket, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a") as f:
    while True:
        f.write(s.recv(4096).decode(errors="replace") + "\n")
        f.flush()' "$sock" "$tele" &
  listener=$!
  BG_PIDS+=("$listener")
  for ((i = 0; i < 50; i++)); do
    [[ -S $sock ]] && break
    sleep 0.1
  done
  [[ -S $sock ]] || log "warning: the telemetry listener did not start within 5 s: no per-dimension split for this run"
  timeout -k 5 "$RUN_TIMEOUT" ip netns exec "$NS_H1" "${NETNS_HOST_PREFIX[@]}" \
    bash -c "$HOST_RANKS" host_ranks "$logs" 0,1 "${envs[@]}" "${cmd[@]}" &
  h1=$!
  timeout -k 5 "$RUN_TIMEOUT" ip netns exec "$NS_H2" "${NETNS_HOST_PREFIX[@]}" \
    bash -c "$HOST_RANKS" host_ranks "$logs" 2,3 "${envs[@]}" "${cmd[@]}" &
  h2=$!
  BG_PIDS+=("$h1" "$h2")
  wait_all "$h1" "$h2" || rc=$?
  kill -TERM "$listener" 2>/dev/null
  wait "$listener" 2>/dev/null || true
  forget "$listener"
  rm -f "$sock"
  return "$rc"
}

# Open MPI's rsh agent: "AGENT HOST COMMAND..." runs COMMAND (a daemon's command line, for a shell) in HOST's
# namespaces, with an IPC and a UTS namespace of its own (vader and ORTE name their files after the host name).
cat >"$work/rsh-agent" <<EOF
#!/bin/sh
host=\$1
shift
case \$host in
  198.18.0.2) ns=$NS_H1 name=host1 ;;
  198.18.0.3) ns=$NS_H2 name=host2 ;;
  *) echo "rsh-agent: unknown host '\$host'" >&2; exit 1 ;;
esac
exec ip netns exec "\$ns" unshare --ipc --uts /bin/sh -c "hostname \$name && exec \$*"
EOF
chmod 755 "$work/rsh-agent"
printf '198.18.0.2 slots=2\n198.18.0.3 slots=2\n' >"$work/hostfile"

# run_mpi VARIANT FIRST LAST ITERS JSON LOGDIR: mpi-allreduce-bench's sweep, mpirun in the ctl namespace.
# Both variants yield the CPU when idle (mpi_yield_when_idle): each "node" looks to Open MPI like 2 slots on
# 2 cores, but the 4 ranks share this machine's 2 cores, which libddl sees (it counts ranks per host name) and
# Open MPI cannot; without it Open MPI's ranks would spin against each other. No binding (ranks of both hosts
# would be bound to the same cores).
run_mpi() {
  local variant=$1 first=$2 last=$3 iters=$4 json=$5 logs=$6 pid rc=0
  local mca=(--mca plm_rsh_agent "$work/rsh-agent" --mca plm_rsh_no_tree_spawn 1 --mca oob_tcp_if_include eth0
             --mca mpi_yield_when_idle 1)
  if [[ $variant == openmpi-ucx ]]; then
    mca+=(--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any -x UCX_TLS -x UCX_NET_DEVICES)
  else
    # shellcheck disable=SC2054 # the commas are Open MPI's list
    mca+=(--mca pml ob1 --mca btl self,vader,tcp --mca btl_tcp_if_include eth0)
  fi
  mkdir -p "$logs"
  UCX_TLS=tcp,sm,self UCX_NET_DEVICES=eth0 timeout -k 10 "$RUN_TIMEOUT" ip netns exec "$NS_CTL" \
    mpirun --allow-run-as-root --hostfile "$work/hostfile" -np 4 --map-by slot --bind-to none "${mca[@]}" \
    "$BIN/mpi-allreduce-bench" -b "$first" -e "$last" -f "$FACTOR" -n "$iters" -w "$WARMUP" -c 1 \
    --json "$json" >"$logs/mpirun.log" 2>&1 &
  pid=$!
  BG_PIDS+=("$pid")
  wait_all "$pid" || rc=$?
  return "$rc"
}

# perftest NAME TLS MODE OUTFILE ARGS...: ucx_perftest ARGS between the hosts (MODE net: server in host2, client
# in host1) or inside host1 (MODE shm: both in its IPC namespace), with peer error handling (-e) as libddl's
# endpoints have it. The client's output goes to OUTFILE.
# shellcheck disable=SC2016 # expanded by the inner bash
PERFTEST_CLIENT='out=$1 host=$2; shift 2
for i in $(seq 30); do   # until the server listens
  "$@" "$host" >"$out" 2>&1 && exit 0
  sleep 0.2
done
exit 1'
perftest() {
  local name=$1 tls=$2 mode=$3 out=$4 rc=0 srv
  shift 4
  PORT=$((PORT + 1))
  local cmd=(env "UCX_TLS=$tls" UCX_NET_DEVICES=eth0 UCX_POSIX_ERROR_HANDLING=y UCX_SYSV_ERROR_HANDLING=y
             ucx_perftest -p "$PORT" -e -w 10 "$@")
  if [[ $mode == shm ]]; then
    # shellcheck disable=SC2016 # expanded by the inner bash
    timeout -k 5 120 ip netns exec "$NS_H1" "${NETNS_HOST_PREFIX[@]}" \
      bash -c '"${@:3}" >/dev/null 2>&1 & srv=$!; bash -c "$0" client "$@"; rc=$?; wait $srv; exit $rc' \
      "$PERFTEST_CLIENT" "$out" 127.0.0.1 "${cmd[@]}" || rc=$?
  else
    timeout -k 5 120 ip netns exec "$NS_H2" "${NETNS_HOST_PREFIX[@]}" "${cmd[@]}" >/dev/null 2>&1 &
    srv=$!
    BG_PIDS+=("$srv")
    timeout -k 5 120 ip netns exec "$NS_H1" "${NETNS_HOST_PREFIX[@]}" \
      bash -c "$PERFTEST_CLIENT" client "$out" 198.18.0.3 "${cmd[@]}" || rc=$?
    ((rc)) && kill -TERM "$srv" 2>/dev/null  # no client will come: do not wait out the server's timeout
    wait_all "$srv" || true
  fi
  grep -q '^Final:' "$out" 2>/dev/null || { log "ucx_perftest $name gave no result (see $out)"; rc=1; }
  return "$rc"
}

# ---- the runs ------------------------------------------------------------------------------------------------------
mkdir -p "$OUT"
rm -rf "$OUT/raw" "$OUT/logs" "$OUT/summary.json" "$OUT/table.txt"
log "sweep: ${MIN} .. ${MAX} bytes by $FACTOR in $(printf '[%s] ' "${BANDS[@]}")(band first last iters);" \
    "warmup $WARMUP; reps $REPS"
log "systems: ${RUN_SYSTEMS[*]}; results in $OUT"
log "note: every rank of both hosts shares this machine's $(nproc) cores (and whatever else runs on them)"

for ((rep = 1; rep <= REPS; rep++)); do
  raw=$OUT/raw/rep$rep logs=$OUT/logs/rep$rep
  mkdir -p "$raw" "$logs"
  if ((HAVE_PERFTEST)); then
    # Bandwidth runs of about 2 s at the nominal rate (20 .. 1000 messages of 4 MiB).
    bw_iters=$(/usr/bin/python3 -c 'import re,sys
m = re.fullmatch(r"([0-9.]+)([kmgt]?)bit", sys.argv[1].lower())
bps = float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[m[2]] / 8 if m else 125e6
print(max(20, min(1000, int(2 * bps / (4 << 20)))))' "$RATE")
    # Latency twice: with -E sleep (the receiver waits in the kernel: wire, stack and a wake-up; robust when
    # the cores are busy) for the model, and busy-polling (-E poll; on a machine with fewer free cores than
    # spinning processes it degrades to the scheduler's time slice) for the record.
    log "rep $rep: ucx_perftest over the link (tcp) and inside host1 (shared memory)"
    pt="$raw/perftest"
    perftest net-lat tcp net "$pt-net-lat.txt" -t tag_lat -s 8 -n 1000 -E sleep || true
    perftest net-lat-poll tcp net "$pt-net-lat-poll.txt" -t tag_lat -s 8 -n 200 -E poll || true
    perftest net-bw tcp net "$pt-net-bw.txt" -t tag_bw -s $((4 << 20)) -n "$bw_iters" || true
    perftest shm-lat sm,self shm "$pt-shm-lat.txt" -t tag_lat -s 8 -n 1000 -E sleep || true
    perftest shm-lat-poll sm,self shm "$pt-shm-lat-poll.txt" -t tag_lat -s 8 -n 200 -E poll || true
    # Shared memory's bandwidth swings widely when other processes want the cores (two spinning processes
    # get time-sliced): the best of three short runs.
    for k in 1 2 3; do
      perftest shm-bw sm,self shm "$pt-shm-bw-$k.txt" -t tag_bw -s $((4 << 20)) -n 100 || true
    done
    settle
  fi
  mapfile -t order < <(printf '%s\n' "${RUN_SYSTEMS[@]}" | shuf)
  log "rep $rep: order ${order[*]}"
  for system in "${order[@]}"; do
    for band in "${BANDS[@]}"; do
      read -r bname first last iters <<<"$band"
      json=$raw/$system.$bname.json
      dir=$logs/$system.$bname
      t=$SECONDS
      rc=0
      case $system in
        openmpi*) run_mpi "$system" "$first" "$last" "$iters" "$json" "$dir" || rc=$? ;;
        *) run_ddl "$system" "$first" "$last" "$iters" "$json" "$dir" "$raw/$system.$bname.telemetry" || rc=$? ;;
      esac
      settle
      if ((rc == 0)) && [[ -s $json ]]; then
        log "rep $rep: $system $bname ($first .. $last B) ok in $((SECONDS - t)) s"
        continue
      fi
      case $rc in
        0) why="no results in $json" ;;
        1) why="wrong values (exit 1)" ;;
        124 | 137) why="timed out after $RUN_TIMEOUT s" ;;
        *) why="exit status $rc" ;;
      esac
      FAILED+=("rep $rep $system $bname: $why")
      log "rep $rep: $system $bname FAILED: $why; its output:"
      for f in "$dir"/*.log; do
        [[ -f $f ]] || continue
        echo "----- ${f#"$OUT"/} (last 30 lines)"
        tail -n 30 "$f"
      done
      echo "-----"
      rm -f "$json"
      ((KEEP_GOING)) || fail "stopping (--keep-going goes on after a failed run)"
    done
  done
done

# ---- the report ----------------------------------------------------------------------------------------------------
/usr/bin/python3 "$script_dir/hierarchy_report.py" --raw "$OUT/raw" --out "$OUT" \
  --rate "$RATE" --delay "$DELAY" --delay-applied "$DELAY_APPLIED" --shaping "$SHAPING" \
  --systems "$(IFS=,; echo "${RUN_SYSTEMS[*]}")" --reps "$REPS" --iters "$ITERS" --small-iters "$SMALL_ITERS" \
  --small-below "$SMALL_BELOW" \
  --warmup "$WARMUP" --cores "$(nproc)" || FAILED+=("the report failed")
if ((${#FAILED[@]})); then
  log "${#FAILED[@]} failure(s):"
  printf '  %s\n' "${FAILED[@]}"
  exit 1
fi
