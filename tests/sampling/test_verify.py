"""Lossless verification: the committed tokens must follow the target's law exactly.

Distribution checks run many independent rows in one vectorised call: row i carries seed i, so
its uniforms are independent of every other row's. Draft tokens come from torch's own sampler,
independent of the code under test. Histograms are compared with the exact target law within
``tests.stats`` noise floors.
"""

import math

import pytest
import torch

from saguaro.kernels import build, ops, transfer
from saguaro.sampling import (
    SamplingParams,
    SamplingTensors,
    SparseQ,
    inverse_cdf,
    logits_to_probs,
    process,
    verify,
)
from saguaro.sampling.noise import seed_tensor
from saguaro.sampling.probs import UNKNOWN
from saguaro.sampling.verify import _verify_greedy_on_device as on_device
from saguaro.sampling.verify import verify_general, verify_greedy
from tests.stats import assert_samples_follow, tv_distance, tv_noise_floor

V = 8
N = 200_000
PLAIN = SamplingParams()  # temperature 1, no truncation: p = softmax(logits)


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def logits(seed: int, vocab: int = V) -> torch.Tensor:
    return torch.randn(vocab, generator=seeded(seed)) * 1.5


def probs_under(z: torch.Tensor, **params) -> torch.Tensor:
    """The [V] distribution ``z`` gives under ``SamplingParams(**params)``."""
    return logits_to_probs(z[None], SamplingTensors.from_params([SamplingParams(**params)]))[0]


def with_zeros(p: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    p = p.clone()
    p[tokens] = 0
    return p / p.sum()


def one_hot(token: int, vocab: int = V) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token), vocab).float()


def dense_q(q: torch.Tensor) -> SparseQ:
    """A full-vocabulary q as (id, prob) pairs; ``q`` is [..., V]."""
    ids = torch.arange(q.shape[-1]).expand(q.shape).contiguous()
    return SparseQ(ids, q.contiguous())


def run(
    p: torch.Tensor,
    s: torch.Tensor,
    q: torch.Tensor | SparseQ | None,
    num: torch.Tensor,
    seed0: int = 0,
    params: SamplingParams = PLAIN,
):
    """Verify n rows whose target distributions are ``p`` [n, K+1, V] (as log-probabilities
    under ``params``); row i uses seed ``seed0 + i`` at position 100."""
    n, k1, vocab = p.shape
    q = dense_q(q) if isinstance(q, torch.Tensor) else q
    return verify(
        p.log().reshape(n * k1, vocab),
        SamplingTensors.from_params([params] * n),
        s,
        num,
        seed_tensor(list(range(seed0, seed0 + n))),
        torch.full((n,), 100),
        q,
    )


def cases() -> dict[str, tuple[torch.Tensor, torch.Tensor, bool]]:
    """name -> (p, q, point_mass). Tokens are drawn from q; for point-mass cases the verifier is
    told q = delta(s), which is exact for any way of choosing s independent of the target."""
    zt, zd = logits(0), logits(1)
    p, q = probs_under(zt), probs_under(zd)
    return {
        "random": (p, q, False),
        "q_zero_where_p_positive": (p, with_zeros(q, [0, 1, 2]), False),
        "p_zero_where_q_positive": (with_zeros(p, [5, 6]), q, False),
        "disjoint_support": (with_zeros(p, [4, 5, 6, 7]), with_zeros(q, [0, 1, 2, 3]), False),
        "identical": (p, p, False),
        "truncated_target": (
            probs_under(zt, temperature=0.8, top_k=5, top_p=0.8),
            probs_under(zt + logits(2) / 3, temperature=1.3),
            False,
        ),
        "draft_hotter": (probs_under(zt, temperature=0.6), probs_under(zt, temperature=1.7), False),
        "greedy_target": (probs_under(zt, temperature=0), q, False),
        "greedy_draft": (p, probs_under(zd, temperature=0), False),
        "point_mass_random": (p, torch.full((V,), 1 / V), True),
        "point_mass_argmax": (p, one_hot(int(p.argmax())), True),
        "point_mass_zero_p": (with_zeros(p, [5, 6]), one_hot(5), True),
    }


def draws(q: torch.Tensor, n: int, g: torch.Generator) -> torch.Tensor:
    """n test proposals from q (torch's own sampler, independent of the code under test)."""
    return torch.multinomial(q, n, replacement=True, generator=g)


def first_committed(
    p: torch.Tensor, q: torch.Tensor, point_mass: bool, n: int = N, seed: int = 0
) -> torch.Tensor:
    """One K=1 round on n independent rows: s ~ q, verify against p; the first committed token."""
    s = draws(q, n, seeded(seed))
    res = run(
        p.expand(n, 2, -1),
        s[:, None],
        None if point_mass else q.expand(n, 1, -1),
        torch.ones(n, dtype=torch.long),
        seed0=seed * n,
    )
    return torch.where(res.num_accepted > 0, s, res.next_token)


def first_token_of_round(
    z: torch.Tensor, params: SamplingParams, s: torch.Tensor, q: torch.Tensor
) -> torch.Tensor:
    """One K=1 round per proposal in ``s`` (drawn from ``q``), against logits ``z`` under
    ``params``, row i with seed i: the first committed token of each."""
    n = len(s)
    res = verify(
        z.expand(2 * n, -1).contiguous(),
        SamplingTensors.from_params([params] * n),
        s[:, None],
        torch.ones(n, dtype=torch.long),
        seed_tensor(list(range(n))),
        torch.zeros(n, dtype=torch.long),
        dense_q(q.expand(n, 1, -1)),
    )
    return torch.where(res.num_accepted > 0, s, res.next_token)


@pytest.mark.parametrize("name", list(cases()))
def test_first_committed_token_follows_target(name):
    p, q, point_mass = cases()[name]
    tokens = first_committed(p, q, point_mass)
    assert_samples_follow(tokens, p, name)


@pytest.mark.parametrize("wrong_rule", ["greedy_acceptance", "resample_from_p"])
def test_known_wrong_verifiers_are_caught(wrong_rule):
    """Power check: the same test rejects biased rules (greedy acceptance at T > 0, and a
    rejection followed by a draw from p instead of the residual)."""
    p, q, _ = cases()["random"]
    g = seeded(0)
    s = draws(q, N, g)
    if wrong_rule == "greedy_acceptance":
        accept = s == p.argmax()
    else:
        accept = torch.rand(N, generator=g) * q[s] < p[s]
    tokens = torch.where(accept, s, draws(p, N, g))
    counts = torch.bincount(tokens, minlength=V)
    assert tv_distance(counts, p) > tv_noise_floor(V, N)


def test_greedy_target_row_is_its_argmax():
    p, q, _ = cases()["greedy_target"]
    n = 5_000
    s = draws(q, n, seeded(1))
    first = first_token_of_round(logits(0), SamplingParams(temperature=0), s, q)
    assert bool((first == p.argmax()).all())


def test_mixed_rows_in_one_batch():
    """All cases share one K=2 batch with different num_draft, point-mass rows among sampled
    ones and -1 padding; each keeps the target's law."""
    n, k = 40_000, 2
    targets, tokens, qs, nums = [], [], [], []
    g = seeded(3)
    for i, (p, q, point_mass) in enumerate(cases().values()):
        num = i % (k + 1)
        s = draws(q, n * k, g).view(n, k)
        s[:, num:] = -1
        targets.append(p.expand(n, k + 1, -1))
        tokens.append(s)
        rows = SparseQ.point_mass(s.clamp(min=0), V) if point_mass else dense_q(q.expand(n, k, -1))
        qs.append(rows)
        nums.append(torch.full((n,), num))
    q = SparseQ(torch.cat([x.ids for x in qs]), torch.cat([x.probs for x in qs]))
    res = run(torch.cat(targets), torch.cat(tokens), q, torch.cat(nums))
    first = torch.where(res.num_accepted > 0, torch.cat(tokens)[:, 0], res.next_token)
    assert bool((res.num_accepted <= torch.cat(nums)).all())
    for i, (name, (p, _, _)) in enumerate(cases().items()):
        assert_samples_follow(first[i * n : (i + 1) * n], p, f"{name} (mixed batch)")


def two_token_setup(kind: str, vocab: int):
    """Target p_1, p_2(.|x) [V, V], p_3 and a draft q_1, q_2(.|x) near it (None: point mass)."""
    g = seeded(4)
    z1, z2, z3 = (torch.randn(shape, generator=g) for shape in [vocab, (vocab, vocab), vocab])
    d1, d2 = (z + 0.5 * torch.randn(z.shape, generator=g) for z in (z1, z2))
    params = SamplingParams(temperature=0.7, top_k=4, top_p=0.9) if kind == "truncated" else None
    st = SamplingTensors.from_params([params or SamplingParams()])
    p1, p3 = (logits_to_probs(z[None], st)[0] for z in (z1, z3))
    p2 = logits_to_probs(z2, st.repeat_interleave(vocab))
    q1, q2 = torch.softmax(d1, -1), torch.softmax(d2, -1)
    return p1, p2, p3, (None if kind == "point_mass" else (q1, q2))


@pytest.mark.parametrize("kind", ["draft", "truncated", "point_mass"])
def test_first_two_committed_tokens_and_bonus_follow_target(kind):
    """K=2 with p_2 depending on s_1: the joint law of the first two committed tokens must be
    p_1(x1) p_2(x2 | x1); rows that accept both drafts draw the bonus token from p_3."""
    vocab, n = 6, 300_000
    p1, p2, p3, draft = two_token_setup(kind, vocab)
    g = seeded(5)
    if draft is None:  # deterministic proposals: any token, then a fixed function of it
        s1 = draws(p1, n, g)
        s2 = p2[s1].argmax(-1)
        q = None
    else:
        q1, q2 = draft
        s1 = draws(q1, n, g)
        s2 = torch.multinomial(q2[s1], 1, generator=g)[:, 0]
        q = torch.stack([q1.expand(n, -1), q2[s1]], dim=1)
    target = torch.stack([p1.expand(n, -1), p2[s1], p3.expand(n, -1)], dim=1)
    res = run(target, torch.stack([s1, s2], 1), q, torch.full((n,), 2))
    k, t = res.num_accepted, res.next_token

    # Rows that accept nothing commit only x1 = t; their x2 comes from the next round, at the
    # next position with the same seeds.
    empty = torch.empty(n, 0, dtype=torch.long)
    nxt = verify(
        p2[t].log(),
        SamplingTensors.from_params([PLAIN] * n),
        empty,
        torch.zeros(n, dtype=torch.long),
        seed_tensor(list(range(n))),
        torch.full((n,), 101),
    )
    x1 = torch.where(k >= 1, s1, t)
    x2 = torch.where(k >= 2, s2, torch.where(k == 1, t, nxt.next_token))
    assert_samples_follow(x1 * vocab + x2, (p1[:, None] * p2).flatten(), f"{kind}: (x1, x2)")
    assert_samples_follow(t[k == 2], p3, f"{kind}: bonus token")
    assert all(int((k == i).sum()) > n // 10 for i in range(3))  # every outcome is exercised


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "torch"])
def test_num_draft_zero_samples_first_target_distribution(monkeypatch, kernels):
    """AR's draw (no proposals): saguaro's CPU kernels, and torch's dense path that runs
    elsewhere."""
    if not kernels:
        monkeypatch.setattr(build, "available", lambda: False)
    p, q, _ = cases()["random"]
    tokens = torch.full((N, 2), -1)  # pure padding
    res = run(p.expand(N, 3, -1), tokens, q.expand(N, 2, -1), torch.zeros(N, dtype=torch.long))
    assert bool((res.num_accepted == 0).all())
    assert_samples_follow(res.next_token, p, "num_draft=0")


def test_greedy_target_accepts_while_equal_to_argmax():
    k = 3
    z = torch.randn(5, k + 1, V, generator=seeded(7))
    a = z.argmax(-1)
    s = a[:, :k].clone()
    s[1, 0] = (a[1, 0] + 1) % V  # mismatch at position 1
    s[2, 1] = (a[2, 1] + 1) % V  # mismatch at position 2
    s[3, 1:] = -1  # num_draft = 1
    num = torch.tensor([3, 3, 3, 1, 0])
    q = torch.softmax(torch.randn(5, k, V, generator=seeded(8)), -1)  # a non-greedy draft
    for draft_q in (None, dense_q(q)):
        res = verify(
            z.view(-1, V),
            SamplingTensors.from_params([SamplingParams(temperature=0)] * 5),
            s,
            num,
            seed_tensor(list(range(5))),
            torch.zeros(5, dtype=torch.long),
            draft_q,
        )
        assert res.num_accepted.tolist() == [3, 0, 1, 1, 0]
        stop = res.num_accepted.tolist()
        assert res.next_token.tolist() == [int(a[i, j]) for i, j in enumerate(stop)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_q", [False, True])
def test_the_greedy_fast_path_decides_as_the_general_path(with_q, dtype):
    """verify_greedy (every row at T = 0) against verify_general on the same rounds: planted
    prefixes of matches, tied maxima, NaN / inf / all -inf rows at every position, padding, a
    non-greedy draft's q, uneven num_draft and a shuffled row layout; in float32 and in
    bfloat16 (which NumPy, where the fast path decides, does not have). The GPU's variant, whose
    decisions stay on the device, runs here on the CPU's tensors and must decide the same, with
    and without coupled verification's stop at a non-finite row."""
    gen = seeded(11)
    n, k, vocab = 400, 4, 16
    logits = torch.randn(n * (k + 1), vocab, generator=gen).to(dtype)
    logits[::7, 3] = logits.max(-1).values[::7]  # ties: the first index wins in both
    logits[5::11] = torch.nan
    logits[6::13, 2] = torch.inf
    logits[8::17] = -torch.inf
    rows = torch.randperm(n * (k + 1), generator=gen).view(n, k + 1)
    best = logits.max(-1).indices
    planted = torch.randint(0, k + 1, (n,), generator=gen)  # matches before a random token
    s = torch.randint(0, vocab, (n, k), generator=gen)
    for i in range(n):
        s[i, : planted[i]] = best[rows[i, : planted[i]]]
    num = torch.randint(0, k + 1, (n,), generator=gen)
    s[torch.arange(k) >= num[:, None]] = -1
    q = dense_q(torch.softmax(torch.randn(n, k, vocab, generator=gen), -1)) if with_q else None
    st = SamplingTensors.from_params([SamplingParams(temperature=0)] * n)
    seeds, pos = seed_tensor(list(range(n))), torch.zeros(n, dtype=torch.long)
    fast = verify_greedy(logits, s, num, rows)
    general = verify_general(logits, st, s, num, seeds, pos, q, rows)
    assert fast.num_accepted.tolist() == general.num_accepted.tolist()
    assert fast.invalid.tolist() == general.invalid.tolist()
    assert fast.next_token.tolist() == general.next_token.tolist()
    assert bool(fast.invalid.any()) and bool((fast.num_accepted == k).any())  # both kinds ran
    for stop in (False, True):
        want, got = verify_greedy(logits, s, num, rows, stop), on_device(logits, s, num, rows, stop)
        for field in ("num_accepted", "next_token", "invalid"):
            assert getattr(got, field).tolist() == getattr(want, field).tolist(), (stop, field)


def test_rejected_token_is_never_the_recovery_token():
    n, k = 50_000, 2
    p, q, _ = cases()["random"]
    s = draws(q, n * k, seeded(9)).view(n, k)
    point_mass = torch.arange(n) % 2 == 0
    sampled = dense_q(q.expand(n, k, -1))
    pm = SparseQ.point_mass(s, V)
    draft_q = SparseQ(
        torch.where(point_mass[:, None, None], pm.ids, sampled.ids),
        torch.where(point_mass[:, None, None], pm.probs, sampled.probs),
    )
    num = torch.full((n,), k)
    res = run(p.expand(n, k + 1, -1), s, draft_q, num)
    rejected = res.num_accepted < num
    assert int(rejected.sum()) > n // 4
    s_at_stop = s.gather(1, res.num_accepted.clamp(max=k - 1)[:, None])[:, 0]
    assert not bool((res.next_token == s_at_stop)[rejected].any())


def random_rows(n: int, k: int):
    """A varied batch: sampled / point-mass / greedy rows with num_draft in 0..k."""
    g = seeded(12)
    z = torch.randn(n, k + 1, V, generator=g)
    params = [SamplingParams(temperature=0.0 if i % 4 == 3 else 1.0) for i in range(n)]
    q = torch.softmax(torch.randn(n, k, V, generator=g), -1)
    s = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(n, k)
    num = torch.arange(n) % (k + 1)
    point_mass = (torch.arange(n) % 3 == 1)[:, None, None]
    pm, sampled = SparseQ.point_mass(s, V), dense_q(q)
    draft_q = SparseQ(
        torch.where(point_mass, pm.ids, sampled.ids),
        torch.where(point_mass, pm.probs, sampled.probs),
    )
    return z, params, s, draft_q, num


def test_seeded_rows_are_independent_of_the_batch():
    """A sequence alone and inside any batch (other rows, other order, padding) gets the same
    outcome: its uniforms depend only on its seed and positions."""
    n, k = 16, 3
    z, params, s, q, num = random_rows(n, k)
    seeds, positions = list(range(100, 100 + n)), torch.arange(n) * 7

    def one(i: int):
        d = int(num[i])
        r = verify(
            z[i, : d + 1],
            SamplingTensors.from_params([params[i]]),
            s[i : i + 1, :d],
            num[i : i + 1],
            seed_tensor([seeds[i]]),
            positions[i : i + 1],
            q[i : i + 1, :d],
        )
        return int(r.num_accepted), int(r.next_token)

    alone = [one(i) for i in range(n)]
    order = torch.randperm(n, generator=seeded(13))
    s_pad = torch.where(torch.arange(k) < num[:, None], s, -1)
    batched = verify(
        z[order].reshape(-1, V),
        SamplingTensors.from_params([params[i] for i in order]),
        s_pad[order],
        num[order],
        seed_tensor([seeds[i] for i in order]),
        positions[order],
        q[order],
    )
    got = list(zip(batched.num_accepted.tolist(), batched.next_token.tolist(), strict=True))
    assert [got[j] for j in order.argsort().tolist()] == alone
    outcomes = {
        tuple(
            verify(
                z.reshape(-1, V),
                SamplingTensors.from_params(params),
                s,
                num,
                seed_tensor([seed * n + i for i in range(n)]),
                positions,
                q,
            ).next_token.tolist()
        )
        for seed in range(20)
    }
    assert len(outcomes) > 1  # the seed matters


@pytest.mark.parametrize("temperature", [0.3, 0.5, 1.0])
def test_confident_rows_accept_improbable_drafts_at_their_rate(temperature):
    """Rows whose float32 softmax rounds to one-hot are still sampled exactly: a draft token of
    target probability ~1e-9..1e-30 is accepted with probability p/q, i.e. never in 50k tries,
    where a verifier that treats such rows as greedy-with-mass accepts it every time."""
    n, vocab = 50_000, 16
    gap = 20.0 * temperature  # log p(s) = -20 for every non-argmax token, whatever T
    z = torch.zeros(vocab)
    z[3] = gap
    p = torch.softmax(z / temperature, -1)
    assert float(p.max()) == 1.0 and float(p.min()) > 0  # rounds to one-hot, but is not
    params = SamplingParams(temperature=temperature)
    q = torch.full((vocab,), 1 / vocab)
    first = first_token_of_round(z, params, draws(q, n, seeded(14)), q)
    assert bool((first == 3).all()), "committed a token of probability ~2e-9"
    # and a moderately likely token keeps its rate: p(s) = e^-3 / (1 + 15 e^-3) ~ 0.038
    z[3] = 3.0 * temperature
    p = probs_under(z, temperature=temperature)
    assert_samples_follow(first_committed(p, q, False), p, "moderate gap")


def dense_draw(dist, u: float) -> int:
    return int(inverse_cdf(dist.probs(), torch.tensor([u], dtype=torch.float64))[0])


def kernel_draw(dist, u: float) -> int:
    return int(ops.sample_rows(dist.z, dist.thr, torch.tensor([u], dtype=torch.float64))[0][0])


@pytest.mark.parametrize("draw", [dense_draw, kernel_draw], ids=["dense", "kernel"])
def test_150k_vocabulary_tail_token_keeps_its_rate(draw):
    """The last token of a 151,936-token row with mass 1e-8 owns an interval of uniforms of
    length 1e-8 (to 1e-5 relative): the CDF resolves it behind a mass near 1."""
    vocab, tail = 151_936, 1e-8
    p = torch.full((vocab,), 1e-9, dtype=torch.float64)
    p[-1] = tail
    p[0] = 1 - float(p[1:].sum())
    dist = process(p.log().float()[None], SamplingTensors.from_params([PLAIN]))
    probs = dist.probs()
    lo, hi = 0.5, 1.0  # bisect the smallest uniform that draws the last token
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if draw(dist, mid) == vocab - 1 else (mid, hi)
    width = 1 - hi
    expected = float(probs[0, -1]) / float(probs.double().sum())
    assert math.isclose(width, expected, rel_tol=1e-5), (width, expected)
    assert math.isclose(expected, tail, rel_tol=1e-3)
    # Power: a float32 CDF cannot resolve it (the whole tail is one rounding step).
    cdf32 = probs.cumsum(-1)
    assert float(cdf32[0, -1] - cdf32[0, -2]) != pytest.approx(tail, rel=0.5)


@pytest.mark.parametrize("vocab", [5, 1000, 151_936])
def test_the_kernels_draw_is_the_inverse_cdf(vocab):
    """Every uniform inside a token's CDF interval (its middle, away from rounding) draws that
    token, the extremes draw the first and last kept tokens, and a token cut by ``thr`` or at
    -inf is never drawn; the mass is the row's total weight."""
    g = seeded(9)
    z = torch.randn(4, vocab, generator=g) * torch.tensor([0.5, 2.0, 4.0, 1.0])[:, None]
    z[2, ::3] = -torch.inf
    z = z - z.amax(dim=-1, keepdim=True)
    z[:, [0, -1]] = 0.0  # the first and last tokens are kept and heavy: the extremes draw them
    thr = torch.tensor([-torch.inf, -2.0, -torch.inf, -0.7])
    w = torch.where(z >= thr[:, None], z.double().exp(), 0.0)
    cdf, total = w.cumsum(-1), w.sum(-1)
    for r in range(4):
        heavy = (w[r] > 1e-4 * total[r]).nonzero()[:, 0]
        tokens = heavy[torch.randperm(len(heavy), generator=g)[:20]]
        u = (cdf[r, tokens] - w[r, tokens] / 2) / total[r]
        tokens = torch.cat([tokens, torch.tensor([0, vocab - 1])])
        u = torch.cat([u, torch.tensor([2.0**-54, 1 - 2.0**-53], dtype=torch.float64)])
        n = len(u)
        drawn, mass = ops.sample_rows(z[r].expand(n, -1), thr[r].expand(n), u)
        assert drawn.tolist() == tokens.tolist()
        assert torch.allclose(mass, total[r].expand(n), rtol=1e-5)


def test_shape_validation():
    z = torch.zeros(6, V)
    st = SamplingTensors.from_params([PLAIN] * 2)
    s = torch.zeros(2, 2, dtype=torch.long)
    seeds, pos = seed_tensor([0, 1]), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="rows"):
        verify(z[:5], st, s, torch.ones(2, dtype=torch.long), seeds, pos)
    with pytest.raises(ValueError, match="draft_q"):
        verify(z, st, s, torch.ones(2, dtype=torch.long), seeds, pos, dense_q(torch.ones(2, 1, V)))
    with pytest.raises(ValueError, match="num_draft"):
        verify(z, st, s, torch.tensor([0, 3]), seeds, pos)
    with pytest.raises(ValueError, match="num_draft"):
        verify(z, st, s, torch.ones(3, dtype=torch.long), seeds, pos)


DEVICE_PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.8),
    SamplingParams(temperature=0.9, min_p=0.2),
]


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("facts", ["host's", "unknown"])
@pytest.mark.parametrize("params", ["mixed", "temperature only"], ids=str)
def test_the_paths_a_gpu_takes_decide_as_the_hosts(monkeypatch, k, facts, params):
    """On a GPU nothing is read back to choose a path: every check a host tensor answers for
    free (all rows finite, none cut, none greedy) is taken as unknown there, a device copy of
    sampling rows knows what its host rows did, or, indexed on the device, possibly nothing, and
    a round tests every position at once and draws both the bonus and the recovery token of
    every sequence, keeping one. Those paths must decide exactly as the host's: same accepted
    counts, tokens and flags, on rows with NaN, inf and all -inf logits, greedy and sampled
    rows, cut-offs, AR (K = 0) and speculation, point-mass and dense q."""
    n = 40
    z, _, s, q, num = random_rows(n, max(k, 1))
    z, s, q, num = z[:, : k + 1], s[:, :k], q[:, :k], num.clamp(max=k)
    z[3::9, 1 % (k + 1)] = torch.nan
    z[5::11, 0, 2] = torch.inf
    z[7::13, k] = -torch.inf
    mix = DEVICE_PARAMS if params == "mixed" else DEVICE_PARAMS[1:2]
    st = SamplingTensors.from_params([mix[i % len(mix)] for i in range(n)])
    args = (z.reshape(-1, V), st, s, num, seed_tensor(list(range(n))), torch.arange(n) * 3)
    want = verify(*args, q)
    monkeypatch.setattr(transfer, "reads_wait", lambda device: True)
    if facts == "unknown":
        monkeypatch.setattr(SamplingTensors, "facts", lambda self: UNKNOWN)
    got = verify(*args, q)
    for field in ("num_accepted", "next_token", "invalid"):
        assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    assert bool(want.invalid.any()) and not bool(want.invalid.all())
