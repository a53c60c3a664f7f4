"""Synthetic acceptance, for benchmarks only: speculation's speed at an acceptance rate chosen
by the caller, on checkpoints whose own acceptance means nothing (random weights of real shapes,
as on a GPU machine that receives no trained pair).

Each proposed token is accepted with probability ``rate``, independently of every other and of
both models, until the first rejection: a round of ``K`` proposals commits ``k`` of them with
``P(k = j) = rate^j (1 - rate)`` for ``j < K`` and ``P(k = K) = rate^K``, the law of a draft
whose every position is accepted with probability ``rate``; the next token is the target's
argmax at the first position not accepted. The output is *not* the target's distribution, nor
its greedy text. So the engine offers no setting for it: only the bench installs it, on engines
it built itself (``saguaro bench --synthetic-acceptance``), and skips its greedy check then.
"""

from __future__ import annotations

import torch

from saguaro.sampling.round import Round, Verifier
from saguaro.sampling.verify import VerifyResult


def synthetic_verifier(rate: float, seed: int) -> Verifier:
    """A verifier accepting each proposal with probability ``rate`` (module docstring)."""
    if not 0 <= rate <= 1:
        raise ValueError(f"a synthetic acceptance rate lies in [0, 1], got {rate}")
    gen = torch.Generator().manual_seed(seed)

    def verify(logits: torch.Tensor, rnd: Round) -> VerifyResult:
        n, k_max = rnd.draft_tokens.shape
        accepted = torch.rand(n, k_max, generator=gen) < rate
        # The leading run of acceptances, cut at each sequence's own proposals.
        run = accepted.long().cumprod(dim=1).sum(dim=1)
        num_accepted = torch.minimum(run, rnd.num_draft.cpu())
        rows = rnd.rows.cpu().gather(1, num_accepted[:, None])[:, 0]
        next_token = logits.index_select(0, rows.to(logits.device)).argmax(dim=-1).cpu()
        return VerifyResult(num_accepted, next_token, torch.zeros(n, dtype=torch.bool))

    return verify
