#!/usr/bin/env python3
"""preempt-bench: the example's training preempted again and again by a higher QoS (issue 41, item 4).

A benchmark that prints figures (and JSON with --json), not a test. On loopback ports chosen at run time it
starts an --insecure ddl-coordinator and one ddl-agent with 2 virtual GPUs, makes a QoS `urgent` that may
preempt `normal`, gives normal a grace of --grace seconds, and then:

  1. trains examples/fashion_mnist/train.py on 2 ranks (QoS normal) once, uninterrupted: the reference;
  2. trains it again from scratch, and --preemptions times, once the job has run --steps more steps since it
     last started, submits a 2-GPU urgent job (`sleep 1`), which preempts it: the ranks get SIGTERM and the
     deadline, agree on a step (torch_ddl.StopSignal), checkpoint and exit; the job goes back to the queue,
     the urgent job runs, and the training job starts again and resumes at the next step.

It reports, against the goals:
  - steps lost or repeated: the step log of run 2 (attempt, epoch, step, loss) against run 1's: every step once,
    in order, with the same loss (goal: 0 and 0);
  - the final test accuracy of both runs (goal: equal) and their weights' checksum;
  - GPUs free after the decision: from the coordinator's preemption line to the urgent job's placement, the
    median and the largest (goal: within grace + 2 s);
  - the restarts the job used (goal: 0: a preemption is not a restart) and its attempts ended PREEMPTED.

  bench/preempt_bench.py [--preemptions 20] [--steps 3] [--grace 20] [--train-samples 8192]
                         [--bin build/bin] [--json FILE]
"""
import argparse
import datetime
import json
import os
import re
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from local_cluster import LocalCluster  # noqa: E402


def log_ms(line):
    """The unix ms of a coordinator log line ("[2026-12-06 19:54:53.652] ..."), its clock being local time."""
    m = re.match(r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})\]", line)
    if not m:
        return None
    return datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp() * 1000


def read_steps(path):
    steps = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 4:
                    steps.append((int(parts[0]), int(parts[1]), int(parts[2]), parts[3]))
    return steps


def train(cluster, args, job_dir, name):
    os.makedirs(job_dir, exist_ok=True)
    cmd = ["/usr/bin/python3", os.path.join(ROOT, "examples/fashion_mnist/train.py"), "--epochs", "2",
           "--train-samples", str(args.train_samples), "--test-samples", "1000",
           "--checkpoint-dir", os.path.join(job_dir, "checkpoints"), "--json", os.path.join(job_dir, "result.json"),
           "--step-log", os.path.join(job_dir, "steps.log")]
    return cluster.ctl("submit", "--name", name, "--gpus", "2", "--workdir", job_dir, "--env",
                       "PYTHONPATH=" + os.path.join(args.bin, "..", "python"), "--env", "OMP_NUM_THREADS=1",
                       "--", *cmd).stdout.strip()


def wait_for(what, predicate, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise SystemExit("preempt-bench: timed out after %d s waiting for %s" % (timeout_s, what))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preemptions", type=int, default=20)
    p.add_argument("--steps", type=int, default=3, help="steps the job runs between preemptions")
    p.add_argument("--grace", type=int, default=20, help="normal's grace, seconds")
    p.add_argument("--train-samples", type=int, default=8192)
    p.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    p.add_argument("--json", default="")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    args = p.parse_args()
    args.bin = os.path.abspath(args.bin)
    work = tempfile.mkdtemp(prefix="preempt-bench-")
    os.chmod(work, 0o755)
    cluster = LocalCluster(args.bin, work, "preempt-bench", nodes=1, gpus=2)
    try:
        cluster.start()
        cluster.ctl("admin", "add-qos", "urgent", "--priority", "100", "--preempt", "normal", "--grace", "5",
                    "--accounts", "root")
        cluster.ctl("admin", "add-qos", "normal", "--update", "--grace", str(args.grace))

        t0 = time.monotonic()
        ref = train(cluster, args, os.path.join(work, "reference"), "reference")
        cluster.ctl("wait", "--wait-timeout", "1800", ref, check=False)
        reference_s = time.monotonic() - t0
        if cluster.status(ref)["state"] != "SUCCEEDED":
            raise SystemExit("preempt-bench: the reference run ended " + cluster.status(ref)["state"])
        print("reference run: %.1f s, %d steps" % (reference_s,
                                                   len(read_steps(os.path.join(work, "reference", "steps.log")))))

        job_dir = os.path.join(work, "preempted")
        job = train(cluster, args, job_dir, "preempted")
        steps_log = os.path.join(job_dir, "steps.log")
        free_s, urgent_jobs = [], []
        t0 = time.monotonic()
        for i in range(args.preemptions):
            # The job runs again and has done --steps more steps in this attempt.
            def ran_enough():
                st = cluster.status(job)
                if st["state"] in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"):
                    raise SystemExit("preempt-bench: the training ended %s after %d preemptions"
                                     % (st["state"], i))
                attempt = len(st.get("attempts", [])) + 1
                mine = [s for s in read_steps(steps_log) if s[0] == attempt]
                return st["state"] == "RUNNING" and len(mine) >= args.steps
            wait_for("the training to run %d steps" % args.steps, ran_enough, 600)
            urgent = cluster.ctl("submit", "--name", "urgent", "--qos", "urgent", "--gpus", "2", "--",
                                 "/bin/sleep", "1").stdout.strip()
            urgent_jobs.append(urgent)
            wait_for("the urgent job to end", lambda: cluster.status(urgent)["state"] == "SUCCEEDED", 300)
            with open(cluster.coordinator_log) as f:
                lines = f.readlines()
            decided = [log_ms(l) for l in lines if "preempted for job %s " % urgent in l and ": preempted" in l]
            placed = [log_ms(l) for l in lines if "job %s: PENDING -> SCHEDULED" % urgent in l]
            if decided and placed:
                free_s.append((placed[0] - decided[0]) / 1000)
                print("preemption %2d: GPUs free %.2f s after the decision" % (i + 1, free_s[-1]), flush=True)
        cluster.ctl("wait", "--wait-timeout", "1800", job, check=False)
        preempted_s = time.monotonic() - t0
        final = cluster.status(job)

        ref_steps = read_steps(os.path.join(work, "reference", "steps.log"))
        got = read_steps(steps_log)
        ref_keys = [(e, s) for _, e, s, _ in ref_steps]
        got_keys = [(e, s) for _, e, s, _ in got]
        repeated = len(got_keys) - len(set(got_keys))
        lost = len(set(ref_keys) - set(got_keys))
        same_losses = [(e, s, l) for _, e, s, l in ref_steps] == [(e, s, l) for _, e, s, l in got]
        with open(os.path.join(work, "reference", "result.json")) as f:
            ref_result = json.load(f)
        with open(os.path.join(job_dir, "result.json")) as f:
            got_result = json.load(f)
        ends = [a.get("end") for a in final.get("attempts", [])]
        out = {
            "preemptions": len(urgent_jobs),
            "grace_s": args.grace,
            "steps": len(ref_steps),
            "steps_lost": lost,
            "steps_repeated": repeated,
            "step_log_identical": same_losses,
            "reference_test_accuracy": ref_result["epochs"][-1]["test_accuracy"],
            "preempted_test_accuracy": got_result["epochs"][-1]["test_accuracy"],
            "final_state": final["state"],
            "restarts": int(final.get("restarts", 0)),
            "attempts_preempted": ends.count("PREEMPTED"),
            "gpus_free_s_median": statistics.median(free_s) if free_s else None,
            "gpus_free_s_max": max(free_s) if free_s else None,
            "reference_s": reference_s,
            "preempted_run_s": preempted_s,
        }
        print("steps: %d; lost %d, repeated %d; step log (epoch, step, loss) identical: %s"
              % (out["steps"], lost, repeated, same_losses))
        print("test accuracy: %.4f uninterrupted, %.4f with %d preemptions; job %s, restarts used %d, "
              "attempts PREEMPTED %d" % (out["reference_test_accuracy"], out["preempted_test_accuracy"],
                                        out["preemptions"], out["final_state"], out["restarts"],
                                        out["attempts_preempted"]))
        if free_s:
            print("GPUs free after the decision: median %.2f s, max %.2f s (goal: within grace %d s + 2 s)"
                  % (out["gpus_free_s_median"], out["gpus_free_s_max"], args.grace))
        print("wall: %.0f s uninterrupted, %.0f s preempted" % (reference_s, preempted_s))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        ok = lost == 0 and repeated == 0 and same_losses and final["state"] == "SUCCEEDED" and \
            out["reference_test_accuracy"] == out["preempted_test_accuracy"]
        return 0 if ok else 1
    finally:
        cluster.close(args.keep)


if __name__ == "__main__":
    sys.exit(main())
