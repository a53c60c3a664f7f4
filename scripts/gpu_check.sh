#!/usr/bin/env bash
# The first thing to run on a machine with NVIDIA GPUs, from a fresh checkout, in 4 to 6 minutes,
# with no network: it uses the machine's torch and what the repository carries, and writes its
# own checkpoints. Everything goes to $OUT (default docs/bench/gpu/<date>); copy its summary.md
# into docs/bench/gpu/README.md.
#
#   bash scripts/gpu_check.sh
#
# 1. saguaro over the machine's torch (pip install --no-deps -e .); stops, naming them, if the
#    project's other dependencies or transformers (the tests' checkpoints) cannot be imported.
# 2. The CUDA tests: graph replay equals eager, greedy SD and SSD through graphs equal AR, SD's
#    first two tokens at T = 0.7 against the exact law; the bucketed path's CPU tests; TP where
#    two GPUs are visible.
# 3. One forward eager against graphed, draft and target of SmolLM2-135M's shapes (random
#    weights; the draft is the target's first 4 layers, the target's other layers scaled by
#    NEAR, which sets greedy acceptance: about 0.8 at 0.02): batch 1 and 16, 1 and 5 positions.
# 4. Where a decoding step synchronises the host with the GPU, by line (scripts/gpu_syncs.py):
#    AR, SD, and SD under coupled sampling (SSD's target side at T > 0).
# 5. saguaro bench on that pair, greedy (exact: checked against AR), AR, SD and SSD, eager and
#    graphed, batch 1 and 16; with two GPUs, SSD's draft on the second (the paper's layout) and
#    TP 2. Then SD at a synthetic acceptance of 0.7 on an unrelated random pair.
#
# PYTHON names the interpreter that holds the machine's torch (default python3). WHEELS=DIR
# installs the wheels in DIR first (--no-index, into a folder on PYTHONPATH): how a machine with no
# network gets the project's pure dependencies (gguf, llguidance). DEVICE=cpu runs the same steps
# on the CPU, as a dry run of the script itself (no capture, no synchronisation count), with
# MAX_TOKENS and NUM_PROMPTS (default 64 and 16) to shorten the benches.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/bench/gpu/$(date -u +%Y-%m-%d)}
MODELS=${MODELS:-/tmp/saguaro-gpu-models}
NEAR=${NEAR:-0.02}
PYTHON=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
MAX_TOKENS=${MAX_TOKENS:-64}
NUM_PROMPTS=${NUM_PROMPTS:-16}
python() { "$PYTHON" "$@"; }
mkdir -p "$OUT"
log() { echo "== $*" | tee -a "$OUT/summary.md"; }
: >"$OUT/summary.md"
log "gpu_check $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

if [ -n "${WHEELS:-}" ]; then
    python -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/saguaro-site \
        "$WHEELS"/*.whl >"$OUT/install.log" 2>&1 || { log "wheels from $WHEELS failed"; exit 1; }
    export PYTHONPATH=/tmp/saguaro-site${PYTHONPATH:+:$PYTHONPATH}
fi
# No build isolation: an isolated build would fetch setuptools from an index the machine lacks.
if ! python -m pip install --no-deps --no-build-isolation -e . >>"$OUT/install.log" 2>&1; then
    log "pip install failed (install.log); running from the checkout"
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
missing=$(python - <<'EOF'
import importlib.util
mods = ["torch", "numpy", "safetensors", "tokenizers", "jinja2", "tqdm", "gguf", "llguidance",
        "transformers", "pytest"]
print(" ".join(m for m in mods if importlib.util.find_spec(m) is None))
EOF
)
if [ -n "$missing" ]; then
    log "missing Python modules: $missing (install them, then rerun)"
    exit 2
fi
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1 || true
python - <<'EOF' | tee -a "$OUT/summary.md"
import torch
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s):",
      ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))
EOF
gpus=$(python -c "import torch; print(torch.cuda.device_count())")

log "tests"
timeout 300 "$PYTHON" -m pytest -q -p no:cacheprovider tests/engine/test_graphs_cuda.py \
    tests/engine/test_graphs.py tests/engine/test_tensor_parallel_cuda.py 2>&1 \
    | tee "$OUT/tests.txt" | tail -3 | tee -a "$OUT/summary.md"

log "checkpoints (random weights, SmolLM2-135M's shapes)"
python scripts/real_shapes.py write --out "$MODELS" --shapes smollm2-135m --near "$NEAR" >/dev/null
target="$MODELS/smollm2-135m-near"
draft="$MODELS/smollm2-135m-near-draft"

log "one forward, eager vs graphed (ms, medians of 50)"
for m in "$draft" "$target"; do
    timeout 120 "$PYTHON" scripts/graph_forwards.py --model "$m" --device "$DEVICE" --repeats 50
done | tee "$OUT/forwards.jsonl" | tee -a "$OUT/summary.md"

if [ "$DEVICE" = cuda ]; then
    log "host-device synchronisations per step (lines that cause them)"
    timeout 180 "$PYTHON" scripts/gpu_syncs.py --model "$target" --draft "$draft" \
        | tee "$OUT/syncs.jsonl" | tee -a "$OUT/summary.md"
fi

bench() {  # name, then saguaro bench flags
    local name=$1; shift
    log "bench $name"
    timeout 240 "$PYTHON" -m saguaro bench --device "$DEVICE" --model "$target" --draft "$draft" \
        --prompts scripts/gpu_prompts.jsonl --num-prompts "$NUM_PROMPTS" --max-tokens "$MAX_TOKENS" \
        --temperatures 0 \
        --repeats 1 --out "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1 \
        || log "bench $name failed: see $name.log"
    [ -f "$OUT/$name/results.md" ] && grep '^|' "$OUT/$name/results.md" | tee -a "$OUT/summary.md"
}
# Graphs are captured on CUDA alone: a dry run on the CPU benches the eager forwards.
if [ "$DEVICE" = cuda ]; then graphs=graphs both=eager,graphs; else graphs=eager both=eager; fi
bench one-gpu --modes ar,sd,ssd --k 4 --forwards "$both" --batch-sizes 1,16 --draft-device "$DEVICE"
if [ "$gpus" -ge 2 ]; then
    bench ssd-own-gpu --modes ar,sd,ssd --k 4 --forwards "$graphs" --batch-sizes 1,16 \
        --draft-device cuda:1
    bench tp2 --modes ar,sd --k 4 --forwards eager --tensor-parallel-sizes 1,2 --batch-sizes 16
fi
bench synthetic --modes ar,sd --k 4 --forwards "$graphs" --batch-sizes 1,16 \
    --draft "$MODELS/smollm2-135m-draft" --synthetic-acceptance 0.7
log "done"
