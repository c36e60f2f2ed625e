#!/usr/bin/env python3
"""fairness-bench: accounts with shares 2:1 on a live cluster, each with more work than it holds (issue 41).

A benchmark that prints figures (and JSON with --json), not a test. On loopback ports chosen at run time it
starts an --insecure ddl-coordinator and two ddl-agents with 4 virtual GPUs each (8 GPUs), makes accounts `a`
(share 2) and `b` (share 1), gives them limits, and for --minutes keeps each account's queue at --backlog
pending jobs: short jobs (`sleep`, --min-s to --max-s seconds, each with a --time limit so backfill can work)
of mixed sizes (1 to 6 GPUs on any nodes, within the account's GPU limit). At --arrive seconds a third account `c` (share 1, equal to b's)
starts submitting too. Every job's placement and end come from the coordinator's own record (each attempt's
start_ms, end_ms and GPUs, as `ddlctl status` shows them), and from it the bench reports:

  - delivered GPU-seconds of a and b over the run, and their ratio against 2:1 (goal: within 5%); the same
    before and after c arrived;
  - how long c's first job waited for GPUs, against the longest job's run time (goal: within one job's run
    time; preemption to restore a share is not built, so there is no "at once" figure);
  - the most GPUs and running jobs each account held at any instant, from the same record, against its
    limits (goal: never over);
  - utilisation: GPU-seconds delivered over the GPU-seconds the cluster had.

  bench/fairness_bench.py [--minutes 10] [--arrive 300] [--backlog 6] [--seed 1] [--bin build/bin] [--json F]
"""
import argparse
import json
import os
import random
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from local_cluster import LocalCluster  # noqa: E402
SIZES = [1, 1, 2, 2, 3, 4, 6]  # GPUs per job, drawn uniformly
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT")


def field(message, name, default=0):
    """A field of the JSON API's messages, by its proto name or its lowerCamel one."""
    camel = name.split("_")[0] + "".join(w.title() for w in name.split("_")[1:])
    return message.get(name, message.get(camel, default))


def all_jobs(cluster):
    """Every job the coordinator keeps, as its JSON API lists them (oldest first)."""
    out, token = [], ""
    for _ in range(100):  # pages of 5,000: far more than a run submits
        page = cluster.get("/api/v1/jobs?page_size=5000&order=oldest" + ("&page_token=" + token if token else ""))
        out += page.get("jobs", [])
        token = field(page, "next_page_token", "")
        if not token:
            break
    return out


def intervals(jobs, now_ms):
    """(account, start_ms, end_ms, gpus) of every attempt that held GPUs: ended ones from the job's attempt
    record, the one running now until now_ms."""
    out = []
    for j in jobs:
        account = j["spec"].get("account", "root")
        for a in j.get("attempts", []):
            out.append((account, int(field(a, "start_ms")), int(field(a, "end_ms")), int(field(a, "gpus"))))
        if j["state"] not in FINAL and j["state"] != "PENDING" and int(field(j, "start_ms")) > 0:
            out.append((account, int(field(j, "start_ms")), now_ms, int(field(j, "gpus"))))
    return out


def delivered(ivs, account, lo, hi):
    """GPU-seconds `account` held within [lo, hi) (ms)."""
    return sum(g * max(0, min(e, hi) - max(s, lo)) for a, s, e, g in ivs if a == account) / 1000.0


def peaks(ivs):
    """Per account: the most GPUs and jobs it held at any instant (ends before starts at the same ms)."""
    events = []
    for a, s, e, g in ivs:
        events.append((s, 1, a, g))
        events.append((e, 0, a, g))
    held, most = {}, {}
    for _, kind, a, g in sorted(events):
        gpus, jobs = held.get(a, (0, 0))
        gpus, jobs = (gpus + g, jobs + 1) if kind == 1 else (gpus - g, jobs - 1)
        held[a] = (gpus, jobs)
        mg, mj = most.get(a, (0, 0))
        most[a] = (max(mg, gpus), max(mj, jobs))
    return most


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--arrive", type=float, default=300, help="seconds into the run when account c starts")
    p.add_argument("--backlog", type=int, default=6, help="pending jobs kept per account")
    p.add_argument("--min-s", type=float, default=4)
    p.add_argument("--max-s", type=float, default=16)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--json", default="")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    args.bin = os.path.abspath(args.bin)
    rng = random.Random(args.seed)
    limits = {"a": ("--running", 4), "b": ("--gpus", 4), "c": ("--gpus", 5)}
    work = tempfile.mkdtemp(prefix="fairness-bench-")
    os.chmod(work, 0o755)
    cluster = LocalCluster(args.bin, work, "fairness-bench", nodes=2, gpus=4)
    try:
        cluster.start()
        for name, share in (("a", 2), ("b", 1), ("c", 1)):
            cluster.ctl("admin", "add-account", name, "--share", str(share))
            flag, value = limits[name]
            cluster.ctl("admin", "set-limit", "--account", name, flag, str(value))
        submitted = {"a": 0, "b": 0, "c": 0}
        first_c = None  # unix ms of c's first submit
        t0 = time.time()
        end = t0 + args.minutes * 60
        while time.time() < end:
            pending = {"a": 0, "b": 0, "c": 0}
            for j in all_jobs(cluster):
                if j["state"] == "PENDING":
                    account = j["spec"].get("account", "root")
                    pending[account] = pending.get(account, 0) + 1
            active = ["a", "b"] + (["c"] if time.time() - t0 >= args.arrive else [])
            for account in active:
                for _ in range(args.backlog - pending[account]):
                    seconds = rng.uniform(args.min_s, args.max_s)
                    if account == "c" and first_c is None:
                        first_c = int(time.time() * 1000)
                    flag, value = limits[account]  # no job asks for more than its account's GPU limit
                    sizes = [g for g in SIZES if flag != "--gpus" or g <= value]
                    cluster.ctl("submit", "--account", account, "--gpus", str(rng.choice(sizes)), "--time",
                                "%ds" % int(args.max_s + 30), "--name", "%s-%d" % (account, submitted[account]),
                                "--", "/bin/sleep", "%.1f" % seconds)
                    submitted[account] += 1
            time.sleep(1)
        stop_ms = int(time.time() * 1000)
        jobs = all_jobs(cluster)
        ivs = intervals(jobs, stop_ms)
        t0_ms, arrive_ms = int(t0 * 1000), int(t0 * 1000 + args.arrive * 1000)

        def ratio(lo, hi):
            a, b = delivered(ivs, "a", lo, hi), delivered(ivs, "b", lo, hi)
            return a, b, (a / b if b else float("inf"))

        a_all, b_all, r_all = ratio(t0_ms, stop_ms)
        a_before, b_before, r_before = ratio(t0_ms, arrive_ms)
        a_after, b_after, r_after = ratio(arrive_ms, stop_ms)
        c_after = delivered(ivs, "c", arrive_ms, stop_ms)
        c_starts = sorted(s for a, s, _, _ in ivs if a == "c")
        c_wait_s = (c_starts[0] - first_c) / 1000.0 if c_starts and first_c else None
        total = sum(delivered(ivs, a, t0_ms, stop_ms) for a in ("a", "b", "c"))
        capacity = 8 * (stop_ms - t0_ms) / 1000.0
        most = peaks(ivs)
        over = []
        for account, (flag, value) in limits.items():
            gpus, running = most.get(account, (0, 0))
            held = gpus if flag == "--gpus" else running
            if held > value:
                over.append("%s held %d against %s %d" % (account, held, flag, value))
        failed = [j["id"] for j in jobs if j["state"] in ("FAILED", "TIMEOUT")]
        out = {
            "minutes": args.minutes,
            "jobs_submitted": submitted,
            "jobs_failed": len(failed),
            "gpu_seconds": {"a": a_all, "b": b_all, "c": c_after},
            "ratio_a_b": r_all,
            "ratio_error": abs(r_all / 2.0 - 1),
            "ratio_a_b_before_c": r_before,
            "ratio_a_b_after_c": r_after,
            "c_share_after_arrival": c_after / (a_after + b_after + c_after) if c_after else 0.0,
            "c_first_gpus_wait_s": c_wait_s,
            "longest_job_s": args.max_s,
            "peaks": {a: {"gpus": g, "running": r} for a, (g, r) in sorted(most.items())},
            "limits": {a: {f.lstrip("-"): v} for a, (f, v) in limits.items()},
            "limit_violations": over,
            "utilisation": total / capacity,
        }
        print("delivered GPU-seconds over %.0f min: a %.0f, b %.0f (a:b %.3f, %.1f%% from 2:1; goal within 5%%)"
              % (args.minutes, a_all, b_all, r_all, 100 * out["ratio_error"]))
        print("a:b before c arrived %.3f (%.0f / %.0f), after %.3f (%.0f / %.0f); c after arriving: %.0f "
              "(%.1f%% of what was delivered then)" % (r_before, a_before, b_before, r_after, a_after, b_after,
                                                        c_after, 100 * out["c_share_after_arrival"]))
        if c_wait_s is not None:
            print("c's first GPUs %.1f s after its first submit (goal: within one job's run time, <= %.0f s)"
                  % (c_wait_s, args.max_s))
        for account, (flag, value) in sorted(limits.items()):
            g, r = most.get(account, (0, 0))
            print("account %s: at most %d GPUs and %d running jobs at once (limit %s %d)" % (account, g, r, flag,
                                                                                           value))
        print("limits exceeded: %s" % ("; ".join(over) if over else "never"))
        print("utilisation %.1f%%; jobs submitted a %d, b %d, c %d; failed or timed out %d"
              % (100 * out["utilisation"], submitted["a"], submitted["b"], submitted["c"], len(failed)))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        ok = out["ratio_error"] <= 0.05 and not over and not failed and \
            (c_wait_s is not None and c_wait_s <= args.max_s)
        return 0 if ok else 1
    finally:
        cluster.close(args.keep)


if __name__ == "__main__":
    sys.exit(main())
