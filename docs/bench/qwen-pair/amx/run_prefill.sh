#!/usr/bin/env bash
# Prefill of two checkouts, interleaved: 3 rounds x {1, 2} threads x {old, new}, each a fresh
# process timing prompts of 64, 150 and 256 tokens (medians of 3).
#   bash docs/bench/qwen-pair/amx/run_prefill.sh OLD_CHECKOUT NEW_CHECKOUT > prefill.log
set -euo pipefail
old=$1 new=$2
model=${MODEL:-$HOME/.cache/saguaro/models/qwen2.5-coder-1.5b-instruct.gguf}
here=$(cd "$(dirname "$0")" && pwd)
for round in 1 2 3; do
  for threads in 1 2; do
    for tree in old new; do
      dir=$new
      [ "$tree" = old ] && dir=$old
      line=$(cd "$dir" && PYTHONPATH=$dir python "$here/prefill.py" "$model" "$threads" 64,150,256 2>/dev/null | tail -1)
      echo "$round $threads $tree $line"
    done
  done
done
