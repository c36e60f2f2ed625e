# shellcheck shell=bash disable=SC2034 # sets variables for the scripts that source it
# Hosts made of Linux network namespaces on one machine, for tests/e2e/netns_test.sh and bench/hierarchy.sh.
# Source it; it defines functions and starts nothing.
#
#   NS_BR   bridge br0 (no address of its own)            netns_build NS_BR NS_A 198.18.0.1 NS_B 198.18.0.2 ...
#   NS_A    eth0 198.18.0.1/24 <-> NS_BR:veth1
#   NS_B    eth0 198.18.0.2/24 <-> NS_BR:veth2   ...
#
# Each veth is created inside the bridge namespace with its peer moved straight into the host namespace, so no
# interface name ever appears in the caller's namespace and parallel runs cannot collide. Every namespace has
# lo up (UCX and rendezvous use it). Deleting a namespace deletes its veth end and with it the pair, so
# netns_teardown (kill what runs inside, delete the namespaces) is the whole cleanup.
#
# Two things make a namespace a "host" for UCX and MPI, beyond its network:
#  - its own IPC namespace (netns_host_prefix: `unshare --ipc`): UCX 1.13 deems shared memory (sysv, posix)
#    reachable between processes with the same boot id and IPC namespace, so without it, ranks on different
#    "hosts" of this one kernel would talk through shared memory instead of the network. All the processes of
#    one host must share it, so start them under one `unshare --ipc`.
#  - for Open MPI, also its own host name (`unshare --uts`): vader's shared-memory segments and ORTE's session
#    directory are named after the host name, so two "hosts" with the machine's name collide in /dev/shm and
#    /tmp. libddl is better off with the machine's name: it counts ranks sharing a host name to tell whether they
#    share CPUs, and here all the hosts do share this machine's CPUs.
#
# Everything here needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN); netns_preflight says why not where it cannot run.

NETNS_CREATED=()   # the namespaces netns_build created, for netns_teardown
NETNS_SHAPING=     # what netns_shape put on the last link: "netem delay ... rate ...", "tbf rate ...", or ""
NETNS_DELAYED=0    # 1 when netns_shape could add the delay (netem), 0 otherwise
NETNS_WHY=         # why netns_preflight failed

netns__say() {
  if declare -F log >/dev/null; then log "$@"; else printf '[netns] %s\n' "$*" >&2; fi
}

# (grep without -q: with pipefail, a grep that quits at its first match can fail the pipeline by SIGPIPE)
netns_exists() { ip netns list 2>/dev/null | awk '{ print $1 }' | grep -xF -- "$1" >/dev/null; }

# 0 when this machine can build namespaced hosts (root, iproute2, namespaces, bridges, veths); else 1 with the
# reason in NETNS_WHY. PROBE names a throw-away namespace (unique per caller).
netns_preflight() {
  local probe=$1
  NETNS_WHY=
  if [[ $(id -u) -ne 0 ]]; then
    NETNS_WHY="needs root to create network namespaces"
  elif ! command -v ip >/dev/null; then
    NETNS_WHY="needs iproute2 (ip) to create network namespaces"
  elif ! ip netns add "$probe" 2>/dev/null; then
    NETNS_WHY="needs root with CAP_SYS_ADMIN to create network namespaces (ip netns add failed)"
  else
    if ! ip -n "$probe" link set lo up 2>/dev/null; then
      NETNS_WHY="cannot configure a network namespace here (ip -n NS link set lo up failed)"
    elif ! ip -n "$probe" link add name pbr0 type bridge 2>/dev/null ||
         ! ip -n "$probe" link add name pveth0 type veth peer name pveth1 2>/dev/null; then
      NETNS_WHY="the kernel cannot create bridges or veth pairs here (CONFIG_BRIDGE, CONFIG_VETH)"
    fi
    ip netns del "$probe" 2>/dev/null || true
  fi
  [[ -z $NETNS_WHY ]]
}

# netns_build BR_NS NS ADDR [NS ADDR ...]: the namespaces, bridge br0 in BR_NS, and NS's eth0 (ADDR/24) joined to
# it by veth1, veth2, ... in the order given. Records every namespace it creates for netns_teardown.
netns_build() {
  local br=$1 ns addr n=1
  shift
  ip netns add "$br"
  NETNS_CREATED+=("$br")
  ip -n "$br" link set lo up
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up
  while (($# >= 2)); do
    ns=$1 addr=$2
    shift 2
    ip netns add "$ns"
    NETNS_CREATED+=("$ns")
    ip -n "$ns" link set lo up
    ip -n "$br" link add "veth$n" type veth peer name eth0 netns "$ns"
    ip -n "$br" link set "veth$n" master br0
    ip -n "$br" link set "veth$n" up
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set eth0 up
    n=$((n + 1))
  done
}

# netns_shape NS DEV RATE [DELAY]: shapes DEV's egress in NS. "netem delay DELAY rate RATE" where the kernel has
# sch_netem, else "tbf rate RATE" (no added delay: tbf only limits the rate), else nothing. Sets NETNS_SHAPING
# to what it put there ("" for nothing) and NETNS_DELAYED; status 0 when the rate is limited, 1 when not.
netns_shape() {
  local ns=$1 dev=$2 rate=$3 delay=${4:-}
  NETNS_SHAPING='' NETNS_DELAYED=0
  command -v tc >/dev/null || return 1
  if [[ -n $delay && $delay != 0 && $delay != 0ms ]] &&
     tc -n "$ns" qdisc add dev "$dev" root netem delay "$delay" rate "$rate" 2>/dev/null; then
    NETNS_SHAPING="netem delay $delay rate $rate" NETNS_DELAYED=1
    return 0
  fi
  # A 256 KiB bucket: enough for a 64 KiB GSO packet and for the full rate. What fits in it after an idle moment
  # leaves at the veth's own speed (tbf shapes sustained traffic, not a message's first bytes). Packets may wait
  # up to 20 ms in the queue before tbf drops them.
  if tc -n "$ns" qdisc add dev "$dev" root tbf rate "$rate" burst 256kb latency 20ms 2>/dev/null; then
    NETNS_SHAPING="tbf rate $rate"
    return 0
  fi
  return 1
}

# netns_link_up NS DEV: carrier on both ends.
netns_link_up() { ip -n "$1" -o link show dev "$2" 2>/dev/null | grep 'LOWER_UP' >/dev/null; }

# netns_wait_up SECONDS BR_NS NS ADDR [NS ADDR ...] (as given to netns_build): waits until every link has a
# carrier at both ends and its bridge port forwards, and, where ping exists, until each host answers the next
# one's ping. Status 1 if that did not happen in time.
netns_wait_up() {
  local secs=$1 br=$2 deadline i n ns
  shift 2
  local -a args=("$@")
  deadline=$((SECONDS + secs))
  while ((SECONDS < deadline)); do
    local ok=1
    for ((i = 0, n = 1; i + 1 < ${#args[@]}; i += 2, n++)); do
      ns=${args[i]}
      if ! netns_link_up "$br" "veth$n" || ! netns_link_up "$ns" eth0 ||
         ! ip -n "$br" -o link show dev "veth$n" | grep 'state UP' >/dev/null; then
        ok=0
        break
      fi
    done
    if ((ok)) && command -v ping >/dev/null; then
      for ((i = 2; i + 1 < ${#args[@]}; i += 2)); do
        ip netns exec "${args[i]}" ping -c 1 -W 1 "${args[i - 1]}" >/dev/null 2>&1 || { ok=0; break; }
      done
    fi
    ((ok)) && return 0
    sleep 0.2
  done
  return 1
}

# Sets the array NETNS_HOST_PREFIX to the command that starts a host's processes in an IPC namespace of their
# own (see the top of this file): (unshare --ipc), or () with a warning where unshare cannot.
netns_host_prefix() {
  NETNS_HOST_PREFIX=()
  if command -v unshare >/dev/null && unshare --ipc true 2>/dev/null; then
    NETNS_HOST_PREFIX=(unshare --ipc)
  else
    netns__say "warning: unshare --ipc is not usable: ranks of different hosts may use shared memory, not TCP"
  fi
}

# Kills (SIGKILL) whatever still runs in the namespaces netns_build created, then deletes them; never fails.
# The processes are found by namespace, not by name, so nothing else on the machine is touched.
netns_teardown() {
  local ns pids i
  for ns in "${NETNS_CREATED[@]}"; do
    netns_exists "$ns" || continue
    pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    if [[ -n ${pids// /} ]]; then
      netns__say "killing leftover processes in $ns: $pids"
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null
    fi
  done
  for ns in "${NETNS_CREATED[@]}"; do
    netns_exists "$ns" || continue
    for ((i = 0; i < 20; i++)); do
      ip netns del "$ns" 2>/dev/null && break
      sleep 0.2
    done
    netns_exists "$ns" && netns__say "warning: could not delete namespace $ns"
  done
  NETNS_CREATED=()
  return 0
}
