"""Logits -> probabilities under per-row sampling transforms (temperature, top-k, top-p).

The output of :func:`logits_to_probs` *is* the distribution ``p`` (target) or ``q`` (draft) of
DESIGN §2-3: the sampler draws from it and the verifier tests against it, so it must be a
deterministic function of the logits and the row's parameters.

Ties at a top-k / top-p cut-off are resolved by value, not by token index: every token whose
(tempered) logit equals the logit at the cut-off is kept. The kept set is then independent of
how the vocabulary happens to be ordered, and of the (unspecified) tie order of ``torch.sort``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from saguaro.sampling.params import SamplingParams


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling transforms as tensors (one row per sequence or per scored position)."""

    temperature: torch.Tensor  # [n] float32, 0 = greedy
    top_k: torch.Tensor  # [n] int64, 0 = off
    top_p: torch.Tensor  # [n] float32, 1 = off

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], device: torch.device | str | None = None
    ) -> SamplingTensors:
        return cls(
            temperature=torch.tensor(
                [p.temperature for p in params], dtype=torch.float32, device=device
            ),
            # -1 and 0 both mean "off"; store a single sentinel.
            top_k=torch.tensor([max(p.top_k, 0) for p in params], dtype=torch.int64, device=device),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        )

    def repeat_interleave(self, repeats: int | torch.Tensor) -> SamplingTensors:
        """Row i repeated ``repeats`` (or ``repeats[i]``) times, e.g. K+1 scored positions."""
        return SamplingTensors(
            temperature=self.temperature.repeat_interleave(repeats),
            top_k=self.top_k.repeat_interleave(repeats),
            top_p=self.top_p.repeat_interleave(repeats),
        )

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[n, V] logits (any float dtype) -> [n, V] float32 probabilities.

    With ``z = logits / T``:

    * top-k keeps ``{t : z_t >= z_(k)}`` where ``z_(k)`` is the k-th largest tempered logit;
    * top-p then works on the renormalised top-k distribution ``r`` sorted descending and keeps
      rank j iff ``sum_{i<j} r_(i) < top_p`` — the smallest prefix whose mass reaches top_p
      (the top token always qualifies since top_p > 0), widened to ties at its last value;
    * ``p = softmax(z)`` restricted to the kept set.

    Rows with ``T == 0`` become a one-hot at ``argmax(logits)`` (lowest index wins ties).
    """
    n, vocab = logits.shape
    x = logits.float()
    greedy = st.greedy
    if bool(greedy.all()):  # nothing to temper or filter: skip the softmax
        return torch.zeros_like(x).scatter_(1, x.argmax(dim=-1, keepdim=True), 1.0)
    # Greedy rows are replaced by a one-hot below; divide them by 1 to keep them finite.
    z = x / torch.where(greedy, 1.0, st.temperature).unsqueeze(1)

    k = torch.where((st.top_k > 0) & (st.top_k < vocab), st.top_k, 0)
    use_k = k > 0
    use_p = st.top_p < 1
    if bool(use_p.any()):
        sorted_z = z.sort(dim=-1, descending=True).values
        thr = torch.full((n,), -torch.inf, device=z.device)
        if bool(use_k.any()):
            thr = torch.where(use_k, sorted_z.gather(1, (k - 1).clamp(min=0)[:, None])[:, 0], thr)
            sorted_z = sorted_z.masked_fill(sorted_z < thr[:, None], -torch.inf)
        sorted_p = torch.softmax(sorted_z, dim=-1)
        mass_before = torch.nn.functional.pad(sorted_p.cumsum(dim=-1)[:, :-1], (1, 0))
        num_keep = (mass_before < st.top_p[:, None]).sum(dim=-1)  # >= 1: mass_before[0] = 0
        p_thr = sorted_z.gather(1, (num_keep - 1)[:, None])[:, 0]
        thr = torch.where(use_p, torch.maximum(thr, p_thr), thr)
        z = z.masked_fill(z < thr[:, None], -torch.inf)
    elif bool(use_k.any()):
        # top-k only: a partial top-k is enough to find each row's cut-off value.
        top = z.topk(int(k.max()), dim=-1).values
        thr = top.gather(1, (k - 1).clamp(min=0)[:, None])
        z = z.masked_fill(use_k[:, None] & (z < thr), -torch.inf)

    probs = torch.softmax(z, dim=-1)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(1, x.argmax(dim=-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs
