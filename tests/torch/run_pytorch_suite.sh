#!/usr/bin/env bash
# PyTorch's own distributed test suite against ddl, by hand (tests/torch/pytorch_suite.py says how it runs):
# at each world size, ddl in gloo's place against gloo at that size (every test gloo passes must pass, but the
# name checks the harness names), then the plugin "ddl" (no test may fail). CI runs 2 ranks
# (tests/CMakeLists.txt, torch2_pytorch_suite*); this adds 3. About 2 minutes per size on 2 cores.
#
# Usage: tests/torch/run_pytorch_suite.sh [BUILD_DIR [WORLD_SIZE...]]   (default: build, 2 3)
# DDL_TEST_PYTHON picks the interpreter (default: the torch 2.x venv's). Exit status 0 when every check passed,
# 77 when the interpreter cannot run the suite (the reason is printed).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
shift $(($# > 0 ? 1 : 0))
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(2 3)
py=${DDL_TEST_PYTHON:-$root/.venv/torch2/bin/python}

[[ -x $py ]] || { echo "skipped: $py does not exist (scripts/bootstrap makes the torch 2.x venv)"; exit 77; }
[[ -d $build/python-torch2/torch_ddl ]] ||
  { echo "skipped: no torch_ddl for torch 2.x in $build/python-torch2 (build it first)"; exit 77; }
export PYTHONPATH=$build/python-torch2${PYTHONPATH:+:$PYTHONPATH}

status=0
summary=()
for n in "${sizes[@]}"; do
  for mode in ddl plugin; do
    floor=80 && [[ $mode == plugin ]] && floor=55  # below these, the run proves nothing (tests/CMakeLists.txt)
    set +e
    out=$("$py" "$here/pytorch_suite.py" check --mode "$mode" --world-size "$n" --min-passed "$floor" \
      2>/dev/null | tee /dev/stderr)
    rc=$?
    set -e
    [[ $rc == 77 ]] && exit 77
    [[ $rc == 0 ]] || status=1
    summary+=("$n ranks, $mode: $(grep -E '^[0-9]+ passed|^plugin ddl' <<<"$out" | tail -1) (exit $rc)")
  done
done
printf '%s\n' "${summary[@]}"
exit $status
