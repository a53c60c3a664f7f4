"""Saguaro sampling: a draft proposal that steers rejections into the speculation cache.

After a rejection the target draws from ``max(0, p - q)``, which has little mass where the draft's
``q`` is large, yet the cache prepares exactly the draft's favourite tokens. Lowering ``q`` on its
own top tokens moves residual mass onto them:

    sigma_{F,C}(t) ∝ C * q(t)   if t is among the top F+1 tokens of q,
                     q(t)       otherwise,          with 0 < C <= 1,

where ``q`` is the draft's proposal distribution (temperature, top-k, top-p, top-M). F is the
number of recovery candidates the cache prepares for a rejection at this position; the +1 covers
the drafted token itself. Exactness is untouched as long as the draft samples from sigma and the
verifier is given ``q = sigma`` (any proposal is allowed). When F+1 reaches the draft's whole
support, every token is scaled alike and sigma equals q.
"""

from __future__ import annotations

import math

import torch


def saguaro_weights(
    weights: torch.Tensor, kept: torch.Tensor, fanout: torch.Tensor | int, c: float
) -> torch.Tensor:
    """[R, M] unnormalised weights of a row's candidates, sorted by weight descending, ->
    ``sigma_{F,C}`` weights with F = ``fanout[i]`` (or one int); ``kept`` marks the support.

    Ties at the (F+1)-th weight are all scaled, so the result does not depend on token order.
    C == 1 returns ``weights`` unchanged.
    """
    if not (isinstance(c, (int, float)) and math.isfinite(c) and 0 < c <= 1):
        raise ValueError(f"saguaro c must be in (0, 1], got {c!r}")
    if c == 1:
        return weights
    rows, width = weights.shape
    f = torch.as_tensor(fanout, dtype=torch.int64, device=weights.device).expand(rows)
    if bool((f < 0).any()):
        raise ValueError(f"fanout must be >= 0, got {f.tolist()}")
    edge = weights.gather(1, f.clamp(max=width - 1)[:, None])  # the (F+1)-th largest weight
    top = kept & (weights >= edge)
    return torch.where(top, weights * c, weights)
