#!/usr/bin/env bash
# Tests of what deploy/ ships (ctest label deploy), in three parts that skip on their own:
#
#   units     systemd-analyze verify on deploy/systemd/*.service, each copied with ExecStart pointed at the
#             build's binary (verify refuses an ExecStart that does not exist). verify exits 0 on unknown keys
#             and bad values, only printing them, so any line it prints about our units is a failure. The
#             agent's unit runs as root (it runs ranks as their jobs' users); neither unit asks for plaintext.
#   configs   the shipped deploy/etc/ddl/*.json are secure by default (pki_dir /etc/ddl/pki, insecure false),
#             and the daemons run on them, with --pki-dir pointed at a PKI made in the scratch directory
#             (init-pki, issue-node): the coordinator serves TLS (coordinator.addr appears), the agent registers
#             over mutual TLS (ddlctl nodes with the admin token shows it UP); with the coordinator stopped
#             (SIGTERM) the agent keeps retrying and stops on SIGTERM within 10 s. Each daemon refuses to start,
#             naming the file, without its PKI files, and with a config with a misspelt key, naming the key.
#             Where python3 is present, a NOTIFY_SOCKET stand-in checks READY=1 (after coordinator.addr is
#             written) and STOPPING=1, what the Type=notify units wait for.
#   packages  cpack -G DEB into a scratch directory; each .deb unpacked with dpkg -x (nothing installed on this
#             machine); layout, conffiles, maintainer scripts and dependencies checked; systemd-analyze verify
#             --root on the unpacked tree (the packaged units against the packaged binaries); the unpacked
#             coordinator starts from its unpacked config (with a PKI that its own init-pki makes), ddl-bench
#             finds the unpacked libddl.so.0; no package ships a key or makes one in its maintainer scripts;
#             libddl holds ddl.pc (prefix /usr) and the CMake package, naming no build path.
#
# Usage: deploy_test.sh units|configs|packages SOURCE_DIR BUILD_DIR   (BUILD_DIR must be built: bin/, CPack files)
# Environment (optional): DDL_DEPLOY_KEEP=1 keeps the scratch directory (packages, unpacked trees, logs).
# Exit status: 0 passed, 1 failed, 77 skipped (a tool the part needs is missing; the reason is printed).
set -euo pipefail
# With pipefail, `producer | grep -q` fails at random (grep exits at the first match, the producer then gets
# SIGPIPE), so every grep below reads a file or captured output (<<<).

SKIP=77
part=${1:?usage: deploy_test.sh units|configs|packages SOURCE_DIR BUILD_DIR}
SRC=$(cd "${2:?no SOURCE_DIR}" && pwd)
BUILD=$(cd "${3:?no BUILD_DIR}" && pwd)
BIN=$BUILD/bin

log() { printf '[deploy %s %s] %s\n' "$part" "$(date +%T)" "$*"; }
skip() { log "skipped: $*"; exit "$SKIP"; }
fail() { log "FAIL: $*" >&2; exit 1; }

unset NOTIFY_SOCKET  # the daemons under test must not notify a service manager this test runs under
unset DDL_TOKEN DDL_TOKEN_FILE DDL_CA DDL_COORDINATOR  # the caller's ddlctl settings ($DDL_TOKEN beats --token-file)
tmp=$(mktemp -d /tmp/ddl-deploy-test.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  if [[ ${DDL_DEPLOY_KEEP:-0} == 1 ]]; then log "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

need_bin() {
  for b in "$@"; do [[ -x $BIN/$b ]] || fail "$BIN/$b is missing (build it first)"; done
}

# wait_for SECONDS COMMAND...: polls COMMAND every 0.1 s; non-zero if it never succeeded.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# stop_within SECONDS PID: SIGTERM to a child of this shell, then its exit status; fails (after a SIGKILL) if it
# outlives SECONDS.
stop_within() {
  local limit=$1 pid=$2 rc=0 start=$SECONDS wd
  kill -TERM "$pid"
  (sleep "$limit"; kill -KILL "$pid" 2>/dev/null) >/dev/null 2>&1 &
  wd=$!
  wait "$pid" || rc=$?
  kill "$wd" 2>/dev/null || true
  ((SECONDS - start < limit)) || fail "pid $pid still running ${limit} s after SIGTERM"
  return "$rc"
}

# A NOTIFY_SOCKET stand-in: a Unix datagram socket whose messages are appended, one a line, to a file.
notify_listener() {  # SOCKET FILE; prints the listener's pid
  python3 - "$1" "$2" >/dev/null 2>&1 <<'EOF' &
import os, socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as out:
    while True:
        out.write(s.recv(4096).decode().replace("\n", " ").strip() + "\n")
EOF
  echo $!
}

# ---- units -------------------------------------------------------------------------------------------------
test_units() {
  command -v systemd-analyze >/dev/null || skip "systemd-analyze is absent (Debian package systemd)"
  need_bin ddl-coordinator ddl-agent
  # What the packages and docs rely on, checked on the shipped files themselves.
  grep -qx 'ExecStart=/usr/bin/ddl-coordinator --config /etc/ddl/coordinator.json' \
    "$SRC/deploy/systemd/ddl-coordinator.service" || fail "ddl-coordinator.service: unexpected ExecStart"
  grep -qx 'ExecStart=/usr/bin/ddl-agent --config /etc/ddl/agent.json' "$SRC/deploy/systemd/ddl-agent.service" ||
    fail "ddl-agent.service: unexpected ExecStart"
  grep -qx 'KillMode=process' "$SRC/deploy/systemd/ddl-agent.service" ||
    fail "ddl-agent.service must keep KillMode=process (ranks outlive an agent restart)"
  # The agent switches to each job's user to run its ranks: only root can.
  if grep -qE '^(User|Group|DynamicUser|NoNewPrivileges|CapabilityBoundingSet)=' \
       "$SRC/deploy/systemd/ddl-agent.service"; then
    fail "ddl-agent.service must run as root with its capabilities (it runs ranks as the jobs' users)"
  fi
  for u in ddl-coordinator ddl-agent; do
    grep -qx 'Type=notify' "$SRC/deploy/systemd/$u.service" || fail "$u.service: not Type=notify"
    sed "s|^ExecStart=/usr/bin/|ExecStart=$BIN/|" "$SRC/deploy/systemd/$u.service" >"$tmp/$u.service"
  done
  local out rc=0
  # The cgroup ddl-agent confines ranks under is a unit of its own (a cgroup with controllers delegated below it
  # can hold no process: systemd could not restart the agent in it while confined ranks live).
  grep -q '^Delegate=' "$SRC/deploy/systemd/ddl-agent.service" &&
    fail "ddl-agent.service must not be delegated: its restarts would fail while confined ranks live"
  grep -qx 'Delegate=yes' "$SRC/deploy/systemd/ddl-ranks.service" || fail "ddl-ranks.service: not Delegate=yes"
  grep -qx 'KillMode=process' "$SRC/deploy/systemd/ddl-ranks.service" ||
    fail "ddl-ranks.service must keep KillMode=process (stopping it must not kill ranks)"
  cp "$SRC/deploy/systemd/ddl-ranks.service" "$tmp/ddl-ranks.service"
  out=$(systemd-analyze verify --man=no "$tmp/ddl-coordinator.service" "$tmp/ddl-agent.service" \
    "$tmp/ddl-ranks.service" 2>&1) || rc=$?
  printf '%s\n' "$out" | sed '/^$/d; s/^/  verify: /'
  ((rc == 0)) || fail "systemd-analyze verify exited $rc"
  if grep -q -e 'ddl-coordinator\.service' -e 'ddl-agent\.service' -e 'ddl-ranks\.service' <<<"$out"; then
    fail "systemd-analyze verify complained about the units (above)"
  fi
  log "systemd-analyze verify: the three units clean"
}

# ---- configs -----------------------------------------------------------------------------------------------
test_configs() {
  need_bin ddl-coordinator ddl-agent ddlctl
  local have_notify=0
  if command -v python3 >/dev/null; then have_notify=1; else log "note: python3 absent, sd_notify not checked"; fi
  local coord_extra=()
  # Where the coordinator has a dashboard, keep it off the default port (parallel runs, a real coordinator).
  if grep -q -- "--http" <<<"$("$BIN/ddl-coordinator" --help 2>&1)"; then coord_extra=(--http 127.0.0.1:0); fi

  # Secure by default: both configs name /etc/ddl/pki and neither asks for plaintext.
  local d conf
  for d in coordinator agent; do
    conf=$(<"$SRC/deploy/etc/ddl/$d.json")
    grep -q '"pki_dir": *"/etc/ddl/pki"' <<<"$conf" || fail "$d.json: pki_dir is not /etc/ddl/pki"
    if grep -q '"insecure": *true' <<<"$conf"; then fail "$d.json: insecure is true"; fi
  done

  # The PKI an operator makes (init-pki on the coordinator's host, issue-node per node), in the scratch
  # directory: --pki-dir points the daemons at it instead of the configs' /etc/ddl/pki.
  local pki=$tmp/pki node=ddl-deploy-test
  "$BIN/ddl-coordinator" init-pki "$pki" >"$tmp/pki.log" 2>&1 || { cat "$tmp/pki.log"; fail "init-pki failed"; }
  "$BIN/ddl-coordinator" --pki-dir "$pki" issue-node "$node" --out "$tmp/node-pki" >>"$tmp/pki.log" 2>&1 ||
    { cat "$tmp/pki.log"; fail "issue-node failed"; }

  # The coordinator with the shipped config.
  local c=$tmp/coordinator notify_env=()
  mkdir -p "$c"
  if ((have_notify)); then
    pids+=("$(notify_listener "$tmp/coordinator.notify" "$c/notify.log")")
    wait_for 5 test -S "$tmp/coordinator.notify" || fail "the NOTIFY_SOCKET stand-in did not start"
    notify_env=(NOTIFY_SOCKET="$tmp/coordinator.notify")
  fi
  env "${notify_env[@]}" "$BIN/ddl-coordinator" --config "$SRC/deploy/etc/ddl/coordinator.json" --data-dir "$c/data" \
    --pki-dir "$pki" --listen 127.0.0.1:0 "${coord_extra[@]}" >"$c/out.log" 2>&1 &
  local cpid=$!; pids+=("$cpid")
  wait_for 15 test -s "$c/data/coordinator.addr" ||
    { cat "$c/out.log"; fail "ddl-coordinator did not write coordinator.addr with the shipped config"; }
  local addr
  addr=$(<"$c/data/coordinator.addr")
  log "ddl-coordinator serves TLS with coordinator.json on $addr"
  if ((have_notify)); then
    wait_for 5 grep -qx 'READY=1' "$c/notify.log" || fail "ddl-coordinator sent no READY=1 (built without libsystemd?)"
  fi

  # The agent with the shipped config and the node's certificate registers over mutual TLS.
  local a=$tmp/agent
  mkdir -p "$a"
  notify_env=()
  if ((have_notify)); then
    pids+=("$(notify_listener "$tmp/agent.notify" "$a/notify.log")")
    wait_for 5 test -S "$tmp/agent.notify" || fail "the NOTIFY_SOCKET stand-in did not start"
    notify_env=(NOTIFY_SOCKET="$tmp/agent.notify")
  fi
  env "${notify_env[@]}" "$BIN/ddl-agent" --config "$SRC/deploy/etc/ddl/agent.json" --data-dir "$a/data" \
    --coordinator "$addr" --node "$node" --pki-dir "$tmp/node-pki" >"$a/out.log" 2>&1 &
  local apid=$!; pids+=("$apid")
  if ((have_notify)); then
    wait_for 10 grep -qx 'READY=1' "$a/notify.log" || { cat "$a/out.log"; fail "ddl-agent sent no READY=1"; }
  fi
  node_up() {
    grep -qE "^$node +UP " <<<"$("$BIN/ddlctl" --coordinator "$addr" --ca "$pki/ca.crt" \
      --token-file "$pki/admin.token" --timeout 5 nodes 2>"$tmp/ddlctl.err")"
  }
  wait_for 15 node_up ||
    { cat "$a/out.log" "$c/out.log" "$tmp/ddlctl.err"; fail "ddl-agent did not register over TLS"; }
  log "ddl-agent registered over mutual TLS with agent.json (ddlctl nodes with the admin token: $node UP)"

  local rc=0
  stop_within 15 "$cpid" || rc=$?
  ((rc == 0)) || { cat "$c/out.log"; fail "ddl-coordinator exited $rc after SIGTERM"; }
  if ((have_notify)); then
    wait_for 2 grep -qx 'STOPPING=1' "$c/notify.log" || fail "ddl-coordinator sent no STOPPING=1 on SIGTERM"
    log "ddl-coordinator notified: $(paste -sd' ' "$c/notify.log")"
  fi

  # With the coordinator gone the agent keeps retrying.
  sleep 1
  kill -0 "$apid" 2>/dev/null || { cat "$a/out.log"; fail "ddl-agent exited when its coordinator stopped"; }
  rc=0
  stop_within 10 "$apid" || rc=$?
  ((rc == 0)) || { cat "$a/out.log"; fail "ddl-agent exited $rc after SIGTERM"; }
  if ((have_notify)); then
    wait_for 2 grep -qx 'STOPPING=1' "$a/notify.log" || fail "ddl-agent sent no STOPPING=1 on SIGTERM"
    log "ddl-agent notified: $(paste -sd' ' "$a/notify.log")"
  fi
  log "ddl-agent runs with agent.json, outlives its coordinator and stops on SIGTERM"

  # Without their PKI files neither daemon starts, and each says which file it lacks.
  rc=0
  timeout 20 "$BIN/ddl-coordinator" --config "$SRC/deploy/etc/ddl/coordinator.json" --pki-dir "$tmp/no-pki" \
    --data-dir "$tmp/no-pki-c" --listen 127.0.0.1:0 "${coord_extra[@]}" >"$tmp/no-pki-c.log" 2>&1 || rc=$?
  ((rc != 0 && rc != 124)) || fail "ddl-coordinator without its PKI files: exit $rc, expected a refusal"
  # Its last line.
  grep -q "$tmp/no-pki/" <<<"$(tail -n1 "$tmp/no-pki-c.log")" ||
    { cat "$tmp/no-pki-c.log"; fail "ddl-coordinator's refusal names no file"; }
  log "ddl-coordinator refuses to start without its PKI: $(tail -n1 "$tmp/no-pki-c.log")"
  rc=0
  timeout 20 "$BIN/ddl-agent" --config "$SRC/deploy/etc/ddl/agent.json" --pki-dir "$tmp/no-pki" \
    --data-dir "$tmp/no-pki-a" --coordinator 127.0.0.1:1 >"$tmp/no-pki-a.log" 2>&1 || rc=$?
  ((rc != 0 && rc != 124)) || fail "ddl-agent without its PKI files: exit $rc, expected a refusal"
  grep -q "$tmp/no-pki/" <<<"$(tail -n1 "$tmp/no-pki-a.log")" ||
    { cat "$tmp/no-pki-a.log"; fail "ddl-agent's refusal names no file"; }
  log "ddl-agent refuses to start without its PKI: $(tail -n1 "$tmp/no-pki-a.log")"

  # A misspelt key stops each daemon at start, naming the key.
  sed 's/"heartbeat_grace_s"/"heartbeat_grace"/' "$SRC/deploy/etc/ddl/coordinator.json" >"$tmp/typo-coordinator.json"
  sed 's/"stop_grace_s"/"stop_grace"/' "$SRC/deploy/etc/ddl/agent.json" >"$tmp/typo-agent.json"
  rc=0
  timeout 20 "$BIN/ddl-coordinator" --config "$tmp/typo-coordinator.json" --data-dir "$tmp/typo-c" \
    --pki-dir "$pki" --listen 127.0.0.1:0 "${coord_extra[@]}" >"$tmp/typo-c.log" 2>&1 || rc=$?
  ((rc != 0 && rc != 124)) || fail "ddl-coordinator with a misspelt key: exit $rc, expected a refusal"
  grep -q "unknown key 'heartbeat_grace'" "$tmp/typo-c.log" ||
    { cat "$tmp/typo-c.log"; fail "ddl-coordinator's refusal does not name the key"; }
  log "ddl-coordinator refuses a misspelt key: $(head -1 "$tmp/typo-c.log")"
  rc=0
  timeout 20 "$BIN/ddl-agent" --config "$tmp/typo-agent.json" --data-dir "$tmp/typo-a" \
    --pki-dir "$tmp/node-pki" --coordinator 127.0.0.1:1 >"$tmp/typo-a.log" 2>&1 || rc=$?
  ((rc != 0 && rc != 124)) || fail "ddl-agent with a misspelt key: exit $rc, expected a refusal"
  grep -q "unknown key 'stop_grace'" "$tmp/typo-a.log" ||
    { cat "$tmp/typo-a.log"; fail "ddl-agent's refusal does not name the key"; }
  log "ddl-agent refuses a misspelt key: $(head -1 "$tmp/typo-a.log")"
}

# ---- packages ----------------------------------------------------------------------------------------------
test_packages() {
  command -v cpack >/dev/null || skip "cpack is absent (Debian package cmake)"
  command -v dpkg-deb >/dev/null || skip "dpkg-deb is absent (not a Debian system)"
  [[ -f $BUILD/CPackConfig.cmake ]] || fail "$BUILD/CPackConfig.cmake is missing (configure the build)"
  local arch version
  arch=$(dpkg --print-architecture)
  version=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$BUILD/CPackConfig.cmake")
  [[ -n $version ]] || fail "no CPACK_PACKAGE_VERSION in $BUILD/CPackConfig.cmake"

  # The staging tree (_CPack_Packages) goes under -B too, so the build directory is left as it was.
  (cd "$tmp" && cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$tmp/pkg" >"$tmp/cpack.log" 2>&1) ||
    { cat "$tmp/cpack.log"; fail "cpack failed"; }
  log "cpack: $(grep -c 'generated' "$tmp/cpack.log") packages after ${SECONDS} s"

  declare -A files=(
    [ddl-coordinator]="usr/bin/ddl-coordinator lib/systemd/system/ddl-coordinator.service etc/ddl/coordinator.json"
    [ddl-agent]="usr/bin/ddl-agent usr/libexec/ddl/ddl-rank-shim lib/systemd/system/ddl-agent.service lib/systemd/system/ddl-ranks.service etc/ddl/agent.json"
    [ddlctl]="usr/bin/ddlctl"
    [libddl]="usr/include/ddl/ddl.h usr/bin/ddlrun usr/bin/ddl-bench usr/bin/ddl-sim usr/lib/pkgconfig/ddl.pc
              usr/lib/cmake/ddl/ddlConfig.cmake usr/lib/cmake/ddl/ddlConfigVersion.cmake
              usr/lib/cmake/ddl/ddlTargets.cmake"
  )
  local all=$tmp/root pkg deb f
  mkdir -p "$all"
  for pkg in ddl-coordinator ddl-agent ddlctl libddl; do
    deb=$tmp/pkg/${pkg}_${version}_${arch}.deb
    [[ -f $deb ]] || { ls "$tmp/pkg"; fail "no $deb"; }
    [[ $(dpkg-deb -f "$deb" Package) == "$pkg" ]] || fail "$deb: Package is not $pkg"
    [[ $(dpkg-deb -f "$deb" Architecture) == "$arch" ]] || fail "$deb: Architecture is not $arch"
    grep -q libc6 <<<"$(dpkg-deb -f "$deb" Depends)" || fail "$deb: Depends lacks libc6 (did dpkg-shlibdeps run?)"
    local root=$tmp/x/$pkg
    mkdir -p "$root"
    dpkg -x "$deb" "$root"
    dpkg -x "$deb" "$all"
    for f in ${files[$pkg]}; do [[ -f $root/$f ]] || fail "$pkg: no /$f"; done
    # Nothing under /usr/local, and no file of another package.
    [[ ! -e $root/usr/local ]] || fail "$pkg: installs under /usr/local"
    log "$pkg: $(dpkg-deb -c "$deb" | grep -vc '/$') files; Depends: $(dpkg-deb -f "$deb" Depends)"
  done
  compgen -G "$tmp/x/libddl/usr/lib/libddl.so.0*" >/dev/null ||
    compgen -G "$tmp/x/libddl/usr/lib/*/libddl.so.0*" >/dev/null || fail "libddl: no usr/lib/libddl.so.0"
  [[ -e $tmp/x/libddl/usr/lib/libddl.so || -n $(compgen -G "$tmp/x/libddl/usr/lib/*/libddl.so") ]] ||
    fail "libddl: no usr/lib/libddl.so (link -lddl)"

  # The configs are the shipped examples and conffiles; the daemons' maintainer scripts are valid sh.
  local d
  for d in coordinator agent; do
    deb=$tmp/pkg/ddl-${d}_${version}_${arch}.deb
    cmp -s "$SRC/deploy/etc/ddl/$d.json" "$tmp/x/ddl-$d/etc/ddl/$d.json" || fail "ddl-$d: /etc/ddl/$d.json differs"
    mkdir -p "$tmp/ctl/$d"
    dpkg-deb -e "$deb" "$tmp/ctl/$d"
    grep -qx "/etc/ddl/$d.json" "$tmp/ctl/$d/conffiles" || fail "ddl-$d: /etc/ddl/$d.json is not a conffile"
    for f in postinst prerm postrm; do
      [[ -x $tmp/ctl/$d/$f ]] || fail "ddl-$d: no executable $f"
      sh -n "$tmp/ctl/$d/$f" || fail "ddl-$d: $f is not valid sh"
      # The operator makes the CA (init-pki); no maintainer script does.
      if grep -qE 'init-pki|issue-node|renew-cert|openssl' <<<"$(grep -v '^ *#' "$tmp/ctl/$d/$f")"; then
        fail "ddl-$d: $f makes certificates or keys"
      fi
    done
  done
  # No package ships a certificate, key or token.
  local shipped
  shipped=$(find "$all" -name '*.key' -o -name '*.crt' -o -name '*.token' -o -name users.json)
  [[ -z $shipped ]] || fail "a package ships PKI files: $shipped"
  mkdir -p "$tmp/ctl/libddl"
  dpkg-deb -e "$tmp/pkg/libddl_${version}_${arch}.deb" "$tmp/ctl/libddl"
  grep -q '^libddl 0 libddl' "$tmp/ctl/libddl/shlibs" || fail "libddl: no shlibs entry for libddl.so.0"
  # ddl.pc is written at install time: it must name /usr, not cpack's staging directory. (Linking with it and
  # with the CMake package is tests/deploy/link_test.sh's part.)
  grep -qx 'prefix=/usr' "$tmp/x/libddl/usr/lib/pkgconfig/ddl.pc" ||
    fail "libddl: /usr/lib/pkgconfig/ddl.pc does not say prefix=/usr: $(grep '^prefix=' "$tmp/x/libddl/usr/lib/pkgconfig/ddl.pc")"
  local leaks
  leaks=$(grep -rlF -e "$BUILD" -e "$SRC" -e _CPack_Packages "$tmp/x/libddl/usr/lib/pkgconfig" \
    "$tmp/x/libddl/usr/lib/cmake" || true)
  [[ -z $leaks ]] || fail "libddl: pkg-config or CMake files name the build tree: $leaks"

  # No binary points into the build tree.
  for f in "$all"/usr/bin/* "$all"/usr/lib/libddl.so.0*; do
    [[ -L $f ]] && continue
    if grep -qE "(RPATH|RUNPATH).*$BUILD" <<<"$(readelf -d "$f" 2>/dev/null)"; then
      fail "${f#"$all"} has an RPATH into the build directory"
    fi
  done
  # The unpacked binaries run: ddl-bench finds the unpacked libddl.so.0, the coordinator its unpacked config.
  LD_LIBRARY_PATH=$all/usr/lib "$all/usr/bin/ddl-bench" --help >/dev/null 2>&1 ||
    fail "unpacked ddl-bench --help failed with LD_LIBRARY_PATH=$all/usr/lib"
  grep -q "libddl.so.0 => $all/usr/lib/" <<<"$(LD_LIBRARY_PATH=$all/usr/lib ldd "$all/usr/bin/ddl-bench")" ||
    fail "unpacked ddl-bench does not resolve libddl.so.0 from the unpacked tree"
  local coord_extra=()
  if grep -q -- "--http" <<<"$("$all/usr/bin/ddl-coordinator" --help 2>&1)"; then coord_extra=(--http 127.0.0.1:0); fi
  "$all/usr/bin/ddl-coordinator" init-pki "$tmp/pc-pki" >"$tmp/pc.log" 2>&1 ||
    { cat "$tmp/pc.log"; fail "unpacked ddl-coordinator init-pki failed"; }
  "$all/usr/bin/ddl-coordinator" --config "$all/etc/ddl/coordinator.json" --data-dir "$tmp/pc" --pki-dir "$tmp/pc-pki" \
    --listen 127.0.0.1:0 "${coord_extra[@]}" >>"$tmp/pc.log" 2>&1 &
  local cpid=$!; pids+=("$cpid")
  wait_for 15 test -s "$tmp/pc/coordinator.addr" || { cat "$tmp/pc.log"; fail "unpacked ddl-coordinator did not start"; }
  stop_within 15 "$cpid" || { cat "$tmp/pc.log"; fail "unpacked ddl-coordinator did not stop cleanly"; }
  log "unpacked ddl-coordinator, ddlctl, ddl-bench run"
  "$all/usr/bin/ddlctl" --help >/dev/null || fail "unpacked ddlctl --help failed"

  # torch_ddl, where it was built: where Debian's python3 finds packages, depending on libddl and torch 1.13,
  # and importable from the unpacked tree.
  deb=$tmp/pkg/python3-torch-ddl_${version}_${arch}.deb
  if [[ -f $BUILD/python/torch_ddl/__init__.py ]]; then
    [[ -f $deb ]] || { ls "$tmp/pkg"; fail "torch_ddl was built but there is no $deb"; }
    dpkg -x "$deb" "$all"
    local pydir=$all/usr/lib/python3/dist-packages/torch_ddl
    [[ -f $pydir/__init__.py ]] || fail "python3-torch-ddl: no /usr/lib/python3/dist-packages/torch_ddl/__init__.py"
    compgen -G "$pydir/_C.cpython-*.so" >/dev/null || fail "python3-torch-ddl: no extension module"
    local deps
    deps=$(dpkg-deb -f "$deb" Depends)
    grep -q "libddl (= $version)" <<<"$deps" || fail "python3-torch-ddl: Depends lacks libddl (= $version): $deps"
    grep -q "python3-torch (<< 1.14)" <<<"$deps" || fail "python3-torch-ddl: Depends does not pin torch 1.13: $deps"
    if grep -qE "(RPATH|RUNPATH).*$BUILD" <<<"$(readelf -d "$pydir"/_C.cpython-*.so)"; then
      fail "python3-torch-ddl: the extension has an RPATH into the build directory"
    fi
    local ver
    ver=$(cd "$tmp" && PYTHONPATH=$all/usr/lib/python3/dist-packages LD_LIBRARY_PATH=$all/usr/lib \
      /usr/bin/python3 -c 'import torch_ddl, torch.distributed as d; assert "DDL" in d.Backend._plugins; print(torch_ddl.libddl_version())' 2>&1) ||
      fail "the unpacked torch_ddl does not import: $ver"
    log "python3-torch-ddl: imports from the unpacked tree (libddl $ver); Depends: $deps"
  else
    log "note: torch_ddl was not built here, python3-torch-ddl not checked"
  fi

  # The packaged units against the packaged binaries: verify with the unpacked tree as root. Its unit search
  # path needs the system's own targets (multi-user.target, network-online.target, ...), copied in.
  if command -v systemd-analyze >/dev/null && [[ -d /lib/systemd/system ]]; then
    mkdir -p "$all/usr/lib/systemd/system"
    cp -a /lib/systemd/system/. "$all/usr/lib/systemd/system/"
    local out rc=0
    out=$(systemd-analyze verify --man=no --root="$all" ddl-coordinator.service ddl-agent.service 2>&1) || rc=$?
    printf '%s\n' "$out" | sed '/^$/d; s/^/  verify: /'
    ((rc == 0)) || fail "systemd-analyze verify --root on the unpacked packages exited $rc"
    if grep -q -e 'ddl-coordinator\.service' -e 'ddl-agent\.service' <<<"$out"; then
      fail "systemd-analyze verify complained about the packaged units (above)"
    fi
    log "systemd-analyze verify --root: the packaged units and binaries agree"
  else
    log "note: systemd-analyze absent, packaged units not verified"
  fi
}

case $part in
  units) test_units ;;
  configs) test_configs ;;
  packages) test_packages ;;
  *) fail "unknown part '$part' (units, configs or packages)" ;;
esac
log "passed"
