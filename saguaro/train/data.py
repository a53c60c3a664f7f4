"""Corpus preparation (split, tokenizer, token arrays) and deterministic batching."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from saguaro.corpus import EOT, read_documents, split_files
from saguaro.train.tokenizer import encode_plain, train_tokenizer


@dataclass(frozen=True)
class PrepareConfig:
    root: Path
    run_dir: Path
    vocab_size: int = 8192
    heldout_permille: int = 30


def token_stream(tok: Tokenizer, texts: list[str]) -> np.ndarray:
    """One array: each document preceded by the separator, as a prompt gets its BOS."""
    eot = tok.token_to_id(EOT)
    pieces = []
    for ids in encode_plain(tok, texts):
        pieces.append(np.array([eot, *ids], dtype=np.uint16))
    pieces.append(np.array([eot], dtype=np.uint16))
    return np.concatenate(pieces)


def prepare(cfg: PrepareConfig) -> dict[str, int]:
    """Writes tokenizer.json, train.bin, heldout.bin and split.json into the run dir."""
    assert cfg.vocab_size <= 2**16, "token arrays are uint16"
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    split = split_files(cfg.root, cfg.heldout_permille)
    train_texts = list(read_documents(split.train))
    heldout_texts = list(read_documents(split.heldout))
    tok = train_tokenizer(train_texts, cfg.vocab_size)
    tok.save(str(cfg.run_dir / "tokenizer.json"))
    stats = {"train_files": len(train_texts), "heldout_files": len(heldout_texts)}
    for name, texts in (("train", train_texts), ("heldout", heldout_texts)):
        arr = token_stream(tok, texts)
        arr.tofile(cfg.run_dir / f"{name}.bin")
        stats[f"{name}_tokens"] = int(arr.size)
    summary = {
        **stats,
        "root": str(cfg.root),
        "python": platform.python_version(),
        "heldout": [p.relative_to(cfg.root).as_posix() for p in split.heldout],
    }
    (cfg.run_dir / "split.json").write_text(json.dumps(summary, indent=1) + "\n")
    return stats


def load_tokens(path: Path) -> np.ndarray:
    return np.memmap(path, dtype=np.uint16, mode="r")


class WindowSampler:
    """Batch `step` is a pure function of (seed, step): resuming needs only the step counter.

    Each epoch takes non-overlapping windows at a fresh random offset, in a fresh random order.
    """

    def __init__(self, tokens: np.ndarray, ctx: int, batch: int, seed: int) -> None:
        self.tokens, self.ctx, self.batch, self.seed = tokens, ctx, batch, seed
        self.per_epoch = (tokens.size - 1 - ctx) // ctx
        assert self.per_epoch >= batch, "corpus too small for one batch"
        self._epoch = -1
        self._starts = np.empty(0, dtype=np.int64)

    def _epoch_starts(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            offset = int(rng.integers(self.ctx))
            self._starts = offset + rng.permutation(self.per_epoch) * self.ctx
            self._epoch = epoch
        return self._starts

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rows = []
        for j in range(step * self.batch, (step + 1) * self.batch):
            start = int(self._epoch_starts(j // self.per_epoch)[j % self.per_epoch])
            rows.append(self.tokens[start : start + self.ctx + 1].astype(np.int64))
        window = torch.from_numpy(np.stack(rows))
        return window[:, :-1], window[:, 1:]
