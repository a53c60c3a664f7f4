"""Time the target's forwards on torch's operators and on saguaro's kernels, in each weight
format, and check that a token's logits are the same bits alone, in a K + 1-position
verification and in a batch of 16 sequences' verifications.

    python docs/bench/kernels/kernel_forwards.py [--model DIR] [--context 200] [--threads 1,2] \\
        [--out FILE]

One JSON line per (threads, configuration): median ms of a 1-position decode, a 5-position
verification and 16 sequences' 5-position verifications, each after ``--context`` cached tokens,
and whether the three gave the token the same logits.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from saguaro.engine.model_runner import ModelRunner
from saguaro.models.catalog import DEFAULT_MODEL, resolve_model
from saguaro.models.gguf_import import GGUF_NAME
from saguaro.models.loader import load_model
from saguaro.train.costs import median_ms

BLOCK_SIZE = 16
BATCH = 16
POSITIONS = 5  # K + 1 with K = 4
# (name, dtype, quantization, saguaro's kernels)
CONFIGS = [
    ("float32, torch", "float32", "none", False),
    ("bfloat16, torch", "bfloat16", "none", False),
    ("float32, kernels", "float32", "none", True),
    ("bfloat16, kernels", "bfloat16", "none", True),
    ("int8, kernels", "float32", "int8", True),
    ("int4 (g32), kernels", "float32", "int4", True),
    ("GGUF Q4_1/Q8_0, kernels", "float32", "gguf", True),
    ("GGUF Q4_1/Q8_0, bf16 activations", "bfloat16", "gguf", True),
]


def measure(model_dir: str, dtype: str, quantization: str, kernels: bool, context: int) -> dict:
    model = load_model(model_dir, dtype, quantization=quantization, kernels=kernels)
    blocks = -(-(context + POSITIONS) // BLOCK_SIZE)
    runner = ModelRunner(model, BATCH * blocks, BLOCK_SIZE, "cpu")
    tables = [list(range(i * blocks, (i + 1) * blocks)) for i in range(BATCH)]
    prompt = [(7 * i) % 1000 + 100 for i in range(context)]
    runner.forward([runner.sequence_query(t, 0, prompt, 0) for t in tables])
    ext = [11, 12, 13, 14, 15][:POSITIONS]
    one = [runner.sequence_query(tables[0], context, ext[:1], 1)]
    verify = [runner.sequence_query(tables[0], context, ext, POSITIONS)]
    batch = [runner.sequence_query(t, context, ext, POSITIONS) for t in tables]
    a, b, c = runner.forward(one)[0], runner.forward(verify)[0], runner.forward(batch)[0]
    return {
        "ms_1": median_ms(lambda: runner.forward(one), 15),
        f"ms_{POSITIONS}": median_ms(lambda: runner.forward(verify), 15),
        f"ms_{BATCH}x{POSITIONS}": median_ms(lambda: runner.forward(batch), 5),
        "invariant": bool(torch.equal(a, b) and torch.equal(a, c)),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(resolve_model(DEFAULT_MODEL)))
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    args = p.parse_args()
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for name, dtype, quantization, kernels in CONFIGS:
            if quantization == "gguf" and not (Path(args.model) / GGUF_NAME).is_file():
                continue  # a directory without the file (the draft's) has no GGUF blocks
            row = {"threads": threads, "config": name}
            row |= measure(args.model, dtype, quantization, kernels, args.context)
            line = json.dumps(row)
            print(line, flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(line + "\n")


if __name__ == "__main__":
    main()
