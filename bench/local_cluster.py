"""A local cluster for the benches: an --insecure ddl-coordinator and ddl-agents with virtual GPUs, on loopback
ports chosen at run time, each process's output in a log file of the work directory. Not a test fixture: the
benches (preempt_bench.py, fairness_bench.py) import it.
"""
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    def __init__(self, bin_dir, work, name, nodes=1, gpus=2):
        """name: the bench's, for its errors; nodes n1..nN with `gpus` virtual GPUs each."""
        self.bin, self.work, self.name = bin_dir, work, name
        self.nodes, self.gpus = nodes, gpus
        self.procs = []
        self.listen = "127.0.0.1:%d" % free_port()
        self.http = "127.0.0.1:%d" % free_port()
        self.env = dict(os.environ, DDL_COORDINATOR=self.listen)
        self.coordinator_log = os.path.join(work, "coordinator.log")

    def spawn(self, argv, log):
        self.procs.append(subprocess.Popen(argv, stdout=open(os.path.join(self.work, log), "ab"),
                                           stderr=subprocess.STDOUT, start_new_session=True))

    def start(self):
        """Starts the coordinator and the agents; returns once every node is UP (within 15 s)."""
        self.spawn([os.path.join(self.bin, "ddl-coordinator"), "--insecure", "--listen", self.listen, "--http",
                    self.http, "--allow-root-jobs", "--data-dir", os.path.join(self.work, "c")],
                   "coordinator.log")
        for i in range(1, self.nodes + 1):
            node = "n%d" % i
            self.spawn([os.path.join(self.bin, "ddl-agent"), "--insecure", "--coordinator", self.listen, "--node",
                        node, "--virtual-gpus", str(self.gpus), "--data-dir", os.path.join(self.work, node),
                        "--cgroup-root", "none"], node + ".log")
        for _ in range(150):
            r = self.ctl("nodes", check=False)
            if r.returncode == 0 and r.stdout.count(" UP") >= self.nodes:
                return
            time.sleep(0.1)
        raise SystemExit("%s: the agents did not come UP; see %s" % (self.name, self.work))

    def ctl(self, *argv, check=True):
        r = subprocess.run([os.path.join(self.bin, "ddlctl"), "--insecure"] + list(argv), env=self.env,
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise SystemExit("%s: ddlctl %s: %s" % (self.name, " ".join(argv), r.stderr.strip()))
        return r

    def status(self, job):
        return json.loads(self.ctl("-o", "json", "status", job).stdout)

    def get(self, path):
        """The dashboard's JSON API: GET http://HTTP`path`, parsed."""
        with urllib.request.urlopen("http://%s%s" % (self.http, path), timeout=30) as r:
            return json.load(r)

    def stop(self):
        for p in reversed(self.procs):
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()

    def close(self, keep):
        """Stops the cluster and removes its work directory, or (keep) says where it is."""
        self.stop()
        if keep:
            print("work directory kept:", self.work)
        else:
            shutil.rmtree(self.work, ignore_errors=True)
