#!/bin/sh
# selftest.sh — builds and runs the emulator's runtime and cuBLAS selftests
# on their own (with stub_exec_for_runtime_tests.c in place of exec.c):
# plain, under ASan/UBSan, with the mprotect fallback of the memory
# protection, then the drain benchmark. Run from anywhere; builds in $TMPDIR.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${TMPDIR:-/tmp}/cusim-selftest
mkdir -p "$out"
common="$here/runtime.c $here/stream.c $here/copy.c $here/memory.c $here/vmm.c $here/report.c $here/stub_exec_for_runtime_tests.c"
flags="-std=gnu11 -Wall -Wextra -Werror -g -I$here/include -I$here"
for t in runtime cublas; do
    extra=""
    [ $t = cublas ] && extra="$here/cublas.c"
    cc $flags -O2 "$here/selftest_$t.c" $extra $common -lm -lpthread -o "$out/$t"
    cc $flags -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all \
        "$here/selftest_$t.c" $extra $common -lm -lpthread -o "$out/$t-asan"
    for bin in "$out/$t" "$out/$t-asan"; do
        echo "== $(basename "$bin")"
        "$bin" 2>/dev/null | tail -1
        EMBER_CUSIM_PROTECT=mprotect "$bin" 2>/dev/null | tail -1
    done
done
for mode in 1 mprotect 0; do EMBER_CUSIM_PROTECT=$mode "$out/runtime" bench; done
