#!/usr/bin/env python3
"""Elastic jobs of ddl's coordinator, end to end on this machine: a lost rank, a lost node, and a chaos run.

Starts a local cluster (bench/local_cluster.py: an --insecure ddl-coordinator and --nodes ddl-agents with one
virtual GPU each), submits examples/fashion_mnist/train.py --elastic as `ddlctl submit --gpus MIN:MAX`
(MAX = the nodes), and follows the job's step log ("epoch step ranks loss", each line's time taken by polling
it every 2 ms):

  uninterrupted  no kill: the accuracy the others are compared with
  rank-kill      SIGKILL of rank 2's program once the job finished step --kill-at: the time from the kill to the
                 survivors' next step, and to the first step with all ranks again (the coordinator starts a
                 joiner on the freed GPU with DDL_JOIN=1; it joins at the next --grow-every point)
  node-kill      SIGKILL of node n3's agent and of its rank's processes once the job finished step --kill-at
                 (the node is gone), then the agent started again after --down-s: the time from the agent's
                 start to the first step with all ranks again
  chaos          --events random events, one after another, each once the job has all its ranks again: a
                 rank's program killed, or a node killed and brought back 1-3 s later (never rank 0's, which
                 serves the job's rendezvous store)

For each: the job's end state, the steps lost or done twice (none expected), the ranks the step log went through,
the membership changes in the job's transitions, processes of the job left running after its end (none
expected), and the final test accuracy. JSON to --json.

  bench/elastic_service.py                               # all four, 4 nodes
  bench/elastic_service.py --runs chaos --events 20 --epochs 6
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(ROOT, "examples", "fashion_mnist", "train.py")
sys.path.insert(0, HERE)
from local_cluster import LocalCluster  # noqa: E402


class StepLog:
    """Polls a step log every 2 ms from a thread: every line with the time it was first seen."""

    def __init__(self, path):
        self.path, self.lines, self.done = path, [], False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        seen = 0
        while not self.done:
            try:
                with open(self.path) as f:
                    got = [ln.split() for ln in f.read().splitlines() if ln.strip()]
            except FileNotFoundError:
                got = []
            now = time.monotonic()
            for ln in got[seen:]:
                self.lines.append((now, int(ln[1]), int(ln[2])))  # (seen at, step, ranks)
            seen = len(got)
            time.sleep(0.002)

    def step(self):
        return self.lines[-1][1] if self.lines else 0

    def first_after(self, t, ranks=None):
        """(time, step, ranks) of the first line seen after t (with that many ranks), or None."""
        for ln in self.lines:
            if ln[0] > t and (ranks is None or ln[2] == ranks):
                return ln
        return None

    def stop(self):
        self.done = True
        self.thread.join()


class Bench:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.cluster = LocalCluster(os.path.join(ROOT, args.build, "bin"), work, "elastic_service",
                                    nodes=args.nodes, gpus=1)
        self.agents = {}  # node -> its Popen, to kill and start again

    def start(self):
        self.cluster.start()
        for i, p in enumerate(self.cluster.procs[1:], start=1):
            self.agents["n%d" % i] = p

    def restart_agent(self, node):
        c = self.cluster
        c.spawn([os.path.join(c.bin, "ddl-agent"), "--insecure", "--coordinator", c.listen, "--node", node,
                 "--virtual-gpus", "1", "--data-dir", os.path.join(c.work, node), "--cgroup-root", "none"],
                node + ".log")
        self.agents[node] = c.procs[-1]

    def submit(self, name):
        a = self.args
        steps, out = os.path.join(self.work, name + ".steps"), os.path.join(self.work, name + ".json")
        env = []
        for kv in a.job_env:
            env += ["--env", kv]
        r = self.cluster.ctl(
            "submit", "--name", name, "--gpus", "%d:%d" % (a.min, a.nodes), "--env", "OMP_NUM_THREADS=1", *env,
            "--env", "PYTHONPATH=" + os.path.join(ROOT, a.build, "python"), "--", a.python, TRAIN, "--elastic",
            "--epochs", str(a.epochs), "--train-samples", str(a.train_samples), "--test-samples", str(a.test_samples),
            "--batch-size", str(a.batch_size),
            "--grow-every", str(a.grow_every), "--timeout", "60", "--step-log", steps, "--json", out)
        return r.stdout.strip().splitlines()[0], steps, out

    def rank(self, job, rank):
        for r in self.cluster.status(job).get("ranks", []):
            if r.get("rank", 0) == rank:
                return r
        return None

    def wait(self, cond, limit):
        end = time.monotonic() + limit
        while time.monotonic() < end:
            if cond():
                return True
            time.sleep(0.02)
        return False

    def kill_rank(self, job, rank):
        r = self.rank(job, rank)
        os.kill(int(r["program_pid"]), signal.SIGKILL)

    def kill_node(self, job, node):
        """The node gone: its agent and every process of the job's ranks there, killed at once."""
        self.agents[node].kill()
        self.agents[node].wait()
        for r in self.cluster.status(job).get("ranks", []):
            if r.get("node") == node and r.get("state") == "RUNNING" and int(r.get("pid", 0)) > 0:
                try:
                    os.killpg(int(r["pid"]), signal.SIGKILL)  # the rank's shim leads its process group
                except ProcessLookupError:
                    pass

    def node_of(self, job, rank):
        return self.rank(job, rank)["node"]

    def live_ranks(self, job):
        return [r for r in self.cluster.status(job).get("ranks", []) if r.get("state") == "RUNNING"]

    def run(self, name):
        a = self.args
        job, steps_path, out = self.submit(name)
        log = StepLog(steps_path)
        result = {"run": name, "job": job}
        try:
            if not self.wait(lambda: log.step() >= a.kill_at or self.ended(job), a.limit):
                raise SystemExit("%s: no step %d within %d s" % (name, a.kill_at, a.limit))
            if name == "rank-kill" and not self.ended(job):
                t = time.monotonic()
                self.kill_rank(job, 2)
                result.update(self.recovery(job, log, t))
            elif name == "node-kill" and not self.ended(job):
                node = self.node_of(job, 2)
                t = time.monotonic()
                self.kill_node(job, node)
                result.update(self.recovery(job, log, t, back=False))
                time.sleep(a.down_s)
                back = time.monotonic()
                self.restart_agent(node)
                # (a step with all ranks before the start: the node's loss was not noticed yet, or was in vain)
                whole = self.wait(lambda: log.first_after(back, a.nodes) is not None or self.ended(job), a.limit)
                whole = whole and log.first_after(back, a.nodes)
                result["s_agent_start_to_all_ranks"] = whole and round(whole[0] - back, 3)
            elif name == "chaos":
                result["events"] = self.chaos(job, log)
            self.wait(lambda: self.ended(job), a.limit)
        finally:
            log.stop()
        time.sleep(1)
        result.update(self.outcome(job, log, out))
        return result

    def recovery(self, job, log, t, back=True):
        """From the kill at t: to the survivors' first step (the first line with one rank fewer: steps that
        the kill did not reach may still finish with all ranks) and, with back, to the first step with all
        ranks again after that."""
        a = self.args
        self.wait(lambda: log.first_after(t, a.nodes - 1) is not None or self.ended(job), a.limit)
        nxt = log.first_after(t, a.nodes - 1)
        out = {"s_kill_to_survivors_step": nxt and round(nxt[0] - t, 3), "survivors_first_step": nxt and nxt[1]}
        if back and nxt:
            self.wait(lambda: log.first_after(nxt[0], a.nodes) is not None or self.ended(job), a.limit)
            whole = log.first_after(nxt[0], a.nodes)
            out["s_kill_to_all_ranks"] = whole and round(whole[0] - t, 3)
        return out

    def chaos(self, job, log):
        a = self.args
        rng, events = random.Random(a.seed), []
        t = time.monotonic()
        for i in range(a.events):
            # Each event once the job has gone on without the last one's rank (a step with fewer ranks) and
            # has all its ranks again.
            if i > 0 and not self.wait(lambda: log.first_after(t, a.nodes - 1) is not None or self.ended(job),
                                       a.limit):
                break
            fewer = log.first_after(t, a.nodes - 1)
            since = fewer[0] if fewer and i > 0 else t
            if not self.wait(lambda: (log.first_after(since, a.nodes) is not None and log.lines[-1][2] == a.nodes)
                             or self.ended(job), a.limit):
                break
            if self.ended(job):
                break
            ranks = [r for r in self.live_ranks(job) if r.get("rank", 0) != 0 and r["node"] != self.node_of(job, 0)]
            if not ranks:
                break
            victim = rng.choice(ranks)
            kind = "node" if rng.random() < 0.5 else "rank"
            at = log.step()
            t = time.monotonic()  # the event: from here the job must go on with fewer ranks, then grow back
            if kind == "rank":
                os.kill(int(victim["program_pid"]), signal.SIGKILL)
            else:
                self.kill_node(job, victim["node"])
                time.sleep(rng.uniform(1, 3))
                self.restart_agent(victim["node"])
            events.append({"kind": kind, "rank": victim.get("rank", 0), "node": victim["node"], "after_step": at})
            print("  event %d: %s kill of rank %d on %s after step %d" % (i + 1, kind, victim.get("rank", 0),
                                                                            victim["node"], at), flush=True)
        return events

    def ended(self, job):
        return self.cluster.status(job)["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT")

    def outcome(self, job, log, out):
        st = self.cluster.status(job)
        steps = [ln[1] for ln in log.lines]
        worlds = []
        for ln in log.lines:
            if not worlds or worlds[-1] != ln[2]:
                worlds.append(ln[2])
        changes = [t.get("reason", "") for t in st.get("transitions", [])
                   if t.get("from") == "RUNNING" and t.get("to") == "RUNNING"]
        left = subprocess.run(["pgrep", "-f", "--", "--step-log " + os.path.join(self.work, "")],
                              capture_output=True, text=True).stdout.split()
        acc = None
        try:
            with open(out) as f:
                acc = json.load(f)["epochs"][-1]["test_accuracy"]
        except (OSError, ValueError, KeyError, IndexError):
            pass
        return {"state": st["state"], "steps": len(steps),
                "steps_lost": (steps[-1] - len(set(steps))) if steps else 0,
                "steps_repeated": len(steps) - len(set(steps)), "ranks_over_time": worlds,
                "shrinks": sum("going on without" in c for c in changes),
                "grows": sum(c.startswith("grown") for c in changes),
                "processes_left": len(left), "test_accuracy": acc,
                "gpu_hours": sum(float(u.get("gpu_seconds", 0)) for u in st.get("attempts", [])) / 3600}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", default="uninterrupted,rank-kill,node-kill,chaos")
    p.add_argument("--nodes", type=int, default=4, help="agents with one virtual GPU each; the job's MAX")
    p.add_argument("--min", type=int, default=2, help="the job's MIN")
    p.add_argument("--epochs", type=int, default=2)
    # 300 steps an epoch at 4 ranks: the kill at step 200 falls inside one, not on the evaluation at its end.
    p.add_argument("--train-samples", type=int, default=38400)
    p.add_argument("--test-samples", type=int, default=2000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--grow-every", type=int, default=10)
    p.add_argument("--kill-at", type=int, default=200)
    p.add_argument("--down-s", type=float, default=3.0, help="node-kill: how long the node stays away")
    p.add_argument("--events", type=int, default=20, help="chaos: how many")
    p.add_argument("--seed", type=int, default=44)
    p.add_argument("--limit", type=float, default=600, help="seconds any one wait may take")
    # The nodes share this host: libddl joins their ranks in its shared-memory segment whatever UCX_TLS says (a
    # dead member is seen at once through its pidfd).
    p.add_argument("--job-env", action="append", default=None,
                   help="KEY=VALUE for the job's ranks, repeatable (default: UCX_TLS=tcp,self)")
    p.add_argument("--build", default="build")
    p.add_argument("--python", default="/usr/bin/python3")
    p.add_argument("--json", default="")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    if args.job_env is None:
        args.job_env = ["UCX_TLS=tcp,self"]
    results = []
    for name in args.runs.split(","):
        work = tempfile.mkdtemp(prefix="ddl-elastic-service-")
        bench = Bench(args, work)
        try:
            bench.start()
            print("== %s" % name, flush=True)
            r = bench.run(name)
        finally:
            bench.cluster.close(args.keep)
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "elastic_service", "args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
