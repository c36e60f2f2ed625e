"""torch_ddl, the torch.distributed backend "ddl", tested with real processes (tests/torch/harness.py).

Each test runs one scenario of worker.py on N ranks and expects every rank to print "OK <scenario>". ctest runs
each test method as a test of its own (label torch); by hand:

    PYTHONPATH=build/python /usr/bin/python3 -m unittest -v tests/torch/test_torch_ddl.py
"""

import os
import shutil
import tempfile
import unittest

import harness


class Case(unittest.TestCase):
    def run_ok(self, n, scenario, *args, timeout=180, env=None):
        results = harness.run_ranks(n, scenario, *args, timeout=timeout, env=env)
        for r in results:
            self.assertEqual(r.code, 0, harness.describe(results))
            self.assertIn("OK " + scenario, r.output, harness.describe(results))
        return results


class Collectives(Case):
    """Every collective, op and dtype against torch's own results, at 1 to 4 ranks."""

    def test_1_rank(self):
        self.run_ok(1, "collectives")

    def test_2_ranks(self):
        self.run_ok(2, "collectives")

    def test_3_ranks(self):
        self.run_ok(3, "collectives")

    def test_4_ranks(self):
        self.run_ok(4, "collectives")


class Async(Case):
    def test_futures_complete_in_call_order_2_ranks(self):
        self.run_ok(2, "async")

    def test_futures_complete_in_call_order_4_ranks(self):
        self.run_ok(4, "async")

    def test_blocking_mode_gives_the_same_results(self):
        self.run_ok(2, "async", env={"TORCH_DDL_BLOCKING": "1"})


class Ddp(Case):
    """DDP over ddl ends with the weights DDP over gloo ends with, from the same start and data."""

    def test_2_ranks_same_weights_as_gloo(self):
        self.run_ok(2, "ddp")

    def test_3_ranks_same_weights_as_gloo(self):
        self.run_ok(3, "ddp")


class InitMethods(Case):
    def run_init(self, method):
        tmp = tempfile.mkdtemp(prefix="torch-ddl-init-")
        try:
            self.run_ok(3, "init", method, timeout=120,
                        env={"DDL_TEST_SECOND_PORT": str(harness.free_port()),
                             "DDL_TEST_SHARED_FILE": os.path.join(tmp, "rendezvous")})
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def test_env(self):
        self.run_init("env")

    def test_tcp(self):
        self.run_init("tcp")

    def test_file(self):
        self.run_init("file")

    def test_explicit_store(self):
        self.run_init("store")


class Groups(Case):
    def test_new_group_with_ranks_outside_it(self):
        self.run_ok(4, "groups")


class Failures(Case):
    def test_killed_rank_makes_the_others_raise_naming_a_rank(self):
        results = harness.run_ranks(3, "kill", timeout=120)
        self.assertEqual(results[2].code, -9, harness.describe(results))  # the victim, SIGKILL
        for r in results[:2]:
            self.assertEqual(r.code, 0, harness.describe(results))
            self.assertIn("OK kill", r.output, harness.describe(results))

    def test_a_rank_that_stops_calling_times_out_the_others(self):
        results = harness.run_ranks(3, "stall", timeout=120)
        for r in results:
            self.assertEqual(r.code, 0, harness.describe(results))
        for r in (results[0], results[2]):
            self.assertIn("OK stall", r.output, harness.describe(results))

    def test_mismatched_sizes_raise_on_every_rank(self):
        self.run_ok(3, "mismatch")

    def test_bad_arguments_raise_and_break_nothing(self):
        self.run_ok(2, "errors")


class Fsdp(Case):
    """FSDP2 with mixed precision and a gradient divide factor (ReduceOp.PREMUL_SUM) against a single process."""

    def run_fsdp(self, n):
        results = harness.run_ranks(n, "fsdp", timeout=300)
        if all(r.code == 77 for r in results):
            self.skipTest(results[0].output.strip().splitlines()[-1])
        for r in results:
            self.assertEqual(r.code, 0, harness.describe(results))
            self.assertIn("OK fsdp", r.output, harness.describe(results))

    def test_2_ranks_same_weights_as_one_process(self):
        self.run_fsdp(2)

    def test_3_ranks_same_weights_as_one_process(self):
        self.run_fsdp(3)


class Cuda(Case):
    """CUDA tensors (torch 2.x: stream-ordered); skipped where torch sees no GPU."""

    def run_cuda(self, n, scenario, *args):
        results = harness.run_ranks(n, scenario, *args, timeout=300)
        if all(r.code == 77 for r in results):
            self.skipTest(results[0].output.strip().splitlines()[-1])
        return results

    def test_cuda_tensors_2_ranks(self):
        for r in self.run_cuda(2, "cuda"):
            self.assertEqual(r.code, 0, r)
            self.assertIn("OK cuda", r.output)

    def test_cuda_tensors_3_ranks(self):
        for r in self.run_cuda(3, "cuda"):
            self.assertEqual(r.code, 0, r)
            self.assertIn("OK cuda", r.output)

    def test_killed_rank_makes_the_others_raise(self):
        results = self.run_cuda(3, "kill", "cuda")
        self.assertEqual(results[2].code, -9, harness.describe(results))
        for r in results[:2]:
            self.assertEqual(r.code, 0, harness.describe(results))
            self.assertIn("OK kill", r.output, harness.describe(results))


if __name__ == "__main__":
    unittest.main()
