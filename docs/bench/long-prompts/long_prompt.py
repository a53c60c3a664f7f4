"""Decode after a long prompt on the default pair: held-out ShareGPT turns joined and cut to
``--prompt-tokens``, sent once to fill the prefix cache, then again for ``--max-tokens`` greedy
tokens at batch 1. Prints one JSON line: time, tok/s, rounds, tokens a round, and for SSD the
cache hit rate and the target's waits for its worker (the first rounds', and in all).

    python docs/bench/long-prompts/long_prompt.py --mode ssd --prompt-tokens 3000

Run it from the checkout whose worker is meant: ``python -m`` starts SSD's worker, and that puts
the working directory's saguaro ahead of ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import time

from saguaro import LLM, SamplingParams
from saguaro.bench.datasets import sharegpt_conversations, sharegpt_heldout

FIRST_ROUNDS = 6  # waits listed one by one: where a draft prefill would stall the target


def long_prompt(llm: LLM, tokens: int) -> str:
    """Held-out conversations' turns, joined until ``tokens`` tokens, cut there, and a request."""
    texts: list[str] = []
    ids: list[int] = []
    for conv in sharegpt_conversations():
        if sharegpt_heldout(conv["id"]):
            texts += [t["value"] for t in conv["conversations"]]
            ids = llm.tokenizer.encode("\n\n".join(texts))
            if len(ids) >= tokens:
                break
    return llm.tokenizer.decode(ids[:tokens]) + "\n\nSummarise the conversation above."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", default="ssd")
    ap.add_argument("--prompt-tokens", type=int, default=3000)
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    llm = LLM(mode=args.mode, max_model_len=8192)
    prompt = long_prompt(llm, args.prompt_tokens)
    # the same prompt once before: the measured request decodes from the prefix cache
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    out = llm.generate([prompt], params)[0]
    seconds = time.perf_counter() - start
    run, waits = llm.last_run, [r.wait_s for r in out.records]
    print(json.dumps({
        "mode": args.mode,
        "prompt_tokens": args.prompt_tokens,
        "cached_prompt_tokens": out.metrics["cached_prompt_tokens"],
        "s": round(seconds, 3),
        "tok_s": round(args.max_tokens / seconds, 1),
        "rounds": run["rounds"],
        "tokens_a_round": round(run["mean_accepted_length"], 2),
        "hit_rate": run.get("cache_hit_rate"),
        "first_waits_ms": [round(w * 1e3) for w in waits[:FIRST_ROUNDS]],
        "wait_s": round(sum(waits), 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
