#!/usr/bin/env bash
# Everything libddl's GPU work waits to have measured, in one run on a machine with a GPU (docs/benchmarks.md,
# "GPU"): the CUDA tests, ddl-cuda-bench, and ddl-bench on device buffers next to host buffers at 2, 4 and 8
# ranks (ranks share the GPUs, device = local rank mod GPUs), each rank pinned to a core of its own. Writes the
# outputs and JSON under --out and prints where.
#
# Usage: bench/gpu.sh [--out DIR] [--bin DIR] [--ranks "2 4 8"] [--max SIZE] [--iters N]
# Exit status: 0 done, 1 a step failed (the others still ran), 2 bad usage, 77 no GPU here (nothing to measure).
set -uo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/.." && pwd)
OUT=gpu-results BIN=$repo/build/bin RANKS="2 4 8" MAX=256M ITERS=20
while (($#)); do
  case $1 in
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --bin) BIN=${2:?--bin needs a directory}; shift 2 ;;
    --ranks) RANKS=${2:?--ranks needs a list}; shift 2 ;;
    --max) MAX=${2:?--max needs a size}; shift 2 ;;
    --iters) ITERS=${2:?--iters needs a count}; shift 2 ;;
    -h|--help) sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
for tool in ddl-bench ddlrun ddl-cuda-bench; do
  [[ -x $BIN/$tool ]] || { echo "gpu.sh: $BIN/$tool is missing: build with the CUDA Toolkit first" >&2; exit 2; }
done
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu.sh: no GPU here (nvidia-smi lists none): nothing to measure" >&2
  exit 77
fi
mkdir -p "$OUT"
status=0
step() {  # step NAME command...: runs it, output to OUT/NAME.txt, and says how it ended
  local name=$1; shift
  echo "== $name: $*"
  if "$@" >"$OUT/$name.txt" 2>&1; then echo "   ok ($OUT/$name.txt)"; else echo "   FAILED: exit $? ($OUT/$name.txt)"; status=1; fi
}

nvidia-smi -L >"$OUT/gpus.txt" 2>&1
nvidia-smi topo -m >>"$OUT/gpus.txt" 2>&1 || true
step cuda-tests ctest --test-dir "$repo/build" -R 'Cuda|UcxDevice|DevicePath' --output-on-failure
step cuda-bench "$BIN/ddl-cuda-bench" -b 64M -e 1G
cores=$(nproc)
for n in $RANKS; do
  if ((n > cores)); then echo "== $n ranks: skipped, $cores cores here"; continue; fi
  for kind in host device; do
    flags=(-b 64K -e "$MAX" -n "$ITERS" --json "$OUT/ddl-bench-$kind-$n.json")
    [[ $kind == device ]] && flags+=(--device)
    # ddlrun binds nothing itself: taskset gives rank r core r through the launcher's DDL_LOCAL_RANK.
    step "ddl-bench-$kind-$n" "$BIN/ddlrun" -np "$n" -- bash -c \
      'exec taskset -c "$DDL_LOCAL_RANK" "$0" "$@"' "$BIN/ddl-bench" "${flags[@]}"
  done
done
echo "results in $OUT"
exit $status
