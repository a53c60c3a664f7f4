"""Where the Qwen2.5-Coder 0.5B draft's step goes on saguaro's kernels: every packed weight's
product timed alone at 1 row (a draft step) and 8 rows (SSD's eight branches), summed by format,
and the whole forward after 200 cached tokens with the whole head and with the engine's default
cut head (``EngineConfig.draft_head_tokens``), one thread.

    python docs/bench/qwen-pair/draft-step/draft_step.py [--out DIR]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from pathlib import Path

import torch

from saguaro.config import DRAFT_HEAD_TOKENS
from saguaro.kernels import ops
from saguaro.models.catalog import DEFAULT_DRAFT, resolve_model
from saguaro.models.head import cut_draft_head
from saguaro.models.linear import KernelLinear
from saguaro.train.costs import ForwardTimer

CONTEXT = 200
ROWS = (1, 8)
REPEATS = 5  # the fastest of these is kept
BRANCHES = 8


def product_ms(w, rows: int) -> float:
    x = torch.randn(rows, w.k)
    ops.linear(x, w)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        ops.linear(x, w)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def by_format(model: torch.nn.Module) -> dict[str, dict[int, float]]:
    """ms of every packed weight's product, summed by format, at each row count."""
    out: dict[str, dict[int, float]] = defaultdict(lambda: dict.fromkeys(ROWS, 0.0))
    for module in model.modules():
        if isinstance(module, KernelLinear):
            for rows in ROWS:
                out[module.fmt][rows] += product_ms(module.weight, rows)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(Path(__file__).parent))
    a = p.parse_args()
    torch.set_num_threads(1)
    draft = Path(resolve_model(DEFAULT_DRAFT))
    timer = ForwardTimer(draft, CONTEXT, kernels=True)
    lines = ["| weights | 1 row ms | 8 rows ms |", "|---|---:|---:|"]
    heads = {}
    for label in ("whole head", f"head {DRAFT_HEAD_TOKENS}"):
        if label != "whole head":
            cut_draft_head(timer.runner.model, draft, DRAFT_HEAD_TOKENS)
        for fmt, ms in sorted(by_format(timer.runner.model).items()):
            lines.append(f"| {fmt} ({label}) | {ms[1]:.2f} | {ms[8]:.2f} |")
        heads[label] = (timer.positions_ms(1), timer.branches_ms(BRANCHES))
    lines += ["", "| draft forward | 1 position ms | 8 branches ms |", "|---|---:|---:|"]
    lines += [f"| {label} | {one:.1f} | {eight:.1f} |" for label, (one, eight) in heads.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    Path(a.out, "results.md").write_text(text)


if __name__ == "__main__":
    main()
