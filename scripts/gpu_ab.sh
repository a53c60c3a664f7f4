#!/usr/bin/env bash
# Two trees of saguaro benched one after the other on one machine: the working tree against
# commit OLD, through graphs, greedy and at T = 0.7. Runs on different hosts differ more than
# most changes do, so a change's effect on speed is read from one run of this script.
#
#   bash scripts/gpu_ab.sh OLD [saguaro bench flags that replace the defaults below]
#
# Run it on a machine where saguaro is not installed (an installed saguaro would shadow the
# trees put on PYTHONPATH; each tree prints where it was imported from). WHEELS=DIR as for
# gpu_check.sh; DEVICE=cpu, NUM_PROMPTS and MAX_TOKENS (default 16 and 64) dry-run it on the CPU
# (give eager forwards in the flags). Output in $OUT (default /tmp/gpu-ab): old/ and new/, each
# a saguaro bench.
set -uo pipefail
cd "$(dirname "$0")/.."
old=$1
shift
OUT=${OUT:-/tmp/gpu-ab}
MODELS=${MODELS:-/tmp/saguaro-gpu-models}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT/old-tree"
git archive "$old" saguaro ':!saguaro/bundled' | tar -x -C "$OUT/old-tree" || exit 1
site=""
if [ -n "${WHEELS:-}" ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade \
        --target /tmp/saguaro-site "$WHEELS"/*.whl || exit 1
    site=/tmp/saguaro-site
fi
PYTHONPATH=$PWD:$site "$PYTHON" scripts/real_shapes.py write --out "$MODELS" \
    --shapes smollm2-135m --near 0.02 >/dev/null || exit 1
flags=(--modes ar,sd --k 4 --forwards graphs --batch-sizes 1,16 --temperatures 0,0.7
    --repeats 3)
[ $# -gt 0 ] && flags=("$@")
root=$PWD
cd "$OUT"  # not the checkout: Python puts the working directory ahead of PYTHONPATH
for tree in "old:$OUT/old-tree" "new:$root"; do
    name=${tree%%:*}
    export PYTHONPATH=${tree#*:}:$site
    "$PYTHON" -c "import saguaro; print('$name: saguaro from', saguaro.__file__)"
    "$PYTHON" -m saguaro bench --device "$DEVICE" --model "$MODELS/smollm2-135m-near" \
        --draft "$MODELS/smollm2-135m-near-draft" --prompts "$root/scripts/gpu_prompts.jsonl" \
        --num-prompts "${NUM_PROMPTS:-16}" --max-tokens "${MAX_TOKENS:-64}" --out "$OUT/$name" \
        "${flags[@]}" >"$OUT/$name.log" 2>&1 || echo "$name failed: see $name.log"
    grep '^|' "$OUT/$name/results.md" | head -12
done
