"""What a cut output head gives the Qwen2.5-Coder 0.5B draft: its step with a head of N rows,
and how often the target's own greedy tokens fall outside those N (the draft could then never
propose them), for two choices of the N: the engine's (``--draft-head-tokens``,
:func:`saguaro.models.head.ranked_tokens`: special tokens, then by frequency in the code corpus)
and the first N ids (a BPE vocabulary lists its merges roughly by frequency). The draft only
proposes, so any head keeps the output exact (docs/design.md §10); this measures speed against
reach, on HumanEval prompts as raw completions and as chat requests.

    python docs/bench/qwen-pair/draft-head/draft_head.py [--heads 32768,65536] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from saguaro import LLM, SamplingParams
from saguaro.bench.datasets import humaneval_prompts
from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL, resolve_model
from saguaro.models.head import cut_head, ranked_tokens
from saguaro.models.tokenizer import Tokenizer
from saguaro.train.costs import ForwardTimer

CONTEXT = 200


def first_ids(n: int, tokenizer: Tokenizer) -> list[int]:
    """The first n ids and the special tokens."""
    return sorted(set(range(n)) | set(tokenizer.special_token_ids()))


def step_ms(timer: ForwardTimer, threads: int) -> float:
    torch.set_num_threads(threads)
    return timer.positions_ms(1)


def target_tokens(count: int, max_tokens: int) -> dict[str, list[int]]:
    """The target's greedy tokens for HumanEval's first ``count`` prompts, as completions of
    the prompt's code and as chat requests for it."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    with LLM(model=DEFAULT_MODEL, max_model_len=1024) as llm:
        tok = llm.tokenizer
        texts = [p.text for p in humaneval_prompts()[:count]]
        asks = [tok.encode_chat([{"role": "user", "content": f"Complete:\n{t}"}]) for t in texts]
        kinds = {"code": [tok.encode(t) for t in texts], "chat": asks}
        outs = {k: llm.generate(v, params) for k, v in kinds.items()}
    return {k: [t for o in v for t in o.token_ids] for k, v in outs.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heads", default="32768,65536")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", default=str(Path(__file__).parent))
    a = p.parse_args()
    tokens = target_tokens(a.prompts, a.max_tokens)
    draft = resolve_model(DEFAULT_DRAFT)
    tokenizer = Tokenizer(draft)
    rows = []
    for n in [0, *map(int, a.heads.split(","))]:
        for rule in ("corpus", "first ids") if n else ("whole",):
            timer = ForwardTimer(draft, CONTEXT, kernels=True)
            ids = list(range(tokenizer.vocab_size))
            if n:
                ids = ranked_tokens(tokenizer, n) if rule == "corpus" else first_ids(n, tokenizer)
                cut_head(timer.runner.model, ids)
            kept = set(ids)
            reach = {k: sum(t in kept for t in v) / len(v) for k, v in tokens.items()}
            rows.append({"head": len(ids), "rule": rule, "ms_1t": step_ms(timer, 1),
                         "ms_2t": step_ms(timer, 2), "reach": reach})  # fmt: skip
            print(rows[-1], flush=True)
    write(Path(a.out), rows, {k: len(v) for k, v in tokens.items()})


def write(out: Path, rows: list[dict], counts: dict[str, int]) -> None:
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "target_tokens": counts}
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    lines = ["| head rows | chosen by | draft step ms, 1 thread | 2 threads | target's code "
             "tokens in the head | chat tokens |", "|---:|---|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['head']:,} | {r['rule']} | {r['ms_1t']:.1f} | {r['ms_2t']:.1f} | "
                     f"{r['reach']['code']:.2%} | {r['reach']['chat']:.2%} |")  # fmt: skip
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
