"""Tokens committed per round by SD with each of several drafts of the default target, on the
bench's held-out prompts: the draft's acceptance, side by side, in one process.

    python docs/bench/draft/draft_acceptance.py DRAFT_DIR [DRAFT_DIR ...] [--k 4] [--prompts 12] \\
        [--max-tokens 64] [--temperatures 0,0.7] [--datasets humaneval,sharegpt] [--lookups 2] \\
        [--stop-below 0]

A draft written without its embedding (``train-draft --no-embeddings``, as the repository
ships one) is made whole from the target first. One request at a time; greedy requests are
checked against AR's tokens (any draft must leave them unchanged). ``--lookups`` runs each
draft with each ``draft_lookup`` setting (0: the draft alone, no copies from the context);
``--stop-below`` is SD's confidence stop (default 0: every chain drafts K, so that tokens per
round measure the proposals, not where they stopped).
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
from pathlib import Path

from saguaro import LLM, SamplingParams
from saguaro.bench.config import BenchConfig
from saguaro.bench.prompts import prepare_prompts
from saguaro.config import EngineConfig
from saguaro.models.catalog import resolve_model
from saguaro.models.draft_dir import assemble_draft, has_embedding
from saguaro.models.tokenizer import Tokenizer

MAX_PROMPT_TOKENS = 448  # the bench's prompts fit a context of 512 with 64 new tokens


def whole(draft: Path, target: Path, scratch: Path) -> Path:
    """``draft`` itself if it holds an input embedding, else a copy made whole from ``target``."""
    if has_embedding(draft):
        return draft
    return assemble_draft(draft, target, scratch / draft.name)


def run(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[list, float]:
    """Each prompt's tokens, and the mean of its tokens per round."""
    ids, lengths = [], []
    for p in prompts:
        out = llm.generate([p], params)[0]
        ids.append(out.token_ids)
        lengths.append(out.metrics.get("mean_accepted_length", 1.0))
    return ids, sum(lengths) / len(lengths)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("drafts", nargs="+", type=Path)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--prompts", type=int, default=12)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperatures", default="0,0.7")
    p.add_argument("--datasets", default="humaneval,sharegpt")
    p.add_argument("--lookups", default=str(EngineConfig.draft_lookup))
    p.add_argument("--stop-below", type=float, default=0.0)
    a = p.parse_args()
    target = resolve_model("smollm2-135m-instruct")
    cfg = BenchConfig(datasets=tuple(a.datasets.split(",")))
    sets = prepare_prompts(cfg, Tokenizer(target), MAX_PROMPT_TOKENS, a.prompts)
    temps = [float(t) for t in a.temperatures.split(",")]
    params = {t: SamplingParams(temperature=t, max_tokens=a.max_tokens, seed=0) for t in temps}
    with LLM(model=str(target), mode="ar") as ar:
        want = {ps.name: run(ar, ps.token_ids, params[0.0])[0] for ps in sets if 0.0 in params}
    with tempfile.TemporaryDirectory() as scratch:
        for draft, lookup in itertools.product(a.drafts, map(int, a.lookups.split(","))):
            path = whole(draft, target, Path(scratch))
            spec = dict(mode="sd", num_speculative_tokens=a.k, draft_lookup=lookup)
            spec["draft_stop_below"] = a.stop_below
            with LLM(model=str(target), draft=str(path), **spec) as sd:
                for ps, t in itertools.product(sets, temps):
                    ids, per_round = run(sd, ps.token_ids, params[t])
                    row = {"draft": str(draft), "lookup": lookup, "dataset": ps.name}
                    row |= {"temperature": t, "tokens_per_round": round(per_round, 3)}
                    if t == 0.0:
                        row["equal_to_ar"] = ids == want[ps.name]
                    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
