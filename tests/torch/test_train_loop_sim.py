"""A mixed-precision training loop (tests/torch/train_loop.py: torch.autocast, torch.utils.checkpoint,
gradient accumulation, GradScaler, clipping, AdamW) run by PyTorch on the strict CUDA simulator,
under gpumem's plugin with each policy and under PyTorch's own allocator.

    python tests/torch/test_train_loop_sim.py PLUGIN CUDASIM_DIR [unittest arguments]

Each run is a fresh Python with GPUMEM_SIM_STRICT=abort (tests/torch/test_torch_sim.py): a
violation of the GPU's rules kills it. Inside, the blocks record what they saw each time they ran
— the forward and checkpoint's recomputation — and the test checks it was CUDA autocast in the
requested dtype both times.
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_torch_sim as sim  # noqa: E402  (the simulator's runner and the allocators)

LOOP = f"""
import json
sys.path.insert(0, {HERE!r})
import train_loop
steps, accumulate, depth = 3, 4, 4
for dtype in (torch.float16, torch.bfloat16):
    for reentrant in (False, True):
        seen = []
        before = counters()
        r = train_loop.train(torch.device("cuda"), steps=steps, accumulate=accumulate,
                             depth=depth, dtype=dtype, use_reentrant=reentrant, matmul=False,
                             record=seen)
        after = counters()
        # Every block ran twice per micro-batch (forward, recomputation), both under autocast.
        assert len(seen) == 2 * depth * accumulate * steps, len(seen)
        assert set(seen) == {{(True, dtype, dtype)}}, set(seen)
        assert after.kernel_launches > before.kernel_launches
        assert r["max_memory_reserved"] > 0 and r["max_memory_allocated"] > 0, r
        print(json.dumps(dict(r, dtype=str(dtype), reentrant=reentrant)))
assert counters().violations == 0, last_violation()
"""


class TrainLoopTest(sim.SimTest):
    def test_autocast_checkpoint_and_accumulation_under_every_allocator(self):
        self.each_allocator(LOOP)

    def test_the_recorded_state_would_show_a_recomputation_without_autocast(self):
        # The control: a block that runs outside autocast is seen as such.
        out, _ = self.check(f"""
            sys.path.insert(0, {HERE!r})
            import train_loop
            seen = []
            train_loop.train(torch.device("cuda"), steps=1, accumulate=1, depth=1,
                             dtype=torch.float16, checkpointed=False, matmul=False, record=seen)
            block = train_loop.Block(8, False, seen).cuda()
            block(torch.ones(2, 8, device="cuda"))
            print(seen[-1])
        """)
        self.assertIn("(False, torch.float16, torch.float32)", out)


if __name__ == "__main__":
    sim.PLUGIN, sim.CUDASIM = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[3:])
