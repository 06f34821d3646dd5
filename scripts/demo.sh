#!/usr/bin/env bash
# demo.sh — what `make demo` runs: trains a small character-level GPT on the
# word list of Debian's `wamerican` package (one English word per line) for
# about two minutes on 2 cores, as 2 processes with DDP (ember launch -n 2),
# then samples new "words" from it.
set -euo pipefail
cd "$(dirname "$0")/.."
words=/usr/share/dict/american-english
out=build/demo-words
./build/ember launch -n 2 ./build/ember train --data "$words" --out "$out" \
    --layers 4 --heads 4 --embd 128 --block 64 --batch 12 \
    --iters 2000 --lr 1e-3 --min-lr 1e-4 --warmup 100 \
    --eval-every 500 --eval-iters 50 --log-every 100
echo
echo "== ember sample --ckpt $out (words the model invented, one per line)"
./build/ember sample --ckpt "$out" --prompt $'\n' --tokens 400 --temperature 0.8 --seed 7
