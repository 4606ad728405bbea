"""Snapshots on out-of-memory, per rank, with PyTorch itself on the CUDA simulator: the oom_snapshot
key of libgpumem_torch.so in a two-rank job, and gpumem.snapshot_on_oom (the Python package, from
the source tree) with PyTorch's own allocator and with gpumem's; each snapshot replayed by
gpumem-replay to the request that failed.

    python tests/torch/test_oom_snapshot.py PLUGIN CUDASIM_DIR GPUMEM_REPLAY SOURCE_DIR

The two ranks meet through torch.distributed's gloo backend on 127.0.0.1 (GLOO_SOCKET_IFNAME=lo):
nothing leaves the machine.
"""

import glob
import json
import os
import pickle
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import unittest

import test_plugin

REPLAY = ""
SOURCE = ""

# The package from the source tree: its _build_info is written by the package's build, so a stand-in
# takes its place (no plugin in this "installation": the plugin is loaded by path where needed).
IMPORT_GPUMEM = """
import types
sys.path.insert(0, {python!r})
info = types.ModuleType("gpumem._build_info")
info.VERSION, info.PLUGIN, info.PLUGIN_WHY, info.TORCH_VERSION = "0", False, "source tree", ""
sys.modules["gpumem._build_info"] = info
import gpumem
"""

# One rank of a job: 16 steps, each keeping (48 + 48 * rank) MiB and using 20 MiB of scratch. On a
# 1 GiB device rank 0 completes and rank 1 runs out of memory. Rank 0, which completes, dumps its
# own snapshot at the end (as a job may), so that the replay has every rank to compare.
RANK = """
import os
import torch.distributed as dist
rank = int(os.environ["RANK"])
out_dir = os.environ["OUT_DIR"]
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank,
                        world_size=2)
torch.cuda.memory._record_memory_history(max_entries=10000)
keep = []
try:
    for step in range(16):
        keep.append(torch.empty((48 + 48 * rank) * MiB + 1000, dtype=torch.uint8, device="cuda"))
        scratch = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
        del scratch
    print("completed")
    torch.cuda.memory._dump_snapshot(os.path.join(out_dir, f"rank{rank}-at-the-end.pickle"))
except torch.OutOfMemoryError:
    print(f"out of memory at step {step}")
dist.barrier()
dist.destroy_process_group()
"""


def free_loopback_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def replay_json(paths):
    p = subprocess.run([REPLAY, *paths, "--json", "--progress", "never"], capture_output=True,
                       text=True, timeout=300, check=False)
    return p.returncode, p.stdout, p.stderr


class OomSnapshotTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="gpumem-oom-")

    def tearDown(self):
        for f in glob.glob(os.path.join(self.dir, "*")):
            os.remove(f)
        os.rmdir(self.dir)

    def assert_written(self, err, rank):
        """The one stderr line of a snapshot: its path, with rank, host and pid, and the command
        that replays it. Returns the path."""
        m = re.search(r"gpumem: out of memory on cuda:0: snapshot written to (\S+); replay it "
                      r"with: gpumem-replay (\S+)\n", err)
        self.assertIsNotNone(m, err)
        self.assertEqual(m.group(1), m.group(2))
        host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname())
        self.assertRegex(os.path.basename(m.group(1)),
                         rf"^rank{rank}-{re.escape(host)}-pid[0-9]+-oom[0-9]+\.pickle$")
        self.assertTrue(os.path.isfile(m.group(1)))
        return m.group(1)

    def assert_replays_to_its_failure(self, path, failed_size):
        """The snapshot's oom event carries the request that failed (PyTorch's rounding, 512 B
        granules, or gpumem's exact size), and gpumem-replay runs out of memory at it."""
        with open(path, "rb") as f:
            snapshot = pickle.load(f)
        ooms = [e for e in snapshot["device_traces"][0] if e["action"] == "oom"]
        self.assertEqual(len(ooms), 1, ooms)
        self.assertIn(ooms[0]["size"], (failed_size, (failed_size + 511) // 512 * 512))
        rc, out, err = replay_json([path])
        self.assertEqual(rc, 0, err)
        record = json.loads(out)[0]
        self.assertEqual(record["config"], "recorded")
        self.assertIsNotNone(record["recorded_oom_event"], record)
        self.assertFalse(record["completed"], record)
        self.assertEqual(record["oom_event_index"], record["recorded_oom_event"])

    def test_two_ranks_one_out_of_memory_with_the_oom_snapshot_key(self):
        port = str(free_loopback_port())
        procs = []
        for rank in (0, 1):
            env = dict(os.environ)
            for var in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
                        "LOCAL_RANK"):
                env.pop(var, None)
            env.update(LD_PRELOAD=f"{test_plugin.CUDASIM}/libcudart.so.13:"
                                  f"{test_plugin.CUDASIM}/libcuda.so.1",
                       GPUMEM_SIM_MEMORY="1GiB", GPUMEM_SIM_STRICT="abort",
                       GPUMEM_ALLOC_CONF=f"oom_snapshot:{self.dir}", RANK=str(rank),
                       WORLD_SIZE="2", PORT=port, OUT_DIR=self.dir, GLOO_SOCKET_IFNAME="lo")
            script = (test_plugin.PRELUDE + f"lib = ctypes.CDLL({test_plugin.PLUGIN!r})\n" +
                      textwrap.dedent(RANK))
            procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        (out0, err0), (out1, err1) = [p.communicate(timeout=300) for p in procs]
        self.assertEqual(procs[0].returncode, 0, err0)
        self.assertEqual(procs[1].returncode, 0, err1)
        self.assertIn("completed", out0)
        self.assertIn("out of memory at step", out1)
        # Only the rank that ran out of memory writes a snapshot (the other, its own at the end).
        self.assertNotIn("snapshot written", err0)
        failing = self.assert_written(err1, 1)
        names = sorted(os.listdir(self.dir))
        self.assertEqual(names, sorted([os.path.basename(failing), "rank0-at-the-end.pickle"]))
        self.assert_replays_to_its_failure(failing, 96 * (1 << 20) + 1000)

        # gpumem-replay DIR/*.pickle: every rank replayed, the one that ran out of memory first.
        paths = sorted(glob.glob(os.path.join(self.dir, "*.pickle")))
        p = subprocess.run([REPLAY, *paths, "--progress", "never"], capture_output=True,
                           text=True, timeout=300, check=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        table = p.stdout[p.stdout.index("=== 2 traces, worst first ==="):]
        rows = [line for line in table.splitlines() if line.startswith(self.dir)]
        self.assertEqual(len(rows), 2, table)
        self.assertIn(os.path.basename(failing), rows[0])
        event = re.search(r"OOM at event (\d+) +OOM at event (\d+)", rows[0])
        self.assertIsNotNone(event, table)
        self.assertEqual(event.group(1), event.group(2))  # reproduced at the recorded event
        self.assertIn("completed", rows[1])
        self.assertIn(f"{os.path.basename(failing)} (out of memory at event {event.group(1)}, "
                      "as recorded)", table)

    def snapshot_on_oom(self, with_gpumem):
        """gpumem.snapshot_on_oom, then two out-of-memory errors, the first caught: two snapshots,
        the second replaying to its own failure, past the first."""
        code = IMPORT_GPUMEM.format(python=os.path.join(SOURCE, "python")) + textwrap.dedent(f"""
            gpumem.snapshot_on_oom({self.dir!r}, max_entries=1000)
            keep = [torch.empty(100 * MiB + 5, dtype=torch.uint8, device="cuda") for _ in range(3)]
            for size in (1900 * MiB + 7, 1800 * MiB + 9):
                try:
                    torch.empty(size, dtype=torch.uint8, device="cuda")
                    raise SystemExit(f"{{size}} bytes fit")
                except torch.OutOfMemoryError:
                    pass
                keep.append(torch.empty(10 * MiB, dtype=torch.uint8, device="cuda"))
        """)
        rc, out, err = test_plugin.run(code, {"GPUMEM_SIM_MEMORY": "2GiB"},
                                       load_first=with_gpumem)
        self.assertEqual(rc, 0, f"stdout:\n{out}\nstderr:\n{err}")
        self.assertEqual(err.count("snapshot written to"), 2, err)
        first, second = re.findall(r"snapshot written to (\S+);", err)
        self.assertTrue(first.endswith("-oom1.pickle") and second.endswith("-oom2.pickle"))
        self.assert_written(err, 0)
        self.assert_replays_to_its_failure(first, 1900 * (1 << 20) + 7)
        self.assert_replays_to_its_failure(second, 1800 * (1 << 20) + 9)

    def test_snapshot_on_oom_with_pytorchs_allocator(self):
        self.snapshot_on_oom(with_gpumem=False)

    def test_snapshot_on_oom_with_gpumem(self):
        self.snapshot_on_oom(with_gpumem=True)


if __name__ == "__main__":
    test_plugin.PLUGIN, test_plugin.CUDASIM, REPLAY, SOURCE = sys.argv[1:5]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    unittest.main(argv=[sys.argv[0], *sys.argv[5:]], verbosity=2)
