"""Runs N ranks of tests/torch/worker.py as separate processes, the way torchrun would on one machine.

Each rank gets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (a free port) and its own output file;
run_ranks waits for all of them up to a deadline, kills what is left, and returns every rank's exit code and
output. Unlike ddlrun it does not stop the other ranks when one dies, so tests can watch how survivors fail.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "worker.py")
# Debian's interpreter: the one python3-torch is installed for.
PYTHON = os.environ.get("DDL_TEST_PYTHON", "/usr/bin/python3")


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankResult:
    def __init__(self, rank, code, output):
        self.rank, self.code, self.output = rank, code, output

    def __repr__(self):
        return "rank %d exited %s:\n%s" % (self.rank, self.code, self.output)


def run_ranks(n, scenario, *args, timeout=180, env=None, linger=None):
    """Runs scenario on n ranks; returns a RankResult per rank (code None: killed at the deadline). linger
    ({rank: text}): after the ranks exit, wait up to 10 s for text in that rank's output (written by a process
    it started, which inherits the file)."""
    port = free_port()
    outdir = tempfile.mkdtemp(prefix="torch-ddl-test-")
    procs, files = [], []
    for r in range(n):
        e = dict(os.environ)
        e.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        e.update(env or {})
        f = open(os.path.join(outdir, "rank%d.out" % r), "w+")
        files.append(f)
        procs.append(subprocess.Popen([PYTHON, WORKER, scenario, *map(str, args)], stdout=f,
                                      stderr=subprocess.STDOUT, env=e))
    deadline = time.monotonic() + timeout
    codes = [None] * n
    while time.monotonic() < deadline and any(c is None for c in codes):
        for r, p in enumerate(procs):
            if codes[r] is None:
                codes[r] = p.poll()
        time.sleep(0.02)
    for r, p in enumerate(procs):
        if codes[r] is None:
            p.kill()
            p.wait()
    for r, text in (linger or {}).items():
        end = time.monotonic() + 10
        while time.monotonic() < end:
            files[r].seek(0)
            if text in files[r].read():
                break
            time.sleep(0.05)
    results = []
    for r, f in enumerate(files):
        f.seek(0)
        results.append(RankResult(r, codes[r], f.read()))
        f.close()
        os.unlink(f.name)
    os.rmdir(outdir)
    return results


def describe(results):
    return "\n".join(repr(r) for r in results)


def main():
    """python3 harness.py N SCENARIO [ARGS...]: runs a scenario by hand; exits 0 when every rank did."""
    n, scenario, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    results = run_ranks(n, scenario, *args)
    print(describe(results))
    sys.exit(0 if all(r.code == 0 for r in results) else 1)


if __name__ == "__main__":
    main()
