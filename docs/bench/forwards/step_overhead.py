"""The engine's time outside its forwards, per committed token, AR or SD, on the default pair.

    python docs/bench/forwards/step_overhead.py [--mode ar] [--threads 2] [--compile] [--runs 3]

Generates greedy tokens from one prompt and splits each run's time per committed token into the
target's forwards, the draft's forwards (SD) and the rest: scheduling, the step's metadata,
verification, detokenisation. The rest is what a step costs beyond its forwards; run it from two
checkouts in turn to compare them.
"""

from __future__ import annotations

import argparse
import json
import time

from saguaro import LLM, SamplingParams
from saguaro.train.costs import time_forwards

PROMPT = "def fibonacci(n):\n    "


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["ar", "sd"], default="ar")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--compile", action="store_true", help="compiled forwards")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    llm = LLM(mode=args.mode, compile=args.compile, num_threads=args.threads)
    totals = {"target": 0.0, "draft": 0.0}
    time_forwards(llm.engine.runner, totals, "target")
    draft = getattr(llm.engine.proposer, "runner", None)
    if draft is not None:
        time_forwards(draft, totals, "draft")
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    llm.generate([PROMPT], params)  # warm-up
    for _ in range(args.runs):
        totals.update(target=0.0, draft=0.0)
        start = time.perf_counter()
        out = llm.generate([PROMPT], params)
        seconds = time.perf_counter() - start
        n = len(out[0].token_ids)
        ms = {name: 1e3 * s / n for name, s in totals.items()}
        rest = 1e3 * seconds / n - ms["target"] - ms["draft"]
        row = {"tok_s": n / seconds, "target_ms": ms["target"], "draft_ms": ms["draft"]}
        print(json.dumps({**row, "outside_forwards_ms": rest}))


if __name__ == "__main__":
    main()
