"""The forward costs that decide whether SSD can pay off on a machine (issue 3's cost regime).

Measured with saguaro's own model runner, one thread, medians: target T(1) and T_verify(K+1);
draft T(1), T_glue(K+1) and one branch depth over 8 branches. Two conditions follow:
`K T_draft(1) >= 0.5 T_verify(K+1)` (drafting is a real cost, so hiding it matters) and
`T_glue(K+1) + K T_draft(8 branches) <= T_verify(K+1)` (a cache of 8 branches fits inside one
verification).
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from saguaro.core.query import Query, token_slots
from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model


def median_ms(fn, repeats: int = 30) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def forward_costs(model_dir: str | Path, k: int, context: int) -> dict[str, float]:
    """Milliseconds of one forward after ``context`` cached tokens: 1 position, K+1 positions,
    and 8 single-token branches in one masked forward."""
    model = load_model(str(model_dir))
    bs = 16
    blocks = -(-(context + 64) // bs) + 4
    runner = ModelRunner(model, blocks, bs, "cpu")
    table = list(range(blocks))
    vocab = model.config.vocab_size
    prompt = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(0))
    prompt = prompt.tolist()
    runner.forward([runner.sequence_query(table, 0, prompt, 1)])  # fill the KV cache

    def step(n: int):
        return lambda: runner.forward([runner.sequence_query(table, context, prompt[:n], 1)])

    keys = token_slots(table, 0, context + 8, bs)
    mask = torch.zeros(8, context + 8, dtype=torch.bool)
    mask[:, :context] = True
    mask[torch.arange(8), context + torch.arange(8)] = True
    branches = Query(prompt[:8], torch.full((8,), context), keys[context:], keys, 8, mask)
    return {
        "t1": median_ms(step(1)),
        "t_k1": median_ms(step(k + 1)),
        "branch8": median_ms(lambda: runner.forward([branches])),
    }


def cost_regime(target_dir: str | Path, draft_dir: str | Path, k: int = 4, context: int = 200):
    """Both models' costs (one thread) and the two conditions."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t = forward_costs(target_dir, k, context)
        d = forward_costs(draft_dir, k, context)
    finally:
        torch.set_num_threads(threads)
    drafting = k * d["t1"]
    build = d["t_k1"] + k * d["branch8"]
    out: dict[str, Any] = {"k": k, "context": context, "target": t, "draft": d}
    out["drafting_ms"], out["build8_ms"] = drafting, build
    out["drafting_is_real"] = drafting >= 0.5 * t["t_k1"]
    out["cache8_fits"] = build <= t["t_k1"]
    out["machine"] = f"{platform.processor() or platform.machine()}, PyTorch {torch.__version__}"
    out["date"] = time.strftime("%Y-%m-%d")
    return out
