#!/bin/sh
# selftest_exec.sh — builds and runs the execution model's standalone test
# (selftest_exec.cu against stub_runtime_for_exec_tests.c) by hand, outside
# meson: the kernel file with -fsanitize=thread (its hooks are ours, not
# libtsan's), the C parts plain or, with ASAN=1, under AddressSanitizer and
# UBSan. Runs it under every schedule. Usage: tests/cusim/selftest_exec.sh [outdir]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-/tmp/cusim-selftest}
mkdir -p "$out"
san=""
[ "${ASAN:-0}" = 1 ] && san="-fsanitize=address,undefined -fno-omit-frame-pointer"
cflags="-std=gnu11 -O2 -g -Wall -Wextra -Werror -I$here -I$here/include $san"
for f in fiber exec warp memcheck hooks report stub_runtime_for_exec_tests; do
    gcc $cflags -c "$here/$f.c" -o "$out/$f.o"
done
g++ -std=c++17 -O1 -g -Wall -Wextra -Werror -x c++ -fsanitize=thread -I"$here/include" -I"$here" \
    -c "$here/selftest_exec.cu" -o "$out/selftest_exec.o"
# link with the C++ driver but without libtsan: no -fsanitize=thread here
g++ $san -o "$out/selftest_exec" "$out"/selftest_exec.o "$out"/fiber.o "$out"/exec.o "$out"/warp.o \
    "$out"/memcheck.o "$out"/hooks.o "$out"/report.o "$out"/stub_runtime_for_exec_tests.o -lpthread
status=0
for s in compare in-order reversed random random:12345; do
    EMBER_CUSIM_SCHEDULE=$s "$out/selftest_exec" >"$out/log.$s" 2>&1 || status=1
    tail -n 1 "$out/log.$s"
done
exit $status
