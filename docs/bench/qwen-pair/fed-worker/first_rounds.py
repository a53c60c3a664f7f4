"""SSD's first rounds of a request on the default pair: (proposals, hit, backup) of each of the
first six rounds for three HumanEval prompts, greedy, the target on its core and the draft
worker on the other. The first round is the prompt's prefill (nothing prepared yet); the
second hits where the worker read the prompt and built its cache within the first window.

    PYTHONPATH=. python docs/bench/qwen-pair/fed-worker/first_rounds.py
"""

from __future__ import annotations

from saguaro.api import LLM
from saguaro.bench.datasets import load_dataset
from saguaro.models.catalog import DEFAULT_DRAFT, DEFAULT_MODEL
from saguaro.sampling.params import SamplingParams

PROMPTS = 3
ROUNDS = 6
MAX_TOKENS = 24


def main() -> None:
    prompts = [p.text for p in load_dataset("humaneval")[:PROMPTS]]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    with LLM(model=DEFAULT_MODEL, draft=DEFAULT_DRAFT, mode="ssd", max_model_len=2048) as llm:
        for prompt in prompts:
            out = llm.generate([prompt], params)[0]
            print([(r.num_drafted, r.hit, r.backup) for r in out.records[:ROUNDS]])


if __name__ == "__main__":
    main()
