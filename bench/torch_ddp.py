#!/usr/bin/python3
"""DDP training and torch.distributed.all_reduce over ddl and gloo, on this machine.

    bench/torch_ddp.py ddp [--ranks 1,2,3,4] [--model cnn,mlp] [--reps 3] [--json FILE]
    bench/torch_ddp.py ddp --device cuda [--ranks 2,4]     # GPUs: torch 2.x (.venv/torch2), CUDA tensors
    bench/torch_ddp.py allreduce [--ranks 2,4] [--min 4K] [--max 64M] [--reps 3] [--json FILE]

ddp: examples/fashion_mnist/train.py's models (and a communication-bound one, embed), DistributedDataParallel,
one torch thread per rank, a fixed batch per rank (64 by default). Per backend and rank count it reports the
step time (median over the repetitions of each run's per-step median, averaged over the ranks), samples/s of
the job, and the time a step is exposed on communication: step time minus the same step under DDP's
no_sync() (which skips the gradient all_reduce), the two measured in alternating blocks within each run. Backend "ddl-blocking" is ddl with TORCH_DDL_BLOCKING=1: each collective runs
on the calling thread, so DDP cannot overlap it with the backward pass; its exposed time against ddl's shows
the overlap. --device cuda runs the same on CUDA tensors (one GPU per rank where there are enough, ranks
sharing GPUs otherwise; start the MPS daemon for figures when they share one) with the torch 2.x of --python
(default .venv/torch2/bin/python): ddl stream-ordered, ddl-blocking waiting on the host for every collective,
gloo through host memory, and ddl-staged (TORCH_DDL_REGISTER=0: none of DDP's buckets registered, so every
allreduce copies its input through libddl's memory; ddl registers them for zero-copy); each timed step ends
with torch.cuda.synchronize(), so it includes its GPU work.

allreduce: torch.distributed.all_reduce (float32 sum, in place) through ddl and through gloo, sizes 4 KiB to
64 MiB, busbw = bytes/time * 2(n-1)/n as nccl-tests defines it; next to it raw ddl-bench (its in-place
column) at the same sizes, so that the cost of the torch layer shows.

Ranks run under ddlrun (build/bin/ddlrun); repetitions run in shuffled order, so that drift of this machine
spreads over every backend. Prints tables; --json writes every figure.
"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

from compare import human as fmt_size, parse_size  # bench/compare.py's, next to this file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("DDL_BUILD_DIR", os.path.join(ROOT, "build"))
DDLRUN = os.path.join(BUILD, "bin", "ddlrun")
DDL_BENCH = os.path.join(BUILD, "bin", "ddl-bench")
PYTHON = "/usr/bin/python3"  # Debian's torch 1.13 (build/python)
VENV_PYTHON = os.path.join(ROOT, ".venv", "torch2", "bin", "python")  # scripts/bootstrap's torch 2.x


def torch_build_dir(python):
    """Where the build put the torch_ddl for python's torch (python/CMakeLists.txt: build/python for Debian's
    torch 1.13, build/python-torch2 for a torch 2.x); DDL_TORCH_PYTHONPATH says it instead."""
    if os.environ.get("DDL_TORCH_PYTHONPATH"):
        return os.environ["DDL_TORCH_PYTHONPATH"]
    r = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], stdout=subprocess.PIPE,
                       stderr=subprocess.DEVNULL, text=True)
    if r.returncode != 0:
        sys.exit("%s cannot import torch" % python)
    return os.path.join(BUILD, "python" if r.stdout.startswith("1.") else "python-torch2")


# ---- the rank side ----

def worker(args):
    import datetime
    import torch
    import torch.distributed as dist
    backend = args.backend
    if backend.startswith("ddl"):
        import torch_ddl  # noqa: F401
    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    device = torch.device("cpu")
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist.init_process_group("ddl" if backend.startswith("ddl") else backend, timeout=datetime.timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    out = {}
    if args.what == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        gen = torch.Generator().manual_seed(rank)
        if args.model == "embed":
            # A fastText-style text classifier: a large embedding table (dense gradients), almost no compute
            # per parameter: the step is the gradient all_reduce.
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.EmbeddingBag(100000, 64, mode="mean"), torch.nn.Linear(64, 10))
            x = torch.randint(0, 100000, (args.batch, 32), generator=gen)
        else:
            sys.path.insert(0, os.path.join(ROOT, "examples", "fashion_mnist"))
            import train
            model = train.make_model(args.model)
            x = torch.randn(args.batch, 1, 28, 28, generator=gen)
        y = torch.randint(0, 10, (args.batch,), generator=gen)
        model, x, y = model.to(device), x.to(device), y.to(device)
        ddp = DDP(model, device_ids=[device] if cuda else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)

        def step(sync):
            if sync:
                loss = torch.nn.functional.cross_entropy(ddp(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
            else:
                with ddp.no_sync():
                    loss = torch.nn.functional.cross_entropy(ddp(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
            opt.step()
            if cuda:
                torch.cuda.synchronize()  # the step's time includes its GPU work

        # Blocks of --block steps, synchronised and not in turn, each step timed on its own: both modes see
        # the same machine, and the medians shrug off the odd slow step. A barrier before each block lines
        # the ranks up (a no_sync step waits for nobody).
        for _ in range(args.warmup):
            step(True)
            step(False)
        times = {"sync": [], "nosync": []}
        for b in range(2 * max(1, args.steps // args.block)):
            mode = "sync" if b % 2 == 0 else "nosync"
            dist.barrier()
            for _ in range(args.block):
                t0 = time.perf_counter()
                step(mode == "sync")
                times[mode].append(time.perf_counter() - t0)
        med = torch.tensor([statistics.median(times["sync"]), statistics.median(times["nosync"])],
                           dtype=torch.float64, device=device)
        dist.all_reduce(med)  # the mean over the ranks (sum, then /world)
        out["sync"], out["nosync"] = (med / world).cpu().tolist()
        out["params"] = sum(p.numel() for p in model.parameters())
        if backend.startswith("ddl") and args.device == "cuda":  # DDP's buckets registered for zero-copy
            pg = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
            out["registered"] = getattr(pg, "registered_buffers", 0)
    else:
        for size in args.sizes:
            t = torch.ones(size // 4)
            for _ in range(3):
                dist.all_reduce(t)
            # About 0.3 s per size, 5 to 200 calls.
            t0 = time.perf_counter()
            dist.all_reduce(t)
            one = time.perf_counter() - t0
            iters = max(5, min(200, int(0.3 / max(one, 1e-6))))
            flag = torch.tensor([iters])
            dist.broadcast(flag, 0)  # every rank runs the same count
            iters = int(flag.item())
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            seconds = (time.perf_counter() - t0) / iters
            worst = torch.tensor([seconds], dtype=torch.float64)
            dist.all_reduce(worst, op=dist.ReduceOp.MAX)
            out[str(size)] = worst.item()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(out, f)
    dist.barrier()
    # No teardown: torch 1.13's ProcessGroupGloo can hang in its destructor after DDP (it joins a worker thread
    # that waits for the GIL its caller holds); every backend skips it alike.
    sys.stdout.flush()
    os._exit(0)


# ---- the driver ----

def launch_hosts(hosts, env, worker_cmd, timeout):
    """One rank per host (bench/torch_hosts.sh's network namespaces, each with an IPC namespace of its own):
    started with the torchrun variables, rank 0's address as MASTER_ADDR, traffic kept on eth0."""
    port = 29500 + random.randrange(2000)
    procs = []
    for r, (ns, addr) in enumerate(hosts):
        e = dict(env, RANK=str(r), WORLD_SIZE=str(len(hosts)), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                 MASTER_ADDR=hosts[0][1], MASTER_PORT=str(port), UCX_NET_DEVICES="eth0", GLOO_SOCKET_IFNAME="eth0")
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns, "unshare", "--ipc"] + worker_cmd, env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    deadline = time.monotonic() + timeout
    out, code = "", 0
    for p in procs:
        try:
            o, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            o, _ = p.communicate()
            code = code or 124
        out += o
        code = code or p.returncode
    return code, out


def launch(n, backend, what, extra, timeout=900, hosts=None, python=PYTHON):
    fd, path = tempfile.mkstemp(prefix="torch-bench-", suffix=".json")
    os.close(fd)
    env = dict(os.environ, PYTHONPATH=torch_build_dir(python), OMP_NUM_THREADS="1")
    env.pop("TORCH_DDL_BLOCKING", None)
    env.pop("TORCH_DDL_REGISTER", None)
    if backend == "ddl-blocking":
        env["TORCH_DDL_BLOCKING"] = "1"
    if backend == "ddl-staged":
        env["TORCH_DDL_REGISTER"] = "0"
    worker_cmd = [python, os.path.abspath(__file__), "--worker", what, "--backend", backend, "--out", path] + extra
    if hosts:
        code, output = launch_hosts(hosts, env, worker_cmd, timeout)
    else:
        r = subprocess.run([DDLRUN, "-np", str(n), "--"] + worker_cmd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        code, output = r.returncode, r.stdout
    if code != 0:
        sys.exit("%s %s on %d ranks failed:\n%s" % (what, backend, n, output[-3000:]))
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    return data


def ddl_bench(n, lo, hi):
    fd, path = tempfile.mkstemp(prefix="ddl-bench-", suffix=".json")
    os.close(fd)
    cmd = [DDLRUN, "-np", str(n), "--", DDL_BENCH, "-b", str(lo), "-e", str(hi), "-f", "4", "-w", "10", "-n", "100",
           "-c", "0", "--json", path]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit("ddl-bench on %d ranks failed:\n%s" % (n, r.stdout[-3000:]))
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    # {size: seconds} of the in-place column.
    return {row["bytes"]: row["inplace_time_us"] * 1e-6 for row in data["results"]}


def run_ddp(args):
    hosts = [tuple(h.split("=")) for h in args.hosts.split(",")] if args.hosts else None
    ranks = [len(hosts)] if hosts else [int(r) for r in args.ranks.split(",")]
    models = args.model.split(",")
    # ddl-staged (CUDA): torch_ddl registers none of DDP's buckets, so every allreduce copies through libddl's
    # memory; against ddl, what zero-copy gives.
    backends = ["ddl", "ddl-blocking", "gloo"] + (["ddl-staged"] if args.device == "cuda" else [])
    runs = [(m, n, b) for m in models for n in ranks for b in backends for _ in range(args.reps)]
    random.Random(7).shuffle(runs)
    raw = {}
    for i, (m, n, b) in enumerate(runs, 1):
        print("[%d/%d] %s %d ranks %s" % (i, len(runs), m, n, b), file=sys.stderr, flush=True)
        extra = ["--model", m, "--batch", str(args.batch), "--steps", str(args.steps), "--block", str(args.block),
                 "--warmup", str(args.warmup), "--device", args.device]
        raw.setdefault((m, n, b), []).append(launch(n, b, "ddp", extra, hosts=hosts, python=args.python))
    where = ("one rank per host, %d hosts (network namespaces), links: %s" % (len(hosts), args.link) if hosts
             else "ranks on this machine, shared memory")
    if args.device == "cuda":
        where += ", CUDA tensors"
    result = {"what": "ddp", "where": where, "device": args.device, "batch_per_rank": args.batch,
              "steps": args.steps, "warmup": args.warmup, "reps": args.reps, "cases": []}
    for m in models:
        print("\n## %s, %s: DDP step over %s, batch %d per rank, median of %d runs of %d steps (ms; samples/s of "
              "the job)" % (m, where, ", ".join(backends), args.batch, args.reps, args.steps))
        print("%5s  %-13s %8s %9s %10s %12s %14s %16s" % ("ranks", "backend", "step", "no_sync", "exposed",
                                                          "samples/s", "ddl/gloo step", "exposed/blocking"))
        for n in ranks:
            med = {}
            for b in backends:
                reps = raw[(m, n, b)]
                step = statistics.median(r["sync"] for r in reps)
                nosync = statistics.median(r["nosync"] for r in reps)
                exposed = statistics.median(r["sync"] - r["nosync"] for r in reps)
                med[b] = (step, nosync, exposed)
                result["cases"].append({"model": m, "ranks": n, "backend": b, "params": reps[0]["params"],
                                        "step_s": step, "nosync_s": nosync, "exposed_s": exposed,
                                        "samples_per_s": n * args.batch / step,
                                        "registered": reps[0].get("registered"),
                                        "runs": [{"step_s": r["sync"], "nosync_s": r["nosync"]} for r in reps]})
            for b in backends:
                step, nosync, exposed = med[b]
                ratio = "%.2f" % (step / med["gloo"][0]) if b.startswith("ddl") else ""
                ov = "%.2f" % (exposed / med["ddl-blocking"][2]) if b == "ddl" and med["ddl-blocking"][2] > 0 else ""
                print("%5d  %-13s %8.2f %9.2f %10.2f %12.0f %14s %16s" % (n, b, 1e3 * step, 1e3 * nosync,
                                                                        1e3 * exposed, n * args.batch / step, ratio, ov))
    return result


def run_allreduce(args):
    ranks = [int(r) for r in args.ranks.split(",")]
    sizes = []
    s = args.min
    while s <= args.max:
        sizes.append(s)
        s *= 4
    backends = ["ddl", "gloo", "ddl-bench"]
    runs = [(n, b) for n in ranks for b in backends for _ in range(args.reps)]
    random.Random(11).shuffle(runs)
    raw = {}
    for i, (n, b) in enumerate(runs, 1):
        print("[%d/%d] all_reduce %d ranks %s" % (i, len(runs), n, b), file=sys.stderr, flush=True)
        if b == "ddl-bench":
            got = ddl_bench(n, sizes[0], sizes[-1])
        else:
            got = {int(k): v for k, v in launch(n, b, "allreduce", ["--sizes"] + [str(x) for x in sizes]).items()}
        raw.setdefault((n, b), []).append(got)
    result = {"what": "allreduce", "reps": args.reps, "ranks": ranks, "sizes": sizes, "cases": []}
    for n in ranks:
        for size in sizes:
            for b in backends:
                runs = [r[size] for r in raw[(n, b)]]
                result["cases"].append({"ranks": n, "backend": b, "bytes": size, "time_s": statistics.median(runs),
                                        "busbw_gbs": busbw(size, statistics.median(runs), n), "runs_s": runs})
    print_allreduce(result)
    return result


def busbw(size, seconds, n):
    return size / seconds * (2 * (n - 1) / n if n > 1 else 1) / 1e9


def print_allreduce(result):
    """The all_reduce tables of a result (also of a saved --json: bench/torch_ddp.py report FILE). Medians, and
    the ratios of the best runs too: this VM runs a whole program either fast or some 5x slower, at random."""
    by = {(c["ranks"], c["backend"], c["bytes"]): c for c in result["cases"]}
    for n in result["ranks"]:
        print("\n## torch.distributed.all_reduce, %d ranks, float32 sum in place: busbw GB/s (median of %d runs; "
              "best/best: the fastest runs' ratio)" % (n, result["reps"]))
        print("%8s %10s %10s %12s %14s %12s %12s" % ("size", "ddl", "gloo", "ddl-bench", "ddl/ddl-bench",
                                                     "best/best", "ddl/gloo"))
        for size in result["sizes"]:
            med = {b: by[(n, b, size)]["busbw_gbs"] for b in ("ddl", "gloo", "ddl-bench")}
            best = {b: busbw(size, min(by[(n, b, size)]["runs_s"]), n) for b in ("ddl", "ddl-bench")}
            print("%8s %10.3f %10.3f %12.3f %14.2f %12.2f %12.1f" % (
                fmt_size(size), med["ddl"], med["gloo"], med["ddl-bench"], med["ddl"] / med["ddl-bench"],
                best["ddl"] / best["ddl-bench"], med["ddl"] / med["gloo"]))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="?", choices=["ddp", "allreduce", "report"])
    p.add_argument("file", nargs="?", help="report: a --json file of an allreduce run, printed again")
    p.add_argument("--ranks", default=None)
    p.add_argument("--model", default="cnn,mlp,embed",
                   help="cnn, mlp: examples/fashion_mnist/train.py's; embed: a 6.4 M-parameter EmbeddingBag text "
                        "classifier (communication-bound)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="ddp: where the model and data live")
    p.add_argument("--python", default="", help="the ranks' interpreter (default: Debian's python3; with "
                                                "--device cuda, .venv/torch2/bin/python)")
    p.add_argument("--steps", type=int, default=24, help="timed steps per mode")
    p.add_argument("--block", type=int, default=4, help="steps per block; sync and no_sync blocks alternate")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--min", default="4K", type=parse_size)
    p.add_argument("--max", default="64M", type=parse_size)
    p.add_argument("--json", default="")
    p.add_argument("--hosts", default="", help="NS=ADDR,... one rank per network namespace (bench/torch_hosts.sh)")
    p.add_argument("--link", default="", help="what the hosts' links are, for the report (bench/torch_hosts.sh)")
    # The rank side, started by the driver through ddlrun.
    p.add_argument("--worker", choices=["ddp", "allreduce"])
    p.add_argument("--backend", default="ddl")
    p.add_argument("--out", default="")
    p.add_argument("--sizes", nargs="*", type=int, default=[])
    args = p.parse_args()
    if args.worker:
        args.what = args.worker
        return worker(args)
    if not args.what:
        p.error("say what to measure: ddp or allreduce (or report FILE)")
    if args.what == "report":
        if not args.file:
            p.error("report needs the --json file of an allreduce run")
        with open(args.file) as f:
            saved = json.load(f)
        if saved.get("what") != "allreduce":
            sys.exit("%s is not the result of an allreduce run" % args.file)
        return print_allreduce(saved)
    if args.ranks is None:
        args.ranks = "1,2,3,4" if args.what == "ddp" else "2,4"
    if not args.python:
        args.python = VENV_PYTHON if args.device == "cuda" else PYTHON
    if args.device == "cuda":
        r = subprocess.run([args.python, "-c", "import torch; print(torch.cuda.device_count())"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        if r.returncode != 0 or int(r.stdout.strip() or 0) == 0:
            sys.exit("--device cuda: the torch of %s sees no CUDA GPU" % args.python)
    for f in (DDLRUN, DDL_BENCH, args.python, os.path.join(torch_build_dir(args.python), "torch_ddl", "__init__.py")):
        if not os.path.exists(f):
            sys.exit("%s is missing: build first (./scripts/build)" % f)
    t0 = time.time()
    result = run_ddp(args) if args.what == "ddp" else run_allreduce(args)
    result["seconds"] = time.time() - t0
    result["machine"] = {"cpus": os.cpu_count(), "uname": " ".join(os.uname())}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print("\n(%.0f s)" % result["seconds"])


if __name__ == "__main__":
    main()
