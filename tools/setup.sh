#!/usr/bin/env bash
# Installs what gpumem's build needs on a Debian machine (idempotent; quiet when all is there).
#   bash tools/setup.sh [--replay-only]   (--replay-only: the CUDA toolkit is not required)
set -euo pipefail

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v ninja >/dev/null || need+=(ninja-build)
command -v g++ >/dev/null || need+=(g++)
dpkg -s libfmt-dev >/dev/null 2>&1 || need+=(libfmt-dev)
dpkg -s nlohmann-json3-dev >/dev/null 2>&1 || need+=(nlohmann-json3-dev)  # the tools' JSON
dpkg -s libgtest-dev >/dev/null 2>&1 || need+=(libgtest-dev)
dpkg -s libbenchmark-dev >/dev/null 2>&1 || need+=(libbenchmark-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "gpumem setup: installing ${need[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The CUDA toolkit provides the headers gpumem compiles against (no GPU is needed). Without it
# only gpumem-replay builds: `bash tools/setup.sh --replay-only` (the demo) goes on with a note.
if ! command -v nvcc >/dev/null && [ ! -d /usr/local/cuda ]; then
  if [ "${1:-}" = "--replay-only" ]; then
    echo "gpumem setup: no CUDA toolkit: building gpumem-replay only" >&2
    exit 0
  fi
  echo "gpumem setup: the CUDA toolkit was not found (expected nvcc on PATH or /usr/local/cuda)." >&2
  echo "  Install it from NVIDIA's packages (cuda-toolkit), then run this again; without it only" >&2
  echo "  gpumem-replay builds (bash tools/demo.sh runs without it)." >&2
  exit 1
fi
