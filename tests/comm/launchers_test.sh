#!/usr/bin/env bash
# ddl-bench, unchanged, started the way other launchers start ranks (ctest label comm): 2 ranks on this machine
# with only torchrun's, Slurm's (srun) or Open MPI's (mpirun, with DDL_ROOT) variables set, no DDL_RANK; each
# must finish with its results checked (exit 0), and rank 0 must warn that no job secret is set.
#
# Usage: launchers_test.sh BIN_DIR
set -euo pipefail
BIN=${1:?usage: launchers_test.sh BIN_DIR}
tmp=$(mktemp -d /tmp/ddl-launchers.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# run2 NAME VAR=VALUE... -- per-rank assignments use @R for the rank: both ranks, bounded, both must exit 0.
run2() {
  local name=$1; shift
  local pids=() r
  for r in 0 1; do
    local vars=()
    for kv in "$@"; do vars+=("${kv//@R/$r}"); done
    env -u DDL_RANK -u DDL_WORLD_SIZE -u DDL_ROOT -u RANK -u WORLD_SIZE -u DDL_JOB_SECRET "${vars[@]}" \
      timeout 120 "$BIN/ddl-bench" -b 4K -e 64K -n 5 -w 1 >"$tmp/$name.$r.log" 2>&1 &
    pids+=($!)
  done
  for r in 0 1; do
    wait "${pids[$r]}" || { cat "$tmp/$name.$r.log"; fail "$name: rank $r exited $?"; }
  done
  grep -q "without DDL_JOB_SECRET" "$tmp/$name.0.log" || { cat "$tmp/$name.0.log"; fail "$name: rank 0 did not warn"; }
  echo "ok: $name"
}

port=$(free_port)
run2 torchrun RANK=@R WORLD_SIZE=2 LOCAL_RANK=@R MASTER_ADDR=127.0.0.1 MASTER_PORT="$port"
run2 srun SLURM_PROCID=@R SLURM_NTASKS=2 SLURM_LOCALID=@R SLURM_JOB_NODELIST=127.0.0.1 SLURM_JOB_ID=77 \
  DDL_PORT="$(free_port)"
run2 mpirun OMPI_COMM_WORLD_RANK=@R OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_LOCAL_RANK=@R \
  DDL_ROOT="127.0.0.1:$(free_port)"
# Nothing set: the error names every launcher's variables.
if env -u DDL_RANK -u DDL_WORLD_SIZE -u DDL_ROOT -u RANK -u WORLD_SIZE timeout 30 "$BIN/ddl-bench" -b 4K -e 4K \
    >"$tmp/none.log" 2>&1; then
  fail "ddl-bench started without any launcher's variables"
fi
grep -q "SLURM_PROCID" "$tmp/none.log" || { cat "$tmp/none.log"; fail "the error does not name Slurm's variables"; }
echo "ok: no launcher"
