#!/usr/bin/env bash
# tests/gpu/torch_compare.sh — on a machine with a CUDA GPU and torch: builds libgpumem_torch.so
# against that torch, then trains examples/python/train_with_gpumem.py once with PyTorch's
# allocator and once with gpumem, in separate processes, and prints max_memory_reserved,
# max_memory_allocated, step time and both memory summaries. Bounded by 290 s.
#
#   bash tests/gpu/torch_compare.sh            (PYTHON picks the interpreter; default python3;
#                                              OUT the report folder; STEPS the training steps)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
OUT_DIR="${OUT:-$ROOT/gpu-out}"
STEPS="${STEPS:-300}"
BUILD="${GPUMEM_GPU_BUILD_DIR:-$ROOT/build-gpu-torch}"
mkdir -p "$OUT_DIR"
report="$OUT_DIR/torch_compare.txt"
exec > >(tee "$report") 2>&1
deadline=$((SECONDS + 290))
left() { echo $((deadline - SECONDS)); }

"$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 2)" ||
  { echo "torch_compare: no usable CUDA GPU for $PYTHON"; exit 2; }
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'on', torch.cuda.get_device_name())"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
timeout "$(left)" cmake -S "$ROOT" -B "$BUILD" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  "-DGPUMEM_TORCH_PYTHON=$(command -v "$PYTHON")" -DGPUMEM_BUILD_TESTS=OFF \
  -DGPUMEM_BUILD_BENCHMARKS=OFF -DGPUMEM_BUILD_EXAMPLES=OFF >/dev/null
timeout "$(left)" cmake --build "$BUILD" --target gpumem_torch_plugin -j"$(nproc)" >/dev/null
plugin="$BUILD/tools/torch_plugin/libgpumem_torch.so"
for allocator in pytorch gpumem; do
  echo "=== $allocator ==="
  timeout "$(left)" "$PYTHON" "$ROOT/examples/python/train_with_gpumem.py" --allocator "$allocator" \
    --plugin "$plugin" --steps "$STEPS" --json | tee "$OUT_DIR/train_$allocator.txt"
done
"$PYTHON" - "$OUT_DIR" <<'PY'
import json, sys
rows = {}
for name in ("pytorch", "gpumem"):
    with open(f"{sys.argv[1]}/train_{name}.txt") as f:
        rows[name] = json.loads(f.read().strip().splitlines()[-1])
print(f"{'allocator':10} {'max reserved':>16} {'max allocated':>16} {'ms/step':>9}")
for name, r in rows.items():
    print(f"{name:10} {r['max_memory_reserved']:>16,} {r['max_memory_allocated']:>16,} {r['step_ms']:>9.2f}")
g, p = rows["gpumem"], rows["pytorch"]
print(f"gpumem / pytorch: reserved {g['max_memory_reserved'] / p['max_memory_reserved']:.3f}, "
      f"step time {g['step_ms'] / p['step_ms']:.3f}")
PY
