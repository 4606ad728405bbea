#!/usr/bin/env bash
# gpumem-replay builds and runs without the CUDA toolkit: configures gpumem in a fresh build tree
# with find_package(CUDAToolkit) disabled, builds gpumem-replay alone and replays the quick start's
# trace (the demo) on it.
# usage: replay_without_cuda.sh SOURCE_DIR BUILD_DIR [CMAKE_GENERATOR] [CXX_COMPILER_LAUNCHER]
set -euo pipefail
source_dir=$1
build=$2
generator=${3:-Ninja}
launcher=${4:-}
rm -rf "$build"
cmake -S "$source_dir" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON -DGPUMEM_TORCH_PYTHON= \
  ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER=$launcher} >"$build.configure.log" 2>&1 || {
  cat "$build.configure.log"
  exit 1
}
grep -q "gpumem: no CUDA toolkit: building the headers and gpumem-replay only" "$build.configure.log" ||
  { echo "FAIL: the configure step did not say that CUDA is missing"; exit 1; }
cmake --build "$build" --target gpumem_replay
replay=$build/tools/replay/gpumem-replay
[[ -x $replay ]] || { echo "FAIL: no $replay"; exit 1; }
[[ ! -e $build/cudasim && ! -e $build/tests ]] || { echo "FAIL: CUDA parts configured"; exit 1; }
out=$("$replay" "$source_dir/examples/traces/gpt2-small-b4-s512-ckpt.trace" --device-memory 3GiB \
  --compare policy:classic policy:stitch)
grep -qE "policy:classic +classic +OOM at event 3410" <<<"$out" || { echo "FAIL: $out"; exit 1; }
grep -qE "policy:stitch +stitch +completed" <<<"$out" || { echo "FAIL: $out"; exit 1; }
if "$replay" "$source_dir/examples/traces/resnet50-b32.trace" --allocator cub 2>"$build.err"; then
  echo "FAIL: --allocator cub without the peer"
  exit 1
fi
grep -q "needs gpumem-replay-peer" "$build.err" || { cat "$build.err"; exit 1; }
echo "gpumem-replay built and ran without the CUDA toolkit"
