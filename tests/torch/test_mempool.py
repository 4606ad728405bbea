"""torch.cuda.MemPool and torch.cuda.use_mem_pool on the CUDA simulator, with gpumem as PyTorch's
CUDA allocator (libgpumem_torch.so loaded) or with PyTorch's own allocator.

    python tests/torch/test_mempool.py PLUGIN CUDASIM_DIR DUMMY_ALLOCATOR {gpumem|pytorch}

Every test runs a fresh Python on the simulator (test_plugin.run) and fails when that Python fails,
aborts included. The same checks run under both allocators, since what PyTorch's allocator does
with a pool is what gpumem must do (a pool with its own allocator included: the dummy allocator
counts PyTorch's calls to it).

MemPoolTest holds gpumem's own checks. PyTorchTestMemPool repeats PyTorch's TestMemPool
(test/test_cuda.py) test by test, with torch.empty where PyTorch's test launches a kernel (the
simulator runs none); where a check depends on how PyTorch's allocator lays blocks out in
segments, the gpumem run checks the same allocations without the layout.
"""

import os
import sys
import textwrap
import unittest

import test_plugin

DUMMY = ""
GPUMEM = True

PRELUDE = """
import os
import threading
from collections import defaultdict
GPUMEM = {gpumem!r}
DUMMY = {dummy!r}
# Blocks laid out as PyTorch's allocator lays them out: PyTorch's, or gpumem's classic policy.
PYTORCH_LAYOUT = not GPUMEM or os.environ.get("GPUMEM_ALLOC_CONF") == "policy:classic"
nelem_1mb = 1024 * 1024 // 4

def e(nbytes=MiB):
    return torch.empty(nbytes, dtype=torch.uint8, device="cuda")

def segments(pool_id=None):
    if pool_id is None:
        return torch.cuda.memory_snapshot()
    return [s for s in torch.cuda.memory_snapshot(pool_id)
            if tuple(s["segment_pool_id"]) == tuple(pool_id)]

def blocks_in(pool_id):
    # Addresses of the allocated blocks in pool_id's segments.
    return {{b["address"] for s in segments(pool_id) for b in s["blocks"]
            if b["state"] == "active_allocated"}}

def pool_of(t):
    # The id of the pool whose segment holds tensor t.
    addr = t.data_ptr()
    for s in torch.cuda.memory_snapshot():
        if s["address"] <= addr < s["address"] + s["total_size"]:
            return tuple(s["segment_pool_id"])
    raise AssertionError(f"{{addr:#x}} is in no segment")

def dummy_allocator():
    alloc = torch.cuda.memory.CUDAPluggableAllocator(DUMMY, "dummy_alloc", "dummy_free")
    lib = ctypes.CDLL(DUMMY)
    return (alloc, ctypes.c_int.in_dll(lib, "called_dummy_alloc"),
            ctypes.c_int.in_dll(lib, "called_dummy_free"))

"""


def run_check(case, code, env=None):
    """Runs `code` (after PRELUDE) in a fresh Python under the allocator chosen; it must exit 0,
    and gpumem must have reported nothing on stderr."""
    prelude = PRELUDE.format(gpumem=GPUMEM, dummy=DUMMY)
    rc, out, err = test_plugin.run(prelude + textwrap.dedent(code), env, load_first=GPUMEM)
    case.assertEqual(rc, 0, f"stdout:\n{out}\nstderr:\n{err}")
    if GPUMEM:
        case.assertNotIn("gpumem: ", err)
    return out, err


def run_check_policies(case, code):
    """run_check, and for gpumem once more under the classic policy, whose layout of blocks is
    PyTorch's (PYTORCH_LAYOUT): the checks that depend on the layout run there."""
    run_check(case, code)
    if GPUMEM:
        run_check(case, code, {"GPUMEM_ALLOC_CONF": "policy:classic"})


class MemPoolTest(unittest.TestCase):
    def check(self, code, env=None):
        return run_check(self, code, env)

    def test_a_pool_is_made_and_destroyed(self):
        self.check("""
            if GPUMEM:
                assert lib.gpumem_installed() == 1
            p = torch.cuda.MemPool()
            assert p.use_count() == 1
            del p
            for _ in range(50):
                q = torch.cuda.MemPool()
                del q
            x = e()
            assert pool_of(x) == (0, 0)
        """)

    def test_a_pool_destroyed_while_it_holds_tensors_keeps_them_until_they_are_freed(self):
        self.check("""
            w = e(); del w; torch.cuda.empty_cache()
            before = counters().bytes_in_use
            pool = torch.cuda.MemPool()
            pid = pool.id
            with torch.cuda.use_mem_pool(pool):
                x = e(5 * MiB)
            addr = x.data_ptr()
            del pool
            assert torch.cuda.memory_allocated() == 5 * MiB
            assert addr in blocks_in(pid)                # still the pool's block
            y = e(5 * MiB)                               # outside every pool
            assert pool_of(y) == (0, 0)
            del y
            torch.cuda.empty_cache()
            assert addr in blocks_in(pid)
            del x                                        # the pool's last tensor
            torch.cuda.empty_cache()                     # releases what the dead pool cached
            assert not segments(pid), segments(pid)
            assert torch.cuda.memory_reserved() == 0, torch.cuda.memory_reserved()
            assert counters().bytes_in_use == before
        """)

    def test_use_mem_pool_allocates_into_the_pool_and_statistics_count_it(self):
        self.check("""
            pool = torch.cuda.MemPool()
            outside = e(3 * MiB)
            with torch.cuda.use_mem_pool(pool):
                assert pool.use_count() == 2
                x = e(3 * MiB)
                small = e(1000)
            assert pool.use_count() == 1
            after = e(1000)
            assert blocks_in(pool.id) == {x.data_ptr(), small.data_ptr()}, blocks_in(pool.id)
            assert pool_of(x) == pool.id and pool_of(small) == pool.id
            assert pool_of(outside) == (0, 0) and pool_of(after) == (0, 0)
            snap = pool.snapshot()
            assert snap and all(tuple(s["segment_pool_id"]) == pool.id for s in snap), snap
            s = torch.cuda.memory_stats()
            assert s["allocation.all.current"] == 4, s["allocation.all.current"]
            assert s["requested_bytes.all.current"] == 6 * MiB + 2000
            assert s["reserved_bytes.all.current"] == sum(
                seg["total_size"] for seg in torch.cuda.memory_snapshot())
            del x, small
            assert torch.cuda.memory_stats()["allocation.all.current"] == 2
            assert not blocks_in(pool.id)
        """)

    def test_nested_use_mem_pool_allocates_into_the_innermost_pool(self):
        self.check("""
            outer, inner, innermost = (torch.cuda.MemPool() for _ in range(3))
            with torch.cuda.use_mem_pool(outer):
                a = e()
                with torch.cuda.use_mem_pool(inner):
                    b = e()
                    with torch.cuda.use_mem_pool(innermost):
                        c = e()
                        assert outer.use_count() == inner.use_count() == innermost.use_count() == 2
                    d = e()
                    assert innermost.use_count() == 1
                f = e()
            g = e()
            got = [pool_of(t) for t in (a, b, c, d, f, g)]
            want = [outer.id, inner.id, innermost.id, inner.id, outer.id, (0, 0)]
            assert got == want, (got, want)
            # Begun in the other order: the most recently begun pool still wins.
            with torch.cuda.use_mem_pool(innermost):
                with torch.cuda.use_mem_pool(outer):
                    h = e()
                i = e()
            assert (pool_of(h), pool_of(i)) == (outer.id, innermost.id)
        """)

    def test_threads_allocate_into_their_own_pools_at_the_same_time(self):
        self.check("""
            n = 4
            pools = [torch.cuda.MemPool() for _ in range(n)]
            out = [None] * n
            errors = []
            together = threading.Barrier(n + 1)
            def work(i):
                try:
                    with torch.cuda.use_mem_pool(pools[i]):
                        together.wait()          # every pool is being allocated to
                        out[i] = e((i + 1) * MiB)
                        together.wait()
                        torch.cuda.empty_cache()  # leaves the pools' memory alone
                except Exception as ex:
                    errors.append(ex)
                    together.abort()
            threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
            for t in threads:
                t.start()
            together.wait()
            mine = e()                            # this thread is in no pool
            together.wait()
            for t in threads:
                t.join()
            assert not errors, errors
            assert pool_of(mine) == (0, 0)
            for i in range(n):
                assert pool_of(out[i]) == pools[i].id, (i, pool_of(out[i]), pools[i].id)
                assert blocks_in(pools[i].id) == {out[i].data_ptr()}
        """)

    def test_a_pool_with_its_own_allocator_takes_its_segments_from_it(self):
        self.check("""
            alloc, called_alloc, called_free = dummy_allocator()
            torch.cuda.memory._record_memory_history(max_entries=1000)
            p = torch.cuda.MemPool(alloc.allocator())
            assert called_alloc.value == 0
            with torch.cuda.use_mem_pool(p):
                x = e()
                y = e(30 * MiB)
            assert pool_of(x) == p.id and pool_of(y) == p.id
            assert called_alloc.value == 123 and called_free.value == 0
            # PyTorch's segment sizes, whatever the policy: 2 MiB for 1 MiB, 30 MiB for 30 MiB.
            pool_segments = {s["address"]: s["total_size"] for s in segments(p.id)}
            assert sorted(pool_segments.values()) == [2 * MiB, 30 * MiB], pool_segments
            assert not any(s["is_expandable"] for s in segments(p.id))
            # The default pool does not use it.
            z = e()
            assert pool_of(z) == (0, 0)
            del x, y, z
            assert called_free.value == 0
            del p                                  # its destructor empties its cache
            assert called_free.value == 321
            # Each segment was announced and withdrawn, as ProcessGroupNCCL's registration needs.
            trace = torch.cuda.memory._snapshot()["device_traces"][0]
            for action in ("segment_alloc", "segment_free"):
                seen = {(t["addr"], t["size"]) for t in trace if t["action"] == action}
                assert set(pool_segments.items()) <= seen, (action, pool_segments, seen)
            torch.cuda.memory._record_memory_history(enabled=None)
            # Nothing was left half made: pools still work, and the process ends normally.
            p = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(p):
                x = e()
            assert pool_of(x) == p.id
            del p, x
            torch.cuda.empty_cache()
            assert torch.cuda.memory_reserved() == 0
        """)

    def test_use_on_oom_lends_a_cached_block_of_the_pool_before_the_cache_is_freed(self):
        # PyTorch's test_mempool_limited_memory_with_allocator without the pool's own allocator,
        # and the statistics: the borrowed block is no out-of-memory and no retry.
        run_check_policies(self, """
            pool_do_not_use = torch.cuda.MemPool()
            pool_use = torch.cuda.MemPool(use_on_oom=True)
            torch.cuda.empty_cache()
            _, all_memory = torch.cuda.mem_get_info()
            torch.cuda.set_per_process_memory_fraction(80 * MiB / all_memory)
            with torch.cuda.use_mem_pool(pool_do_not_use):
                a = e(40 * MiB)
            with torch.cuda.use_mem_pool(pool_use):
                b = e(40 * MiB)
            b_ptr = b.data_ptr()
            try:
                e(40 * MiB)
                raise AssertionError("no out-of-memory error")
            except torch.OutOfMemoryError:
                pass
            del a, b
            before = torch.cuda.memory_stats()
            c = e(30 * MiB)                                # from pool_use's cache
            after = torch.cuda.memory_stats()
            assert c.data_ptr() == b_ptr
            assert pool_of(c) == pool_use.id
            assert c.data_ptr() in blocks_in(pool_use.id)
            for key in ("num_ooms", "num_alloc_retries", "reserved_bytes.all.current"):
                assert after[key] == before[key], (key, before[key], after[key])
            assert after["allocated_bytes.all.current"] == 30 * MiB
            try:
                e(30 * MiB)                                # pool_do_not_use lends nothing
                raise AssertionError("no out-of-memory error")
            except torch.OutOfMemoryError:
                pass
            del c                                          # back to pool_use
            assert not blocks_in(pool_use.id)
            with torch.cuda.use_mem_pool(pool_use):
                f = e(20 * MiB)
            if PYTORCH_LAYOUT:                             # stitch maps the pages anew
                assert f.data_ptr() == b_ptr
            del f
            s = torch.cuda.memory_stats()
            assert (s["num_ooms"], s["num_alloc_retries"]) == (2, 2), s
            assert s["reserved_bytes.all.current"] == 80 * MiB
            # Destroyed, the pool lends nothing: its cache goes back and the default pool allocates.
            del pool_use
            g = e(30 * MiB)
            assert pool_of(g) == (0, 0)
            del g, pool_do_not_use
            torch.cuda.empty_cache()
            torch.cuda.set_per_process_memory_fraction(1.0)
        """)

    def test_caching_allocator_enable_false_gives_each_tensor_its_own_cuda_malloc(self):
        run_check_policies(self, """
            x = e(3 * MiB)                                 # cached
            torch.cuda.caching_allocator_enable(False)
            c0 = counters()
            y = e(5 * MiB)
            c1 = counters()
            assert c1.malloc == c0.malloc + 1
            assert torch.cuda.memory_allocated() == 3 * MiB    # y is not counted
            del x                                          # back to the cache, not cudaFree
            assert counters().free == c1.free
            assert torch.cuda.memory_allocated() == 0
            del y
            assert counters().free == c1.free + 1
            z = e(7 * MiB)
            torch.cuda.caching_allocator_enable(True)
            del z                                          # allocated uncached: cudaFree'd
            assert counters().free == c1.free + 2
            assert counters().bytes_in_use == c0.bytes_in_use
            w = e()
            assert torch.cuda.memory_allocated() == MiB
        """)

    def test_the_process_ends_normally_with_live_pools_and_their_tensors(self):
        out, _ = self.check("""
            kept = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(kept):
                x = e(3 * MiB)
            def dropped():
                p = torch.cuda.MemPool()
                with torch.cuda.use_mem_pool(p):
                    return e(2 * MiB)
            y = dropped()
            print("end of script")
        """)
        self.assertIn("end of script", out)


class PyTorchTestMemPool(unittest.TestCase):
    """PyTorch's TestMemPool (test/test_cuda.py), test by test, on the simulator."""

    def check(self, code, env=None):
        return run_check(self, code, env)

    def test_mempool_id(self):
        self.check("""
            pool1 = torch.cuda.graph_pool_handle()
            pool2 = torch.cuda.MemPool().id
            handles = [pool1, pool2]
            if hasattr(torch.accelerator, "generate_graph_pool_handle"):
                handles.append(torch.accelerator.generate_graph_pool_handle())
            # the first value of a user-created pool's id is always zero
            assert all((h[0] == 0) == (pool1[0] == 0) for h in handles)
            # each call makes a new id
            assert all(b[1] - a[1] > 0 for a, b in zip(handles, handles[1:])), handles
        """)

    def test_mempool_empty_cache(self):
        self.check("""
            torch.cuda.empty_cache()
            pool = torch.cuda.MemPool()
            x = torch.empty(1024, 1024, device="cuda")
            with torch.cuda.use_mem_pool(pool):
                y = torch.empty(1024, 1024, device="cuda")
            del y
            del x
            del pool
            segs = torch.cuda.memory._snapshot()["segments"]
            assert len(segs) > 0, "expected more than one segment"
        """)

    def test_mempool_empty_cache_inactive(self):
        self.check("""
            torch.cuda.empty_cache()
            allocator, called_dummy_alloc, called_dummy_free = dummy_allocator()
            assert called_dummy_alloc.value == 0 and called_dummy_free.value == 0
            def f():
                pool = torch.cuda.MemPool(allocator.allocator())
                with torch.cuda.use_mem_pool(pool):
                    x = torch.empty(1024 * 1024 * 2, dtype=torch.int64, device="cuda")
                return x          # the pool dies here; x, allocated from it, lives on
            x = f()
            assert called_dummy_alloc.value == 123
            assert called_dummy_free.value == 0
            del x
            torch.cuda.empty_cache()
            assert called_dummy_free.value == 321
        """)

    def test_mempool_with_allocator(self):
        # torch 2.11's MemPool has no .allocator attribute: the rest of PyTorch's test.
        self.check("""
            pool = torch.cuda.MemPool()
            allocator, called_dummy_alloc, called_dummy_free = dummy_allocator()
            pool = torch.cuda.MemPool(allocator.allocator())
            assert pool.use_count() == 1
            assert called_dummy_alloc.value == 0 and called_dummy_free.value == 0
            with torch.cuda.use_mem_pool(pool):
                out_0 = torch.empty(nelem_1mb, device="cuda")
                assert pool.use_count() == 2
            assert pool.use_count() == 1
            assert called_dummy_alloc.value == 123
            out_non_pool = torch.empty(nelem_1mb, device="cuda")
            with torch.cuda.use_mem_pool(pool):
                assert len(pool.snapshot()) == 1     # 1 MiB packed into a 2 MiB buffer
                out_1 = torch.empty(nelem_1mb, device="cuda")
                assert len(pool.snapshot()) == 1
                out_2 = torch.empty(nelem_1mb, device="cuda")
                assert len(pool.snapshot()) == 2
            assert len(pool.snapshot()) == 2
            del out_0, out_1, out_2
            del pool                                 # its destructor empties its cache
            assert called_dummy_free.value == 321
        """)

    def test_tensor_delete_after_allocator_delete(self):
        self.check("""
            allocator, called_dummy_alloc, called_dummy_free = dummy_allocator()
            pool = torch.cuda.MemPool(allocator.allocator())
            with torch.cuda.use_mem_pool(pool):
                data = torch.empty(4, device="cuda")
            assert called_dummy_alloc.value == 123 and called_dummy_free.value == 0
            del pool
            del allocator
            assert called_dummy_free.value == 0
            del data
            torch.cuda.empty_cache()
            assert called_dummy_free.value == 321
        """)

    def test_mempool_limited_memory_with_allocator(self):
        self.check("""
            allocator, _, _ = dummy_allocator()
            pool_do_not_use = torch.cuda.MemPool(allocator.allocator())
            pool_use = torch.cuda.MemPool(allocator.allocator(), use_on_oom=True)
            device = torch.device("cuda:0")
            init_fraction = torch.cuda.get_per_process_memory_fraction()
            torch.cuda.memory.empty_cache()
            _, all_memory = torch.cuda.memory.mem_get_info(device)
            total_allowed = 80 * MiB + torch.cuda.memory_reserved(device)
            torch.cuda.memory.set_per_process_memory_fraction(total_allowed / all_memory, device)
            with torch.cuda.use_mem_pool(pool_do_not_use):
                a = torch.empty(40 * nelem_1mb, device="cuda")
            with torch.cuda.use_mem_pool(pool_use):
                b = torch.empty(40 * nelem_1mb, device="cuda")
            b_dataptr = b.data_ptr()
            try:
                c = torch.empty(40 * nelem_1mb, device="cuda")
                raise AssertionError("no out-of-memory error")
            except torch.OutOfMemoryError:
                pass
            del a, b
            c = torch.empty(30 * nelem_1mb, device="cuda")   # falls back on pool_use
            c_dataptr = c.data_ptr()
            try:
                d = torch.empty(30 * nelem_1mb, device="cuda")
                raise AssertionError("no out-of-memory error")
            except torch.OutOfMemoryError:
                pass
            del c
            assert b_dataptr == c_dataptr
            with torch.cuda.use_mem_pool(pool_use):
                e_ = torch.empty(20 * nelem_1mb, device="cuda")
            e_dataptr = e_.data_ptr()
            del e_
            assert e_dataptr == c_dataptr
            del pool_use, pool_do_not_use
            torch.cuda.memory.empty_cache()
            torch.cuda.memory.set_per_process_memory_fraction(init_fraction)
        """)

    def test_mempool_no_split(self):
        run_check_policies(self, """
            torch.cuda.empty_cache()
            pool_split = torch.cuda.MemPool()
            pool_no_split = torch.cuda.MemPool(no_split=True)
            with torch.cuda.use_mem_pool(pool_split):
                a_split = torch.empty(4 * nelem_1mb, device="cuda")
            with torch.cuda.use_mem_pool(pool_no_split):
                a_no_split = torch.empty(4 * nelem_1mb, device="cuda")
            with torch.cuda.use_mem_pool(pool_split):
                b_split = torch.empty(4 * nelem_1mb, device="cuda")
            with torch.cuda.use_mem_pool(pool_no_split):
                b_no_split = torch.empty(4 * nelem_1mb, device="cuda")
            assert len(pool_no_split.snapshot()) > len(pool_split.snapshot())
            for seg in pool_no_split.snapshot():
                assert len(seg["blocks"]) == 1
            count = lambda p: sum(len(seg["blocks"]) for seg in p.snapshot())
            if PYTORCH_LAYOUT:   # stitch leaves no free remainder in the split pool's segment
                assert count(pool_no_split) < count(pool_split)
            # gpumem: a no_split pool's segments are PyTorch's, whatever the policy.
            sizes = sorted(seg["total_size"] for seg in pool_no_split.snapshot())
            assert sizes == [20 * MiB, 20 * MiB], sizes
            assert not any(seg["is_expandable"] for seg in pool_no_split.snapshot())
            del a_no_split                                 # reused whole by a smaller request
            with torch.cuda.use_mem_pool(pool_no_split):
                c_no_split = torch.empty(3 * nelem_1mb, device="cuda")
            assert len(pool_no_split.snapshot()) == 2
            for seg in pool_no_split.snapshot():
                assert [b["state"] for b in seg["blocks"]] == ["active_allocated"], seg
        """)

    def test_deleted_mempool_not_used_on_oom(self):
        self.check("""
            allocator, _, _ = dummy_allocator()
            device = torch.device("cuda:0")
            init_fraction = torch.cuda.get_per_process_memory_fraction()
            torch.cuda.memory.empty_cache()
            _, all_memory = torch.cuda.memory.mem_get_info(device)
            total_allowed = 40 * MiB + torch.cuda.memory_reserved(device)
            torch.cuda.memory.set_per_process_memory_fraction(total_allowed / all_memory, device)
            for _ in range(10):
                pool_use_on_oom = torch.cuda.MemPool(allocator.allocator(), use_on_oom=True)
                with torch.cuda.use_mem_pool(pool_use_on_oom):
                    a = torch.empty(40 * nelem_1mb, device="cuda")
                del a
                del pool_use_on_oom
            new_pool_use_on_oom = torch.cuda.MemPool(allocator.allocator(), use_on_oom=True)
            with torch.cuda.use_mem_pool(new_pool_use_on_oom):
                a = torch.empty(40 * nelem_1mb, device="cuda")
            del a
            b = torch.empty(20 * nelem_1mb, device="cuda")
            c = torch.empty(20 * nelem_1mb, device="cuda")
            del b, c
            del new_pool_use_on_oom
            torch.cuda.memory.empty_cache()
            torch.cuda.memory.set_per_process_memory_fraction(init_fraction)
        """)

    def test_mempool_multithread(self):
        self.check("""
            pool_ids = []
            def create_mempool_and_make_active():
                pool = torch.cuda.MemPool()
                pool_ids.extend([pool.id])
            threads = [threading.Thread(target=create_mempool_and_make_active) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(set(pool_ids)) == 4       # ids are made atomically
        """)

    def test_mempool_emptycache_multithread(self):
        self.check("""
            num_threads = 4
            def my_function(pool):
                with torch.cuda.use_mem_pool(pool):
                    x = torch.empty(4, device="cuda")
                    del x
                    torch.cuda.empty_cache()
            pools = [torch.cuda.MemPool() for _ in range(num_threads)]
            threads = [threading.Thread(target=my_function, args=(pools[i],))
                       for i in range(num_threads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            # empty_cache did nothing to the pools
            for p in pools:
                assert len(p.snapshot()) == 1, p.snapshot()
        """)

    def test_nested_mempool(self):
        self.check("""
            torch.cuda.empty_cache()
            pool1, pool2, pool3 = (torch.cuda.MemPool() for _ in range(3))
            data = []
            def allocate_data():
                data.append(torch.empty(nelem_1mb * 20, device="cuda"))
            with torch.cuda.use_mem_pool(pool1):
                allocate_data()
                with torch.cuda.use_mem_pool(pool2):
                    allocate_data()
                    with torch.cuda.use_mem_pool(pool3):
                        allocate_data()
                    allocate_data()
                allocate_data()
            pool1_segments = torch.cuda.memory.memory_snapshot(pool1.id)
            pool2_segments = torch.cuda.memory.memory_snapshot(pool2.id)
            pool3_segments = torch.cuda.memory.memory_snapshot(pool3.id)
            if not GPUMEM:   # a 20 MiB tensor is a segment of its own in PyTorch's allocator
                assert len(pool1_segments) == 2, pool1_segments
                assert len(pool2_segments) == 2, pool2_segments
                assert len(pool3_segments) == 1, pool3_segments
            # The layout-free check: which pool each tensor went to.
            got = [len(blocks_in(p.id)) for p in (pool1, pool2, pool3)]
            assert got == [2, 2, 1], got
        """)

    def test_mempool_expandable(self):
        self.check("""
            torch.cuda.empty_cache()
            allocator, _, _ = dummy_allocator()
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")
            pool = torch.cuda.MemPool(allocator.allocator())
            data = []
            nelem = 1024 * 1024 // 4
            with torch.cuda.use_mem_pool(pool):
                data.append(torch.empty(nelem, device="cuda"))
            data.append(torch.empty(nelem, device="cuda"))   # in an expandable segment
            segs = torch.cuda.memory.memory_snapshot()
            assert len(segs) == 2, segs
            assert sum(1 for s in segs if s["is_expandable"]) == 1, segs
            torch.cuda.memory._set_allocator_settings("expandable_segments:False")
        """)

    def test_mempool_ctx_multithread(self):
        self.check("""
            torch.cuda.empty_cache()
            segs = torch.cuda.memory._snapshot()["segments"]
            assert len(segs) == 0, "Expected empty pool in the beginning"
            nelem = 1024 * 1024
            trigger_alloc = threading.Event()
            done_allocation = threading.Event()
            def main_thread_fn():
                pool = torch.cuda.MemPool()
                out1 = torch.empty(nelem, dtype=torch.int8, device="cuda")
                with torch.cuda.use_mem_pool(pool):
                    out = torch.empty(nelem, dtype=torch.int8, device="cuda")
                    del out
                    trigger_alloc.set()
                    done_allocation.wait()
            def side_thread_fn(segments):
                trigger_alloc.wait()
                out = torch.empty(nelem, dtype=torch.int8, device="cuda")
                s = torch.cuda.memory._snapshot()["segments"]
                segments.append(s)
                done_allocation.set()
            segments_seen = []
            main_thread = threading.Thread(target=main_thread_fn)
            side_thread = threading.Thread(target=side_thread_fn, args=(segments_seen,))
            main_thread.start()
            side_thread.start()
            main_thread.join(timeout=10)
            side_thread.join(timeout=10)
            assert not main_thread.is_alive() and not side_thread.is_alive(), "timed out"
            assert len(segments_seen) == 1
            active = defaultdict(int)
            for s in segments_seen[0]:
                active[tuple(s["segment_pool_id"])] += s["active_size"]
            assert len(segments_seen[0]) == 2, "Expected to have 2 segments allocated"
            for k, v in active.items():
                if k == (0, 0):
                    assert v == 2 * nelem, ("default pool", v)
                else:
                    assert v == 0, ("the pool", k, v)
        """)


if __name__ == "__main__":
    test_plugin.PLUGIN = os.path.abspath(sys.argv[1])
    test_plugin.CUDASIM = os.path.abspath(sys.argv[2])
    DUMMY = os.path.abspath(sys.argv[3])
    GPUMEM = {"gpumem": True, "pytorch": False}[sys.argv[4]]
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[5:])
