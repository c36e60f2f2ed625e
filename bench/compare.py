#!/usr/bin/env python3
"""Side-by-side allreduce comparison on this machine: ddl (each algorithm), Open MPI's MPI_Allreduce and UCX's
point-to-point bandwidth (ucx_perftest tag_bw), over the same UCX transport, measured in one run.

Every figure is the median of --reps runs, interleaved (ddl, MPI, ddl, MPI, ...) in a new shuffled order every
repetition, so that a noisy moment, or whatever one run leaves behind for the next, hurts every system alike. Prints one table per transport and rank count and writes everything to OUT/summary.json.

  bench/compare.py                          # shm and tcp, 2 and 4 ranks, 64 KiB .. 64 MiB
  bench/compare.py --transports shm --ranks 4 --reps 5
"""
import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time

TRANSPORTS = {
    # name: (UCX_TLS, Open MPI's own BTLs for the same wire, description)
    "shm": ("sm,self", "self,vader", "shared memory (UCX posix/sysv, peer error handling on)"),
    "tcp": ("tcp", "self,tcp", "TCP over loopback"),
}
# Open MPI twice: its default path (the ob1 PML over its own BTLs) and its UCX PML on the same UCX transport.
MPI_VARIANTS = ("openmpi", "openmpi-ucx")


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper()
    if text and text[-1] in mult:
        return int(float(text[:-1]) * mult[text[-1]])
    return int(text)


def human(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, env, timeout):
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s: {' '.join(cmd)}"
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {' '.join(cmd)}\n{p.stdout[-2000:]}"
    return p.stdout, None


def sweep_args(a):
    return ["-b", str(a.min), "-e", str(a.max), "-f", str(a.factor), "-n", str(a.iters), "-w", str(a.warmup)]


def ddl_run(a, tls, ranks, algo, out):
    env = dict(os.environ, UCX_TLS=tls)
    cmd = [f"{a.build}/bin/ddlrun", "-np", str(ranks), "--no-tag-output", "--",
           f"{a.build}/bin/ddl-bench", *sweep_args(a), "-c", "0", "-a", algo, "--json", out]
    text, err = run(cmd, env, a.timeout)
    return (json.load(open(out)) if text is not None else None), err


def mpi_run(a, tname, variant, ranks, out):
    tls, btls, _ = TRANSPORTS[tname]
    if variant == "openmpi-ucx":
        mca = ["--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"]
    else:
        mca = ["--mca", "pml", "ob1", "--mca", "btl", btls]
    env = dict(os.environ, UCX_TLS=tls)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "-x", "UCX_TLS", *mca,
           f"{a.build}/bin/mpi-allreduce-bench", *sweep_args(a), "--json", out]
    text, err = run(cmd, env, a.timeout)
    return (json.load(open(out)) if text is not None else None), err


def perftest(a, tls, size):
    """UCX point-to-point tag bandwidth with peer error handling, as libddl's endpoints use it (GB/s)."""
    env = dict(os.environ, UCX_TLS=tls, UCX_POSIX_ERROR_HANDLING="y", UCX_SYSV_ERROR_HANDLING="y")
    iters = max(20, min(2000, (2 << 30) // size))
    port = str(free_port())
    args = ["ucx_perftest", "-p", port, "-t", "tag_bw", "-s", str(size), "-n", str(iters), "-w", "5", "-e"]
    server = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(50):  # the server needs a moment to listen
            text, err = run(args[:1] + ["127.0.0.1"] + args[1:], env, 120)
            if text is not None:
                break
        else:
            return None
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    for line in text.splitlines():
        if line.startswith("Final:"):
            return float(line.split()[5]) * (1 << 20) / 1e9  # MB/s (2^20 bytes) -> GB/s
    return None


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build")
    p.add_argument("--transports", default="shm,tcp")
    p.add_argument("--ranks", default="2,4")
    p.add_argument("--algos", default="auto,ring,mdring,rhd")
    p.add_argument("--min", type=parse_size, default=parse_size("64K"))
    p.add_argument("--max", type=parse_size, default=parse_size("64M"))
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--timeout", type=int, default=600, help="seconds per benchmark process")
    p.add_argument("--pause", type=float, default=1.0, help="seconds of quiet before each run")
    p.add_argument("--seed", type=int, default=1, help="seed of the run order shuffle")
    p.add_argument("--no-mpi", action="store_true")
    p.add_argument("--no-perftest", action="store_true")
    p.add_argument("--out", default="bench-results")
    a = p.parse_args()

    for t in a.transports.split(","):
        if t not in TRANSPORTS:
            sys.exit(f"compare.py: unknown transport '{t}' (use {', '.join(TRANSPORTS)})")
    os.makedirs(a.out, exist_ok=True)
    algos = a.algos.split(",")
    sizes = []
    s = a.min
    while s <= a.max:
        sizes.append(s)
        s *= a.factor
    summary = {"sizes": sizes, "reps": a.reps, "iters": a.iters, "results": []}
    errors = []
    rng = random.Random(a.seed)

    for tname in a.transports.split(","):
        tls, _, tdesc = TRANSPORTS[tname]
        p2p = {}
        if not a.no_perftest:
            for size in sizes:
                p2p[size] = median(perftest(a, tls, size) for _ in range(a.reps))
        for ranks in (int(r) for r in a.ranks.split(",")):
            runs = {name: [] for name in [f"ddl-{x}" for x in algos] + ([] if a.no_mpi else list(MPI_VARIANTS))}
            systems = list(runs)
            with tempfile.TemporaryDirectory() as tmp:
                for rep in range(a.reps):
                    # A new order every repetition (seeded: reproducible), so that neither a system's position
                    # nor its predecessor is fixed: whatever one run leaves behind falls on every system alike.
                    # (A rotation would keep each system's predecessor.)
                    order = systems[:]
                    rng.shuffle(order)
                    for name in order:
                        time.sleep(a.pause)
                        if name.startswith("ddl-"):
                            res, err = ddl_run(a, tls, ranks, name[4:], f"{tmp}/ddl.json")
                        else:
                            res, err = mpi_run(a, tname, name, ranks, f"{tmp}/mpi.json")
                        (runs[name].append(res) if res else errors.append(err))
            table = {}
            for name, results in runs.items():
                for size in sizes:
                    vals = [r2["busbw_GBs"] for res in results for r2 in res["results"] if r2["bytes"] == size]
                    table.setdefault(size, {})[name] = median(vals)
            for size in sizes:  # the best peer at each size
                peers = [table[size].get(v) for v in MPI_VARIANTS if table[size].get(v) is not None]
                if peers:
                    table[size]["best-mpi"] = max(peers)
            entry = {"transport": tname, "ucx_tls": tls, "ranks": ranks, "p2p_GBs": {str(k): v for k, v in p2p.items()},
                     "busbw_GBs": {str(k): v for k, v in table.items()}}
            summary["results"].append(entry)

            names = list(runs) + (["best-mpi"] if not a.no_mpi else [])
            print(f"\n## {ranks} ranks over {tdesc} (UCX_TLS={tls}); busbw GB/s, median of {a.reps}")
            head = f"{'size':>8} {'p2p':>7} " + " ".join(f"{n:>11}" for n in names)
            if "best-mpi" in names and "ddl-auto" in names:
                head += f" {'auto/mpi':>9}"
            if p2p and "ddl-auto" in names:
                head += f" {'auto/p2p':>8}"
            print(head)
            for size in sizes:
                row = table[size]
                fmt = lambda v: f"{v:11.2f}" if v is not None else f"{'-':>11}"
                line = f"{human(size):>8} " + (f"{p2p[size]:7.2f} " if p2p.get(size) else f"{'-':>7} ")
                line += " ".join(fmt(row.get(n)) for n in names)
                auto, ompi = row.get("ddl-auto"), row.get("best-mpi")
                if "best-mpi" in names and "ddl-auto" in names:
                    line += f" {auto / ompi:9.2f}" if auto and ompi else f" {'-':>9}"
                if p2p and "ddl-auto" in names:
                    line += f" {auto / p2p[size]:8.0%}" if auto and p2p.get(size) else f" {'-':>8}"
                print(line)
            sys.stdout.flush()

    summary["errors"] = errors
    with open(f"{a.out}/summary.json", "w") as f:
        json.dump(summary, f, indent=1)
    print(f"\nwrote {a.out}/summary.json")
    for e in errors:
        print("error:", e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
