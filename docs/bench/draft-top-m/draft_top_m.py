"""What the draft's top-M truncation costs in acceptance: SD at temperature > 0 per M.

    python docs/bench/draft-top-m/draft_top_m.py [--model DIR --draft DIR] [--m 1,4,16,64,256,0] \
        [--temperatures 0.7,1.0] [--k 4] [--prompts 16] [--tokens 96]

M = 0 stands for the whole vocabulary. Every M runs the same seeded requests (HumanEval
prompts), so the rows differ only by the draft's support. Prints a markdown table: mean
accepted length, acceptance rate, bytes per proposal on the SSD wire (an int64 id and a float32
probability per pair) and output tok/s.
"""

from __future__ import annotations

import argparse

from saguaro import LLM, SamplingParams
from saguaro.bench.datasets import load_dataset, select

PAIR_BYTES = 8 + 4  # int64 id + float32 probability


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model")
    p.add_argument("--draft")
    p.add_argument("--m", default="1,4,16,64,256,0")
    p.add_argument("--temperatures", default="0.7,1.0")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--tokens", type=int, default=96)
    args = p.parse_args()
    prompts = [q.text for q in select(load_dataset("humaneval"), args.prompts, 0, "humaneval")]
    print("| T | M | mean accepted length | acceptance | bytes / proposal | tok/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for m in (int(x) for x in args.m.split(",")):
            llm = LLM(
                model=args.model,
                draft=args.draft,
                mode="sd",
                num_speculative_tokens=args.k,
                draft_top_m=m or 2**31,
                max_num_seqs=len(prompts),
            )
            vocab = llm.engine.model_config.vocab_size
            params = [
                SamplingParams(
                    temperature=temperature, seed=i, max_tokens=args.tokens, ignore_eos=True
                )
                for i in range(len(prompts))
            ]
            llm.generate(prompts, params)
            run = llm.last_run
            width = min(m or vocab, vocab)
            print(
                f"| {temperature:g} | {m or f'V = {vocab}'} | {run['mean_accepted_length']:.2f} "
                f"| {run['acceptance_rate']:.1%} | {width * PAIR_BYTES:,} "
                f"| {run['tokens_per_s']:.0f} |"
            )
            llm.close()


if __name__ == "__main__":
    main()
