"""The installed Python package (pip install .), run by install.sh with the environment's Python.

    python test_package.py --mode full --source SOURCE_DIR --cudasim CUDASIM_DIR
    python test_package.py --mode no-torch|no-cuda --source SOURCE_DIR

full: gpumem.install() and the functions that need it run in fresh Pythons in which PyTorch (the
wheel) runs on the CUDA simulator (its libcudart.so.13 and libcuda.so.1 preloaded); what gpumem
reports must be what torch.cuda reports. no-torch, no-cuda: installed without the plugin, the
package says why. Every mode: gpumem.replay() against `gpumem-replay
--json` found on PATH.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import unittest

MODE = ""
SOURCE = ""
CUDASIM = ""
MiB = 1 << 20


def python(code, env=None, preload=()):
    """Runs `code` in a fresh Python of this environment on the simulator; (rc, stdout, stderr)."""
    full_env = dict(os.environ)
    for var in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                "GPUMEM_AUTO_INSTALL", "GPUMEM_TORCH_INSTALL_AT_LOAD", "LD_PRELOAD"):
        full_env.pop(var, None)
    if CUDASIM:
        full_env.update(
            LD_PRELOAD=":".join([f"{CUDASIM}/libcudart.so.13", f"{CUDASIM}/libcuda.so.1",
                                 *preload]),
            GPUMEM_SIM_MEMORY="16GiB",
            GPUMEM_SIM_STRICT="abort",  # a violation of the GPU's rules fails the test
        )
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


class Base(unittest.TestCase):
    def check(self, code, env=None, preload=()):
        rc, out, err = python(code, env, preload)
        self.assertEqual(rc, 0, f"stdout:\n{out}\nstderr:\n{err}")
        return out, err

    def trace(self, name="gpt2-small-b4-s512-ckpt.trace"):
        return os.path.join(SOURCE, "examples", "traces", name)


class ReplayTest(Base):
    """Every mode: neither torch nor the plugin is needed."""

    def test_the_package_is_the_installed_one(self):
        import gpumem

        here = os.path.abspath(gpumem.__file__)
        self.assertFalse(here.startswith(os.path.join(SOURCE, "python") + os.sep), here)
        self.assertTrue(here.startswith(sys.prefix + os.sep), (here, sys.prefix))
        self.assertIn("site-packages", here)
        self.assertTrue(os.access(gpumem.replay_path(), os.X_OK))

    def test_gpumem_replay_runs_from_path(self):
        exe = shutil.which("gpumem-replay")
        self.assertIsNotNone(exe)
        self.assertEqual(os.path.dirname(exe), os.path.dirname(sys.executable))
        p = subprocess.run([exe, self.trace(), "--device-memory", "3GiB", "--compare",
                            "policy:classic", "policy:stitch"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertRegex(p.stdout, r"policy:classic +classic +OOM at event 3410")
        self.assertRegex(p.stdout, r"policy:stitch +stitch +completed")
        p = subprocess.run([exe, "--device-memory", "24"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)

    def test_replay_returns_the_records_of_gpumem_replay_json(self):
        import gpumem

        records = gpumem.replay(self.trace(), device_memory="3GiB",
                                configs=["policy:classic", "policy:stitch"])
        p = subprocess.run(["gpumem-replay", self.trace(), "--device-memory", "3GiB", "--compare",
                            "policy:classic", "policy:stitch", "--json"],
                           capture_output=True, text=True, check=True)
        expected = json.loads(p.stdout)
        self.assertEqual(len(records), 2)
        for got, want in zip(records, expected):
            self.assertEqual(set(got), set(want))
            for key in want:
                if key not in ("events_per_second", "replay_seconds"):  # measurements
                    self.assertEqual(got[key], want[key], key)
        classic, stitch = records
        self.assertEqual((classic["policy"], classic["completed"], classic["oom_event_index"]),
                         ("classic", False, 3410))
        self.assertTrue(stitch["completed"])
        self.assertIn("policy:stitch", classic["completes_with"])

    def test_replay_options(self):
        import gpumem

        one = gpumem.replay(self.trace(), device_memory=3 << 30, configs=["policy:stitch"],
                            find_min_memory=True)
        self.assertEqual(len(one), 1)
        self.assertEqual(one[0]["config"], "policy:stitch")
        self.assertGreater(one[0]["min_device_memory_bytes"], 2 << 30)
        self.assertLessEqual(one[0]["min_device_memory_bytes"], 3 << 30)
        steps = gpumem.replay(self.trace(), configs=["policy:classic"], steps=3)
        self.assertEqual(steps[0]["steps"], 3)
        self.assertEqual(len(steps[0]["device_calls_per_step"]), 3)
        default = gpumem.replay(self.trace())  # gpumem-replay's default: stitch on 80 GiB
        self.assertEqual([r["policy"] for r in default], ["stitch"])
        overhead = gpumem.replay(self.trace(), device_memory="3GiB", overhead="1GiB",
                                 configs=["policy:stitch"])
        self.assertFalse(overhead[0]["completed"])
        both = gpumem.replay([self.trace(), self.trace("resnet50-b32.trace")],
                             configs=["policy:stitch"])
        self.assertEqual(len(both), 2)
        self.assertEqual({os.path.basename(r["trace"]) for r in both},
                         {"gpt2-small-b4-s512-ckpt.trace", "resnet50-b32.trace"})

    def test_replay_errors(self):
        import gpumem

        with self.assertRaisesRegex(gpumem.GpumemError, "cannot|no such|open"):
            gpumem.replay(os.path.join(SOURCE, "no-such.trace"))
        with self.assertRaisesRegex(ValueError, "sideways"):
            gpumem.replay(self.trace(), configs=["policy:sideways"])
        with self.assertRaises(TypeError):
            gpumem.replay(self.trace(), configs="policy:classic")
        with self.assertRaises(TypeError):
            gpumem.replay(self.trace(), device_memory=3.5)
        with self.assertRaises(ValueError):
            gpumem.replay(self.trace(), steps=0)
        with self.assertRaises(ValueError):
            gpumem.replay([])

    def test_replay_on_pytorchs_and_cubs_allocators(self):
        """gpumem-replay-peer and the simulator ship with the CUDA toolkit (pytorch with torch)."""
        import gpumem

        peer = os.path.join(os.path.dirname(gpumem.replay_path()), "gpumem-replay-peer")
        if MODE == "no-cuda":
            self.assertFalse(os.path.exists(peer))
            for allocator in ("cub", "pytorch"):
                with self.assertRaisesRegex(ValueError, "needs gpumem-replay-peer"):
                    gpumem.replay(self.trace(), allocator=allocator)
            return
        cub = gpumem.replay(self.trace(), allocator="cub", device_memory="3GiB")
        self.assertEqual((cub[0]["allocator"], cub[0]["completed"]), ("cub", False))
        if MODE == "no-torch":
            with self.assertRaisesRegex(ValueError, "built without it"):
                gpumem.replay(self.trace(), allocator="pytorch")
            return
        args = ["--allocator", "pytorch", "--device-memory", "3GiB", "--compare", "",
                "expandable_segments:True"]
        records = gpumem.replay(self.trace(), allocator="pytorch", device_memory="3GiB",
                                configs=["", "expandable_segments:True"])
        p = subprocess.run(["gpumem-replay", self.trace(), *args, "--json"], capture_output=True,
                           text=True, check=True)
        expected = json.loads(p.stdout)
        self.assertEqual(len(records), len(expected))
        for got, want in zip(records, expected):
            for key in want:
                if key not in ("events_per_second", "replay_seconds"):  # measurements
                    self.assertEqual(got[key], want[key], key)
        native, expandable = records
        self.assertEqual(native["allocator"], "pytorch")
        # PyTorch's own allocator runs out where the demo says; expandable segments complete.
        self.assertEqual((native["completed"], native["oom_event_index"]), (False, 3410))
        self.assertTrue(expandable["completed"])


class ReplayOnlyTest(Base):
    """Installed where torch is absent: the package says what is missing."""

    def test_install_says_the_plugin_is_missing_and_why(self):
        import gpumem

        for call in (gpumem.install, gpumem.plugin_path):
            with self.assertRaises(gpumem.GpumemError) as e:
                call()
            self.assertIn("no libgpumem_torch.so", str(e.exception))
            why = {"no-torch": "torch was not found when the package was built",
                   "no-cuda": "the CUDA toolkit was not found when the package was built"}[MODE]
            self.assertIn(why, str(e.exception))
            self.assertIn("pip install <gpumem clone>", str(e.exception))
        self.assertFalse(gpumem.is_installed())
        self.assertEqual(gpumem.torch_version(), "")


class PluginTest(Base):
    """With the plugin, on the CUDA simulator."""

    def test_install_and_the_functions_report_what_torch_cuda_reports(self):
        out, err = self.check("""
            import os, torch, gpumem
            assert os.path.exists(gpumem.plugin_path()), gpumem.plugin_path()
            assert gpumem.torch_version() == torch.__version__
            assert not gpumem.is_installed()
            gpumem.install("policy:classic,max_split_size_mb:64")
            assert gpumem.is_installed()
            x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
            y = torch.empty(1000, dtype=torch.uint8, device="cuda")
            s = gpumem.stats()
            t = torch.cuda.memory_stats()
            assert set(s) == set(t), set(s) ^ set(t)
            assert s == t, [(k, s[k], t[k]) for k in s if s[k] != t[k]]
            assert s["allocated_bytes.all.current"] == (3 << 20) + 1024, s
            assert gpumem.stats(0) == gpumem.stats("cuda:0") == gpumem.stats(torch.device("cuda", 0))
            summary = gpumem.memory_summary()
            assert summary == gpumem.memory_summary(0) == gpumem.memory_summary("cuda:0")
            for line in ("gpumem CUDA memory summary, device ID 0", "Allocated memory",
                         "GPU reserved memory", "gpumem allocator details", "Largest free block",
                         "max_split_size_mb:64,policy:classic"):
                assert line in summary, (line, summary)
            del x, y
            torch.cuda.empty_cache()
            assert gpumem.stats()["reserved_bytes.all.current"] == 0
            print("ok")
        """)
        self.assertEqual(out.strip(), "ok")
        self.assertNotIn("gpumem", err)  # nothing reported

    def test_the_default_is_the_environment_then_stitch(self):
        self.check("""
            import torch, gpumem
            gpumem.install()
            x = torch.empty(1 << 20, device="cuda")
            assert "| Allocator policy      | stitch" in gpumem.memory_summary(), gpumem.memory_summary()
            gpumem.install()                      # installed already: nothing to do
            try:
                gpumem.install("policy:classic")  # other settings: too late for them
            except gpumem.GpumemError as e:
                assert "already" in str(e), e
            else:
                raise AssertionError("install with other settings after install")
        """)
        self.check("""
            import torch, gpumem
            gpumem.install()
            x = torch.empty(1 << 20, device="cuda")
            assert "| Allocator policy      | classic" in gpumem.memory_summary()
        """, env={"GPUMEM_ALLOC_CONF": "policy:classic"})

    def test_a_bad_config_raises_and_installs_nothing(self):
        self.check("""
            import torch, gpumem
            for bad in ("policy:sideways", "max_split_size_mb:5", "expandable_segments:Yes",
                        "no_such_key:1"):
                try:
                    gpumem.install(bad)
                except gpumem.ConfigError as e:
                    assert isinstance(e, ValueError)
                    assert bad.split(":")[0] in str(e), (bad, e)
                else:
                    raise AssertionError(bad)
                assert not gpumem.is_installed()
            try:
                gpumem.install(42)
            except TypeError:
                pass
            else:
                raise AssertionError("install(42)")
            gpumem.install("policy:expandable")  # a good one still works afterwards
            x = torch.empty(1 << 20, device="cuda")
            assert "| Allocator policy      | expandable" in gpumem.memory_summary()
        """)
        rc, out, err = python("""
            import torch, gpumem
            gpumem.install()
        """, env={"GPUMEM_ALLOC_CONF": "policy:sideways"})
        self.assertNotEqual(rc, 0)
        self.assertIn("gpumem.ConfigError", err)
        self.assertIn("GPUMEM_ALLOC_CONF", err)

    def test_too_late_raises_and_pytorch_keeps_working(self):
        for first in ('torch.empty(1000, device="cuda")', "torch.cuda.init()"):
            out, err = self.check(f"""
                import torch, gpumem
                x = {first}
                try:
                    gpumem.install()
                except gpumem.GpumemError as e:
                    assert "too late" in str(e), e
                else:
                    raise AssertionError("install after CUDA started")
                assert not gpumem.is_installed()
                for f in (gpumem.stats, gpumem.memory_summary):
                    try:
                        f()
                    except gpumem.GpumemError as e:
                        assert "not PyTorch's CUDA allocator" in str(e), e
                    else:
                        raise AssertionError(f)
                y = torch.empty(1000, device="cuda")  # PyTorch's allocator, as before
                assert "gpumem" not in torch.cuda.memory_summary()
            """)
            self.assertNotIn("did not install", err)

    def test_a_torch_other_than_the_build_one_is_refused(self):
        self.check("""
            import torch, gpumem, gpumem._build_info as info
            info.TORCH_VERSION = "2.0.0+other"
            try:
                gpumem.install()
            except gpumem.GpumemError as e:
                assert "built against torch 2.0.0+other" in str(e), e
                assert torch.__version__ in str(e), e
            else:
                raise AssertionError("install with another torch")
            assert not gpumem.is_installed()
        """)

    def test_gpumem_auto_install_installs_when_torch_is_imported(self):
        out, _ = self.check("""
            import sys
            assert "gpumem" not in sys.modules or not sys.modules["gpumem"].is_installed()
            import torch
            x = torch.empty(1 << 20, device="cuda")
            import gpumem
            assert gpumem.is_installed()
            print(gpumem.memory_summary())
        """, env={"GPUMEM_AUTO_INSTALL": "1", "GPUMEM_ALLOC_CONF": "policy:classic"})
        self.assertIn("| Allocator policy      | classic", out)
        self.check("""
            import torch, gpumem
            x = torch.empty(1 << 20, device="cuda")
            assert not gpumem.is_installed()
            assert "gpumem" not in torch.cuda.memory_summary()
        """, env={"GPUMEM_AUTO_INSTALL": "0"})

    def test_gpumem_auto_install_fails_the_import_of_torch_when_it_cannot(self):
        rc, out, err = python("import torch",
                              env={"GPUMEM_AUTO_INSTALL": "1", "GPUMEM_ALLOC_CONF": "policy:sideways"})
        self.assertNotEqual(rc, 0)
        self.assertIn("GPUMEM_AUTO_INSTALL is set, but gpumem could not be installed", err)
        self.assertIn("sideways", err)

    def test_ld_preload_of_the_plugin(self):
        import gpumem

        out, err = self.check("""
            import torch, gpumem
            assert gpumem.is_installed()
            x = torch.empty(3 << 20, dtype=torch.uint8, device="cuda")
            assert gpumem.stats() == torch.cuda.memory_stats()
            assert gpumem.stats()["allocated_bytes.all.current"] == 3 << 20
            assert "| Allocator policy      | classic" in gpumem.memory_summary()
            gpumem.install()  # installed already: nothing to do
        """, env={"GPUMEM_ALLOC_CONF": "policy:classic"}, preload=[gpumem.plugin_path()])
        self.assertNotIn("did not install", err)
        # Every process started with it loads torch's libraries, Python without torch too.
        self.check("import sys; assert 'torch' not in sys.modules",
                   preload=[gpumem.plugin_path()])


def main():
    global MODE, SOURCE, CUDASIM
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["full", "no-torch", "no-cuda"], required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--cudasim", default="")
    args, rest = parser.parse_known_args()
    MODE, SOURCE, CUDASIM = args.mode, os.path.abspath(args.source), args.cudasim
    classes = [ReplayTest] + ([PluginTest] if MODE == "full" else [ReplayOnlyTest])
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in classes)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    sys.exit(0 if result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
