#!/usr/bin/env bash
# Builds gpumem's LibTorch adapter (include/gpumem/torch) and libgpumem_torch.so against other
# torch releases from PyPI, and with --test also runs the adapter's tests on the CUDA simulator
# against that release's libc10_cuda.so. Only the wheel's headers and c10 libraries are kept
# (under .cache/torch/<version>); nothing is installed.
#
#   bash tools/check_torch_versions.sh newest           # the newest torch on PyPI (CI does this)
#   bash tools/check_torch_versions.sh 2.8.0 2.9.1 2.10.0 2.12.1 2.13.0 2.14.1 2.15.0
#   bash tools/check_torch_versions.sh --test newest
set -euo pipefail
cd "$(dirname "$0")/.."
run_tests=0
versions=()
for arg in "$@"; do
  case "$arg" in
    --test) run_tests=1 ;;
    -h | --help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) echo "check_torch_versions: unknown option $arg" >&2; exit 2 ;;
    *) versions+=("$arg") ;;
  esac
done
[ ${#versions[@]} -gt 0 ] || { echo "usage: bash tools/check_torch_versions.sh [--test] VERSION|newest..." >&2; exit 2; }
python=${GPUMEM_PYTHON:-python3}
cuda_include=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")/include

fetch() {  # version -> prints the folder holding torch/include and torch/lib
  local version=$1 dir=.cache/torch/$1
  if [ ! -f "$dir/torch/lib/libc10_cuda.so" ]; then
    local tmp
    tmp=$(mktemp -d)
    echo "check_torch_versions: downloading torch $version from PyPI (headers and c10 kept)" >&2
    "$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary :all: \
      --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$tmp" "torch==$version" >&2
    mkdir -p "$dir"
    unzip -q -o "$tmp"/torch-*.whl 'torch/include/*' 'torch/lib/libc10.so' 'torch/lib/libc10_cuda.so' \
      'torch/version.py' -d "$dir"
    rm -rf "$tmp"
  fi
  echo "$dir"
}

newest() {
  "$python" -m pip index versions torch --disable-pip-version-check 2>/dev/null |
    sed -n 's/^torch (\(.*\))$/\1/p' | head -1
}

status=0
for version in "${versions[@]}"; do
  [ "$version" = newest ] && version=$(newest)
  [ -n "$version" ] || { echo "check_torch_versions: cannot ask PyPI for the newest torch" >&2; exit 1; }
  dir=$(fetch "$version")
  # torch's headers need C++20 from the releases that use operator<=> (2.15 does).
  std=c++17
  grep -q "operator<=>" "$dir/torch/include/c10/util/intrusive_ptr.h" && std=c++20
  flags=(-std=$std -fsyntax-only -Wall -Wextra -Wpedantic -Wshadow -Wconversion
    -Wno-sign-conversion -Werror -DFMT_HEADER_ONLY=1 -D_GLIBCXX_USE_CXX11_ABI=1
    -DPYTORCH_C10_DRIVER_API_SUPPORTED "-DGPUMEM_TORCH_BUILD_VERSION=\"$version\""
    -Iinclude -Itools/cudasim/include -Itools/torch_plugin
    -isystem "$cuda_include" -isystem "$dir/torch/include")
  ok=1
  for source in tests/torch/test_cuda_allocator.cpp tools/torch_plugin/gpumem_torch_plugin.cpp; do
    if ! g++ "${flags[@]}" "$source"; then ok=0; fi
  done
  if [ $ok = 1 ] && [ $run_tests = 1 ]; then
    build=build-torch-$version
    cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUMEM_TORCH_PYTHON= \
      "-DGPUMEM_TORCH_DIR=$PWD/$dir/torch" -DGPUMEM_BUILD_BENCHMARKS=OFF -DGPUMEM_BUILD_EXAMPLES=OFF \
      -DGPUMEM_TEST_PACKAGING=OFF >/dev/null
    cmake --build "$build" -j"$(nproc)" --target gpumem_test_torch_cuda_allocator gpumem_cudasim \
      gpumem_torch_plugin >/dev/null || ok=0
    [ $ok = 1 ] && { ctest --test-dir "$build" -R '^torch\.cuda_allocator' --output-on-failure || ok=0; }
  fi
  if [ $ok = 1 ]; then
    echo "check_torch_versions: torch $version ($std): gpumem's adapter and plugin build$([ $run_tests = 1 ] && echo ', tests pass')"
  else
    echo "check_torch_versions: torch $version: FAILED" >&2
    status=1
  fi
done
exit $status
