"""On a CUDA GPU: the mixed-precision training loop of tests/torch/train_loop.py (torch.autocast,
torch.utils.checkpoint on every block, gradient accumulation, GradScaler, clipping, AdamW) with
PyTorch's allocator and with gpumem's plugin under each policy, each in its own process. Prints
the median step time and max_memory_reserved of each, relative to PyTorch's.

    python tests/gpu/train_amp.py PLUGIN [--steps 20] [--width 1024] [--depth 8] [--batch 64]

Exit status 2, with a line starting "skipped:", when no CUDA GPU is usable (ctest counts it as
skipped); 1 when a run fails.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RUNS = [("pytorch", ""), ("gpumem classic", "policy:classic"),
        ("gpumem expandable", "policy:expandable"), ("gpumem stitch", "policy:stitch")]
CONFIGS = [("float16, checkpointed", "float16", True), ("bfloat16, checkpointed", "bfloat16", True),
           ("bfloat16, no checkpointing", "bfloat16", False)]


def worker(args):
    import torch
    if args.worker != "pytorch":
        torch.ops.load_library(args.plugin)  # before the first CUDA tensor
        if ctypes.CDLL(args.plugin).gpumem_installed() != 1:
            sys.exit("gpumem was not installed")
    sys.path.insert(0, os.path.join(HERE, "..", "torch"))
    import train_loop
    r = train_loop.train(torch.device("cuda"), steps=args.steps, accumulate=4, width=args.width,
                         depth=args.depth, batch=args.batch, dtype=getattr(torch, args.dtype),
                         checkpointed=args.checkpointed, matmul=not args.no_matmul)
    print(json.dumps(r))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plugin")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--no-matmul", action="store_true",
                        help="elementwise blocks (a dry run on the CUDA simulator, without cuBLAS)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float16", help=argparse.SUPPRESS)
    parser.add_argument("--checkpointed", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)

    import torch
    if not torch.cuda.is_available():
        print("skipped: train_amp.py needs a CUDA GPU (torch.cuda.is_available() is False)")
        return 2
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name()}; width {args.width}, "
          f"depth {args.depth}, batch {args.batch} x 4 micro-batches, {args.steps} steps")
    failed = False
    for label, dtype, checkpointed in CONFIGS:
        print(f"\n{label}:")
        print(f"{'allocator':20} {'ms/step':>9} {'max reserved':>16} {'vs pytorch':>11}")
        base = None
        for name, conf in RUNS:
            env = dict(os.environ, GPUMEM_ALLOC_CONF=conf)
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
            p = subprocess.run([sys.executable, __file__, args.plugin, "--worker", name,
                                "--steps", str(args.steps), "--width", str(args.width),
                                "--depth", str(args.depth), "--batch", str(args.batch),
                                "--dtype", dtype, "--checkpointed", str(int(checkpointed))]
                               + (["--no-matmul"] if args.no_matmul else []),
                               env=env, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                print(f"{name:20} FAILED\n{p.stdout}{p.stderr}")
                failed = True
                continue
            r = json.loads(p.stdout.strip().splitlines()[-1])
            base = base or r
            print(f"{name:20} {r['step_ms']:>9.2f} {r['max_memory_reserved']:>16,} "
                  f"{r['max_memory_reserved'] / base['max_memory_reserved']:>10.3f}x")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
