#!/usr/bin/env bash
# Everything libddl's GPU work waits to have measured, in one run on a machine with a GPU (docs/benchmarks.md,
# "GPU"): the CUDA tests, ddl-cuda-bench, and ddl-bench at 2, 4 and 8 ranks (ranks share the GPUs, device =
# local rank mod GPUs), each rank pinned to a core of its own: host buffers, then device buffers stream-ordered
# (64 KiB to --max; and 8 B to 1 MiB for the small-message latency), CUDA-graph replay and the host-blocking
# call, each without and with the MPS daemon (--mps); and 4 ranks split into two nodes of 2 (DDL_NODE_TAG:
# the allreduce across nodes, stream-ordered and blocking, the GPU folding what crossed). With --torch DIR (the folder holding a torch_ddl built for
# python3's torch 2.x, e.g. build/python-torch2): tests/torch's CUDA tests and bench/torch_ddp.py's DDP on CUDA
# tensors at 2 ranks, also without and with MPS. Writes the outputs and JSON under --out, a summary of the
# figures in summary.txt, and prints where. Every step ends within --step-timeout seconds (a hang is a failed
# step, not a lost run); --skip leaves out groups of steps (tests cuda-bench host stream small graph blocking
# registered blocks nodes torch), e.g. to spend a short lease on what matters first. The registered group times the
# same calls on buffers registered with ddlCommRegister (the zero-copy node kernel), and 1,000 graph replays; the
# blocks group (with MPS) times them with the node kernel's CTAs forced (DDL_NODE_BLOCKS 16, 32, 64) beside the
# count the setup chose (DDL_DEBUG's line says it), at 2 and 8 ranks.
#
# Usage: bench/gpu.sh [--out DIR] [--bin DIR] [--build DIR] [--ranks "2 4 8"] [--max SIZE] [--iters N]
#                     [--mps "off on"] [--torch DIR] [--step-timeout S] [--skip "GROUP ..."]
# Exit status: 0 done, 1 a step failed (the others still ran), 2 bad usage, 77 no GPU here (nothing to measure).
set -uo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/.." && pwd)
OUT=gpu-results BIN=$repo/build/bin BUILD="" RANKS="2 4 8" MAX=256M ITERS=20 MPS="off on" TORCH="" STEP_TIMEOUT=300
SKIP=""
groups=" tests cuda-bench host stream small graph blocking registered blocks nodes torch "
while (($#)); do
  case $1 in
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --bin) BIN=${2:?--bin needs a directory}; shift 2 ;;
    --build) BUILD=${2:?--build needs a directory}; shift 2 ;;
    --mps) MPS=${2:?--mps needs "off", "on" or "off on"}; shift 2 ;;
    --ranks) RANKS=${2:?--ranks needs a list}; shift 2 ;;
    --max) MAX=${2:?--max needs a size}; shift 2 ;;
    --iters) ITERS=${2:?--iters needs a count}; shift 2 ;;
    --step-timeout) STEP_TIMEOUT=${2:?--step-timeout needs seconds}; shift 2 ;;
    --skip) SKIP=${2?--skip needs a list of groups}; shift 2 ;;
    --torch) TORCH=$(cd "${2:?--torch needs the folder holding torch_ddl}" && pwd) || exit 2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/{/^#/p}' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
[[ $STEP_TIMEOUT =~ ^[1-9][0-9]*$ ]] || { echo "gpu.sh: --step-timeout must be a whole number of seconds" >&2; exit 2; }
for g in $SKIP; do
  [[ $groups == *" $g "* ]] || { echo "gpu.sh: --skip: no group '$g' (groups:$groups)" >&2; exit 2; }
done
skipped() { [[ " $SKIP " == *" $1 "* ]]; }
for tool in ddl-bench ddlrun ddl-cuda-bench; do
  [[ -x $BIN/$tool ]] || { echo "gpu.sh: $BIN/$tool is missing: build with the CUDA Toolkit first" >&2; exit 2; }
done
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "gpu.sh: no GPU here (nvidia-smi lists none): nothing to measure" >&2
  exit 77
fi
mkdir -p "$OUT"
status=0
step() {  # step NAME command...: runs it for at most STEP_TIMEOUT s, output to OUT/NAME.txt, says how it ended
  local name=$1 rc=0 t0=$SECONDS; shift
  echo "== $name: $*"
  timeout -k 10 "$STEP_TIMEOUT" "$@" >"$OUT/$name.txt" 2>&1 || rc=$?
  if ((rc == 0)); then
    echo "   ok in $((SECONDS - t0)) s ($OUT/$name.txt)"
  elif ((rc == 124 || rc == 137)); then
    echo "   TIMED OUT after $STEP_TIMEOUT s ($OUT/$name.txt)"; status=1
  else
    echo "   FAILED: exit $rc in $((SECONDS - t0)) s ($OUT/$name.txt)"; status=1
  fi
}

nvidia-smi -L >"$OUT/gpus.txt" 2>&1
nvidia-smi topo -m >>"$OUT/gpus.txt" 2>&1 || true
[[ -n $BUILD ]] || BUILD=$(cd "$BIN/.." && pwd)
skipped tests ||
  step cuda-tests ctest --test-dir "$BUILD" -R 'Cuda|UcxDevice|DevicePath|StreamPath|NodeKernel' --timeout 120 \
    --output-on-failure
skipped cuda-bench || step cuda-bench "$BIN/ddl-cuda-bench" -b 64M -e 1G
mps() {  # mps on|off: starts or stops the MPS control daemon; false where it cannot
  if [[ $1 == on ]]; then
    command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d && sleep 1
  else
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
    sleep 1
    return 0
  fi
}
# bench GROUP NAME RANKS flags...: ddl-bench on RANKS ranks, rank r on core r, unless GROUP is skipped. With
# PER_NODE=k set, the ranks count as nodes of k (DDL_NODE_TAG = local rank / k); BENCH_ENV=NAME=VALUE sets one
# more variable on every rank.
bench() {
  local name=$2 n=$3 split=()
  skipped "$1" && return 0
  shift 3
  [[ -z ${PER_NODE:-} ]] || split=(-x "DDL_BENCH_PER_NODE=$PER_NODE")
  [[ -z ${BENCH_ENV:-} ]] || split+=(-x "$BENCH_ENV")
  # ddlrun binds nothing itself: taskset gives rank r core r through the launcher's DDL_LOCAL_RANK.
  step "$name" "$BIN/ddlrun" -np "$n" -x DDL_DEBUG=1 "${split[@]}" -- bash -c \
    '[[ -z ${DDL_BENCH_PER_NODE:-} ]] || export DDL_NODE_TAG=$((DDL_LOCAL_RANK / DDL_BENCH_PER_NODE))
     exec taskset -c "$DDL_LOCAL_RANK" "$0" "$@"' "$BIN/ddl-bench" "$@" --json "$OUT/$name.json"
}
cores=$(nproc)
for n in $RANKS; do
  ((n > cores)) || bench host "ddl-bench-host-$n" "$n" -b 64K -e "$MAX" -n "$ITERS"
done
for m in $MPS; do
  if ! mps "$m"; then echo "== MPS $m: skipped, the MPS daemon cannot be started here"; continue; fi
  for n in $RANKS; do
    if ((n > cores)); then echo "== $n ranks: skipped, $cores cores here"; continue; fi
    bench stream "ddl-bench-stream-mps$m-$n" "$n" --device -b 64K -e "$MAX" -n "$ITERS"
    bench small "ddl-bench-small-mps$m-$n" "$n" --device -b 8 -e 1M -f 4 -n 200 -w 20
    bench graph "ddl-bench-graph-mps$m-$n" "$n" --device --graph -b 8 -e 1M -f 4 -n 200 -w 20
    bench blocking "ddl-bench-blocking-mps$m-$n" "$n" --device --blocking -b 64K -e "$MAX" -n "$ITERS"
    # Registered buffers (ddlCommRegister): the zero-copy node kernel, large and small, and 1,000 replays.
    bench registered "ddl-bench-registered-mps$m-$n" "$n" --device --registered -b 64K -e "$MAX" -n "$ITERS"
    bench registered "ddl-bench-registered-small-mps$m-$n" "$n" --device --registered -b 8 -e 1M -f 4 -n 200 -w 20
    bench registered "ddl-bench-registered-graph-mps$m-$n" "$n" --device --registered --graph -b 64K -e 64K \
      -n 1000 -w 20
  done
  if [[ $m == on ]]; then
    for n in 2 8; do
      ((n <= cores)) || continue
      for b in 16 32 64; do
        BENCH_ENV=DDL_NODE_BLOCKS=$b bench blocks "ddl-bench-blocks$b-mps$m-$n" "$n" --device --registered \
          -b 64M -e "$MAX" -n "$ITERS"
      done
    done
  fi
  if ((cores >= 4)); then
    PER_NODE=2 bench nodes "ddl-bench-nodes-mps$m-4" 4 --device -b 64K -e "$MAX" -n "$ITERS"
    PER_NODE=2 bench nodes "ddl-bench-nodes-blocking-mps$m-4" 4 --device --blocking -b 64K -e "$MAX" -n "$ITERS"
  fi
done
mps off
if [[ -n $TORCH ]] && ! skipped torch; then
  py=$(command -v python3)
  for m in $MPS; do
    if ! mps "$m"; then continue; fi
    step "torch-cuda-tests-mps$m" env -C "$repo/tests/torch" PYTHONPATH="$TORCH" DDL_TEST_PYTHON="$py" \
      "$py" -m unittest -v test_torch_ddl.Cuda
    step "torch-ddp-cuda-mps$m" env DDL_BUILD_DIR="$BUILD" DDL_TORCH_PYTHONPATH="$TORCH" "$py" \
      "$repo/bench/torch_ddp.py" ddp --device cuda --ranks 2 --model mlp,cnn --reps 2 --python "$py" \
      --json "$OUT/torch-ddp-cuda-mps$m.json"
  done
  mps off
fi
# One line per run: the 64 KiB time and the best bus bandwidth at 64 MiB and above (out of place).
for f in "$OUT"/ddl-bench-*.txt; do
  awk -v run="$(basename "$f" .txt)" '
    $1 == "[0]" && $2 ~ /^[0-9]+$/ { size = $2; t = $7; bw = $9
      if (size == 65536) small = t
      if (size == 8) tiny = t
      if (size >= 67108864 && bw > best) best = bw }
    END { printf "%-32s 8 B: %8s us   64 KiB: %8s us   busbw >= 64 MiB: %s GB/s\n", run, tiny, small, best }' "$f"
done | tee "$OUT/summary.txt"
echo "results in $OUT"
exit $status
