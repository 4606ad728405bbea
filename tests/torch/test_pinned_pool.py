"""Pinned-memory pools (torch 2.11+) on the CUDA simulator: PyTorch's allocator and each gpumem
policy (libgpumem_torch.so loaded) run the same sequences, which are compared step by step.

    python tests/torch/test_pinned_pool.py PLUGIN CUDASIM_DIR

Since torch 2.11 a CUDA graph's capture gives PyTorch's pinned host allocator (CachingHostAllocator,
which gpumem does not replace) a private pool with the graph's pool id: `pin_memory` tensors made
on the capturing stream come from that pool, are reused only inside it (and never once a copy on a
stream used them during the capture), and go back to the system at `_host_emptyCache` only after
every graph sharing the pool was reset. CUDAGraph::capture_begin, capture_end and reset make the
same calls on the CUDA allocator (beginAllocateToPool, endAllocateToPool, releasePool with the
same id), which is where gpumem takes part, also when the pool id is a MemPool's. Each sequence
asserts PyTorch's behaviour where it runs and prints what it saw (host statistics, the simulator's
cudaHostAlloc / cudaFreeHost counts, which pool each tensor went to); gpumem's record must equal
PyTorch's under every policy, and gpumem must report nothing on stderr.
"""

import importlib.metadata
import json
import os
import re
import sys
import unittest

import test_plugin

POLICIES = ("classic", "expandable", "stitch")

COMMON = """
record = []

def host():
    s = torch.cuda.host_memory_stats()
    return {k: v for k, v in s.items() if not k.startswith(("host_alloc_time", "host_free_time"))}

def step(name, **facts):
    c = counters()
    record.append(dict(step=name, host=host(), cudaHostAlloc=c.host_alloc,
                       cudaFreeHost=c.host_free, device_allocated=torch.cuda.memory_allocated(),
                       **facts))

def pinned(n):
    t = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    assert t.is_pinned()
    return t

def host_allocs():
    return torch.cuda.host_memory_stats()["num_host_alloc"]

def pool_of(t):
    addr = t.data_ptr()
    for s in torch.cuda.memory_snapshot():
        if s["address"] <= addr < s["address"] + s["total_size"]:
            return tuple(s["segment_pool_id"])
    raise AssertionError(f"{addr:#x} is in no segment")

x = torch.zeros(1 << 20, device="cuda")
torch.cuda.synchronize()
"""

# A graph's pinned pool: allocation, reuse inside the pool, no reuse of a block a capture copied
# from, a second graph sharing the pool, and the pool's lifetime.
CAPTURE = """
outside = pinned(1000)                       # the default pool
step("default pool")
g1 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g1):
    n = host_allocs()
    a = pinned(1000)                         # the graph's pool: a new block
    assert host_allocs() == n + 1
    a_ptr = a.data_ptr()
    del a                                    # no stream used it: free in the pool at once
    b = pinned(1000)
    assert b.data_ptr() == a_ptr, "a block freed in the capture is reused in the pool"
    y = x * 2
    r = pinned(4096)
    r_ptr = r.data_ptr()
    y2 = r.to("cuda", non_blocking=True)     # the capture copies from it: an event on the stream
    del r
    r_again = pinned(4096)
    assert r_again.data_ptr() != r_ptr, "a block a capture used is never reused"
step("after the first capture")
b_ptr = b.data_ptr()
del b, r_again
n = host_allocs()
o = pinned(1000)                             # outside the capture: not the graph's free block
assert o.data_ptr() != b_ptr and host_allocs() == n + 1
step("outside the capture")
g2 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g2, pool=g1.pool()):   # the same pool, on host as on device
    z = y * 2
    n = host_allocs()
    c = pinned(1000)
    assert c.data_ptr() == b_ptr and host_allocs() == n, "the shared pool's free block is reused"
    r2 = pinned(4096)
    assert r2.data_ptr() != r_ptr, "a block a capture used is never reused"
pid = g1.pool()
def pool_segments():
    return len([s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == pid])
assert pool_segments() > 0 and pool_of(y) == pid and pool_of(z) == pid
step("second graph on the shared pool")
del c, r2
freed = torch.cuda.host_memory_stats()["num_host_free"]
torch._C._host_emptyCache()
assert torch.cuda.host_memory_stats()["num_host_free"] == freed, "the pool lives with its graphs"
step("host empty_cache while both graphs live")
g1.replay()
g2.replay()
torch.cuda.synchronize()
del g1
torch._C._host_emptyCache()
assert torch.cuda.host_memory_stats()["num_host_free"] == freed, "g2 still holds the pool"
step("host empty_cache with g2 alive")
del g2
torch._C._host_emptyCache()
assert torch.cuda.host_memory_stats()["num_host_free"] > freed, "the released pool is freed"
step("host empty_cache after both graphs")
del y, y2, z, o
torch.cuda.empty_cache()
assert pool_segments() == 0, "the released device pool went back to the device"
step("device empty_cache", pool_segments=pool_segments())
print("RECORD " + json.dumps(record))
"""

# A device MemPool at the same time: use_mem_pool routes device tensors only; a graph captured
# into a MemPool's id gives the host side a pool of that id; a capture under use_mem_pool.
MEMPOOL = """
mp = torch.cuda.MemPool()
with torch.cuda.use_mem_pool(mp):
    d = torch.empty(1 << 20, device="cuda")
    h = pinned(1000)                         # pinned memory ignores use_mem_pool
assert pool_of(d) == mp.id
h_ptr = h.data_ptr()
del h
n = host_allocs()
h2 = pinned(1000)
assert h2.data_ptr() == h_ptr and host_allocs() == n, "the default pool's block is reused"
step("use_mem_pool", device_pool_is_mp=pool_of(d) == mp.id)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, pool=mp.id):
    y = x * 2
    n = host_allocs()
    p = pinned(1000)
    assert host_allocs() == n + 1 and p.data_ptr() != h2.data_ptr()
assert pool_of(y) == mp.id and mp.use_count() == 2, mp.use_count()
step("graph captured into the MemPool", use_count=mp.use_count(),
     device_pool_is_mp=pool_of(y) == mp.id)
p_ptr = p.data_ptr()
del p
n = host_allocs()
with torch.cuda.use_mem_pool(mp):
    q = pinned(1000)                         # not the graph's pinned pool
assert q.data_ptr() != p_ptr and host_allocs() == n + 1
del q
step("use_mem_pool after the capture")
g.replay()
torch.cuda.synchronize()
g.reset()
assert mp.use_count() == 1, mp.use_count()
freed = torch.cuda.host_memory_stats()["num_host_free"]
torch._C._host_emptyCache()
assert torch.cuda.host_memory_stats()["num_host_free"] == freed + 2   # p's block and q's
step("graph reset", use_count=mp.use_count())
del y, d, mp, h2
torch.cuda.empty_cache()
step("MemPool destroyed")
mp2 = torch.cuda.MemPool()
g3 = torch.cuda.CUDAGraph()
with torch.cuda.use_mem_pool(mp2):
    with torch.cuda.graph(g3):
        w = x * 3
        n = host_allocs()
        r = pinned(2000)
        assert host_allocs() == n + 1
where = {mp2.id: "mempool", g3.pool(): "graph"}.get(pool_of(w), "other")
step("capture inside use_mem_pool", device_pool=where)
del r, w
g3.reset()
freed = torch.cuda.host_memory_stats()["num_host_free"]
torch._C._host_emptyCache()
assert torch.cuda.host_memory_stats()["num_host_free"] == freed + 1
del g3, mp2
torch.cuda.empty_cache()
step("end")
print("RECORD " + json.dumps(record))
"""


def torch_version():
    match = re.match(r"(\d+)\.(\d+)", importlib.metadata.version("torch"))
    return (int(match.group(1)), int(match.group(2)))


def record_of(case, code, plugin, policy=None):
    env = {"GPUMEM_ALLOC_CONF": f"policy:{policy}"} if policy else {}
    rc, out, err = test_plugin.run(COMMON + code, env, load_first=plugin)
    who = f"gpumem {policy}" if plugin else "PyTorch's allocator"
    case.assertEqual(rc, 0, f"{who}\nstdout:\n{out}\nstderr:\n{err}")
    if plugin:
        case.assertNotIn("gpumem: ", err)
    lines = [line for line in out.splitlines() if line.startswith("RECORD ")]
    case.assertEqual(len(lines), 1, out)
    return json.loads(lines[0][len("RECORD "):])


@unittest.skipIf(torch_version() < (2, 11), "pinned-memory pools came with torch 2.11")
class PinnedPoolTest(unittest.TestCase):
    def compare(self, code):
        expected = record_of(self, code, plugin=False)
        self.assertGreater(len(expected), 3)
        for policy in POLICIES:
            got = record_of(self, code, plugin=True, policy=policy)
            for want, have in zip(expected, got):
                self.assertEqual(want, have, f"policy {policy}, step {want['step']!r}")
            self.assertEqual(len(expected), len(got), policy)

    def test_a_graphs_pinned_pool_reuse_and_lifetime(self):
        self.compare(CAPTURE)

    def test_pinned_pools_beside_a_device_mempool(self):
        self.compare(MEMPOOL)


if __name__ == "__main__":
    test_plugin.PLUGIN = os.path.abspath(sys.argv[1])
    test_plugin.CUDASIM = os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[3:])
