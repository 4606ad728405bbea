# Sourced from the repository root by bench/replay_traces.sh and bench/replay_allocators.sh:
# - traces: the traces their tables cover, every real PyTorch snapshot in $GPUMEM_SHARED_TRACES
#   (default examples/traces/real) and then every bundled trace in examples/traces;
# - json_lines: gpumem-replay's --json outputs, one after another on stdin, as one JSON value a
#   line on stdout.
shared=${GPUMEM_SHARED_TRACES:-examples/traces/real}
traces=()
for f in "$shared"/*.pickle examples/traces/*.trace; do [[ -f $f ]] && traces+=("$f"); done

json_lines() {
  python3 -c '
import json, sys
text = sys.stdin.read()
decoder, pos = json.JSONDecoder(), 0
while pos < len(text):
    while pos < len(text) and text[pos].isspace(): pos += 1
    if pos >= len(text): break
    obj, pos = decoder.raw_decode(text, pos)
    print(json.dumps(obj))
'
}
