"""The forward costs that decide whether SSD can pay off on a machine (its cost regime).

Timed with saguaro's own model runner, one thread, medians: target T(1) and T_verify(K+1);
draft T(1), T_glue(K+1) and one branch depth over B = 8 branches (``BRANCHES``). Two conditions
follow: `K T_draft(1) >= 0.5 T_verify(K+1)` (``DRAFTING_SHARE``: drafting is a real cost, so
hiding it matters) and `T_glue(K+1) + K T_draft(B branches) <= T_verify(K+1)` (a cache of B
branches fits inside one verification).
"""

from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model

# Branches in the timed depth: the draft worker's starting cache budget (the result's keys,
# branch8 / build8_ms / cache8_fits, name it).
BRANCHES = 8
DRAFTING_SHARE = 0.5  # drafting is a real cost when K draft steps take this share of a verify
WARMUP = 3  # untimed calls before timing (allocator, caches)
REPEATS = 30  # timed calls per median
BLOCK_SIZE = 16  # KV block size of the timed runner
# Slots beyond the context the timed queries may write: K + 1 verification positions or
# BRANCHES branch tokens, with room to spare; and a few spare blocks on top.
SCRATCH_SLOTS = 64
SPARE_BLOCKS = 4


def median_ms(fn, repeats: int = REPEATS) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls, after ``WARMUP`` untimed ones."""
    for _ in range(WARMUP):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def time_forwards(runner: ModelRunner, totals: dict[str, float], key: str) -> None:
    """Wrap ``runner.run`` so that every forward adds its seconds to ``totals[key]`` (the
    overhead scripts split a step or a build into its forwards and the rest)."""
    run = runner.run

    def timed_run(inputs):
        start = time.perf_counter()
        out = run(inputs)
        totals[key] += time.perf_counter() - start
        return out

    runner.run = timed_run


class ForwardTimer:
    """One model's runner after ``context`` cached tokens, timing the forwards a speculative
    round is made of: 1 position (decode, a draft step), n positions (verification of K + 1,
    the draft's glue) and B single-token branches in one masked forward (a branch depth)."""

    def __init__(
        self,
        model_dir: str | Path,
        context: int,
        compile: bool = False,
        dtype: str = "float32",
        compile_options: dict | None = None,
        kernels: bool = False,
    ) -> None:
        # On saguaro's kernels the weights are the engine's default (a GGUF file's blocks where
        # the directory keeps one); on torch's operators, dense in dtype.
        quantization = "auto" if kernels else "none"
        model = load_model(str(model_dir), dtype, quantization=quantization, kernels=kernels)
        bs = BLOCK_SIZE
        blocks = -(-(context + SCRATCH_SLOTS) // bs) + SPARE_BLOCKS
        self.runner = ModelRunner(model, blocks, bs, "cpu", compile, compile_options)
        if compile:
            self.runner.warm_up()
        self.table = list(range(blocks))
        self.context = context
        vocab = model.config.vocab_size
        prompt = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(0))
        self.prompt = prompt.tolist()
        self.runner.forward([self.runner.sequence_query(self.table, 0, self.prompt, 1)])

    def positions_ms(self, n: int, repeats: int = REPEATS) -> float:
        """n positions after the context, logits at each (as verification asks)."""
        query = self.runner.sequence_query(self.table, self.context, self.prompt[:n], n)
        return median_ms(lambda: self.runner.forward([query]), repeats)

    def branches_ms(self, b: int, repeats: int = REPEATS) -> float:
        """b branches forked at the context's end, each seeing the context and itself."""
        query = self.runner.fork_query(self.table, self.context, self.prompt[:b])
        return median_ms(lambda: self.runner.forward([query]), repeats)


def forward_costs(model_dir: str | Path, k: int, context: int) -> dict[str, float]:
    """Milliseconds of one forward after ``context`` cached tokens: 1 position, K+1 positions,
    and ``BRANCHES`` single-token branches in one masked forward."""
    timer = ForwardTimer(model_dir, context)
    return {
        "t1": timer.positions_ms(1),
        "t_k1": timer.positions_ms(k + 1),
        "branch8": timer.branches_ms(BRANCHES),
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
    out["drafting_is_real"] = drafting >= DRAFTING_SHARE * t["t_k1"]
    out["cache8_fits"] = build <= t["t_k1"]
    out["machine"] = f"{platform.processor() or platform.machine()}, PyTorch {torch.__version__}"
    out["date"] = time.strftime("%Y-%m-%d")
    return out
