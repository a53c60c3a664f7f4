"""What a decoding strategy hands the target: proposals to verify, and how they were drawn."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from saguaro.engine.sequence import Sequence
from saguaro.sampling import SparseQ


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


class Proposer(Protocol):
    """Makes up to ``ks[i]`` proposals continuing ``seqs[i]``. It may write draft KV; it records
    in ``seq.num_draft_computed`` how many of the sequence's tokens (committed + proposed) now
    have draft KV, and the engine clamps that to what verification commits."""

    # True when the draft's KV pool is indexed by the engine's block tables (in-process draft):
    # prefix-cache blocks are then shared only once the draft's KV is written too.
    shares_block_table: bool

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal: ...

    def observe(self, seqs: list[Sequence], target_s: float) -> None:
        """Called after each round with its sequences (their last record) and verify time."""

    def release(self, seq: Sequence) -> None: ...

    def close(self, failed: bool = False) -> None: ...
