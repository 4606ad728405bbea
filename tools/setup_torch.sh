#!/usr/bin/env bash
# Makes a Python virtual environment with PyTorch 2.11 (CPU use only; from PyPI) for the parts of
# gpumem that need torch: tools/trace_model.py and its tests. Idempotent. Prints the interpreter.
#   bash tools/setup_torch.sh            (GPUMEM_TORCH_VENV picks the folder; default: .venv-torch)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${GPUMEM_TORCH_VENV:-.venv-torch}
torch_version=2.11.0
torchvision_version=0.26.0
if [ -x "$venv/bin/python" ] &&
  "$venv/bin/python" -c "import torch, torchvision, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  echo "$venv/bin/python"
  exit 0
fi
if ! python3 -m venv --help >/dev/null 2>&1; then
  echo "gpumem setup: installing python3-venv" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-venv >/dev/null
fi
echo "gpumem setup: installing torch $torch_version and torchvision $torchvision_version into $venv (a few minutes, ~5 GB)" >&2
python3 -m venv "$venv" >&2
"$venv/bin/pip" install --quiet --disable-pip-version-check \
  "torch==$torch_version" "torchvision==$torchvision_version" >&2
echo "$venv/bin/python"
