"""tools/pytorch_tests/run_test_cuda.py on a stand-in for PyTorch's test_cuda.py
(tests/torch/pytorch_runner/fake_test_cuda.py), with PyTorch's allocator and gpumem's classic
policy on the CUDA simulator: every outcome is read right, the abort is charged to the test that
aborted and the tests after it still run, the hang is cut at --timeout, and the regressions are
exactly the tests that pass with PyTorch's allocator only.

    python tests/torch/test_pytorch_runner.py PLUGIN CUDASIM_DIR
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "..", "..", "tools", "pytorch_tests", "run_test_cuda.py")
FAKE = os.path.join(HERE, "pytorch_runner", "fake_test_cuda.py")
PLUGIN = ""
CUDASIM = ""


def load_runner():
    spec = importlib.util.spec_from_file_location("run_test_cuda", RUNNER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class KeywordTest(unittest.TestCase):
    def test_k_expressions_select_as_pytest_does(self):
        runner = load_runner()
        selected = runner.keyword_filter("memory and not (pinned or Graph)")
        self.assertTrue(selected("TestCuda.test_memory_stats"))
        self.assertFalse(selected("TestCuda.test_pinned_memory_empty_cache"))
        self.assertFalse(selected("TestCuda.test_graph_memory_stats"))
        self.assertFalse(selected("TestCuda.test_streams"))
        self.assertTrue(runner.keyword_filter("")("anything"))


class RunnerTest(unittest.TestCase):
    def test_outcomes_crash_timeout_and_regressions(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            p = subprocess.run(
                [sys.executable, RUNNER, FAKE, "--plugin", PLUGIN, "--cudasim", CUDASIM,
                 "--python", sys.executable, "--policies", "classic", "--timeout", "4",
                 "--jobs", "2", "--json", out],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)  # regressions found
            with open(out) as f:
                report = json.load(f)
        outcome = {config: {test.split(".")[-1]: r["outcome"] for test, r in tests.items()}
                   for config, tests in report["results"].items()}
        self.assertEqual(outcome["pytorch"], {
            "test_a_passes": "pass", "test_b_fails": "fail", "test_c_crashes": "crash",
            "test_d_passes_after_the_crash": "pass",
            "test_e_passes_only_with_pytorchs_allocator": "pass", "test_f_skips": "skip",
            "test_g_hangs": "pass"})
        self.assertEqual(outcome["classic"], dict(
            outcome["pytorch"], test_e_passes_only_with_pytorchs_allocator="fail",
            test_g_hangs="timeout"))
        crash = report["results"]["classic"]["FakeCudaTest.test_c_crashes"]["message"]
        self.assertIn("SIGABRT", crash)
        self.assertEqual(sorted(r["test"] for r in report["regressions"]), [
            "FakeCudaTest.test_e_passes_only_with_pytorchs_allocator",
            "FakeCudaTest.test_g_hangs"])
        self.assertEqual(report["counts"]["classic"]["fail"], 2)
        self.assertIn("Regressions (pass with PyTorch's allocator, not with gpumem): 2", p.stdout)
        self.assertIn("'gpumem' != 'native'", p.stdout)


if __name__ == "__main__":
    PLUGIN, CUDASIM = sys.argv[1], sys.argv[2]
    del sys.argv[1:3]
    unittest.main()
