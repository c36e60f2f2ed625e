#!/usr/bin/env bash
# DDP across hosts: bench/torch_ddp.py's DDP measurement with one rank per "host", the hosts being Linux network
# namespaces on this machine joined by a bridge, each host's link shaped with tc (1 Gbit/s by default), so that
# gradients cross a wire as between real nodes, instead of shared memory. There the collective waits on the
# network rather than on the CPU, which is where running it beside the backward pass (DDP's overlap) pays.
#
#   bench/torch_hosts.sh [--hosts 2] [--rate 1gbit] [torch_ddp.py ddp options: --model, --batch, --reps, --json ...]
#
# Needs root (namespaces, tc); exits 77 saying why where it cannot run. Everything it creates is removed at the
# end, also after a failure or Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=../scripts/lib/netns.sh
source scripts/lib/netns.sh
log() { printf '[torch_hosts %s] %s\n' "$(date +%T)" "$*" >&2; }
skip() { log "skipped: $*"; exit 77; }

HOSTS_N=2
RATE=1gbit
pass=()
while (($#)); do
  case $1 in
    --hosts) HOSTS_N=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    *) pass+=("$1"); shift ;;
  esac
done
[[ $HOSTS_N =~ ^[2-8]$ ]] || { echo "torch_hosts.sh: --hosts takes 2 to 8" >&2; exit 2; }
netns_preflight "dth-$$-probe" || skip "$NETNS_WHY"
command -v tc >/dev/null || skip "needs tc (iproute2) to shape the links"
[[ -f build/python/torch_ddl/__init__.py ]] || { echo "torch_hosts.sh: build torch_ddl first (./scripts/build)" >&2; exit 1; }

NS_BR=dth-$$-br
args=() spec=()
for ((h = 1; h <= HOSTS_N; h++)); do
  args+=("dth-$$-h$h" "198.18.1.$h")
  spec+=("dth-$$-h$h=198.18.1.$h")
done
trap 'netns_teardown' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
log "building $HOSTS_N hosts on a bridge (198.18.1.1..$HOSTS_N), links shaped to $RATE"
netns_build "$NS_BR" "${args[@]}"
for ((h = 1; h <= HOSTS_N; h++)); do
  netns_shape "dth-$$-h$h" eth0 "$RATE" || skip "cannot shape the links with tc (sch_tbf, sch_netem)"
done
netns_wait_up 10 "$NS_BR" "${args[@]}" || { echo "torch_hosts.sh: the links did not come up" >&2; exit 1; }
netns_host_prefix
((${#NETNS_HOST_PREFIX[@]})) || skip "unshare --ipc is not usable: ranks would talk through shared memory"
log "host links: $NETNS_SHAPING"
IFS=,
/usr/bin/python3 bench/torch_ddp.py ddp --hosts "${spec[*]}" --link "$NETNS_SHAPING" "${pass[@]}"
