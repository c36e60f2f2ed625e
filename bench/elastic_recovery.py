#!/usr/bin/env python3
"""A lost rank, side by side: ddl's elastic training against torchrun's restart, on this machine.

Trains examples/fashion_mnist/train.py on N ranks (4 by default) three times and SIGKILLs rank N-1 once the
job has finished step K (200 by default) in two of them:

  ddl-elastic      backend ddl with --elastic: the survivors raise torch_ddl.RankLost, agree on the step, and
                   go on as N-1 ranks from the model in memory
  ddl-uninterrupted  the same without a kill: the accuracy the elastic run is compared with
  torchrun-gloo    python -m torch.distributed.run --max_restarts 1 (torch 2.x's, --torchrun-python), backend
                   gloo, --checkpoint-dir (the example's checkpoint of each epoch): torchrun restarts every
                   worker, which reload the last checkpoint and repeat the steps since

For each it prints the time from the kill to the next finished step (the step log's next line, polled every
2 ms), the steps finished before the kill that were done again, and the final test accuracy; JSON to --json.
The ranks of ddl's runs are started as torchrun would start them (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
by this script, which leaves the survivors running when one dies.

  bench/elastic_recovery.py                          # 4 ranks, kill after step 200, 2 epochs
  bench/elastic_recovery.py --epochs 1 --kill-at 100 --train-samples 30000
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(ROOT, "examples", "fashion_mnist", "train.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lines(path):
    try:
        with open(path) as f:
            return [ln.split() for ln in f.read().splitlines() if ln.strip()]
    except FileNotFoundError:
        return []


def watch(step_log, kill_at, kill, step_of, limit_s, running):
    """Polls step_log; once a line's step reaches kill_at, calls kill(); returns (seconds from the kill to the
    next line, that line), or (None, None) when the run ends (running() False) or the limit passes first."""
    killed_at, seen, end = None, 0, time.monotonic() + limit_s
    while time.monotonic() < end and running():
        got = lines(step_log)
        if killed_at is None and got and step_of(got[-1]) >= kill_at:
            kill()
            killed_at, seen = time.monotonic(), len(got)
        elif killed_at is not None and len(got) > seen:
            return time.monotonic() - killed_at, got[seen]
        time.sleep(0.002)
    return None, None


def final_accuracy(json_path):
    try:
        with open(json_path) as f:
            return json.load(f)["epochs"][-1]["test_accuracy"]
    except (OSError, ValueError, KeyError, IndexError):
        return None


def run_ddl(args, python, tmp, name, kill):
    step_log, out_json = os.path.join(tmp, name + ".steps"), os.path.join(tmp, name + ".json")
    port = free_port()
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(
            [python, TRAIN, "--elastic", "--epochs", str(args.epochs), "--train-samples", str(args.train_samples),
             "--step-log", step_log, "--json", out_json, "--timeout", str(args.timeout)],
            env=env, stdout=open(os.path.join(tmp, "%s.rank%d" % (name, r)), "w"), stderr=subprocess.STDOUT))
    seconds, line = None, None
    if kill:
        # "epoch step ranks loss": the job's step count is the second field.
        seconds, line = watch(step_log, args.kill_at, lambda: procs[-1].send_signal(signal.SIGKILL),
                              lambda ln: int(ln[1]), args.limit, lambda: procs[0].poll() is None)
    codes = [p.wait(timeout=args.limit) for p in procs]
    steps = [int(ln[1]) for ln in lines(step_log)]
    return {"system": name, "seconds_to_next_step": seconds, "next_step": line and int(line[1]),
            "ranks_after": line and int(line[2]), "steps_redone": len(steps) - len(set(steps)),
            "test_accuracy": final_accuracy(out_json), "exit_codes": codes}


def worker_pids(parent):
    """The workers torchrun started: the children of its process, with their RANK."""
    found = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % pid) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            found[int(env.get(b"RANK", b"-1"))] = int(pid)
        except (OSError, ValueError, IndexError):
            continue
    return found


def run_torchrun(args, python, tmp):
    name = "torchrun-gloo"
    step_log, out_json = os.path.join(tmp, name + ".steps"), os.path.join(tmp, name + ".json")
    ckpt = os.path.join(tmp, "checkpoints")
    os.makedirs(ckpt, exist_ok=True)
    agent = subprocess.Popen(
        [python, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks), "--max_restarts", "1",
         "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:%d" % free_port(), TRAIN, "--backend", "gloo",
         "--epochs", str(args.epochs), "--train-samples", str(args.train_samples), "--checkpoint-dir", ckpt,
         "--step-log", step_log, "--json", out_json, "--timeout", str(args.timeout)],
        env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=open(os.path.join(tmp, name + ".out"), "w"),
        stderr=subprocess.STDOUT)

    def kill():
        pid = worker_pids(agent.pid).get(args.ranks - 1)
        if pid:
            os.kill(pid, signal.SIGKILL)
    # "attempt epoch step loss": the step within its epoch; the job's step is counted from the lines.
    per_epoch = {}

    def job_step(ln):
        per_epoch[int(ln[1])] = max(per_epoch.get(int(ln[1]), 0), int(ln[2]))
        return sum(per_epoch.values())
    seconds, line = watch(step_log, args.kill_at, kill, job_step, args.limit, lambda: agent.poll() is None)
    code = agent.wait(timeout=args.limit)
    seen = [(int(ln[1]), int(ln[2])) for ln in lines(step_log)]
    return {"system": name, "seconds_to_next_step": seconds, "next_step": line and "epoch %s step %s" % (line[1], line[2]),
            "steps_redone": len(seen) - len(set(seen)), "test_accuracy": final_accuracy(out_json),
            "exit_codes": [code]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--kill-at", type=int, default=200, help="SIGKILL rank N-1 once this many steps are done")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--train-samples", type=int, default=0, help="0: all 60000")
    p.add_argument("--python", default="/usr/bin/python3", help="the interpreter with torch and torch_ddl")
    p.add_argument("--torchrun-python", default=os.path.join(ROOT, ".venv", "torch2", "bin", "python"),
                   help="the interpreter whose torchrun runs the gloo side (Debian's torch 1.13 torchrun fails "
                        "under its Python 3.11 before starting a worker)")
    p.add_argument("--limit", type=float, default=900, help="seconds a run may take")
    p.add_argument("--json", default="", help="write the results there")
    p.add_argument("--timeout", type=int, default=120, help="the process groups' timeout, seconds")
    p.add_argument("--systems", default="ddl-elastic,ddl-uninterrupted,torchrun-gloo",
                   help="which of the three runs to make")
    p.add_argument("--pythonpath", default=os.path.join(ROOT, "build", "python"),
                   help="where torch_ddl is (prepended to PYTHONPATH)")
    args = p.parse_args()
    os.environ["PYTHONPATH"] = args.pythonpath + os.pathsep + os.environ.get("PYTHONPATH", "")
    tmp = tempfile.mkdtemp(prefix="ddl-elastic-bench-")
    runs = {"ddl-elastic": lambda: run_ddl(args, args.python, tmp, "ddl-elastic", kill=True),
            "ddl-uninterrupted": lambda: run_ddl(args, args.python, tmp, "ddl-uninterrupted", kill=False),
            "torchrun-gloo": lambda: run_torchrun(args, args.torchrun_python, tmp)}
    results = [runs[name]() for name in args.systems.split(",")]
    print("%d ranks, rank %d SIGKILLed after step %d, %d epochs (outputs in %s)" %
          (args.ranks, args.ranks - 1, args.kill_at, args.epochs, tmp))
    print("%-18s %22s %14s %14s" % ("system", "kill -> next step (s)", "steps redone", "test accuracy"))
    for r in results:
        s = r["seconds_to_next_step"]
        a = r["test_accuracy"]
        print("%-18s %22s %14d %14s" % (r["system"], "-" if s is None else "%.3f" % s, r["steps_redone"],
                                         "-" if a is None else "%.2f%%" % (100 * a)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "kill_at": args.kill_at, "epochs": args.epochs, "results": results},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
