#!/usr/bin/env bash
# tests/gpu/run.sh — gpumem's check on a machine with a real NVIDIA GPU.
#
# Usage, from the repository root:  bash tests/gpu/run.sh
#
#   1. checks that a CUDA GPU is usable (fails at once, exit 2, when there is none);
#   2. times the device calls an allocator makes — cudaMalloc / cudaFree and cuMemCreate + cuMemMap
#      + cuMemSetAccess / cuMemUnmap + cuMemRelease, 2 MiB to 1 GiB, median of several
#      repetitions — with tests/gpu/time_device_calls.cpp (compiled here with nvcc, or g++ against
#      the toolkit);
#   3. builds gpumem's GPU tests (tests/test_cuda*.cpp) in Release (cmake; ninja when present,
#      else make);
#   4. runs them against the real CUDA runtime and driver (ctest -L 'gpu|cuda');
#   5. builds the rest of the test suite in Release with the time that is left;
#   6. prints a summary. Timings run before any build so that nothing competes with them.
#
# Everything printed also goes to "${OUT:-./gpu-out}/gpu_report.txt", next to device_call_times.csv
# and ctest_LastTest.log. The whole run is bounded by `timeout` (GPUMEM_GPU_TIME_LIMIT seconds,
# default 290: under 5 minutes). Exit status: 0 when every step passed; 2 without a usable GPU;
# 124 when the time limit was hit; 1 when any other step failed (the later steps still run).
#
# Environment: OUT (report folder), GPUMEM_GPU_BUILD_DIR (default <repo>/build-gpu),
# GPUMEM_GPU_TIME_LIMIT, GPUMEM_GPU_REPS (timing repetitions, default 9), CUDA_HOME / CUDA_PATH
# (toolkit; else nvcc's folder, else /usr/local/cuda).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
LIMIT_S="${GPUMEM_GPU_TIME_LIMIT:-290}"

# --- Outer: the time limit and the report ---------------------------------------------------------
if [[ -z "${GPUMEM_GPU_RUN_INNER:-}" ]]; then
  out_dir="${OUT:-./gpu-out}"
  mkdir -p "$out_dir"
  out_dir="$(cd "$out_dir" && pwd)"
  report="$out_dir/gpu_report.txt"
  : >"$report"
  if ! command -v timeout >/dev/null 2>&1; then
    echo "gpumem GPU check: FAILED: 'timeout' (coreutils) is not installed" | tee -a "$report"
    exit 1
  fi
  set +e
  GPUMEM_GPU_RUN_INNER=1 GPUMEM_GPU_OUT_DIR="$out_dir" \
    timeout --kill-after=10 "$LIMIT_S" bash "${BASH_SOURCE[0]}" "$@" 2>&1 | tee -a "$report"
  rc=${PIPESTATUS[0]}
  set -e
  if ((rc == 124 || rc == 137)); then
    echo "gpumem GPU check: FAILED: stopped after the time limit of ${LIMIT_S} s" | tee -a "$report"
    rc=124
  fi
  echo "gpumem GPU check: exit status $rc; report: $report" | tee -a "$report"
  exit "$rc"
fi

# --- Inner: the steps ---------------------------------------------------------------------------
OUT_DIR="$GPUMEM_GPU_OUT_DIR"
BUILD_DIR="${GPUMEM_GPU_BUILD_DIR:-$ROOT/build-gpu}"
REPS="${GPUMEM_GPU_REPS:-9}"
DEADLINE=$((SECONDS + LIMIT_S - 15)) # leave the outer time to print its verdict
JOBS="$(nproc 2>/dev/null || echo 4)"
declare -a RESULTS=()
FAILED=0

section() { printf '\n=== %s ===\n' "$*"; }
record() { # record <step> <status>
  RESULTS+=("$(printf '%-28s %s' "$1" "$2")")
  [[ "$2" == ok* ]] || FAILED=1
}
# Seconds a step may take: at most $1, leaving $2 seconds for the steps after it.
budget() {
  local left=$((DEADLINE - SECONDS - $2))
  ((left > $1)) && left=$1
  ((left < 5)) && left=5
  echo "$left"
}

section "gpumem GPU check, $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
echo "repository: $ROOT"
if command -v git >/dev/null 2>&1 && git -C "$ROOT" rev-parse HEAD >/dev/null 2>&1; then
  echo "commit: $(git -C "$ROOT" rev-parse HEAD)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
fi
echo "report folder: $OUT_DIR"

# --- 1. The toolkit and the GPU ------------------------------------------------------------------
section "1. CUDA toolkit and GPU"
CUDA_DIR="${CUDA_HOME:-${CUDA_PATH:-}}"
if [[ -z "$CUDA_DIR" ]] && command -v nvcc >/dev/null 2>&1; then
  CUDA_DIR="$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)"
fi
[[ -n "$CUDA_DIR" ]] || CUDA_DIR=/usr/local/cuda
if [[ ! -f "$CUDA_DIR/include/cuda_runtime_api.h" ]]; then
  echo "FAILED: no CUDA toolkit at $CUDA_DIR (set CUDA_HOME); it is needed to build anything here"
  exit 1
fi
NVCC=""
if [[ -x "$CUDA_DIR/bin/nvcc" ]]; then
  NVCC="$CUDA_DIR/bin/nvcc"
elif command -v nvcc >/dev/null 2>&1; then
  NVCC="$(command -v nvcc)"
fi
echo "CUDA toolkit: $CUDA_DIR${NVCC:+ ($("$NVCC" --version | tail -n 1))}"
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L || true
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv || true
else
  echo "(nvidia-smi not found)"
fi

TIMER="$BUILD_DIR/time_device_calls"
mkdir -p "$BUILD_DIR"
TIMER_SRC="$ROOT/tests/gpu/time_device_calls.cpp"
if [[ -n "$NVCC" ]]; then
  echo "+ nvcc -std=c++17 -O2 $TIMER_SRC -o $TIMER"
  "$NVCC" -std=c++17 -O2 "$TIMER_SRC" -o "$TIMER"
else
  CUDA_LIB="$CUDA_DIR/lib64"
  [[ -d "$CUDA_LIB" ]] || CUDA_LIB="$CUDA_DIR/targets/x86_64-linux/lib"
  CXX_BIN="${CXX:-g++}"
  echo "+ $CXX_BIN -std=c++17 -O2 -I$CUDA_DIR/include $TIMER_SRC -L$CUDA_LIB -lcudart -o $TIMER"
  "$CXX_BIN" -std=c++17 -O2 -isystem "$CUDA_DIR/include" "$TIMER_SRC" -L"$CUDA_LIB" -lcudart \
    -Wl,-rpath,"$CUDA_LIB" -o "$TIMER"
fi

set +e
"$TIMER" --check
check_rc=$?
set -e
if ((check_rc == 2)); then
  echo
  echo "FAILED: no usable CUDA GPU on this machine (see the line above). This check needs an NVIDIA"
  echo "GPU with its driver; without one, run the CPU test suite instead: bash tools/test.sh"
  exit 2
elif ((check_rc != 0)); then
  echo "FAILED: the GPU check failed (exit status $check_rc)"
  exit 1
fi
record "GPU present" "ok"

# --- 2. Device call timings ----------------------------------------------------------------------
section "2. Device call timings (median of $REPS, after a warm-up)"
set +e
timeout "$(budget 60 150)" "$TIMER" --reps "$REPS" --csv "$OUT_DIR/device_call_times.csv"
timer_rc=$?
set -e
if ((timer_rc == 0)); then
  record "device call timings" "ok ($OUT_DIR/device_call_times.csv)"
else
  record "device call timings" "FAILED (exit status $timer_rc)"
fi

# --- 3. Build the GPU tests ----------------------------------------------------------------------
section "3. Build gpumem's GPU tests (Release)"
if command -v ninja >/dev/null 2>&1; then
  GENERATOR="Ninja"
  KEEP_GOING=(-k 0)
else
  GENERATOR="Unix Makefiles"
  KEEP_GOING=(-k)
fi
if [[ -f "$BUILD_DIR/CMakeCache.txt" ]] &&
  ! grep -q "^CMAKE_GENERATOR:INTERNAL=$GENERATOR\$" "$BUILD_DIR/CMakeCache.txt"; then
  rm -rf "$BUILD_DIR/CMakeCache.txt" "$BUILD_DIR/CMakeFiles" # another generator's build tree
fi
# The GPU tests are tests/test_cuda*.cpp (one executable each, gpumem_test_<name>). They are
# built first and run before the rest of the suite is built, so the GPU part always gets its time.
GPU_TARGETS=()
for source in "$ROOT"/tests/test_cuda*.cpp; do
  [[ -e "$source" ]] || continue
  name="$(basename "$source" .cpp)"
  GPU_TARGETS+=("gpumem_test_${name#test_}")
done
configure=(cmake -S "$ROOT" -B "$BUILD_DIR" -G "$GENERATOR" -DCMAKE_BUILD_TYPE=Release
  -DCUDAToolkit_ROOT="$CUDA_DIR" -DGPUMEM_BUILD_TESTS=ON -DGPUMEM_BUILD_BENCHMARKS=OFF
  -DGPUMEM_BUILD_EXAMPLES=OFF -DGPUMEM_BUILD_TOOLS=OFF -DGPUMEM_TEST_PACKAGING=OFF
  -DGPUMEM_INSTALL=OFF)
echo "+ ${configure[*]}"
configured=0
set +e
timeout "$(budget 60 90)" "${configure[@]}"
configure_rc=$?
set -e
if ((configure_rc != 0)); then
  record "configure" "FAILED (exit status $configure_rc; are libfmt-dev, nlohmann-json3-dev and libgtest-dev installed?)"
elif ((${#GPU_TARGETS[@]} == 0)); then
  configured=1
  record "configure" "ok"
  record "build GPU tests" "FAILED (no tests/test_cuda*.cpp found)"
else
  configured=1
  record "configure" "ok"
  echo "+ cmake --build $BUILD_DIR -j $JOBS --target ${GPU_TARGETS[*]} -- ${KEEP_GOING[*]}"
  set +e
  timeout "$(budget 180 60)" cmake --build "$BUILD_DIR" -j "$JOBS" --target "${GPU_TARGETS[@]}" \
    -- "${KEEP_GOING[@]}"
  build_rc=$?
  set -e
  if ((build_rc == 0)); then
    record "build GPU tests" "ok (${GPU_TARGETS[*]})"
  else
    record "build GPU tests" "FAILED (exit status $build_rc; those that did build still run)"
  fi
fi

# --- 4. GPU tests --------------------------------------------------------------------------------
# -L is a regular expression: the CUDA tests carry the labels "gpu" and "cuda".
section "4. GPU tests (ctest -L 'gpu|cuda')"
if ((configured)); then
  set +e
  (cd "$BUILD_DIR" && timeout "$(budget 120 10)" ctest -L 'gpu|cuda' --output-on-failure \
    --no-tests=error --timeout 60)
  ctest_rc=$?
  set -e
  log="$BUILD_DIR/Testing/Temporary/LastTest.log"
  if [[ -f "$log" ]]; then cp "$log" "$OUT_DIR/ctest_LastTest.log"; fi
  if ((ctest_rc != 0)); then
    record "GPU tests" "FAILED (ctest exit status $ctest_rc)"
  elif [[ -f "$log" ]] && grep -q "needs a CUDA GPU" "$log"; then
    # A GPU was found above, so a test that skipped for want of one did not see it.
    record "GPU tests" "FAILED (tests skipped as if there were no GPU; see ctest_LastTest.log)"
  else
    skipped=0
    if [[ -f "$log" ]]; then skipped="$(grep -c '^\[  SKIPPED \] .*([0-9]* ms)$' "$log" || true)"; fi
    record "GPU tests" "ok (${skipped:-0} skipped: no-GPU error paths, features the GPU lacks)"
  fi
else
  record "GPU tests" "FAILED (not run: the build was not configured)"
fi

# --- 5. The rest of the test suite, with the time that is left --------------------------------------
section "5. Build the rest of gpumem's tests (Release)"
if ((configured)); then
  echo "+ cmake --build $BUILD_DIR -j $JOBS -- ${KEEP_GOING[*]}"
  set +e
  timeout "$(budget 240 0)" cmake --build "$BUILD_DIR" -j "$JOBS" -- "${KEEP_GOING[@]}"
  all_rc=$?
  set -e
  if ((all_rc == 0)); then
    record "build all tests" "ok"
  elif ((all_rc == 124)); then
    # Not a failure of the GPU check: the machine ran out of this script's time, not the code.
    RESULTS+=("$(printf '%-28s %s' "build all tests" "not finished within the time limit")")
  else
    record "build all tests" "FAILED (exit status $all_rc)"
  fi
fi

# --- 6. Summary ----------------------------------------------------------------------------------
section "Summary"
for line in "${RESULTS[@]}"; do echo "$line"; done
if [[ -f "$OUT_DIR/device_call_times.csv" ]]; then
  echo
  echo "device call times (median microseconds; per-granule columns: see section 2):"
  awk -F, 'NR == 1 { next }
    { s = $1 / 1048576; u = "MiB"; if (s >= 1024) { s /= 1024; u = "GiB" }
      printf "  %4d %s  cudaMalloc %9.1f  cudaFree %9.1f  create+map %9.1f  unmap+release %9.1f\n",
             s, u, $2, $3, $4, $5 }' "$OUT_DIR/device_call_times.csv"
fi
if ((FAILED)); then
  echo "RESULT: FAILED"
  exit 1
fi
echo "RESULT: ok"
