"""Time the linear kernel at 1..8 rows on SmolLM2-135M's product shapes: a decode step's row, a
verification's K + 1 rows, SSD's branch widths.

    python docs/bench/kernels/linear_rows.py [--threads 1] [--calls 30]

Random weights in the default model's formats (Q4 groups of 32 for the layers, Q8 per channel
standing in for the Q8_0 head; a product's cost depends on its shape and format, not its
values). Prints the median microseconds per call of each product and their sum, and the sum
over the one-row sum.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from saguaro.kernels import ops
from saguaro.models.quant import quantize

# (rows n, input width k, scheme) of SmolLM2-135M: fused QKV, fused gate/up, down, the head
SHAPES = {
    "qkv": (576 + 2 * 192, 576, "int4"),
    "gate_up": (2 * 1536, 576, "int4"),
    "down": (576, 1536, "int4"),
    "head": (49152, 576, "int8"),
}
MAX_ROWS = 8


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--calls", type=int, default=30)
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    weights = {name: quantize(torch.randn(n, k), s) for name, (n, k, s) in SHAPES.items()}
    one_row = None
    for m in range(1, MAX_ROWS + 1):
        us = {}
        for name, w in weights.items():
            x = torch.randn(m, w.k)
            times = []
            for _ in range(args.calls):
                start = time.perf_counter()
                ops.linear(x, w)
                times.append(time.perf_counter() - start)
            us[name] = 1e6 * statistics.median(times)
        total = sum(us.values())
        one_row = one_row or total
        cells = " ".join(f"{name} {v:8.1f}" for name, v in us.items())
        print(f"rows {m}: {cells}   sum {total:8.1f} us   x{total / one_row:.2f}")


if __name__ == "__main__":
    main()
