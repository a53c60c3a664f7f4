"""The strategy interface: what a proposer hands the target, and what the engine asks of it.

The engine never knows which strategy runs (none for AR, the in-process draft for SD, the draft
worker for SSD): it calls a :class:`Proposer` built by a :data:`ProposerFactory` it is given.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from saguaro.core.sequence import Sequence
from saguaro.sampling import SparseQ

if TYPE_CHECKING:
    from saguaro.config import EngineConfig


@dataclass
class Proposal:
    """Proposals for n sequences, padded to K columns.

    ``q`` holds, per proposal, exactly the distribution it was sampled from (the verifier must see
    the same q bit for bit); deterministic proposals are point masses. None: every proposal is
    a point mass (greedy draft, n-gram lookup).
    """

    tokens: torch.Tensor  # [n, K] int64
    num_draft: torch.Tensor  # [n] int64
    q: SparseQ | None = None  # [n, K, M]
    hit: list[bool | None] | None = None  # SSD: per row, outcome found in the speculation cache
    backup: list[str | None] | None = None  # SSD: per row, backup used on a miss
    wait_s: float = 0.0  # SSD: time the target waited for these proposals


class Proposer(ABC):
    """Makes up to ``ks[i]`` proposals continuing ``seqs[i]``; keeps whatever draft state it
    needs keyed by ``seq_id``. A proposer that can no longer propose raises
    :class:`saguaro.errors.DraftWorkerError`; the engine then decodes exactly without it."""

    @abstractmethod
    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal: ...

    def draft_ready(self, seq: Sequence) -> int | None:
        """Tokens of ``seq`` whose draft KV sits in the sequence's own blocks, or None when the
        draft keeps its KV elsewhere. A shared prefix-cache block must hold both models' KV, so
        the engine registers no block past this many tokens."""
        return None

    def observe(self, seqs: list[Sequence], target_s: float) -> None:
        """Called after each round with its sequences (their last record) and verify time."""
        return None  # default: nothing to do

    def preempted(self, seq: Sequence) -> None:
        """``seq`` lost its KV blocks; it is recomputed from its prefix-cache hit on readmission."""
        return None  # default: nothing to do

    def release(self, seq: Sequence) -> None:
        """``seq`` finished or was aborted: forget it."""
        return None  # default: nothing to do

    def stats(self, batch: int) -> dict[str, Any]:
        """Strategy-specific figures for a batch of ``batch`` sequences (empty: none)."""
        return {}

    def close(self, failed: bool = False) -> None:
        """Free what the proposer holds; after a failure, do not wait for it to cooperate."""
        return None  # default: nothing to do


@dataclass(frozen=True)
class DraftSetup:
    """What the engine knows, after loading the target, that a proposer needs to start."""

    draft_dir: Path
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int  # the target's pool: an in-process draft indexes the same block tables


ProposerFactory = Callable[["EngineConfig", DraftSetup], Proposer]
