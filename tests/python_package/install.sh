#!/usr/bin/env bash
# Installs the Python package (pyproject.toml) into a fresh virtual environment with pip, as a user
# would, then runs test_package.py with it.
#   install.sh full SOURCE_DIR WORK_DIR TORCH_PYTHON CUDASIM_DIR [CXX_COMPILER_LAUNCHER]
#   install.sh no-torch|no-cuda SOURCE_DIR WORK_DIR [CXX_COMPILER_LAUNCHER]
# full: the environment sees the torch of TORCH_PYTHON (a .pth file, so torch is not downloaded
# again) and the package is built with a plain `pip install .` (pip's build isolation: the build
# must still find the environment's torch), the plugin required.
# no-torch: an environment without torch, `pip install --no-build-isolation .`; the package must
# install without the plugin, and say why. no-cuda: the same, with CMake's
# find_package(CUDAToolkit) disabled as well.
# WORK_DIR keeps the CMake build folder between runs (incremental); the environment is made anew.
set -euo pipefail
mode=$1
case $mode in full | no-torch | no-cuda) ;; *) echo "install.sh: unknown mode $mode" >&2; exit 2 ;; esac
source_dir=$(cd "$2" && pwd)
work=$3
shift 3
if [ "$mode" = full ]; then
  torch_python=$1
  cudasim=$(cd "$2" && pwd)
  launcher=${3:-}
else
  launcher=${1:-}
fi
mkdir -p "$work"
work=$(cd "$work" && pwd)
venv=$work/venv
rm -rf "$venv"
# full: the same Python version as TORCH_PYTHON's, for its site-packages.
base_python=python3
[ "$mode" = full ] && base_python=$torch_python
if ! "$base_python" -m venv --help >/dev/null 2>&1; then
  echo "skipped: $base_python has no venv module (Debian: apt-get install python3-venv)"
  exit 77
fi
"$base_python" -m venv "$venv"
site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if [ "$mode" = full ]; then
  torch_site=$("$torch_python" -c "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
  echo "$torch_site" >"$site/_gpumem_test_torch.pth"
  "$venv/bin/python" -c "import torch" || { echo "FAIL: torch not visible in $venv"; exit 1; }
else
  if "$venv/bin/python" -c "import torch" 2>/dev/null; then
    echo "FAIL: $venv sees a torch; the $mode install must be tested without one"
    exit 1
  fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
settings=(--config-settings=build-dir="$work/build")
if [ "$mode" = full ]; then
  settings+=(--config-settings=cmake.define.GPUMEM_REQUIRE_TORCH_PLUGIN=ON)
else
  "${pip[@]}" install --quiet "scikit-build-core>=0.10"
  settings+=(--no-build-isolation)
fi
[ "$mode" = no-cuda ] && settings+=(--config-settings=cmake.define.CMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON)
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
# The compiler launcher of the calling build, else ccache where there is one: the package's build
# compiles the plugin and the peer again, in Release.
[ -z "$launcher" ] && command -v ccache >/dev/null && launcher=ccache
[ -n "$launcher" ] && export CMAKE_CXX_COMPILER_LAUNCHER=$launcher
echo "pip install ${settings[*]} $source_dir"
if ! "${pip[@]}" install "${settings[@]}" "$source_dir" >"$work/pip.log" 2>&1; then
  cat "$work/pip.log"
  echo "FAIL: pip install"
  exit 1
fi
tail -1 "$work/pip.log"
# The tests run from a folder outside the source tree, so that `import gpumem` is the installed one.
cd "$work"
args=(--mode "$mode" --source "$source_dir")
[ "$mode" = full ] && args+=(--cudasim "$cudasim")
PATH="$venv/bin:$PATH" "$venv/bin/python" "$source_dir/tests/python_package/test_package.py" "${args[@]}"
