#!/usr/bin/env bash
# ddl-sim's check against a real two-level hierarchy, in one command (docs/scaling-model.md):
#   1. bench/hierarchy.sh (root): 2 hosts x 2 ranks in network namespaces, ring, mdring, rhd and auto from
#      --min up, with ucx_perftest over the link and in shared memory;
#   2. ddl-sim calibrate from its ucx_perftest figures         -> OUT/calibration.json
#      ddl-sim check: measured against predicted, per size      -> OUT/check.txt, OUT/check.json
#   3. the same with the host link fitted (least squares) to the flat ring's measured times instead
#                                                               -> OUT/calibration-fit.json, OUT/check-fit.*
# Re-run it after a change to a transport (e.g. the intra-node path): the calibration follows the links.
#
# Usage: bench/sim_check.sh [--out DIR] [--reps N] [--skip-bench] [-- hierarchy.sh options...]
#   --out DIR      hierarchy.sh's results and ddl-sim's files (default: bench-results/sim-check)
#   --reps N       hierarchy.sh repetitions (default 2)
#   --min SIZE     smallest size measured and checked (default 64K); --max SIZE largest (default 16M)
#   --bin DIR      ddl-bench and ddl-sim (default: build/bin); build them first:
#                  ninja -C build ddl-bench ddl-sim
#   --skip-bench   reuse OUT's measurements, only calibrate and check
# Exit status: that of the check with ucx_perftest's calibration (0: within its goal, 1: not, 2: bad input),
# or hierarchy.sh's when it fails (77: skipped, not root).
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$script_dir/.." && pwd)
OUT=$repo/bench-results/sim-check BIN=$repo/build/bin REPS=2 MIN=64K MAX=16M SKIP=0
while (($#)); do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --min) MIN=$2; shift 2 ;;
    --max) MAX=$2; shift 2 ;;
    --bin) BIN=$2; shift 2 ;;
    --skip-bench) SKIP=1; shift ;;
    --) shift; break ;;
    -h | --help) sed -n '/^# Usage:/,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "sim_check.sh: unexpected argument '$1' (hierarchy.sh options go after --)" >&2; exit 2 ;;
  esac
done
[[ -x $BIN/ddl-sim ]] || { echo "sim_check.sh: $BIN/ddl-sim is missing (ninja -C build ddl-sim)" >&2; exit 2; }

if ((!SKIP)); then
  rc=0
  "$script_dir/hierarchy.sh" --reps "$REPS" --min "$MIN" --max "$MAX" --systems ring,mdring,rhd,auto \
    --bin "$BIN" --out "$OUT" "$@" || rc=$?
  ((rc == 0)) || { echo "sim_check.sh: hierarchy.sh failed (exit status $rc)" >&2; exit "$rc"; }
fi

echo "== calibration from ucx_perftest"
"$BIN/ddl-sim" calibrate --hierarchy "$OUT" -o "$OUT/calibration.json"
rc=0
"$BIN/ddl-sim" check --calibration "$OUT/calibration.json" --hierarchy "$OUT" --min "$MIN" \
  --json "$OUT/check.json" | tee "$OUT/check.txt" || rc=${PIPESTATUS[0]}

echo
echo "== calibration with the host link fitted to the flat ring's times (ring: fitted; mdring, rhd: predicted)"
fits=()
for f in "$OUT"/raw/rep*/ring.*.json; do
  [[ -f $f ]] && fits+=(--fit "node=$f")
done
if ((${#fits[@]})); then
  "$BIN/ddl-sim" calibrate --hierarchy "$OUT" "${fits[@]}" --fit-min "$MIN" -o "$OUT/calibration-fit.json"
  "$BIN/ddl-sim" check --calibration "$OUT/calibration-fit.json" --hierarchy "$OUT" --min "$MIN" \
    --json "$OUT/check-fit.json" | tee "$OUT/check-fit.txt" || true
else
  echo "no ring results in $OUT/raw: no fit"
fi
exit "$rc"
