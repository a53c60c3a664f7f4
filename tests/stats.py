"""Statistical helpers for distribution tests.

Every distribution check compares an empirical histogram with the exact target through the total
variation distance ``TV = 1/2 * sum_x |N_x/N - p_x|`` and fails only above a rigorous noise floor.

Bretagnolle–Huber–Carol inequality: for N i.i.d. draws from p over V categories,

    P( sum_x |N_x/N - p_x| >= lam ) <= 2^V * exp(-N * lam^2 / 2).

With lam = 2 * eps this is ``P(TV >= eps) <= 2^V * exp(-2 N eps^2)``; setting the right side to
delta gives the floor ``eps = sqrt((V ln 2 + ln(1/delta)) / (2 N))``. A correct sampler fails a
check with probability at most delta (tests use fixed seeds, so they are deterministic anyway);
a sampler whose law is at TV distance d from p is caught once d exceeds about twice the floor.

Resolution: a sampler whose law q is at TV distance d from p gives an empirical law at least
d - TV(empirical, q) from p (triangle inequality), and the same inequality applied to q bounds
TV(empirical, q) by ``tv_noise_floor(V, N, 0.01)`` with probability 0.99. So a check catches
every such sampler with probability at least 0.99 once

    d >= tv_noise_floor(V, N, delta) + tv_noise_floor(V, N, 0.01) =: tv_resolution(V, N),

the smallest bias the check is sure to see at its own sample size. Over V = 8 tokens, 12,000
samples resolve 0.049 TV; over the V^2 = 64 pairs of two tokens, 0.094.
"""

from __future__ import annotations

import math

import torch


def tv_distance(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """TV distance between the empirical distribution of ``counts`` [V] and ``probs`` [V]."""
    counts = torch.as_tensor(counts, dtype=torch.float64)
    probs = torch.as_tensor(probs, dtype=torch.float64)
    return 0.5 * float((counts / counts.sum() - probs / probs.sum()).abs().sum())


def tv_noise_floor(num_categories: int, num_samples: int, delta: float = 1e-6) -> float:
    """The eps with ``P(TV >= eps) <= delta`` for an empirical distribution (module docstring)."""
    return math.sqrt((num_categories * math.log(2) + math.log(1 / delta)) / (2 * num_samples))


# The largest resolution a check of a token's law may have (see the module docstring).
MAX_RESOLUTION = 0.05
MISS = 0.01  # the resolution's chance of missing a bias of that size


def tv_resolution(num_categories: int, num_samples: int, delta: float = 1e-6) -> float:
    """The smallest TV distance from p that a check at ``delta`` catches with probability 0.99
    (module docstring)."""
    return tv_noise_floor(num_categories, num_samples, delta) + tv_noise_floor(
        num_categories, num_samples, MISS
    )


def assert_first_two_follow(counts: torch.Tensor, expected: torch.Tensor, what: str = "") -> None:
    """Counts [V, V] of sampled first-two-token pairs against their exact law [V, V]: the joint
    law within its noise floor, and each token's marginal law within its own, at a resolution of
    at most ``MAX_RESOLUTION`` (the joint's, over V^2 cells, is coarser: it is stated, not
    bounded, and catches the dependence between the two tokens the marginals cannot see)."""
    n = int(counts.sum())
    vocab = expected.shape[0]
    assert tv_resolution(vocab, n) <= MAX_RESOLUTION, (
        f"{what}: {n} samples resolve {tv_resolution(vocab, n):.3f} TV, not {MAX_RESOLUTION}"
    )
    laws = {
        "joint": (counts.flatten(), expected.flatten()),
        "first token": (counts.sum(1), expected.sum(1)),
        "second token": (counts.sum(0), expected.sum(0)),
    }
    for name, (got, law) in laws.items():
        tv, floor = tv_distance(got, law), tv_noise_floor(law.numel(), n)
        assert tv <= floor, (
            f"{what}, {name}: TV {tv:.4f} > noise floor {floor:.4f} (N={n}, resolution "
            f"{tv_resolution(law.numel(), n):.3f})"
        )


def assert_samples_follow(samples: torch.Tensor, probs: torch.Tensor, what: str = "") -> None:
    """Assert that the integer ``samples`` [N] are consistent with draws from ``probs`` [V]."""
    counts = torch.bincount(samples.flatten(), minlength=probs.numel())
    tv = tv_distance(counts, probs)
    floor = tv_noise_floor(probs.numel(), samples.numel())
    assert tv <= floor, f"{what}: TV {tv:.5f} > noise floor {floor:.5f} (N={samples.numel()})"
