"""Train a small transformer with gpumem as PyTorch's CUDA allocator (or PyTorch's own, to
compare), then print torch.cuda.memory_summary() and the peaks.

    python examples/python/train_with_gpumem.py --plugin build/tools/torch_plugin/libgpumem_torch.so
    python examples/python/train_with_gpumem.py --allocator pytorch        # the same, without gpumem

gpumem's settings come from GPUMEM_ALLOC_CONF (e.g. "policy:stitch") on top of PyTorch's
PYTORCH_CUDA_ALLOC_CONF. The plugin must be loaded before the first CUDA tensor.
"""

import argparse
import ctypes
import json
import os
import sys
import time

DEFAULT_PLUGIN = os.path.join(os.path.dirname(__file__), "..", "..", "build", "tools",
                              "torch_plugin", "libgpumem_torch.so")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocator", choices=["gpumem", "pytorch"], default="gpumem")
    parser.add_argument("--plugin", default=DEFAULT_PLUGIN, help="path of libgpumem_torch.so")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="print one JSON line of results last")
    args = parser.parse_args()
    if args.steps < 1 or args.batch < 1:
        parser.error("--steps and --batch must be at least 1")

    import torch  # noqa: E402  (after the arguments: --help works without torch)

    if args.allocator == "gpumem":
        if not os.path.exists(args.plugin):
            parser.error(f"{args.plugin} does not exist: build gpumem with torch "
                         "(bash tools/test.sh) or pass --plugin")
        torch.ops.load_library(args.plugin)  # before the first CUDA tensor
        if ctypes.CDLL(args.plugin).gpumem_installed() != 1:
            sys.exit("gpumem was not installed (its message above says why)")
    if not torch.cuda.is_available():
        sys.exit("this example needs a CUDA GPU")

    torch.manual_seed(0)
    device = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048)
    model = torch.nn.TransformerEncoder(layer, num_layers=6).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    start = None
    for step in range(args.steps):
        if step == 10:  # leave the warm-up out of the step time
            torch.cuda.synchronize()
            start = time.perf_counter()
        length = 64 + (step * 37) % 448  # varying sequence lengths, as real batches have
        x = torch.randn(length, args.batch, 512, device=device)
        loss = torch.nn.functional.mse_loss(model(x), x)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    torch.cuda.synchronize()
    timed = max(args.steps - 10, 1)
    step_ms = (time.perf_counter() - start) * 1000 / timed if start else float("nan")

    print(torch.cuda.memory_summary())
    results = {
        "allocator": args.allocator,
        "steps": args.steps,
        "step_ms": round(step_ms, 3),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "num_device_alloc": torch.cuda.memory_stats().get("num_device_alloc"),
    }
    print(f"{args.allocator}: max_memory_reserved {results['max_memory_reserved']:,} B, "
          f"max_memory_allocated {results['max_memory_allocated']:,} B, {step_ms:.2f} ms/step")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
