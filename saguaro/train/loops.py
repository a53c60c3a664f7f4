"""Training the target against greedy loops with pseudo-repetitions (DITTO: Xu et al., 2022,
"Learning to break the loop").

A small LM decoded greedily repeats a line forever through *self-reinforcement*: each time a
segment recurs, the model grows surer that it recurs again. DITTO shows the model that effect
on constructed text and asks for the opposite. A row is a real prefix ``x`` from the corpus
followed by the real segment ``s`` (n tokens) that follows it, repeated until the row is full:
``x s s s ...``. With ``p_r(j)`` the model's probability of segment token ``j`` in occurrence
``r`` (``r = 0`` the first, after real context), every later occurrence is trained towards a
fixed fraction of the one before:

    L = -mean_{r >= 1, j} log(1 - |p_r(j) - lambda * sg(p_{r-1}(j))|),

``sg`` stopping the gradient. With ``lambda < 1`` the probability of continuing a loop decays
geometrically with the number of repeats instead of growing towards 1. Unlike unlikelihood
(``saguaro/train/rollouts.py``), which pushes every repeated n-gram towards 0, one repeat of a
line stays ``lambda`` times as likely as its first occurrence, so repeats that code really has
keep their mass; and the rows are corpus text, so the mass is moved within what the model
already finds plausible rather than onto whatever token is least repeated.
"""

from __future__ import annotations

import numpy as np
import torch

# Segment lengths drawn, inclusive: the periods of the loops a small greedy target falls into,
# from a repeated token to a repeated line of code.
SEGMENT = (2, 24)
ROW = 192  # tokens per pseudo-repetition row, prefix included
# 1 - |gap| reaches 0 only when p = 1 against a previous p of 0: the gap is clamped this far
# below 1 so that the log stays finite.
GAP_MAX = 1 - 1e-6


def pseudo_repeats(
    tokens: np.ndarray, step: int, rows: int, prefix: int, seed: int, length: int = ROW
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[rows, length]`` of prefix + repeated segment, and each row's period n; a pure
    function of ``(seed, step)``, so a resumed run sees the same rows."""
    rng = np.random.default_rng([seed, step])
    periods = rng.integers(SEGMENT[0], SEGMENT[1] + 1, rows)
    starts = rng.integers(0, tokens.size - prefix - SEGMENT[1], rows)
    out = np.empty((rows, length), dtype=np.int64)
    for i, (s, n) in enumerate(zip(starts.tolist(), periods.tolist(), strict=True)):
        seg = tokens[s + prefix : s + prefix + n]
        body = np.tile(seg, -(-(length - prefix) // n))
        out[i] = np.concatenate([tokens[s : s + prefix], body])[:length]
    return torch.from_numpy(out), torch.from_numpy(periods)


def ditto_loss(
    logits: torch.Tensor, seq: torch.Tensor, periods: torch.Tensor, prefix: int, lam: float
) -> torch.Tensor:
    """L above. ``logits[:, t]`` predicts ``seq[:, t + 1]``; row b's segment starts at ``prefix``
    with period ``periods[b]``, so token ``t + 1`` is a repeat when ``t + 1 >= prefix + n`` and
    its previous occurrence is predicted at ``t - n``."""
    p = logits[:, :-1].float().log_softmax(-1).gather(-1, seq[:, 1:, None])[..., 0].exp()
    t = torch.arange(p.size(1), device=p.device)[None]
    n = periods.to(p.device)[:, None]
    repeat = t + 1 >= prefix + n
    previous = p.gather(1, (t - n).clamp(min=0).expand_as(p)).detach()
    gap = (p - lam * previous).abs().clamp(max=GAP_MAX)
    return (-torch.log1p(-gap) * repeat).sum() / repeat.sum()
