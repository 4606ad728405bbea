"""A stand-in for PyTorch's test/test_cuda.py, for tests/torch/test_pytorch_runner.py: one test
of each outcome the runner must tell apart (FakeCudaTest), and tests that pass in some runs only
(FakeFlipsTest), for --repeat."""

import os
import unittest

import torch


class FakeCudaTest(unittest.TestCase):
    def test_a_passes(self):
        x = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        self.assertGreaterEqual(torch.cuda.memory_allocated(), 1 << 20)
        del x

    def test_b_fails(self):
        self.assertEqual(1, 2, "fails under every allocator")

    def test_c_crashes(self):
        os.abort()

    def test_d_passes_after_the_crash(self):
        torch.empty(10, device="cuda")

    def test_e_passes_only_with_pytorchs_allocator(self):
        self.assertEqual(torch.cuda.get_allocator_backend(), "native")

    @unittest.skip("skipped on purpose")
    def test_f_skips(self):
        pass

    def test_g_hangs(self):
        if os.environ.get("GPUMEM_ALLOC_CONF"):
            import time

            time.sleep(3600)


def _run_index():
    """Which run of this configuration this is (0, 1, 2, ...), for the tests below that pass in
    some runs only, as PyTorch's value checks do on the simulator. Counted with files in
    FAKE_RUNS_DIR that only one process can create."""
    directory = os.environ.get("FAKE_RUNS_DIR")
    if not directory:
        return 0
    if not hasattr(_run_index, "cached"):  # once per process: a run is one worker
        config = os.environ.get("GPUMEM_ALLOC_CONF", "pytorch").replace(":", "-")
        index = 0
        while True:
            try:
                os.close(os.open(os.path.join(directory, f"{config}.{index}"),
                                 os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                break
            except FileExistsError:
                index += 1
        _run_index.cached = index
    return _run_index.cached


def _under_gpumem():
    return bool(os.environ.get("GPUMEM_ALLOC_CONF"))


class FakeFlipsTest(unittest.TestCase):
    """With --repeat 3: passes per run under PyTorch's allocator and under gpumem."""

    def test_h_lost_in_every_run_passes_in_two_of_three(self):
        # PyTorch's allocator: runs 0 and 2; gpumem: none -> regression
        self.assertTrue(not _under_gpumem() and _run_index() != 1)

    def test_i_passes_in_some_runs_under_both(self):
        # PyTorch's allocator: runs 0 and 2; gpumem: run 1 -> flaky
        self.assertEqual(_run_index() % 2, 1 if _under_gpumem() else 0)

    def test_j_lost_in_every_run_passes_in_one_of_three(self):
        # PyTorch's allocator: run 0; gpumem: none -> unclear
        self.assertTrue(not _under_gpumem() and _run_index() == 0)
