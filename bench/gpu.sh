#!/usr/bin/env bash
# gpu.sh — everything a lent GPU session should run, in one call (see
# /work/.library/device/METHOD.md): build with CUDA, the GPU tests, then
# GPT-2 124M training in ember beside PyTorch eager and torch.compile on the
# same device. Output: the test summary, then one line per (framework, batch).
#   bash bench/gpu.sh [batch ...]     (default 8 16 32)
set -uo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
meson setup build-gpu -Dcuda=enabled >/dev/null 2>&1 || meson setup --reconfigure build-gpu -Dcuda=enabled >/dev/null
ninja -C build-gpu >/dev/null || { echo "build failed"; ninja -C build-gpu | tail -30; exit 1; }
./build-gpu/ember env | grep -E "CUDA|cuda:|NCCL"
./build-gpu/tests/ember-tests cuda 2>&1 | grep -E "^(FAIL|fail|skip)|passed" | tail -40
./build-gpu/bench/bench_gpu "$@"
python3 bench/gpt_gpu_torch.py eager "$@"
python3 bench/gpt_gpu_torch.py compile "$@"
