"""One verification round as a type of its own, and the one entry point that verifies it.

A round of n sequences: sequence i proposed ``num_draft[i]`` tokens ``s_1..s_k`` (k at most
the round's K), the target scored its positions in the logits rows ``rows[i, 0..k]`` (row j
decides the token after ``s_1..s_j``), and the sequence's noise is keyed by its seed and the
absolute ``positions[i]`` of ``s_1``. :func:`verifier` names the exact method that turns such a
round into accepted prefixes and next tokens (docs/sampling.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from saguaro.sampling.coupled import verify_coupled
from saguaro.sampling.probs import SamplingTensors
from saguaro.sampling.sparse import SparseQ
from saguaro.sampling.verify import VerifyResult, verify


@dataclass
class Round:
    """What a verifier needs of one round (shapes as :func:`saguaro.sampling.verify.verify`)."""

    st: SamplingTensors  # the n sequences' transforms
    draft_tokens: torch.Tensor  # [n, K] int64; entries at or after num_draft[i] are padding
    num_draft: torch.Tensor  # [n] int64 in 0..K
    seeds: torch.Tensor  # [n] int64 noise keys
    positions: torch.Tensor  # [n] int64, the absolute position of s_1
    rows: torch.Tensor  # [n, K+1] int64 logits row of each scored position
    draft_q: SparseQ | None = None  # [n, K, M] what each s_j was drawn from; None: point masses

    def __len__(self) -> int:
        return len(self.num_draft)

    def select(self, idx: list[int]) -> Round:
        """The rounds ``idx`` of this one (the logits rows they index stay shared)."""
        pick = torch.tensor(idx)

        def take(t: torch.Tensor) -> torch.Tensor:
            return t[pick.to(t.device)]

        q_device = None if self.draft_q is None else self.draft_q.ids.device

        return Round(
            st=self.st.index(pick),
            draft_tokens=take(self.draft_tokens),
            num_draft=take(self.num_draft),
            seeds=take(self.seeds),
            positions=take(self.positions),
            rows=take(self.rows),
            draft_q=None if self.draft_q is None else self.draft_q[pick.to(q_device)],
        )


Verifier = Callable[[torch.Tensor, Round], VerifyResult]


def _rejection(logits: torch.Tensor, r: Round) -> VerifyResult:
    return verify(
        logits, r.st, r.draft_tokens, r.num_draft, r.seeds, r.positions, r.draft_q, r.rows
    )


def _coupled(logits: torch.Tensor, r: Round) -> VerifyResult:
    # Coupled verification needs no q: the target's token at each position is fixed by the noise.
    return verify_coupled(logits, r.st, r.draft_tokens, r.num_draft, r.seeds, r.positions, r.rows)


VERIFIERS: dict[str, Verifier] = {"rejection": _rejection, "coupled": _coupled}


def verifier(method: str) -> Verifier:
    """The verification of ``method`` ("rejection" or "coupled"): ``(logits, round) -> result``."""
    try:
        return VERIFIERS[method]
    except KeyError:
        known = sorted(VERIFIERS)
        raise ValueError(f"unknown sampling method {method!r}; one of {known}") from None
