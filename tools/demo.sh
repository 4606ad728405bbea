#!/usr/bin/env bash
# Sets up, builds and runs gpumem's fragmentation-OOM example on a simulated GPU: bash tools/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
build=${GPUMEM_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target gpumem_example_fragmentation_oom >/dev/null
"$build/examples/gpumem_example_fragmentation_oom"
