#!/usr/bin/env bash
# The trace table of bench/README.md: every real PyTorch snapshot in examples/traces/real and every
# bundled trace in examples/traces, replayed by gpumem-replay under classic, expandable and stitch
# on an 80 GiB simulated device, beside what PyTorch reserved when it recorded the snapshot, with
# the smallest device per policy. Prints Markdown.
#   bash bench/replay_traces.sh [path/to/gpumem-replay]     (default: build/tools/replay/gpumem-replay)
set -euo pipefail
cd "$(dirname "$0")/.."
replay=${1:-build/tools/replay/gpumem-replay}
# shellcheck source=bench/replay_common.sh
source bench/replay_common.sh
for f in "${traces[@]}"; do
  "$replay" "$f" --compare policy:classic policy:expandable policy:stitch --find-min-memory \
    --json --progress never
done | json_lines | python3 -c '
import json, sys
gib = float(1 << 30)
def g(b): return "%.3f" % (b / gib) if b is not None else "-"
def r(a, b): return "%.3f" % (a / b) if a is not None and b else "-"
runs = [json.loads(line) for line in sys.stdin]
print("| trace | peak requested GiB | PyTorch recorded reserved GiB (÷ req) | classic reserved (÷ req) | expandable reserved (÷ req) | stitch reserved (÷ req) | min device classic / expandable / stitch GiB (stitch ÷ req) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for cfgs in runs:
    by = {c["policy"]: c for c in cfgs}
    c0 = cfgs[0]
    req = c0["peak_requested_bytes"]
    name = c0["trace"].split("/")[-1]
    rec = c0["recorded_peak_reserved_bytes"]
    cells = [name, g(req), "%s (%s)" % (g(rec), r(rec, req)) if rec else "not recorded"]
    for p in ("classic", "expandable", "stitch"):
        c = by[p]
        if not c["completed"]:
            cells.append("OOM at event %d" % c["oom_event_index"])
        else:
            cells.append("%s (%s)" % (g(c["peak_reserved_bytes"]), r(c["peak_reserved_bytes"], req)))
    mins = [by[p]["min_device_memory_bytes"] for p in ("classic", "expandable", "stitch")]
    cells.append("%s / %s / %s (%s)" % (g(mins[0]), g(mins[1]), g(mins[2]), r(mins[2], req)))
    print("| " + " | ".join(cells) + " |")
'
