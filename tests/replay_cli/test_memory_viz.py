#!/usr/bin/env python3
"""gpumem-replay --export-snapshot, as pytorch.org/memory_viz and torch.cuda._memory_viz see it.

For each policy, on the quick start's run (the GPT-2 step on a 3 GiB device: classic runs out of
memory), a bundled trace and a real snapshot, exports the replay and
  - rebuilds the memory at every event as memory_viz does (memory_viz_check.py): every position
    can be drawn, and the highest reserved memory it shows is the replay's peak reserved memory
    (gpumem-replay --json), the last position the reserved memory at the end;
  - checks the export's keys: the mapped parts of VMM ranges (is_expandable), segment and oom
    events, time_us where the trace recorded times;
  - where a Python with torch is given, runs torch.cuda._memory_viz on it: segsum, trace, segments
    and memory (flame graph input), trace_plot and segment_plot (HTML), compare.

usage: test_memory_viz.py PATH/TO/gpumem-replay SOURCE_DIR [TORCH_PYTHON]
"""
import json
import os
import pickle
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory_viz_check  # noqa: E402

TORCH_CHECK = r"""
import pickle, sys
import torch.cuda._memory_viz as viz
identity = lambda text: text
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        data = pickle.load(f)
    assert viz.segsum(data)
    viz.trace(data)
    assert viz.segments(data, format_flamegraph=identity) is not None
    assert viz.memory(data, format_flamegraph=identity) is not None
    assert "<html" in viz.trace_plot(data).lower()
    assert "<html" in viz.trace_plot(data, plot_segments=True).lower()
    assert "<html" in viz.segment_plot(data).lower()
    viz.compare(data["segments"], data["segments"], format_flamegraph=identity)
    print("torch.cuda._memory_viz read", path)
"""

failures = []


def fail(message):
    failures.append(message)
    print("FAIL:", message)


def main(argv):
    if len(argv) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    replay, source = argv[1], argv[2]
    torch_python = argv[3] if len(argv) > 3 and argv[3] else None
    runs = [
        ("examples/traces/gpt2-small-b4-s512-ckpt.trace", "3GiB"),
        ("examples/traces/resnet50-b32.trace", "80GiB"),
        ("examples/traces/real/transformer-forward-bf16.pickle", "80GiB"),
    ]
    exports = []
    with tempfile.TemporaryDirectory() as work:
        for trace, device in runs:
            for policy in ("classic", "expandable", "stitch"):
                name = f"{os.path.basename(trace)} policy:{policy} {device}"
                out = os.path.join(work, f"{len(exports)}.pickle")
                proc = subprocess.run(
                    [replay, os.path.join(source, trace), "--device-memory", device, "--config",
                     f"policy:{policy}", "--json", "--export-snapshot", out],
                    capture_output=True, text=True)
                if proc.returncode != 0:
                    fail(f"{name}: gpumem-replay exited with {proc.returncode}: {proc.stderr}")
                    continue
                record = json.loads(proc.stdout)[0]
                with open(out, "rb") as f:
                    snapshot = pickle.load(f)
                result = memory_viz_check.check(snapshot)
                for e in result["errors"][:5]:
                    fail(f"{name}: {e}")
                events = snapshot["device_traces"][0]
                shown = result["reserved"]
                if record["initial_events"] == 0 and shown and max(shown) != record[
                        "peak_reserved_bytes"]:
                    fail(f"{name}: memory_viz's highest reserved memory is {max(shown)}, "
                         f"the replay's peak {record['peak_reserved_bytes']}")
                segments = snapshot["segments"]
                expandable = {s["is_expandable"] for s in segments}
                if expandable != {policy != "classic"}:
                    fail(f"{name}: is_expandable {expandable}")
                actions = {e["action"] for e in events}
                wanted = {"segment_alloc"} if policy == "classic" else {"segment_map"}
                if not wanted <= actions:
                    fail(f"{name}: no {wanted} events")
                ooms = [e for e in events if e["action"] == "oom"]
                if record["completed"] == bool(ooms):
                    fail(f"{name}: completed {record['completed']} but {len(ooms)} oom events")
                if ooms and ("device_free" not in ooms[0] or ooms[-1] is not events[-1]):
                    fail(f"{name}: the oom event is not last or has no device_free")
                timed = trace.endswith(".pickle")  # the real snapshot recorded times
                if timed and not all("time_us" in e for e in events):
                    fail(f"{name}: events without time_us")
                if not record["completed"] and policy == "classic" and "3GiB" == device:
                    if not {"segment_free", "oom"} <= actions:
                        fail(f"{name}: the out-of-memory run has no segment_free / oom")
                print(f"{name}: {len(events)} events, every position drawn, "
                      f"peak {max(shown) if shown else 0} bytes reserved")
                exports.append(out)
        if torch_python:
            proc = subprocess.run([torch_python, "-c", TORCH_CHECK] + exports,
                                  capture_output=True, text=True)
            sys.stdout.write(proc.stdout)
            if proc.returncode != 0:
                fail(f"torch.cuda._memory_viz: {proc.stderr[-2000:]}")
        else:
            print("note: no Python with torch given: torch.cuda._memory_viz not run")
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("all memory_viz export checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
