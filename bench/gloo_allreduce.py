#!/usr/bin/python3
"""gloo-allreduce-bench: the Gloo peer of ddl-bench, through torch.distributed (backend "gloo"), for
side-by-side figures on the same machines.

It runs the sweep the way ddl-bench and mpi-allreduce-bench do (per size: barrier, warmup, barrier, the mean
of -n timed calls, the slowest rank's), float32 sum only, checks the result of every size, and prints the
nccl-tests table and, with --json, ddl-bench's JSON with "algo": "gloo". torch.distributed has only an
in-place allreduce, so "in place" is all_reduce(buf) and "out of place" is what a caller who must keep its
input does: copy the input into the output buffer, then all_reduce it (the copy is timed). torch's Gloo
devices are TCP, so on one machine it runs over loopback whatever UCX_TLS says.

Ranks join from the environment, as torchrun and ddlrun set it (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
or the program starts them itself with --np N on this machine, on a free port, and stops them all when one
fails or --timeout passes. Run with Debian's python3 (python3-torch; scripts/bootstrap bench installs it):

  /usr/bin/python3 bench/gloo_allreduce.py --np 4 -b 8 -e 64M -f 4 --json gloo.json
"""
import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time

EXIT_OK, EXIT_WRONG_VALUES, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3
PROGRAM = "gloo-allreduce-bench"


# ---- Command line: the sweep flags of tools/ddl-bench/bench_common.h, with the same defaults and checks ----

def size_arg(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    try:
        value = int(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid size '{text}' (use bytes, optionally with K, M or G)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid size '{text}' (must not be negative)")
    return value


def int_arg(low):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"invalid value '{text}' (use an integer from {low})")
        return value
    return parse


def choice_arg(allowed, what):
    def parse(text):
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{what} '{text}' is not measured ({allowed[0]} only)")
        return text
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROGRAM, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--minbytes", type=size_arg, default=8, help="smallest message, bytes; K, M, G (8)")
    p.add_argument("-e", "--maxbytes", type=size_arg, default=64 << 20, help="largest message (64M)")
    p.add_argument("-f", "--stepfactor", type=int_arg(1), default=None,
                   help="multiply the size by N each step (2)")
    p.add_argument("-i", "--stepbytes", type=size_arg, default=None,
                   help="add SIZE each step instead; used when -f is not given or is 1 (1M)")
    p.add_argument("-n", "--iters", type=int_arg(1), default=20, help="timed iterations per size (20)")
    p.add_argument("-w", "--warmup_iters", type=int_arg(0), default=5,
                   help="untimed iterations before them (5)")
    p.add_argument("-c", "--check", type=int_arg(0), default=1,
                   help="checks per size and variant, 0: none (1)")
    p.add_argument("-d", "--datatype", type=choice_arg(["float", "float32"], "datatype"), default="float",
                   help="float only (accepted for ddl-bench command lines)")
    p.add_argument("-o", "--op", type=choice_arg(["sum"], "op"), default="sum", help="sum only (likewise)")
    p.add_argument("--json", metavar="FILE", help="rank 0 also writes the results to FILE as JSON")
    p.add_argument("--np", type=int_arg(1),
                   help="start N ranks here (else join as RANK of WORLD_SIZE from the environment)")
    p.add_argument("--timeout", type=int_arg(1), default=300,
                   help="seconds: any one collective (and rendezvous); with --np, the whole run (300)")
    a = p.parse_args(argv)
    # As nccl-tests: the sizes grow by the factor when it is above 1, else by the step; -i alone means steps.
    if a.stepbytes is not None and a.stepfactor is None:
        a.stepfactor = 1
    a.stepfactor = 2 if a.stepfactor is None else a.stepfactor
    a.stepbytes = (1 << 20) if a.stepbytes is None else a.stepbytes
    if a.stepfactor == 1 and a.stepbytes == 0:
        p.error("-i: must be above 0 when sizes grow linearly")
    if a.stepfactor > 1 and a.minbytes == 0:
        p.error("-b: must be above 0 when sizes grow by a factor")
    if a.minbytes > a.maxbytes:
        p.error(f"-b: minbytes {a.minbytes} is above maxbytes {a.maxbytes}")
    if a.json == "":
        p.error("--json: needs a file name")
    return a


def sweep_sizes(a):
    """Message sizes in bytes, as bench_next_size walks them."""
    size = a.minbytes
    while True:
        yield size
        if a.stepfactor > 1:
            if size > a.maxbytes // a.stepfactor:
                return
            size *= a.stepfactor
        else:
            if size > a.maxbytes - a.stepbytes:
                return
            size += a.stepbytes


# ---- Launcher (--np) ----

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(a, argv):
    """Starts a.np ranks of this program; returns the first failing rank's status (0 when all succeed)."""
    child_argv = []
    skip = False
    for arg in argv:  # the same flags, less --np
        if skip:
            skip = False
        elif arg == "--np":
            skip = True
        elif not arg.startswith("--np="):
            child_argv.append(arg)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(a.np))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one machine: loopback, whatever the default route is
    procs = []
    for rank in range(a.np):
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *child_argv],
                                      env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank))))
    deadline = time.monotonic() + a.timeout
    status = None
    try:
        while status is None and any(p.poll() is None for p in procs):
            for rank, p in enumerate(procs):
                rc = p.poll()
                if rc is not None and rc != 0:
                    status = 128 - rc if rc < 0 else rc  # a signal as a shell reports it
                    print(f"{PROGRAM}: rank {rank} failed (exit {rc}); stopping the others", file=sys.stderr)
                    break
            if status is None and time.monotonic() > deadline:
                print(f"{PROGRAM}: --timeout {a.timeout} s passed; stopping the ranks", file=sys.stderr)
                status = EXIT_ERROR
            time.sleep(0.05)
    finally:
        stop(procs)
    if status is None:
        status = next((p.returncode for p in procs if p.returncode != 0), EXIT_OK)
    return status


def stop(procs):
    """SIGTERM to the ranks still running, SIGKILL to those still running 5 s later."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


# ---- One rank ----

class Bench:
    """One rank's run of the sweep; everything on the main thread (Gloo's I/O threads are torch's)."""

    def __init__(self, a, torch, dist):
        self.a, self.torch, self.dist = a, torch, dist
        self.rank, self.nranks = dist.get_rank(), dist.get_world_size()
        # Rank r's element i is 1 + (r + i) % 3, so the sum is a small integer, exact in float32, and depends
        # on i only through i % 3: one tensor of the largest size serves every size as a prefix.
        max_count = max(1, a.maxbytes // 4)
        period = max_count // 3 + 1
        mine = torch.tensor([1 + (self.rank + k) % 3 for k in range(3)], dtype=torch.float32)
        total = torch.tensor([sum(1 + (r + k) % 3 for r in range(self.nranks)) for k in range(3)],
                             dtype=torch.float32)
        self.inputs = mine.repeat(period)[:max_count].contiguous()
        self.expected = total.repeat(period)[:max_count].contiguous()
        self.send = torch.zeros(max_count, dtype=torch.float32)  # zeros: the pages are faulted in now
        self.recv = torch.zeros(max_count, dtype=torch.float32)

    def allreduce(self, count, in_place):
        recv = self.recv[:count]
        if not in_place:
            recv.copy_(self.send[:count])
        self.dist.all_reduce(recv, op=self.dist.ReduceOp.SUM)

    def time_us(self, count, in_place):
        """Barrier, warmup, barrier, then the mean time of -n calls, the slowest rank's."""
        self.dist.barrier()
        for _ in range(self.a.warmup_iters):
            self.allreduce(count, in_place)
        self.dist.barrier()
        start = time.perf_counter()
        for _ in range(self.a.iters):
            self.allreduce(count, in_place)
        us = self.torch.tensor([(time.perf_counter() - start) * 1e6 / self.a.iters], dtype=self.torch.float64)
        self.dist.all_reduce(us, op=self.dist.ReduceOp.MAX)
        return us.item()

    def wrong(self, count, in_place):
        """The wrong elements over all ranks, from the first of -c checks that finds any."""
        wrong = 0
        for _ in range(self.a.check):
            self.recv[:count].fill_(float("nan"))  # a result never written counts as wrong
            (self.recv if in_place else self.send)[:count].copy_(self.inputs[:count])
            self.allreduce(count, in_place)
            n = (self.recv[:count] != self.expected[:count]).sum().reshape(1)
            self.dist.all_reduce(n, op=self.dist.ReduceOp.SUM)
            wrong = int(n.item())
            if wrong > 0:
                break
        return wrong

    def measure(self, count, in_place):
        # In place, each timed call reduces the previous result again (the values grow to inf, which costs
        # nothing extra); the check fills the buffer afresh.
        (self.recv if in_place else self.send)[:count].copy_(self.inputs[:count])
        us = self.time_us(count, in_place)
        algbw = count * 4 / (us * 1e3)  # GB/s, GB = 1e9 bytes
        busbw = algbw * 2 * (self.nranks - 1) / self.nranks
        wrong = self.wrong(count, in_place) if self.a.check > 0 else None
        return {"time_us": us, "algbw_GBs": algbw, "busbw_GBs": busbw, "wrong": wrong}

    def run(self):
        a = self.a
        if self.rank == 0:
            print(f"# {PROGRAM}  ranks {self.nranks}  topology {self.nranks}  algo gloo  "
                  f"torch {self.torch.__version__}")
            mode = f"factor: {a.stepfactor}" if a.stepfactor > 1 else f"bytes: {a.stepbytes}"
            print(f"# minBytes {a.minbytes} maxBytes {a.maxbytes} step {mode} warmup iters: {a.warmup_iters} "
                  f"iters: {a.iters} validation: {a.check}")
            print("# algo: gloo (torch.distributed's Gloo backend over TCP; out of place = copy + in place)")
            print(f"#{'':>51}out-of-place{'':>25}in-place")
            print(f"#{'size':>11} {'count':>13} {'type':>9} {'redop':>7} {'root':>7} "
                  + f"{'time':>8} {'algbw':>7} {'busbw':>7} {'#wrong':>6} " * 2)
            units = f"{'(us)':>8} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6} "
            print(f"#{'(B)':>11} {'(elements)':>13} {'':>25} " + units * 2)
            sys.stdout.flush()
        rows = []
        for size in sweep_sizes(a):
            count = size // 4
            if count == 0 or (rows and rows[-1]["count"] == count):
                continue
            out, inp = self.measure(count, False), self.measure(count, True)
            row = {"bytes": count * 4, "count": count, "type": "float32", "redop": "sum", "algo": "gloo"}
            row.update(out)
            row.update({"inplace_" + k: v for k, v in inp.items()})
            rows.append(row)
            if self.rank == 0:
                cells = ""
                for v in (out, inp):
                    w = "N/A" if v["wrong"] is None else str(v["wrong"])
                    cells += f" {v['time_us']:8.1f} {v['algbw_GBs']:7.2f} {v['busbw_GBs']:7.2f} {w:>6}"
                print(f"{count * 4:>12} {count:>13} {'float':>9} {'sum':>7} {-1:>7}{cells}", flush=True)
        total_wrong = sum(r[k] or 0 for r in rows for k in ("wrong", "inplace_wrong"))
        status = EXIT_WRONG_VALUES if total_wrong > 0 else EXIT_OK
        if self.rank == 0:
            busbws = [r[k] for r in rows for k in ("busbw_GBs", "inplace_busbw_GBs")]
            print(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
            print(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws) if busbws else 0:g}")
            if a.json is not None:
                doc = {"ranks": self.nranks, "topology": str(self.nranks), "algo": "gloo", "results": rows}
                try:
                    with open(a.json, "w") as f:
                        json.dump(doc, f, indent=None)
                        f.write("\n")
                except OSError as e:
                    print(f"{PROGRAM}: --json: cannot write '{a.json}': {e.strerror}", file=sys.stderr)
                    status = status or EXIT_USAGE
        return status


def run_rank(a):
    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        print(f"{PROGRAM}: {', '.join(missing)} not set: start the ranks with --np N, torchrun or ddlrun",
              file=sys.stderr)
        return EXIT_USAGE
    rank = os.environ["RANK"]
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        print(f"{PROGRAM}: rank {rank}: cannot import torch ({e}); run with /usr/bin/python3 after "
              "scripts/bootstrap bench (python3-torch)", file=sys.stderr)
        return EXIT_ERROR
    torch.set_num_threads(1)  # the ranks share the cores; fills and checks need no thread pool
    try:
        dist.init_process_group("gloo", init_method="env://",
                                timeout=datetime.timedelta(seconds=a.timeout))
        status = Bench(a, torch, dist).run()
        dist.destroy_process_group()
        return status
    except Exception as e:  # a peer died, the rendezvous or a collective timed out: say which rank saw what
        print(f"{PROGRAM}: rank {rank}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_ERROR


def main(argv):
    a = parse_args(argv)
    if a.np is None:
        return run_rank(a)  # SIGTERM keeps its default: a rank blocked in Gloo dies at once
    # The launcher stops its ranks (launch's finally) when it is told to stop.
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _: sys.exit(128 + signum))
    return launch(a, argv)


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)
    sys.exit(main(sys.argv[1:]))
