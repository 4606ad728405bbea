#!/usr/bin/env python3
"""Tests of tools/trace_model.py and of the traces bundled in examples/traces.

Run:
    python3 tests/trace_model/test_trace_model.py [-v]

The format validator, the bundled-trace checks and the option checks need only the Python
standard library. The tests that run the recorder need torch (and torchvision for resnet50):
they use the interpreter named by GPUMEM_TORCH_PYTHON (e.g. a virtualenv's bin/python), else
the one running this file, and are skipped with a message when it cannot import torch.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tools" / "trace_model.py"
TRACES = REPO / "examples" / "traces"
README = TRACES / "README.md"

MAX_TRACE_BYTES = 1_500_000
MAX_TOTAL_BYTES = 5_000_000
U64 = (1 << 64) - 1

# ---------------------------------------------------------------------------------------------
# Trace format version 1 (docs/trace_format.md): reader and validator


class TraceError(Exception):
    """A violation of the format; the message says whether it is at a byte offset (format
    errors) or an event index (meaning errors)."""


KINDS = ("alloc", "free_requested", "free_completed", "record_stream", "segment_alloc",
         "segment_free")
HEADER_KEYS = ("source", "recorded_config", "recorded_initial_reserved", "device_memory",
               "initial_events")
NUMERIC_HEADER_KEYS = ("recorded_initial_reserved", "device_memory", "initial_events")
_HEX = re.compile(r"0[xX][0-9a-fA-F]+\Z")
_DEC = re.compile(r"[0-9]+\Z")


class TraceSummary:
    """What validate_trace() learned about a trace.

    live bytes are requested bytes: an alloc adds its size, a free_requested removes it (or an
    alloc at an address whose free was requested but not completed returns the old block).
    markers: (comment text, live bytes at that point, number of events before it) for each
    comment line after the first event or between header and events.
    """

    def __init__(self):
        self.header = {}
        self.events = 0
        self.allocations = 0
        self.frees = 0
        self.peak_live_bytes = 0
        self.end_live_bytes = 0
        self.end_live_blocks = 0
        self.markers = []

    def marker_live(self, text):
        for t, live, _ in self.markers:
            if t == text:
                return live
        raise KeyError(text)

    def phase_peak(self, start, end):
        """Peak live bytes between the markers `start` and `end` (needs keep_timeline)."""
        i = next(i for i, (t, _, _) in enumerate(self.markers) if t == start)
        j = next(j for j, (t, _, _) in enumerate(self.markers) if t == end)
        lo, hi = self.markers[i][2], self.markers[j][2]
        return max([self.markers[i][1]] + self.timeline[lo:hi])


def _number(text, what, offset, bits_ok=True):
    if _HEX.match(text):
        value = int(text, 16)
    elif _DEC.match(text):
        value = int(text)
    else:
        raise TraceError("format error at byte offset %d: bad %s %r" % (offset, what, text))
    if value > U64:
        raise TraceError("format error at byte offset %d: %s %s does not fit in 64 bits"
                         % (offset, what, text))
    return value


def validate_trace(source, keep_timeline=False):
    """Reads a version-1 trace (a path or the text) and returns a TraceSummary.

    Raises TraceError at the first violation of docs/trace_format.md.
    """
    if isinstance(source, Path):
        data = source.read_bytes()
    elif isinstance(source, bytes):
        data = source
    else:
        data = source.encode("utf-8")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError("format error at byte offset %d: not UTF-8" % e.start)

    s = TraceSummary()
    timeline = [] if keep_timeline else None
    blocks = {}         # address -> [size, free_requested]
    live = 0
    offset = 0
    first = True
    seen_event = False
    initial_events = 0
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for raw in lines:
        line_offset = offset
        offset += len(raw.encode("utf-8")) + 1
        line = raw[:-1] if raw.endswith("\r") else raw
        if first:
            if line != "gpumem-trace 1":
                raise TraceError("format error at byte offset 0: the first line must be "
                                 "'gpumem-trace 1', not %r" % line[:40])
            first = False
            continue
        if line == "":
            continue
        if line.startswith("#"):
            s.markers.append((line[1:].strip(), live, s.events))
            continue
        if line.startswith("@"):
            if seen_event:
                raise TraceError("format error at byte offset %d: header line after the first "
                                 "event" % line_offset)
            key, _, value = line[1:].partition(" ")
            if key not in HEADER_KEYS:
                raise TraceError("format error at byte offset %d: unknown header key @%s"
                                 % (line_offset, key))
            if key in s.header:
                raise TraceError("format error at byte offset %d: header key @%s given twice"
                                 % (line_offset, key))
            if key in NUMERIC_HEADER_KEYS:
                if not _DEC.match(value):
                    raise TraceError("format error at byte offset %d: @%s needs a decimal "
                                     "number" % (line_offset, key))
                value = _number(value, "@" + key, line_offset)
            s.header[key] = value
            if key == "initial_events":
                initial_events = value
            continue
        fields = re.split(r"[ \t]", line)
        if len(fields) not in (4, 5) or any(f == "" for f in fields):
            raise TraceError("format error at byte offset %d: an event is 'KIND ADDRESS SIZE "
                             "STREAM [TIME_US]' separated by single spaces or tabs: %r"
                             % (line_offset, line[:80]))
        kind = fields[0]
        if kind not in KINDS:
            raise TraceError("format error at byte offset %d: unknown event kind %r"
                             % (line_offset, kind))
        if not _HEX.match(fields[1]):
            raise TraceError("format error at byte offset %d: address %r is not 0x-hexadecimal"
                             % (line_offset, fields[1]))
        address = _number(fields[1], "address", line_offset)
        for what, f in zip(("size", "stream", "time"), fields[2:]):
            if not _DEC.match(f):
                raise TraceError("format error at byte offset %d: %s %r is not decimal"
                                 % (line_offset, what, f))
            _number(f, what, line_offset)
        size = int(fields[2])
        index = s.events
        seen_event = True
        s.events += 1
        if index < initial_events and kind != "alloc":
            raise TraceError("event %d: one of the @initial_events is not an alloc" % index)
        if kind == "alloc":
            if size == 0:
                raise TraceError("event %d: alloc of 0 bytes" % index)
            old = blocks.get(address)
            if old is not None:
                if not old[1]:
                    raise TraceError("event %d: alloc at 0x%x, a block that is still live"
                                     % (index, address))
            blocks[address] = [size, False]
            live += size
            s.allocations += 1
            if live > s.peak_live_bytes:
                s.peak_live_bytes = live
        elif kind == "free_requested":
            block = blocks.get(address)
            if block is None or block[1]:
                raise TraceError("event %d: free_requested of 0x%x, which is not a live block"
                                 % (index, address))
            if size not in (0, block[0]):
                raise TraceError("event %d: free_requested of 0x%x says %d bytes, the block "
                                 "has %d" % (index, address, size, block[0]))
            block[1] = True
            live -= block[0]
            s.frees += 1
        elif kind == "free_completed":
            block = blocks.get(address)
            if block is None or not block[1]:
                raise TraceError("event %d: free_completed of 0x%x, whose free was not "
                                 "requested" % (index, address))
            if size not in (0, block[0]):
                raise TraceError("event %d: free_completed of 0x%x says %d bytes, the block "
                                 "has %d" % (index, address, size, block[0]))
            del blocks[address]
        elif kind == "record_stream":
            block = blocks.get(address)
            if block is None or block[1]:
                raise TraceError("event %d: record_stream of 0x%x, which is not a live block"
                                 % (index, address))
        if timeline is not None:
            timeline.append(live)
    if first:
        raise TraceError("format error at byte offset 0: empty file")
    if initial_events > s.events:
        raise TraceError("event %d: @initial_events %d but only %d events"
                         % (s.events, initial_events, s.events))
    s.end_live_bytes = live
    s.end_live_blocks = sum(1 for b in blocks.values() if not b[1])
    if timeline is not None:
        s.timeline = timeline
    return s


def loaded_bytes(summary):
    """Live bytes at the '# model loaded' comment of a trace_model.py trace."""
    for text, live, _ in summary.markers:
        if text.startswith("model loaded:"):
            return live
    raise KeyError("no '# model loaded' comment")


def model_comment(summary):
    """(parameter bytes, bytes with buffers) from the '# model loaded: ...' comment."""
    for text, _, _ in summary.markers:
        m = re.match(r"model loaded: \d+ parameter tensors, (\d+) parameter bytes, (\d+) bytes "
                     r"with buffers", text)
        if m:
            return int(m.group(1)), int(m.group(2))
    raise KeyError("no '# model loaded' comment")


# ---------------------------------------------------------------------------------------------
# README of the bundled traces

_ROW = re.compile(r"^\|\s*`([^`]+\.trace)`\s*\|\s*([\d,]+)\s*\|\s*([\d,]+)\s*\|\s*([\d,]+)\s*\|")
_CMD = re.compile(r"^(?:python3 )?tools/trace_model\.py .*--output examples/traces/(\S+\.trace)")


def readme_table(path=README):
    """{file name: (events, allocations, peak live bytes)} from the README's table."""
    rows = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _ROW.match(line.strip())
        if m:
            nums = tuple(int(g.replace(",", "")) for g in m.groups()[1:])
            if m.group(1) in rows:
                raise ValueError("%s is listed twice" % m.group(1))
            rows[m.group(1)] = nums
    return rows


def readme_commands(path=README):
    """{file name: command line} for each 'tools/trace_model.py ... --output ...' line."""
    cmds = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = _CMD.match(line.strip())
        if m:
            cmds[m.group(1)] = line.strip()
    return cmds


# ---------------------------------------------------------------------------------------------
# Running the script

def torch_python():
    return os.environ.get("GPUMEM_TORCH_PYTHON") or sys.executable


_torch_state = {}


def torch_info():
    """(torch version or None, torchvision available) for torch_python()."""
    if "info" not in _torch_state:
        code = ("import json, torch\n"
                "try:\n import torchvision; tv = True\nexcept ImportError:\n tv = False\n"
                "print(json.dumps([torch.__version__, tv]))")
        try:
            r = subprocess.run([torch_python(), "-c", code], capture_output=True, text=True,
                               timeout=300)
            info = tuple(json.loads(r.stdout.strip().splitlines()[-1])) if r.returncode == 0 \
                else (None, False)
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            info = (None, False)
        _torch_state["info"] = info
    return _torch_state["info"]


def run_script(args, python=None, timeout=600):
    return subprocess.run([python or torch_python(), str(SCRIPT)] + list(args),
                          capture_output=True, text=True, timeout=timeout, cwd=str(REPO))


class TorchTestCase(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        version, _ = torch_info()
        if version is None:
            raise unittest.SkipTest(
                "torch is not importable by %s; set GPUMEM_TORCH_PYTHON to an interpreter "
                "that has it (e.g. a virtualenv's bin/python)" % torch_python())
        cls.tmp = tempfile.TemporaryDirectory(prefix="trace_model_test_")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def trace(self, *args, keep_timeline=True):
        """Runs the script with `args`, checks it succeeded, returns (summary, text, stderr)."""
        out = Path(self.tmp.name) / ("t%d.trace" % len(os.listdir(self.tmp.name)))
        r = run_script(list(args) + ["--output", str(out)])
        self.assertEqual(r.returncode, 0, "trace_model.py %s failed:\n%s" % (args, r.stderr))
        text = out.read_text(encoding="utf-8")
        summary = validate_trace(text, keep_timeline=keep_timeline)
        m = re.search(r": (\d+) events, (\d+) allocations, peak live bytes (\d+)", r.stderr)
        self.assertIsNotNone(m, "no summary line on stderr: %r" % r.stderr)
        self.assertEqual(
            (int(m.group(1)), int(m.group(2)), int(m.group(3))),
            (summary.events, summary.allocations, summary.peak_live_bytes),
            "the stderr summary disagrees with the trace")
        self.assertNotIn("untracked", r.stderr)
        return summary, text, r.stderr


# ---------------------------------------------------------------------------------------------
# Tests that need no torch


class ValidatorTest(unittest.TestCase):
    GOOD = ("gpumem-trace 1\n# comment\n@source pytorch-snapshot\n@recorded_config x y\n"
            "@recorded_initial_reserved 1073741824\n@device_memory 85899345920\n"
            "@initial_events 2\n"
            "alloc 0x7f0000000000 4194304 0\n"
            "alloc 0x7f0000400000 1024 0\n"
            "alloc 0x7f0000600000 1572864 0 1772552894612373\n"
            "free_requested 0x7f0000600000 1572864 0 1772552894612400\n"
            "free_completed 0x7f0000600000 1572864 0 1772552894612401\n"
            "record_stream 0x7f0000400000 0 7\n"
            "segment_alloc 0x7f0000800000 20971520 0\n"
            "segment_free\t0x7f0000800000\t20971520\t0\n")

    def test_documented_example_is_valid(self):
        s = validate_trace(self.GOOD)
        self.assertEqual(s.events, 8)
        self.assertEqual(s.allocations, 3)
        self.assertEqual(s.peak_live_bytes, 4194304 + 1024 + 1572864)
        self.assertEqual(s.end_live_bytes, 4194304 + 1024)
        self.assertEqual(s.header["initial_events"], 2)

    def test_free_requested_without_completed_returns_block(self):
        validate_trace("gpumem-trace 1\nalloc 0x200 10 0\nfree_requested 0x200 0 0\n"
                       "alloc 0x200 20 0\n")

    def assert_invalid(self, text, fragment):
        with self.assertRaises(TraceError) as cm:
            validate_trace(text)
        self.assertIn(fragment, str(cm.exception))

    def test_violations(self):
        head = "gpumem-trace 1\n"
        self.assert_invalid("gpumem-trace 2\n", "byte offset 0")
        self.assert_invalid(head + "@colour red\n", "unknown header key")
        self.assert_invalid(head + "@source a\n@source b\n", "twice")
        self.assert_invalid(head + "alloc 0x0 1 0\n@source a\n", "after the first event")
        self.assert_invalid(head + "alloc 0x0 0 0\n", "event 0")
        self.assert_invalid(head + "alloc 0x0 1 0\nalloc 0x0 1 0\n", "still live")
        self.assert_invalid(head + "free_requested 0x0 1 0\n", "not a live block")
        self.assert_invalid(head + "alloc 0x0 1 0\nfree_completed 0x0 1 0\n", "not requested")
        self.assert_invalid(head + "alloc 0x0 1 0\nfree_requested 0x0 2 0\n", "says 2 bytes")
        self.assert_invalid(head + "alloc 0x0 1 0\nfree_requested 0x0 1 0\n"
                            "free_requested 0x0 1 0\n", "not a live block")
        self.assert_invalid(head + "alloc 123 1 0\n", "not 0x-hexadecimal")
        self.assert_invalid(head + "alloc 0x0 -1 0\n", "not decimal")
        self.assert_invalid(head + "alloc 0x10000000000000000 1 0\n", "64 bits")
        self.assert_invalid(head + "alloc 0x0 1 0 5 6\n", "single spaces")
        self.assert_invalid(head + "alloc  0x0 1 0\n", "single spaces")
        self.assert_invalid(head + "malloc 0x0 1 0\n", "unknown event kind")
        self.assert_invalid(head + "@initial_events 1\nrecord_stream 0x0 0 1\n", "event 0")


class BundledTracesTest(unittest.TestCase):
    def setUp(self):
        self.files = sorted(p.name for p in TRACES.glob("*.trace"))

    def test_bundled_traces_exist_and_fit_the_size_budget(self):
        self.assertGreaterEqual(len(self.files), 3, "no bundled traces in %s" % TRACES)
        total = 0
        for name in self.files:
            size = (TRACES / name).stat().st_size
            self.assertLess(size, MAX_TRACE_BYTES, name)
            total += size
        self.assertLess(total, MAX_TOTAL_BYTES)

    def test_readme_lists_every_trace_with_its_command(self):
        table = readme_table()
        cmds = readme_commands()
        self.assertEqual(sorted(table), self.files, "README table vs. *.trace files")
        self.assertEqual(sorted(cmds), self.files, "README commands vs. *.trace files")

    def test_bundled_traces_are_valid_and_match_readme(self):
        table = readme_table()
        cmds = readme_commands()
        for name in self.files:
            with self.subTest(trace=name):
                s = validate_trace(TRACES / name)
                self.assertEqual((s.events, s.allocations, s.peak_live_bytes), table[name],
                                 "%s: (events, allocations, peak live bytes)" % name)
                source = s.header.get("source", "")
                self.assertTrue(source.startswith("trace_model.py "), source)
                model = re.search(r"--model (\S+)", cmds[name]).group(1)
                self.assertEqual(source.split()[1], model)
                # The model's parameters and buffers are loaded first; the trace ends with
                # them and AdamW's two states per parameter live, gradients freed.
                params, with_buffers = model_comment(s)
                self.assertEqual(loaded_bytes(s), with_buffers)
                self.assertEqual(s.end_live_bytes, with_buffers + 2 * params)
                self.assertGreaterEqual(s.peak_live_bytes, with_buffers + 4 * params)


class OptionsTest(unittest.TestCase):
    """Argument checking happens before torch is imported: any python3 runs these."""

    BAD = [
        [],
        ["--model", "gpt3"],
        ["--model", "gpt2", "--batch-size", "0"],
        ["--model", "gpt2", "--seq-len", "0"],
        ["--model", "gpt2", "--seq-len", "2048"],
        ["--model", "gpt2", "--steps", "0"],
        ["--model", "gpt2", "--grad-accum-steps", "0"],
        ["--model", "gpt2", "--dtype", "float16"],
        ["--model", "gpt2", "--batch-size", "two"],
        ["--model", "gpt2", "--image-size", "224"],
        ["--model", "gpt2", "--layers", "0"],
        ["--model", "gpt2", "--attention", "flash"],
        ["--model", "gpt2", "--dropout", "1.5"],
        ["--model", "llama", "--dropout", "0.1"],
        ["--model", "resnet50", "--seq-len", "128"],
        ["--model", "resnet50", "--layers", "2"],
        ["--model", "resnet50", "--image-size", "8"],
        ["--model", "gpt2", "--bogus"],
        ["--model", "gpt2", "--output", "/nonexistent-folder/x.trace"],
        ["--module", "mymodels"],
        ["--module", ":make"],
        ["--module", "mymodels:make-it"],
        ["--module", "mymodels:make", "--model", "gpt2"],
        ["--module", "mymodels:make", "--batch-size", "2"],
        ["--module", "mymodels:make", "--checkpointing"],
        ["--module", "mymodels:make", "--attention", "math"],
        ["--module", "mymodels:make", "--steps", "0"],
    ]

    def test_bad_options_exit_nonzero_with_a_message(self):
        for args in self.BAD:
            with self.subTest(args=args):
                r = run_script(args, python=sys.executable, timeout=120)
                self.assertNotEqual(r.returncode, 0)
                self.assertIn("error:", r.stderr)
                self.assertEqual(r.stdout, "")

    def test_help(self):
        r = run_script(["--help"], python=sys.executable, timeout=120)
        self.assertEqual(r.returncode, 0)
        self.assertIn("--grad-accum-steps", r.stdout)

    def test_missing_torch_gives_a_friendly_message(self):
        code = ("import runpy, sys\nsys.modules['torch'] = None\n"
                "sys.argv = [%r, '--model', 'gpt2']\nrunpy.run_path(%r, run_name='__main__')"
                % (str(SCRIPT), str(SCRIPT)))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("pip install torch", r.stderr)
        self.assertNotIn("Traceback", r.stderr)


# ---------------------------------------------------------------------------------------------
# Tests that run the recorder (need torch)

# llama-tiny: hidden 512, 8 heads, 2 kv heads (head_dim 64), MLP 1536, vocab 32000, tied.
LLAMA_TINY_EMBED = 32000 * 512
LLAMA_TINY_LAYER = (512 * 512 + 2 * 512 * 128 + 512 * 512   # q, k, v, o projections
                    + 3 * 512 * 1536                       # gate, up, down
                    + 2 * 512)                             # two RMSNorm weights
LLAMA_TINY_INV_FREQ = 64 // 2                              # rotary buffer, head_dim / 2

# GPT-2 small: width 768, vocab 50257, context 1024, tied lm_head.
GPT2_EMBED = 50257 * 768 + 1024 * 768
GPT2_LAYER = 12 * 768 * 768 + 13 * 768
GPT2_FINAL_NORM = 2 * 768

# ResNet-50 (torchvision): 25,557,032 parameters; BatchNorm buffers: running mean and variance
# over 26,560 channels in all, and one int64 num_batches_tracked in each of 53 layers.
RESNET50_PARAMS = 25557032
RESNET50_BUFFER_BYTES = 2 * 26560 * 4 + 53 * 8


class RecorderMechanismTest(TorchTestCase):
    """Drives the recorder with hand-written tensor code whose events are known exactly."""

    SNIPPET = r"""
import json, sys
sys.dont_write_bytecode = True
sys.path.insert(0, %r)
import torch
import trace_model
Recorder = trace_model.build_recorder_class()
rec = Recorder()
with rec:
    a = torch.empty(1000, device="meta")          # 4000 bytes
    b = a * 2                                     # 4000; live 8000
    c = b.view(10, 100)                           # a view: no allocation
    d = b[5:]                                     # another view
    rec.mark("views")
    del a                                         # a dies; live 4000
    e = torch.cat([c, c])                         # 8000; live 12000
    del b, c                                      # d still holds b's storage
    rec.mark("b held by d")
    f = e + 1                                     # 8000; live 20000 (peak)
    del d                                         # b's storage dies; live 16000
    rec.mark("b dead")
    e.add_(1)                                     # in place: nothing
    del e, f                                      # live 0
    g = torch.empty(0, device="meta")             # zero bytes: no allocation
    x = torch.empty(8, 16, device="meta", dtype=torch.bfloat16)   # 256 bytes
    w = torch.empty(4, 16, device="meta", requires_grad=True)     # 256 bytes
    y = (x.float() @ w.t()).sum()                 # x.float(): 512, mm: 128, sum: 4
    rec.mark("forward")
    y.backward()
    rec.mark("backward")
    del x, y
    w.grad = None
    rec.mark("grad dropped")
print(json.dumps({"lines": rec.lines, "peak": rec.peak_live_bytes, "live": rec.live_bytes,
                  "untracked": rec.untracked_inputs}))
"""

    def test_storage_births_and_deaths(self):
        code = self.SNIPPET % str(SCRIPT.parent)
        r = subprocess.run([torch_python(), "-c", code], capture_output=True, text=True,
                           timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout.strip().splitlines()[-1])
        text = "gpumem-trace 1\n" + "\n".join(out["lines"]) + "\n"
        s = validate_trace(text, keep_timeline=True)
        self.assertEqual(out["untracked"], 0)
        self.assertEqual(s.marker_live("views"), 8000)
        self.assertEqual(s.marker_live("b held by d"), 4000 + 8000)
        self.assertEqual(s.marker_live("b dead"), 8000 + 8000)
        self.assertEqual(s.phase_peak("views", "forward"), 20000)
        lines = out["lines"]
        kinds = [l.split()[0] for l in lines if not l.startswith("#")]
        # a, b, e, f; then x, w, x.float(), mm, sum, and what backward allocates.
        self.assertEqual(kinds[:3], ["alloc", "alloc", "free_requested"])
        self.assertEqual(kinds.count("free_requested"), kinds.count("free_completed"))
        for i, line in enumerate(lines):
            if line.startswith("free_requested"):
                self.assertEqual(lines[i + 1].replace("free_completed", "free_requested"),
                                 line, "free_completed must follow its free_requested")
        # Forward: x (256) + w (256) + x.float() (512, saved for backward) + sum (4); the
        # mm output (128) died once sum() had run.
        self.assertEqual(s.marker_live("forward"), 256 + 256 + 512 + 4)
        # After backward: saved x.float() released, w.grad (256) kept, y's 4 bytes kept.
        self.assertEqual(s.marker_live("backward"), 256 + 256 + 4 + 256)
        self.assertEqual(s.marker_live("grad dropped"), 256)
        self.assertEqual(out["live"], 256)
        # Allocation sizes are the storages' nbytes; addresses are 512-byte aligned.
        for line in lines:
            if line.startswith("alloc"):
                self.assertEqual(int(line.split()[1], 16) % 512, 0)
                self.assertGreater(int(line.split()[2]), 0)


USER_MODULE = """
import torch
from torch import nn


class WithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 10))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def make_mlp():
    def batch(device):
        return (torch.empty(64, 1024, device=device),
                torch.empty(64, dtype=torch.long, device=device))
    return WithLoss(), batch


def not_a_pair():
    return 3
"""


class UserModuleTest(TorchTestCase):
    """--module MODULE:FUNCTION: the user's own model, imported from the current folder."""

    def run_in(self, *args):
        folder = Path(self.tmp.name) / "user"
        folder.mkdir(exist_ok=True)
        (folder / "mymodels.py").write_text(USER_MODULE, encoding="utf-8")
        return subprocess.run([torch_python(), str(SCRIPT)] + list(args), capture_output=True,
                              text=True, timeout=600, cwd=str(folder))

    def test_user_model_is_recorded(self):
        out = Path(self.tmp.name) / "mlp.trace"
        r = self.run_in("--module", "mymodels:make_mlp", "--output", str(out))
        self.assertEqual(r.returncode, 0, r.stderr)
        text = out.read_text(encoding="utf-8")
        summary = validate_trace(text)
        self.assertIn("@source trace_model.py module mymodels:make_mlp accum=1 dtype=float32 "
                      "steps=2", text)
        # Two float32 linear layers: weights and biases.
        params = (1024 * 4096 + 4096 + 4096 * 10 + 10) * 4
        self.assertIn("parameters %d bytes" % params, r.stderr)
        # After the steps: the parameters and AdamW's two states (gradients set to None).
        self.assertIn("end live bytes %d" % (3 * params), r.stderr)
        self.assertGreater(summary.peak_live_bytes, 4 * params)  # + gradients + activations

    def test_user_model_errors(self):
        r = self.run_in("--module", "mymodels:not_a_pair")
        self.assertEqual(r.returncode, 2)
        self.assertIn("must return (model, make_batch)", r.stderr)
        r = self.run_in("--module", "mymodels:missing")
        self.assertEqual(r.returncode, 2)
        self.assertIn("mymodels has no function missing", r.stderr)
        r = self.run_in("--module", "nosuchmodule:f")
        self.assertEqual(r.returncode, 2)
        self.assertIn("cannot import nosuchmodule", r.stderr)


class TraceModelScriptTest(TorchTestCase):
    def test_llama_tiny_hand_calculation(self):
        # One block, batch 1 x 8 tokens: activations are tiny next to the parameters.
        s, text, _ = self.trace("--model", "llama-tiny", "--layers", "1", "--batch-size", "1",
                                "--seq-len", "8")
        self.assertTrue(text.startswith("gpumem-trace 1\n"))
        self.assertEqual(
            s.header["source"],
            "trace_model.py llama-tiny batch=1 seq=8 ckpt=0 accum=1 dtype=float32 steps=2 "
            "layers=1 attention=efficient")
        P = 4 * (LLAMA_TINY_EMBED + LLAMA_TINY_LAYER + 512)    # + final norm
        buf = 4 * LLAMA_TINY_INV_FREQ
        self.assertEqual(model_comment(s), (P, P + buf))
        # The model is loaded first.
        self.assertEqual(loaded_bytes(s), P + buf)
        self.assertEqual(s.marker_live("step 1 micro 1 forward"), P + buf)
        # After backward: parameters and one gradient per parameter; activations all freed.
        self.assertEqual(s.marker_live("step 1 optimizer"), 2 * P + buf)
        # AdamW (foreach) creates exp_avg and exp_avg_sq, then one sqrt(exp_avg_sq)
        # temporary per parameter: parameters + gradients + 2 states + temporaries.
        self.assertEqual(s.phase_peak("step 1 optimizer", "step 1 zero_grad"), 5 * P + buf)
        self.assertEqual(s.marker_live("step 1 zero_grad"), 4 * P + buf)
        # zero_grad(set_to_none=True) frees the gradients.
        self.assertEqual(s.marker_live("step 2 micro 1 forward"), 3 * P + buf)
        self.assertEqual(s.phase_peak("step 2 optimizer", "step 2 zero_grad"), 5 * P + buf)
        self.assertEqual(s.end_live_bytes, 3 * P + buf)
        self.assertGreaterEqual(s.peak_live_bytes, 5 * P + buf)
        self.assertEqual(s.end_live_blocks, 3 * 11 + 1)   # 11 parameter tensors, inv_freq

    def test_gpt2_parameters_and_steady_state(self):
        s, _, _ = self.trace("--model", "gpt2", "--layers", "1", "--batch-size", "1",
                             "--seq-len", "16", "--steps", "3")
        P = 4 * (GPT2_EMBED + GPT2_LAYER + GPT2_FINAL_NORM)
        self.assertEqual(loaded_bytes(s), P)
        for step in (2, 3):
            self.assertEqual(s.marker_live("step %d micro 1 forward" % step), 3 * P)
        self.assertEqual(s.end_live_bytes, 3 * P)
        # Steady state: steps 2 and 3 see the same peaks.
        self.assertEqual(s.phase_peak("step 2 micro 1 forward", "step 2 zero_grad"),
                         s.phase_peak("step 3 micro 1 forward", "step 3 zero_grad"))

    def test_bfloat16_halves_the_model(self):
        s, _, _ = self.trace("--model", "llama-tiny", "--layers", "1", "--batch-size", "1",
                             "--seq-len", "8", "--dtype", "bfloat16", "--steps", "1")
        P = 2 * (LLAMA_TINY_EMBED + LLAMA_TINY_LAYER + 512)
        self.assertEqual(loaded_bytes(s), P + 2 * LLAMA_TINY_INV_FREQ)
        self.assertIn("attention=flash", s.header["source"])

    def test_checkpointing_lowers_peak(self):
        common = ["--model", "llama-tiny", "--batch-size", "4", "--seq-len", "256"]
        plain, _, _ = self.trace(*common)
        ckpt, _, _ = self.trace(*common, "--checkpointing")
        self.assertIn("ckpt=1", ckpt.header["source"])
        self.assertLess(ckpt.peak_live_bytes, plain.peak_live_bytes)
        # Saved activations at the end of the forward pass drop a lot.
        self.assertLess(ckpt.marker_live("step 2 micro 1 backward"),
                        plain.marker_live("step 2 micro 1 backward"))
        # Recomputation allocates more, and everything still dies.
        self.assertGreater(ckpt.allocations, plain.allocations)
        self.assertEqual(ckpt.end_live_bytes, plain.end_live_bytes)

    def test_grad_accumulation_with_half_batch_lowers_activation_peak(self):
        common = ["--model", "llama-tiny", "--seq-len", "256"]
        full, _, _ = self.trace(*common, "--batch-size", "8")
        half, _, _ = self.trace(*common, "--batch-size", "4", "--grad-accum-steps", "2")
        self.assertIn("accum=2", half.header["source"])
        for micro in (1, 2):
            half.marker_live("step 2 micro %d backward" % micro)
        start_full = full.marker_live("step 2 micro 1 forward")
        start_half = half.marker_live("step 2 micro 1 forward")
        self.assertEqual(start_full, start_half)
        act_full = full.phase_peak("step 2 micro 1 forward", "step 2 optimizer") - start_full
        act_half = half.phase_peak("step 2 micro 1 forward", "step 2 optimizer") - start_half
        self.assertLess(act_half, act_full)
        self.assertLess(half.peak_live_bytes, full.peak_live_bytes)
        self.assertEqual(half.end_live_bytes, full.end_live_bytes)

    def test_resnet50_parameters(self):
        if not torch_info()[1]:
            self.skipTest("torchvision is not importable by %s" % torch_python())
        s, _, _ = self.trace("--model", "resnet50", "--batch-size", "2", "--image-size", "64",
                             "--steps", "1", "--checkpointing")
        P = 4 * RESNET50_PARAMS
        self.assertEqual(model_comment(s), (P, P + RESNET50_BUFFER_BYTES))
        self.assertEqual(loaded_bytes(s), P + RESNET50_BUFFER_BYTES)
        self.assertEqual(s.end_live_bytes, 3 * P + RESNET50_BUFFER_BYTES)

    def test_stdout_output(self):
        r = run_script(["--model", "llama-tiny", "--layers", "1", "--batch-size", "1",
                        "--seq-len", "4", "--steps", "1"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.startswith("gpumem-trace 1\n@source trace_model.py "))
        validate_trace(r.stdout)
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)

    def test_bundled_traces_are_reproducible(self):
        version = torch_info()[0]
        cmds = readme_commands()
        for name, cmd in sorted(cmds.items()):
            expected = (TRACES / name).read_text(encoding="utf-8")
            m = re.search(r"^# recorded with torch (\S+)", expected, re.M)
            with self.subTest(trace=name):
                if m is None or m.group(1) != version:
                    self.skipTest("%s was recorded with another torch than %s" % (name, version))
                if "resnet50" in cmd and not torch_info()[1]:
                    self.skipTest("torchvision is not importable")
                argv = shlex.split(cmd)
                argv = argv[argv.index("tools/trace_model.py") + 1:]
                out = Path(self.tmp.name) / name
                argv[argv.index("--output") + 1] = str(out)
                r = run_script(argv)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(out.read_text(encoding="utf-8"), expected,
                                 "%s differs from the README command's output" % name)


if __name__ == "__main__":
    unittest.main()
