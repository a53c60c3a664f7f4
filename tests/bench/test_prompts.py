"""Preparing a run's prompts: drawn per dataset, tokenized, cut from the left to fit."""

from __future__ import annotations

from saguaro.bench import datasets
from saguaro.bench.config import BenchConfig
from saguaro.bench.prompts import prepare_prompts, summary


class CharTokenizer:
    """One token per character, after a BOS of id 0."""

    bos_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id, *(ord(c) for c in text)]


def test_long_prompts_keep_their_end_and_bos(prompt_file):
    cfg = BenchConfig(prompts=str(prompt_file), datasets=(), seed=0)
    (ps,) = prepare_prompts(cfg, CharTokenizer(), max_prompt_tokens=8, count=2)
    chosen = datasets.select(datasets.file_prompts(prompt_file), 2, seed=0, name="prompts")
    assert ps.name == "prompts" and ps.prompts == chosen
    for p, ids in zip(ps.prompts, ps.token_ids, strict=True):
        full = CharTokenizer().encode(p.text)
        assert len(ids) == min(len(full), 8) and ids[0] == 0
        assert ids[1:] == full[len(full) - len(ids) + 1 :]  # the prompt's last tokens
    assert ps.truncated == sum(len(p.text) + 1 > 8 for p in ps.prompts)
    info = summary([ps])["prompts"]
    assert info["ids"] == [p.id for p in chosen] and info["tokens_max"] == 8
