# Sourced by the gpumem-replay script tests (tests/replay_cli/test_cli.sh,
# tests/peers/test_peers.sh) once they have set $replay: a scratch folder $work, the failure count,
# the helpers below and the split-survivor trace $work/survivor.trace.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run EXPECTED_STATUS ARGS...: runs gpumem-replay, keeps stdout in $out and stderr in $err.
run() {
  local expected=$1
  shift
  "$replay" "$@" >"$work/out" 2>"$work/err"
  local status=$?
  out=$(cat "$work/out")
  err=$(cat "$work/err")
  if [[ $status != "$expected" ]]; then
    fail "gpumem-replay $* exited $status, expected $expected; stderr: $err"
  fi
}

expect_in() {  # expect_in TEXT PATTERN WHAT
  if ! grep -qE -- "$2" <<<"$1"; then fail "$3: /$2/ not found in:"$'\n'"$1"; fi
}

# finish WHAT: exits 1 when a check failed, else says that all WHAT checks passed.
finish() {
  if ((failures > 0)); then
    echo "$failures check(s) failed" >&2
    exit 1
  fi
  echo "all $1 checks passed"
}

# A 60 MiB block is freed and 20 MiB cut from its segment; then 50 MiB are asked for. On a
# 100 MiB device classic runs out of memory at event 4; stitch completes; 70 MiB are requested.
mib=1048576
cat >"$work/survivor.trace" <<EOF
gpumem-trace 1
@source split survivor by hand
alloc 0x1000 $((60 * mib)) 0
free_requested 0x1000 $((60 * mib)) 0
free_completed 0x1000 $((60 * mib)) 0
alloc 0x2000 $((20 * mib)) 0
alloc 0x3000 $((50 * mib)) 0
free_requested 0x2000 $((20 * mib)) 0
free_requested 0x3000 $((50 * mib)) 0
EOF
