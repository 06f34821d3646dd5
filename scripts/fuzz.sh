#!/usr/bin/env bash
# fuzz.sh — builds ember's libFuzzer targets (tests/fuzz) with clang, ASan and
# UBSan in build-fuzz/, runs each reader's target for a bounded time, then
# shows that the fuzzer catches a planted bug in the same time.
#
# Output is the test suite's: one line per result, then "N passed, N failed,
# N skipped" (scripts/run_tests.sh adds these to its totals):
#   ok   fuzz_safetensors (25.0s): 412345 runs (16493/s), coverage 812 edges, 2301 features, corpus 212
#   ok   fuzz_finds_planted_bug (2.1s): heap-buffer-overflow in hex4 after 31337 runs
# Without clang every result is a skip that says why.
#
# usage: scripts/fuzz.sh [SECONDS]   (per target; default $EMBER_FUZZ_SECONDS or 25)
# The two readers' targets run side by side (one core each). A crash's input
# is kept in build-fuzz/artifacts/; the corpus grows in build-fuzz/corpus/
# (seeded from tests/fuzz/corpus/).
set -uo pipefail
cd "$(dirname "$0")/.."

secs=${1:-${EMBER_FUZZ_SECONDS:-25}}
targets=(fuzz_safetensors fuzz_config)
planted=fuzz_finds_planted_bug
dir=build-fuzz

skip_all() {
    for t in "${targets[@]}" "$planted"; do echo "skip $t: $1"; done
    echo "0 passed, 0 failed, $((${#targets[@]} + 1)) skipped"
    exit 0
}

command -v clang >/dev/null 2>&1 || skip_all "clang is not installed (libFuzzer comes with clang; apt-get install clang)"

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
if [ ! -f "$dir/build.ninja" ]; then
    if ! CC=clang meson setup "$dir" -Dfuzz=true -Dcuda=disabled -Db_sanitize=address,undefined \
        -Dbuildtype=debugoptimized >"$log/setup" 2>&1; then
        cat "$log/setup"
        echo "FAIL fuzz_build: meson setup $dir (output above)"
        echo "0 passed, 1 failed, 0 skipped"
        exit 1
    fi
fi
if ! ninja -C "$dir" fuzz >"$log/build" 2>&1; then
    tail -n 60 "$log/build"
    echo "FAIL fuzz_build: ninja -C $dir fuzz (output above)"
    echo "0 passed, 1 failed, 0 skipped"
    exit 1
fi

export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
mkdir -p "$dir/artifacts"

# run_target <name> <seconds> <seed dir>: libFuzzer's output into $log/<name>
run_target() {
    local name=$1 t=$2 seeds=$3
    mkdir -p "$dir/corpus/$name"
    "$dir/tests/fuzz/$name" -max_total_time="$t" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$dir/artifacts/$name-" "$dir/corpus/$name" "$seeds" >"$log/$name" 2>&1
}

now() { date +%s.%N; }

passed=0 failed=0
pids=()
t0=$(now)
for t in "${targets[@]}"; do
    run_target "$t" "$secs" "tests/fuzz/corpus/${t#fuzz_}" &
    pids+=($!)
done
for k in "${!targets[@]}"; do
    t=${targets[$k]}
    wait "${pids[$k]}"
    rc=$?
    took=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    # the last status line ("#412345<tab>DONE cov: 812 ft: 2301 corp: 212/9Kb ...") and the final stats
    st=$(grep -E '^#[0-9]+[[:space:]]+[A-Z]+ +cov:' "$log/$t" | tail -n 1)
    cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$st")
    ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$st")
    corp=$(sed -nE 's/.* corp: ([0-9]+).*/\1/p' <<<"$st")
    runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log/$t")
    eps=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$log/$t")
    if [ "$rc" -eq 0 ] && grep -q "^Done [0-9]* runs" "$log/$t"; then
        echo "ok   $t (${took}s): ${runs:-?} runs (${eps:-?}/s), coverage ${cov:-?} edges, ${ft:-?} features, corpus ${corp:-?}"
        passed=$((passed + 1))
    else
        grep -E -A 40 '^==[0-9]+==ERROR|^fuzz check failed|runtime error|^SUMMARY' "$log/$t" | head -n 60
        echo "FAIL $t (${took}s): libFuzzer exited $rc after ${runs:-?} runs (input kept as $dir/artifacts/$t-*; output above)"
        failed=$((failed + 1))
    fi
done

# The planted bug: the same fuzzer, given the JSON of the safetensors seeds,
# must stop on the out-of-bounds read within the same time.
seeds="$log/json-seeds"
mkdir -p "$seeds"
for f in tests/fuzz/corpus/safetensors/*; do tail -c +3 "$f" >"$seeds/$(basename "$f")"; done
t0=$(now)
"$dir/tests/fuzz/fuzz_json_planted" -max_total_time="$secs" -timeout=10 -artifact_prefix="$log/planted-" \
    -print_final_stats=1 "$seeds" >"$log/planted" 2>&1
rc=$?
took=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
runs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$log/planted")
if [ "$rc" -ne 0 ] && grep -q "heap-buffer-overflow" "$log/planted" && grep -q "in hex4" "$log/planted"; then
    echo "ok   $planted (${took}s): heap-buffer-overflow in hex4 found after ${runs:-?} runs"
    passed=$((passed + 1))
else
    tail -n 20 "$log/planted"
    echo "FAIL $planted (${took}s): the fuzzer did not find the planted overread in ${secs}s (exit $rc; output above)"
    failed=$((failed + 1))
fi

echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ]
