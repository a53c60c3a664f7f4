"""Drawing tokens: inverse-CDF sampling in float64, and the draft's top-M proposals.

Every draw maps one counter-based uniform (:mod:`saguaro.sampling.noise`) through a row's CDF.
The CDF is accumulated in float64, so a token of mass m is drawn at rate m to within about
``V * 2^-53`` of the row's total: at a 150k vocabulary, masses far below 1e-8 keep their rate
(a float32 CDF loses any token lighter than ~6e-8 behind a mass near 1).
"""

from __future__ import annotations

import torch

from saguaro.kernels.transfer import upload
from saguaro.sampling.noise import Purpose, uniforms
from saguaro.sampling.probs import SamplingTensors, cutoffs, finite_rows
from saguaro.sampling.reduce import argmax_rows, topk_rows
from saguaro.sampling.saguaro import saguaro_weights
from saguaro.sampling.sparse import SparseQ

DEFAULT_TOP_M = 256  # draft support sampled and shipped per position (docs/bench/draft-top-m)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[n, W] non-negative weights (need not be normalised), [n] float64 uniforms in (0, 1) ->
    [n] int64 column: the first j with ``cdf_j > u * cdf_W``, the CDF summed in float64.

    A zero-weight column can never be that first index (its cdf equals its predecessor's), and
    ``u * cdf_W`` is clamped below ``cdf_W`` so rounding cannot step past the last column.
    """
    cdf = weights.cumsum(dim=-1, dtype=torch.float64)
    total = cdf[:, -1:]
    x = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, x, right=True)[:, 0].clamp(max=weights.shape[1] - 1)


def draft_support(
    logits: torch.Tensor, st: SamplingTensors, top_m: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The draft's processed distribution restricted to its M most likely tokens.

    Returns ``greedy`` [R], ``argmax`` [R], and over the top-M: ``ids`` [R, M] (descending),
    their scaled logits ``z`` (0 at the max) and ``kept`` (inside top-k / top-p); ``z`` is None
    when every row is greedy. Rows whose logits are not finite are read as flat rows: a broken
    draft row must still give a valid proposal (any proposal is exact).
    """
    rows, vocab = logits.shape
    device = logits.device
    st = st.on(device)
    greedy = st.greedy
    logits = finite_rows(logits, logits.amax(dim=-1))[0]
    argmax = argmax_rows(logits)
    if st.all_greedy():
        return greedy, argmax, argmax[:, None], None, greedy[:, None]
    x = logits.float()
    values, ids = topk_rows(x, min(top_m, vocab))
    t = torch.where(greedy, 1.0, st.temperature)[:, None]
    z = (values - values[:, :1]) / t
    top_k, top_p, min_p = st.top_k, st.top_p, st.log_min_p
    thr = torch.full((rows,), -torch.inf, device=device)
    cut = ~greedy & (((top_k > 0) & (top_k < vocab)) | (top_p < 1) | (min_p > -torch.inf))
    if not st.facts().uncut and bool(cut.any()):  # the cut-offs need the full row's mass
        r = cut.nonzero()[:, 0]
        thr[r] = cutoffs((x[r] - values[r, :1]) / t[r], top_k[r], top_p[r], log_min_p=min_p[r])
    return greedy, argmax, ids, z, z >= thr[:, None]


def propose(
    logits: torch.Tensor,
    st: SamplingTensors,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    top_m: int = DEFAULT_TOP_M,
    fanout: torch.Tensor | int = 0,
    saguaro_c: float = 1.0,
) -> tuple[torch.Tensor, SparseQ]:
    """Draft proposals for R rows: tokens [R] and the exact q [R, M] each was drawn from.

    q is the row's processed distribution (temperature, min-p, top-k, top-p: :mod:`.probs`)
    restricted to its M most likely tokens and renormalised, then reweighted by Saguaro sampling
    (``fanout`` F per row, constant ``saguaro_c``). Greedy rows are the point mass at the argmax.
    Each token is drawn with ``u(seed, position, DRAFT)``: the position is that of the token.
    """
    greedy, argmax, ids, z, kept = draft_support(logits, st, top_m)
    if z is None:
        return argmax, SparseQ.point_mass(argmax)
    device = logits.device
    weights = torch.where(kept, z.exp(), 0.0)
    weights = saguaro_weights(weights, kept, fanout, saguaro_c)
    probs = weights / weights.sum(dim=-1, keepdim=True)
    point = SparseQ.point_mass(argmax, ids.shape[1])
    ids = torch.where(greedy[:, None], point.ids, ids)
    probs = torch.where(greedy[:, None], point.probs, probs)
    seeds, positions = upload([seeds, positions.to(seeds.dtype)], device)
    u = uniforms(seeds, positions, Purpose.DRAFT)
    col = inverse_cdf(probs, u)
    tokens = torch.where(greedy, argmax, ids.gather(1, col[:, None])[:, 0])
    return tokens, SparseQ(ids, probs)
