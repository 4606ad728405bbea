#!/usr/bin/env bash
# gpumem's reliability figures (README.md, "Reliability"), from scratch, on any Linux machine:
#   1. the test suite built with clang (so that CI builds it with both g++ and clang), with
#      AddressSanitizer + UndefinedBehaviorSanitizer, and run (ctest; the
#      tests that need torch or a GPU are left out of that build);
#   2. the concurrency stress test (threads x streams x sizes, record_stream, empty_cache, the
#      pinned pool) built with ThreadSanitizer and run;
#   3. the seven libFuzzer targets (clang; ASan + UBSan), corpora seeded from the bundled traces,
#      each run for GPUMEM_FUZZ_SECONDS (default 60); the trace parsers get inputs up to 4 MiB and
#      10 s each, so that a hang or a quadratic slowdown is a finding;
#   4. a table of the figures, also written to ${OUT:-build-reliability}/reliability.md.
#
#   bash tools/reliability.sh          (GPUMEM_FUZZ_SECONDS=10 GPUMEM_STRESS_OPS=20000 to size it)
# Exit status: 0 when every run is clean; 1 otherwise (the later steps still run).
set -uo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh || exit 1
if ! command -v clang++ >/dev/null; then
  echo "reliability: installing clang (libFuzzer)" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang >/dev/null
fi
out=${OUT:-build-reliability}
mkdir -p "$out"
out=$(cd "$out" && pwd)
fuzz_seconds=${GPUMEM_FUZZ_SECONDS:-60}
stress_ops=${GPUMEM_STRESS_OPS:-20000}
jobs=$(nproc)
status=0
common=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUMEM_TORCH_PYTHON= -DGPUMEM_BUILD_BENCHMARKS=OFF
  -DGPUMEM_BUILD_EXAMPLES=OFF -DGPUMEM_TEST_PACKAGING=OFF -DGPUMEM_INSTALL=OFF)
# Line tables only: sanitizer reports keep file:line, the builds take about a quarter less time.
clang_flags=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -gline-tables-only -DNDEBUG")
gcc_flags=("-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG")
step() { echo "== reliability: $* (at $SECONDS s)" >&2; }

# 1. ASan + UBSan
step "test suite under AddressSanitizer + UndefinedBehaviorSanitizer"
asan_tests="not run"
if CXX=clang++ cmake -S . -B build-asan "${common[@]}" "${clang_flags[@]}" -DGPUMEM_SANITIZE=address,undefined >/dev/null &&
  cmake --build build-asan -j"$jobs" >"$out/asan-build.log" 2>&1; then
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan -j"$jobs" -LE "gpu|torch|python" --output-on-failure >"$out/asan-ctest.log" 2>&1 ||
    status=1
  asan_tests=$(grep -E "tests passed|tests failed" "$out/asan-ctest.log" | tail -1)
else
  status=1
  asan_tests="build failed (see $out/asan-build.log)"
fi
echo "   $asan_tests" >&2

# 2. TSan stress
step "concurrency stress under ThreadSanitizer ($stress_ops operations per thread)"
tsan_result="not run"
if cmake -S . -B build-tsan "${common[@]}" "${gcc_flags[@]}" -DGPUMEM_SANITIZE=thread -DGPUMEM_BUILD_TOOLS=OFF >/dev/null &&
  cmake --build build-tsan -j"$jobs" --target gpumem_test_stress >"$out/tsan-build.log" 2>&1; then
  if GPUMEM_STRESS_OPS=$stress_ops TSAN_OPTIONS=halt_on_error=1 build-tsan/tests/gpumem_test_stress \
    >"$out/tsan-stress.log" 2>&1; then
    tsan_result="clean"
  else
    tsan_result="FAILED (see $out/tsan-stress.log)"
    status=1
  fi
else
  status=1
  tsan_result="build failed (see $out/tsan-build.log)"
fi
stress_ops_total=$(sed -n 's/^gpumem stress: .*: \([0-9]*\) operations.*/\1/p' "$out/tsan-stress.log" 2>/dev/null |
  awk '{s += $1} END {print s + 0}')
echo "   $tsan_result, $stress_ops_total operations" >&2

# 3. Fuzzers
step "libFuzzer targets, $fuzz_seconds s each"
fuzz_rows=()
if CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${clang_flags[@]}" -DGPUMEM_BUILD_FUZZERS=ON \
  -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_TOOLS=OFF -DGPUMEM_BUILD_BENCHMARKS=OFF \
  -DGPUMEM_BUILD_EXAMPLES=OFF -DGPUMEM_INSTALL=OFF >/dev/null &&
  cmake --build build-fuzz -j"$jobs" >"$out/fuzz-build.log" 2>&1; then
  corpus=$out/corpus
  rm -rf "$corpus"
  mkdir -p "$corpus"/{config,native_trace,rmm_csv,pytorch_snapshot,allocator_ops,replay,parse_size}
  cp examples/traces/*.trace "$corpus/native_trace/"
  # fuzz_replay: a configuration line, then a trace (the start of a bundled one).
  for c in policy:stitch policy:expandable "policy:classic,max_split_size_mb:64"; do
    { echo "$c"; head -n 400 examples/traces/llama-tiny-b4-s512-accum2.trace; } >"$corpus/replay/$(echo "$c" | tr -c 'a-z0-9' _)"
  done
  for size in 80GiB 1.5TiB "512 MiB" 4096 0.1K; do printf '%s' "$size" >"$corpus/parse_size/$(echo "$size" | tr -c 'a-zA-Z0-9' _)"; done
  printf '%s' "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:4]" >"$corpus/config/a"
  printf '%s' "expandable_segments:True,garbage_collection_threshold:0.6,policy:stitch" >"$corpus/config/b"
  printf '%s' "per_process_memory_fraction:0.5,pinned_num_register_threads:8" >"$corpus/config/c"
  # The RMM CSV and PyTorch snapshot seeds: bundled traces converted and exported by gpumem-replay.
  if cmake -S . -B build-asan >/dev/null 2>&1 && [ -x build-asan/tools/replay/gpumem-replay ]; then
    replay=build-asan/tools/replay/gpumem-replay
    seed=examples/traces/resnet50-b32.trace
    "$replay" "$seed" --convert "$corpus/rmm_csv/seed.csv" >/dev/null 2>&1 || true
    "$replay" "$seed" --export-snapshot "$corpus/pytorch_snapshot/seed.pickle" >/dev/null 2>&1 || true
    # A workload that empties the cache: segment frees that the reader takes for empty_cache calls.
    "$replay" examples/traces/workloads/inference_varying_inputs.trace --config policy:classic \
      --export-snapshot "$corpus/pytorch_snapshot/empty_cache.pickle" >/dev/null 2>&1 || true
  fi
  # PyTorch snapshot seeds: the real snapshots (a recording from program start, one that began with
  # blocks already live, a state-only one), gpumem-replay's exports above and the small snapshots
  # PyTorch's own allocator recorded with empty_cache calls, retries and garbage collection.
  # fuzz_pytorch_snapshot writes each trace back with write_pytorch_snapshot(out, trace), initial
  # events included, and checks that it reads back unchanged.
  cp examples/traces/real/*.pickle "$corpus/pytorch_snapshot/"
  for f in tests/data/empty_cache/*.pickle; do cp "$f" "$corpus/pytorch_snapshot/empty_cache_$(basename "$f")"; done
  head -c 3000 /dev/urandom >"$corpus/allocator_ops/random"
  for name in config native_trace rmm_csv pytorch_snapshot allocator_ops replay parse_size; do
    log=$out/fuzz_$name.log
    limits=(-max_len=65536 -timeout=10)
    case $name in
      native_trace | rmm_csv | pytorch_snapshot) limits=(-max_len=4194304 -timeout=10) ;;
      allocator_ops) limits=(-max_len=3000 -timeout=10) ;; # up to 1,000 operations, each checked
      replay) limits=(-max_len=262144 -timeout=10) ;;
      parse_size) limits=(-max_len=256 -timeout=10) ;;
    esac
    # The configuration's keys and edge values: fuzz_config reads them raw, fuzz_replay in its
    # first line (fuzz_allocator_ops builds its configuration from a table of its own).
    case $name in config | replay) limits+=(-dict=tests/fuzz/config.dict) ;; esac
    if build-fuzz/tests/fuzz/fuzz_$name "$corpus/$name" -max_total_time="$fuzz_seconds" "${limits[@]}" \
      -artifact_prefix="$out/fuzz_$name-" -print_final_stats=1 >"$log" 2>&1; then
      runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
      rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
      fuzz_rows+=("| fuzz_$name | ${runs:-?} | ${rate:-?} | clean |")
    else
      fuzz_rows+=("| fuzz_$name | - | - | FINDING (see $log and $out/fuzz_$name-*) |")
      status=1
    fi
  done
else
  status=1
  fuzz_rows+=("| (fuzzers) | - | - | build failed (see $out/fuzz-build.log) |")
fi

# 4. Figures
fault_tests=$(grep -cE "Test +#[0-9]+: (FaultInjection|SimulatedFaults|CudaSimFaults|.*Fault)" "$out/asan-ctest.log" 2>/dev/null || echo 0)
{
  echo "| run | result |"
  echo "|---|---|"
  echo "| test suite, ASan + UBSan (tests needing torch or a GPU left out) | $asan_tests |"
  echo "| of which fault-injection tests (every call index of representative sequences, every policy, the pinned pool) | $fault_tests, all under ASan |"
  echo "| concurrency stress, TSan: $stress_ops_total operations on 4 threads (4 allocator configs + the pinned pool) | $tsan_result |"
  echo
  echo "| fuzz target ($fuzz_seconds s, ASan + UBSan) | executions | per second | result |"
  echo "|---|---:|---:|---|"
  printf '%s\n' "${fuzz_rows[@]}"
  echo
  echo "Invariant violations: $([ $status = 0 ] && echo 0 || echo 'see the logs above') (the allocator checker runs after every fuzzed operation)."
  echo "Machine: $(lscpu | sed -n 's/^Model name: *//p') ($(nproc) cores); $(g++ --version | head -1); $(clang++ --version | head -1)."
} | tee "$out/reliability.md"
exit $status
