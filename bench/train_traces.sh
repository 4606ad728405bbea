#!/usr/bin/env bash
# Records the allocation traces of a LibTorch GPT-style training loop (activation checkpointing
# off/on, gradient accumulation K = 1/4, float32 and autocast to bfloat16; bench/train_traces.cpp)
# and replays each on a simulated
# 80 GiB GPU under gpumem's three policies and PyTorch's own allocator (native and
# expandable_segments:True), printing bench/README.md's table.
#
#   bash bench/train_traces.sh [BUILD_DIR]      (default: build; needs torch: bash tools/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
recorder=$build/bench/gpumem_train_traces
replay=$build/tools/replay/gpumem-replay
for tool in "$recorder" "$replay"; do
  [ -x "$tool" ] || { echo "train_traces.sh: $tool is missing: build with torch (bash tools/test.sh)" >&2; exit 1; }
done
out=$build/train-traces
mkdir -p "$out"
names="nockpt-k1 nockpt-k4 ckpt-k1 ckpt-k4 nockpt-k1-bf16 nockpt-k4-bf16 ckpt-k1-bf16 ckpt-k4-bf16"
export names
"$recorder" "$out" >&2
{
  for name in $names; do
    trace=$out/gpt-$name.trace
    "$replay" "$trace" --device-memory 80GiB --no-costs --json --find-min-memory \
      --compare policy:classic policy:expandable policy:stitch | sed "s|^|$name gpumem |"
    "$replay" "$trace" --device-memory 80GiB --no-costs --json --find-min-memory --allocator pytorch \
      --compare "" expandable_segments:True | sed "s|^|$name pytorch |"
  done
} | python3 -c '
import json, os, sys
from collections import defaultdict
rows = defaultdict(dict)
buf = defaultdict(str)
for line in sys.stdin:
    name, who, text = line.split(" ", 2)
    buf[(name, who)] += text
for (name, who), text in buf.items():
    for r in json.loads(text):
        label = r["config"] if who == "gpumem" else ("pytorch " + (r["config"] or "native"))
        rows[name]["requested"] = r["peak_requested_bytes"]
        rows[name][label] = (r["peak_reserved_bytes"], r.get("min_device_memory_bytes"))
cols = ["policy:classic", "policy:expandable", "policy:stitch", "pytorch native", "pytorch expandable_segments:True"]
MiB = 1 << 20
print("| trace | peak requested | " + " | ".join(c.replace("policy:", "gpumem ") for c in cols) + " |")
print("|---|---:|" + "---:|" * len(cols))
for name in os.environ["names"].split():
    r = rows[name]
    req = r["requested"]
    cells = [f"{r[c][0] / MiB:.0f} MiB ({r[c][0] / req:.3f}x)" for c in cols]
    print(f"| gpt-{name} | {req / MiB:.0f} MiB | " + " | ".join(cells) + " |")
print()
print("Smallest device (MiB) on which each completes:")
print("| trace | " + " | ".join(c.replace("policy:", "gpumem ") for c in cols) + " |")
print("|---|" + "---:|" * len(cols))
for name in os.environ["names"].split():
    r = rows[name]
    print(f"| gpt-{name} | " + " | ".join(f"{r[c][1] / MiB:.0f}" for c in cols) + " |")
'
