"""PyTorch itself (the PyPI wheel) on the strict CUDA simulator: CUDA graphs, several devices,
kernels and streams, with PyTorch's own caching allocator and with gpumem's plugin.

    python tests/torch/test_torch_sim.py PLUGIN CUDASIM_DIR [unittest arguments, e.g. -k Graph]

Every test runs a fresh Python with the simulator's libcudart.so.13 and libcuda.so.1 preloaded and
GPUMEM_SIM_STRICT=abort, so any violation of the GPU's rules (tools/cudasim/README.md, "What the
simulator checks") kills it; the tests also read the violation counters. Kernels touch nothing
the simulator knows of; copies and fills do.
"""

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


if __name__ == "__main__":
    PLUGIN, CUDASIM = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[3:])
