#!/usr/bin/env python3
"""Side-by-side allreduce comparison on this machine: ddl (each algorithm), Open MPI's MPI_Allreduce (its own
path and its UCX PML), Gloo through torch.distributed, and UCX's point-to-point bandwidth (ucx_perftest
tag_bw), measured in one run. float32 sum, in place by default (torch.distributed has no other allreduce;
--out-of-place measures the others out of place and Gloo as copy + in place).

Every figure is the median of --reps runs, interleaved (ddl, MPI, Gloo, ddl, ...) in a new shuffled order
every repetition, so that a noisy moment, or whatever one run leaves behind for the next, hurts every system
alike. Each system runs the sweep in two bands: sizes below --small-below with --small-iters timed calls (they
are cheap, and few calls would be noise), the rest with --iters. Every result is checked once per size. Prints
one table per transport and rank count, writes everything to OUT/summary.json and, when --python can import
matplotlib, draws OUT/busbw.png (bench/plot.py).

ddl and Open MPI run over the transport's UCX_TLS (openmpi: over the same wire through its own BTLs); Gloo, as
torch builds it, has only TCP, so it runs over loopback in every table.

  bench/compare.py                                 # shm; 2, 3 and 4 ranks; 8 B .. 32 MiB by 4; 3 reps
  bench/compare.py --quick                         # one rep, few iterations: a smoke test
  bench/compare.py --transports shm,tcp --ranks 4 --systems ddl,gloo --max 1M
"""
import argparse
import datetime
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

TRANSPORTS = {
    # name: (UCX_TLS, Open MPI's own BTLs for the same wire, description)
    "shm": ("sm,self", "self,vader", "shared memory (UCX posix/sysv, peer error handling on)"),
    "tcp": ("tcp", "self,tcp", "TCP over loopback"),
}
ALGOS = ("auto", "ring", "mdring", "rhd")
# Open MPI twice: its default path (the ob1 PML over its own BTLs) and its UCX PML on the same UCX transport.
MPI_VARIANTS = ("openmpi", "openmpi-ucx")
PEERS = MPI_VARIANTS + ("gloo",)  # what ddl-auto is measured against: the best of these at each size
SYSTEM_WORDS = ("ddl",) + tuple(f"ddl-{x}" for x in ALGOS) + PEERS

# The full run's settings, and --quick's (a smoke test: figures too noisy to quote). A flag given on the
# command line wins over both.
DEFAULTS = {"reps": 3, "iters": 20, "small_iters": 100, "warmup": 5, "pause": 1.0}
QUICK = {"reps": 1, "iters": 5, "small_iters": 20, "warmup": 2, "pause": 0.2}


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    try:
        return int(float(t[:-1]) * mult[t[-1]]) if t and t[-1] in mult else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid size '{text}' (use bytes, optionally with K, M or G)")


def human(n):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(p):
    """SIGTERM to p's process group (ddlrun, mpirun and the Gloo launcher stop their ranks on it), SIGKILL 10 s
    later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            return
        try:
            p.communicate(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            pass


def run(cmd, env, timeout):
    """Runs cmd in its own session; on timeout, SIGTERM to its process group (ddlrun, mpirun and the Gloo
    launcher stop their ranks on it), SIGKILL 10 s later. Returns (output, None) or (None, what went
    wrong)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_group(p)
        return None, f"timed out after {timeout} s: {' '.join(cmd)}"
    except BaseException:  # Ctrl-C, SIGTERM: its own session does not get them, so stop it here
        stop_group(p)
        raise
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {' '.join(cmd)}\n{out[-2000:]}"
    return out, None


def sweep(first, last, a):
    """The tools' flags for the sizes first..last of the sweep (first is on it)."""
    return ["-b", str(first), "-e", str(last), "-f", str(a.factor), "-c", "1"]


def ddl_cmd(a, ranks, algo, band, out):
    return [f"{a.build}/bin/ddlrun", "-np", str(ranks), "--no-tag-output", "--",
            f"{a.build}/bin/ddl-bench", *band, "-a", algo, "--json", out]


def mpi_cmd(a, tname, variant, ranks, band, out):
    _, btls, _ = TRANSPORTS[tname]
    if variant == "openmpi-ucx":
        mca = ["--mca", "pml", "ucx", "--mca", "pml_ucx_tls", "any", "--mca", "pml_ucx_devices", "any"]
    else:
        mca = ["--mca", "pml", "ob1", "--mca", "btl", btls]
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks), "-x", "UCX_TLS", *mca,
            f"{a.build}/bin/mpi-allreduce-bench", *band, "--json", out]


def gloo_cmd(a, ranks, band, out):
    # The launcher's own deadline a little inside ours, so that it is the one to stop the ranks and say so.
    return [a.python, f"{HERE}/gloo_allreduce.py", "--np", str(ranks),
            "--timeout", str(max(1, a.timeout - 15)), *band, "--json", out]


def system_run(a, tname, name, ranks, bands, tmp):
    """One run of one system over every band: {bytes: result row}, or None and what went wrong."""
    tls = TRANSPORTS[tname][0]
    env = dict(os.environ, UCX_TLS=tls)
    if a.tune_file and name.startswith("ddl-"):
        env["DDL_TUNE_FILE"] = os.path.abspath(a.tune_file)
    rows = {}
    for band in bands:
        out = f"{tmp}/{name}.json"
        if os.path.exists(out):
            os.unlink(out)
        if name.startswith("ddl-"):
            cmd = ddl_cmd(a, ranks, name[4:], band, out)
        elif name == "gloo":
            cmd = gloo_cmd(a, ranks, band, out)
        else:
            cmd = mpi_cmd(a, tname, name, ranks, band, out)
        text, err = run(cmd, env, a.timeout)
        if text is None:
            return None, err
        try:
            with open(out) as f:
                rows.update({r["bytes"]: r for r in json.load(f)["results"]})
        except (OSError, ValueError, KeyError) as e:
            return None, f"{name}: cannot read its --json {out}: {e}"
    return rows, None


def perftest(tls, size):
    """UCX point-to-point tag bandwidth with peer error handling, as libddl's endpoints use it: (GB/s, None) or
    (None, what went wrong)."""
    env = dict(os.environ, UCX_TLS=tls, UCX_POSIX_ERROR_HANDLING="y", UCX_SYSV_ERROR_HANDLING="y")
    iters = max(20, min(2000, (2 << 30) // size))
    port = str(free_port())
    args = ["ucx_perftest", "-p", port, "-t", "tag_bw", "-s", str(size), "-n", str(iters), "-w", "5", "-e"]
    server = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        for _ in range(50):  # the server needs a moment to listen: bounded in tries and time
            text, err = run(args[:1] + ["127.0.0.1"] + args[1:], env, 120)
            if text is not None or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        if text is None:
            return None, f"ucx_perftest tag_bw at {size} B: {err}"
    finally:
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    for line in text.splitlines():
        if line.startswith("Final:"):
            return float(line.split()[5]) * (1 << 20) / 1e9, None  # MB/s (2^20 bytes) -> GB/s
    return None, f"ucx_perftest tag_bw at {size} B printed no 'Final:' line"


def paired_ratios(by_rep, mine, peer, size, field):
    """mine/peer within each repetition that ran both: the two ran minutes apart at most, so a slow spell of
    this machine moves both. Their spread says whether a median ratio is a result or noise."""
    out = []
    for rows in by_rep.values():
        m, p = rows.get(mine, {}).get(size), rows.get(peer, {}).get(size)
        if m and p and m.get(field) and p.get(field):
            out.append(m[field] / p[field])
    return out


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def word_list(p, text, what, allowed=None):
    """The comma-separated words of --WHAT, once each in the given order; p.error (exit 2) on a bad one."""
    words = [w.strip() for w in text.split(",") if w.strip()]
    if not words:
        p.error(f"--{what} is empty")
    for w in words:
        if allowed is not None and w not in allowed:
            p.error(f"--{what}: unknown {what[:-1]} '{w}' (use {', '.join(allowed)})")
    return list(dict.fromkeys(words))


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build", default="build", help="build directory with bin/ddlrun, bin/ddl-bench, "
                   "bin/mpi-allreduce-bench (default: build)")
    p.add_argument("--transports", default="shm",
                   help=f"comma-separated: {', '.join(TRANSPORTS)} (default: shm)")
    p.add_argument("--ranks", default="2,3,4",
                   help="comma-separated rank counts, each 2 or more (default: 2,3,4)")
    p.add_argument("--systems", default="ddl," + ",".join(PEERS),
                   help=f"comma-separated: {', '.join(SYSTEM_WORDS)}; ddl means ddl-ALGO for each of --algos "
                   "(default: ddl and every peer)")
    p.add_argument("--algos", default=",".join(ALGOS), help="ddl's algorithms for 'ddl' (default: all)")
    p.add_argument("--no-mpi", action="store_true", help="leave out openmpi and openmpi-ucx")
    p.add_argument("--no-gloo", action="store_true", help="leave out gloo")
    p.add_argument("--no-perftest", action="store_true", help="leave out the p2p column")
    p.add_argument("--min", type=parse_size, default=parse_size("8"), help="smallest size (default: 8)")
    p.add_argument("--max", type=parse_size, default=parse_size("64M"),
                   help="largest size; the sweep stops at the last size not above it (default: 64M)")
    p.add_argument("--factor", type=int, default=4, help="size step factor, 2 or more (default: 4)")
    p.add_argument("--out-of-place", action="store_true",
                   help="compare the out-of-place figures (Gloo's: a copy, then its in-place allreduce)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items()))
    p.add_argument("--reps", type=int,
                   help=f"runs of each system, the median is shown (default: {DEFAULTS['reps']})")
    p.add_argument("--iters", type=int, help=f"timed calls per size from --small-below up "
                   f"(default: {DEFAULTS['iters']})")
    p.add_argument("--small-iters", type=int, help=f"timed calls per size below --small-below "
                   f"(default: {DEFAULTS['small_iters']})")
    p.add_argument("--small-below", type=parse_size, default=parse_size("1M"),
                   help="where the sweep's second band starts (default: 1M)")
    p.add_argument("--warmup", type=int, help=f"untimed calls per size (default: {DEFAULTS['warmup']})")
    p.add_argument("--pause", type=float,
                   help=f"seconds of quiet before each run (default: {DEFAULTS['pause']})")
    p.add_argument("--timeout", type=int, default=600, help="seconds per benchmark process (default: 600)")
    p.add_argument("--seed", type=int, default=1, help="seed of the run order shuffle")
    p.add_argument("--python", default="/usr/bin/python3",
                   help="the Python with torch (Gloo) and matplotlib (the plot); "
                   "default: Debian's /usr/bin/python3")
    p.add_argument("--no-plot", action="store_true", help="do not draw OUT/busbw.png")
    p.add_argument("--tune-file", help="run ddl with DDL_TUNE_FILE=FILE (a table from ddl-bench --tune) instead "
                                       "of libddl's built-in table")
    p.add_argument("--out", default="bench-results", help="output directory (default: bench-results)")
    a = p.parse_args()

    preset = QUICK if a.quick else DEFAULTS
    for key, value in preset.items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    for key in ("reps", "iters", "small_iters", "timeout"):
        if getattr(a, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be 1 or more")
    if a.warmup < 0 or a.pause < 0:
        p.error("--warmup and --pause must not be negative")
    if a.factor < 2:
        p.error("--factor must be 2 or more")
    if a.min < 1 or a.min > a.max:
        p.error(f"--min must be from 1 to --max ({a.max})")

    a.transports = word_list(p, a.transports, "transports", list(TRANSPORTS))
    a.algos = word_list(p, a.algos, "algos", list(ALGOS))
    try:
        a.ranks = [int(r) for r in word_list(p, a.ranks, "ranks")]
    except ValueError:
        p.error(f"--ranks: '{a.ranks}' is not a list of integers (e.g. 2,3,4)")
    if min(a.ranks) < 2:
        p.error("--ranks: each rank count must be 2 or more (busbw is 0 for one rank)")
    systems = []
    for word in word_list(p, a.systems, "systems", list(SYSTEM_WORDS)):
        systems += [f"ddl-{x}" for x in a.algos] if word == "ddl" else [word]
    if a.no_mpi:
        systems = [s for s in systems if s not in MPI_VARIANTS]
    if a.no_gloo:
        systems = [s for s in systems if s != "gloo"]
    a.systems = list(dict.fromkeys(systems))
    if not a.systems:
        p.error("no system left to run (see --systems, --no-mpi, --no-gloo)")
    return a


def check_tools(a):
    """Says now, not after minutes of runs, what a chosen system lacks."""
    problems = []
    def need_file(path, hint):
        if not os.access(path, os.X_OK):
            problems.append(f"{path} is missing ({hint})")
    if a.tune_file and not os.access(a.tune_file, os.R_OK):
        problems.append(f"--tune-file {a.tune_file} cannot be read (write one with: ddlrun -np N -- "
                        f"ddl-bench --tune {a.tune_file})")
    if any(s.startswith("ddl-") for s in a.systems):
        need_file(f"{a.build}/bin/ddlrun", "build ddl: ./scripts/build")
        need_file(f"{a.build}/bin/ddl-bench", "build ddl: ./scripts/build")
    if any(s in MPI_VARIANTS for s in a.systems):
        need_file(f"{a.build}/bin/mpi-allreduce-bench",
                  "it is built when CMake finds MPI: scripts/bootstrap installs libopenmpi-dev; or --no-mpi")
        if subprocess.run(["sh", "-c", "command -v mpirun"], stdout=subprocess.DEVNULL).returncode != 0:
            problems.append("mpirun is not on PATH (openmpi-bin; or --no-mpi)")
    if "gloo" in a.systems:
        probe = "import torch.distributed as d; assert d.is_available() and d.is_gloo_available()"
        try:
            ok = subprocess.run([a.python, "-c", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                timeout=120).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if not ok:
            problems.append(f"{a.python} cannot import torch.distributed with Gloo "
                            "(scripts/bootstrap bench installs python3-torch; or --no-gloo)")
    if not a.no_perftest:
        if subprocess.run(["sh", "-c", "command -v ucx_perftest"], stdout=subprocess.DEVNULL).returncode != 0:
            problems.append("ucx_perftest is not on PATH (ucx-utils; or --no-perftest)")
    if problems:
        sys.exit("compare.py: cannot run the chosen systems:\n  " + "\n  ".join(problems))


def verdict(lo_hi_n, reps):
    """'ahead' (at or above) or 'behind' only when every repetition ran both and agrees; '~' when they
    disagree (noise decides); 'few' when some repetition lacks one of the two."""
    if not lo_hi_n:
        return "-"
    lo, hi, n = lo_hi_n
    if n < reps:
        return "few"
    return "ahead" if lo >= 1 else "behind" if hi < 1 else "~"


def print_table(entry, a, tdesc, tls):
    systems, sizes = entry["systems"], entry["sizes"]
    busbw, p2p, best = entry["busbw_GBs"], entry["p2p_GBs"], entry["best_peer"]
    has_peer = "ddl-auto" in systems and any(s in PEERS for s in systems)
    has_p2p = "ddl-auto" in systems and bool(p2p)
    gloo = "; gloo over TCP loopback" if "gloo" in systems else ""
    print(f"\n## {entry['ranks']} ranks over {tdesc} (UCX_TLS={tls}{gloo}); busbw GB/s, "
          f"{entry['variant']}, median of {a.reps}")
    head = f"{'size':>8} {'p2p':>7} " + " ".join(f"{n:>11}" for n in systems)
    if has_peer:
        head += f" {'best peer':>11} {'auto/best':>9} {'each rep':>11} {'verdict':>7}"
    if has_p2p:
        head += f" {'auto/p2p':>8}"
    print(head)
    dash = lambda width: f"{'-':>{width}}"
    # Two decimals, as nccl-tests; below 0.1 (GB/s of small messages, ratios) two significant digits, so that
    # they differ.
    bw = lambda v, width: dash(width) if v is None else f"{v:{width}.2f}" if v >= 0.1 else f"{v:{width}.2g}"
    for size in sizes:
        row, key = busbw[str(size)], str(size)
        line = f"{human(size):>8} {bw(p2p.get(key), 7)} "
        line += " ".join(bw(row.get(n), 11) for n in systems)
        auto = row.get("ddl-auto")
        if has_peer:
            peer = best.get(key)
            line += f" {peer:>11}" if peer else " " + dash(11)
            line += " " + bw(auto / row[peer] if auto and peer and row[peer] else None, 9)
            lo_hi = entry.get("auto_best_per_rep", {}).get(key)
            line += f" {lo_hi[0]:5.2f}-{lo_hi[1]:<5.2f}" if lo_hi else " " + dash(11)
            line += f" {verdict(lo_hi, a.reps):>7}"
        if has_p2p:
            line += f" {auto / p2p[key]:8.0%}" if auto and p2p.get(key) else " " + dash(8)
        print(line)
    sys.stdout.flush()


def plot(a, path):
    script = f"{HERE}/plot.py"
    probe = subprocess.run([a.python, "-c", "import matplotlib"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    if probe.returncode != 0:
        print(f"plot: skipped: {a.python} cannot import matplotlib (scripts/bootstrap bench installs "
              f"python3-matplotlib for /usr/bin/python3; then: /usr/bin/python3 bench/plot.py {path})")
        return None
    text, err = run([a.python, script, path], dict(os.environ), 300)
    if text is None:
        return f"plot: {err}"
    print(text.strip())
    return None


def write_summary(summary, errors, started, path):
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["errors"] = errors
    with open(path, "w") as f:
        json.dump(summary, f, indent=1)


def main():
    a = parse_args()
    # SIGTERM unwinds like Ctrl-C, so run() stops the system that is running (it has a session of its own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    check_tools(a)
    os.makedirs(a.out, exist_ok=True)
    sizes = []
    s = a.min
    while s <= a.max:
        sizes.append(s)
        s *= a.factor
    if sizes[-1] != a.max:
        print(f"note: sizes {human(sizes[0])} x{a.factor} end at {human(sizes[-1])}, below --max "
              f"{human(a.max)} (as nccl-tests' -b -e -f)")
    small, large = [x for x in sizes if x < a.small_below], [x for x in sizes if x >= a.small_below]
    bands = []
    if small:
        bands.append([*sweep(small[0], small[-1], a), "-n", str(a.small_iters), "-w", str(a.warmup)])
    if large:
        bands.append([*sweep(large[0], large[-1], a), "-n", str(a.iters), "-w", str(a.warmup)])
    field = "busbw_GBs" if a.out_of_place else "inplace_busbw_GBs"
    variant = "out of place" if a.out_of_place else "in place"
    summary = {
        "machine": {"host": socket.gethostname(), "cpus": os.cpu_count(),
                    "date": datetime.datetime.now().isoformat(timespec="seconds")},
        "sizes": sizes, "variant": variant, "reps": a.reps, "warmup": a.warmup,
        "iters": {"below": a.small_below, "small": a.small_iters, "large": a.iters},
        "peers": list(PEERS), "results": [],
    }
    errors = []
    rng = random.Random(a.seed)
    started = time.monotonic()
    path = f"{a.out}/summary.json"

    for tname in a.transports:
        tls, _, tdesc = TRANSPORTS[tname]
        p2p = {}
        if not a.no_perftest:
            for size in sizes:
                measured = []
                for _ in range(a.reps):
                    gbs, err = perftest(tls, size)
                    if gbs is None:
                        errors.append(f"{tname}, p2p: {err}")
                    else:
                        measured.append(gbs)
                p2p[size] = median(measured)
        for ranks in a.ranks:
            runs = {name: [] for name in a.systems}
            by_rep = {}  # rep -> {system: rows}: for ratios within one repetition
            with tempfile.TemporaryDirectory() as tmp:
                for rep in range(a.reps):
                    # A new order every repetition (seeded: reproducible), so that neither a system's position
                    # nor its predecessor is fixed: whatever one run leaves behind falls on every system
                    # alike. (A rotation would keep each system's predecessor.)
                    order = a.systems[:]
                    rng.shuffle(order)
                    for name in order:
                        time.sleep(a.pause)
                        rows, err = system_run(a, tname, name, ranks, bands, tmp)
                        if rows is not None:
                            runs[name].append(rows)
                            by_rep.setdefault(rep, {})[name] = rows
                        else:
                            errors.append(f"{tname}, {ranks} ranks, {name}: {err}")
            table, best, spread = {}, {}, {}
            for size in sizes:
                cell = {name: median(r[size][field] for r in results if size in r)
                        for name, results in runs.items()}
                table[str(size)] = cell
                peers = [(cell[n], n) for n in PEERS if cell.get(n) is not None]
                if peers:
                    best[str(size)] = max(peers)[1]
                    pair = paired_ratios(by_rep, "ddl-auto", best[str(size)], size, field)
                    if pair:
                        spread[str(size)] = [min(pair), max(pair), len(pair)]
            entry = {"transport": tname, "ucx_tls": tls, "ranks": ranks, "variant": variant, "sizes": sizes,
                     "systems": a.systems, "p2p_GBs": {str(k): v for k, v in p2p.items()},
                     "busbw_GBs": table, "best_peer": best, "auto_best_per_rep": spread}
            summary["results"].append(entry)
            print_table(entry, a, tdesc, tls)
            write_summary(summary, errors, started, path)  # after each table: a cut-off run keeps them

    write_summary(summary, errors, started, path)
    print(f"\nwrote {path} ({summary['seconds']:.0f} s of measurements)")
    if not a.no_plot:
        err = plot(a, path)
        if err:
            errors.append(err)
    for e in errors:
        print("error:", e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
