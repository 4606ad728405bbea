#!/usr/bin/env bash
# Fidelity of the PyTorch peer: replays each PyTorch memory snapshot of a folder through
# `gpumem-replay --allocator pytorch` (PyTorch's own caching allocator on the CUDA simulator) and
# compares with what the snapshot recorded: the segment_alloc / segment_free events during the
# trace and the peak reserved memory. Prints a Markdown table (for bench/README.md).
#
# usage: fidelity.sh PATH/TO/gpumem-replay [TRACES_DIR] [--check]
#   TRACES_DIR  default: examples/traces/real in the source tree
#   --check     exit 1 when a difference has no known cause (the ctest peers.fidelity)
#   DEVICE_MEMORY (environment) the simulated device, default 80GiB
#
# The device: 80 GiB, at least as large as every recording GPU (all had 24 GB or more, and none of
# these snapshots reserved more than 11.1 GiB), so PyTorch never reaches its out-of-memory path
# (free the cache, retry), the only place where the device size changes what it does.
#
# A difference is explained when it comes from how the starting state is rebuilt: a snapshot whose
# recording began after the program had allocated lists the blocks live then, and gpumem-replay
# allocates them first (initial events, not compared); the segments PyTorch had cached but not in
# use at that moment are not rebuilt, so the replay starts with less reserved than the recording
# did and allocates the rest during the trace, up to the same peak.
set -euo pipefail
replay=${1:?usage: fidelity.sh PATH/TO/gpumem-replay [TRACES_DIR] [--check]}
shift
traces=""
check=0
for a in "$@"; do
  if [[ $a == --check ]]; then check=1; else traces=$a; fi
done
if [[ -z $traces ]]; then
  traces="$(cd "$(dirname "$0")/../.." && pwd)/examples/traces/real"
fi
device=${DEVICE_MEMORY:-80GiB}
shopt -s nullglob
files=("$traces"/*.pickle)
if ((${#files[@]} == 0)); then
  echo "fidelity.sh: no PyTorch snapshots (*.pickle) in $traces" >&2
  exit 77
fi
json=$(mktemp)
trap 'rm -f "$json"' EXIT
for f in "${files[@]}"; do
  "$replay" "$f" --allocator pytorch --device-memory "$device" --json --progress never >>"$json"
done
PYTHONPATH="$(cd "$(dirname "$0")" && pwd)" python3 - "$json" "$device" "$check" <<'PY'
import json, os, sys

path, device, check = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
from replay_json import read_runs

runs = read_runs(path)

def mib(b):
    return "-" if b is None else f"{b / 2**20:,.1f} MiB"

print(f"PyTorch {runs[0].get('torch_version', '?') if runs else '?'} caching allocator (default "
      f"configuration) on the CUDA simulator, {device} device, against the recording:\n")
print("| trace | live at start | segment alloc / free: recorded | replayed | peak reserved: recorded "
      "| replayed (simulator) | replayed (PyTorch's stats) | verdict |")
print("|---|---|---|---|---|---|---|---|")
unexplained = 0
for r in runs:
    name = os.path.basename(r["trace"])
    rec_a, rec_f = r["recorded_segment_allocs"], r["recorded_segment_frees"]
    rep_a = r["device_alloc_calls_after_initial_events"]
    rep_f = r["device_free_calls_after_initial_events"]
    rec_peak, sim_peak = r["recorded_peak_reserved_bytes"], r["peak_reserved_bytes"]
    pt_peak = r.get("pytorch_reserved_peak_bytes")
    notes, bad = [], []
    if not r["completed"]:
        bad.append(f"ran out of memory at event {r['oom_event_index']}")
    if sim_peak != pt_peak:
        bad.append("the simulator and PyTorch count different peaks")
    if rec_peak is None:
        notes.append("no reserved memory recorded")
    elif sim_peak != rec_peak:
        bad.append(f"peak reserved differs by {sim_peak - rec_peak:+,} bytes")
    if (rep_a, rep_f) != (rec_a, rec_f):
        start_rec = r.get("recorded_initial_reserved_bytes") or 0
        start_rep = r["reserved_bytes_after_initial_events"]
        gap = start_rec - start_rep
        if (r["initial_events"] > 0 and rep_f == rec_f and rep_a > rec_a and gap > 0
                and sim_peak == rec_peak):
            notes.append(
                f"{rep_a - rec_a} more segment allocations: the starting state is rebuilt from the "
                f"{r['initial_events']} blocks live when recording began ({mib(start_rep)} reserved); "
                f"the recording also held {mib(gap)} of cached free segments then, which the replay "
                f"allocates during the trace")
        else:
            bad.append(f"segment allocations/frees {rep_a}/{rep_f}, recorded {rec_a}/{rec_f}")
    if bad:
        unexplained += 1
    verdict = "DIFFERS: " + "; ".join(bad) if bad else ("same" if not notes else "explained: " + "; ".join(notes))
    print(f"| {name} | {r['initial_events']} blocks | {rec_a} / {rec_f} | {rep_a} / {rep_f} | "
          f"{mib(rec_peak)} | {mib(sim_peak)} | {mib(pt_peak)} | {verdict} |")
print("\nReplayed segment allocations and frees are the simulator's cudaMalloc/cuMemCreate and "
      "cudaFree/cuMemRelease calls after the initial events; peaks are compared to the byte.")
if check and unexplained:
    print(f"\nfidelity: {unexplained} unexplained difference(s)", file=sys.stderr)
    sys.exit(1)
PY
