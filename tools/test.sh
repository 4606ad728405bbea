#!/usr/bin/env bash
# Sets up, builds and runs gpumem's whole test suite (no GPU needed): bash tools/test.sh
# GPUMEM_BUILD_DIR picks the build folder (default: build). GPUMEM_NO_TORCH=1 skips installing
# torch (the tests of tools/trace_model.py then skip with a message).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
torch_python=""
if [ "${GPUMEM_NO_TORCH:-0}" != 1 ]; then
  if ! torch_python=$(bash tools/setup_torch.sh); then
    echo "gpumem setup: WARNING: torch could not be installed; its tests will be skipped" >&2
    torch_python=""
  fi
  [ -n "$torch_python" ] && torch_python=$(cd "$(dirname "$torch_python")" && pwd)/$(basename "$torch_python")
fi
build=${GPUMEM_BUILD_DIR:-build}
# -g1: line tables only (enough for a backtrace), a sixth less compile time than -g.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" "-DGPUMEM_TORCH_PYTHON=$torch_python" >/dev/null
start=$SECONDS
cmake --build "$build" -j"$(nproc)"
echo "gpumem: built in $((SECONDS - start)) s; running the tests" >&2
ctest --test-dir "$build" --output-on-failure -j"$(nproc)"
