"""A small mixed-precision training loop: torch.autocast, torch.utils.checkpoint on every block,
gradient accumulation, torch.amp.GradScaler (float16) and gradient clipping, with AdamW.

Shared by tests/torch/test_train_loop_sim.py (PyTorch on the CUDA simulator, under every
allocator) and tests/gpu/train_amp.py (the same loop on a real GPU, timed). On the simulator the
blocks use no matrix product (cuBLAS does not start there): `matmul=False` replaces each block's
two Linear layers by an elementwise scale and a PReLU, which autocast also runs in the
lower-precision dtype.
"""

import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop


class Block(torch.nn.Module):
    def __init__(self, width, matmul, record):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)  # autocast runs it in float32
        self.matmul = matmul
        self.record = record
        if matmul:
            self.fc1 = torch.nn.Linear(width, 4 * width)
            self.fc2 = torch.nn.Linear(4 * width, width)
        else:
            self.scale = torch.nn.Parameter(torch.ones(width))
            self.prelu = torch.nn.PReLU(width)

    def forward(self, x):
        h = self.norm(x)
        if self.matmul:
            h = self.fc2(F.gelu(self.fc1(h)))
        else:
            h = self.prelu(h * self.scale)
        if self.record is not None:
            device = x.device.type
            self.record.append((torch.is_autocast_enabled(device),
                                torch.get_autocast_dtype(device), h.dtype))
        return x + h


class Model(torch.nn.Module):
    def __init__(self, width, depth, matmul, record=None):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width, matmul, record) for _ in range(depth))
        self.head = torch.nn.LayerNorm(width)

    def forward(self, x, checkpointed, use_reentrant):
        for block in self.blocks:
            if checkpointed:
                x = checkpoint(block, x, use_reentrant=use_reentrant)
            else:
                x = block(x)
        return self.head(x)


def train(device, *, steps=3, accumulate=4, width=256, depth=4, batch=16, dtype=torch.float16,
          checkpointed=True, use_reentrant=False, matmul=True, record=None, seed=0):
    """Trains `steps` optimizer steps of `accumulate` micro-batches; returns a dict with the median
    step time (ms, after the first step), max_memory_reserved and max_memory_allocated (bytes)."""
    torch.manual_seed(seed)
    model = Model(width, depth, matmul, record).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    x = torch.randn(accumulate, batch, width, device=device)
    y = torch.randn(accumulate, batch, width, device=device)
    # With a record, the non-reentrant recomputation runs to the end of each block (by default it
    # stops once the tensors backward needs are back, before the block records what it saw).
    with set_checkpoint_early_stop(record is None):
        return _loop(device, model, optimizer, scaler, x, y, steps, accumulate, dtype,
                     checkpointed, use_reentrant)


def _loop(device, model, optimizer, scaler, x, y, steps, accumulate, dtype, checkpointed,
          use_reentrant):
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        for micro in range(accumulate):
            # The re-entrant form computes gradients only when an input of the checkpoint requires
            # them: the first block's input is made to (PyTorch's documented workaround).
            inp = x[micro].detach().requires_grad_(checkpointed and use_reentrant)
            with torch.autocast(device.type, dtype=dtype):
                out = model(inp, checkpointed, use_reentrant)
                loss = F.mse_loss(out.float(), y[micro]) / accumulate
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    timed = times[1:] or times
    return {
        "step_ms": 1000.0 * statistics.median(timed),
        "max_memory_reserved": torch.cuda.max_memory_reserved(device),
        "max_memory_allocated": torch.cuda.max_memory_allocated(device),
    }
