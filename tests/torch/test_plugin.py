"""libgpumem_torch.so loaded into PyTorch (the PyPI wheel) running on the CUDA simulator.

    python tests/torch/test_plugin.py PLUGIN CUDASIM_DIR

Every test runs a fresh Python in which the simulator's libcudart.so.13 and libcuda.so.1 are
preloaded, so PyTorch's own CUDA start-up, tensors on cuda:0 (no kernel runs: only allocation) and
the torch.cuda.memory_* functions all run without a GPU. What torch.cuda reports must be what
gpumem and the simulator count.
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
import ctypes, json, sys, torch
sim = ctypes.CDLL("libcuda.so.1")

class Counters(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in (
        "malloc free mem_get_info event_create event_destroy event_record event_query "
        "event_synchronize device_synchronize stream_create stream_destroy address_reserve "
        "address_free mem_create mem_release mem_map mem_unmap set_access memcpy_calls "
        "memcpy_bytes memcpy_device_calls memset_calls memset_bytes host_alloc host_free "
        "host_register host_unregister stream_synchronize stream_query stream_wait_event "
        "unimplemented total_memory bytes_in_use").split()]

def counters():
    c = Counters()
    assert sim.gpumemSimGetCounters(ctypes.byref(c), ctypes.sizeof(c)) == 0
    return c

def gpumem_stats(lib):
    buf = ctypes.create_string_buffer(1 << 16)
    n = lib.gpumem_memory_stats_json(0, buf, len(buf))
    assert 0 < n < len(buf), n
    return json.loads(buf.value.decode())

MiB = 1 << 20
"""


def run(code, env=None, load_first=True):
    """Runs `code` after PRELUDE (and loading the plugin as `lib`) in a fresh Python on the
    simulator; returns (returncode, stdout, stderr)."""
    full_env = dict(os.environ)
    for var in ("GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        full_env.pop(var, None)
    full_env.update(
        LD_PRELOAD=f"{CUDASIM}/libcudart.so.13:{CUDASIM}/libcuda.so.1",
        GPUMEM_SIM_MEMORY="16GiB",
        GPUMEM_SIM_STRICT="abort",  # a violation of the GPU's rules fails the test
    )
    full_env.update(env or {})
    load = f"lib = ctypes.CDLL({PLUGIN!r})\n" if load_first else ""
    script = PRELUDE + load + textwrap.dedent(code)
    p = subprocess.run([sys.executable, "-c", script], env=full_env, capture_output=True,
                       text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


class PluginTest(unittest.TestCase):
    def check(self, code, env=None, load_first=True):
        rc, out, err = run(code, env, load_first)
        self.assertEqual(rc, 0, f"stdout:\n{out}\nstderr:\n{err}")
        return out, err

    def test_loading_installs_gpumem_and_torch_cuda_reports_it(self):
        self.check("""
            assert lib.gpumem_installed() == 1
            before = counters()
            x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
            y = torch.empty(1000, dtype=torch.uint8, device="cuda")
            s = torch.cuda.memory_stats()
            g = gpumem_stats(lib)
            for key in ("allocated_bytes.all.current", "reserved_bytes.all.current",
                        "requested_bytes.all.current", "num_device_alloc",
                        "segment.all.current", "allocation.all.current"):
                assert s[key] == g[key], (key, s[key], g[key])
            assert s["allocation.all.current"] == 2
            assert s["requested_bytes.all.current"] == 3 * MiB + 1000
            after = counters()
            assert after.bytes_in_use - before.bytes_in_use == torch.cuda.memory_reserved()
            assert torch.cuda.max_memory_allocated() >= 3 * MiB
            del x, y
            assert torch.cuda.memory_allocated() == 0
            torch.cuda.empty_cache()
            assert torch.cuda.memory_reserved() == 0
            assert counters().bytes_in_use == before.bytes_in_use
            torch.cuda.reset_peak_memory_stats()
            assert torch.cuda.max_memory_reserved() == 0
            assert "Allocated memory" in torch.cuda.memory_summary()
        """)

    def test_the_default_policy_is_stitch_and_the_summary_says_so(self):
        out, _ = self.check("""
            x = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
            segs = torch.cuda.memory._snapshot()["segments"]
            assert segs and all(s["is_expandable"] for s in segs), segs
            buf = ctypes.create_string_buffer(1 << 16)
            lib.gpumem_memory_summary(0, buf, len(buf))
            print(buf.value.decode())
        """)
        self.assertIn("gpumem CUDA memory summary", out)
        self.assertIn("stitch", out)

    def test_settings_come_from_gpumem_alloc_conf_and_pytorchs_variables(self):
        self.check("""
            x = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
            segs = torch.cuda.memory._snapshot()["segments"]
            assert not any(s["is_expandable"] for s in segs), segs   # classic: cudaMalloc
            assert segs[0]["total_size"] == 20 * MiB                  # PyTorch's 20 MiB segment
            assert torch.cuda.memory_stats()["max_split_size"] == 64 * MiB
        """, env={"GPUMEM_ALLOC_CONF": "policy:classic",
                  "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})

    def test_memory_fraction_and_out_of_memory_are_pytorchs(self):
        out, _ = self.check("""
            torch.cuda.set_per_process_memory_fraction(0.25)
            try:
                torch.empty(5 << 30, dtype=torch.uint8, device="cuda")
                raise SystemExit("5 GiB fit under a 4 GiB cap")
            except torch.OutOfMemoryError as e:
                print(e)
            assert torch.cuda.memory_stats()["num_ooms"] == 1
        """)
        self.assertIn("Tried to allocate", out)
        self.assertIn("gpumem diagnosis", out)
        self.assertIn("memory fraction", out)

    def test_memory_history_and_snapshot_dump_with_python_stacks(self):
        out, _ = self.check("""
            import pickle, tempfile, os
            torch.cuda.memory._record_memory_history(max_entries=1000)
            def make():
                return torch.empty(7 * MiB, dtype=torch.uint8, device="cuda")
            x = make()
            del x
            snap = torch.cuda.memory._snapshot()
            actions = [e["action"] for e in snap["device_traces"][0]]
            assert "alloc" in actions and "free_completed" in actions, actions
            alloc = next(e for e in snap["device_traces"][0] if e["action"] == "alloc")
            assert alloc["size"] == 7 * MiB
            names = [f["name"] for f in alloc["frames"]]
            assert "make" in names, names
            path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
            torch.cuda.memory._dump_snapshot(path)
            with open(path, "rb") as f:
                dumped = pickle.load(f)
            assert dumped["device_traces"][0], dumped.keys()
            torch.cuda.memory._record_memory_history(enabled=None)
            print(path)
        """)

    def test_stitch_snapshots_draw_memory_reserved_in_memory_viz(self):
        # A 50 MiB tensor stitched from the pages of a freed 60 MiB one while a 20 MiB tensor keeps
        # part of its range (a 100 MiB cap): those pages are mapped at two addresses. The snapshot's
        # segments and memory_viz's rebuild from the history must count them once.
        checker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "replay_cli")
        self.check(f"""
            sys.path.insert(0, {checker!r})
            import memory_viz_check
            torch.cuda.set_per_process_memory_fraction(100 / (16 * 1024))  # of the 16 GiB
            torch.cuda.memory._record_memory_history(max_entries=1000)
            big = torch.empty(60 * MiB, dtype=torch.uint8, device="cuda")
            del big
            keep = torch.empty(20 * MiB, dtype=torch.uint8, device="cuda")
            stitched = torch.empty(50 * MiB, dtype=torch.uint8, device="cuda")
            snap = torch.cuda.memory._snapshot()
            listed = sum(s["total_size"] for s in snap["segments"])
            assert listed == torch.cuda.memory_reserved(), (listed, torch.cuda.memory_reserved())
            result = memory_viz_check.check(snap)
            assert not result["errors"], result["errors"]
            assert max(result["reserved"]) <= 100 * MiB, result["reserved"]
            assert result["reserved"][-1] == torch.cuda.memory_reserved(), result["reserved"]
            mapped = [e for e in snap["device_traces"][0] if e["action"] == "segment_map"]
            assert mapped, snap["device_traces"][0]
            torch.cuda.memory._record_memory_history(enabled=None)
        """, env={"GPUMEM_ALLOC_CONF": "policy:stitch"})

    def test_free_and_empty_cache_stacks_only_under_context_all(self):
        # PyTorch's test_memory_plots_free_stack / _free_segment_stack: a free's stack and
        # empty_cache's are recorded under context="all" only.
        self.check("""
            import json
            for context in ("alloc", "all", "state"):
                torch.cuda.memory.empty_cache()
                torch.cuda.memory._record_memory_history(context=context)
                x = None
                def thealloc():
                    global x
                    x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
                def thefree():
                    global x
                    del x
                def theempty():
                    torch.cuda.memory.empty_cache()
                thealloc()
                thefree()
                theempty()
                text = json.dumps(torch.cuda.memory._snapshot())
                assert ("thefree" in text) == (context == "all"), context
                assert ("theempty" in text) == (context == "all"), context
                assert ("thealloc" in text) == (context != "state"), context
                torch.cuda.memory._record_memory_history(None)
                assert not torch.cuda.memory._snapshot()["device_traces"][0]  # cleared
        """)

    def test_the_profiler_sees_every_allocation_and_free(self):
        self.check("""
            from torch.profiler import profile, ProfilerActivity
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                x = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
                del x
            # The allocation is charged to the op that made it (aten::empty), the free outside
            # any op to a "[memory]" event.
            sizes = {}
            for e in prof.events():
                usage = getattr(e, "device_memory_usage", 0) or getattr(e, "cuda_memory_usage", 0)
                if usage:
                    sizes.setdefault(e.name, []).append(usage)
            assert 5 * MiB in sizes.get("aten::empty", []), sizes
            assert -5 * MiB in sizes.get("[memory]", []), sizes
        """)

    def test_pluggable_allocator_route(self):
        self.check(f"""
            alloc = torch.cuda.memory.CUDAPluggableAllocator({PLUGIN!r}, "gpumem_malloc", "gpumem_free")
            torch.cuda.memory.change_current_allocator(alloc)
            x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
            g = gpumem_stats(lib)
            assert g["allocation.all.current"] == 1, g["allocation.all.current"]
            assert g["requested_bytes.all.current"] == 3 * MiB
            del x
            assert gpumem_stats(lib)["allocation.all.current"] == 0
        """)

    def test_pluggable_route_record_stream_entry_point(self):
        # The route loses tensor.record_stream (PyTorch's pluggable allocator ignores it without a
        # record-stream function): gpumem says so once, and gpumem_record_stream does what it
        # should: a block used on another stream is not reused before that stream's work.
        out, err = self.check(f"""
            alloc = torch.cuda.memory.CUDAPluggableAllocator({PLUGIN!r}, "gpumem_malloc", "gpumem_free")
            torch.cuda.memory.change_current_allocator(alloc)
            lib.gpumem_malloc.restype = ctypes.c_void_p
            lib.gpumem_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            lib.gpumem_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            lib.gpumem_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")   # the warning
            main = torch.cuda.current_stream().cuda_stream
            side = torch.cuda.Stream()
            p = lib.gpumem_malloc(8 * MiB, 0, main)
            lib.gpumem_record_stream(p, side.cuda_stream)
            with torch.cuda.stream(side):
                torch.cuda._sleep(1000)                  # work on the side stream
            lib.gpumem_free(p, 8 * MiB, 0, main)
            q = lib.gpumem_malloc(8 * MiB, 0, main)
            assert q != p, "reused before the side stream's work"
            lib.gpumem_free(q, 8 * MiB, 0, main)
            lib.gpumem_record_stream(12345, side.cuda_stream)  # not gpumem's: reported
            del x
        """, env={"GPUMEM_SIM_EVENT_DELAY": "30"})
        self.assertEqual(err.count("used through CUDAPluggableAllocator"), 1, err)
        self.assertIn("gpumem_record_stream:", err)

    def test_loading_too_late_is_reported_once_and_pytorch_keeps_working(self):
        out, err = self.check(f"""
            x = torch.empty(1000, device="cuda")
            lib = ctypes.CDLL({PLUGIN!r})
            assert lib.gpumem_installed() == 0
            lib.gpumem_empty_cache.restype = ctypes.c_int
            assert lib.gpumem_empty_cache() == -1
            lib.gpumem_last_error.restype = ctypes.c_char_p
            assert b"not PyTorch's CUDA allocator" in lib.gpumem_last_error()
            y = torch.empty(1000, device="cuda")
        """, load_first=False)
        self.assertEqual(err.count("did not install gpumem"), 1, err)
        self.assertIn("too late", err)

    def test_a_malformed_setting_is_reported_once_at_load(self):
        out, err = self.check("""
            assert lib.gpumem_installed() == 0
            x = torch.empty(1000, device="cuda")   # PyTorch's own allocator still serves
        """, env={"GPUMEM_ALLOC_CONF": "policy:sideways"})
        self.assertEqual(err.count("did not install gpumem"), 1, err)
        self.assertIn("GPUMEM_ALLOC_CONF", err)
        self.assertIn("sideways", err)

    def test_install_at_load_0_leaves_installing_to_gpumem_install(self):
        out, err = self.check(f"""
            import os
            os.environ["GPUMEM_TORCH_INSTALL_AT_LOAD"] = "0"
            lib = ctypes.CDLL({PLUGIN!r})
            lib.gpumem_last_error.restype = ctypes.c_char_p
            lib.gpumem_torch_version.restype = ctypes.c_char_p
            assert lib.gpumem_torch_version().decode() == torch.__version__
            assert lib.gpumem_installed() == 0
            assert lib.gpumem_install(b"policy:sideways") == -2       # malformed: nothing changes
            assert b"sideways" in lib.gpumem_last_error(), lib.gpumem_last_error()
            assert lib.gpumem_installed() == 0
            assert lib.gpumem_install(b"policy:classic,max_split_size_mb:64") == 0
            assert lib.gpumem_installed() == 1
            assert lib.gpumem_install(None) == -1                     # once
            assert b"already" in lib.gpumem_last_error()
            x = torch.empty(3 * MiB, dtype=torch.uint8, device="cuda")
            assert gpumem_stats(lib)["allocated_bytes.all.current"] == 3 * MiB
            buf = ctypes.create_string_buffer(1 << 16)
            assert 0 < lib.gpumem_memory_summary(0, buf, len(buf)) < len(buf)
            assert "max_split_size_mb:64,policy:classic" in buf.value.decode(), buf.value
        """, load_first=False)
        self.assertNotIn("did not install", err)

    def test_gpumem_install_too_late_says_so_and_changes_nothing(self):
        self.check(f"""
            import os
            x = torch.empty(1000, device="cuda")
            os.environ["GPUMEM_TORCH_INSTALL_AT_LOAD"] = "0"
            lib = ctypes.CDLL({PLUGIN!r})
            lib.gpumem_last_error.restype = ctypes.c_char_p
            assert lib.gpumem_install(None) == -1
            assert b"too late" in lib.gpumem_last_error(), lib.gpumem_last_error()
            assert lib.gpumem_installed() == 0
            y = torch.empty(1000, device="cuda")
        """, load_first=False)

    def test_c_interface_refuses_bad_input_without_crashing(self):
        self.check("""
            lib.gpumem_malloc.restype = ctypes.c_void_p
            lib.gpumem_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            lib.gpumem_last_error.restype = ctypes.c_char_p
            assert lib.gpumem_malloc(-5, 0, None) is None
            assert b"negative size" in lib.gpumem_last_error()
            assert lib.gpumem_malloc(1024, 9, None) is None      # one simulated GPU
            lib.gpumem_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            lib.gpumem_free(ctypes.c_void_p(12345), 0, 0, None)   # reported, not fatal
            assert b"not allocated by gpumem" in lib.gpumem_last_error()
            lib.gpumem_memory_summary.restype = ctypes.c_size_t
            assert lib.gpumem_memory_summary(-1, None, 0) == ctypes.c_size_t(-1).value
            p = lib.gpumem_malloc(1024, 0, None)
            assert p
            lib.gpumem_free(ctypes.c_void_p(p), 1024, 0, None)
        """)

    # What users do around code that needs cudaMalloc memory (custom all-reduce buffers, DeepEP,
    # UCX): expandable_segments:False before it, :True after.
    SEGMENTS = """
        def segment(t):
            p = t.data_ptr()
            for s in torch.cuda.memory_snapshot():
                if s["address"] <= p < s["address"] + s["total_size"]:
                    return s
            raise AssertionError("no segment holds the tensor")

        def share(t):
            # What torch.multiprocessing does with a CUDA tensor. The simulator has no CUDA IPC:
            # sharing stops at the first CUDA IPC call, which it names on stderr (once a process),
            # cudaIpcGetMemHandle for a cudaMalloc segment.
            try:
                t.untyped_storage()._share_cuda_()
            except RuntimeError as e:
                assert "not supported by gpumem" not in str(e), e

        def mib(n):
            return torch.empty(n * MiB, dtype=torch.uint8, device="cuda")
    """

    def check_segments(self, code, env):
        out, err = self.check(textwrap.dedent(self.SEGMENTS) + textwrap.dedent(code), env)
        self.assertIn("cudaIpcGetMemHandle is not implemented", err)  # shared the cudaMalloc way
        return out, err

    def test_expandable_segments_false_at_run_time_gives_cuda_malloc_memory(self):
        for policy in ("expandable", "stitch"):
            with self.subTest(policy=policy):
                self.check_segments("""
                    a = mib(3)
                    assert segment(a)["is_expandable"]
                    torch.cuda.memory._set_allocator_settings("expandable_segments:False")
                    before = counters()
                    b = mib(3)
                    seg = segment(b)
                    assert not seg["is_expandable"], seg
                    assert counters().malloc == before.malloc + 1
                    assert counters().address_reserve == before.address_reserve
                    share(b)
                    # torch counts both kinds of segment; gpumem_stats is the configured policy's
                    s, g = torch.cuda.memory_stats(), gpumem_stats(lib)
                    assert s["reserved_bytes.all.current"] == \
                        g["reserved_bytes.all.current"] + seg["total_size"], (s, g)
                    assert s["allocated_bytes.all.current"] == \
                        g["allocated_bytes.all.current"] + 3 * MiB, (s, g)
                    del a  # allocated before the switch, freed while it is on
                    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
                    c = mib(3)
                    assert segment(c)["is_expandable"]
                    del b  # freed after switching back
                    assert torch.cuda.memory_allocated() == 3 * MiB
                    torch.cuda.empty_cache()
                    assert counters().free == before.free + 1
                    assert all(not x["address"] == seg["address"]
                               for x in torch.cuda.memory_snapshot())
                    assert torch.cuda.memory_reserved() == \
                        gpumem_stats(lib)["reserved_bytes.all.current"]
                """, env={"GPUMEM_ALLOC_CONF": f"policy:{policy}"})

    def test_under_classic_expandable_segments_at_run_time_changes_nothing(self):
        self.check_segments("""
            torch.cuda.memory._set_allocator_settings("expandable_segments:True")
            a = mib(3)
            torch.cuda.memory._set_allocator_settings("expandable_segments:False")
            b = mib(3)
            assert segment(a)["address"] == segment(b)["address"]  # one 20 MiB segment, split
            assert not segment(a)["is_expandable"]
            share(a)
            assert torch.cuda.memory_stats()["reserved_bytes.all.current"] == \
                gpumem_stats(lib)["reserved_bytes.all.current"] == 20 * MiB
        """, env={"GPUMEM_ALLOC_CONF": "policy:classic"})

    def test_gpumem_legacy_segments_is_the_same_switch_without_pytorchs_setting(self):
        python = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
        self.check_segments(f"""
            import types
            sys.path.insert(0, {python!r})
            info = types.ModuleType("gpumem._build_info")
            info.VERSION, info.PLUGIN, info.PLUGIN_WHY, info.TORCH_VERSION = "0", False, "", ""
            sys.modules["gpumem._build_info"] = info
            import gpumem
            gpumem._lib = gpumem._declare(lib)  # the plugin this test loaded by path
            with gpumem.legacy_segments():
                with gpumem.legacy_segments():
                    a = mib(3)
                b = mib(3)
            c = mib(3)
            assert not segment(a)["is_expandable"] and not segment(b)["is_expandable"]
            assert segment(c)["is_expandable"]
            share(a)
            assert lib.gpumem_set_legacy_segments(0) == 0
            del a, b, c
            torch.cuda.empty_cache()
            assert torch.cuda.memory_reserved() == 0
        """, env={"GPUMEM_ALLOC_CONF": "policy:stitch"})


if __name__ == "__main__":
    PLUGIN, CUDASIM = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    unittest.main(argv=[sys.argv[0], "-v"] + sys.argv[3:])
