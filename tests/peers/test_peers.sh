#!/usr/bin/env bash
# gpumem-replay --allocator pytorch|cub: PyTorch's and CUB's allocators on the CUDA simulator, on
# hand-built traces whose outcome is known by construction, and on a bundled trace.
# usage: test_peers.sh PATH/TO/gpumem-replay SOURCE_DIR PYTORCH(ON|OFF)
set -uo pipefail
replay=$1
source_dir=$2
pytorch=$3
# shellcheck source=tests/replay_cli/common.sh
source "$source_dir/tests/replay_cli/common.sh"

# json_field JSON KEY [INDEX]: a field of the INDEX-th object of a --json array
json_field() {
  python3 -c 'import json, sys; print(json.dumps(json.loads(sys.argv[1])[int(sys.argv[3])][sys.argv[2]]))' \
    "$1" "$2" "${3:-0}"
}

expect_field() {  # expect_field JSON KEY VALUE WHAT [INDEX]
  local v
  v=$(json_field "$1" "$2" "${5:-0}")
  if [[ $v != "$3" ]]; then fail "$4: $2 is $v, expected $3"; fi
}

# $work/survivor.trace (tests/replay_cli/common.sh): 60 MiB freed, 20 MiB then 50 MiB asked for.

# Two streams and a record_stream: a 4 MiB block used on stream 7 too, freed, then 4 MiB again.
cat >"$work/streams.trace" <<TRACE
gpumem-trace 1
alloc 0x1000 $((4 * mib)) 0
record_stream 0x1000 0 7
free_requested 0x1000 $((4 * mib)) 0
alloc 0x2000 $((4 * mib)) 7
alloc 0x3000 $((4 * mib)) 0
free_requested 0x2000 $((4 * mib)) 7
free_requested 0x3000 $((4 * mib)) 0
TRACE

# --- CUB ------------------------------------------------------------------------------------------
# Blocks above CUB's largest bin (2 MiB) are cudaMalloc'ed exactly and cudaFree'd at once: the 60 MiB
# segment is gone before the 50 MiB request, so the survivor trace completes on 100 MiB.
run 0 "$work/survivor.trace" --allocator cub --device-memory 100MiB --json
expect_field "$out" allocator '"cub"' "cub"
expect_field "$out" completed true "cub survivor"
expect_field "$out" device_alloc_calls 3 "cub survivor"
expect_field "$out" device_free_calls 3 "cub survivor"
expect_field "$out" peak_reserved_bytes $((70 * mib)) "cub survivor"
expect_field "$out" simulated_device_seconds null "cub survivor"
run 0 "$work/survivor.trace" --allocator cub --device-memory 100MiB
expect_in "$out" "allocator cub, policy bins 8\^3..8\^7, cache 6291455" "cub detail"
expect_in "$out" "cudaMalloc 3, cudaFree 3" "cub device calls"
# Bins up to 4^13 = 64 MiB and no cache limit: the 60 MiB block is a cached 64 MiB block, the 20 MiB
# request reuses it (same bin), and 50 MiB needs a second 64 MiB block: 128 MiB > 100 MiB.
run 0 "$work/survivor.trace" --allocator cub --device-memory 100MiB \
  --config "bin_growth:4,min_bin:0,max_bin:13,max_cached_bytes:none" --json
expect_field "$out" completed false "cub with a large cache"
run 2 "$work/survivor.trace" --allocator cub --config "bins:7"
expect_in "$err" "bad configuration \"bins:7\".*unknown key" "cub bad config"
run 0 "$work/streams.trace" --allocator cub --json
expect_field "$out" record_stream_ignored 1 "cub record_stream"
expect_field "$out" completed true "cub streams"
run 0 "$source_dir/examples/traces/llama-tiny-b4-s512-accum2.trace" --allocator cub --compare
expect_in "$out" "^\(default\) +bins 8\^3..8\^7, cache 6291455 +completed" "cub on llama-tiny"
expect_in "$out" "events/s" "cub events/s"

# --- PyTorch ------------------------------------------------------------------------------------
if [[ $pytorch != ON ]]; then
  run 2 "$work/survivor.trace" --allocator pytorch
  expect_in "$err" "built without it.*tools/setup_torch.sh.*GPUMEM_TORCH_PYTHON" "pytorch not built"
else
  # Like gpumem's classic policy: 20 MiB is cut from the cached 60 MiB segment, 50 MiB does not fit.
  run 0 "$work/survivor.trace" --allocator pytorch --device-memory 100MiB --json
  expect_field "$out" allocator '"pytorch"' "pytorch"
  expect_field "$out" policy '"native"' "pytorch"
  expect_field "$out" completed false "pytorch survivor"
  expect_field "$out" oom_event_index 4 "pytorch survivor"
  expect_field "$out" peak_reserved_bytes $((60 * mib)) "pytorch survivor"
  expect_field "$out" pytorch_reserved_peak_bytes $((60 * mib)) "pytorch survivor"
  expect_field "$out" pytorch_num_ooms 1 "pytorch survivor"
  expect_in "$(json_field "$out" oom_message)" "CUDA out of memory. Tried to allocate 50.00 MiB" \
    "pytorch's message"
  # Expandable segments map 20 MiB pages: 80 MiB reserved, it completes.
  run 0 "$work/survivor.trace" --allocator pytorch --device-memory 100MiB \
    --config expandable_segments:True --json
  expect_field "$out" policy '"expandable_segments"' "pytorch expandable"
  expect_field "$out" completed true "pytorch expandable"
  expect_field "$out" peak_reserved_bytes $((80 * mib)) "pytorch expandable"
  expect_field "$out" pytorch_reserved_peak_bytes $((80 * mib)) "pytorch expandable"
  # The environment is not read.
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run 0 "$work/survivor.trace" \
    --allocator pytorch --device-memory 100MiB --json
  expect_field "$out" completed false "PYTORCH_CUDA_ALLOC_CONF is ignored"
  run 0 "$work/survivor.trace" --allocator pytorch --device-memory 100MiB --compare \
    --find-min-memory
  expect_in "$out" "^\(default\) +native +OOM at event 4 .* 110 MiB" "pytorch min memory"
  expect_in "$out" "^expandable_segments:True +expandable_segments +completed .* 80 MiB" \
    "pytorch expandable min memory"
  expect_in "$out" "CUDA out of memory" "pytorch table message"
  run 2 "$work/survivor.trace" --allocator pytorch --config "bogus:1"
  expect_in "$err" "bad configuration \"bogus:1\"" "pytorch bad config"
  run 0 "$work/streams.trace" --allocator pytorch --json
  expect_field "$out" completed true "pytorch streams"
  run 0 "$source_dir/examples/traces/llama-tiny-b4-s512-accum2.trace" --allocator pytorch \
    --compare "" "expandable_segments:True" "max_split_size_mb:64"
  expect_in "$out" "^max_split_size_mb:64 +native +completed" "pytorch on llama-tiny"
fi

finish "gpumem-replay --allocator"
