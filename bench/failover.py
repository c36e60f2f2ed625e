#!/usr/bin/env python3
"""failover: several coordinators on etcd, the leader killed (SIGKILL) again and again under load (issue 30).

A benchmark that prints figures (and JSON with --json), not a test. On loopback ports chosen at run time it
starts a 3-member etcd cluster, three ddl-coordinators sharing it over mutual TLS toward ddlctl and the agents
(plaintext to etcd, which is loopback, with --etcd-insecure), and two ddl-agents with virtual GPUs that are given
all three coordinator addresses. One thread submits jobs through ddlctl without pause (each rank records its own
start, and a second start of the same attempt's rank); the main thread kills the leader every --interval seconds,
--kills times, and measures the failover: from the kill to the first submit acknowledged by the new leader (a
probe that submits every 50 ms). The killed coordinator is started again at once, as a standby.

Then, with the cluster left alone, every acknowledged job must end, and the run reports:
  - failover time (median, max) over the kills;
  - acknowledged jobs lost (unknown to the coordinator afterwards) and jobs whose rank started twice in one
    attempt (0 and 0 are the goals);
  - ddlctl submit round trips (a process start, TLS and the RPC; not the coordinator's acknowledgement alone:
    load-bench --attach measures that).

With --waiters, a long job is also followed the whole run by `ddlctl submit --wait`, `ddlctl wait` and
`ddlctl logs -f`, and the run reports for each leader change how long after a fresh call's success each of them
said `answers again` (the goal: within 5 s), and whether each ended with the job's result. --signal term stops
the leader cleanly (SIGTERM: it resigns, and cuts the calls in flight) instead of killing it; both alternates.

  bench/failover.py [--kills 20] [--interval 6] [--lease 3] [--rate 5] [--signal kill|term|both] [--waiters]
                    [--bin build/bin] [--json FILE]
"""
import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import statistics
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
        self.args, self.work = args, work
        self.bin = args.bin
        self.procs = []
        self.etcd = []
        self.coordinators = [None, None, None]
        self.listens = ["127.0.0.1:%d" % free_port() for _ in range(3)]
        self.agents = []
        self.marker = "failover-rank-%d" % os.getpid()

    def spawn(self, argv, log):
        p = subprocess.Popen(argv, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(p)
        return p

    def run(self, argv):
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start_etcd(self):
        members = [("m%d" % i, free_port(), free_port()) for i in range(3)]
        cluster = ",".join("%s=http://127.0.0.1:%d" % (n, peer) for n, _, peer in members)
        for name, client, peer in members:
            self.etcd.append(self.spawn(
                [self.args.etcd, "--name", name, "--data-dir", os.path.join(self.work, name),
                 "--listen-client-urls", "http://127.0.0.1:%d" % client,
                 "--advertise-client-urls", "http://127.0.0.1:%d" % client,
                 "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
                 "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
                 "--initial-cluster", cluster, "--initial-cluster-state", "new",
                 "--logger", "zap", "--log-outputs", os.path.join(self.work, name + ".log")],
                os.path.join(self.work, name + ".out")))
        self.store = "etcd://" + ",".join("127.0.0.1:%d" % c for _, c, _ in members) + "/bench/"

    def start_coordinator(self, i):
        data = os.path.join(self.work, "c%d" % i)
        try:
            os.remove(os.path.join(data, "coordinator.addr"))
        except FileNotFoundError:
            pass
        argv = [os.path.join(self.bin, "ddl-coordinator"), "--listen", self.listens[i], "--http", "127.0.0.1:0",
                "--data-dir", data, "--pki-dir", self.pki, "--store", self.store, "--etcd-insecure",
                "--leader-lease", str(self.args.lease), "--heartbeat-grace", "10"]
        if os.geteuid() == 0:
            argv.append("--allow-root-jobs")
        self.coordinators[i] = self.spawn(argv, os.path.join(self.work, "c%d.log" % i))

    def leader(self):
        """The index of the live coordinator with the newest address file, or None."""
        best = None
        for i, p in enumerate(self.coordinators):
            addr = os.path.join(self.work, "c%d" % i, "coordinator.addr")
            if p is None or p.poll() is not None or not os.path.exists(addr):
                continue
            if best is None or os.path.getmtime(addr) > best[1]:
                best = (i, os.path.getmtime(addr))
        return None if best is None else best[0]

    def ctl(self, *words, timeout=10):
        argv = [os.path.join(self.bin, "ddlctl"), "--coordinator", ",".join(self.listens), "--ca",
                os.path.join(self.pki, "ca.crt"), "--token-file", self.token_file, "--timeout", "3"] + list(words)
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)

    def start(self):
        self.pki = os.path.join(self.work, "pki")
        self.run([os.path.join(self.bin, "ddl-coordinator"), "init-pki", self.pki])
        for n in ("n1", "n2"):
            self.run([os.path.join(self.bin, "ddl-coordinator"), "--pki-dir", self.pki, "issue-node", n, "--out",
                      os.path.join(self.work, n + "-pki")])
        self.start_etcd()
        for i in range(3):
            self.start_coordinator(i)
        deadline = time.time() + 60
        while self.leader() is None:
            if time.time() > deadline:
                sys.exit("failover: no coordinator leads after 60 s (see %s/c*.log)" % self.work)
            time.sleep(0.1)
        # The ranks run as the user running this bench: a token of that name.
        self.token_file = os.path.join(self.pki, "admin.token")
        user = pwd.getpwuid(os.geteuid()).pw_name
        out = self.ctl("-o", "json", "admin", "add-user", user)
        if out.returncode != 0:
            sys.exit("failover: add-user %s: %s" % (user, out.stderr))
        token = json.loads(out.stdout)["token"]
        self.token_file = os.path.join(self.work, "user.token")
        with open(self.token_file, "w") as f:
            f.write(token + "\n")
        for k, n in enumerate(("n1", "n2")):
            ports = "%d-%d" % (32000 + 200 * k, 32199 + 200 * k)
            self.agents.append(self.spawn(
                [os.path.join(self.bin, "ddl-agent"), "--coordinator", ",".join(self.listens), "--node", n,
                 "--address", "127.0.0.1", "--virtual-gpus", "4", "--force-virtual", "--data-dir",
                 os.path.join(self.work, n), "--port-range", ports, "--pki-dir",
                 os.path.join(self.work, n + "-pki")],
                os.path.join(self.work, "agent-%s.log" % n)))
        deadline = time.time() + 60
        while True:
            out = self.ctl("-o", "json", "nodes")
            if out.returncode == 0 and sum(1 for n in json.loads(out.stdout).get("nodes", [])
                                           if n.get("state") == "UP") == 2:
                break
            if time.time() > deadline:
                sys.exit("failover: the agents did not register in 60 s (see %s/agent-*.log)" % self.work)
            time.sleep(0.2)

    def rank_script(self, sleep_s):
        runs = os.path.join(self.work, "runs")
        return ("d=%s/$DDL_JOB_ID; mkdir -p $d; f=$d/a${DDL_JOB_ATTEMPT}-r${DDL_RANK}; "
                "[ -e $f.start ] && echo $$ >> $f.dup; echo $$ > $f.start; sleep %.2f" % (runs, sleep_s))

    def submit(self, sleep_s=0.5):
        """A job's id when the submit was acknowledged, else None; and the round trip in seconds."""
        t = time.monotonic()
        try:
            out = self.ctl("submit", "--nodes", "1", "--", "/bin/sh", "-c", self.rank_script(sleep_s), self.marker,
                           timeout=15)
        except (subprocess.TimeoutExpired, OSError):  # OSError: ddlctl being rebuilt, say
            return None, time.monotonic() - t
        dt = time.monotonic() - t
        return (out.stdout.strip() or None) if out.returncode == 0 else None, dt

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.procs:
            p.wait()
        subprocess.run(["pkill", "-KILL", "-f", self.marker])


class Waiter:
    """A ddlctl that waits (submit --wait, wait, logs -f), its stderr lines timestamped as they come."""

    def __init__(self, name, argv):
        self.name = name
        self.lines = []  # (monotonic time, line)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.first_out = threading.Event()
        self.out = []
        threading.Thread(target=self._read, args=(self.proc.stderr, self.lines), daemon=True).start()
        threading.Thread(target=self._read_out, daemon=True).start()

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append((time.monotonic(), line.rstrip("\n")))

    def _read_out(self):
        for line in self.proc.stdout:
            self.out.append(line.rstrip("\n"))
            self.first_out.set()

    def back_after(self, t_kill, t_fresh):
        """Seconds from t_fresh (a fresh call's success after the kill at t_kill) to this waiter's next
        `answers again`; None when it never lost the coordinator after t_kill."""
        for t, line in self.lines:
            if t >= t_kill and "answers again" in line:
                return t - t_fresh
        return None


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--interval", type=float, default=6.0, help="seconds between kills")
    ap.add_argument("--lease", type=int, default=3, help="the leaders' etcd lease (seconds)")
    ap.add_argument("--rate", type=float, default=5.0, help="jobs submitted per second by the background thread")
    ap.add_argument("--signal", choices=("kill", "term", "both"), default="kill",
                    help="how the leader is stopped: SIGKILL, SIGTERM, or the two in turn")
    ap.add_argument("--waiters", action="store_true",
                    help="follow a long job with submit --wait, wait and logs -f through the kills")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--etcd", default=os.path.join(ROOT, ".cache", "etcd", "usr", "bin", "etcd"))
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()
    if not os.access(args.etcd, os.X_OK):
        sys.exit("failover: no etcd at %s (scripts/bootstrap unpacks one)" % args.etcd)
    work = tempfile.mkdtemp(prefix="ddl-failover-")
    cluster = Cluster(args, work)
    acked, round_trips, stop = [], [], threading.Event()
    failovers = []
    kills_at, fresh_at, signals = [], [], []
    waiters = []
    try:
        cluster.start()
        if args.waiters:
            base = [os.path.join(args.bin, "ddlctl"), "--coordinator", ",".join(cluster.listens), "--ca",
                    os.path.join(cluster.pki, "ca.crt"), "--token-file", cluster.token_file, "--timeout", "3"]
            length = int(args.kills * args.interval + 30)
            waiters.append(Waiter("submit --wait", base + ["submit", "--wait", "--nodes", "1", "--gpus-per-node",
                                                          "1", "--", "/bin/sh", "-c",
                                                          "for i in $(seq %d); do echo tick $i; sleep 1; done"
                                                          % length, cluster.marker]))
            if not waiters[0].first_out.wait(30):
                sys.exit("failover: submit --wait printed no job id in 30 s")
            job = waiters[0].out[0]
            waiters.append(Waiter("wait", base + ["wait", job]))
            waiters.append(Waiter("logs -f", base + ["logs", "-f", job]))

        def submitter():
            while not stop.is_set():
                job, dt = cluster.submit(0.3 + (len(acked) % 5) * 0.3)
                if job:
                    acked.append(job)
                    round_trips.append(dt)
                # About --rate jobs a second: more would only queue (8 GPUs, jobs of 0.3-1.5 s).
                time.sleep(max(0.0, 1.0 / args.rate - dt))

        thread = threading.Thread(target=submitter)
        thread.start()
        for k in range(args.kills):
            time.sleep(args.interval)
            victim = cluster.leader()
            if victim is None:
                print("kill %d: no leader to kill" % k, flush=True)
                continue
            sig = signal.SIGKILL if args.signal == "kill" or (args.signal == "both" and k % 2 == 0) \
                else signal.SIGTERM
            t0 = time.monotonic()
            os.killpg(cluster.coordinators[victim].pid, sig)
            kills_at.append(t0)
            signals.append(signal.Signals(sig).name)
            cluster.coordinators[victim].wait()
            cluster.start_coordinator(victim)  # back as a standby
            while True:
                job, _ = cluster.submit(0.1)
                if job:
                    acked.append(job)
                    break
                if time.monotonic() - t0 > 60:
                    break
                time.sleep(0.05)
            failovers.append(time.monotonic() - t0)
            fresh_at.append(time.monotonic())
            print("kill %d (%s): coordinator %d; a submit was acknowledged %.2f s later (leader now %s)"
                  % (k + 1, signals[-1], victim, failovers[-1], cluster.leader()), flush=True)
        stop.set()
        thread.join()

        # Every acknowledged job must end; then count what was lost or started twice.
        final = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"}
        deadline = time.time() + 180
        states, reasons = {}, {}
        while time.time() < deadline:
            out = cluster.ctl("-o", "json", "list", "--all", "--page-size", "5000", timeout=30)
            if out.returncode == 0:
                listed = json.loads(out.stdout).get("jobs", [])
                states = {j["id"]: j["state"] for j in listed}
                reasons = {j["id"]: j.get("reason", "") for j in listed}
                if all(states.get(j) in final for j in acked):
                    break
            time.sleep(1)
        lost = [j for j in acked if j not in states]
        unended = [j for j in acked if j in states and states[j] not in final]
        dups = []
        runs = os.path.join(work, "runs")
        for job in os.listdir(runs) if os.path.isdir(runs) else []:
            dups += [job + "/" + f for f in os.listdir(os.path.join(runs, job)) if f.endswith(".dup")]
        result = {
            "kills": len(failovers),
            "lease_s": args.lease,
            "failover_s": {"median": statistics.median(failovers) if failovers else None,
                           "max": max(failovers) if failovers else None, "all": [round(f, 3) for f in failovers]},
            "acknowledged_jobs": len(acked),
            "lost": len(lost),
            "not_ended": len(unended),
            "started_twice": len(dups),
            "succeeded": sum(1 for j in acked if states.get(j) == "SUCCEEDED"),
            # Every rank sleeps and exits 0: any other end is a job the failovers hurt.
            "not_succeeded": {j: "%s: %s" % (states[j], reasons.get(j, "")) for j in acked
                              if j in states and states[j] != "SUCCEEDED"},
            "ddlctl_submit_round_trip_ms": {"median": 1000 * statistics.median(round_trips) if round_trips else None,
                                            "p99": 1000 * percentile(round_trips, 0.99) if round_trips else None},
        }
        if waiters:
            for w in waiters:
                try:
                    w.proc.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    w.proc.kill()
                    w.proc.wait()
            per = {}
            for w in waiters:
                backs = [w.back_after(t_kill, t_fresh) for t_kill, t_fresh in zip(kills_at, fresh_at)]
                seen = [b for b in backs if b is not None]
                per[w.name] = {"exit": w.proc.returncode,
                               "outages_ridden_out": sum(1 for _, l in w.lines if "lost the coordinator" in l),
                               "back_after_fresh_call_s": {"max": round(max(seen), 2) if seen else None,
                                                           "median": round(statistics.median(seen), 2)
                                                           if seen else None,
                                                           "all": [None if b is None else round(b, 2)
                                                                   for b in backs]}}
            result["signals"] = signals
            result["waiters"] = per
        print(json.dumps(result, indent=2))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
        if lost or dups or unended or result["not_succeeded"]:
            print("failover: lost %s, not ended %s, started twice %s, not succeeded %s (work dir %s kept)"
                  % (lost[:10], unended[:10], dups[:10], list(result["not_succeeded"])[:10], work))
            args.keep = True
    finally:
        stop.set()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print("work directory: " + work)


if __name__ == "__main__":
    main()
