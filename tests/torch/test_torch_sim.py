"""PyTorch itself (the PyPI wheel) on the strict CUDA simulator: CUDA graphs, several devices,
kernels and streams, with PyTorch's own caching allocator and with gpumem's plugin.

    python tests/torch/test_torch_sim.py PLUGIN CUDASIM_DIR [unittest arguments, e.g. -k Graph]

Every test runs a fresh Python with the simulator's libcudart.so.13 and libcuda.so.1 preloaded and
GPUMEM_SIM_STRICT=abort, so any violation of the GPU's rules (tools/cudasim/README.md, "What the
simulator checks") kills it; the tests also read the violation counters. Kernels touch nothing
the simulator knows of; copies and fills do.
"""

import json
import os
import subprocess
import sys
import textwrap
import unittest

PLUGIN = ""
CUDASIM = ""

PRELUDE = """
import ctypes, os, sys, torch
sim = ctypes.CDLL("libcuda.so.1")
FIELDS = (
    "malloc free mem_get_info event_create event_destroy event_record event_query "
    "event_synchronize device_synchronize stream_create stream_destroy address_reserve "
    "address_free mem_create mem_release mem_map mem_unmap set_access memcpy_calls memcpy_bytes "
    "memcpy_device_calls memset_calls memset_bytes host_alloc host_free host_register "
    "host_unregister stream_synchronize stream_query stream_wait_event unimplemented "
    "total_memory bytes_in_use peak_bytes_in_use host_bytes live_segments live_reservations "
    "live_physical live_mappings live_streams live_events injected_faults out_of_memory devices "
    "kernel_launches work_launches memcpy_peer_calls captures captures_invalidated "
    "graph_launches live_graphs live_graph_execs pending_works host_clock_ns violations "
    "violations_unmapped violations_inaccessible violations_in_flight violations_race "
    "faulted_devices").split()

class Counters(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in FIELDS]

def counters(device=-1):
    c = Counters()
    if device < 0:
        assert sim.gpumemSimGetCounters(ctypes.byref(c), ctypes.sizeof(c)) == 0
    else:
        assert sim.gpumemSimGetDeviceCounters(device, ctypes.byref(c), ctypes.sizeof(c)) == 0
    return c

def last_violation():
    buf = ctypes.create_string_buffer(4096)
    sim.gpumemSimGetLastViolation(buf, len(buf))
    return buf.value.decode()

if os.environ.get("TEST_PLUGIN"):
    lib = ctypes.CDLL(os.environ["TEST_PLUGIN"])
    assert lib.gpumem_installed() == 1
MiB = 1 << 20
"""


def run(code, env=None):
    """Runs `code` after PRELUDE in a fresh Python on the simulator; returns (rc, out, err)."""
    full_env = dict(os.environ)
    for var in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        full_env.pop(var, None)
    full_env.update(
        LD_PRELOAD=f"{CUDASIM}/libcudart.so.13:{CUDASIM}/libcuda.so.1",
        GPUMEM_SIM_MEMORY="16GiB",
        GPUMEM_SIM_STRICT="abort",
    )
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code)], env=full_env,
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


# The allocators each test runs under: PyTorch's (both kinds of segment), gpumem's plugin.
ALLOCATORS = {
    "pytorch": {},
    "pytorch expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "gpumem stitch": {"TEST_PLUGIN": "plugin", "GPUMEM_ALLOC_CONF": "policy:stitch"},
    "gpumem classic": {"TEST_PLUGIN": "plugin", "GPUMEM_ALLOC_CONF": "policy:classic"},
    "gpumem expandable": {"TEST_PLUGIN": "plugin", "GPUMEM_ALLOC_CONF": "policy:expandable"},
}


class SimTest(unittest.TestCase):
    def check(self, code, env=None):
        rc, out, err = run(code, env)
        self.assertEqual(rc, 0, f"stdout:\n{out}\nstderr:\n{err}")
        self.assertNotIn("cudasim violation", err)
        return out, err

    def each_allocator(self, code, env=None):
        outs, errs = [], []
        for name, extra in ALLOCATORS.items():
            with self.subTest(allocator=name):
                e = dict(extra)
                if "TEST_PLUGIN" in e:
                    e["TEST_PLUGIN"] = PLUGIN
                e.update(env or {})
                out, err = self.check(code, e)
                # gpumem reports what fails in a destructor (a tensor's deleter) on stderr.
                self.assertNotIn("gpumem: freeing", err)
                outs.append(out)
                errs.append(err)
        return "".join(outs), "".join(errs)


class GraphTest(SimTest):
    def test_capture_and_replay_of_fills_copies_and_kernels(self):
        self.each_allocator("""
            x = torch.zeros(1 << 20, device="cuda")
            y = torch.ones(1 << 20, device="cuda")
            before = counters()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                x.fill_(3.0)
                y.copy_(x)
                z = x + y                     # allocated from the graph's private pool
            for _ in range(5):
                g.replay()
            torch.cuda.synchronize()
            after = counters()
            assert after.captures - before.captures == 1, after.captures
            assert after.graph_launches - before.graph_launches == 5, after.graph_launches
            assert after.live_graph_execs == 1
            del g, z
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            c = counters()
            assert c.live_graph_execs == 0 and c.live_graphs == 0
            assert c.violations == 0, last_violation()
        """)

    def test_replays_on_a_side_stream_and_memory_of_a_reset_graph(self):
        self.each_allocator("""
            static_in = torch.zeros(4 * MiB, dtype=torch.uint8, device="cuda")
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):            # warm up, as PyTorch recommends
                    out = static_in * 2
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                out = static_in * 2
                out.add_(1)
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                g.replay()
            torch.cuda.current_stream().wait_stream(s)
            static_in.copy_(out)
            torch.cuda.synchronize()
            g.reset()
            del out
            torch.cuda.empty_cache()
            assert counters().violations == 0, last_violation()
        """)


    def test_make_graphed_callables_forward_and_backward(self):
        self.each_allocator("""
            def f(x):
                return (x * 2 + 1).relu()
            sample = torch.randn(1 << 16, device="cuda", requires_grad=True)
            graphed = torch.cuda.make_graphed_callables(f, (sample,))
            before = counters()
            for _ in range(3):
                x = torch.randn(1 << 16, device="cuda", requires_grad=True)
                y = graphed(x)
                y.sum().backward()
                assert x.grad is not None and x.grad.shape == x.shape
            torch.cuda.synchronize()
            assert counters().graph_launches - before.graph_launches >= 6
            del graphed, x, y, sample
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            assert counters().violations == 0, last_violation()
        """)

    def test_record_stream_in_a_capture_and_empty_cache_during_it(self):
        # A tensor of the default pool recorded on the capturing stream and freed in the capture
        # (its free waits for the capture's end: no event recorded in the capture, none queried),
        # a side stream joined into the capture, and empty_cache during the capture (skipped, as
        # PyTorch skips it: no synchronisation, nothing freed, the capture stays valid).
        self.each_allocator("""
            outside = torch.ones(1 << 20, device="cuda")
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            side = torch.cuda.Stream()
            with torch.cuda.graph(g):
                cur = torch.cuda.current_stream()
                outside.record_stream(cur)
                del outside
                static = torch.zeros(1 << 20, device="cuda")
                side.wait_stream(cur)
                with torch.cuda.stream(side):
                    tmp = static + 1
                    tmp.record_stream(side)
                cur.wait_stream(side)
                out = tmp * 2
                del tmp
                reserved = torch.cuda.memory_reserved()
                torch.cuda.empty_cache()
                assert torch.cuda.memory_reserved() == reserved
            for _ in range(3):
                g.replay()
            x = torch.empty(1 << 20, device="cuda")   # processes what the capture deferred
            torch.cuda.synchronize()
            torch.cuda.empty_cache()                  # the live graph's pool keeps its memory
            g.replay()
            torch.cuda.synchronize()
            del g, out, static, x
            torch.cuda.empty_cache()
            assert counters().violations == 0, last_violation()
        """)


    def test_a_record_stream_block_is_reused_in_the_capture_once_its_streams_join(self):
        # graph_capture_record_stream_reuse, set at run time as PyTorch's users set it: a block
        # freed with record_stream in a capture is not reused while the other stream's use is
        # unordered with the allocating stream, and is reused once that stream joined back.
        # Turned off again, the block waits for the capture's end.
        self.each_allocator("""
            def capture(reuse):
                torch.cuda.memory._set_allocator_settings(
                    f"graph_capture_record_stream_reuse:{reuse}")
                torch.cuda.empty_cache()
                s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
                g = torch.cuda.CUDAGraph(keep_graph=True)
                torch.cuda.synchronize()
                with torch.cuda.stream(s1):
                    g.capture_begin()
                    sink = torch.empty(8, device="cuda")
                    data1 = torch.empty(8, device="cuda")
                    ptr1 = data1.data_ptr()
                    s2.wait_stream(s1)
                    with torch.cuda.stream(s2):
                        buf = torch.empty_like(data1)
                        torch.add(data1, 2.0, out=buf)
                        data1.record_stream(s2)
                    del data1
                    before_join = torch.empty(8, device="cuda").data_ptr()
                    s1.wait_stream(s2)
                    sink.fill_(1.0)
                    after_join = torch.empty(8, device="cuda").data_ptr()
                    g.capture_end()
                torch.cuda.synchronize()
                return ptr1, before_join, after_join
            ptr1, before_join, after_join = capture(True)
            assert before_join != ptr1
            assert after_join == ptr1, "not reused after the join"
            ptr1, before_join, after_join = capture(False)
            assert before_join != ptr1 and after_join != ptr1
            assert counters().violations == 0, last_violation()
        """)


class MultiDeviceTest(SimTest):
    def test_record_stream_on_another_devices_stream(self):
        # A tensor of device 0 read on a stream of device 1 and recorded there: the event is
        # device 1's. With the event made on device 0, recording it fails inside the tensor's
        # deleter, which reports it and leaks the block.
        out, err = self.each_allocator("""
            a = torch.ones(4 << 20, device="cuda:0")
            torch.cuda.synchronize(0)
            with torch.cuda.device(1):
                s1 = torch.cuda.Stream()
                with torch.cuda.stream(s1):
                    b = torch.empty(4 << 20, device="cuda:1")
                    b.copy_(a)
                a.record_stream(s1)
            del a
            c = torch.empty(4 << 20, device="cuda:0")   # may reuse a's memory only after s1's copy
            c.fill_(2.0)
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            del b, c
            torch.cuda.empty_cache()
            assert torch.cuda.memory_allocated(0) == 0, torch.cuda.memory_allocated(0)
            assert torch.cuda.memory_reserved(0) == 0, torch.cuda.memory_reserved(0)
            assert counters().violations == 0, last_violation()
        """, {"GPUMEM_SIM_DEVICES": "2", "GPUMEM_SIM_MEMORY": "80GiB"})


    def test_tensors_copies_and_side_streams_on_two_devices(self):
        self.each_allocator("""
            assert torch.cuda.device_count() == 2
            assert counters().devices == 2
            a = torch.ones(1 << 20, device="cuda:0")
            b = torch.empty(1 << 20, device="cuda:1")
            b.copy_(a)
            c = a.to("cuda:1")
            with torch.cuda.device(1):
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    d = c * 2
                    e = torch.empty_like(c)
                    e.copy_(c)
                c.record_stream(s)
                del c
                f = torch.empty(1 << 20, device="cuda:1")
                f.copy_(b)
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            del a, b, d, e, f
            torch.cuda.empty_cache()
            assert counters().violations == 0, last_violation()
        """, {"GPUMEM_SIM_DEVICES": "2", "GPUMEM_SIM_MEMORY": "80GiB"})

    def test_a_copy_between_devices_grants_the_peer_the_vmm_pages(self):
        # PyTorch enables peer access for a copy between GPUs (enablePeerAccess): the pages of
        # expandable segments and of gpumem's VMM policies, which peer access does not cover, are
        # granted with cuMemSetAccess, those mapped then and those mapped later.
        self.each_allocator("""
            conf = os.environ.get("GPUMEM_ALLOC_CONF", "") + os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
            vmm = "expandable" in conf or "stitch" in conf
            a = torch.ones(4 << 20, device="cuda:0")
            b = torch.empty(4 << 20, device="cuda:1")
            before = counters().set_access
            b.copy_(a)
            granted = counters().set_access - before
            assert (granted > 0) == vmm, (granted, vmm)
            c = torch.empty(64 << 20, device="cuda:1")      # mapped after: granted too
            later = counters().set_access - before - granted
            assert (later >= 2) == vmm, later               # its own device and the peer
            torch.cuda.synchronize(0)
            torch.cuda.synchronize(1)
            del a, b, c
            torch.cuda.empty_cache()
            assert counters().violations == 0, last_violation()
        """, {"GPUMEM_SIM_DEVICES": "2", "GPUMEM_SIM_MEMORY": "80GiB"})

    def test_expandable_segments_reserve_a_range_per_stream_on_a_large_device(self):
        # 9/8 of an 80 GiB device per stream: 900 GiB of addresses for ten streams.
        self.check("""
            streams = [torch.cuda.Stream() for _ in range(10)]
            kept = []
            for s in streams:
                with torch.cuda.stream(s):
                    kept.append(torch.empty(100 * MiB, dtype=torch.uint8, device="cuda"))
            c = counters(0)
            assert c.live_reservations >= 10, c.live_reservations
            torch.cuda.synchronize()
            del kept
            torch.cuda.empty_cache()
            assert counters().violations == 0, last_violation()
        """, {"GPUMEM_SIM_DEVICES": "2", "GPUMEM_SIM_MEMORY": "80GiB",
              "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})


class StreamRulesTest(SimTest):
    def test_kernels_are_work_in_stream_order(self):
        self.each_allocator("""
            before = counters()
            x = torch.zeros(1024, device="cuda")
            y = (x + 1) * 2
            y.cumsum(0)  # CUB asks cudaFuncGetAttributes
            float(y.sum())  # a value copied to the host (its bytes are whatever the simulator
            # holds: kernels run as time, not arithmetic, so nothing may depend on them; nonzero()
            # sized a tensor from such a count and failed now and then)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                z = y.clone()
            y.record_stream(s)
            torch.cuda.current_stream().wait_stream(s)
            del y
            w = torch.empty(1024, device="cuda").copy_(z)
            assert w.device.type == "cuda"
            torch.cuda.synchronize()
            assert counters().kernel_launches > before.kernel_launches
            assert counters().violations == 0, last_violation()
        """)

    def test_a_missing_wait_stream_is_a_race(self):
        # The control: a program that uses a tensor on a side stream without ordering the streams
        # is reported (GPUMEM_SIM_STRICT is off here, so it runs to the end).
        rc, out, err = run("""
            a = torch.ones(1 << 20, device="cuda")
            b = torch.empty_like(a)
            b.copy_(a)
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                c = torch.empty_like(b)
                c.copy_(b)                      # b may still be being written
            torch.cuda.synchronize()
            print(counters().violations_race)
        """, {"GPUMEM_SIM_STRICT": "off"})
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.strip(), "1", err)
        self.assertIn("cudasim violation: race: cudaMemcpyAsync on stream", err)


# CUDA-graph trees (torch._inductor.cudagraph_trees, what torch.compile(mode="reduce-overhead")
# and backend="cudagraphs" run) checkpoint a graph pool after each recording and return it to that
# checkpoint before recording a graph after replaying others: getCheckpointState and
# setCheckpointPoolState. Each test prints what it measured as one JSON line; PyTorch's allocator
# is the oracle (classic lays blocks out as PyTorch's allocator, expandable as PyTorch's
# expandable segments; stitch must give the same allocations and statistics where the test says).
TREES_PRELUDE = """
import json
import torch._inductor.config as inductor_config
from torch._inductor import cudagraph_trees
inductor_config.triton.slow_path_cudagraph_asserts = True   # live storages == the pool's blocks
calls = {"get": 0, "set": 0}
_get, _set = torch._C._cuda_getCheckpointState, torch._C._cuda_setCheckpointPoolState
def _counting_get(*a):
    calls["get"] += 1
    return _get(*a)
def _counting_set(*a):
    calls["set"] += 1
    return _set(*a)
torch._C._cuda_getCheckpointState = _counting_get
torch._C._cuda_setCheckpointPoolState = _counting_set

def e(n):
    return torch.empty(n, dtype=torch.uint8, device="cuda")

def pool_segments(pool):
    return [s for s in torch.cuda.memory_snapshot() if tuple(s["segment_pool_id"]) == tuple(pool)]

def live_blocks(pool):
    return sum(b["state"] == "active_allocated" for s in pool_segments(pool) for b in s["blocks"])

def current():
    st = torch.cuda.memory_stats()
    return [st[k + ".all.current"] for k in ("allocation", "allocated_bytes", "active_bytes",
                                             "requested_bytes", "inactive_split")]
"""


# The allocators whose statistics agree: PyTorch's and gpumem's classic policy; PyTorch's
# expandable segments and gpumem's VMM policies (no inactive_split).
SAME_LAYOUT = [["pytorch", "gpumem classic"],
               ["pytorch expandable", "gpumem expandable", "gpumem stitch"]]


class SameAsPyTorchTest(SimTest):
    PRELUDE = ""  # code each test's code runs after

    def each_allocator_same(self, code, same):
        """Runs `code` under every allocator; the JSON each prints must equal that of the
        allocators named with it in `same` (a list of groups)."""
        printed = {}
        for name, extra in ALLOCATORS.items():
            with self.subTest(allocator=name):
                env = dict(extra)
                if "TEST_PLUGIN" in env:
                    env["TEST_PLUGIN"] = PLUGIN
                out, err = self.check(self.PRELUDE + textwrap.dedent(code), env)
                self.assertNotIn("gpumem: ", err)
                printed[name] = json.loads(out.strip().splitlines()[-1])
        for group in same:
            for name in group[1:]:
                self.assertEqual(printed[name], printed[group[0]], f"{name} against {group[0]}")
        return printed


class CudagraphTreesTest(SameAsPyTorchTest):
    PRELUDE = TREES_PRELUDE

    def test_a_branch_recorded_after_replaying_its_parent(self):
        # A, then B as A's child, recorded and replayed; then C as A's child: recorded after A
        # replays, on the pool returned to A's checkpoint (the tree A -> B, A -> C).
        printed = self.each_allocator_same("""
            def make(fn, inputs, outputs):
                def model(args):
                    xs = list(args)
                    args.clear()
                    return fn(*xs)
                return cudagraph_trees.cudagraphify_impl(
                    model, inputs, (), device_index=0, is_backward=False, is_inference=True,
                    stack_traces=[None] * outputs)
            def foo_a(x):
                t = e(3 * MiB)
                u = e(4096)
                return (x.add(1), t, e(512))
            def foo_b(x):
                return (x.mul(2), e(25 * MiB))
            def foo_c(x):
                tmp = e(6 * MiB)
                del tmp
                return (x.sub(1), e(700 * 1024))
            x = torch.zeros(1 << 16, device="cuda")
            fa, fb, fc = make(foo_a, [x], 3), make(foo_b, [x], 2), make(foo_c, [x], 2)
            for _ in range(3):
                torch.compiler.cudagraph_mark_step_begin()
                a = fa([x])
                b = fb([a[0]])
            for _ in range(3):
                torch.compiler.cudagraph_mark_step_begin()
                a = fa([x])
                c = fc([a[0]])
            torch.cuda.synchronize()
            during = current()
            del a, b, c
            cudagraph_trees.reset_cudagraph_trees()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            assert counters().violations == 0, last_violation()
            print(json.dumps({"calls": calls, "during": during,
                              "after": torch.cuda.memory_allocated(),
                              "reserved": torch.cuda.memory_reserved()}))
        """, SAME_LAYOUT)
        self.assertGreater(printed["gpumem stitch"]["calls"]["set"], 0)

    def test_checkpoint_restore_frees_stale_and_hands_back_live_blocks(self):
        # TestBlockStateAbsorption's steps without kernel values: a graph's outputs are
        # checkpointed; a second graph on the pool allocates; the restore frees its output (stale:
        # its deleter is swapped out) and hands the first graph's blocks back, two of them to
        # tensors rebuilt without a deleter, the third only by raw pointer.
        self.each_allocator_same("""
            def graphed(fn):
                torch.cuda.synchronize()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s, pool=pool):
                    out = fn()
                return g, out
            def meta(t):
                return (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes(), t.shape)
            def rebuild(m):
                st = torch._C._construct_storage_from_data_pointer(m[0], torch.device("cuda", 0),
                                                                    m[1])
                t = torch.empty([0], device="cuda", dtype=torch.uint8)
                return t.set_(source=st, storage_offset=0, size=m[2], stride=(1,))
            pool = torch.cuda.graph_pool_handle()
            g1, outs = graphed(lambda: (e(2 * MiB), e(2 * MiB), e(24 * MiB), e(512)))
            segments_before = [(s["address"], s["total_size"], s["allocated_size"],
                                [(b["size"], b["state"]) for b in s["blocks"]])
                               for s in pool_segments(pool)]
            state = torch._C._cuda_getCheckpointState(0, pool)
            metas = [meta(t) for t in outs]
            steps = [live_blocks(pool), current()]
            del outs                                   # every block of g1 dies
            steps += [live_blocks(pool), current()]
            g2, outs2 = graphed(lambda: (e(3 * MiB), e(1024)))
            steps += [live_blocks(pool), current()]
            rebuilt = [rebuild(m) for m in metas[:3]]
            torch._C._cuda_setCheckpointPoolState(
                0, state, [t.untyped_storage()._cdata for t in outs2],
                [t.untyped_storage()._cdata for t in rebuilt[:2]])
            del outs2                                  # stale: freed by the restore, not again
            steps += [live_blocks(pool), current()]
            segments_after = [(s["address"], s["total_size"], s["allocated_size"],
                               [(b["size"], b["state"]) for b in s["blocks"]])
                              for s in pool_segments(pool)]
            if os.environ.get("GPUMEM_ALLOC_CONF") != "policy:stitch":
                assert all(s in segments_after for s in segments_before), (segments_before,
                                                                           segments_after)
            rebuilt[0] = None                          # its deleter is gpumem's (or PyTorch's)
            steps += [live_blocks(pool)]
            rebuilt[1] = None
            steps += [live_blocks(pool)]
            rebuilt[2] = None                          # no deleter was given to this one
            steps += [live_blocks(pool)]
            torch._C._cuda_cudaCachingAllocator_raw_delete(metas[2][0])
            steps += [live_blocks(pool)]
            torch._C._cuda_cudaCachingAllocator_raw_delete(metas[3][0])  # never rebuilt
            steps += [live_blocks(pool), current()]
            del g1, g2
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            assert not pool_segments(pool), pool_segments(pool)
            assert counters().violations == 0, last_violation()
            print(json.dumps({"steps": steps}))
        """, SAME_LAYOUT)

    def test_torch_compile_cudagraphs_backend(self):
        # torch.compile(backend="cudagraphs"): cudagraph trees without Inductor's code generation
        # (mode="reduce-overhead" needs Triton, which compiles for a real GPU).
        printed = self.each_allocator_same("""
            w = torch.randn(64, device="cuda")
            b = torch.randn(64, device="cuda")
            f = torch.compile(lambda x: ((x * w + b).relu() * 2 + 1).tanh(), backend="cudagraphs")
            g = torch.compile(lambda y: (y * 2).sum(), backend="cudagraphs")
            x = torch.randn(16, 64, device="cuda")
            with torch.no_grad():
                for step in range(8):
                    torch.compiler.cudagraph_mark_step_begin()
                    y = f(x)
                    if step >= 3:
                        z = g(y)            # a new child of f's node, recorded after f replays
            torch.cuda.synchronize()
            assert counters().violations == 0, last_violation()
            print(json.dumps({"calls": calls["set"], "allocated": torch.cuda.memory_allocated(),
                              "reserved": torch.cuda.memory_reserved()}))
        """, [list(ALLOCATORS)])
        self.assertGreater(printed["pytorch"]["calls"], 0)


# What memory_snapshot() says of free blocks: PyTorch keeps the request a block last served once it
# is free (memory_viz's trace_plot(filter_freed=True) and PyTorch's test_memory_plots read it); a
# merge keeps the request of the block being freed, a block cut off a free one (the rest of a
# split, a part that stays mapped around an unmapped range) starts at 0.
SNAPSHOT_PRELUDE = """
import json

def e(n):
    return torch.empty(n, dtype=torch.uint8, device="cuda")

def layout():
    # Each segment in address order: its blocks (state, size, requested size) and its totals.
    out = []
    for s in sorted(torch.cuda.memory_snapshot(), key=lambda s: s["address"]):
        out.append([s["segment_type"], s["total_size"], s["active_size"], s["requested_size"],
                    [(b["state"], b["size"], b["requested_size"]) for b in s["blocks"]]])
    return out

def requested_bytes():
    return torch.cuda.memory_stats()["requested_bytes.all.current"]
"""


class SnapshotTest(SameAsPyTorchTest):
    PRELUDE = SNAPSHOT_PRELUDE

    def test_free_blocks_keep_their_last_request_as_in_pytorch(self):
        printed = self.each_allocator_same("""
            steps = {}
            def step(name):
                steps[name] = [layout(), requested_bytes()]
            a, b, c, d = e(1000), e(3000), e(5000), e(7000)
            del b                          # free between two live blocks: keeps 3000
            step("free")
            del c                          # takes b's block in: keeps its own 5000
            step("merge")
            f = e(600)                     # cut off the merged block: the rest keeps 5000
            step("split")
            del d                          # between that rest and the segment's tail
            step("merge both sides")
            g, h, i = e(3 * MiB), e(5 * MiB), e(4 * MiB)
            del h, g                       # g takes h in
            j = e(2 * MiB)
            step("large")
            del i, j
            x, y = e(50 * MiB), e(10 * MiB)
            del x
            torch.cuda.empty_cache()       # unmaps x's whole pages under expandable
            z = e(30 * MiB)                # maps them again
            step("unmapped and mapped again")
            print(json.dumps(steps))
        """, [["pytorch", "gpumem classic"], ["pytorch expandable", "gpumem expandable"]])
        free = [b for s in printed["pytorch"]["free"][0] for b in s[4] if b[0] == "inactive"]
        self.assertIn(["inactive", 3072, 3000], free)  # the oracle keeps it too
        # Stitch lays large blocks out its own way; its small segment is PyTorch's, and its
        # freed large blocks keep their requests too.
        stitch, oracle = printed["gpumem stitch"], printed["pytorch expandable"]
        for name, (segments, requested) in oracle.items():
            small = [s for s in segments if s[0] == "small"]
            self.assertEqual([s for s in stitch[name][0] if s[0] == "small"], small, name)
            self.assertEqual(stitch[name][1], requested, name)
        large_free = [b for s in stitch["large"][0] if s[0] == "large" for b in s[4]
                      if b[0] == "inactive"]
        self.assertIn(3 * (1 << 20), [b[2] for b in large_free])  # g's request


if __name__ == "__main__":
    PLUGIN, CUDASIM = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[3:])
