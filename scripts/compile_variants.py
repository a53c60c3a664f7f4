"""Time one model's forwards under several ways of compiling them, interleaved in one process.

The ways a CPU forward could shed per-step overhead: inductor with symbolic shapes (what
``compile=True`` does), a static graph per shape (the bucketed design), weights frozen into the
graph (inductor's ``freezing``: oneDNN/MKL prepacked matrices), a C++ wrapper instead of Python
around the kernels (``cpp_wrapper``), and bfloat16 weights. Every variant runs the same queries
after ``--context`` cached tokens; rounds alternate between variants so machine noise falls on
all alike, and each figure is the median over rounds of medians over forwards.

    python scripts/compile_variants.py [--model DIR] [--threads 1] [--variants a,b,..]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from saguaro import bundled
from saguaro.train.costs import ForwardTimer

# name -> (dtype, torch.compile keyword arguments or None for eager)
VARIANTS: dict[str, tuple[str, dict | None]] = {
    "eager": ("float32", None),
    "dynamic": ("float32", {"dynamic": True}),
    "static": ("float32", {"dynamic": False}),
    "static+freezing": ("float32", {"dynamic": False, "options": {"freezing": True}}),
    "dynamic+cpp_wrapper": ("float32", {"dynamic": True, "options": {"cpp_wrapper": True}}),
    "bf16 eager": ("bfloat16", None),
    "bf16 dynamic": ("bfloat16", {"dynamic": True}),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(bundled.DRAFT_DIR))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--branches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--variants", default=",".join(VARIANTS))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    timers: dict[str, ForwardTimer] = {}
    for name in a.variants.split(","):
        dtype, kw = VARIANTS[name]
        start = time.perf_counter()
        timers[name] = ForwardTimer(
            a.model, a.context, compile=kw is not None, dtype=dtype, compile_options=kw
        )
        print(f"{name}: loaded and warmed up in {time.perf_counter() - start:.0f} s", flush=True)
    shapes = {
        "1 position": lambda t: t.positions_ms(1),
        f"{a.k + 1} positions": lambda t: t.positions_ms(a.k + 1),
        f"{a.branches} branches": lambda t: t.branches_ms(a.branches),
    }
    samples: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.rounds):
        for name, timer in timers.items():
            for shape, fn in shapes.items():
                samples.setdefault((name, shape), []).append(fn(timer))
    print(f"\n{a.model}, {a.threads} thread(s), context {a.context}, ms (median of {a.rounds})")
    print("| variant | " + " | ".join(shapes) + " |")
    print("|---|" + "---:|" * len(shapes))
    for name in timers:
        cells = [f"{statistics.median(samples[(name, s)]):.2f}" for s in shapes]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
