#!/usr/bin/env bash
# gpumem's main job on a bundled example: replays the allocation trace of a GPT-2 training step
# on a simulated 3 GiB GPU. PyTorch's allocator (gpumem's classic policy) runs out of memory there
# and the report says why; gpumem's stitch policy completes. Writes the memory plot as an SVG.
#   bash tools/demo.sh            (GPUMEM_BUILD_DIR picks the build folder; default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh --replay-only  # gpumem-replay needs no CUDA toolkit
build=${GPUMEM_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j"$(nproc)" --target gpumem_replay >/dev/null
"$build/tools/replay/gpumem-replay" examples/traces/gpt2-small-b4-s512-ckpt.trace \
  --device-memory 3GiB --compare policy:classic policy:stitch --plot "$build/gpumem-replay.svg"
