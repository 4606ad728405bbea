#!/usr/bin/env bash
# The per-trace comparison of bench/README.md: every real PyTorch snapshot in examples/traces/real and
# every bundled trace, replayed by gpumem (classic, expandable, stitch), by PyTorch 2.11's own
# allocator (default, expandable_segments:True) and by CUB's CachingDeviceAllocator (defaults), on
# an 80 GiB simulated device; peak reserved memory, device calls, simulated time in device calls
# (gpumem only: the CUDA simulator charges none) and the smallest device. Prints Markdown.
#   bash bench/replay_allocators.sh [path/to/gpumem-replay]   (needs a build with torch for pytorch)
set -euo pipefail
cd "$(dirname "$0")/.."
replay=${1:-build/tools/replay/gpumem-replay}
# shellcheck source=bench/replay_common.sh
source bench/replay_common.sh
for f in "${traces[@]}"; do
  "$replay" "$f" --compare policy:classic policy:expandable policy:stitch --find-min-memory --json --progress never
  "$replay" "$f" --allocator pytorch --compare "" expandable_segments:True --find-min-memory --json --progress never
  "$replay" "$f" --allocator cub --compare "" --find-min-memory --json --progress never
done | json_lines | python3 -c '
import json, sys
gib = float(1 << 30)
runs = []
for line in sys.stdin:
    runs.extend(json.loads(line))
print("| trace | allocator | config | peak reserved GiB (÷ requested) | device alloc / free calls | simulated device time | min device GiB |")
print("| --- | --- | --- | --- | --- | --- | --- |")
last = None
for r in runs:
    name = r["trace"].split("/")[-1]
    req = r["peak_requested_bytes"]
    res = r["peak_reserved_bytes"]
    cell = ("%.3f (%.3f)" % (res / gib, res / req)) if r["completed"] else "OOM at event %d" % r["oom_event_index"]
    t = r.get("simulated_device_seconds")
    t = "%.1f ms" % (t * 1e3) if t is not None else "-"
    m = r.get("min_device_memory_bytes")
    m = "%.3f" % (m / gib) if m is not None else "-"
    print("| %s | %s | `%s` | %s | %d / %d | %s | %s |" % (name if name != last else "", r["allocator"], r["config"] or "(default)", cell, r["device_alloc_calls"], r["device_free_calls"], t, m))
    last = name
'
