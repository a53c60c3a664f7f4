"""Lossless verification: the committed tokens must follow the target's law exactly (DESIGN §3).

Distribution checks run many independent rows in one vectorised call (one generator for the
batch) and compare histograms with the exact target law within ``tests.stats`` noise floors.
"""

import pytest
import torch

from saguaro.sampling import SamplingParams, SamplingTensors, logits_to_probs, sample, verify
from tests.stats import assert_samples_follow, tv_distance, tv_noise_floor

V = 8
N = 200_000


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
    g = seeded(seed)
    s = draws(q, n, g)
    res = verify(
        p.expand(n, 2, -1),
        s[:, None],
        None if point_mass else q.expand(n, 1, -1),
        torch.ones(n, dtype=torch.long),
        g,
    )
    return torch.where(res.num_accepted > 0, s, res.next_token)


@pytest.mark.parametrize("name", list(cases()))
def test_first_committed_token_follows_target(name):
    p, q, point_mass = cases()[name]
    tokens = first_committed(p, q, point_mass)
    assert_samples_follow(tokens, p, name)
    if name == "greedy_target":
        assert bool((tokens == p.argmax()).all())


@pytest.mark.parametrize("wrong_rule", ["greedy_acceptance", "resample_from_p"])
def test_known_wrong_verifiers_are_caught(wrong_rule):
    """Power check: the same test rejects the biased rules DESIGN §11 warns about."""
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


def test_mixed_rows_in_one_batch():
    """All cases share one K=2 batch with different num_draft, point-mass rows whose
    draft_probs are NaN (must be ignored) and -1 padding; each keeps the target's law."""
    n, k = 40_000, 2
    targets, tokens, drafts, nums, pms = [], [], [], [], []
    g = seeded(3)
    for i, (p, q, point_mass) in enumerate(cases().values()):
        num = i % (k + 1)
        s = draws(q, n * k, g).view(n, k)
        s[:, num:] = -1
        targets.append(p.expand(n, k + 1, -1))
        tokens.append(s)
        drafts.append(torch.full((n, k, V), torch.nan) if point_mass else q.expand(n, k, -1))
        nums.append(torch.full((n,), num))
        pms.append(torch.full((n,), point_mass))
    res = verify(
        torch.cat(targets), torch.cat(tokens), torch.cat(drafts), torch.cat(nums), g, torch.cat(pms)
    )
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
        draft_probs = None
    else:
        q1, q2 = draft
        s1 = draws(q1, n, g)
        s2 = sample(q2[s1], g)
        draft_probs = torch.stack([q1.expand(n, -1), q2[s1]], dim=1)
    target = torch.stack([p1.expand(n, -1), p2[s1], p3.expand(n, -1)], dim=1)
    res = verify(target, torch.stack([s1, s2], 1), draft_probs, torch.full((n,), 2), g)
    k, t = res.num_accepted, res.next_token

    # Rows that accept nothing commit only x1 = t; their x2 comes from the next round.
    empty = torch.empty(n, 0, dtype=torch.long)
    nxt = verify(p2[t][:, None], empty, None, torch.zeros(n, dtype=torch.long), g)
    x1 = torch.where(k >= 1, s1, t)
    x2 = torch.where(k >= 2, s2, torch.where(k == 1, t, nxt.next_token))
    assert_samples_follow(x1 * vocab + x2, (p1[:, None] * p2).flatten(), f"{kind}: (x1, x2)")
    assert_samples_follow(t[k == 2], p3, f"{kind}: bonus token")
    assert all(int((k == i).sum()) > n // 10 for i in range(3))  # every outcome is exercised


def test_num_draft_zero_samples_first_target_distribution():
    p, q, _ = cases()["random"]
    tokens = torch.full((N, 2), -1)  # pure padding
    res = verify(
        p.expand(N, 3, -1), tokens, q.expand(N, 2, -1), torch.zeros(N, dtype=torch.long), seeded(6)
    )
    assert bool((res.num_accepted == 0).all())
    assert_samples_follow(res.next_token, p, "num_draft=0")


def greedy_batch():
    k = 3
    z = torch.randn(5, k + 1, V, generator=seeded(7))
    st = SamplingTensors.from_params([SamplingParams(temperature=0)]).repeat_interleave(5 * (k + 1))
    p = logits_to_probs(z.view(-1, V), st).view(5, k + 1, V)
    a = z.argmax(-1)
    s = a[:, :k].clone()
    s[1, 0] = (a[1, 0] + 1) % V  # mismatch at position 1
    s[2, 1] = (a[2, 1] + 1) % V  # mismatch at position 2
    s[3, 1:] = -1  # num_draft = 1
    num = torch.tensor([3, 3, 3, 1, 0])
    return p, s, num, a


@pytest.mark.parametrize("point_mass", [False, True])
def test_greedy_target_accepts_while_equal_to_argmax(point_mass):
    p, s, num, a = greedy_batch()
    q = torch.softmax(torch.randn(5, 3, V, generator=seeded(8)), -1)  # a non-greedy draft
    gens = [seeded(i) for i in range(5)]
    states = [g.get_state() for g in gens]
    res = verify(p, s, None if point_mass else q, num, gens)
    assert res.num_accepted.tolist() == [3, 0, 1, 1, 0]
    stop = res.num_accepted.tolist()
    assert res.next_token.tolist() == [int(a[i, j]) for i, j in enumerate(stop)]
    for g, state in zip(gens, states, strict=True):
        assert torch.equal(g.get_state(), state), "greedy rows must draw no randomness"


def test_rejected_token_is_never_the_recovery_token():
    n, k = 50_000, 2
    p, q, _ = cases()["random"]
    g = seeded(9)
    s = draws(q, n * k, g).view(n, k)
    point_mass = torch.arange(n) % 2 == 0
    num = torch.full((n,), k)
    res = verify(p.expand(n, k + 1, -1), s, q.expand(n, k, -1), num, g, point_mass)
    rejected = res.num_accepted < num
    assert int(rejected.sum()) > n // 4
    s_at_stop = s.gather(1, res.num_accepted.clamp(max=k - 1)[:, None])[:, 0]
    assert not bool((res.next_token == s_at_stop)[rejected].any())


def test_zero_mass_residual_falls_back_to_p_without_the_rejected_token():
    # q >= p everywhere (q = 1.01 p, unnormalised): a rejection leaves max(0, p - q) == 0.
    p, _, _ = cases()["random"]
    s = draws(p, N, seeded(10))
    res = verify(
        p.expand(N, 2, -1),
        s[:, None],
        (1.01 * p).expand(N, 1, -1),
        torch.ones(N, dtype=torch.long),
        seeded(11),
    )
    rejected = res.num_accepted == 0
    assert int(rejected.sum()) > 500
    assert not bool((res.next_token == s)[rejected].any())
    assert bool((p[res.next_token] > 0).all())


def random_rows(n: int, k: int):
    """A varied batch: draft / point-mass / greedy rows with num_draft in 0..k."""
    g = seeded(12)
    z = torch.randn(n, k + 1, V, generator=g)
    params = [SamplingParams(temperature=0.0 if i % 4 == 3 else 1.0) for i in range(n)]
    st = SamplingTensors.from_params(params).repeat_interleave(k + 1)
    p = logits_to_probs(z.view(-1, V), st).view(n, k + 1, V)
    q = torch.softmax(torch.randn(n, k, V, generator=g), -1)
    s = sample(q.reshape(-1, V), g).view(n, k)
    num = torch.arange(n) % (k + 1)
    point_mass = torch.arange(n) % 3 == 1
    return p, s, q, num, point_mass


def test_seeded_rows_are_independent_of_the_batch():
    n, k = 16, 3
    p, s, q, num, pm = random_rows(n, k)
    alone = []
    for i in range(n):
        d = int(num[i])
        r = verify(
            p[i : i + 1, : d + 1],
            s[i : i + 1, :d],
            q[i : i + 1, :d],
            num[i : i + 1],
            [seeded(100 + i)],
            pm[i : i + 1],
        )
        alone.append((int(r.num_accepted), int(r.next_token)))
    # In the batch: padding after num_draft, a non-one-hot p beyond the scored positions.
    p_pad = p.clone()
    scored = torch.arange(k + 1) <= num[:, None]
    p_pad[~scored] = 1 / V
    s_pad = torch.where(torch.arange(k) < num[:, None], s, -1)
    batched = verify(p_pad, s_pad, q, num, [seeded(100 + i) for i in range(n)], pm)
    assert batched.num_accepted.tolist() == [k for k, _ in alone]
    assert batched.next_token.tolist() == [t for _, t in alone]


def test_fixed_randomness_per_row_and_reproducible():
    n, k = 16, 3
    p, s, q, num, pm = random_rows(n, k)
    gens = [seeded(200 + i) for i in range(n)]
    first = verify(p, s, q, num, gens, pm)
    greedy = torch.arange(n) % 4 == 3
    for i, g in enumerate(gens):
        ref = seeded(200 + i)
        if not greedy[i]:
            torch.rand(int(num[i]) + 1, generator=ref)  # num_draft acceptance tests + final sample
        assert torch.equal(g.get_state(), ref.get_state()), i
    again = verify(p, s, q, num, [seeded(200 + i) for i in range(n)], pm)
    assert torch.equal(first.num_accepted, again.num_accepted)
    assert torch.equal(first.next_token, again.next_token)
    outcomes = set()
    for seed in range(20):
        r = verify(p, s, q, num, [seeded(seed * n + i) for i in range(n)], pm)
        outcomes.add(tuple(r.next_token.tolist()))
    assert len(outcomes) > 1


def test_shape_validation():
    p = torch.full((2, 3, V), 1 / V)
    s = torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="draft_tokens"):
        verify(p, s[:, :1], None, torch.ones(2, dtype=torch.long), None)
    with pytest.raises(ValueError, match="draft_probs"):
        verify(p, s, p, torch.ones(2, dtype=torch.long), None)
    with pytest.raises(ValueError, match="num_draft"):
        verify(p, s, None, torch.tensor([0, 3]), None)
