"""Logits -> the distribution a request samples from, under temperature, top-k and top-p.

The result *is* the distribution ``p`` (target) or ``q`` (draft) that exact speculation must
reproduce, so it is one deterministic function of the logits and the row's parameters. With
``d = logits - max(logits)`` and ``z = d / T``:

* min-p keeps ``{t : z_t >= log(min_p)}``, the tokens of probability at least ``min_p`` times
  the top one's (``log(min_p)`` rounded to float32; the top token always qualifies);
* top-k keeps ``{t : z_t >= z_(k)}``, ``z_(k)`` the k-th largest value (ties at it all kept);
  on a row already cut by min-p it keeps the k largest of what is left, so the two together keep
  ``z_t >= max(log(min_p), z_(k))``;
* top-p then works on the renormalised min-p/top-k distribution ``r`` sorted descending and
  keeps rank j iff ``sum_{i<j} r_(i) < top_p`` (the smallest prefix whose mass reaches
  top_p; the top token always qualifies), widened to every token tied with its last value;
* ``p = exp(z - lse)`` on the kept set, ``lse`` the log-sum-exp of z over it; 0 elsewhere.

Ties are resolved by value, never by token index, so the kept set does not depend on the order
of the vocabulary or of a sort. Rows with ``T == 0`` are greedy: a point mass at
``argmax(logits)`` (the lowest index among ties).

Subtracting the max before dividing keeps every positive temperature finite: however small T
is, ``z <= 0`` with the max at 0, so the row tends to its limit (uniform over the tied maxima)
instead of overflowing. Temperatures below float32's smallest normal number are computed at that
number; the distribution is then already that limit for any logits that differ at all.

Nothing here sorts a whole vocabulary: the top-k / top-p cut-off is found among the
``CANDIDATES`` largest values of each row (a partial top-k), and rows whose nucleus is not
closed within them (its mass there is below top_p) bucket their values by magnitude and sort
only the bucket where the nucleus ends (:func:`_wide_nucleus`). Both give the kept set of a full
sort (tested against it on rows with ties, -inf entries, tiny and wide nuclei).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch

from saguaro.kernels import transfer
from saguaro.sampling.params import SamplingParams
from saguaro.sampling.reduce import max_rows, topk_rows

CANDIDATES = 64  # leading values per row searched for a top-p cut-off before bucketing
NUCLEUS_BUCKETS = 4096  # value buckets of a wide nucleus: few values share the one crossing top_p
NUCLEUS_SPAN = 40.0  # nats below the max the buckets cover; a value below it has mass < 5e-18
# int64 must hold top_k; any value at or above the vocabulary size disables it anyway.
MAX_TOP_K = 2**31
TINY_TEMPERATURE = torch.finfo(torch.float32).tiny


@dataclass(frozen=True)
class HostFacts:
    """What the host knows of a block of rows without reading a device (on a GPU a read makes
    the host wait for everything queued). Each is True only where it holds for every row; False
    means it may not, and the code then takes the path that is exact either way."""

    all_greedy: bool  # every row at temperature 0
    uncut: bool  # no row has top-k, top-p or min-p on


UNKNOWN = HostFacts(all_greedy=False, uncut=False)


@dataclass(frozen=True)
class SamplingTensors:
    """Per-row sampling transforms as tensors (one row per sequence or per scored position)."""

    temperature: torch.Tensor  # [n] float32, 0 = greedy
    top_k: torch.Tensor  # [n] int64, 0 = off
    top_p: torch.Tensor  # [n] float64, 1 = off (float64: a tiny top_p must not round to 0)
    log_min_p: torch.Tensor  # [n] float32 log(min_p), -inf = off
    # A device copy's facts, read on the host before it moved (see :meth:`facts`).
    known: HostFacts = field(default=UNKNOWN, init=False, repr=False, compare=False)

    @classmethod
    def from_params(
        cls, params: Sequence[SamplingParams], device: torch.device | str | None = None
    ) -> SamplingTensors:
        return cls(
            temperature=torch.tensor(
                [max(p.temperature, TINY_TEMPERATURE) if p.temperature else 0.0 for p in params],
                dtype=torch.float32,
                device=device,
            ),
            # -1 and 0 both mean "off"; store a single sentinel.
            top_k=torch.tensor(
                [min(max(p.top_k, 0), MAX_TOP_K) for p in params], dtype=torch.int64, device=device
            ),
            top_p=torch.tensor([p.top_p for p in params], dtype=torch.float64, device=device),
            log_min_p=torch.tensor(
                [math.log(p.min_p) if p.min_p > 0 else -math.inf for p in params],
                dtype=torch.float32,
                device=device,
            ),
        )

    def _derived(self, *tensors: torch.Tensor) -> SamplingTensors:
        """Rows made of this block's rows keep what was known of all of them."""
        out = SamplingTensors(*tensors)
        object.__setattr__(out, "known", self.facts())
        return out

    def repeat_interleave(self, repeats: int | torch.Tensor) -> SamplingTensors:
        """Row i repeated ``repeats`` (or ``repeats[i]``) times, e.g. K+1 scored positions."""
        return self._derived(
            self.temperature.repeat_interleave(repeats),
            self.top_k.repeat_interleave(repeats),
            self.top_p.repeat_interleave(repeats),
            self.log_min_p.repeat_interleave(repeats),
        )

    def index(self, rows: torch.Tensor) -> SamplingTensors:
        return self._derived(
            self.temperature[rows], self.top_k[rows], self.top_p[rows], self.log_min_p[rows]
        )

    def on(self, device: torch.device | str) -> SamplingTensors:
        """These rows on ``device``: on a GPU one non-blocking copy (every field packed as
        float64, which holds each exactly: float32 values, top-k below 2^31), knowing what the
        host knew of them."""
        device = torch.device(device)
        if self.temperature.device == device:
            return self
        fields = (self.temperature, self.top_k, self.top_p, self.log_min_p)
        moved = transfer.upload([f.double() for f in fields], device)
        return self._derived(*(m.to(f.dtype) for m, f in zip(moved, fields, strict=True)))

    @property
    def greedy(self) -> torch.Tensor:
        return self.temperature == 0

    def facts(self) -> HostFacts:
        """Read from the tensors on the host (a few values, no device to wait for); a device
        copy's are those known when it was made, or made from host rows."""
        return self._read_facts if self.temperature.device.type == "cpu" else self.known

    @cached_property
    def _read_facts(self) -> HostFacts:
        return HostFacts(
            all_greedy=not any(self.temperature.tolist()),
            uncut=not (
                bool((self.top_k > 0).any())
                or bool((self.top_p < 1).any())
                or bool((self.log_min_p > -torch.inf).any())
            ),
        )

    def all_greedy(self) -> bool:
        return self.facts().all_greedy


@dataclass
class Dist:
    """The processed distributions of a block of logit rows, without materialising them.

    ``log p_t = z_t - lse`` where ``z_t >= thr``, else ``-inf``; greedy rows are point masses at
    ``argmax``. ``z`` is None when every row is greedy.
    """

    z: torch.Tensor | None  # [R, V] float32 scaled logits, max 0 (greedy rows: unscaled)
    thr: torch.Tensor  # [R] float32 smallest kept z (-inf: all kept)
    greedy: torch.Tensor  # [R] bool
    argmax: torch.Tensor  # [R] int64
    vocab_size: int
    valid: torch.Tensor  # [R] bool: the row's max is finite (no NaN, no inf, not all -inf)
    uncut: bool = False  # known on the host: every thr is -inf

    @cached_property
    def lse(self) -> torch.Tensor:
        """[R] float32 log-sum-exp of z over the kept set (0 without z). Computed when first
        read: coupled sampling never reads it."""
        if self.z is None:
            return torch.zeros(len(self.thr), device=self.thr.device)
        thr = self.thr[:, None]
        kept = (
            self.z
            if self.uncut or host_all(thr == -torch.inf)
            else self.z.masked_fill(self.z < thr, -torch.inf)
        )
        return torch.logsumexp(kept, dim=-1)

    def log_prob(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """float64 ``log p_rows(tokens)`` (same shape as ``rows`` and ``tokens``)."""
        point = torch.where(tokens == self.argmax[rows], 0.0, -torch.inf).double()
        if self.z is None:
            return point
        z = self.z[rows, tokens]
        lp = torch.where(z >= self.thr[rows], z - self.lse[rows], -torch.inf).double()
        return torch.where(self.greedy[rows], point, lp)

    def probs(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """``p`` of the given rows (all if None) as dense float32 [m, V] rows."""
        every = rows is None
        if every:
            rows = torch.arange(len(self.thr), device=self.thr.device)
        greedy = self.greedy[rows]
        if self.z is not None:
            z = self.z if every else self.z[rows]
            logp = z - self.lse[rows, None]
            thr = self.thr[rows]
            if not (self.uncut or host_all(thr == -torch.inf)):
                logp.masked_fill_(z < thr[:, None], -torch.inf)
            # exp in float32: masses down to 1e-45 survive, and the CDF sums them in float64.
            p = logp.exp_()
            if host_all(~greedy):
                return p
        else:
            p = torch.zeros(len(rows), self.vocab_size, device=self.thr.device)
        # Greedy rows become the point mass at their argmax; the others gain 0 there, exactly.
        p.masked_fill_(greedy[:, None], 0.0)
        return p.scatter_add_(1, self.argmax[rows][:, None], greedy[:, None].to(p.dtype))


def host_all(mask: torch.Tensor) -> bool:
    """``mask.all()`` where it is read without waiting (a host tensor); on a device False, as
    if unknown: the caller then takes the path that is exact either way."""
    return not transfer.reads_wait(mask.device) and bool(mask.all())


def finite_rows(x: torch.Tensor, top: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` with every row whose max ``top`` is not finite (NaN, inf, all -inf) replaced by a
    flat row, and which rows were kept: the caller flags the others, and nothing raises."""
    valid = top.isfinite()
    return (x if host_all(valid) else x.masked_fill(~valid[:, None], 0.0)), valid


def process(logits: torch.Tensor, st: SamplingTensors, candidates: int = CANDIDATES) -> Dist:
    """[R, V] logits (any float dtype) and R rows of transforms -> :class:`Dist`."""
    rows, vocab = logits.shape
    device = logits.device
    st = st.on(device)
    facts, greedy = st.facts(), st.greedy
    x = logits.float()
    top, argmax = max_rows(x)  # the first index among tied maxima
    x, valid = finite_rows(x, top)
    # A flat row's max is 0, first at index 0: what max_rows would give, read without waiting.
    top, argmax = torch.where(valid, top, 0.0), torch.where(valid, argmax, 0)
    inf = torch.full((rows,), -torch.inf, device=device)
    if facts.all_greedy:  # nothing to temper or filter
        return Dist(None, inf, greedy, argmax, vocab, valid, uncut=True)
    # Greedy rows are never read through z; divide them by 1 to keep them finite.
    t = torch.where(greedy, 1.0, st.temperature)
    z = (x - top[:, None]).div_(t[:, None])
    if facts.uncut:  # no cut-off in any row: cutoffs() would find none
        return Dist(z, inf, greedy, argmax, vocab, valid, uncut=True)
    top_k = torch.where(greedy, 0, st.top_k)
    top_p = torch.where(greedy, 1.0, st.top_p)
    min_p = torch.where(greedy, -torch.inf, st.log_min_p)
    thr = cutoffs(z, top_k, top_p, candidates, min_p)
    return Dist(z, thr, greedy, argmax, vocab, valid)


def cutoffs(
    z: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    candidates: int = CANDIDATES,
    log_min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """[R] float32: the smallest kept value of each row of ``z`` (-inf: every cut off)."""
    rows, vocab = z.shape
    thr = torch.full((rows,), -torch.inf, device=z.device)
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, 0)
    m_thr = thr.clone() if log_min_p is None else log_min_p.to(z.device, torch.float32)
    need = ((k > 0) | (top_p < 1) | (m_thr > -torch.inf)).nonzero()[:, 0]
    if len(need) == 0:
        return thr
    if len(need) < rows:
        z, k, top_p, m_thr = z[need], k[need], top_p[need], m_thr[need]
    use_k, use_p = k > 0, top_p < 1
    cut = bool(use_k.any()) or bool((m_thr > -torch.inf).any())  # a min-p or top-k cut
    if not cut:
        # top-p alone: the row's own normaliser, and a cheap test of whether the candidates can
        # hold the nucleus at all (their mass is at most `candidates` times the largest, exp(-lse))
        lse_k = torch.logsumexp(z, dim=-1)
        flat = (candidates * (-lse_k).double().exp() < top_p).nonzero()[:, 0]
        if len(flat) == len(need):  # e.g. a random-weight model: bucket every row directly
            thr[need] = _wide_nucleus(z, torch.full_like(lse_k, -torch.inf), lse_k, top_p)
            return thr
    width = min(vocab, max(candidates, int(k.max())))
    values = topk_rows(z, width)[0]
    k_thr = torch.where(use_k, values.gather(1, (k - 1).clamp(min=0)[:, None])[:, 0], -torch.inf)
    k_thr = torch.maximum(k_thr, m_thr)  # min-p, then top-k of what it left
    if not bool(use_p.any()):
        thr[need] = k_thr
        return thr
    if cut:  # top-p works on the renormalised cut distribution
        lse_k = torch.logsumexp(z.masked_fill(z < k_thr[:, None], -torch.inf), dim=-1)
    zero = torch.zeros(len(need), dtype=torch.float64, device=z.device)
    p_thr, reached = _nucleus(values, k_thr, lse_k, top_p, zero)
    holds_all = (width == vocab) | (values[:, -1] < k_thr)  # every kept value is a candidate
    wide = (use_p & ~reached & ~holds_all).nonzero()[:, 0]
    if len(wide):  # nuclei wider than the candidates
        p_thr[wide] = _wide_nucleus(z[wide], k_thr[wide], lse_k[wide], top_p[wide])
    thr[need] = torch.where(use_p, torch.maximum(k_thr, p_thr), k_thr)
    return thr


def _nucleus(
    values: torch.Tensor,
    k_thr: torch.Tensor,
    lse_k: torch.Tensor,
    top_p: torch.Tensor,
    before: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The top-p cut-off among ``values`` (descending, the next ones of each row after values of
    total mass ``before``), and whether the nucleus closes among them."""
    lead = torch.where(values >= k_thr[:, None], values - lse_k[:, None], -torch.inf)
    mass = lead.double().exp().cumsum(dim=-1) + before[:, None]
    mass_before = torch.cat([before[:, None], mass[:, :-1]], dim=1)
    num_keep = (mass_before < top_p[:, None]).sum(dim=-1).clamp(min=1)
    return values.gather(1, (num_keep - 1)[:, None])[:, 0], mass[:, -1] >= top_p


def _wide_nucleus(
    z: torch.Tensor, k_thr: torch.Tensor, lse_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    """The top-p cut-off of rows whose nucleus is wide, without sorting them.

    Values are bucketed by magnitude (bucket 0 holds the largest), one pass sums each bucket's
    mass, the bucket where the running mass reaches top_p is found, and only its own values
    are sorted. Equal values share a bucket, so the kept set is the full sort's; the masses
    are the same float64 terms summed in another order, which can move the cut-off only where
    a prefix's mass lies within float64 rounding (~1e-15) of top_p.
    """
    rows, vocab = z.shape
    # outside the top-k set: a spare bucket, never summed (None: top-k is off in every row)
    dropped = (z < k_thr[:, None]) if bool((k_thr > -torch.inf).any()) else None
    # z <= 0 with the max at 0; values below -NUCLEUS_SPAN share the last bucket.
    bucket = z.mul(-NUCLEUS_BUCKETS / NUCLEUS_SPAN).floor_().clamp_(max=NUCLEUS_BUCKETS - 1)
    mass = (z - lse_k[:, None]).exp_()
    if dropped is not None:
        bucket.masked_fill_(dropped, NUCLEUS_BUCKETS)
        mass.masked_fill_(dropped, 0.0)
    # Each row's buckets get their own range of one flat index (exact in float32 up to 2^24).
    offsets = torch.arange(rows, device=z.device, dtype=z.dtype)[:, None] * (NUCLEUS_BUCKETS + 1)
    sums = torch.zeros(rows * (NUCLEUS_BUCKETS + 1), dtype=torch.float64, device=z.device)
    sums = sums.index_add_(0, bucket.add(offsets).view(-1).long(), mass.view(-1).double())
    running = sums.view(rows, -1)[:, :-1].cumsum(dim=-1)
    # The first bucket whose running mass reaches top_p (the last one if rounding leaves the
    # total a hair below top_p: the nucleus is then everything kept).
    crossing = (running < top_p[:, None]).sum(dim=-1).clamp(max=NUCLEUS_BUCKETS - 1)
    before = running.gather(1, (crossing - 1).clamp(min=0)[:, None])[:, 0]
    before = before.masked_fill(crossing == 0, 0.0)
    # The crossing bucket's values, sorted descending within each row, padded with -inf.
    flat = (bucket == crossing[:, None].to(bucket.dtype)).view(-1).nonzero()[:, 0]
    vals, row = z.view(-1)[flat], flat // vocab
    order = vals.argsort(descending=True, stable=True)
    order = order[row[order].argsort(stable=True)]
    vals, row = vals[order], row[order]
    counts = torch.bincount(row, minlength=rows)
    pos = torch.arange(len(row), device=z.device) - (counts.cumsum(0) - counts)[row]
    values = torch.full((rows, max(1, int(counts.max()))), -torch.inf, device=z.device)
    values[row, pos] = vals
    return _nucleus(values, k_thr, lse_k, top_p, before)[0]


def logits_to_probs(logits: torch.Tensor, st: SamplingTensors) -> torch.Tensor:
    """[n, V] logits -> [n, V] float32 probabilities (the module docstring's definition)."""
    return process(logits, st).probs()
