"""Statistical helpers for distribution tests.

Every distribution check compares an empirical histogram with the exact target through the total
variation distance ``TV = 1/2 * sum_x |N_x/N - p_x|`` and fails only above a rigorous noise floor.

Bretagnolle–Huber–Carol inequality: for N i.i.d. draws from p over V categories,

    P( sum_x |N_x/N - p_x| >= lam ) <= 2^V * exp(-N * lam^2 / 2).

With lam = 2 * eps this is ``P(TV >= eps) <= 2^V * exp(-2 N eps^2)``; setting the right side to
delta gives the floor ``eps = sqrt((V ln 2 + ln(1/delta)) / (2 N))``. A correct sampler fails a
check with probability at most delta (tests use fixed seeds, so they are deterministic anyway);
a sampler whose law is at TV distance d from p is caught once d exceeds about twice the floor.
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


def assert_samples_follow(samples: torch.Tensor, probs: torch.Tensor, what: str = "") -> None:
    """Assert that the integer ``samples`` [N] are consistent with draws from ``probs`` [V]."""
    counts = torch.bincount(samples.flatten(), minlength=probs.numel())
    tv = tv_distance(counts, probs)
    floor = tv_noise_floor(probs.numel(), samples.numel())
    assert tv <= floor, f"{what}: TV {tv:.5f} > noise floor {floor:.5f} (N={samples.numel()})"
