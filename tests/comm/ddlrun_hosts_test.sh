#!/usr/bin/env bash
# ddlrun across machines over real ssh (ctest label netns): two "hosts" made of network namespaces, each with
# an sshd, and ddlrun -H on the first one starting ranks on both, as mpirun -H or horovodrun -H would.
#
#   ddlr-<pid>-br   bridge br0
#   ddlr-<pid>-a    eth0 198.18.2.1/24   sshd on port 2222, the launcher
#   ddlr-<pid>-b    eth0 198.18.2.2/24   sshd on port 2222
#
# Each sshd runs as a throwaway account ddlr-<pid> (useradd, removed on exit), which is the only account it
# can log in, with a key made here: nothing of this machine's own ssh set-up is read or changed. Each host's
# processes share an IPC namespace of their own (unshare --ipc) so that UCX between them uses TCP.
# Checks: a 4-rank ddl-bench (2 hosts x 2) passes its bounds check with ranks 2 and 3 on host b; a rank that
# fails on host b ends the run with its status and leaves no rank on either host.
#
# sshd: $DDL_SSHD, else .cache/openssh/usr/sbin/sshd (scripts/bootstrap unpacks Debian's openssh-server there
# rather than installing it, which would start an SSH service on this machine), else /usr/sbin/sshd.
# Usage: ddlrun_hosts_test.sh [BIN_DIR]. Exit status: 0 passed, 1 failed, 77 skipped (with the reason).
set -euo pipefail

SKIP=77
log() { printf '[ddlrun-hosts %s] %s\n' "$(date +%T)" "$*"; }
skip() { log "skipped: $*"; exit "$SKIP"; }
fail() { log "FAIL: $*" >&2; exit 1; }

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=../../scripts/lib/netns.sh
source "$repo/scripts/lib/netns.sh"
BIN=${1:-$repo/build/bin}
BIN=$(cd "$BIN" 2>/dev/null && pwd) || fail "no binary directory ${1:-$repo/build/bin}"
for b in ddlrun ddl-bench; do [[ -x $BIN/$b ]] || fail "$BIN/$b is missing (build it first)"; done

SSHD=${DDL_SSHD:-}
for candidate in "$repo/.cache/openssh/usr/sbin/sshd" /usr/sbin/sshd; do
  [[ -z $SSHD && -x $candidate ]] && SSHD=$candidate
done
[[ -n $SSHD ]] || skip "no sshd: scripts/bootstrap unpacks one into .cache/openssh (or set DDL_SSHD)"
for tool in ssh ssh-keygen useradd userdel runuser unshare; do
  command -v "$tool" >/dev/null || skip "needs $tool"
done
netns_preflight "ddlr-$$-probe" || skip "$NETNS_WHY"
unshare --ipc true 2>/dev/null || skip "needs unshare --ipc (hosts of their own for UCX)"

ID=$$
NS_BR=ddlr-$ID-br NS_A=ddlr-$ID-a NS_B=ddlr-$ID-b
A=198.18.2.1 B=198.18.2.2
ACCOUNT=ddlr-$ID
MADE_USER=0
SSHD_PIDS=()
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddl-ddlrun-hosts.XXXXXX")
chmod 755 "$tmp"

cleanup() {
  local rc=$? pid
  set +e
  trap - EXIT INT TERM
  if [[ $rc -ne 0 && $rc -ne $SKIP ]]; then
    for f in "$tmp"/*.log "$tmp"/*.out; do [[ -f $f ]] && { echo "----- ${f##*/}"; tail -n 60 "$f"; }; done
  fi
  for pid in "${SSHD_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${SSHD_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  netns_teardown
  if ((MADE_USER)) && ! userdel "$ACCOUNT" 2>/dev/null && ! userdel -f "$ACCOUNT"; then
    log "could not remove the account $ACCOUNT"
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

netns_build "$NS_BR" "$NS_A" "$A" "$NS_B" "$B"
netns_wait_up 10 "$NS_BR" "$NS_A" "$A" "$NS_B" "$B" || fail "the links did not come up within 10 s"
log "hosts $NS_A ($A) and $NS_B ($B) on bridge $NS_BR"

mkdir -p "$tmp/home"
useradd --home-dir "$tmp/home" --no-create-home --shell /bin/sh --comment "ddl ddlrun_hosts, removed on exit" \
  "$ACCOUNT" || fail "useradd $ACCOUNT failed"
MADE_USER=1
chown "$ACCOUNT:" "$tmp/home"
runuser -u "$ACCOUNT" -- test -x "$BIN/ddl-bench" ||
  skip "$ACCOUNT cannot run $BIN/ddl-bench (a directory above it is private)"
as_user() { runuser -u "$ACCOUNT" -- "$@"; }
as_user ssh-keygen -q -t ed25519 -N '' -f "$tmp/home/id"
as_user ssh-keygen -q -t ed25519 -N '' -f "$tmp/home/host_key"
as_user cp "$tmp/home/id.pub" "$tmp/home/authorized_keys"

n=0
for pair in "$NS_A $A" "$NS_B $B"; do
  read -r ns addr <<<"$pair"
  n=$((n + 1))
  cat >"$tmp/sshd-$n.conf" <<CONF
Port 2222
ListenAddress $addr
HostKey $tmp/home/host_key
AuthorizedKeysFile $tmp/home/authorized_keys
PidFile $tmp/home/sshd-$n.pid
UsePAM no
StrictModes no
PasswordAuthentication no
KbdInteractiveAuthentication no
LogLevel ERROR
CONF
  ip netns exec "$ns" unshare --ipc runuser -u "$ACCOUNT" -- "$SSHD" -D -e -f "$tmp/sshd-$n.conf" \
    >"$tmp/sshd-$n.log" 2>&1 &
  SSHD_PIDS+=($!)
done
RSH="ssh -p 2222 -i $tmp/home/id -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes"
RSH+=" -o LogLevel=ERROR"
# The launcher runs on host a as the account; it reaches both hosts (a too) over ssh.
on_a() { ip netns exec "$NS_A" unshare --ipc runuser -u "$ACCOUNT" -- "$@"; }
for host in "$A" "$B"; do
  up=0
  for ((i = 0; i < 50; i++)); do
    # shellcheck disable=SC2086
    on_a $RSH "$host" true 2>/dev/null && { up=1; break; }
    sleep 0.2
  done
  ((up)) || fail "sshd on $host does not answer (its log: $(cat "$tmp"/sshd-*.log))"
done
log "sshd answers on $A:2222 and $B:2222 (as $ACCOUNT, $SSHD)"

# 1. Where each rank runs, then a 4-rank ddl-bench over TCP between the hosts. (The single-quoted scripts are
# the ranks': they expand on the hosts.)
cd "$tmp/home"
# shellcheck disable=SC2016
on_a "$BIN/ddlrun" -H "$A:2,$B:2" --rsh "$RSH" -- /bin/sh -c \
  'echo "$DDL_RANK/$DDL_WORLD_SIZE local $DDL_LOCAL_RANK $(ip -o -4 addr show dev eth0 | awk "{print \$4}") $DDL_ROOT"' \
  >"$tmp/where.out" 2>&1 || fail "ddlrun -H $A:2,$B:2 failed: $(cat "$tmp/where.out")"
sort "$tmp/where.out" >"$tmp/where.sorted"
for want in "[0] 0/4 local 0 $A/24 $A:" "[1] 1/4 local 1 $A/24 $A:" "[2] 2/4 local 0 $B/24 $A:" \
  "[3] 3/4 local 1 $B/24 $A:"; do
  grep -F -- "$want" "$tmp/where.sorted" >/dev/null || fail "no line '$want...' in: $(cat "$tmp/where.sorted")"
done
log "ranks 0-1 on $A, 2-3 on $B, DDL_ROOT on $A: $(tr '\n' ';' <"$tmp/where.sorted")"

on_a "$BIN/ddlrun" -H "$A:2,$B:2" --rsh "$RSH" -x UCX_TLS=tcp,sm,self -- "$BIN/ddl-bench" -b 1K -e 1M -n 5 \
  >"$tmp/bench.out" 2>&1 || fail "ddl-bench across the hosts failed"
grep -F "# Out of bounds values : 0 OK" "$tmp/bench.out" >/dev/null || fail "ddl-bench's check did not pass"
log "ddl-bench, 4 ranks on 2 hosts: $(grep -F 'Avg bus bandwidth' "$tmp/bench.out" | head -n 1 | sed 's/^\[0\] //')"

# 2. A rank failing on host b: the run ends with its status, and no rank is left on either host.
set +e
# shellcheck disable=SC2016
on_a "$BIN/ddlrun" -H "$A:2,$B:2" --rsh "$RSH" --grace-ms 1000 -- /bin/sh -c \
  'if [ "$DDL_RANK" = 3 ]; then sleep 1; exit 7; fi; exec sleep 61.5' >"$tmp/fail.out" 2>&1
rc=$?
set -e
[[ $rc -eq 7 ]] || fail "a rank exiting 7 on $B gave ddlrun status $rc: $(cat "$tmp/fail.out")"
grep -F "host $B (ranks 2-3)" "$tmp/fail.out" >/dev/null || fail "ddlrun did not name host $B: $(cat "$tmp/fail.out")"
for ((i = 0; i < 50; i++)); do
  pgrep -f 'sleep 61.5' >/dev/null || break
  sleep 0.2
done
pgrep -f 'sleep 61.5' >/dev/null && fail "ranks outlived the run: $(pgrep -af 'sleep 61.5')"
log "a rank exiting 7 on $B: ddlrun exited 7 and stopped the ranks on both hosts"
log "PASSED"
