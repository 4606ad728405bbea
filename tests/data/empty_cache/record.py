"""Records the snapshots in this folder with PyTorch's own caching allocator on gpumem's CUDA
simulator (a 1 GiB device): a program that empties the cache between phases, next to the
allocator's own releases (an out-of-memory retry that succeeds, one that fails) and, in gc.pickle,
garbage_collection_threshold. tests/test_pytorch_snapshot.cpp checks which releases the reader
takes for empty_cache calls and that classic replays them to PyTorch's peak.

    LD_PRELOAD=build/cudasim/libcudart.so.13:build/cudasim/libcuda.so.1 GPUMEM_SIM_MEMORY=1GiB \
        .venv-torch/bin/python tests/data/empty_cache/record.py OUT.pickle main|gc
(PYTORCH_CUDA_ALLOC_CONF: "" for classic.pickle, expandable_segments:True for expandable.pickle,
garbage_collection_threshold:0.6 for gc.pickle; recorded with torch 2.11.)
"""
import sys

import torch

MiB = 1 << 20
torch.cuda.memory._record_memory_history(max_entries=100000)
d = "cuda"
if sys.argv[2] == "gc":
    torch.cuda.set_per_process_memory_fraction(0.5)
    xs = [torch.empty(100 * MiB, dtype=torch.uint8, device=d) for _ in range(4)]
    del xs
    y = torch.empty(150 * MiB, dtype=torch.uint8, device=d)  # collects garbage first
    del y
    torch.cuda.empty_cache()
    z = torch.empty(120 * MiB, dtype=torch.uint8, device=d)
else:
    # 1. empty_cache, then memory of another shape: no released segment fits the next request.
    a = torch.empty(40 * MiB, dtype=torch.uint8, device=d)
    b = torch.empty(40 * MiB, dtype=torch.uint8, device=d)
    del a, b
    torch.cuda.empty_cache()
    c = torch.empty(100 * MiB, dtype=torch.uint8, device=d)
    # 2. empty_cache, then a request that the released segment would have held.
    e = torch.empty(20 * MiB, dtype=torch.uint8, device=d)
    del e
    torch.cuda.empty_cache()
    f = torch.empty(20 * MiB, dtype=torch.uint8, device=d)
    del c, f
    # 3. an out-of-memory retry that succeeds: the device full of cached 100 MiB segments, then
    # 250 MiB, which only fits once they are released.
    xs = []
    while torch.cuda.mem_get_info()[0] >= 100 * MiB:
        xs.append(torch.empty(100 * MiB, dtype=torch.uint8, device=d))
    del xs
    big = torch.empty(250 * MiB, dtype=torch.uint8, device=d)
    del big
    # 4. an out-of-memory that fails, then empty_cache and new memory.
    try:
        torch.empty(4096 * MiB, dtype=torch.uint8, device=d)
    except torch.OutOfMemoryError:
        pass
    g = torch.empty(30 * MiB, dtype=torch.uint8, device=d)
    del g
    torch.cuda.empty_cache()
    h = torch.empty(60 * MiB, dtype=torch.uint8, device=d)
torch.cuda.memory._dump_snapshot(sys.argv[1])
