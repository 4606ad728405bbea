#!/usr/bin/env bash
# gpumem-replay's command line: flags, outputs and errors.
# usage: test_cli.sh PATH/TO/gpumem-replay SOURCE_DIR
set -uo pipefail
replay=$1
source_dir=$2
# shellcheck source=tests/replay_cli/common.sh
source "$source_dir/tests/replay_cli/common.sh"

# --- help, version and command-line errors ----------------------------------------------------
run 0 --help
expect_in "$out" "usage: gpumem-replay TRACE" "--help"
expect_in "$out" "--find-min-memory" "--help lists --find-min-memory"
run 0 --version
expect_in "$out" "^gpumem-replay [0-9]+\.[0-9]+\.[0-9]+" "--version"
run 2
expect_in "$err" "no trace given" "no arguments"
run 2 "$work/survivor.trace" --bogus
expect_in "$err" "unknown option --bogus" "unknown flag"
run 2 "$work/survivor.trace" --device-memory 12XB
expect_in "$err" "--device-memory" "bad size"
run 2 "$work/survivor.trace" --device-memory 0B
expect_in "$err" "more than 0 bytes" "zero size"
# A size without a unit is refused ("24" would be 24 bytes), for --device-memory and --overhead.
for v in 24 0 1.5 "24 "; do
  run 2 "$work/survivor.trace" --device-memory "$v"
  expect_in "$err" "--device-memory \"$v\" has no unit: write e.g. " "--device-memory $v without a unit"
done
run 2 "$work/survivor.trace" --overhead 512
expect_in "$err" "--overhead \"512\" has no unit" "--overhead without a unit"
run 2 "$work/survivor.trace" --overhead 3QB
expect_in "$err" "--overhead: " "--overhead bad size"
run 2 "$work/survivor.trace" --device-memory 100MiB --overhead 100MiB
expect_in "$err" "--overhead 100 MiB leaves nothing of the 100 MiB device" "--overhead too large"
run 2 "$work/survivor.trace" --timeline "$work/t.txt"
expect_in "$err" "--timeline writes FILE.csv or FILE.json" "--timeline bad extension"
run 2 "$work/survivor.trace" --timeline
expect_in "$err" "--timeline needs a value" "--timeline without a file"
run 2 "$work/survivor.trace" --device-memory
expect_in "$err" "--device-memory needs a value" "missing value"
run 2 "$work/survivor.trace" --config "policy:sometimes"
expect_in "$err" "bad configuration \"policy:sometimes\"" "bad config"
run 2 "$work/survivor.trace" --config policy:classic --compare policy:stitch
expect_in "$err" "one --config, or --compare" "--config with --compare"
run 0 "$work/survivor.trace" "$work/survivor.trace"
expect_in "$out" "=== 2 traces, worst first ===" "two traces"
run 2 "$work/survivor.trace" --progress sometimes
expect_in "$err" "auto, always or never" "bad --progress"
run 2 "$work/survivor.trace" --allocator jemalloc
expect_in "$err" "--allocator must be gpumem, pytorch or cub" "bad --allocator"
run 2 "$work/survivor.trace" --allocator cub --plot "$work/plot.svg"
expect_in "$err" "--plot is only for --allocator gpumem" "--plot with a peer"
run 2 "$work/survivor.trace" --allocator pytorch --export-snapshot "$work/s.pickle"
expect_in "$err" "--export-snapshot is only for --allocator gpumem" "--export-snapshot with a peer"
GPUMEM_REPLAY_PEER="$work/no-such-peer" run 2 "$work/survivor.trace" --allocator pytorch
expect_in "$err" "needs gpumem-replay-peer.*not found.*tools/setup_torch.sh" "missing peer"
GPUMEM_REPLAY_PEER="$work/no-such-peer" run 2 "$work/survivor.trace" --allocator cub
expect_in "$err" "needs gpumem-replay-peer.*not found" "missing peer (cub)"

# A peer's record that gpumem-replay cannot use is an error naming what is wrong, not figures
# taken as 0. The stand-in peer (GPUMEM_REPLAY_PEER) prints $work/record for every replay.
cat >"$work/fake-peer" <<EOF
#!/usr/bin/env bash
if [[ \$1 == --list ]]; then echo cub; exit 0; fi
cat "$work/record"
EOF
chmod +x "$work/fake-peer"
peer_record() {  # peer_record [KEY=PYTHON_VALUE|KEY=DELETE...]: a complete record, fields changed
  python3 - "$@" >"$work/record" <<'PY'
import json, sys
calls = ["malloc", "free", "mem_get_info", "event_create", "event_destroy", "event_record",
         "event_query", "event_synchronize", "device_synchronize", "stream_create",
         "stream_destroy", "address_reserve", "address_free", "mem_create", "mem_release",
         "mem_map", "mem_unmap", "set_access", "stream_wait_event"]
r = {"config": "", "allocator": "cub", "policy": "stand-in", "completed": True,
     "oom_event_index": None, "oom_message": None, "oom_request_bytes": 0,
     "events_replayed": 7, "peak_requested_bytes": 73400320, "peak_allocated_bytes": 73400320,
     "peak_reserved_bytes": 136314880, "replay_seconds": 0.001, "stand_in": [1, {"a": "b"}]}
r.update({"calls_" + c: 0 for c in calls})
for arg in sys.argv[1:]:
    key, value = arg.split("=", 1)
    if value == "DELETE":
        del r[key]
    else:
        r[key] = eval(value)
print(json.dumps(r))
PY
}
peer_record
GPUMEM_REPLAY_PEER="$work/fake-peer" run 0 "$work/survivor.trace" --allocator cub --json
python3 - "$work/out" <<'PY' || fail "a peer's record read back"
import json, sys
r = json.load(open(sys.argv[1]))[0]
assert r["policy"] == "stand-in" and r["peak_reserved_bytes"] == 136314880, r
assert r["stand_in"] == [1, {"a": "b"}], r["stand_in"]  # the peer's own fields, as it wrote them
PY
peer_error() {  # peer_error PATTERN WHAT: gpumem-replay fails on $work/record, saying PATTERN
  GPUMEM_REPLAY_PEER="$work/fake-peer" run 1 "$work/survivor.trace" --allocator cub
  expect_in "$err" "gpumem-replay-peer \(--allocator cub, config \"\"\) $1" "$2"
}
printf 'Segmentation fault\n' >"$work/record"
peer_error "printed no readable JSON record \(parse error at line 1, column 1" "peer record not JSON"
printf '{"policy": "cut short", "completed": tr' >"$work/record"
peer_error "printed no readable JSON record \(parse error" "peer record cut short"
printf '[1, 2]\n' >"$work/record"
peer_error "printed a JSON array, not the record object" "peer record not an object"
peer_record peak_reserved_bytes=DELETE
peer_error "printed a record without \"peak_reserved_bytes\"" "peer record missing a figure"
peer_record completed='"yes"'
peer_error "printed \"completed\": \"yes\" in its record, expected true or false" "peer flag"
peer_record peak_reserved_bytes=-1
peer_error "printed \"peak_reserved_bytes\": -1 in its record, expected a count" "peer count"
peer_record calls_mem_map=1.5
peer_error "printed \"calls_mem_map\": 1.5 in its record, expected a count" "peer call count"
peer_record completed=False oom_event_index=None
peer_error "printed \"oom_event_index\": null in its record, expected a count" "peer OOM index"

# --json stays valid JSON when a path is not UTF-8: its bad bytes are written as U+FFFD.
cp "$work/survivor.trace" "$work/bad"$'\xff'".trace"
run 0 "$work/bad"$'\xff'".trace" --device-memory 100MiB --config policy:stitch --json
python3 - "$work/out" <<'PY' || fail "--json with a path that is not UTF-8"
import json, sys
r = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))[0]
assert r["trace"].endswith("bad\ufffd.trace"), r["trace"]
PY
run 0 "$work/survivor.trace" --device-memory 100MiB --allocator gpumem --config policy:classic
expect_in "$out" "allocator gpumem, policy classic" "--allocator gpumem is the default"

# --- unreadable and malformed traces ------------------------------------------------------------
run 1 "$work/missing.trace"
expect_in "$err" "cannot open '$work/missing.trace'" "missing file"
printf 'hello\n' >"$work/garbage.txt"
run 1 "$work/garbage.txt"
expect_in "$err" "not a trace gpumem can read" "unknown format"
printf 'gpumem-trace 1\nalloc 0x10 -5 0\n' >"$work/negative.trace"
run 1 "$work/negative.trace"
expect_in "$err" "line 2, column 12 \(byte 26\).*negative" "negative size"
printf 'gpumem-trace 1\nalloc 0x10 5 0\nfree_requested 0x20 5 0\n' >"$work/unknown_free.trace"
run 1 "$work/unknown_free.trace"
expect_in "$err" "event 1 .*not live" "free of an unknown address"
printf '\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94(' >"$work/truncated.pickle"
run 1 "$work/truncated.pickle"
expect_in "$err" "byte [0-9]+" "truncated pickle"

# --- one configuration: the detailed report -----------------------------------------------------
run 0 "$work/survivor.trace" --device-memory 100MiB --config policy:classic
expect_in "$out" "OUT OF MEMORY at event 4 of 7 \(a request of 50 MiB\)" "classic OOM"
expect_in "$out" "Tried to allocate 50.00 MiB" "OOM report"
expect_in "$out" "this is fragmentation" "diagnosis"
expect_in "$out" "GPU reserved memory" "memory_summary at the OOM"
expect_in "$out" "peak requested 70 MiB" "program's peak requested"
expect_in "$out" "M events/s" "replay speed"
expect_in "$out" "simulated time in device calls" "simulated time"
run 0 "$work/survivor.trace" --device-memory 100MiB --config policy:stitch
expect_in "$out" "result:  completed, 7 events" "stitch completes"

# --- compare, JSON, minimum memory ---------------------------------------------------------------
run 0 "$work/survivor.trace" --device-memory 100MiB --compare policy:classic policy:stitch
expect_in "$out" "policy:classic +classic +OOM at event 4" "compare row classic"
expect_in "$out" "policy:stitch +stitch +completed" "compare row stitch"
expect_in "$out" "ran out of memory at event 4" "compare explains the OOM"
run 0 "$work/survivor.trace" --device-memory 100MiB --compare "policy:classic" "policy:stitch" \
  --find-min-memory --json
if command -v python3 >/dev/null; then
  python3 - "$work/out" <<'PY' || fail "JSON check"
import json, sys
runs = json.load(open(sys.argv[1]))
assert [r["config"] for r in runs] == ["policy:classic", "policy:stitch"], runs
c, s = runs
for key in ["config", "allocator", "completed", "oom_event_index", "peak_requested_bytes",
            "peak_allocated_bytes", "peak_reserved_bytes", "device_alloc_calls",
            "device_free_calls", "min_device_memory_bytes"]:
    assert key in c and key in s, key
assert c["allocator"] == "gpumem"
assert c["completed"] is False and c["oom_event_index"] == 4, c
assert s["completed"] is True and s["oom_event_index"] is None, s
assert c["min_device_memory_bytes"] == 110 * 2**20, c["min_device_memory_bytes"]
assert 70 * 2**20 <= s["min_device_memory_bytes"] <= 72 * 2**20, s["min_device_memory_bytes"]
assert s["peak_requested_bytes"] == 70 * 2**20
PY
else
  expect_in "$out" '"config": "policy:classic".*"oom_event_index": 4' "JSON classic"
  expect_in "$out" '"min_device_memory_bytes": 115343360' "JSON min memory"
fi
run 0 "$work/survivor.trace" --device-memory 100MiB --compare
expect_in "$out" "policy:expandable" "--compare alone compares the three policies"

# --- plot, convert, progress ----------------------------------------------------------------------
run 0 "$work/survivor.trace" --device-memory 100MiB --compare policy:classic policy:stitch \
  --plot "$work/plot.svg"
[[ -s $work/plot.svg ]] || fail "--plot wrote nothing"
expect_in "$(head -c 300 "$work/plot.svg")" "<svg" "SVG document"
expect_in "$(cat "$work/plot.svg")" "OOM" "the plot marks the OOM"
run 1 "$work/survivor.trace" --plot "$work/no/such/dir/plot.svg"
expect_in "$err" "cannot write" "unwritable plot"

run 0 "$work/survivor.trace" --convert "$work/copy.csv"
expect_in "$(head -1 "$work/copy.csv")" "^Thread,Time,Action,Pointer,Size,Stream$" "RMM CSV"
run 0 "$work/copy.csv" --device-memory 100MiB --config policy:classic
expect_in "$out" "OUT OF MEMORY at event 3 of 6" "the RMM log replays (one free per block)"

run 0 "$work/survivor.trace" --device-memory 100MiB --progress always
expect_in "$err" "\[#+\] 100% 7/7 events" "progress bar"
run 0 "$work/survivor.trace" --device-memory 100MiB --progress never
[[ -z $err ]] || fail "--progress never printed: $err"

run 0 "$work/survivor.trace" --device-memory 100MiB --config policy:stitch \
  --export-snapshot "$work/export.pickle"
expect_in "$out" "snapshot: $work/export.pickle" "export announced"
run 0 "$work/export.pickle" --device-memory 100MiB --config policy:stitch --json
expect_in "$out" '"completed": true' "the exported snapshot replays"
expect_in "$out" '"peak_requested_bytes": 73400320' "the exported snapshot has the same requests"
if command -v python3 >/dev/null; then
  python3 - "$work/export.pickle" <<'PY' || fail "exported snapshot is not PyTorch's schema"
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
assert set(s) >= {"segments", "device_traces"}, s.keys()
actions = [e["action"] for e in s["device_traces"][0]]
assert actions.count("alloc") == 3 and actions.count("free_completed") == 3, actions
for seg in s["segments"]:
    assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
PY
fi

# --- "-" reads the trace from standard input ------------------------------------------------------
"$replay" - --device-memory 100MiB --config policy:classic --json <"$work/survivor.trace" >"$work/out" 2>"$work/err" ||
  fail "reading from standard input failed: $(cat "$work/err")"
expect_in "$(cat "$work/out")" '"completed": false' "standard input replayed like the file"
run 2 - --allocator cub
expect_in "$err" "reads the trace from a file" "a peer with standard input"

# --- hostile settings and outputs: refused clearly, never a crash or a silent success -------------
# A segment size whose page arithmetic overflowed (SIGFPE before it was bounded).
run 2 "$work/survivor.trace" --config "policy:expandable,large_segment_size_mb:17592186044415"
expect_in "$err" "large_segment_size_mb.*must be at most 1048576" "huge segment size refused"
# A bad configuration is refused before the trace is read (the trace here does not exist).
run 2 "$work/no-such.trace" --config "policy:sometimes"
expect_in "$err" "bad configuration" "config checked before the trace is read"
# Control characters from the command line and from the trace are escaped, never printed raw.
run 2 "$work/survivor.trace" --config $'max_split_size_mb:\e]0;x\a'
expect_in "$err" 'max_split_size_mb:\\x1b\]0;x\\x07' "escape sequence in a config escaped"
if grep -q $'\e' "$work/err"; then fail "an escape character reached the terminal (config)"; fi
# A raw control character in a trace's header is refused (the writer never writes one), and the
# message quotes it escaped.
printf 'gpumem-trace 1\n@source \033]0;pwned\007 title\nalloc 0x1000 1024 0\n' >"$work/escape.trace"
run 1 "$work/escape.trace"
expect_in "$err" 'control character 0x1b in the value of @source' "raw control character in @source refused"
if grep -q $'\e' "$work/err"; then fail "an escape character reached the terminal (@source)"; fi
# A file name is printed escaped.
escaped_name=$'\e]0;pwned\a.trace'
cp "$work/survivor.trace" "$work/$escaped_name"
run 0 "$work/$escaped_name"
expect_in "$out" 'trace: .*\\x1b\]0;pwned\\x07\.trace' "file name escaped"
if grep -q $'\e' "$work/out"; then fail "an escape character reached the terminal (file name)"; fi
# A huge bad value is echoed once, cut short.
huge=$(head -c 100000 /dev/zero | tr '\0' 9)
run 2 "$work/survivor.trace" --config "max_split_size_mb:$huge"
((${#err} < 1000)) || fail "a 100 kB bad value was echoed in full (${#err} bytes of message)"
# Output errors are errors.
"$replay" "$work/survivor.trace" >/dev/full 2>"$work/err"
status=$?
[[ $status == 1 ]] || fail "writing to a full disk exited $status, expected 1"
expect_in "$(cat "$work/err")" "cannot write the results" "full disk reported"
"$replay" "$work/survivor.trace" >&- 2>"$work/err"
status=$?
[[ $status == 1 ]] || fail "a closed standard output exited $status, expected 1"
expect_in "$(cat "$work/err")" "standard output is closed" "closed stdout reported"
# An output onto the trace being read is refused, and the trace is left as it was.
cp "$work/survivor.trace" "$work/self.trace"
run 2 "$work/self.trace" --convert "$work/self.trace"
expect_in "$err" "is the trace being read" "--convert onto its input"
cmp -s "$work/survivor.trace" "$work/self.trace" || fail "--convert onto its input changed it"
run 2 "$work/self.trace" --plot "$work/./self.trace"
expect_in "$err" "is the trace being read" "--plot onto its input"
# --find-min-memory searches at least up to the device simulated: a 1.5 TiB request completes
# on 2 TiB, so its minimum is found (the search used to stop at 1 TiB and say it never completes).
printf 'gpumem-trace 1\nalloc 0x1000 %d 0\n' $((3 << 39)) >"$work/huge.trace"
run 0 "$work/huge.trace" --device-memory 2TiB --find-min-memory --config policy:classic
expect_in "$out" "result:  completed" "1.5 TiB on a 2 TiB device"
expect_in "$out" "minimum: completes on 1.50 TiB" "--find-min-memory beyond 1 TiB"

# --- --overhead: the allocator gets the device minus it --------------------------------------------
# survivor completes under classic on 100 MiB with 30 MiB cut (70 MiB) only if 70 MiB suffice: it
# needs 20 + 50 MiB live after a 60 MiB segment: classic runs out on 100 MiB already.
run 0 "$work/survivor.trace" --device-memory 130MiB --config policy:classic
expect_in "$out" "result:  completed" "130 MiB: classic completes"
run 0 "$work/survivor.trace" --device-memory 130MiB --overhead 40MiB --config policy:classic
expect_in "$out" "device:  simulated, 90 MiB for the allocator \(130 MiB minus 40 MiB of overhead\)" \
  "--overhead in the header"
expect_in "$out" "OUT OF MEMORY at event 4" "--overhead: classic runs out on what is left"
run 0 "$work/survivor.trace" --device-memory 130MiB --overhead 40MiB --config policy:classic --json
expect_in "$out" '"device_memory_bytes": 94371840' "--overhead in --json"

# --- the out-of-memory diagnosis: configurations that complete, found by replaying --------------
run 0 "$work/survivor.trace" --device-memory 100MiB --config policy:classic
expect_in "$out" "tried: these complete on this device \(each replayed\):" "completes_with header"
expect_in "$out" '--config "policy:stitch"' "stitch completes on 100 MiB"
run 0 "$work/survivor.trace" --device-memory 100MiB --config policy:classic --json
expect_in "$out" '"completes_with": \[[^]]*"policy:stitch"' "completes_with in --json"
run 0 "$work/survivor.trace" --device-memory 60MiB --config policy:classic
expect_in "$out" "tried: neither a max_split_size_mb, nor expandable segments, nor stitch" \
  "nothing completes on 60 MiB"
# max_split_size_mb: the GPT-2 step on 3 GiB (the quick start) completes under classic with one.
run 0 "$source_dir/examples/traces/gpt2-small-b4-s512-ckpt.trace" --device-memory 3GiB \
  --config policy:classic
expect_in "$out" '--config "max_split_size_mb:[0-9]+,policy:classic"' "a max_split_size_mb proposed"
proposed=$(grep -oE 'max_split_size_mb:[0-9]+,policy:classic' <<<"$out" | head -1)
run 0 "$source_dir/examples/traces/gpt2-small-b4-s512-ckpt.trace" --device-memory 3GiB \
  --config "$proposed"
expect_in "$out" "result:  completed" "the proposed $proposed completes"

# --- --timeline ------------------------------------------------------------------------------------
run 0 "$work/survivor.trace" --device-memory 100MiB --compare policy:classic policy:stitch \
  --timeline "$work/t.csv"
expect_in "$out" "timeline: $work/t.csv" "--timeline named"
expect_in "$(head -1 "$work/t.csv")" "^config,policy,event,requested_bytes,allocated_bytes,reserved_bytes,time_us$" \
  "--timeline CSV header"
expect_in "$(cat "$work/t.csv")" '^"policy:stitch",stitch,6,0,[0-9]+,[0-9]+,$' "--timeline: stitch's last event"
expect_in "$(cat "$work/t.csv")" '^"policy:classic",classic,3,[0-9]+,' "--timeline: classic up to its OOM"
[[ $(grep -c '^"policy:classic"' "$work/t.csv") == 4 ]] || fail "--timeline: classic has 4 events before its OOM"
[[ $(grep -c '^"policy:stitch"' "$work/t.csv") == 7 ]] || fail "--timeline: stitch has 7 events"
run 0 "$work/survivor.trace" --device-memory 100MiB --config policy:stitch --timeline "$work/t.json"
python3 - "$work/t.json" <<'PY' || fail "--timeline JSON"
import json, sys
t = json.load(open(sys.argv[1]))
assert len(t) == 1 and t[0]["config"] == "policy:stitch" and t[0]["completed"], t
assert t[0]["event"] == list(range(7)), t[0]["event"]
assert t[0]["requested_bytes"][4] == 70 << 20 and t[0]["requested_bytes"][-1] == 0
assert max(t[0]["reserved_bytes"]) >= 70 << 20 and t[0]["time_us"] is None
PY

# --- real PyTorch snapshots (examples/traces/real) ------------------------------------------------
shared=${GPUMEM_SHARED_TRACES:-$source_dir/examples/traces/real}
[[ -f $shared/transformer-forward-bf16.pickle ]] || fail "$shared/transformer-forward-bf16.pickle not found"
run 0 "$shared/transformer-forward-bf16.pickle" --compare policy:classic policy:stitch
expect_in "$out" "pytorch-snapshot, 2948 events, 1074 allocations" "snapshot header"
expect_in "$out" "137 blocks were live before recording began" "initial state"
expect_in "$out" "recorded: the recording allocator reserved" "recorded reference"
# --config recorded: the default for a PyTorch snapshot, printed in the header.
run 0 "$shared/transformer-forward-bf16.pickle"
expect_in "$out" 'config:  recorded = "policy:classic" \(the snapshot.s allocator_settings: ""\)' \
  "recorded config in the header"
expect_in "$out" 'config:  "recorded" \(allocator gpumem, policy classic\)' "recorded is the default"
run 0 "$shared/transformer-forward-bf16.pickle" --compare --json
expect_in "$out" '"config": "recorded".*"recorded_config": "policy:classic"' "--compare starts with recorded"
expect_in "$out" '"config": "policy:stitch"' "--compare then gpumem's policies"
run 0 "$shared/transformer-forward-bf16.pickle" --config policy:stitch
expect_in "$out" 'config:  "policy:stitch"' "a given --config replaces recorded"
run 2 "$work/survivor.trace" --allocator cub --config recorded
# Its time stamps come through to --timeline.
run 0 "$shared/transformer-forward-bf16.pickle" --timeline "$work/tf.csv"
expect_in "$(sed -n 2000p "$work/tf.csv")" '^"recorded",classic,[0-9]+,[0-9]+,[0-9]+,[0-9]+,[0-9]{10,}$' \
  "--timeline carries the recorded time_us"
# A snapshot that recorded an out-of-memory (the quick start's classic run, exported): replayed as
# recorded on the device the recording could use (its reserved memory plus the device's free
# memory at the out-of-memory), it runs out at the same request; on a larger device it completes,
# with a warning.
run 0 "$source_dir/examples/traces/gpt2-small-b4-s512-ckpt.trace" --device-memory 3GiB \
  --config policy:classic --export-snapshot "$work/oom.pickle"
run 0 "$work/oom.pickle"
expect_in "$out" "device:  simulated, 3 GiB \(the recording's at its out-of-memory" "device from the recorded OOM"
expect_in "$out" "recorded: the recording ran out of memory after event 3492" "recorded OOM"
expect_in "$out" "result:  OUT OF MEMORY at event 3492 of 3495 \(a request of 392.63 MiB\)" \
  "the recorded OOM reproduced"
[[ -z $err ]] || fail "no warning when the OOM is reproduced: $err"
run 0 "$work/oom.pickle" --device-memory 8GiB
expect_in "$out" "result:  completed" "8 GiB: completes"
expect_in "$err" "warning: the recording ran out of memory at event 3492, but \"recorded\" completes on 8 GiB" \
  "warning when a recorded OOM is not reproduced"
# Multi-device snapshots: the header says which devices hold data; --snapshot-device N|all.
python3 - "$shared/transformer-forward-bf16.pickle" "$work/oom.pickle" "$work/two.pickle" <<'PY' ||
import pickle, sys
a = pickle.load(open(sys.argv[1], "rb"))
b = pickle.load(open(sys.argv[2], "rb"))
for s in b["segments"]:
    s["device"] = 1
a["segments"] += b["segments"]
a["device_traces"] = [a["device_traces"][0], b["device_traces"][0]]
pickle.dump(a, open(sys.argv[3], "wb"))
PY
  fail "building a two-device snapshot"
run 0 "$work/two.pickle"
expect_in "$out" "devices with data: 0, 1; this is device 0 \(--snapshot-device N or all" "devices listed"
run 0 "$work/two.pickle" --snapshot-device 1
expect_in "$out" "this is device 1" "--snapshot-device 1"
expect_in "$out" "OUT OF MEMORY at event 3492" "device 1 is the out-of-memory run"
run 1 "$work/two.pickle" --snapshot-device 2
expect_in "$err" "device 2 has neither segments nor trace events \(devices with data: 0, 1; see --snapshot-device\)" \
  "a device without data names those with data"
run 2 "$work/two.pickle" --snapshot-device some
expect_in "$err" "--snapshot-device needs a device number or all" "--snapshot-device bad value"
run 0 "$work/two.pickle" --snapshot-device all --device-memory 3GiB --config policy:classic
expect_in "$out" "=== $work/two.pickle, device 0 ===" "all: device 0"
expect_in "$out" "=== $work/two.pickle, device 1 ===" "all: device 1"
expect_in "$out" "=== 2 traces, worst first ===" "all: the summary"
expect_in "$out" "two.pickle device 1 +policy:classic +OOM at event 3492" "all: device 1's row"
expect_in "$out" "worst for \"policy:classic\": $work/two.pickle device 1 \(out of memory at event 3492, as recorded\)" \
  "all: the worst device"
run 0 "$work/two.pickle" --snapshot-device all --json
[[ $(grep -c '"snapshot_device": [01]' <<<"$out") == 2 ]] || fail "all --json: one record per device"
python3 -c 'import json,sys; json.loads(sys.stdin.read())' <<<"$out" || fail "all --json is one JSON array"
# The snapshots of a job's ranks (gpumem-replay DIR/*.pickle, as oom_snapshot:DIR and
# gpumem.snapshot_on_oom write them): each replayed, then the table worst first: the ranks whose
# replay runs out of memory (at the recorded event) before those that complete. A file that cannot
# be read is named and counted; the others are replayed all the same.
ranks=$work/ranks
mkdir -p "$ranks"
cp "$shared/transformer-forward-bf16.pickle" "$ranks/rank0-node1-pid11-oom1.pickle"
cp "$work/oom.pickle" "$ranks/rank1-node1-pid12-oom1.pickle"
printf 'not a snapshot' >"$ranks/rank2-node2-pid13-oom1.pickle"
# Rank 3 ran on its own GPU, device 3, the snapshot's only one: replayed without --snapshot-device.
python3 - "$work/oom.pickle" "$ranks/rank3-node2-pid14-oom1.pickle" <<'PY' ||
import pickle, sys
s = pickle.load(open(sys.argv[1], "rb"))
for seg in s["segments"]:
    seg["device"] = 3
s["device_traces"] = [[], [], [], s["device_traces"][0]]
pickle.dump(s, open(sys.argv[2], "wb"))
PY
  fail "building a device-3 snapshot"
run 0 "$ranks/rank3-node2-pid14-oom1.pickle"
expect_in "$out" "devices with data: 3; this is device 3" "one device with data: that one by default"
expect_in "$out" "result:  OUT OF MEMORY at event 3492" "device 3's out-of-memory reproduced"
run 1 "$ranks"/*.pickle
expect_in "$out" "=== $ranks/rank1-node1-pid12-oom1.pickle ===" "each rank's own output"
expect_in "$err" "rank2-node2-pid13-oom1.pickle" "the unreadable rank is named"
expect_in "$out" "=== 4 traces, worst first ===" "ranks: the table"
expect_in "$out" "\(1 could not be replayed" "ranks: the unreadable one counted"
table=$(sed -n '/=== 4 traces, worst first ===/,$p' <<<"$out")
rows=$(grep -E '^/' <<<"$table" | sed -E 's|^.*/(rank[0-9]).*$|\1|' | tr '\n' ' ')
[[ $rows == "rank1 rank3 rank0 " ]] || fail "ranks worst first: got '$rows' in:"$'\n'"$table"
expect_in "$table" "rank1-node1-pid12-oom1.pickle +recorded +OOM at event 3492 +OOM at event 3492 " \
  "ranks: the failing rank's row, reproduced"
expect_in "$table" "rank3-node2-pid14-oom1.pickle device 3 +recorded +OOM at event 3492" \
  "ranks: device 3's row"
expect_in "$table" "rank0-node1-pid11-oom1.pickle +recorded +completed +- .* [0-9.]+ [GM]iB$" \
  "ranks: the rank that completed, with its headroom"
expect_in "$table" "worst for \"recorded\": .*rank1-node1-pid12-oom1.pickle \(out of memory at event 3492, as recorded\)" \
  "ranks: the worst rank"
# --json: one valid array, each record with its recorded out-of-memory; runs appended to one file
# read back by replay_json.py.
run 1 "$ranks"/*.pickle --json
printf '%s\n' "$out" >"$work/ranks.json"
printf '%s\n' "$out" >>"$work/ranks.json"
PYTHONPATH=$source_dir/tools/replay python3 - "$work/ranks.json" <<'PY' || fail "ranks --json"
import json, sys
from replay_json import read_runs
runs = read_runs(sys.argv[1])
assert len(runs) == 6, len(runs)
by_rank = {r["trace"].rsplit("/", 1)[1][:5]: r for r in runs[:3]}
assert by_rank["rank1"]["recorded_oom_event"] == 3492 == by_rank["rank1"]["oom_event_index"], by_rank
assert by_rank["rank0"]["recorded_oom_event"] is None and by_rank["rank0"]["completed"], by_rank
assert by_rank["rank3"]["snapshot_device"] == 3, by_rank
PY
# Several traces at once (one per rank): one replay each, then the table and the worst.
run 0 "$source_dir/examples/traces/resnet50-b32.trace" \
  "$source_dir/examples/traces/gpt2-small-b4-s512-ckpt.trace" --device-memory 3GiB --config policy:classic
expect_in "$out" "=== 2 traces, worst first ===" "several traces: the summary"
expect_in "$out" "worst for \"policy:classic\": .*gpt2-small-b4-s512-ckpt.trace \(out of memory at event 3410\)" \
  "several traces: the worst one"
run 0 "$source_dir/examples/traces/resnet50-b32.trace" "$work/survivor.trace" --json --config policy:stitch
[[ $(grep -c '"config": "policy:stitch"' <<<"$out") == 2 ]] || fail "several --json: one record each"
run 1 "$work/survivor.trace" "$work/missing.trace" --device-memory 1GiB
expect_in "$out" "=== 2 traces, worst first ===" "a missing trace does not stop the others"
expect_in "$out" "\(1 could not be replayed" "the missing one counted"
expect_in "$err" "missing.trace" "the missing trace is named"
run 2 "$work/survivor.trace" "$work/survivor.trace" --plot "$work/p.svg"
expect_in "$err" "--plot writes one trace's file" "--plot with several traces"
run 2 "$work/survivor.trace" - --config policy:stitch
expect_in "$err" "standard input \(-\) is read alone" "stdin with several traces"
run 0 "$shared/transformer-forward-bf16.pickle" --convert "$work/tf.trace"
run 0 "$work/tf.trace" --json --config policy:classic
from_native=$(grep -oE '"peak_reserved_bytes": [0-9]+' <<<"$out")
run 0 "$shared/transformer-forward-bf16.pickle" --json --config policy:classic
from_pickle=$(grep -oE '"peak_reserved_bytes": [0-9]+' <<<"$out")
[[ -n $from_pickle && $from_native == "$from_pickle" ]] ||
  fail "converted trace replays differently: $from_native vs $from_pickle"

# --steps: the trace replayed as a training loop's steps; what each step asked of the device.
gpt2="$source_dir/examples/traces/gpt2-small-b4-s512.trace"
run 0 "$gpt2" --device-memory 80GiB --steps 4
expect_in "$out" 'result:  completed, 4 steps of 4362 events' "--steps result line"
expect_in "$out" 'step   4: 0 device calls, 0 host synchronisations, 0 stream waits' "--steps: stitch settles"
run 0 "$gpt2" --device-memory 80GiB --steps 3 --config policy:classic --json
if command -v python3 >/dev/null; then
  python3 - "$work/out" <<'PY' || fail "--steps JSON"
import json, sys
r = json.load(open(sys.argv[1]))
r = r[0] if isinstance(r, list) else r
assert r["steps"] == 3, r["steps"]
for key in ("device_calls_per_step", "host_synchronizations_per_step", "stream_waits_per_step"):
    assert len(r[key]) == 3, (key, r[key])
assert r["device_calls_per_step"][0] > 0 and r["device_calls_per_step"][2] == 0, r["device_calls_per_step"]
PY
fi
run 2 "$gpt2" --steps 0
expect_in "$err" 'steps needs a number of steps from 1' "--steps 0 refused"
run 2 "$gpt2" --steps 2x
expect_in "$err" 'steps needs a number of steps' "--steps 2x refused"
run 2 "$gpt2" --steps 3 --find-min-memory
expect_in "$err" 'steps does not combine with' "--steps with --find-min-memory refused"

# A program that empties the cache between two phases (two 20 MiB segments freed, no allocation
# for them to make room for): the snapshot has only the segment frees; replayed as recorded, the
# cache is emptied there too and classic reserves PyTorch's 80 MiB, not 100 MiB.
if command -v python3 >/dev/null; then
  python3 - "$work/empty_cache.pickle" <<'PY' || fail "building an empty_cache snapshot"
import pickle, sys
mib = 1 << 20
a1, a2, x, y = 0x7F0000000000, 0x7F0002000000, 0x7F0004000000, 0x7F0008000000
def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": []}
def seg(addr, size):
    return {"device": 0, "address": addr, "total_size": size, "stream": 0, "segment_type": "large",
            "blocks": [{"address": addr, "size": size, "requested_size": size,
                        "state": "active_allocated", "frames": []}]}
trace = []
for a in (a1, a2):
    trace += [ev("segment_alloc", a, 20 * mib), ev("alloc", a, 20 * mib)]
for a in (a1, a2):
    trace += [ev("free_requested", a, 20 * mib), ev("free_completed", a, 20 * mib)]
trace += [ev("segment_free", a1, 20 * mib), ev("segment_free", a2, 20 * mib)]
trace += [ev("segment_alloc", x, 20 * mib), ev("alloc", x, 20 * mib)]
trace += [ev("segment_alloc", y, 60 * mib), ev("alloc", y, 60 * mib)]
pickle.dump({"segments": [seg(x, 20 * mib), seg(y, 60 * mib)], "device_traces": [trace],
             "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}, open(sys.argv[1], "wb"))
PY
  run 0 "$work/empty_cache.pickle" --config recorded --json
  python3 - "$work/out" <<'PY' || fail "--config recorded reserves what a program that empties the cache recorded"
import json, sys
r = json.load(open(sys.argv[1]))
r = r[0] if isinstance(r, list) else r
assert r["recorded_segment_frees"] == 2, r["recorded_segment_frees"]
assert r["recorded_peak_reserved_bytes"] == 80 << 20, r["recorded_peak_reserved_bytes"]
assert r["peak_reserved_bytes"] == r["recorded_peak_reserved_bytes"], r["peak_reserved_bytes"]
PY
  for config in policy:classic policy:expandable policy:stitch; do
    run 0 "$work/empty_cache.pickle" --config "$config"
    expect_in "$out" "result:  completed" "empty_cache snapshot under $config"
  done
fi

finish "gpumem-replay command-line"
