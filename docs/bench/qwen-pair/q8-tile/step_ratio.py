"""The draft's step against the target's on the default pair: a one-position forward after 200
cached tokens of each, the draft with the engine's cut head (``draft_head_tokens``), one thread
on the first core, the two alternating for five rounds (medians of 15 forwards each); the
median of the rounds' ratios is what #58 asks to be at most 0.35.

    PYTHONPATH=. python docs/bench/qwen-pair/q8-tile/step_ratio.py
"""

from __future__ import annotations

import os
import statistics

import torch

from saguaro.config import DRAFT_HEAD_TOKENS
from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL, resolve_model
from saguaro.models.head import cut_draft_head
from saguaro.train.costs import ForwardTimer

CONTEXT = 200
ROUNDS = 5
REPEATS = 15


def main() -> None:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:1])
    torch.set_num_threads(1)
    target = ForwardTimer(str(resolve_model(DEFAULT_MODEL)), CONTEXT, kernels=True)
    draft = ForwardTimer(str(resolve_model(DEFAULT_DRAFT)), CONTEXT, kernels=True)
    cut_draft_head(draft.runner.model, resolve_model(DEFAULT_DRAFT), DRAFT_HEAD_TOKENS)
    ratios = []
    for _ in range(ROUNDS):
        t, d = target.positions_ms(1, REPEATS), draft.positions_ms(1, REPEATS)
        ratios.append(d / t)
        print(f"target {t:.1f} ms, draft {d:.1f} ms: {d / t:.3f}", flush=True)
    print(f"median draft / target: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
