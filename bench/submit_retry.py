#!/usr/bin/env python3
"""submit_retry: submits retried through coordinator kills, clean stops and a full disk make each job once (issue 39).

A benchmark that prints figures (and JSON with --json), not a test. On loopback ports chosen at run time it starts
one ddl-coordinator on SQLite over mutual TLS, its data directory on a small tmpfs of its own (so the bench can fill
that disk), and one ddl-agent with virtual GPUs. --submits scripts each submit one job with a request id of their
own, the way a CI script would: `until ddlctl submit --request-id ID ...; do sleep 0.5; done` (bounded), a few at
a time. Meanwhile a chaos thread, every --interval seconds, in turn: kills the coordinator (SIGKILL) and starts it
again, stops it cleanly (SIGTERM) and starts it again, and fills its disk for a few seconds, then frees it.

Each rank records its start under the work directory by job id. At the end, with the chaos stopped, every job ends
and the run reports, per request id, how many jobs ran (the goal: exactly 1 for every id, never 2), and what the
submits met: how many tries, how many refusals for the full disk, how many outages ddlctl rode out itself.

Needs root (to mount the tmpfs).

  bench/submit_retry.py [--submits 100] [--parallel 4] [--pace 1] [--interval 2] [--bin build/bin]
                       [--json FILE] [--keep]
"""
import argparse
import collections
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self, args, work):
        self.args, self.work, self.bin = args, work, args.bin
        self.data = os.path.join(work, "disk")  # the coordinator's data dir: a tmpfs of its own
        self.listen = "127.0.0.1:%d" % free_port()
        self.coordinator = None
        self.procs = []
        self.lock = threading.Lock()

    def spawn(self, argv, log):
        p = subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def start_coordinator(self):
        try:
            os.remove(os.path.join(self.data, "coordinator.addr"))
        except FileNotFoundError:
            pass
        self.coordinator = self.spawn(
            [os.path.join(self.bin, "ddl-coordinator"), "--listen", self.listen, "--http", "127.0.0.1:0",
             "--data-dir", self.data, "--pki-dir", self.pki, "--allow-root-jobs", "--heartbeat-grace", "10"],
            os.path.join(self.work, "coordinator.log"))
        deadline = time.time() + 30
        while not os.path.exists(os.path.join(self.data, "coordinator.addr")):
            if time.time() > deadline or self.coordinator.poll() is not None:
                sys.exit("submit_retry: the coordinator did not start (see %s/coordinator.log)" % self.work)
            time.sleep(0.05)

    def ctl(self, *words, timeout=60):
        argv = [os.path.join(self.bin, "ddlctl"), "--coordinator", self.listen, "--ca",
                os.path.join(self.pki, "ca.crt"), "--token-file", os.path.join(self.pki, "admin.token"),
                "--timeout", "5"] + list(words)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def start(self):
        os.makedirs(self.data)
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dm" % self.args.disk_mb, "ddl-bench",
                           self.data]).returncode != 0:
            sys.exit("submit_retry: cannot mount a tmpfs on %s (run as root)" % self.data)
        self.pki = os.path.join(self.work, "pki")
        subprocess.run([os.path.join(self.bin, "ddl-coordinator"), "init-pki", self.pki, "--admin", "root"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run([os.path.join(self.bin, "ddl-coordinator"), "--pki-dir", self.pki, "issue-node", "n1",
                        "--out", os.path.join(self.work, "n1-pki")], check=True, stdout=subprocess.DEVNULL)
        self.start_coordinator()
        self.spawn([os.path.join(self.bin, "ddl-agent"), "--coordinator", self.listen, "--node", "n1",
                    "--address", "127.0.0.1", "--virtual-gpus", "4", "--force-virtual", "--data-dir",
                    os.path.join(self.work, "n1"), "--pki-dir", os.path.join(self.work, "n1-pki"),
                    "--stop-ranks-on-exit"], os.path.join(self.work, "agent.log"))
        deadline = time.time() + 30
        while " UP" not in self.ctl("nodes").stdout:
            if time.time() > deadline:
                sys.exit("submit_retry: the agent did not register (see %s/agent.log)" % self.work)
            time.sleep(0.2)

    def fill(self):
        """Fills the coordinator's disk; returns the filler's path."""
        path = os.path.join(self.data, "filler")
        subprocess.run(["dd", "if=/dev/zero", "of=" + path, "bs=1M"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        return path

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            p.wait()
        subprocess.run(["umount", "-l", self.data], stderr=subprocess.DEVNULL)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--submits", type=int, default=100)
    ap.add_argument("--parallel", type=int, default=4, help="submitting scripts at once")
    ap.add_argument("--interval", type=float, default=2.0, help="seconds between chaos events")
    ap.add_argument("--pace", type=float, default=1.0,
                    help="seconds each script waits between its submits, so that they meet the chaos")
    ap.add_argument("--disk-mb", type=int, default=48, help="the coordinator's tmpfs")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("submit_retry: needs root (a tmpfs for the coordinator's disk)")
    work = tempfile.mkdtemp(prefix="ddl-submit-retry-")
    cluster = Cluster(args, work)
    runs = os.path.join(work, "runs")
    os.makedirs(runs)
    tries = collections.Counter()
    refused_full, rode_out, gave_up = collections.Counter(), collections.Counter(), []
    events = collections.Counter()
    done = threading.Event()
    try:
        cluster.start()
        script = "mkdir -p %s/$DDL_JOB_ID && echo $$ >> %s/$DDL_JOB_ID/started; sleep 0.2" % (runs, runs)

        def submit_one(k):
            rid = "bench-%d-%d" % (os.getpid(), k)
            for attempt in range(240):  # `until ddlctl submit ...; do sleep 0.5; done`, bounded
                tries[rid] += 1
                out = cluster.ctl("submit", "--request-id", rid, "--reconnect-timeout", "20", "--gpus", "1",
                                  "--", "/bin/sh", "-c", script)
                if "lost the coordinator" in out.stderr:
                    rode_out[rid] += 1
                if out.returncode == 0:
                    return
                if "cannot store" in out.stderr:
                    refused_full[rid] += 1
                time.sleep(0.5)
            gave_up.append(rid)

        def submitter(ks):
            for k in ks:
                submit_one(k)
                time.sleep(args.pace)

        threads = [threading.Thread(target=submitter, args=(range(i, args.submits, args.parallel),))
                   for i in range(args.parallel)]
        for t in threads:
            t.start()

        def chaos():
            k = 0
            while not done.wait(args.interval):
                kind = ("kill", "term", "full")[k % 3]
                k += 1
                events[kind] += 1
                if kind == "full":
                    filler = cluster.fill()
                    if done.wait(args.interval):
                        os.remove(filler)
                        break
                    os.remove(filler)
                    continue
                cluster.coordinator.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
                cluster.coordinator.wait()
                cluster.start_coordinator()

        chaos_thread = threading.Thread(target=chaos)
        chaos_thread.start()
        for t in threads:
            t.join()
        done.set()
        chaos_thread.join()

        # Every job ends; then each request id's jobs, and which of them ran.
        final = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"}
        jobs = []
        deadline = time.time() + 120
        while time.time() < deadline:
            out = cluster.ctl("-o", "json", "list", "--all", "--page-size", "5000")
            if out.returncode == 0:
                jobs = json.loads(out.stdout).get("jobs", [])
                if all(j["state"] in final for j in jobs):
                    break
            time.sleep(1)
        by_request = collections.defaultdict(list)
        for j in jobs:
            by_request[j["spec"].get("request_id", "")].append(j)
        ran = {rid: [j["id"] for j in js if os.path.exists(os.path.join(runs, j["id"], "started"))]
               for rid, js in by_request.items()}
        rids = ["bench-%d-%d" % (os.getpid(), k) for k in range(args.submits)]
        ran_twice = {rid: ids for rid, ids in ran.items() if len(ids) > 1}
        never_ran = [rid for rid in rids if not ran.get(rid) and rid not in gave_up]
        started_twice = [d for d in os.listdir(runs)
                         if len(open(os.path.join(runs, d, "started")).read().split()) > 1]
        result = {
            "submits": args.submits,
            "chaos_events": dict(events),
            "request_ids_that_ran_twice": len(ran_twice),
            "request_ids_that_never_ran": len(never_ran),
            "gave_up": len(gave_up),
            "jobs_whose_rank_started_twice": len(started_twice),
            "jobs_made": len(jobs),
            "jobs_withdrawn": sum(1 for j in jobs if "the submit was refused" in j.get("reason", "")),
            "tries": {"total": sum(tries.values()), "max_per_submit": max(tries.values()) if tries else 0},
            "refused_at_once_for_the_full_disk": sum(refused_full.values()),
            "outages_ridden_out_by_ddlctl": sum(rode_out.values()),
            "succeeded": sum(1 for j in jobs if j["state"] == "SUCCEEDED"),
        }
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        if ran_twice or never_ran or started_twice or gave_up:
            print("submit_retry: ran twice %s, never ran %s, started twice %s, gave up %s (work dir %s kept)"
                  % (list(ran_twice.items())[:5], never_ran[:5], started_twice[:5], gave_up[:5], work))
            args.keep = True
    finally:
        done.set()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("work directory: " + work)


if __name__ == "__main__":
    main()
