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
    mode: str = "sd"  # the strategy that proposed: sd, ssd or lookup (ar: nothing proposed)

    @classmethod
    def none(cls, n: int, width: int) -> Proposal:
        """No proposals for n sequences: their rounds are AR rounds."""
        return cls(
            torch.zeros(n, width, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), mode="ar"
        )


@dataclass(frozen=True)
class DraftHealth:
    """Whether a proposer can propose: ``running``, ``restarting`` (a failed draft worker will be
    started again) or ``failed`` (for good); its restarts and the last failure."""

    state: str = "running"
    restarts: int = 0
    failure: str | None = None


class Proposer(ABC):
    """Makes up to ``ks[i]`` proposals continuing ``seqs[i]``; keeps whatever draft state it
    needs keyed by ``seq_id``. A proposer that can no longer propose raises
    :class:`saguaro.errors.DraftWorkerError`; the engine then decodes exactly without it."""

    @abstractmethod
    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal: ...

    def draft_ready(self, seq: Sequence) -> int | None:
        """Tokens of ``seq`` whose draft KV sits in the sequence's own blocks, or None when the
        draft keeps its KV elsewhere. The engine marks the cached blocks within this many tokens
        as holding the draft's KV, so that a sequence admitted onto them knows how far its
        draft may start."""
        return None

    def observe(self, seqs: list[Sequence], target_s: float, positions: int) -> None:
        """Called after each round with its sequences (their last record), the seconds of the
        target's forward and the positions it computed (more than the rounds scored when prompt
        chunks shared it)."""
        return None  # default: nothing to do

    def preempted(self, seq: Sequence) -> None:
        """``seq`` lost its KV blocks; it is recomputed from its prefix-cache hit on readmission."""
        return None  # default: nothing to do

    def release(self, seq: Sequence) -> None:
        """``seq`` finished or was aborted: forget it."""
        return None  # default: nothing to do

    def pause(self) -> None:
        """Rounds are run without this proposer until it is next asked to propose."""
        return None  # default: nothing to do

    def stats(self, batch: int) -> dict[str, Any]:
        """Strategy-specific figures for a batch of ``batch`` sequences (empty: none)."""
        return {}

    def health(self) -> DraftHealth:
        """Whether the proposer is proposing (default: always)."""
        return DraftHealth()

    def calibrate(self, probe: TargetProbe) -> None:
        """Called once before serving with a probe that times the target's forwards."""
        return None  # default: nothing to measure

    def close(self, failed: bool = False) -> None:
        """Free what the proposer holds; after a failure, do not wait for it to cooperate."""
        return None  # default: nothing to do


@dataclass(frozen=True)
class DraftSetup:
    """What the engine knows, after loading the target, that a proposer needs to start."""

    draft_dir: Path | None  # None: the proposer runs no model (draft="lookup")
    max_model_len: int
    vocab_size: int
    num_kv_blocks: int  # the target's pool: an in-process draft indexes the same block tables


ProposerFactory = Callable[["EngineConfig", DraftSetup], Proposer]
TargetProbe = Callable[[int, int], float]
"""(sequences, positions each) -> seconds of one target forward of that shape, after a context
of typical length (writes KV only where no sequence lives: used before serving)."""
