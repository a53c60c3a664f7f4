"""A draft's output head cut to the tokens it is likeliest to propose.

A draft's LM head scores every token of the vocabulary, and on a small draft with a large
vocabulary (the 0.5B Qwen2.5-Coder's 151,936 x 896) it is a fifth of the weights a step reads.
The draft only proposes: keeping the head's rows for the ``n`` tokens most frequent in text like
what it will write leaves verification exact (``CausalLM.forward`` states why: q = 0 off the
head) and only loses the proposals it would have made outside them.

The ranking: token frequencies over the code corpus (:mod:`saguaro.corpus`, the running
interpreter's standard library, code with its comments and docstrings in English), its first
``CORPUS_CHARS`` characters in file order, tokenized by the draft's own tokenizer; the
tokenizer's special tokens come first (an end of turn must stay proposable). Computed once per
tokenizer and cut size, then read from ``$SAGUARO_CACHE/heads``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import torch

from saguaro import corpus
from saguaro.kernels.ops import PackedWeight
from saguaro.models.gguf_weights import Packed
from saguaro.models.linear import KernelLinear
from saguaro.models.llama import CausalLM
from saguaro.models.quant import permute_rows
from saguaro.models.tokenizer import Tokenizer
from saguaro.paths import cache_dir, write_atomically

# Corpus text counted (file order): the ranking's top tens of thousands settle well within it.
CORPUS_CHARS = 8_000_000
RANKING_VERSION = 1  # bump when the rule above changes: cached rankings are keyed by it


def ranked_tokens(tokenizer: Tokenizer, n: int) -> list[int]:
    """The ``n`` token ids most frequent in the corpus (special tokens first, then by count,
    ties to the lower id), sorted ascending; cached by the tokenizer's fingerprint."""
    vocab = tokenizer.vocab_size
    if not 1 <= n <= vocab:
        raise ValueError(f"draft head tokens must be in 1..{vocab}, got {n}")
    path = cache_dir("heads") / f"{tokenizer.fingerprint()}-v{RANKING_VERSION}-{n}.json"
    try:
        ids = json.loads(path.read_text())
        if len(ids) == n and all(0 <= i < vocab for i in ids):
            return ids
    except (OSError, ValueError):
        pass  # absent or damaged: computed again
    ids = sorted(_ranking(tokenizer)[:n])
    write_atomically(path, json.dumps(ids))
    return ids


def _ranking(tokenizer: Tokenizer) -> list[int]:
    counts: Counter[int] = Counter()
    left = CORPUS_CHARS
    for text in corpus.read_documents(corpus.split_files(corpus.stdlib_root()).train):
        counts.update(tokenizer.encode(text[:left], add_special_tokens=False))
        left -= len(text)
        if left <= 0:
            break
    special = {i for i in (tokenizer.eos_token_id, tokenizer.bos_token_id) if i is not None}
    special |= set(tokenizer.special_token_ids())
    rest = sorted(range(tokenizer.vocab_size), key=lambda i: (-counts[i], i))
    return sorted(special) + [i for i in rest if i not in special]


def cut_head(model: CausalLM, ids: list[int]) -> None:
    """Keep ``model``'s LM head rows for ``ids`` only (a tied head gets rows of its own); the
    model's logits are then -inf for every other token."""
    if model.tp.size > 1:
        raise ValueError("a draft's cut head is not split over ranks")
    index = torch.tensor(ids, dtype=torch.long)
    head = model.lm_head
    if isinstance(head, KernelLinear):
        model.lm_head = KernelLinear(permute_rows(head.weight, index))
    else:
        model.lm_head = torch.nn.Linear(head.in_features, len(ids), bias=False)
        model.lm_head.weight.requires_grad_(False).copy_(head.weight.detach()[index])
    _keep_ids(model, index)


def _keep_ids(model: CausalLM, index: torch.Tensor) -> None:
    del model.head_token_ids  # None, an attribute: a buffer from here on
    model.register_buffer("head_token_ids", index)


def _cuts(model: CausalLM, n: int | None) -> bool:
    """Whether a head of ``n`` rows is a cut of ``model``'s (a draft trained with a reduced
    head keeps its own)."""
    return bool(n) and model.head_token_ids is None and n < model.config.vocab_size


def cut_draft_head(model: CausalLM, model_dir: Path, n: int | None) -> None:
    """The draft's head cut to its ``n`` likeliest tokens (None or 0: left whole; a draft
    trained with a reduced head keeps its own)."""
    if _cuts(model, n):
        cut_head(model, ranked_tokens(Tokenizer(model_dir), n))


def cut_packed_head(model: CausalLM, weights: Packed, model_dir: Path, n: int | None) -> None:
    """:func:`cut_draft_head` on a file's blocks (``weights["lm_head"]``) before the kernels
    take them, which would otherwise interleave the whole head (four rows a strip) only for the
    cut to read it back as the file's rows. The model's head becomes a placeholder of the cut's
    shape, which the kernels replace."""
    head = weights.get("lm_head")
    if not isinstance(head, PackedWeight) or model.tp.size > 1 or not _cuts(model, n):
        return
    index = torch.tensor(ranked_tokens(Tokenizer(model_dir), n), dtype=torch.long)
    weights["lm_head"] = permute_rows(head, index)
    hidden = model.lm_head.in_features
    model.lm_head = torch.nn.Linear(hidden, len(index), bias=False, device="meta")
    _keep_ids(model, index)
