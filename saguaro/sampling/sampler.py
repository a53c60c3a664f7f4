"""Seeded inverse-CDF sampling from probability rows.

Reproducibility contract: a row with its own ``torch.Generator`` draws a fixed number of uniforms
from it that depends only on that row's inputs, never on the batch. A seeded request therefore
produces the same tokens whether it runs alone or next to any other requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Generators = Sequence[torch.Generator | None] | torch.Generator | None


def is_one_hot(probs: torch.Tensor) -> torch.Tensor:
    """[..., V] -> [...] bool: rows whose largest probability is exactly 1 (greedy rows).

    Sampling such a row is deterministic, so it takes the argmax and draws no uniform. Any other
    mass such a float32 row can hold sums below 2^-24, which the float32 CDF cannot resolve
    anyway; the max is far cheaper than counting the support over a large vocabulary.
    """
    return probs.amax(dim=-1) == 1


def draw_uniforms(
    generators: Generators, counts: Sequence[int], width: int, device: torch.device
) -> torch.Tensor:
    """[n, width] float32 uniforms in [0, 1) on ``device``, n = len(counts).

    With a sequence of generators, row i draws exactly ``counts[i]`` values from
    ``generators[i]`` (None: torch's default generator) into its first columns; the remaining
    columns are 0 and must be ignored by the caller. With a single generator (or None) the whole
    [n, width] block is drawn at once: fast, but a row's values then depend on the batch.
    """
    n = len(counts)
    if generators is None or isinstance(generators, torch.Generator):
        return torch.rand(n, width, generator=generators, device=device)
    if len(generators) != n:
        raise ValueError(f"expected {n} generators (one per row), got {len(generators)}")
    u = torch.zeros(n, width)
    for i, (g, c) in enumerate(zip(generators, counts, strict=True)):
        if c:
            u[i, :c] = torch.rand(c, generator=g, device=g.device if g is not None else "cpu")
    return u.to(device)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[n, V] probs (need not be normalised), [n] uniforms in [0, 1) -> [n] int64 tokens.

    Returns the first t with ``cdf_t > u * cdf_V``. Since ``cdf_t == cdf_{t-1}`` when
    ``probs_t == 0``, a zero-probability token can never be that first index. ``u * cdf_V`` is
    clamped below ``cdf_V`` so float rounding cannot push it past the last token.
    """
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    x = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True)[:, 0]


def sample(probs: torch.Tensor, generators: Generators) -> torch.Tensor:
    """[n, V] float32 probs -> [n] int64 tokens.

    One uniform per row that is not one-hot, drawn from that row's own generator, mapped through
    the row's CDF. One-hot (greedy) rows return their argmax and draw nothing. A single
    generator (or None: torch's default) draws all n uniforms in one vectorised call instead.
    """
    draws = ~is_one_hot(probs)
    tokens = probs.argmax(dim=-1)
    if bool(draws.any()):  # the CDF only for rows that draw
        u = draw_uniforms(generators, draws.long().tolist(), 1, probs.device)[:, 0]
        tokens[draws] = inverse_cdf(probs[draws], u[draws])
    return tokens
