"""A torch_ddl refuses every torch but the one it was built for (issue 40, item 5).

Before the check, torch 2.11's build imported into Debian's torch 1.13 without a word and died with SIGSEGV at
the first collective. For every pair of this tree's torch_ddl builds for different torches (DDL_TORCH_BUILDS,
from tests/CMakeLists.txt), one imported by the other's interpreter must raise ImportError naming both
versions and the command that builds the right one, and crash nowhere; each imports into its own torch. A
copy with no record, or outside its build tree, says so and names pip. Skipped, with the reason, where fewer
than two torches were built for. By hand: `ctest -R torch_built_for -V` in the build tree (which sets
DDL_TORCH_BUILDS="<name>|<python>|<PYTHONPATH>,...").
"""

import os
import shutil
import subprocess
import tempfile
import unittest

# What the child runs: the import and, where it passes, the first collective (where the wrong torch crashed).
CHILD = """
import os, torch, torch.distributed as dist
import torch_ddl
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["DDL_TEST_PORT"])
dist.init_process_group("ddl", rank=0, world_size=1)
t = torch.ones(4)
dist.all_reduce(t)
print("ALL_REDUCE", t.tolist(), flush=True)
dist.destroy_process_group()
"""


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def run_import(python, pythonpath):
    env = dict(os.environ, PYTHONPATH=pythonpath, PYTHONDONTWRITEBYTECODE="1", DDL_TEST_PORT=free_port())
    return subprocess.run([python, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)


def describe(result):
    how = "died of signal %d" % -result.returncode if result.returncode < 0 else "exited %d" % result.returncode
    return "%s\n--- stdout\n%s--- stderr\n%s" % (how, result.stdout, result.stderr)


class Build:
    def __init__(self, entry):
        self.name, self.python, self.path = entry.split("|")
        self.package = os.path.join(self.path, "torch_ddl")
        self.torch = None
        if os.access(self.python, os.X_OK):
            r = subprocess.run([self.python, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                               text=True, timeout=120)
            self.torch = r.stdout.strip() if r.returncode == 0 else None

    def __repr__(self):
        return "%s (torch %s, %s)" % (self.name, self.torch, self.python)


class BuiltFor(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        entries = [e for e in os.environ.get("DDL_TORCH_BUILDS", "").split(",") if e]
        cls.builds = [b for b in (Build(e) for e in entries) if b.torch]
        if len({b.torch for b in cls.builds}) < 2:
            raise unittest.SkipTest(
                "needs torch_ddl built for two torches (the python3-torch of Debian and the .venv/torch2 that "
                "scripts/bootstrap makes); this tree built for: %s" % (cls.builds or "none"))

    def pairs(self):
        return [(built, runner) for built in self.builds for runner in self.builds if built.torch != runner.torch]

    def test_each_build_runs_in_its_own_torch(self):
        for b in self.builds:
            with self.subTest(build=b):
                r = run_import(b.python, b.path)
                self.assertEqual(r.returncode, 0, describe(r))
                self.assertIn("ALL_REDUCE [1.0, 1.0, 1.0, 1.0]", r.stdout, describe(r))

    def test_another_torch_refuses_it_naming_both_and_the_build(self):
        for built, runner in self.pairs():
            with self.subTest(built=built, runner=runner):
                r = run_import(runner.python, built.path)
                self.assertEqual(r.returncode, 1, describe(r))  # not a signal: it never got to the extension
                self.assertNotIn("ALL_REDUCE", r.stdout, describe(r))
                self.assertIn("ImportError: torch_ddl in %s was built for torch %s (" % (built.package, built.torch),
                              r.stderr, describe(r))
                self.assertIn("but %s runs torch %s (" % (runner.python, runner.torch), r.stderr, describe(r))
                # This tree builds one for the runner's torch: the message names its target and folder.
                self.assertIn("`cmake --build ", r.stderr, describe(r))
                self.assertIn("PYTHONPATH=%s\n" % runner.path, r.stderr, describe(r))

    def copy_of(self, build):
        tmp = tempfile.mkdtemp(prefix="torch-ddl-built-for-")
        self.addCleanup(shutil.rmtree, tmp, ignore_errors=True)
        shutil.copytree(build.package, os.path.join(tmp, "torch_ddl"))
        return tmp

    def test_a_copy_elsewhere_names_pip(self):
        built, runner = self.pairs()[0]
        r = run_import(runner.python, self.copy_of(built))
        self.assertEqual(r.returncode, 1, describe(r))
        self.assertIn("was built for torch %s" % built.torch, r.stderr, describe(r))
        self.assertIn("`%s -m pip install --no-build-isolation " % runner.python, r.stderr, describe(r))

    def test_a_build_without_its_record_refuses_to_load(self):
        b = self.builds[0]
        copy = self.copy_of(b)
        os.remove(os.path.join(copy, "torch_ddl", "_built_for.py"))
        r = run_import(b.python, copy)
        self.assertEqual(r.returncode, 1, describe(r))
        self.assertIn("has no record of the torch it was built for", r.stderr, describe(r))


if __name__ == "__main__":
    unittest.main()
