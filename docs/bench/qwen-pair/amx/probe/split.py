"""Milliseconds of one Q4_K and one Q6_K linear of the 1.5B's shapes on AMX's tiles, one thread,
medians of 9, built as is (base) and with parts of the work left out by the defines of
probes.patch (run.sh applies it in a scratch worktree): NO_TILES (no tile products), NO_FOLD
(no readout into floats), NO_MIN (Q4_K: no minima), NO_UNPACK (one weight tile unpacked, then
reused), TILES_ONLY (products alone), HOT (every tile load from one place: the first-level
cache). The results are wrong in every probe but base; only their times mean anything.
``split.py ROWS,.. VARIANT,..`` (a variant may join defines with +)."""

import sys

import numpy as np
import torch

from saguaro.kernels import build, ops
from saguaro.kernels.interleave import interleave
from saguaro.models.quant import from_gguf_raw
from saguaro.train.costs import median_ms
from tests.ggml_blocks import random_blocks

SHAPES = [("Q4_K", 8960, 1536), ("Q6_K", 1536, 8960)]  # gate/up and down projections
REPEATS = 9


def library(variant: str):
    defines = [f"-DPROBE_{d}" for d in variant.split("+") if d != "base"]
    return build.build((*build.default_flags(), "-DAMX_MIN_ROWS=1", *defines))


rows = [int(r) for r in sys.argv[1].split(",")]
libs = {v: library(v) for v in sys.argv[2].split(",")}
torch.set_num_threads(1)
print("| format | rows | " + " | ".join(libs) + " |")
print("|---|---:|" + "---:|" * len(libs))
for kind, n, k in SHAPES:
    w = interleave(from_gguf_raw(random_blocks(kind, n, k, np.random.default_rng(0)), kind, n, k))
    for m in rows:
        x = torch.randn(m, k)
        times = [
            median_ms(lambda x=x, w=w, lib=lib: ops.linear(x, w, lib), REPEATS)
            for lib in libs.values()
        ]
        cells = " | ".join(f"{t:.2f}" for t in times)
        print(f"| {kind} | {m} | {cells} |", flush=True)
