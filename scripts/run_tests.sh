#!/usr/bin/env bash
# run_tests.sh — builds ember three ways and runs the test suite in each build:
#   plain  build/       (meson defaults: release, -march=native; CUDA through
#                        nvcc when the toolkit is found, so the GPU code is
#                        compiled for sm_80/sm_90; with no GPU its tests skip)
#   asan   build-asan/  (-Dcuda=sim -Db_sanitize=address,undefined
#                        -Dbuildtype=debugoptimized: the same .cu sources built for the
#                        host and run under ember's CUDA emulator, tests/cusim,
#                        so every GPU test runs here, on two emulated devices)
#   portable build-portable/ (-Dnative=false -Dcuda=disabled: the README's
#                        portable build, code outside the kernels' own target
#                        attributes for baseline x86-64, no FMA contraction;
#                        it had stopped compiling unnoticed once)
# then, when clang is installed, the libFuzzer targets (scripts/fuzz.sh:
# each reader's target for $EMBER_FUZZ_SECONDS, default 25 s, side by side,
# and the planted bug the fuzzer must find), one result line each.
# Every per-test line is printed prefixed with [plain], [asan], [portable] or
# [fuzz]; the output ends with one line summing all runs: "N passed, N
# failed, N skipped".
# Exit status is non-zero if a build failed, a test failed or a runner died
# (a failed build or a runner that died counts as one failed test).
#
# usage: scripts/run_tests.sh [substring...]   (only tests whose name contains one)
set -uo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh || exit 1

# Sanitizer reports end the test (and fail it) instead of scrolling past.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:print_stacktrace=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"

passed=0 failed=0 skipped=0 status=0
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
# The single-node Slurm cluster tests/test_slurm.c runs jobs on: started once
# for both suites when they run those tests (as root; where it cannot start,
# they skip saying why) and stopped at the end.
if [ $# -eq 0 ] || printf '%s\n' "$@" | grep -q slurm; then
    bash scripts/slurm_setup.sh start
    trap 'rm -rf "$logs"; bash scripts/slurm_setup.sh stop' EXIT
fi

# configure_and_build <label> <dir> [meson options...]
configure_and_build() {
    local label=$1 dir=$2
    shift 2
    local log="$logs/$label.build"
    echo "== $label: building $dir/ $*"
    if [ ! -f "$dir/build.ninja" ]; then
        local how=()
        [ -f "$dir/meson-private/coredata.dat" ] && how=(--reconfigure)
        if ! meson setup "${how[@]}" "$dir" "$@" >"$log" 2>&1; then
            cat "$log"
            echo "[$label] FAIL build: meson setup $dir $* (output above)"
            return 1
        fi
    fi
    if ! ninja -C "$dir" >"$log" 2>&1; then
        tail -n 80 "$log"
        echo "[$label] FAIL build: ninja -C $dir (output above)"
        return 1
    fi
}

# run_suite <label> <dir> [substring...]: runs the suite, adds to the totals
run_suite() {
    local label=$1 dir=$2
    shift 2
    echo "== $label: running $dir/tests/ember-tests $*"
    run_counted "$label" "$dir/tests/ember-tests" "$@"
}

# run_counted <label> <command...>: runs a command that prints result lines
# and ends with the summary line, and adds that line to the totals
run_counted() {
    local label=$1
    shift
    local log="$logs/$label.out"
    "$@" 2>&1 | tee "$log" | sed -u "s/^/[$label] /"
    local rc=${PIPESTATUS[0]}
    local summary
    summary=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$log" | tail -n 1)
    if [ -z "$summary" ]; then
        echo "[$label] FAIL test runner exited with status $rc before printing its summary"
        failed=$((failed + 1))
        status=1
        return
    fi
    local p f s
    read -r p _ f _ s _ <<<"${summary//,/}"
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    if [ "$rc" -ne 0 ] || [ "$f" -ne 0 ]; then status=1; fi
}

# A build that fails counts as one failed test, so the last line never
# reads as green when nothing could run.
if configure_and_build plain build; then
    run_suite plain build "$@"
else
    failed=$((failed + 1)) status=1
fi
if configure_and_build asan build-asan -Dcuda=sim -Db_sanitize=address,undefined -Dbuildtype=debugoptimized; then
    run_suite asan build-asan "$@"
else
    failed=$((failed + 1)) status=1
fi
if configure_and_build portable build-portable -Dnative=false -Dcuda=disabled; then
    run_suite portable build-portable "$@"
else
    failed=$((failed + 1)) status=1
fi

# The fuzz targets run with the full suite, or when a substring names them
# ("fuzz"): scripts/fuzz.sh builds build-fuzz/ with clang, or reports skips
# saying why.
if [ $# -eq 0 ] || printf '%s\n' "$@" | grep -q fuzz; then
    echo "== fuzz: scripts/fuzz.sh (${EMBER_FUZZ_SECONDS:-25} s a target)"
    run_counted fuzz bash scripts/fuzz.sh
fi

echo "$passed passed, $failed failed, $skipped skipped"
exit "$status"
