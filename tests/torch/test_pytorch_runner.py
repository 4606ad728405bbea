"""tools/pytorch_tests/run_test_cuda.py on a stand-in for PyTorch's test_cuda.py
(tests/torch/pytorch_runner/fake_test_cuda.py), with PyTorch's allocator and gpumem's classic
policy on the CUDA simulator: every outcome is read right, the abort is charged to the test that
aborted and the tests after it still run, the hang is cut at --timeout, and the regressions are
exactly the tests that pass with PyTorch's allocator only. With --repeat, each test's passes are
counted per configuration and a test is a regression only when PyTorch's allocator passes it in
most runs and the policy in none (flaky when both pass it in some runs).

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


class ClassifyTest(unittest.TestCase):
    def test_counts_of_passes_decide(self):
        classify = load_runner().classify
        self.assertEqual(classify(3, 0, 3), "regression")
        self.assertEqual(classify(2, 0, 3), "regression")  # PyTorch's allocator: most runs
        self.assertEqual(classify(1, 0, 3), "unclear")  # a minority: more runs decide
        self.assertEqual(classify(1, 0, 2), "unclear")  # half is not most
        self.assertEqual(classify(3, 1, 3), "flaky")
        self.assertEqual(classify(1, 2, 3), "flaky")
        self.assertIsNone(classify(3, 3, 3))
        self.assertIsNone(classify(0, 0, 3))  # never passes with PyTorch's allocator
        self.assertEqual(classify(1, 0, 1), "regression")  # one run: every loss counts
        self.assertIsNone(classify(1, 1, 1))

    def test_summary_counts_every_run(self):
        runner = load_runner()
        configs = [runner.Config("pytorch", None), runner.Config("classic", "classic"),
                   runner.Config("stitch", "stitch")]

        def run(**outcomes):
            return {f"T.{t}": {"outcome": o, "message": f"{t} {o}", "seconds": 1}
                    for t, o in outcomes.items()}

        runs = {"pytorch": [run(a="pass", b="pass", c="pass"), run(a="pass", b="fail", c="pass"),
                            run(a="pass", b="pass", c="fail")],
                "classic": [run(a="fail", b="pass", c="crash"), run(a="error", b="fail"),
                            run(a="fail", b="fail", c="fail")],
                "stitch": [run(a="pass", b="fail", c="pass"), run(a="pass", b="fail", c="pass"),
                           run(a="pass", b="fail", c="pass")]}
        counts, passes, classified, regressions = runner.summarize(configs, runs, configs[0])
        self.assertEqual(passes["T.a"], {"pytorch": 3, "classic": 0, "stitch": 3})
        self.assertEqual(passes["T.b"], {"pytorch": 2, "classic": 1, "stitch": 0})
        self.assertEqual(passes["T.c"], {"pytorch": 2, "classic": 0, "stitch": 3})
        self.assertEqual(counts["classic"], {"pass": 1, "fail": 5, "error": 1, "skip": 0,
                                             "crash": 1, "timeout": 0, "total": 8})
        self.assertEqual({e["test"]: e["class"] for e in classified},
                         {"T.a": "regression", "T.b": "regression", "T.c": "regression"})
        by_test = {r["test"]: r["configs"] for r in regressions}
        self.assertEqual(sorted(by_test["T.a"]), ["classic"])
        self.assertEqual(by_test["T.a"]["classic"]["outcomes"], ["fail", "error", "fail"])
        self.assertEqual(by_test["T.a"]["classic"]["message"], "a fail")  # the first failure
        self.assertEqual(sorted(by_test["T.b"]), ["stitch"])  # classic passed once: flaky
        self.assertEqual(classified[1]["configs"]["classic"]["class"], "flaky")
        # a run that did not reach the test counts as a failure of it
        self.assertEqual(by_test["T.c"]["classic"]["outcomes"], ["crash", "missing", "fail"])


class RunnerTest(unittest.TestCase):
    def test_outcomes_crash_timeout_and_regressions(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            p = subprocess.run(
                [sys.executable, RUNNER, FAKE, "--plugin", PLUGIN, "--cudasim", CUDASIM,
                 "--python", sys.executable, "--policies", "classic", "--timeout", "4",
                 "--jobs", "2", "-k", "FakeCudaTest", "--json", out],
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

    def test_repeat_counts_passes_and_classifies(self):
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out.json")
            runs_dir = os.path.join(tmp, "runs")
            os.mkdir(runs_dir)
            p = subprocess.run(
                [sys.executable, RUNNER, FAKE, "--plugin", PLUGIN, "--cudasim", CUDASIM,
                 "--python", sys.executable, "--policies", "classic", "--repeat", "3",
                 "--jobs", "2", "-k", "FakeFlipsTest or test_a_ or test_e_",
                 "--env", f"FAKE_RUNS_DIR={runs_dir}", "--json", out],
                capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 1, p.stdout + p.stderr)  # regressions found
            with open(out) as f:
                report = json.load(f)
        passes = {test.split(".")[-1]: counts for test, counts in report["passes"].items()}
        self.assertEqual(passes, {
            "test_a_passes": {"pytorch": 3, "classic": 3},
            "test_e_passes_only_with_pytorchs_allocator": {"pytorch": 3, "classic": 0},
            "test_h_lost_in_every_run_passes_in_two_of_three": {"pytorch": 2, "classic": 0},
            "test_i_passes_in_some_runs_under_both": {"pytorch": 2, "classic": 1},
            "test_j_lost_in_every_run_passes_in_one_of_three": {"pytorch": 1, "classic": 0}})
        self.assertEqual({e["test"].split(".")[-1]: e["class"] for e in report["classified"]}, {
            "test_e_passes_only_with_pytorchs_allocator": "regression",
            "test_h_lost_in_every_run_passes_in_two_of_three": "regression",
            "test_i_passes_in_some_runs_under_both": "flaky",
            "test_j_lost_in_every_run_passes_in_one_of_three": "unclear"})
        self.assertEqual(sorted(r["test"].split(".")[-1] for r in report["regressions"]), [
            "test_e_passes_only_with_pytorchs_allocator",
            "test_h_lost_in_every_run_passes_in_two_of_three"])
        self.assertEqual(report["repeat"], 3)
        self.assertEqual([len(run) for run in report["runs"]["classic"]], [5, 5, 5])
        self.assertEqual(report["counts"]["pytorch"]["pass"], 3 + 3 + 2 + 2 + 1)
        self.assertIn("Passes of 3 runs", p.stdout)
        self.assertRegex(p.stdout, r"\n +2 +1  flaky +FakeFlipsTest\.test_i_")
        self.assertRegex(p.stdout, r"\n +1 +0  unclear +FakeFlipsTest\.test_j_")
        self.assertIn("regression: 2  unclear: 1  flaky: 1", p.stdout)
        self.assertIn("under a policy in none): 2", p.stdout)


if __name__ == "__main__":
    PLUGIN, CUDASIM = sys.argv[1], sys.argv[2]
    del sys.argv[1:3]
    unittest.main()
