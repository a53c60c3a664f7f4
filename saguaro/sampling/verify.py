"""Lossless verification of speculated tokens (DESIGN §3).

Rule, per row: for j = 1..num_draft accept ``s_j`` with probability ``min(1, p_j(s_j) / q_j(s_j))``;
at the first rejection draw ``t ~ norm(max(0, p_j - q_j))``; if all were accepted draw the bonus
``t ~ p_{num_draft+1}``.

Why the committed tokens are distributed exactly as the target's: at one position, with
``s ~ q`` and ``m = min(p, q)``,

    P(commit x) = q(x) * min(1, p(x)/q(x)) + P(reject) * max(0, p(x) - q(x)) / Z
                = m(x) + (1 - sum m) * (p(x) - m(x)) / (1 - sum m)  =  p(x),

because ``Z = sum max(0, p - q) = sum (p - m) = 1 - sum m = P(reject)``. Every position uses
fresh uniforms and ``p_{j+1}``, ``q_{j+1}`` are conditioned on the same committed prefix
``s_1..s_j``, so by induction the committed sequence (up to the stop position) has the target's
joint law; the bonus token is an ordinary sample of ``p_{K+1}`` given the accepted prefix.
The identity holds for any ``q`` that ``s`` really was drawn from, including a point mass
``q = delta(s)``: accept with ``p(s)``, else draw from ``p`` with ``s`` removed (this is
``max(0, p - delta(s))``). A rejected token is never recovered: rejection implies ``q(s) > p(s)``,
so its residual mass is 0.

Acceptance is computed as ``u * q(s) < p(s)`` with ``u ~ U[0, 1)``: equal to ``u < p(s)/q(s)``
for ``q(s) > 0``, needs no division, and is deterministic whenever ``p`` is one-hot
(``p(s) = 1`` always accepts, ``p(s) = 0`` never does). Greedy rows therefore follow
"accept while s_j == argmax p_j, then t = argmax" without drawing any randomness.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from saguaro.sampling.sampler import Generators, draw_uniforms, inverse_cdf, is_one_hot


@dataclass
class VerifyResult:
    num_accepted: torch.Tensor  # [n] int64, k in 0..num_draft[i]
    next_token: torch.Tensor  # [n] int64, recovery token (k < num_draft) or bonus token


def verify(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    num_draft: torch.Tensor,
    generators: Generators,
    point_mass: torch.Tensor | None = None,
) -> VerifyResult:
    """Verify one round of speculation for n rows; see the module docstring for the math.

    Args:
        target_probs: [n, K+1, V] float32, p_1..p_{K+1} after the target's transforms.
        draft_tokens: [n, K] int64, s_1..s_K; entries at or after ``num_draft[i]`` are padding.
        draft_probs: [n, K, V] float32, the q_j each s_j was sampled from, bit for bit.
            None: every row is a point-mass proposal.
        num_draft: [n] int64 in 0..K, the number of real proposals of row i.
        generators: one generator per row (None entries: torch's default generator), or a
            single generator / None that draws for all rows at once (batch-dependent values).
        point_mass: [n] bool, rows whose proposals are deterministic (q_j = delta(s_j)); their
            ``draft_probs`` rows are ignored.

    Randomness: a non-greedy row draws exactly ``num_draft[i] + 1`` uniforms from its generator
    (acceptance tests, then the final sample) whatever the outcome; a row whose scored target
    rows are all one-hot draws none. So seeded rows are reproducible in any batch.
    """
    n, k_plus_1, vocab = target_probs.shape
    k_max = k_plus_1 - 1
    if draft_tokens.shape != (n, k_max):
        raise ValueError(f"draft_tokens must be [{n}, {k_max}], got {list(draft_tokens.shape)}")
    if draft_probs is not None and draft_probs.shape != (n, k_max, vocab):
        raise ValueError(
            f"draft_probs must be [{n}, {k_max}, {vocab}], got {list(draft_probs.shape)}"
        )
    if bool(((num_draft < 0) | (num_draft > k_max)).any()):
        raise ValueError(f"num_draft must be in 0..{k_max}, got {num_draft.tolist()}")
    device = target_probs.device
    rows = torch.arange(n, device=device)

    valid = torch.arange(k_max, device=device) < num_draft[:, None]  # [n, K]
    s = torch.where(valid, draft_tokens, 0)  # padding may be any value (e.g. -1)
    p_s = target_probs[:, :k_max].gather(2, s[..., None])[..., 0]  # [n, K]
    if draft_probs is None:
        pm = torch.ones(n, dtype=torch.bool, device=device)
        q_s = torch.ones_like(p_s)
    else:
        pm = point_mass if point_mass is not None else torch.zeros_like(valid[:, 0])
        q_s = torch.where(pm[:, None], 1.0, draft_probs.gather(2, s[..., None])[..., 0])

    # Greedy rows: every target row that can be scored (positions 1..num_draft+1) is one-hot.
    scored = torch.arange(k_plus_1, device=device) <= num_draft[:, None]
    greedy = (is_one_hot(target_probs) | ~scored).all(dim=1)

    counts = torch.where(greedy, 0, num_draft + 1).tolist()
    u = draw_uniforms(generators, counts, k_plus_1, device)  # acceptance u's, then final u
    accept = valid & (u[:, :k_max] * q_s < p_s)
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)  # length of the accepted prefix

    p_stop = target_probs[rows, num_accepted]  # [n, V]: p at the stop position
    dist = p_stop
    rejected = num_accepted < num_draft
    if bool(rejected.any()):
        r = rejected.nonzero()[:, 0]
        k_r = num_accepted[r]
        p_r = p_stop[r]
        without_s = p_r.scatter(1, s[r, k_r][:, None], 0.0)  # point-mass residual
        if draft_probs is None:
            residual = without_s
        else:
            residual = torch.where(pm[r, None], without_s, (p_r - draft_probs[r, k_r]).clamp(min=0))
        # Zero residual mass needs p <= q everywhere, i.e. p == q up to rounding. Fall back to
        # p without the rejected token, which keeps the invariant "s_j is never recovered".
        empty = residual.sum(dim=-1) <= 0
        dist = p_stop.index_copy(0, r, torch.where(empty[:, None], without_s, residual))

    u_final = u.gather(1, num_draft[:, None])[:, 0]
    sampled = inverse_cdf(dist, u_final)
    next_token = torch.where(greedy, p_stop.argmax(dim=-1), sampled)
    return VerifyResult(num_accepted=num_accepted, next_token=next_token)
