"""Milliseconds of one Q4_K and one Q6_K linear of the 1.5B's shapes (random blocks, interleaved
as loaded), on the vector paths and on AMX's tiles, at each row count, one thread (medians of 7):
``PYTHONPATH=. python docs/bench/qwen-pair/amx/linear.py [THREADS]``. Both builds are this
machine's flags, one with every call on the vector paths, one with every call on the tiles."""

import sys
import time

import numpy as np
import torch

from saguaro.kernels import build, ops
from saguaro.kernels.interleave import interleave
from saguaro.models.quant import from_gguf_raw
from tests.ggml_blocks import random_blocks

SHAPES = [("Q4_K", 8960, 1536), ("Q6_K", 1536, 8960)]  # gate/up and down projections
ROWS = (5, 8, 16, 24, 32, 64, 256)
REPEATS = 7


def median_ms(x: torch.Tensor, w, lib) -> float:
    ops.linear(x, w, lib)
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        ops.linear(x, w, lib)
        times.append(time.perf_counter() - start)
    return 1000 * sorted(times)[REPEATS // 2]


torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
vector = build.build((*build.default_flags(), "-DAMX_MIN_ROWS=1000000"))
tiles = build.build((*build.default_flags(), "-DAMX_MIN_ROWS=1"))
print("| format | n x k | rows | vector ms | AMX ms | vector / AMX |")
print("|---|---|---:|---:|---:|---:|")
for kind, n, k in SHAPES:
    blocks = random_blocks(kind, n, k, np.random.default_rng(0))
    w = interleave(from_gguf_raw(blocks, kind, n, k))
    for m in ROWS:
        x = torch.randn(m, k)
        a, b = median_ms(x, w, vector), median_ms(x, w, tiles)
        print(f"| {kind} | {n} x {k} | {m} | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
