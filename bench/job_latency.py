#!/usr/bin/env python3
"""job_latency: how long the cluster service itself takes around a job, on this machine.

Starts ddl-coordinator and two ddl-agents on 127.0.0.1 (2 virtual GPUs each) over mutual TLS, as a cluster runs
(a throwaway PKI; the jobs are root's when run as root, with --allow-root-jobs), submits --jobs jobs of
2 nodes x 2 GPUs one after another, each rank running `sh -c 'date +%s%3N'` (it prints the time it ends), and
reports, from the coordinator's own transition times:
  - submit -> all ranks started: the job's RUNNING transition minus its submit time (placement, the durable
    writes, the start command to both agents, fork/exec of 4 ranks, their start reports);
  - last rank exit -> SUCCEEDED: the SUCCEEDED transition minus the latest time a rank printed (the rank's
    exit, its reaping by the agent, the exit report, the durable write).
Prints median / p90 / max and writes them as JSON with --json. A tool that prints figures, not a test.
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile, time

BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bin")


CREDENTIALS = []  # --ca and --token-file, once the PKI exists


def ctl(addr, *args):
    out = subprocess.run([os.path.join(BIN, "ddlctl"), "--coordinator", addr, *CREDENTIALS, *args], check=True,
                         capture_output=True, text=True)
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ddl-job-latency-")
    procs = []
    try:
        coordinator = os.path.join(BIN, "ddl-coordinator")
        subprocess.run([coordinator, "init-pki", f"{tmp}/pki"], check=True, capture_output=True)
        for i in (1, 2):
            subprocess.run([coordinator, "--pki-dir", f"{tmp}/pki", "issue-node", f"n{i}", "--out", f"{tmp}/n{i}-pki"],
                           check=True, capture_output=True)
        procs.append(subprocess.Popen([coordinator, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
                                       "--data-dir", f"{tmp}/c", "--log-level", "warn", "--pki-dir", f"{tmp}/pki",
                                       "--allow-root-jobs"]))
        for _ in range(100):
            if os.path.exists(f"{tmp}/c/coordinator.addr"):
                break
            time.sleep(0.1)
        addr = open(f"{tmp}/c/coordinator.addr").read().strip()
        for i, ports in ((1, "32000-32099"), (2, "32100-32199")):
            procs.append(subprocess.Popen([os.path.join(BIN, "ddl-agent"), "--coordinator", addr, "--node", f"n{i}",
                                           "--address", "127.0.0.1", "--virtual-gpus", "2", "--force-virtual",
                                           "--data-dir", f"{tmp}/n{i}", "--port-range", ports, "--log-level", "warn",
                                           "--pki-dir", f"{tmp}/n{i}-pki"]))
        CREDENTIALS[:] = ["--ca", f"{tmp}/pki/ca.crt", "--token-file", f"{tmp}/pki/admin.token"]
        # The jobs' user: whoever runs this (an agent not run as root runs every rank as itself anyway).
        user = json.loads(ctl(addr, "admin", "add-user", os.environ.get("USER") or "root", "-o", "json"))
        with open(f"{tmp}/user.token", "w") as f:
            f.write(user["token"])
        CREDENTIALS[:] = ["--ca", f"{tmp}/pki/ca.crt", "--token-file", f"{tmp}/user.token"]
        for _ in range(100):
            if ctl(addr, "nodes").count(" UP ") == 2:
                break
            time.sleep(0.1)
        start, end = [], []
        for _ in range(args.jobs):
            job = ctl(addr, "submit", "--nodes", "2", "--gpus-per-node", "2", "--", "sh", "-c", "date +%s%3N").strip()
            for _ in range(600):
                j = json.loads(ctl(addr, "-o", "json", "status", job))
                if j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    break
                time.sleep(0.05)
            if j["state"] != "SUCCEEDED":
                sys.exit(f"job {job} ended {j['state']}: {j.get('reason')}")
            at = {t["to"]: int(t["at_ms"]) for t in j["transitions"]}
            exits = [int(line.split()[-1]) for line in ctl(addr, "logs", job).splitlines() if line.strip()]
            start.append(at["RUNNING"] - int(j["submit_ms"]))
            end.append(at["SUCCEEDED"] - max(exits))
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=20)
        subprocess.run(["rm", "-rf", tmp])

    def summary(v):
        v = sorted(v)
        return {"median_ms": statistics.median(v), "p90_ms": v[int(0.9 * (len(v) - 1))], "max_ms": v[-1]}

    result = {"jobs": args.jobs, "ranks_per_job": 4, "submit_to_all_started": summary(start),
              "last_exit_to_succeeded": summary(end)}
    print(f"# {args.jobs} jobs of 2 nodes x 2 GPUs on 127.0.0.1 (ms; ranks print their exit time to 1 ms)")
    print(f"{'':28s}{'median':>8s}{'p90':>8s}{'max':>8s}")
    for name in ("submit_to_all_started", "last_exit_to_succeeded"):
        s = result[name]
        print(f"{name:28s}{s['median_ms']:8.0f}{s['p90_ms']:8.0f}{s['max_ms']:8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
