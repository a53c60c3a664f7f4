#!/usr/bin/env bash
# llama.cpp on the pair's two files, two runs each: AR (llama-completion) and its draft-model
# speculation (llama-speculative-simple, K = 4), 2 threads, greedy, 128 tokens, one ChatML
# coding request; the timing lines of each run into this folder's logs.
#   bash docs/bench/qwen-pair/vnni/llamacpp/run.sh LLAMA_CPP/build/bin
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
models=${SAGUARO_MODELS:-$HOME/.cache/saguaro/models}
target=$models/qwen2.5-coder-1.5b-instruct.gguf draft=$models/qwen2.5-coder-0.5b-instruct.gguf
prompt=$'<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWrite a Python function that returns the n-th Fibonacci number.<|im_end|>\n<|im_start|>assistant\n'
for run in 1 2; do
  "$bin/llama-completion" -m "$target" -t 2 --temp 0 -n 128 -no-cnv --ignore-eos -p "$prompt" \
    > /dev/null 2> "$here/ar-$run.log"
  "$bin/llama-speculative-simple" -m "$target" -md "$draft" --spec-type draft-simple \
    --spec-draft-n-max 4 -t 2 -td 2 --temp 0 -n 128 -p "$prompt" > /dev/null 2> "$here/sd-$run.log"
done
grep -h -E "eval time|decoded|accept" "$here"/*.log
