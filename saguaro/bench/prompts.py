"""The prompts of one run: each dataset's prompts drawn from the seed, tokenized, and cut from the
left to fit the context."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saguaro.bench.config import BenchConfig
from saguaro.bench.datasets import Prompt, file_prompts, load_dataset, select


@dataclass
class PromptSet:
    name: str
    prompts: list[Prompt]
    token_ids: list[list[int]]
    truncated: int  # prompts cut (from the left) to fit the context


def prepare_prompts(
    cfg: BenchConfig, tokenizer: Any, max_prompt_tokens: int, count: int
) -> list[PromptSet]:
    """``count`` prompts per dataset (and from ``cfg.prompts``), each at most
    ``max_prompt_tokens`` tokens: a longer one keeps its last tokens (and its BOS, if any). A
    chat prompt (ShareGPT's) goes in the model's chat template where it has one."""
    sources = [(name, load_dataset(name)) for name in cfg.datasets]
    if cfg.prompts:
        sources.append((Path(cfg.prompts).stem, file_prompts(cfg.prompts)))
    sets = []
    for name, prompts in sources:
        chosen = select(prompts, count, cfg.seed, name)
        ids, truncated = [], 0
        for p in chosen:
            if p.chat and tokenizer.has_chat_template:
                t = tokenizer.encode_chat([{"role": "user", "content": p.text}])
            else:
                t = tokenizer.encode(p.text)
            if len(t) > max_prompt_tokens:
                truncated += 1
                bos = tokenizer.bos_token_id
                keep = t[len(t) - max_prompt_tokens :]
                t = [bos, *keep[1:]] if bos is not None and t[0] == bos else keep
            ids.append(t)
        sets.append(PromptSet(name, chosen, ids, truncated))
    return sets


def summary(sets: list[PromptSet]) -> dict[str, dict[str, Any]]:
    """Per prompt set, for the report: the prompt ids and the token counts."""
    return {
        ps.name: {
            "ids": [p.id for p in ps.prompts],
            "tokens_mean": sum(map(len, ps.token_ids)) / len(ps.token_ids),
            "tokens_max": max(map(len, ps.token_ids)),
            "truncated": ps.truncated,
        }
        for ps in sets
    }
