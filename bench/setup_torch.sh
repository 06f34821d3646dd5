#!/bin/sh
# setup_torch.sh — makes the Python virtual environment with PyTorch 2 that
# bench_train uses as its reference (bench/train_step_torch.py). Only the
# benchmarks use it; the tests never need Python or torch.
#
#   bash bench/setup_torch.sh           into bench/.venv, which bench_train finds by itself
#                                       (.gitignore keeps it out of git)
#   bash bench/setup_torch.sh DIR       into DIR; run the benchmarks with EMBER_BENCH_PYTHON=DIR/bin/python
#   bash bench/setup_torch.sh --cpu     PyTorch's CPU-only wheel (download.pytorch.org/whl/cpu): a much
#                                       smaller download than PyPI's default wheel, which brings CUDA's
#                                       libraries (about 3 GB) even where there is no GPU
#
# Needs python3 with its venv module (Debian: apt-get install python3-venv)
# and network access to PyPI. torch.compile also needs a C++ compiler (g++)
# when it runs.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=$here/.venv
index=
for arg in "$@"; do
    case $arg in
    --cpu) index=https://download.pytorch.org/whl/cpu ;;
    -h | --help)
        awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"
        exit 0
        ;;
    -*)
        echo "setup_torch.sh: unknown flag '$arg' (--cpu, --help)" >&2
        exit 2
        ;;
    *) dir=$arg ;;
    esac
done
python3 -m venv "$dir"
if [ -n "$index" ]; then
    "$dir/bin/pip" install torch --index-url "$index"
else
    "$dir/bin/pip" install torch
fi
"$dir/bin/pip" install numpy # torch warns without it and torch.compile uses it
"$dir/bin/python" "$here/train_step_torch.py" --info
if [ "$dir" != "$here/.venv" ]; then
    echo "now: EMBER_BENCH_PYTHON=$dir/bin/python ./build/bench/bench_train"
else
    echo "now: ./build/bench/bench_train (it finds bench/.venv)"
fi
