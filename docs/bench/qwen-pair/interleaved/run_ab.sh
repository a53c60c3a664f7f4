#!/usr/bin/env bash
# Target forwards of two checkouts, interleaved: 3 rounds x {1, 2} threads x {old, new}, each a
# fresh process running PROBE MODEL THREADS SIZES (default: forward_ab.py timing 1, 5 and 16
# positions after 200 cached tokens, medians of 15 forwards).
#   bash docs/bench/qwen-pair/interleaved/run_ab.sh OLD_CHECKOUT NEW_CHECKOUT > ab.log
#   PROBE=docs/bench/qwen-pair/amx/prefill.py SIZES=64,150,256 bash ... > prefill.log
set -euo pipefail
old=$1 new=$2
model=${MODEL:-$HOME/.cache/saguaro/models/qwen2.5-coder-1.5b-instruct.gguf}
here=$(cd "$(dirname "$0")" && pwd)
probe=$(realpath "${PROBE:-$here/forward_ab.py}")
sizes=${SIZES:-1,5,16}
for round in 1 2 3; do
  for threads in 1 2; do
    for tree in old new; do
      dir=$new
      [ "$tree" = old ] && dir=$old
      line=$(cd "$dir" && PYTHONPATH=$dir python "$probe" "$model" "$threads" "$sizes" 2>/dev/null | tail -1)
      echo "$round $threads $tree $line"
    done
  done
done
