"""torch.cuda.memory._set_allocator_settings while memory is live, on the CUDA simulator: one
sequence of allocations and setting changes under PyTorch's own allocator (the oracle) and under
each gpumem policy (libgpumem_torch.so loaded), compared step by step.

    python tests/torch/test_allocator_settings.py PLUGIN CUDASIM_DIR

Under gpumem's classic policy every statistic of torch.cuda.memory_stats() must equal PyTorch's
(same rounding, splits, oversize refusals, garbage collection, segments); under expandable and
stitch, whose segments differ by design, the statistics of the allocations themselves must.
"""

import json
import os
import sys
import unittest

import test_plugin

# Each step allocates or frees after a settings change; the statistics after it are printed.
SEQUENCE = """
import json
def mib(n, extra=0):
    return torch.empty(n * MiB + extra, dtype=torch.uint8, device="cuda")
steps = []
def step(name):
    steps.append((name, torch.cuda.memory_stats()))
settings = torch.cuda.memory._set_allocator_settings

torch.cuda.empty_cache()
settings("")
x = mib(84)
step("no rounding")
settings("roundup_power2_divisions:4")
y = mib(84)  # 96 MiB
step("roundup_power2_divisions:4")
settings("garbage_collection_threshold:0.5,max_split_size_mb:40")
y2 = mib(84)  # the divisions were reset: 84 MiB
step("reset by the next settings")
z = mib(50)
del z
w = mib(30)  # below max_split_size: the cached 50 MiB block is refused
step("max_split_size_mb:40 refuses an oversize block")
settings("")
q = mib(45)  # no limit now: the cached 50 MiB block splits
step("max_split_size unset again")
settings("roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
v = mib(100, 1)  # [64, 128) MiB in 8 steps: 104 MiB
u = mib(300, 1)  # [256, 512) MiB in 2 steps: 384 MiB
step("roundup_power2_divisions list")
del x, y, y2, w, q, v, u
torch.cuda.empty_cache()
step("empty")
settings("")
torch.cuda.set_per_process_memory_fraction(0.9)
a, b = mib(300), mib(300)
del a
settings("garbage_collection_threshold:0.5")
c = mib(350)  # 600 MiB reserved > 0.5 x 0.9 x 1 GiB: the cached 300 MiB block is collected
step("garbage_collection_threshold:0.5")
del b, c
settings("max_split_size_mb:40")
d = mib(120)
del d
settings("")
e = mib(60)  # splits the 120 MiB block, counted oversize when it was made
del e
torch.cuda.empty_cache()
step("oversize counters across a change")
print("STEPS" + json.dumps(steps))
"""

# What the allocations themselves decide, whatever the segments.
ALLOCATION_KEYS = ("allocated_bytes", "requested_bytes", "active_bytes", "allocation", "active",
                   "max_split_size")


def run_sequence(case, gpumem_policy):
    env = {"GPUMEM_SIM_MEMORY": "1GiB"}
    if gpumem_policy:
        env["GPUMEM_ALLOC_CONF"] = f"policy:{gpumem_policy}"
    rc, out, err = test_plugin.run(SEQUENCE, env, load_first=gpumem_policy is not None)
    case.assertEqual(rc, 0, f"stdout:\n{out}\nstderr:\n{err}")
    if gpumem_policy:
        case.assertNotIn("gpumem: ", err)
    return json.loads(out[out.index("STEPS") + len("STEPS"):])


class AllocatorSettingsAtRunTime(unittest.TestCase):
    oracle = None

    @classmethod
    def pytorch(cls, case):
        if cls.oracle is None:
            cls.oracle = run_sequence(case, None)
        return cls.oracle

    def compare(self, policy, keys):
        expected = self.pytorch(self)
        got = run_sequence(self, policy)
        self.assertEqual([name for name, _ in got], [name for name, _ in expected])
        for (name, want), (_, have) in zip(expected, got):
            for key, value in want.items():
                if keys is not None and not key.startswith(keys):
                    continue
                self.assertIn(key, have, f"{policy}, {name}")
                self.assertEqual(have[key], value, f"{policy}, after '{name}': {key}")

    def test_the_oracle_sees_each_setting(self):
        steps = dict(self.pytorch(self))
        allocated = "allocated_bytes.all.current"
        self.assertEqual(steps["roundup_power2_divisions:4"][allocated] -
                         steps["no rounding"][allocated], 96 * 2**20)
        self.assertEqual(steps["reset by the next settings"][allocated] -
                         steps["roundup_power2_divisions:4"][allocated], 84 * 2**20)
        self.assertEqual(steps["garbage_collection_threshold:0.5"]["num_device_free"] -
                         steps["empty"]["num_device_free"], 1)

    def test_classic_matches_every_statistic(self):
        self.compare("classic", None)

    def test_expandable_matches_the_allocations(self):
        self.compare("expandable", ALLOCATION_KEYS)

    def test_stitch_matches_the_allocations(self):
        self.compare("stitch", ALLOCATION_KEYS)


if __name__ == "__main__":
    test_plugin.PLUGIN = os.path.abspath(sys.argv[1])
    test_plugin.CUDASIM = os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[3:])
