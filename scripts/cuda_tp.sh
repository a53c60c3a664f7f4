#!/usr/bin/env bash
# On a machine with GPUs: install saguaro over the machine's own torch, run the tensor-parallel
# tests (CUDA ones included) and a TP = 1/2/4 benchmark of AR, SD and SSD on random-weight
# checkpoints of real shapes. Results go to $OUT (default ./cuda-out).
#
#   bash scripts/cuda_tp.sh
set -euo pipefail
OUT=${OUT:-cuda-out}
mkdir -p "$OUT"
pip install --no-deps -e . >"$OUT/install.log" 2>&1
nvidia-smi >"$OUT/nvidia-smi.txt" || true
python -m pytest -q -x tests/engine/test_tensor_parallel_cuda.py tests/models/test_parallel.py \
    2>&1 | tee "$OUT/tests.txt"
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
sizes=1
[ "$gpus" -ge 2 ] && sizes=1,2
[ "$gpus" -ge 4 ] && sizes=1,2,4
python scripts/real_shapes.py write --out /tmp/real-shapes
# SSD's draft takes the GPU after the target's ranks where there is one (else rank 0's).
python -m saguaro bench --device cuda \
    --model /tmp/real-shapes/qwen3-0.6b --draft /tmp/real-shapes/qwen3-0.6b-draft \
    --modes ar,sd,ssd --tensor-parallel-size "$sizes" --batch-sizes 1,16 --temperatures 0 \
    --num-prompts 16 --max-tokens 64 --repeats 2 --out "$OUT/tp-bench" 2>&1 | tail -40
