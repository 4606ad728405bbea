#!/usr/bin/env bash
# Parity with PyTorch: replays every bundled trace (examples/traces/*.trace,
# examples/traces/workloads/*.trace) and every PyTorch snapshot in examples/traces/real
# under gpumem's classic and expandable policies and under PyTorch's own allocator
# (`gpumem-replay --allocator pytorch`) with its default configuration and with
# expandable_segments:True, and compares the peak reserved bytes: classic must equal PyTorch's
# native allocator and expandable must equal expandable_segments:True, to the byte. Prints a
# Markdown table.
#
# usage: parity.sh PATH/TO/gpumem-replay [SOURCE_DIR] [--check]
#   SOURCE_DIR  the source tree (default: the one this script is in)
#   --check     exit 1 when a peak differs (the ctest peers.parity); exit 77 when the peer was
#               built without PyTorch
#   DEVICE_MEMORY (environment) the simulated device, default 80GiB
set -euo pipefail
replay=${1:?usage: parity.sh PATH/TO/gpumem-replay [SOURCE_DIR] [--check]}
shift
src=""
check=0
for a in "$@"; do
  if [[ $a == --check ]]; then check=1; else src=$a; fi
done
if [[ -z $src ]]; then
  src="$(cd "$(dirname "$0")/../.." && pwd)"
fi
device=${DEVICE_MEMORY:-80GiB}
shopt -s nullglob
files=("$src"/examples/traces/*.trace "$src"/examples/traces/workloads/*.trace)
real=("$src"/examples/traces/real/*.pickle)
if ((${#files[@]} == 0 || ${#real[@]} == 0)); then
  echo "parity.sh: missing traces under $src/examples/traces (and real/)" >&2
  exit 1
fi
files+=("${real[@]}")
json=$(mktemp)
trap 'rm -f "$json"' EXIT
for f in "${files[@]}"; do
  "$replay" "$f" --device-memory "$device" --json --progress never \
    --compare policy:classic policy:expandable >>"$json"
  if ! "$replay" "$f" --allocator pytorch --device-memory "$device" --json --progress never \
    --compare "" "expandable_segments:True" >>"$json" 2>"$json.err"; then
    if grep -q -i "without pytorch\|built without\|not built with" "$json.err"; then
      echo "parity.sh skipped: gpumem-replay-peer was built without PyTorch" \
        "(configure with -DGPUMEM_TORCH_PYTHON=...)"
      rm -f "$json.err"
      exit 77
    fi
    cat "$json.err" >&2
    rm -f "$json.err"
    exit 1
  fi
done
rm -f "$json.err"
PYTHONPATH="$(cd "$(dirname "$0")" && pwd)" python3 - "$json" "$device" "$check" <<'PY'
import json, os, sys

path, device, check = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
from replay_json import read_runs

runs = read_runs(path)

# (trace, allocator, config) -> run
by = {}
order = []
for r in runs:
    key = r["trace"]
    if key not in order:
        order.append(key)
    by[(key, r["allocator"], r["config"])] = r

def peak(r):
    if r is None:
        return None
    return r["peak_reserved_bytes"] if r["completed"] else None

def cell(b):
    return "missing or out of memory" if b is None else f"{b:,}"

pairs = [("classic", ("gpumem", "policy:classic"), ("pytorch", "")),
         ("expandable", ("gpumem", "policy:expandable"), ("pytorch", "expandable_segments:True"))]
version = next((r.get("torch_version") for r in runs if r.get("torch_version")), "?")
print(f"Peak reserved bytes, {device} device: gpumem's classic and expandable policies against "
      f"PyTorch {version}'s allocator (default configuration, and expandable_segments:True) on "
      f"the CUDA simulator.\n")
print("| trace | classic | PyTorch | expandable | PyTorch expandable_segments | verdict |")
print("|---|---:|---:|---:|---:|---|")
differ = 0
for t in order:
    cols, bad = [], []
    for name, ours, theirs in pairs:
        a, b = peak(by.get((t,) + ours)), peak(by.get((t,) + theirs))
        cols += [cell(a), cell(b)]
        if a is None or b is None or a != b:
            d = "" if a is None or b is None else f" by {a - b:+,} bytes"
            bad.append(f"{name} differs{d}")
    if bad:
        differ += 1
    verdict = "DIFFERS: " + "; ".join(bad) if bad else "same"
    print(f"| {os.path.basename(t)} | " + " | ".join(cols) + f" | {verdict} |")
if check and differ:
    print(f"\nparity: {differ} trace(s) differ from PyTorch", file=sys.stderr)
    sys.exit(1)
PY
