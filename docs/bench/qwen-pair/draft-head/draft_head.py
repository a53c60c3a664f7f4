"""What a reduced output head would give the Qwen2.5-Coder 0.5B draft: its step with a head over
the first N token ids only (a BPE vocabulary lists its merges roughly by frequency, so the first
ids are the common ones; the control tokens are kept), and how often the target's own greedy
tokens fall outside those N, which the draft could then never propose. The draft only proposes,
so any head keeps the output exact (docs/design.md §10); this measures speed against reach.

    python docs/bench/qwen-pair/draft-head/draft_head.py [--heads 16384,32768,65536] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch

from saguaro import LLM, SamplingParams
from saguaro.bench.datasets import humaneval_prompts
from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL, resolve_model
from saguaro.models.linear import KernelLinear
from saguaro.models.quant import permute_rows
from saguaro.train.costs import ForwardTimer

CONTEXT = 200
FIRST_CONTROL_ID = 151643  # Qwen2's control tokens (<|endoftext|>, <|im_start|>, ...) from here


def head_ids(n: int, vocab: int) -> torch.Tensor:
    return torch.cat([torch.arange(n), torch.arange(FIRST_CONTROL_ID, vocab)])


def reduce_head(timer: ForwardTimer, ids: torch.Tensor) -> None:
    """The timer's model scoring ``ids`` only (its head's rows picked, the rest -inf)."""
    model = timer.runner.model
    head = model.lm_head
    model.lm_head = KernelLinear(replace(permute_rows(head.weight, ids), n=len(ids)))
    model.head_token_ids = ids


def step_ms(timer: ForwardTimer, threads: int) -> float:
    torch.set_num_threads(threads)
    return timer.positions_ms(1)


def target_tokens(count: int, max_tokens: int) -> list[int]:
    """The target's greedy tokens for HumanEval's first ``count`` prompts."""
    with LLM(model=DEFAULT_MODEL, max_model_len=1024) as llm:
        prompts = [llm.tokenizer.encode(p.text) for p in humaneval_prompts()[:count]]
        outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens))
    return [t for o in outs for t in o.token_ids]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", default="16384,32768,65536")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", default=str(Path(__file__).parent))
    a = p.parse_args()
    tokens = torch.tensor(target_tokens(a.prompts, a.max_tokens))
    draft = resolve_model(DEFAULT_DRAFT)
    rows = []
    for n in [0, *map(int, a.heads.split(","))]:
        timer = ForwardTimer(draft, CONTEXT, kernels=True)
        vocab = timer.runner.model.config.vocab_size
        if n:
            reduce_head(timer, head_ids(n, vocab))
        reach = float((tokens < n).float().mean()) if n else 1.0
        rows.append({"head": n or vocab, "ms_1t": step_ms(timer, 1), "ms_2t": step_ms(timer, 2),
                     "target_tokens_in_head": reach})  # fmt: skip
        print(rows[-1], flush=True)
    out = Path(a.out)
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "target_tokens": len(tokens)}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["| head rows | draft step ms, 1 thread | 2 threads | target's tokens in the head |",
             "|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['head']:,} | {r['ms_1t']:.1f} | {r['ms_2t']:.1f} | "
                     f"{r['target_tokens_in_head']:.2%} |")  # fmt: skip
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
