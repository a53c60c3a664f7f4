#!/usr/bin/env bash
# Target forwards of two checkouts, interleaved: 3 rounds x {1, 2} threads x {old, new}, each a
# fresh process timing 1, 5 and 16 positions after 200 cached tokens (medians of 15 forwards).
#   bash docs/bench/qwen-pair/interleaved/run_ab.sh OLD_CHECKOUT NEW_CHECKOUT > ab.log
set -euo pipefail
old=$1 new=$2
model=${MODEL:-$HOME/.cache/saguaro/models/qwen2.5-coder-1.5b-instruct.gguf}
here=$(cd "$(dirname "$0")" && pwd)
for round in 1 2 3; do
  for threads in 1 2; do
    for tree in old new; do
      dir=$new
      [ "$tree" = old ] && dir=$old
      line=$(cd "$dir" && PYTHONPATH=$dir python "$here/forward_ab.py" "$model" "$threads" 1,5,16 2>/dev/null | tail -1)
      echo "$round $threads $tree $line"
    done
  done
done
