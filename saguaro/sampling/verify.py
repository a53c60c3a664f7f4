"""Lossless verification of speculated tokens.

Rule, per sequence: for j = 1..num_draft accept ``s_j`` with probability
``min(1, p_j(s_j) / q_j(s_j))``; at the first rejection draw ``t ~ norm(max(0, p_j - q_j))``;
if all were accepted draw the bonus ``t ~ p_{num_draft+1}``.

Why the committed tokens are distributed exactly as the target's: at one position, with
``s ~ q`` and ``m = min(p, q)``,

    P(commit x) = q(x) * min(1, p(x)/q(x)) + P(reject) * max(0, p(x) - q(x)) / Z
                = m(x) + (1 - sum m) * (p(x) - m(x)) / (1 - sum m)  =  p(x),

because ``Z = sum max(0, p - q) = sum (p - m) = 1 - sum m = P(reject)``. The uniforms that
decide position i are independent of the prefix (:mod:`saguaro.sampling.noise`) and ``p_{j+1}``,
``q_{j+1}`` are conditioned on the same committed prefix ``s_1..s_j``, so by induction the
committed sequence has the target's joint law; the bonus token is an ordinary sample of
``p_{K+1}`` given the accepted prefix. The identity holds for any ``q`` that ``s`` really was drawn
from, including a point mass ``q = delta(s)``: accept with ``p(s)``, else draw from ``p`` with
``s`` removed (this is ``max(0, p - delta(s))``). A rejected token is never recovered: rejection
implies ``q(s) > p(s)``, so its residual mass is 0.

Numerics that keep it exact on confident rows and large vocabularies:

* The test is ``log u + log q(s) < log p(s)`` with ``u`` in (0, 1): equal to ``u < p(s)/q(s)``,
  and ``log p`` comes from the log-sum-exp of the scaled logits, so a token of probability 1e-30
  is accepted at rate 1e-30 / q(s) even where a float32 softmax rounds its row to one-hot.
  Only temperature 0 is greedy; a row that merely looks one-hot is sampled like any other.
* Temperature 0 is the same rule with ``p`` the point mass at the argmax: ``log p(s)`` is 0 or
  ``-inf``, so the row accepts while ``s_j == argmax p_j`` and then commits the argmax.
* A row is processed only when its test can matter (the sequence accepted everything before
  it); the residual and the final draw touch one row per sequence, the one at its stop
  position, sampled through a CDF summed in float64
  (:func:`saguaro.sampling.sampler.inverse_cdf`; a draw from ``p`` itself, on the CPU, in one
  pass per row of saguaro's kernel: :func:`draw_from_p`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from saguaro.kernels import build, ops, transfer
from saguaro.sampling.noise import Purpose, uniforms
from saguaro.sampling.probs import Dist, SamplingTensors, host_all, process
from saguaro.sampling.reduce import max_rows
from saguaro.sampling.sampler import inverse_cdf
from saguaro.sampling.sparse import SparseQ


@dataclass
class VerifyResult:
    num_accepted: torch.Tensor  # [n] int64, k in 0..num_draft[i]
    next_token: torch.Tensor  # [n] int64, recovery token (k < num_draft) or bonus token
    # [n] bool: the logits that decide the sequence were not a distribution (NaN, inf, all
    # -inf); its outcome is meaningless and the caller must fail that sequence alone.
    invalid: torch.Tensor


def round_rows(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    rows: torch.Tensor | None,
) -> torch.Tensor:
    """Check a round's shapes; ``rows`` [n, K+1], built sequence-major when None."""
    n, k_max = draft_tokens.shape
    if rows is None:
        if logits.shape[0] != n * (k_max + 1):
            raise ValueError(f"logits must have n*(K+1)={n * (k_max + 1)} rows without `rows`")
        rows = torch.arange(n * (k_max + 1), device=logits.device).view(n, k_max + 1)
    if rows.shape != (n, k_max + 1):
        raise ValueError(f"rows must be [{n}, {k_max + 1}], got {list(rows.shape)}")
    if num_draft.shape != (n,):
        raise ValueError(f"num_draft must be [{n}], got {list(num_draft.shape)}")
    # The values are checked where they are on the host (a few ints, not tensor reductions). On
    # a GPU reading them would make the host wait for the device; the engine's counts are in
    # range by construction (K is the largest of them).
    if num_draft.device.type == "cpu":
        counts = num_draft.tolist()
        if any(c < 0 or c > k_max for c in counts):
            raise ValueError(f"num_draft must be in 0..{k_max}, got {counts}")
    return rows


def verify(
    logits: torch.Tensor,
    st: SamplingTensors,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    draft_q: SparseQ | None = None,
    rows: torch.Tensor | None = None,
) -> VerifyResult:
    """Verify one round of speculation for n sequences; see the module docstring for the math.

    Args:
        logits: [R, V] the target's logits for the scored positions of all sequences.
        st: the n sequences' sampling transforms (they define each ``p_j``).
        draft_tokens: [n, K] int64, s_1..s_K; entries at or after ``num_draft[i]`` are padding.
        num_draft: [n] int64 in 0..K, the number of real proposals of sequence i.
        seeds: [n] int64 noise keys (:func:`saguaro.sampling.noise.seed_tensor`).
        positions: [n] int64, the absolute position of s_1 (the sequence's length before the
            round); position j of the round decides token ``positions + j - 1``.
        draft_q: [n, K, M] the exact q each s_j was drawn from; None: every proposal is a point
            mass (greedy draft, n-gram lookup).
        rows: [n, K+1] int64, the logits row scoring position j of sequence i; rows past
            ``num_draft[i] + 1`` are never read but must index a row of the same sequence.
            None: ``logits`` is [n * (K+1), V] in sequence-major order.

    Nothing is drawn from a stream: the uniforms are functions of (seed, position, purpose), so
    a sequence's outcome is the same in any batch.
    """
    rows = round_rows(logits, draft_tokens, num_draft, rows)
    if st.all_greedy():
        return verify_greedy(logits, draft_tokens, num_draft, rows)
    return verify_general(logits, st, draft_tokens, num_draft, seeds, positions, draft_q, rows)


def verify_general(
    logits: torch.Tensor,
    st: SamplingTensors,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    draft_q: SparseQ | None,
    rows: torch.Tensor,
) -> VerifyResult:
    """:func:`verify` for any mix of rows (greedy and sampled), ``rows`` checked."""
    n, k_max = draft_tokens.shape
    device = logits.device
    if draft_q is not None and draft_q.ids.shape[:2] != (n, k_max):
        raise ValueError(f"draft_q must be [{n}, {k_max}, M], got {list(draft_q.ids.shape)}")
    st = st.on(device)
    seq = torch.arange(n, device=device)
    valid = torch.arange(k_max, device=device) < num_draft[:, None]  # [n, K]
    s = torch.where(valid, draft_tokens, 0)  # padding may be any value (e.g. -1)
    log_q = torch.zeros(n, k_max, dtype=torch.float64, device=device)
    if draft_q is not None:
        log_q = draft_q.prob_of(s).log()
    pos = positions[:, None] + torch.arange(k_max + 1, device=device)  # [n, K+1]
    log_u = uniforms(seeds[:, None], pos[:, :k_max], Purpose.ACCEPT).log()
    accept, draw = (
        (accepted_at_once, draw_after_round_at_once)
        if transfer.reads_wait(device)
        else (accepted_lazily, draw_after_round)
    )
    num_accepted = accept(logits, st, rows, s, valid, log_u + log_q)
    stop_rows = rows[seq, num_accepted]
    if len(stop_rows) == len(logits) and host_all(stop_rows == seq):
        stop_logits = logits  # e.g. AR on the host: the stop rows are all the rows, in order
    else:
        stop_logits = logits[stop_rows]
    dist = process(stop_logits, st)  # p at each sequence's stop position
    if dist.z is None:  # every row greedy: no randomness, no distribution to build
        return VerifyResult(num_accepted, dist.argmax, ~dist.valid)
    u = uniforms(seeds, pos[seq, num_accepted], Purpose.SAMPLE)
    if k_max == 0:  # AR: nothing to reject, each token a draw from p (known without a read)
        sampled, mass = draw_from_p(dist, seq, u)
    else:
        sampled, mass = draw(dist, u, num_accepted, num_draft, s, draft_q)
    invalid = ~dist.valid | ~mass.isfinite() | (mass <= 0)
    return VerifyResult(num_accepted, torch.where(invalid, 0, sampled), invalid)


def accepted_lazily(
    logits: torch.Tensor,
    st: SamplingTensors,
    rows: torch.Tensor,
    s: torch.Tensor,
    valid: torch.Tensor,
    log_uq: torch.Tensor,
) -> torch.Tensor:
    """[n] accepted counts k, position by position, processing a position's row only for the
    sequences that accepted everything before it (on the host, where reading which did is
    free). ``log_uq`` is ``log u + log q(s)`` [n, K]."""
    n, k_max = s.shape
    num_accepted = torch.zeros(n, dtype=torch.int64, device=logits.device)
    live = torch.arange(n, device=logits.device)[valid[:, 0]] if k_max else num_accepted[:0]
    for j in range(k_max):
        if len(live) == 0:
            break
        dist = process(logits[rows[live, j]], st.index(live))
        ok = log_uq[live, j] < dist.log_prob(
            torch.arange(len(live), device=live.device), s[live, j]
        )
        live = live[ok]
        num_accepted[live] += 1
        live = live[valid[live, j + 1]] if j + 1 < k_max else live[:0]
    return num_accepted


def accepted_at_once(
    logits: torch.Tensor,
    st: SamplingTensors,
    rows: torch.Tensor,
    s: torch.Tensor,
    valid: torch.Tensor,
    log_uq: torch.Tensor,
) -> torch.Tensor:
    """:func:`accepted_lazily` with every position's test made at once, as a GPU does it (no
    reads): k is the length of the leading run of accepted positions, the same count, since a
    position after the first rejection never adds to it."""
    n, k_max = s.shape
    flat = torch.arange(n * k_max, device=logits.device)
    dist = process(logits[rows[:, :k_max].reshape(-1)], st.repeat_interleave(k_max))
    log_p = dist.log_prob(flat, s.reshape(-1)).view(n, k_max)
    ok = (log_uq < log_p) & valid
    return ok.long().cumprod(dim=1).sum(dim=1)


def draw_after_round_at_once(
    dist: Dist,
    u: torch.Tensor,
    num_accepted: torch.Tensor,
    num_draft: torch.Tensor,
    s: torch.Tensor,
    draft_q: SparseQ | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`draw_after_round` with both draws made for every sequence and each one's kept:
    the residual of a sequence that rejected nothing is built and dropped."""
    n, k_max = s.shape
    seq = torch.arange(n, device=u.device)
    k = num_accepted.clamp(max=k_max - 1)
    plain, plain_mass = draw_from_p(dist, seq, u)
    recovered, recovered_mass = dense_draw(residuals(dist, seq, s[seq, k], draft_q, k), u)
    rejected = num_accepted < num_draft
    sampled = torch.where(rejected, recovered, plain)
    return sampled, torch.where(rejected, recovered_mass, plain_mass)


def draw_after_round(
    dist: Dist,
    u: torch.Tensor,
    num_accepted: torch.Tensor,
    num_draft: torch.Tensor,
    s: torch.Tensor,
    draft_q: SparseQ | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's token at its stop position and its row's total mass: the bonus token (a
    draw from p) where every proposal was accepted, else a draw from the residual."""
    n = len(num_accepted)
    rejected = num_accepted < num_draft
    sampled = torch.zeros(n, dtype=torch.int64, device=u.device)
    mass = torch.zeros(n, dtype=torch.float64, device=u.device)
    plain = (~rejected).nonzero()[:, 0]
    sampled[plain], mass[plain] = draw_from_p(dist, plain, u[plain])
    r = rejected.nonzero()[:, 0]
    if len(r):
        target = residuals(dist, r, s[r, num_accepted[r]], draft_q, num_accepted[r])
        sampled[r], mass[r] = dense_draw(target, u[r])
    return sampled, mass


def dense_draw(target: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF draws from the dense weights ``target`` [m, V] by ``u`` [m], and each row's
    total weight (float64)."""
    return inverse_cdf(target, u), target.sum(dim=-1).double()


def draw_from_p(
    dist: Dist, rows: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF draws from ``p`` at ``rows`` of ``dist`` by the uniforms ``u``, and each
    row's total mass before normalising (float64). On the CPU saguaro's kernel sums the CDF of
    ``exp(z)`` over the kept tokens in one pass per row (:func:`saguaro.kernels.ops.sample_rows`):
    the same distribution as the dense ``p`` of :meth:`Dist.probs`, normalised by the search
    instead of by ``lse``, without building a ``[rows, V]`` block."""
    if dist.z is None or not build.serves(dist.z):
        return dense_draw(dist.probs(rows), u)
    tokens = dist.argmax[rows].clone()
    mass = torch.ones(len(rows), dtype=torch.float64)
    sampled = ~dist.greedy[rows]  # greedy rows are their argmax
    if bool(sampled.any()):
        sub = rows[sampled]
        tokens[sampled], mass[sampled] = ops.sample_rows(dist.z[sub], dist.thr[sub], u[sampled])
    return tokens, mass


def residuals(
    dist: Dist,
    rows: torch.Tensor,
    rejected: torch.Tensor,
    draft_q: SparseQ | None,
    k: torch.Tensor,
) -> torch.Tensor:
    """The recovery distributions ``max(0, p - q)`` at ``rows`` of ``dist`` (dense float32, not
    normalised), where proposal ``rejected`` [m], drawn from ``draft_q[row's sequence, k]``, was
    rejected (a point mass where ``draft_q`` is None)."""
    target = dist.probs(rows)
    if draft_q is None:  # point masses: the residual is p without s
        target[torch.arange(len(rows)), rejected] = 0
        return target
    q_r = draft_q[rows, k]
    residual = target.clone().scatter_add_(1, q_r.ids, -q_r.normalised().float())
    residual.clamp_(min=0)
    # Zero residual mass needs p <= q everywhere, i.e. p == q up to rounding. Fall back to p
    # without the rejected token, keeping the invariant "s_j is never recovered".
    empty = residual.sum(dim=-1) <= 0
    target[torch.arange(len(rows), device=target.device), rejected] = 0
    return torch.where(empty[:, None], target, residual)


def verify_greedy(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    rows: torch.Tensor,
    stop_at_non_finite: bool = False,
) -> VerifyResult:
    """:func:`verify` when every sequence is at temperature 0, in one pass over the logits.

    Each ``p_j`` is the point mass at ``a_j = argmax_j``, so ``log p_j(s_j)`` is 0 or ``-inf``
    and the test ``log u + log q(s_j) < log p_j(s_j)`` passes exactly when ``s_j == a_j``
    (whatever ``q``: ``log u < 0``). A sequence accepts the longest prefix with
    ``s_j == a_j`` and commits ``a`` at its stop position: nothing is random, and the rows after
    a rejection, which :func:`verify` never reads, change nothing here either. A row whose max
    is not finite counts as :func:`~saguaro.sampling.probs.process` counts it: argmax 0, and
    the sequence is invalid if it is its stop row. With ``stop_at_non_finite`` such a row never
    accepts, so it is always the stop row (coupled verification's rule).

    After the row reduction everything is a handful of ``[n, K]`` integers, decided in NumPy
    on the host: a round's worth of PyTorch operators on tensors this small costs more than the
    reduction (each pays its dispatch, and right after a forward, cold caches). The results
    return on the logits' device. On a GPU the same decisions run there instead
    (:func:`_verify_greedy_on_device`): every copy to the host would make it wait for the GPU.
    """
    if logits.device.type == "cuda":
        return _verify_greedy_on_device(logits, draft_tokens, num_draft, rows, stop_at_non_finite)
    n, k_max = draft_tokens.shape
    top, best = max_rows(logits)  # the first index among tied maxima, as process() takes it
    finite = np.isfinite(top.float().cpu().numpy())  # NumPy has no bfloat16
    best = np.where(finite, best.cpu().numpy(), 0)
    row = rows.cpu().numpy()
    valid = np.arange(k_max) < num_draft.cpu().numpy()[:, None]  # [n, K]
    match = (draft_tokens.cpu().numpy() == best[row[:, :k_max]]) & valid
    if stop_at_non_finite:
        match &= finite[row[:, :k_max]]
    num_accepted = np.cumprod(match, axis=1).sum(axis=1, dtype=np.int64)
    stop_rows = row[np.arange(n), num_accepted]
    out = (num_accepted, best[stop_rows], ~finite[stop_rows])
    return VerifyResult(*(torch.from_numpy(x).to(logits.device) for x in out))


def _verify_greedy_on_device(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    rows: torch.Tensor,
    stop_at_non_finite: bool,
) -> VerifyResult:
    """:func:`verify_greedy`'s decisions as tensor operators where the tensors are, nothing
    read back: the same accepted prefix (the cumulative product of the matches), the same stop
    row, argmax 0 and invalid where a row's max is not finite."""
    k_max = draft_tokens.shape[1]
    top, best = max_rows(logits)
    finite = torch.isfinite(top)
    best = torch.where(finite, best, torch.zeros_like(best))
    scored = rows[:, :k_max]
    valid = torch.arange(k_max, device=rows.device) < num_draft[:, None]
    match = (draft_tokens == best[scored]) & valid
    if stop_at_non_finite:
        match &= finite[scored]
    num_accepted = match.to(torch.int64).cumprod(dim=1).sum(dim=1)
    stop_rows = rows.gather(1, num_accepted[:, None])[:, 0]
    return VerifyResult(num_accepted, best[stop_rows], ~finite[stop_rows])
