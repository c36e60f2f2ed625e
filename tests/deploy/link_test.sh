#!/usr/bin/env bash
# How a user's program links libddl (ctest label deploy): examples/allreduce, built the four ways the README
# shows, each then run under ddlrun as 2 ranks on this machine and checked (every rank prints its sums correct):
#
#   installed   `cmake --install BUILD --component libddl --prefix TMP` (what the libddl package holds), then
#               cc with `pkg-config --cflags --libs ddl`, and the example's CMake project with find_package(ddl)
#               (CMAKE_PREFIX_PATH=TMP; its C and C++ programs)
#   build tree  the same without installing: PKG_CONFIG_PATH=BUILD/pkgconfig, and -Dddl_DIR=BUILD
#
# It also checks that pkg-config prints exactly -I<prefix>/include -L<prefix>/lib -lddl and the version, that
# the installed pkg-config and CMake files name no path of the source or build tree, and (ldd) that each program
# runs with the libddl.so.0 it was built against. A broken ddl.pc or CMake package fails the build step.
#
# Usage: link_test.sh SOURCE_DIR BUILD_DIR VERSION   (BUILD_DIR built: libddl, ddlrun, ddl-bench)
# Environment: CC and CXX, the compilers (default cc, c++); CMAKE (default cmake); CMAKE_GENERATOR is honoured by
# cmake itself. DDL_LINK_KEEP=1 keeps the scratch directory.
# Exit status: 0 passed, 1 failed, 77 skipped (pkg-config or a compiler is missing; the reason is printed).
set -euo pipefail

SRC=$(cd "${1:?usage: link_test.sh SOURCE_DIR BUILD_DIR VERSION}" && pwd)
BUILD=$(cd "${2:?no BUILD_DIR}" && pwd)
VERSION=${3:?no VERSION}
CC=${CC:-cc}
CXX=${CXX:-c++}
CMAKE=${CMAKE:-cmake}
EXAMPLE=$SRC/examples/allreduce

log() { printf '[link %s] %s\n' "$(date +%T)" "$*"; }
skip() { log "skipped: $*"; exit 77; }
fail() { log "FAIL: $*" >&2; exit 1; }

command -v pkg-config >/dev/null ||
  skip "pkg-config is absent (Debian package pkg-config; scripts/bootstrap installs it)"
command -v "$CC" >/dev/null || skip "no C compiler '$CC'"
command -v "$CXX" >/dev/null || skip "no C++ compiler '$CXX'"
[[ -x $BUILD/bin/ddlrun ]] || fail "$BUILD/bin/ddlrun is missing (build it first)"
compgen -G "$BUILD/lib/libddl.so.0*" >/dev/null || fail "$BUILD/lib/libddl.so.0 is missing (build ddl_comm first)"

tmp=$(mktemp -d /tmp/ddl-link-test.XXXXXX)
cleanup() { if [[ ${DDL_LINK_KEEP:-0} == 1 ]]; then log "kept $tmp"; else rm -rf "$tmp"; fi; }
trap cleanup EXIT
# Only what each step names: no ddl.pc or ddl package of this machine's, and no library path of the caller's.
unset PKG_CONFIG_PATH LD_LIBRARY_PATH CMAKE_PREFIX_PATH ddl_DIR

# expect_lib PROGRAM DIR [LD_LIBRARY_PATH]: PROGRAM loads libddl.so.0 from DIR.
expect_lib() {
  local out
  out=$(LD_LIBRARY_PATH=${3:-} ldd "$1") || fail "ldd $1 failed"
  grep -q "libddl.so.0 => $2/libddl.so.0 " <<<"$out" ||
    fail "$1 does not load libddl.so.0 from $2: $(grep libddl <<<"$out" || echo 'no libddl at all')"
}

# run2 NAME PROGRAM [LD_LIBRARY_PATH]: 2 ranks of PROGRAM under ddlrun; both must report correct sums.
run2() {
  local name=$1 prog=$2 libpath=${3:-} rc=0
  LD_LIBRARY_PATH=$libpath timeout 120 "$BUILD/bin/ddlrun" -np 2 --timeout-ms 60000 -- "$prog" \
    >"$tmp/$name.log" 2>&1 || rc=$?
  ((rc == 0)) || { cat "$tmp/$name.log"; fail "$name: ddlrun -np 2 exited $rc"; }
  [[ $(grep -c ' of 2: allreduce of 1001 int[0-9]* correct' "$tmp/$name.log") == 2 ]] ||
    { cat "$tmp/$name.log"; fail "$name: not every rank reported correct sums"; }
  log "$name: 2 ranks under ddlrun, sums correct"
}

# pkg_config_build NAME PC_DIR PREFIX_INCLUDE PREFIX_LIB: the exact flags, the version, then cc with them.
pkg_config_build() {
  local name=$1 pcdir=$2 inc=$3 lib=$4 out want flags=()
  out=$(PKG_CONFIG_LIBDIR=$pcdir pkg-config --cflags --libs ddl) ||
    fail "$name: pkg-config --cflags --libs ddl failed"
  read -r -a flags <<<"$out"
  want="-I$inc -L$lib -lddl"
  [[ ${flags[*]} == "$want" ]] || fail "$name: pkg-config --cflags --libs ddl gives '$out', expected '$want'"
  [[ $(PKG_CONFIG_LIBDIR=$pcdir pkg-config --modversion ddl) == "$VERSION" ]] ||
    fail "$name: pkg-config --modversion ddl is not $VERSION"
  "$CC" -Wall -Werror -o "$tmp/$name" "$EXAMPLE/allreduce.c" "${flags[@]}" >"$tmp/$name.build.log" 2>&1 ||
    { cat "$tmp/$name.build.log"; fail "$name: cc allreduce.c \$(pkg-config --cflags --libs ddl) failed"; }
  log "$name: $CC allreduce.c ${flags[*]}"
}

# cmake_build NAME DDL_DIR CMAKE_ARGS...: the example's CMake project; find_package(ddl) must take DDL_DIR.
cmake_build() {
  local name=$1 dir=$2 found
  shift 2
  "$CMAKE" -S "$EXAMPLE" -B "$tmp/$name" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$CC" \
    -DCMAKE_CXX_COMPILER="$CXX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF "$@" >"$tmp/$name.build.log" 2>&1 ||
    { cat "$tmp/$name.build.log"; fail "$name: configuring examples/allreduce (find_package(ddl)) failed"; }
  found=$(sed -n 's/^ddl_DIR:[A-Z]*=//p' "$tmp/$name/CMakeCache.txt")
  [[ $found == "$dir" ]] || fail "$name: find_package(ddl) took '$found', expected '$dir'"
  "$CMAKE" --build "$tmp/$name" >>"$tmp/$name.build.log" 2>&1 ||
    { cat "$tmp/$name.build.log"; fail "$name: building examples/allreduce against ddl::ddl failed"; }
  log "$name: find_package(ddl) from $found, built allreduce and allreduce_cxx"
}

# ---- installed ----------------------------------------------------------------------------------------------
prefix=$tmp/prefix
"$CMAKE" --install "$BUILD" --component libddl --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
  { cat "$tmp/install.log"; fail "cmake --install --component libddl failed"; }
for f in include/ddl/ddl.h lib/libddl.so lib/pkgconfig/ddl.pc lib/cmake/ddl/ddlConfig.cmake \
  lib/cmake/ddl/ddlConfigVersion.cmake lib/cmake/ddl/ddlTargets.cmake; do
  [[ -e $prefix/$f ]] || fail "the libddl component installs no $f"
done
leaks=$(grep -rlF -e "$SRC" -e "$BUILD" "$prefix/lib/pkgconfig" "$prefix/lib/cmake" || true)
[[ -z $leaks ]] || fail "installed files name the source or build tree: $leaks"
log "installed the libddl component into $prefix"

pkg_config_build pc-installed "$prefix/lib/pkgconfig" "$prefix/include" "$prefix/lib"
expect_lib "$tmp/pc-installed" "$prefix/lib" "$prefix/lib"
run2 pc-installed "$tmp/pc-installed" "$prefix/lib"

cmake_build cmake-installed "$prefix/lib/cmake/ddl" -DCMAKE_PREFIX_PATH="$prefix"
for p in allreduce allreduce_cxx; do
  expect_lib "$tmp/cmake-installed/$p" "$prefix/lib"  # CMake's build RPATH, no LD_LIBRARY_PATH
  run2 "cmake-installed-$p" "$tmp/cmake-installed/$p"
done

# ---- build tree ---------------------------------------------------------------------------------------------
pkg_config_build pc-build "$BUILD/pkgconfig" "$SRC/comm/include" "$BUILD/lib"
expect_lib "$tmp/pc-build" "$BUILD/lib" "$BUILD/lib"
run2 pc-build "$tmp/pc-build" "$BUILD/lib"

cmake_build cmake-build "$BUILD" -Dddl_DIR="$BUILD"
expect_lib "$tmp/cmake-build/allreduce" "$BUILD/lib"
run2 cmake-build-allreduce "$tmp/cmake-build/allreduce"

log "passed in ${SECONDS} s"
