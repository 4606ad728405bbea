"""A stand-in for PyTorch's test/test_cuda.py, for tests/torch/test_pytorch_runner.py: one test
of each outcome the runner must tell apart."""

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
