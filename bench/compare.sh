#!/usr/bin/env bash
# Regenerates the comparison tables of bench/README.md: the hot-path race (gpumem_bench_compare:
# gpumem, PyTorch's and CUB's caching allocators on the CUDA simulator in one process) and, per
# trace, every allocator and configuration (bench/replay_allocators.sh), as Markdown on stdout. Builds nothing: give it a configured and built build folder.
#
#   bench/compare.sh [build dir] [Google Benchmark flags ...]
#   bench/compare.sh build --benchmark_repetitions=3        # quicker
#
# Defaults: build dir `build`, 5 repetitions of at least 0.2 s each; every figure is the median of
# the repetitions (time per allocate+free pair; with 2 threads, the pairs of both threads over the
# time until both have finished).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
shift $(($# > 0 ? 1 : 0))
exe="$build/bench/gpumem_bench_compare"
if [[ ! -x "$exe" ]]; then
  echo "compare.sh: $exe not found; build it first: cmake --build $build --target gpumem_bench_compare" >&2
  exit 1
fi
python=$(command -v python3 || true)
if [[ -z "$python" ]]; then
  echo "compare.sh: python3 is needed to read Google Benchmark's JSON" >&2
  exit 1
fi

json=$(mktemp)
log=$(mktemp)
trap 'rm -f "$json" "$log"' EXIT
if ! "$exe" --benchmark_repetitions=5 --benchmark_min_time=0.2 --benchmark_report_aggregates_only=true \
  --benchmark_out="$json" --benchmark_out_format=json "$@" >/dev/null 2>"$log"; then
  cat "$log" >&2
  exit 1
fi
grep '^gpumem_bench_compare:' "$log" >&2 || true

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
compiler="unknown compiler"
cache="$build/CMakeCache.txt"
if [[ -f "$cache" ]]; then
  cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$cache")
  type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$cache")
  [[ -n "$cxx" ]] && compiler="$("$cxx" --version | head -1) ($type)"
fi

"$python" - "$json" "$(nproc)" "$cpu" "$compiler" "$here" <<'PY'
import json, sys

path, nproc, cpu, compiler, _ = sys.argv[1:6]
with open(path) as f:
    doc = json.load(f)
ctx = doc["context"]

allocators = ["gpumem_classic", "gpumem_stitch", "pytorch", "cub"]
cases = ["512B", "64KiB", "1MiB", "16MiB", "256MiB", "mixed", "trace"]

import statistics

unit = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}
median, error, calls, runs = {}, {}, {}, {}
for b in doc["benchmarks"]:
    name = b.get("run_name", b["name"])
    if b.get("error_occurred"):
        error[name] = b.get("error_message", "error")
        continue
    t = b["real_time"] * unit[b.get("time_unit", "ns")]
    if b.get("run_type") == "aggregate":
        if b.get("aggregate_name") == "median":
            median[name] = t
            calls[name] = b.get("dev_calls")
    else:  # single runs: with one repetition there are no aggregates
        runs.setdefault(name, []).append((t, b.get("dev_calls")))
for name, r in runs.items():
    if name not in median:
        median[name] = statistics.median(t for t, _ in r)
        calls[name] = r[0][1]

def key(alloc, case, threads):
    return f"{alloc}/{case}/manual_time/threads:{threads}"

def ns(v):
    if v is None:
        return "–"
    return f"{v:,.0f} ns" if v >= 100 else f"{v:.1f} ns"

def ratio(a, b):
    if a is None or b is None:
        return "–"
    return f"{a / b:.2f}"

reps = doc["benchmarks"][0].get("repetitions", "?") if doc["benchmarks"] else "?"
print(f"Machine: {nproc} CPUs ({cpu}); compiler: {compiler}; torch {ctx.get('torch')}; "
      f"CUDA toolkit {ctx.get('cuda_toolkit')} headers, runtime: {ctx.get('cuda_runtime')} "
      f"({ctx.get('sim_memory')} device); {ctx.get('date')}.")
print(f"Trace: {ctx.get('trace')} ({ctx.get('trace_pairs')} allocations per pass). "
      f"Medians of {reps} repetitions, time per allocate+free pair "
      f"(with 2 threads: both threads' pairs over the time until both have finished).")
print()
for threads in (1, 2):
    print(f"**{threads} thread{'s' if threads > 1 else ''}**" +
          (" (both threads on one allocator)" if threads > 1 else ""))
    print()
    print("| case | gpumem classic | gpumem stitch | PyTorch | CUB | classic / PyTorch | classic / CUB | stitch / PyTorch | stitch / CUB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for case in cases:
        t = {a: median.get(key(a, case, threads)) for a in allocators}
        cells = []
        for a in allocators:
            k = key(a, case, threads)
            if k in error:
                cells.append("skipped¹")
            elif t[a] is None:
                cells.append("not built" if a == "pytorch" and ctx.get("torch") == "not built" else "–")
            else:
                cells.append(ns(t[a]))
        print(f"| {case} | " + " | ".join(cells) + " | " +
              " | ".join([ratio(t["gpumem_classic"], t["pytorch"]), ratio(t["gpumem_classic"], t["cub"]),
                          ratio(t["gpumem_stitch"], t["pytorch"]), ratio(t["gpumem_stitch"], t["cub"])]) + " |")
    print()
notes = sorted(set(f"`{k}`: {v}" for k, v in error.items()))
if notes:
    print("¹ " + "; ".join(notes))
    print()
sim = [(n, median.get(f"cudasim/{n}")) for n in ("cudaGetDevice", "cudaEventRecord")]
print("The simulator's own cost per call, same run: " +
      ", ".join(f"`{n}` {ns(v)}" for n, v in sim) + ".")
dev = [k for k, v in calls.items() if v is not None and v > 0]
if dev:
    print()
    print("Device memory calls made during the timed loops (not a cache hit every time): " +
          ", ".join(f"`{k}` {calls[k]:g}" for k in sorted(dev)) + " (medians).")
PY
# Then the per-trace tables: every allocator and configuration on every real and bundled trace.
if [[ -x "$build/tools/replay/gpumem-replay" ]]; then
  echo
  bash "$here/replay_allocators.sh" "$build/tools/replay/gpumem-replay"
fi
