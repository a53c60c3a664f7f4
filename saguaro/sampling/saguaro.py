"""Saguaro sampling (DESIGN §6): a draft proposal that steers rejections into the cache.

After a rejection the target draws from ``max(0, p - q)``, which has little mass where the draft's
``q`` is large, yet the cache prepares exactly the draft's favourite tokens. Lowering ``q`` on its
own top tokens moves residual mass onto them:

    sigma_{F,C}(t) ∝ C * q(t)   if t is among the top F+1 tokens of q,
                     q(t)       otherwise,          with 0 < C <= 1,

where ``q`` is the draft's transformed distribution (temperature, top-k, top-p). F is the number
of recovery candidates the cache prepares for a rejection at this position; the +1 covers the
drafted token itself. Exactness is untouched as long as the draft samples from sigma and the
verifier is given ``q = sigma`` (any proposal is allowed, DESIGN §3).
"""

from __future__ import annotations

import math

import torch

from saguaro.sampling.probs import SamplingTensors, logits_to_probs


def saguaro_probs(
    logits: torch.Tensor, st: SamplingTensors, fanout: torch.Tensor | int, c: float
) -> torch.Tensor:
    """[n, V] logits -> [n, V] float32 ``sigma_{F,C}`` with F = ``fanout[i]`` (or one int).

    The top F+1 tokens are ranked by the transformed probabilities; ties at the (F+1)-th value
    are all included, so the result does not depend on token order. If fewer than F+1 tokens
    have mass, the whole support is scaled and sigma equals q. C == 1 returns
    ``logits_to_probs`` unchanged; a one-hot (greedy) row is unchanged bit for bit, since its
    single mass C is renormalised by C.
    """
    if not (isinstance(c, (int, float)) and math.isfinite(c) and 0 < c <= 1):
        raise ValueError(f"saguaro c must be in (0, 1], got {c!r}")
    probs = logits_to_probs(logits, st)
    if c == 1:
        return probs
    n, vocab = probs.shape
    f = torch.as_tensor(fanout, dtype=torch.int64, device=probs.device).expand(n)
    if bool((f < 0).any()):
        raise ValueError(f"fanout must be >= 0, got {f.tolist()}")
    rank = f.clamp(max=vocab - 1)  # 0-based rank of the (F+1)-th largest probability
    top = probs.topk(int(rank.max()) + 1, dim=-1).values
    in_top = probs >= top.gather(1, rank[:, None])
    scaled = torch.where(in_top, probs * c, probs)
    return scaled / scaled.sum(dim=-1, keepdim=True)
