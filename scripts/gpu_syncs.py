"""Where a decoding step makes the host wait for the GPU: a few requests under torch's
synchronisation debug mode (:func:`saguaro.kernels.transfer.waits_recorded`), whose warnings
are counted by the line of saguaro that caused them, per engine step.

    python scripts/gpu_syncs.py --model DIR --draft DIR [--modes ar,sd,sd-coupled] \
        [--temperatures 0,0.7]

``sd-coupled`` is SD under coupled sampling (SSD's default at T > 0: its target side verifies
the same way).

Prints one JSON object per (mode, temperature): steps, synchronisations per step, and the lines
that synchronise most, with their counts.
"""

from __future__ import annotations

import argparse
import collections
import json

from saguaro import LLM, SamplingParams
from saguaro.kernels import transfer

PROMPTS = ["def fibonacci(n):", "The capital of France is", "import numpy as np\n", "class A:"]
TOP_LINES = 12


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--draft", required=True)
    p.add_argument("--modes", default="ar,sd,sd-coupled")
    p.add_argument("--temperatures", default="0,0.7")
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    for mode in args.modes.split(","):
        draft = None if mode == "ar" else args.draft
        engine, _, sampling = mode.partition("-")
        spec = dict(mode=engine, sampling=sampling or "auto")
        with LLM(model=args.model, draft=draft, device="cuda", **spec) as llm:
            for t in (float(x) for x in args.temperatures.split(",")):
                params = SamplingParams(temperature=t, max_tokens=args.max_tokens, seed=0)
                for _ in range(2):  # warm: captures, allocator pools, then prefix-cache hits
                    llm.generate(PROMPTS, params)
                steps = llm.engine.num_steps
                with transfer.waits_recorded() as caught:
                    llm.generate(PROMPTS, params)
                steps = llm.engine.num_steps - steps
                lines = collections.Counter(f"{w.filename}:{w.lineno}" for w in caught)
                print(
                    json.dumps(
                        dict(
                            mode=mode,
                            temperature=t,
                            steps=steps,
                            syncs_per_step=round(len(caught) / max(steps, 1), 2),
                            lines=lines.most_common(TOP_LINES),
                        )
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
