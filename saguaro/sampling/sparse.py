"""A draft distribution as it crosses the wire: the (id, probability) pairs of its support.

The draft samples from its own top-M tokens, renormalised (:func:`saguaro.sampling.sampler.
propose`). Any proposal distribution is allowed as long as the verifier sees exactly the one the
token was drawn from, so this truncation costs acceptance, never exactness, and a row is M
pairs instead of V floats. A deterministic proposal (greedy draft, n-gram lookup) is the point
mass ``q = delta(s)``: one pair ``(s, 1)``.

Both ends read a row the same way: ``q(v) = probs[j] / sum(probs)`` in float64 for the entry j
with ``ids[j] == v`` (0 if there is none). Entries with probability 0 are padding; their ids
are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SparseQ:
    ids: torch.Tensor  # [..., M] int64
    probs: torch.Tensor  # [..., M] float32, non-negative, not all zero

    @staticmethod
    def point_mass(tokens: torch.Tensor, width: int = 1) -> SparseQ:
        """``delta(tokens)`` for every element of ``tokens``, padded to ``width`` entries."""
        ids = torch.zeros(*tokens.shape, width, dtype=torch.int64, device=tokens.device)
        probs = torch.zeros(*tokens.shape, width, device=tokens.device)
        ids[..., 0] = tokens
        probs[..., 0] = 1.0
        return SparseQ(ids, probs)

    @property
    def device(self) -> torch.device:
        return self.ids.device

    @property
    def width(self) -> int:
        return self.ids.shape[-1]

    def normalised(self) -> torch.Tensor:
        """float64 ``q`` values of the entries."""
        p = self.probs.double()
        return p / p.sum(dim=-1, keepdim=True)

    def prob_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """float64 ``q(tokens)``; ``tokens`` has the shape of ``ids`` without its last dim."""
        return (self.normalised() * (self.ids == tokens[..., None])).sum(dim=-1)

    def pad_to(self, width: int) -> SparseQ:
        extra = width - self.width
        if extra <= 0:
            return self
        pad = torch.nn.functional.pad
        return SparseQ(pad(self.ids, (0, extra)), pad(self.probs, (0, extra)))

    def clone(self) -> SparseQ:
        """A compact copy (a view would drag its whole storage along when pickled)."""
        return SparseQ(self.ids.clone(), self.probs.clone())

    def to(self, device: torch.device | str) -> SparseQ:
        return SparseQ(self.ids.to(device), self.probs.to(device))

    def __getitem__(self, index) -> SparseQ:
        return SparseQ(self.ids[index], self.probs[index])
