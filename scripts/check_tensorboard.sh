#!/usr/bin/env bash
# check_tensorboard.sh — checks ember's TensorBoard event files with
# TensorBoard's own reader (not a unit test: it needs Python and the
# `tensorboard` package, which it installs into a venv).
#
# It runs two short `ember train --log-with all` jobs and reads their event
# files with tensorboard.backend.event_processing.event_accumulator.
# EventAccumulator, the reader behind TensorBoard's scalar dashboard, then
# compares every scalar (tag, step, value) with the run's metrics.jsonl
# (values as float32, the precision an event file stores):
#   1. a straight run;
#   2. a run killed (kill -9 through EMBER_FAULT) after its checkpoint and
#      resumed from it: the killed run's event file holds records past the
#      checkpoint that the resumed run logs again; the resumed run's file
#      marks the restart (SessionLog START), TensorBoard must drop the
#      duplicates, and what it shows must equal the deduplicated JSONL.
#
# usage: scripts/check_tensorboard.sh [EMBER_BINARY]
#   EMBER_BINARY   default: build-cpu/ember, else build/ember
#   TB_VENV        the venv to use or create (default /tmp/tbvenv)
# Exit 0 when every scalar matches, 1 otherwise.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
ember=${1:-}
if [ -z "$ember" ]; then
    for c in "$root/build-cpu/ember" "$root/build/ember"; do
        [ -x "$c" ] && ember=$c && break
    done
fi
if [ -z "$ember" ] || [ ! -f "$ember" ] || [ ! -x "$ember" ]; then
    echo "check_tensorboard: no ember binary${ember:+ at $ember} (build it, or pass the path of the ember program)" >&2
    exit 1
fi
venv=${TB_VENV:-/tmp/tbvenv}
if ! "$venv/bin/python" -c 'import tensorboard' 2>/dev/null; then
    echo "check_tensorboard: installing tensorboard into $venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet tensorboard
fi
echo "check_tensorboard: $("$venv/bin/python" -c 'import tensorboard; print("tensorboard", tensorboard.__version__)')"

work=$(mktemp -d -t ember-tb-XXXXXX) # under $TMPDIR, else /tmp
trap 'rm -rf "$work"' EXIT
for i in $(seq 300); do echo "the cat sat on the mat. the dog sat on the log."; done >"$work/corpus.txt"
flags=(--data "$work/corpus.txt" --layers 1 --heads 2 --embd 16 --block 8 --batch 4
       --iters 30 --eval-every 10 --eval-iters 2 --log-every 2 --log-with all)

# 1. straight
"$ember" train "${flags[@]}" --out "$work/straight" >/dev/null

# 2. killed at the end of step 16 (its last checkpoint: step 10), then resumed
killed=0 # (the group's 2>/dev/null keeps bash's own "Killed" notice quiet)
{ EMBER_FAULT=train.step:16 "$ember" train "${flags[@]}" --out "$work/resumed" >/dev/null 2>&1 || killed=$?; } 2>/dev/null
if [ "$killed" -ne 137 ]; then
    echo "check_tensorboard: the run to kill exited $killed, not 137 (killed)" >&2
    exit 1
fi
sleep 1.1 # the event file names start with the second they were made
"$ember" train "${flags[@]}" --out "$work/resumed" --resume "$work/resumed/state" >/dev/null

"$venv/bin/python" - "$work" <<'EOF'
import json, os, struct, sys
from tensorboard.backend.event_processing import event_accumulator

def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]

def check(name, out):
    logdir = os.path.join(out, "runs", os.path.basename(out))
    files = sorted(f for f in os.listdir(logdir) if f.startswith("events.out.tfevents."))
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    want = {}
    with open(os.path.join(out, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            step = rec.pop("step")
            for tag, v in rec.items():
                want.setdefault(tag, []).append((step, f32(v)))
    tags = sorted(acc.Tags()["scalars"])
    bad = 0
    if tags != sorted(want):
        print(f"{name}: TensorBoard has tags {tags}, metrics.jsonl {sorted(want)}")
        bad += 1
    n = 0
    for tag in sorted(want):
        got = [(e.step, e.value) for e in acc.Scalars(tag)] if tag in tags else []
        w = sorted(want[tag])
        if got != w:
            print(f"{name}: {tag}: TensorBoard has {got}\n  metrics.jsonl has {w}")
            bad += 1
        n += len(w)
    print(f"{name}: {len(files)} event file(s), {len(want)} tags, {n} scalars: "
          + ("every one equal to metrics.jsonl's" if not bad else f"{bad} tag(s) differ"))
    return bad

work = sys.argv[1]
bad = check("straight run", os.path.join(work, "straight"))
bad += check("killed at step 16 and resumed from step 10", os.path.join(work, "resumed"))
sys.exit(1 if bad else 0)
EOF
echo "check_tensorboard: ok"
