"""Coupled sampling: every token is the Gumbel-max of its distribution under noise fixed by
(seed, position), whoever proposed what.

Noise: for request seed s and absolute position i, ``g_i[v]`` are independent standard Gumbel
variables, one per vocabulary entry (:func:`saguaro.sampling.noise.gumbels`); they depend on
nothing else, so they are the same in every process, mode, batch and round.

Target: the token at position i is ``x_i = argmax_{v in S_i} (log p_i(v) + g_i[v])`` over the
support ``S_i`` of the processed distribution (temperature, top-k, top-p). The prefix depends on
``g_<i`` only, so ``g_i`` is independent of it, and by the Gumbel-max identity
``P(x_i = v | prefix) = exp(log p_i(v)) / sum_{S_i} exp(log p_i) = p_i(v)``: exactly the
target's law. Temperature 0 is ``argmax p_i`` (no noise).

Draft: proposes ``s_i = argmax_v (log q_i(v) + g_i[v])`` with the same noise; it matches
``x_i`` with probability at least ``(1 - TV(p, q)) / (1 + TV(p, q))``.

Verify: accept ``s_j`` while ``s_j == x_j``; at the first mismatch commit ``x_j``; after K
acceptances commit ``x_{K+1}``. Every committed token is ``x_i`` given its prefix, so the text is
AR's under the same seed whatever was proposed, and nothing about q is needed: exactness no
longer depends on the draft at all.

Only tokens that can win are given noise: a token whose scaled logit is more than
``GUMBEL_MAX`` below the best perturbed value found so far cannot win (no Gumbel value exceeds
``GUMBEL_MAX``). The search starts from the ``CANDIDATES`` largest logits of a row and falls
back to the whole row only when a token outside them could still win, so the result is the
exact argmax. On the CPU a kernel runs the same search over the whole row with a sharper bound,
one per token from its hash alone (``g_v <= -log(1 - u_v)``, read off the hash's leading
zeros), and takes logarithms only for the few tokens that bound leaves in the race.
"""

from __future__ import annotations

import torch

from saguaro.kernels import build, ops, transfer
from saguaro.sampling.noise import GUMBEL_MAX, Purpose, gumbels
from saguaro.sampling.probs import Dist, SamplingTensors, process
from saguaro.sampling.reduce import argmax_rows, topk_rows
from saguaro.sampling.sampler import draft_support
from saguaro.sampling.verify import VerifyResult, round_rows, verify_greedy

CANDIDATES = 64  # largest logits per row given noise first


def perturbed_argmax(dist: Dist, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """[R] int64: ``argmax_{v kept} (z_v + g(seed, position)[v])`` per row of ``dist``, the
    argmax itself for greedy rows (the first index among tied values).

    On the CPU saguaro's kernel computes it (:func:`saguaro.kernels.ops.gumbel_argmax`, which
    rules out most tokens without computing their noise); elsewhere, or without a C compiler,
    :func:`perturbed_argmax_torch`. The two agree except where two perturbed values of a row
    lie within their logarithms' last-bit rounding of each other."""
    if dist.z is None:
        return dist.argmax
    if not build.serves(dist.z):
        return perturbed_argmax_torch(dist, seeds, positions)
    tokens = dist.argmax.clone()
    r = (~dist.greedy).nonzero()[:, 0]
    if len(r):
        z, thr = (dist.z, dist.thr) if len(r) == len(tokens) else (dist.z[r], dist.thr[r])
        tokens[r] = ops.gumbel_argmax(z, thr, seeds[r], positions[r], Purpose.GUMBEL)
    return tokens


def perturbed_argmax_torch(
    dist: Dist, seeds: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """:func:`perturbed_argmax` in torch's operators, on any device: the search starts from the
    ``CANDIDATES`` largest values of each row (see the module docstring)."""
    if dist.z is None:
        return dist.argmax
    vocab = dist.z.shape[1]
    width = min(CANDIDATES, vocab)
    values, ids = topk_rows(dist.z, width)
    noisy = values.double() + gumbels(seeds[:, None], positions[:, None], ids)
    noisy.masked_fill_(values < dist.thr[:, None], -torch.inf)
    best, col = noisy.max(dim=-1)
    tokens = torch.where(dist.greedy, dist.argmax, ids.gather(1, col[:, None])[:, 0])
    # A token outside the candidates has z <= values[:, -1]; it can only win from there.
    last = values[:, -1]
    open_rows = ~dist.greedy & (last >= dist.thr) & (last.double() + GUMBEL_MAX > best)
    if width == vocab:
        return tokens
    if transfer.reads_wait(dist.z.device):  # every row's full search, kept where it is open
        return torch.where(open_rows, _full_search(dist, seeds, positions), tokens)
    if bool(open_rows.any()):
        r = open_rows.nonzero()[:, 0]
        tokens[r] = _full_search(dist, seeds, positions, r)
    return tokens


def _full_search(
    dist: Dist, seeds: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """The perturbed argmax of ``rows`` (all if None) over every kept token."""
    z = dist.z if rows is None else dist.z[rows]
    thr = dist.thr if rows is None else dist.thr[rows]
    if rows is not None:
        seeds, positions = seeds[rows], positions[rows]
    columns = torch.arange(z.shape[1], device=z.device)[None]
    full = z.double() + gumbels(seeds[:, None], positions[:, None], columns)
    full.masked_fill_(z < thr[:, None], -torch.inf)
    return argmax_rows(full)


def propose_coupled(
    logits: torch.Tensor,
    st: SamplingTensors,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    top_m: int,
) -> tuple[torch.Tensor, None]:
    """Draft proposals: the perturbed argmax of the draft's top-M distribution at each row's
    position, with the target's noise. No q: verification does not need it."""
    return ranked_proposals(logits, st, seeds, positions, top_m)[:, 0], None


def ranked_proposals(
    logits: torch.Tensor,
    st: SamplingTensors,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    top_m: int,
) -> torch.Tensor:
    """[R, M] token ids of the draft's top-M support ranked by perturbed value (greedy rows: by
    logit), best first; tokens outside top-k / top-p come last. SSD ranks the outcomes it
    prepares by this order: greedy speculation on perturbed logits."""
    greedy, argmax, ids, z, kept = draft_support(logits, st, top_m)
    if z is None:
        return ids
    noisy = z.double() + gumbels(seeds[:, None], positions[:, None], ids)
    noisy = torch.where(greedy[:, None], z.double(), noisy).masked_fill_(~kept, -torch.inf)
    order = noisy.argsort(dim=-1, descending=True, stable=True)
    ranked = ids.gather(1, order)
    ranked[:, 0] = torch.where(greedy, argmax, ranked[:, 0])  # the lowest index among ties
    return ranked


def verify_coupled(
    logits: torch.Tensor,
    st: SamplingTensors,
    draft_tokens: torch.Tensor,
    num_draft: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> VerifyResult:
    """Coupled verification of one round; arguments as :func:`saguaro.sampling.verify.verify`
    without q. Each scored row is processed at most once: at a mismatch the target's token
    there is the recovery token."""
    n, k_max = draft_tokens.shape
    device = logits.device
    rows = round_rows(logits, draft_tokens, num_draft, rows)
    if st.all_greedy():  # no noise: the target's token is each row's argmax
        return verify_greedy(logits, draft_tokens, num_draft, rows, stop_at_non_finite=True)
    st = st.on(device)
    valid = torch.arange(k_max, device=device) < num_draft[:, None]
    s = torch.where(valid, draft_tokens, -1)
    pos = positions[:, None] + torch.arange(k_max + 1, device=device)
    if transfer.reads_wait(device):
        return _coupled_at_once(logits, st, rows, s, seeds, pos)
    return _coupled_lazily(logits, st, rows, s, seeds, pos)


def _coupled_lazily(
    logits: torch.Tensor,
    st: SamplingTensors,
    rows: torch.Tensor,
    s: torch.Tensor,
    seeds: torch.Tensor,
    pos: torch.Tensor,
) -> VerifyResult:
    """Position by position, for the sequences whose target token there is not known yet (on
    the host, where reading which are is free); ``s`` is -1 past each sequence's proposals."""
    n, k_max = s.shape
    device = logits.device
    num_accepted = torch.zeros(n, dtype=torch.int64, device=device)
    next_token = torch.zeros(n, dtype=torch.int64, device=device)
    invalid = torch.zeros(n, dtype=torch.bool, device=device)
    live = torch.arange(n, device=device)
    for j in range(k_max + 1):
        if len(live) == 0:
            break
        dist = process(logits[rows[live, j]], st.index(live))
        x = perturbed_argmax(dist, seeds[live], pos[live, j])
        invalid[live] = ~dist.valid
        matched = dist.valid & (x == s[live, j]) if j < k_max else torch.zeros_like(dist.valid)
        stop = live[~matched]
        next_token[stop] = torch.where(dist.valid[~matched], x[~matched], 0)
        live = live[matched]
        num_accepted[live] += 1
    return VerifyResult(num_accepted, next_token, invalid)


def _coupled_at_once(
    logits: torch.Tensor,
    st: SamplingTensors,
    rows: torch.Tensor,
    s: torch.Tensor,
    seeds: torch.Tensor,
    pos: torch.Tensor,
) -> VerifyResult:
    """:func:`_coupled_lazily` with every position's target token computed at once, as a GPU
    does it (no reads): k is the leading run of valid rows whose token is the proposal, and the
    stop row's token (0 where it is not valid) the next one. A row's perturbed argmax depends
    on its logits, seed and position alone, so the outcome is the lazy one's."""
    n, k_max = s.shape
    width = k_max + 1
    dist = process(logits[rows.reshape(-1)], st.repeat_interleave(width))
    x = perturbed_argmax(dist, seeds.repeat_interleave(width), pos.reshape(-1)).view(n, width)
    ok = dist.valid.view(n, width)
    matched = ok[:, :k_max] & (x[:, :k_max] == s)
    num_accepted = matched.long().cumprod(dim=1).sum(dim=1)
    at = num_accepted[:, None]
    stop_ok, stop_x = ok.gather(1, at)[:, 0], x.gather(1, at)[:, 0]
    return VerifyResult(num_accepted, torch.where(stop_ok, stop_x, 0), ~stop_ok)
