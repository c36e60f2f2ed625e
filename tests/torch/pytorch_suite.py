"""PyTorch's own distributed test suite against ddl.

torch/testing/_internal/distributed/distributed_test.py (DistributedTest._DistTestBase, what PyTorch's
test_distributed_spawn.py runs: every test spawns WORLD_SIZE processes that each call init_process_group) in one of
three modes:

  gloo    BACKEND=gloo, torch's own gloo: the reference.
  ddl     BACKEND=gloo, so the suite's skip decisions are gloo's, but every process group torch is asked to
          make with gloo is made with ddl (torch_ddl's ProcessGroupDDL): dist.get_backend() says "ddl". A test
          that needs the group's backend to be named gloo cannot pass: NAME_CHECKS names them, with why.
  plugin  BACKEND=ddl: the suite's own handling of a third-party backend (DistTestCases.backend_feature
          "plugin", and the features ddl has: "ddp", "subgroup"); the tests that need gloo by name skip.

    pytorch_suite.py check [--world-size 2] [--shard 1/4] [-k NAME_PART]   # gloo, then ddl in its place
    pytorch_suite.py check --mode plugin [--world-size 3]                  # the plugin: no test fails
    pytorch_suite.py run --mode gloo|ddl|plugin [--world-size N] [--json OUT] [-k NAME_PART]
    pytorch_suite.py list

`check` runs gloo, then ddl in gloo's place (each `run` in a process of its own), and fails when a test that
gloo passes does not pass with ddl, unless NAME_CHECKS names it; it ends with "N passed, M failed" (of gloo's
passing tests). `run` prints each test's outcome and time, then the counts. tests/torch/run_pytorch_suite.sh
runs the checks at 2 and 3 ranks and as the plugin; CI (tests/CMakeLists.txt) runs 2 ranks and the plugin.

The ranks start from a forkserver that imported torch and the suite once (DDL_SUITE_START=spawn: PyTorch's
own fresh interpreter per rank, about 3 s of CPU each, 10 times slower on 2 cores); each is a new process, with
the environment of its test, all the same. They import this file as their __main__, so the mode's set-up (the
environment and the patches below) is done in each of them before the suite is imported.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

# Tests gloo passes that ddl in gloo's place cannot, because they need the group's backend to be named gloo.
# Only these may differ (a name here that passes with ddl is reported, so that the list stays short).
NAME_CHECKS = {
    "test_get_backend": "asserts that dist.get_backend() is BACKEND, 'gloo'; it is 'ddl'",
    "test_monitored_barrier_gloo":
        "dist.monitored_barrier refuses every backend not named gloo ('monitored_barrier is only implemented "
        "for GLOO backend', distributed_c10d.py) before it reaches the group; ddl's monitored barrier passes "
        "test_monitored_barrier_gloo_rank_0_timeout, which calls the group's own monitored_barrier",
    "test_monitored_barrier_gloo_subgroup": "as test_monitored_barrier_gloo",
}

MODES = ("gloo", "ddl", "plugin")
# The mode of this process (also in the spawned ranks, which inherit the environment).
MODE = os.environ.get("DDL_SUITE_MODE", "")


def _set_up_environment(mode, world_size):
    """The variables test_distributed_spawn.py needs, set before the suite is imported."""
    os.environ["DDL_SUITE_MODE"] = mode
    os.environ["BACKEND"] = "ddl" if mode == "plugin" else "gloo"
    os.environ["WORLD_SIZE"] = str(world_size)
    if "TEMP_DIR" not in os.environ:
        temp = tempfile.mkdtemp(prefix="ddl-torch-suite-")
        os.mkdir(os.path.join(temp, "barrier"))
        os.environ["TEMP_DIR"] = temp
    # file:// as PyTorch's CI runs gloo (test_barrier_timeout_global needs it); each test's setUp makes its file.
    os.environ.setdefault("INIT_METHOD", "file://" + os.path.join(os.environ["TEMP_DIR"], "init"))
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _install_ddl_in_gloos_place():
    """Every group torch is asked to make with backend gloo is made with backend ddl instead (init_process_group,
    new_group and whatever calls them: subgroups, device meshes, DDP's and the suite's helpers)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    import torch_ddl  # noqa: F401  (registers "ddl")

    original = c10d._new_process_group_helper

    def helper(group_size, group_rank, global_ranks_in_group, backend, store, *args, **kwargs):
        text = str(backend)
        if re.search(r"\bgloo\b", text):
            text = re.sub(r"\bgloo\b", "ddl", text)
            backend = dist.Backend(text) if ":" not in text else text
        return original(group_size, group_rank, global_ranks_in_group, backend, store, *args, **kwargs)

    c10d._new_process_group_helper = helper


def _install_plugin():
    import torch_ddl  # noqa: F401
    from torch.testing._internal.common_distributed import DistTestCases

    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("ddl")


if MODE in MODES:
    if MODE == "ddl":
        _install_ddl_in_gloos_place()
    elif MODE == "plugin":
        _install_plugin()


# How the ranks start (see the top): forkserver, or spawn as PyTorch does.
START_METHOD = os.environ.get("DDL_SUITE_START", "forkserver")
_server_context = None


def _forkserver():
    global _server_context
    if _server_context is None:
        import multiprocessing

        _server_context = multiprocessing.get_context("forkserver")
        preload = ["torch", "torch.distributed", "torch.testing._internal.distributed.distributed_test"]
        if MODE != "gloo":
            preload.append("torch_ddl")
        _server_context.set_forkserver_preload(preload + ["__main__"])
    return _server_context


def _suite_class():
    import torch
    from torch.testing._internal.distributed import distributed_test
    from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

    torch.backends.cuda.matmul.allow_tf32 = False

    class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            if START_METHOD == "spawn":
                self._spawn_processes()
            else:
                self._start_processes(_forkserver().Process)
            torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

        def _start_processes(self, proc):
            # The ranks get this test's environment (setUp sets TEMP_DIR and INIT_METHOD anew for each test),
            # which a forkserver's children would not inherit.
            proc_with_env = lambda **kw: proc(**{**kw, "kwargs": {**kw.get("kwargs", {}), "env": dict(os.environ)}})
            super()._start_processes(proc_with_env)

        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            env = kwargs.pop("env", None)
            if env is not None:
                os.environ.clear()
                os.environ.update(env)
                # What the suite read from the environment when the server imported it, as a fresh import would.
                distributed_test.INIT_METHOD = os.environ.get("INIT_METHOD", "env://")
            super()._run(rank, test_name, file_name, pipe, **kwargs)

    TestDistBackendWithSpawn.__qualname__ = TestDistBackendWithSpawn.__name__  # pickled by this module's name
    return TestDistBackendWithSpawn


# The spawned ranks look the class up in this module (multiprocessing pickles the target by name).
if MODE in MODES:
    TestDistBackendWithSpawn = _suite_class()


class _Recorder(unittest.TextTestResult):
    """Keeps each test's outcome (pass, fail, error, skip), time and the first line of its failure."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.records = {}
        self._start = 0.0

    def startTest(self, test):
        self._start = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, detail=""):
        name = test.id().split(".")[-1]
        self.records[name] = {"outcome": outcome, "seconds": round(time.monotonic() - self._start, 2),
                              "detail": detail}

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail", _summary(self.failures[-1][1]))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error", _summary(self.errors[-1][1]))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "pass")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "fail", "unexpected success")


def _summary(text):
    """The lines of a traceback that say what failed (the exception lines), shortened."""
    lines = [l for l in text.splitlines() if re.match(r"^\w*(Error|Exception|Failure)\b|^\w+Error:", l.strip())]
    return " | ".join(dict.fromkeys(l.strip() for l in lines))[:600] or text.strip().splitlines()[-1][:600]


def test_names(cls, pattern=None, shard=None):
    names = sorted(unittest.TestLoader().getTestCaseNames(cls))
    if pattern:
        names = [n for n in names if re.search(pattern, n)]
    if shard:
        index, count = shard
        names = names[index - 1::count]
    return names


def run_suite(names, verbosity=1):
    cls = TestDistBackendWithSpawn
    suite = unittest.TestSuite(cls(n) for n in names)
    runner = unittest.TextTestRunner(resultclass=_Recorder, verbosity=verbosity, stream=sys.stderr)
    return runner.run(suite).records


def counts(records):
    out = {"pass": 0, "fail": 0, "error": 0, "skip": 0}
    for r in records.values():
        out[r["outcome"]] += 1
    return out


def parse_shard(text):
    if not text:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", text)
    if not m or not 1 <= int(m.group(1)) <= int(m.group(2)):
        raise argparse.ArgumentTypeError("--shard is I/N with 1 <= I <= N")
    return int(m.group(1)), int(m.group(2))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("run", "check", "list"))
    p.add_argument("--mode", choices=MODES, default="ddl")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--shard", type=parse_shard, help="I/N: every N-th test from the I-th (1-based)")
    p.add_argument("-k", dest="pattern", help="only tests whose name matches this regular expression")
    p.add_argument("--min-passed", type=int, default=1,
                   help="(check) fewer tests passed than this fails the check: a run where nothing could pass "
                        "(a torch upgrade that breaks the harness, every test skipped) proves nothing")
    p.add_argument("--json", help="(run) write every test's outcome, time and failure here")
    args = p.parse_args()
    if args.world_size < 2:
        p.error("--world-size must be at least 2")
    try:
        import expecttest  # noqa: F401  (torch.testing._internal needs it)
    except ImportError:
        print("SKIP this interpreter lacks expecttest, which torch's test suite imports (python/"
              "torch2-requirements.txt has it; scripts/bootstrap installs it)")
        return 77
    if args.command == "check":
        return check(args)
    if MODE and MODE != args.mode:
        p.error("DDL_SUITE_MODE=%s is set in the environment but the mode is %s" % (MODE, args.mode))
    if not MODE:
        # The mode decides what the suite sees when it is imported: set the environment up, then start again
        # with it, so that this process imports the suite as its ranks will.
        _set_up_environment(args.mode, args.world_size)
        os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])
    return run(args)


def run(args):
    names = test_names(TestDistBackendWithSpawn, args.pattern, args.shard)
    if args.command == "list":
        print("\n".join(names))
        return 0
    start = time.monotonic()
    records = run_suite(names)
    elapsed = time.monotonic() - start
    c = counts(records)
    for name in names:
        r = records.get(name, {"outcome": "missing", "seconds": 0, "detail": ""})
        print("%-6s %6.1fs %s%s" % (r["outcome"], r["seconds"], name,
                                    ("  -- " + r["detail"][:300]) if r["outcome"] in ("fail", "error") else ""))
    print("mode %s, %d ranks, %d tests in %.0f s: %d passed, %d failed, %d errors, %d skipped" % (
        MODE, args.world_size, len(names), elapsed, c["pass"], c["fail"], c["error"], c["skip"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": MODE, "world_size": args.world_size, "seconds": round(elapsed), "counts": c,
                       "tests": records}, f, indent=1, sort_keys=True)
    return 0 if MODE == "gloo" or c["fail"] + c["error"] == 0 else 1


def run_mode(mode, args, out_dir):
    """Runs `run --mode MODE` in a process of its own; returns its records."""
    path = os.path.join(out_dir, mode + ".json")
    cmd = [sys.executable, os.path.abspath(__file__), "run", "--mode", mode, "--world-size", str(args.world_size),
           "--json", path]
    if args.pattern:
        cmd += ["-k", args.pattern]
    if args.shard:
        cmd += ["--shard", "%d/%d" % args.shard]
    env = {k: v for k, v in os.environ.items() if k not in ("DDL_SUITE_MODE", "TEMP_DIR", "INIT_METHOD")}
    print("== %s" % " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, env=env, check=False)
    with open(path) as f:
        return json.load(f)["tests"]


def check(args):
    """--mode ddl (the default): gloo, then ddl in its place; every test gloo passes must pass with ddl, but
    NAME_CHECKS. --mode plugin: the plugin run has no failure and no error. Exit status 0 when so."""
    out_dir = tempfile.mkdtemp(prefix="ddl-torch-suite-check-")
    if args.mode == "plugin":
        plugin = run_mode("plugin", args, out_dir)
        bad = sorted(n for n, r in plugin.items() if r["outcome"] in ("fail", "error"))
        c = counts(plugin)
        print("plugin ddl, %d ranks: %d passed, %d skipped, %d failed or errors%s" % (
            args.world_size, c["pass"], c["skip"], len(bad), (": " + ", ".join(bad)) if bad else ""))
        if c["pass"] < args.min_passed:
            print("FAILED: %d passed, fewer than --min-passed %d" % (c["pass"], args.min_passed))
            return 1
        return 1 if bad else 0
    if args.mode != "ddl":
        print("check takes --mode ddl (against gloo) or plugin")
        return 2
    gloo = run_mode("gloo", args, out_dir)
    ddl = run_mode("ddl", args, out_dir)
    gloo_passed = sorted(n for n, r in gloo.items() if r["outcome"] == "pass")
    missing = [n for n in gloo_passed if ddl.get(n, {}).get("outcome") != "pass" and n not in NAME_CHECKS]
    excused = [n for n in gloo_passed if ddl.get(n, {}).get("outcome") != "pass" and n in NAME_CHECKS]
    stale = [n for n in NAME_CHECKS if ddl.get(n, {}).get("outcome") == "pass"]
    ddl_passed = sum(1 for n in gloo_passed if ddl.get(n, {}).get("outcome") == "pass")
    print("\n%d ranks: gloo passes %d tests; ddl in gloo's place passes %d of them (%d passed in all)" % (
        args.world_size, len(gloo_passed), ddl_passed, counts(ddl)["pass"]))
    for n in excused:
        print("  excused (checks gloo's name): %s: %s" % (n, NAME_CHECKS[n]))
    for n in stale:
        print("  NOTE %s passes with ddl: NAME_CHECKS need not name it" % n)
    for n in missing:
        print("  FAILED with ddl where gloo passes: %s (%s) %s" % (n, ddl.get(n, {}).get("outcome", "not run"),
                                                                 ddl.get(n, {}).get("detail", "")[:500]))
    print("%d passed, %d failed" % (ddl_passed, len(missing)))
    if len(gloo_passed) < args.min_passed:
        print("FAILED: gloo passed %d tests, fewer than --min-passed %d: the reference run proves nothing"
              % (len(gloo_passed), args.min_passed))
        return 1
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
