#!/usr/bin/env bash
# torch_ddl installed the way torch users install extensions (ctest label deploy): libddl installed as its
# package would (`cmake --install BUILD --component libddl --prefix TMP`), then `pip install --no-build-isolation`
# of a copy of python/ with PKG_CONFIG_PATH=TMP/lib/pkgconfig, into a folder of its own, by the interpreter of a
# torch (the torch 2.x venv). Checks that the extension loads TMP's libddl.so.0 with no LD_LIBRARY_PATH, that one
# built against the build tree's ddl.pc has no run path into the build tree (but libddl's install dir), that
# it records the torch it was built for (another torch's import refuses it), and that 2 ranks importing the
# first pass tests/torch's collectives scenario.
#
# Usage: pip_test.sh SOURCE_DIR BUILD_DIR PYTHON   (BUILD_DIR built: libddl)
# Exit status: 0 passed, 1 failed, 77 skipped (PYTHON has no torch or pip; the reason is printed).
set -euo pipefail

SRC=$(cd "${1:?usage: pip_test.sh SOURCE_DIR BUILD_DIR PYTHON}" && pwd)
BUILD=$(cd "${2:?no BUILD_DIR}" && pwd)
PY=${3:?no PYTHON}
CMAKE=${CMAKE:-cmake}

log() { printf '[pip %s] %s\n' "$(date +%T)" "$*"; }
skip() { log "skipped: $*"; exit 77; }
fail() { log "FAIL: $*" >&2; exit 1; }

[[ -x $PY ]] || skip "$PY does not exist (scripts/bootstrap makes the torch 2.x venv)"
"$PY" -c "import torch, pip, wheel" 2>/dev/null || skip "$PY lacks torch, pip or wheel"
command -v pkg-config >/dev/null || skip "pkg-config is absent"
command -v readelf >/dev/null || skip "readelf is absent"

tmp=$(mktemp -d /tmp/ddl-pip-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
unset PKG_CONFIG_PATH LD_LIBRARY_PATH PYTHONPATH

log "installing libddl into $tmp/prefix"
"$CMAKE" --install "$BUILD" --component libddl --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install of libddl failed"; }
cp -r "$SRC/python" "$tmp/src"  # pip builds in the tree it is given: a copy keeps the checkout clean
rm -rf "$tmp/src/build" "$tmp/src"/*.egg-info

log "pip install --no-build-isolation (torch $("$PY" -c 'import torch; print(torch.__version__)'))"
PKG_CONFIG_PATH=$tmp/prefix/lib/pkgconfig timeout 600 "$PY" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation --no-deps --no-index --target "$tmp/site" "$tmp/src" >"$tmp/pip.log" 2>&1 ||
  { cat "$tmp/pip.log"; fail "pip install failed"; }

ext=$(compgen -G "$tmp/site/torch_ddl/_C*.so") || fail "no extension in $tmp/site/torch_ddl"
# ldd's output whole first: `ldd | grep -q` fails under pipefail when grep stops reading early and ldd, still
# writing a longer list (torch 2.11's), dies of SIGPIPE.
deps=$(ldd "$ext")
grep -q "libddl.so.0 => $tmp/prefix/lib/libddl.so.0 " <<<"$deps" ||
  fail "$ext does not load $tmp/prefix/lib/libddl.so.0: $(grep libddl <<<"$deps" || echo 'no libddl at all')"

# Against a build tree's ddl.pc the extension links BUILD's libddl, but its run path must not point into the
# tree (a user removes or rebuilds it): it names where `cmake --install` of that build puts libddl.
log "pip install against the build tree's ddl.pc: the run path leaves the build tree out"
cp -r "$SRC/python" "$tmp/src-tree"
rm -rf "$tmp/src-tree/build" "$tmp/src-tree"/*.egg-info
PKG_CONFIG_PATH=$BUILD/pkgconfig timeout 600 "$PY" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation --no-deps --no-index --target "$tmp/site-tree" "$tmp/src-tree" >"$tmp/pip-tree.log" 2>&1 ||
  { cat "$tmp/pip-tree.log"; fail "pip install against the build tree failed"; }
ext_tree=$(compgen -G "$tmp/site-tree/torch_ddl/_C*.so") || fail "no extension in $tmp/site-tree/torch_ddl"
runpath=$(readelf -d "$ext_tree" | grep -E '\((RUN)?PATH\)' || true)
want=$(PKG_CONFIG_PATH=$BUILD/pkgconfig pkg-config --variable=installlibdir ddl)
[[ $runpath != *"$BUILD"* ]] || fail "the extension's run path points into the build tree: $runpath"
[[ -n $want && $runpath == *"[$want"* ]] || fail "the extension's run path is not libddl's install dir $want: $runpath"

# pip's build records its torch as the CMake build does (torch_ddl/_built_for.py), and another torch (Debian's
# /usr/bin/python3, where its torch is another) refuses it naming both and pip.
[[ -f $tmp/site/torch_ddl/_built_for.py ]] || fail "pip's build wrote no torch_ddl/_built_for.py"
grep -q '^BUILT_BY = "setup.py"$' "$tmp/site/torch_ddl/_built_for.py" ||
  fail "_built_for.py: $(cat "$tmp/site/torch_ddl/_built_for.py")"
have=$("$PY" -c 'import torch; print(torch.__version__)')
other=$(/usr/bin/python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [[ -n $other && $other != "$have" ]]; then
  log "torch $other (/usr/bin/python3) refuses the build for torch $have"
  if PYTHONPATH=$tmp/site /usr/bin/python3 -c 'import torch_ddl' >"$tmp/other.log" 2>&1; then
    fail "/usr/bin/python3 (torch $other) imported the torch_ddl built for torch $have"
  fi
  grep -q "ImportError: torch_ddl in .* was built for torch $have .* runs torch $other .*pip install" \
    "$tmp/other.log" || { cat "$tmp/other.log"; fail "the ImportError does not name both torches and pip"; }
else
  log "no other torch in /usr/bin/python3: the refusal is not tried"
fi

log "2 ranks of the collectives scenario importing the installed torch_ddl"
PYTHONPATH=$tmp/site DDL_TEST_PYTHON=$PY timeout 300 "$PY" "$SRC/tests/torch/harness.py" 2 collectives \
  >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; fail "the collectives scenario failed"; }
[[ $(grep -c '^OK collectives' "$tmp/run.log") == 2 ]] || { cat "$tmp/run.log"; fail "not every rank said OK"; }
log "passed"
