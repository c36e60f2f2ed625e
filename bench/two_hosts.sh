#!/usr/bin/env bash
# ddl-bench between two hosts with one rank each, the hosts made of Linux network namespaces on this machine
# (scripts/lib/netns.sh): the shape of a 2-node job with one GPU per node, the case where every byte of the
# allreduce crosses the network. Each host's egress is shaped to --rate (tbf, or netem where it can add
# --delay). Rank 0 prints ddl-bench's table; VAR=VALUE arguments after -- go into both ranks' environment,
# so settings can be compared run by run:
#
#   for t in auto 2097153; do sudo bench/two_hosts.sh -- DDL_ALGO=auto UCX_RNDV_THRESH=$t; done
#
# Usage: bench/two_hosts.sh [options] [-- VAR=VALUE ...]      (as root)
#   --rate RATE     host link rate, tc syntax (default 1gbit)
#   --delay DELAY   one-way delay on each host's egress where netem exists (default 0: none)
#   --min SIZE      smallest message (default 64K); --max SIZE largest (default 4M); sizes grow by 4
#   --iters N       timed calls per size (default 20)
#   --bin DIR       ddl-bench (default: build/bin in the repository)
#   --timeout S     per run (default 300)
# Exit status: ddl-bench's (0: right results), 2 bad usage, 77 skipped (not root, no namespaces or tc).
set -euo pipefail

SKIP=77
log() { printf '[two_hosts %s] %s\n' "$(date +%T)" "$*" >&2; }
script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/.." && pwd)
# shellcheck source-path=SCRIPTDIR source=../scripts/lib/netns.sh
source "$script_dir/../scripts/lib/netns.sh"

RATE=1gbit DELAY=0 MIN=64K MAX=4M ITERS=20 BIN=$repo/build/bin RUN_TIMEOUT=300
ENVS=()
while (($#)); do
  case $1 in
    --) shift; ENVS=("$@"); break ;;
    -h | --help) sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --rate | --delay | --min | --max | --iters | --bin | --timeout)
      (($# >= 2)) || { echo "two_hosts.sh: $1 needs a value" >&2; exit 2; }
      case $1 in
        --rate) RATE=$2 ;; --delay) DELAY=$2 ;; --min) MIN=$2 ;; --max) MAX=$2 ;;
        --iters) ITERS=$2 ;; --bin) BIN=$2 ;; --timeout) RUN_TIMEOUT=$2 ;;
      esac
      shift 2
      ;;
    *) echo "two_hosts.sh: unexpected argument '$1' (settings go after --)" >&2; exit 2 ;;
  esac
done
for e in "${ENVS[@]}"; do
  [[ $e =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { echo "two_hosts.sh: '$e' is not VAR=VALUE" >&2; exit 2; }
done
[[ $ITERS =~ ^[0-9]+$ && $ITERS -ge 1 && $RUN_TIMEOUT =~ ^[0-9]+$ && $RUN_TIMEOUT -ge 1 ]] ||
  { echo "two_hosts.sh: --iters and --timeout must be positive integers" >&2; exit 2; }
[[ -x $BIN/ddl-bench ]] || { echo "two_hosts.sh: $BIN/ddl-bench is missing (ninja -C build ddl-bench)" >&2; exit 2; }
netns_preflight "ddl2h-$$-probe" || { log "skipped: $NETNS_WHY"; exit "$SKIP"; }

NS_BR=ddl2h-$$-br NS_A=ddl2h-$$-a NS_B=ddl2h-$$-b
# shellcheck disable=SC2317 # run by the EXIT trap
cleanup() {
  local rc=$?
  trap - EXIT
  netns_teardown
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
netns_build "$NS_BR" "$NS_A" 198.18.0.2 "$NS_B" 198.18.0.3
for ns in "$NS_A" "$NS_B"; do
  netns_shape "$ns" eth0 "$RATE" "$DELAY" || { log "skipped: cannot shape the links with tc (sch_tbf, sch_netem)"; exit "$SKIP"; }
done
netns_wait_up 10 "$NS_BR" "$NS_A" 198.18.0.2 "$NS_B" 198.18.0.3 || { log "the links did not come up in 10 s"; exit 1; }
netns_host_prefix
((${#NETNS_HOST_PREFIX[@]})) || { log "skipped: unshare --ipc is not usable"; exit "$SKIP"; }
log "links: $NETNS_SHAPING; settings: ${ENVS[*]:-(none)}"

secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
common=(DDL_WORLD_SIZE=2 "DDL_ROOT=198.18.0.2:$((29500 + RANDOM % 1000))" "DDL_JOB_SECRET=$secret"
        DDL_TIMEOUT_MS=60000 "${ENVS[@]}")
bench=("$BIN/ddl-bench" -b "$MIN" -e "$MAX" -f 4 -n "$ITERS" -w 5)
ip netns exec "$NS_B" "${NETNS_HOST_PREFIX[@]}" timeout "$RUN_TIMEOUT" env "${common[@]}" DDL_RANK=1 \
  "${bench[@]}" >/dev/null 2>&1 &
other=$!
rc=0
ip netns exec "$NS_A" "${NETNS_HOST_PREFIX[@]}" timeout "$RUN_TIMEOUT" env "${common[@]}" DDL_RANK=0 \
  "${bench[@]}" || rc=$?
wait "$other" || ((rc)) || rc=$?
exit "$rc"
