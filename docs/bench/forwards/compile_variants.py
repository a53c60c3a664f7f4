"""Time one model's forwards under several ways of compiling them, interleaved in one process.

The ways a CPU forward could shed per-step overhead: inductor with symbolic shapes (what
``compile=True`` does), a static graph per shape (the bucketed design), weights frozen into the
graph (inductor's ``freezing``: oneDNN/MKL prepacked matrices), a C++ wrapper instead of Python
around the kernels (``cpp_wrapper``), and bfloat16 weights. Every variant runs the same queries
after ``--context`` cached tokens. Each variant runs in a process of its own (variants in one
process would share dynamo's graph cache for the model's forward, and with it guard checks and
the recompile limit); rounds alternate between variants so machine noise falls on all alike, and
each figure is the median over rounds of medians over forwards.

    python docs/bench/forwards/compile_variants.py [--model DIR] [--threads 1] [--variants a,b,..]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch

from saguaro.models.catalog import DEFAULT_DRAFT, resolve_model
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
    p.add_argument("--model", default=str(resolve_model(DEFAULT_DRAFT)))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--branches", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)
    a = p.parse_args()
    shapes = [("1 position", "positions", 1), (f"{a.k + 1} positions", "positions", a.k + 1)]
    shapes.append((f"{a.branches} branches", "branches", a.branches))
    if a.one:  # a child: one variant, one round
        torch.set_num_threads(a.threads)
        dtype, kw = VARIANTS[a.one]
        start = time.perf_counter()
        timer = ForwardTimer(a.model, a.context, kw is not None, dtype, kw)
        warm = time.perf_counter() - start
        ms = [getattr(timer, f"{how}_ms")(n) for _, how, n in shapes]
        print(json.dumps({"warm_up_s": warm, "ms": ms}))
        return 0
    samples: dict[str, list[list[float]]] = {}
    for r in range(a.rounds):
        for name in a.variants.split(","):
            argv = [sys.executable, __file__, "--one", name, "--model", a.model]
            argv += ["--threads", str(a.threads), "--context", str(a.context), "--k", str(a.k)]
            argv += ["--branches", str(a.branches)]
            out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
            result = json.loads(out.strip().splitlines()[-1])
            samples.setdefault(name, []).append(result["ms"])
            print(f"round {r + 1} {name}: warm-up {result['warm_up_s']:.0f} s", flush=True)
    print(f"\n{a.model}, {a.threads} thread(s), context {a.context}, ms (median of {a.rounds})")
    print("| variant | " + " | ".join(label for label, _, _ in shapes) + " |")
    print("|---|" + "---:|" * len(shapes))
    for name, rounds in samples.items():
        cells = [f"{statistics.median(col):.2f}" for col in zip(*rounds, strict=True)]
        print(f"| {name} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
