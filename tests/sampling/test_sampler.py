"""Inverse-CDF draws, the draft's top-M proposals and the counter-based noise behind both."""

import pytest
import torch

from saguaro.sampling import (
    Purpose,
    SamplingParams,
    SamplingTensors,
    SparseQ,
    inverse_cdf,
    logits_to_probs,
    propose,
    seed_tensor,
    uniforms,
)
from saguaro.sampling.noise import GOLDEN, MASK64, MIX1, MIX2, hash_words, hash_words_torch
from tests.stats import assert_samples_follow, tv_distance, tv_noise_floor

N = 200_000  # draws for vectorised distribution checks


def random_probs(vocab: int, seed: int, zeros: tuple[int, ...] = ()) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(vocab, generator=g) * 1.5, dim=-1)
    p[list(zeros)] = 0
    return p / p.sum()


def dense(q: SparseQ, vocab: int) -> torch.Tensor:
    """[n, M] pairs -> [n, V] float64 distributions."""
    out = torch.zeros(*q.ids.shape[:-1], vocab, dtype=torch.float64)
    return out.scatter_add_(-1, q.ids, q.normalised())


# ---- noise ---------------------------------------------------------------------------------


def _mix(x: int) -> int:
    x = ((x ^ (x >> 30)) * MIX1) & MASK64
    x = ((x ^ (x >> 27)) * MIX2) & MASK64
    return x ^ (x >> 31)


@pytest.mark.parametrize("words", [hash_words, hash_words_torch], ids=["kernel", "torch"])
def test_hash_matches_python_integers(words):
    """The kernel's unsigned arithmetic and torch's wrapping int64 arithmetic both compute the
    unsigned 64-bit hash, with and without a vocabulary column, broadcast."""
    seeds = [0, 1, 2**63 - 1, 2**63, 2**64 - 1, 987654321987654321]
    positions = [0, 1, 5, 2**40, 131_071, 7]
    columns = [0, 3, 151_935]
    got = words(seed_tensor(seeds), torch.tensor(positions), Purpose.SAMPLE).tolist()
    folded = words(
        seed_tensor(seeds)[:, None], torch.tensor(positions)[:, None], Purpose.GUMBEL,
        torch.tensor(columns)[None],
    ).tolist()  # fmt: skip
    for i, (seed, pos) in enumerate(zip(seeds, positions, strict=True)):
        key = _mix((seed + GOLDEN) & MASK64)
        key = _mix((key + pos * GOLDEN) & MASK64)
        assert got[i] & MASK64 == _mix((key + int(Purpose.SAMPLE) * GOLDEN) & MASK64)
        key = _mix((key + int(Purpose.GUMBEL) * GOLDEN) & MASK64)
        assert [w & MASK64 for w in folded[i]] == [
            _mix((key + c * GOLDEN) & MASK64) for c in columns
        ]


def test_noise_keys_on_two_devices_are_hashed_on_the_accelerator():
    """An SSD worker on a GPU ranks its candidates with positions built on the host and token ids
    where the logits are: the hash runs where the non-host input is (the meta device stands in
    for a GPU here: an operator mixing it with host tensors raises, as CUDA's do)."""
    seeds, positions, columns = (
        seed_tensor([1, 2])[:, None],
        torch.tensor([[3], [4]]),
        torch.arange(5),
    )
    for on_meta in ("positions", "columns"):
        args = dict(seeds=seeds, positions=positions, columns=columns[None])
        args[on_meta] = args[on_meta].to("meta")
        words = hash_words(purpose=Purpose.GUMBEL, **args)
        assert words.device.type == "meta" and words.shape == (2, 5)


def test_uniforms_are_uniform_and_independent_across_keys():
    n = 200_000
    seeds = seed_tensor(list(range(n)))
    u = uniforms(seeds, torch.tensor(17), Purpose.ACCEPT)
    assert 0 < float(u.min()) and float(u.max()) < 1
    bins = torch.bucketize(u, torch.linspace(0, 1, 33)[1:-1])
    assert_samples_follow(bins, torch.full((32,), 1 / 32), "uniform bins")
    others = [
        uniforms(seeds, torch.tensor(18), Purpose.ACCEPT),  # next position
        uniforms(seeds, torch.tensor(17), Purpose.SAMPLE),  # other purpose
        uniforms(seeds + 1, torch.tensor(17), Purpose.ACCEPT),  # neighbouring seed
    ]
    for v in others:
        corr = float(torch.corrcoef(torch.stack([u, v]))[0, 1])
        assert abs(corr) < 5 / n**0.5  # about 5 standard errors of a zero correlation
    # 2-d uniformity of pairs (the joint law, not just the correlation): a 6x6 grid
    cells = (u * 6).long() * 6 + (others[1] * 6).long()
    assert_samples_follow(cells, torch.full((36,), 1 / 36), "pairs (ACCEPT, SAMPLE)")


def test_uniforms_depend_only_on_their_key():
    a = uniforms(seed_tensor([5, 6, 7]), torch.tensor([10, 20, 30]), Purpose.DRAFT)
    b = uniforms(seed_tensor([7, 5]), torch.tensor([30, 10]), Purpose.DRAFT)
    assert a[2] == b[0] and a[0] == b[1]


# ---- inverse CDF ----------------------------------------------------------------------------


def test_inverse_cdf_edges_skip_zero_mass_tokens():
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]] * 3)
    u = torch.tensor([1e-12, 0.31, 1 - 2**-53], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [1, 3, 3]


def test_inverse_cdf_follows_probs_and_never_draws_zero_mass():
    p = random_probs(12, seed=3, zeros=(0, 4, 5, 11))
    p[7] = 1e-30  # tiny but positive: may appear, must not be skipped as "zero" either
    p /= p.sum()
    u = uniforms(seed_tensor(list(range(N))), torch.tensor(0), Purpose.SAMPLE)
    tokens = inverse_cdf(p.expand(N, -1), u)
    assert bool((p[tokens] > 0).all())
    assert_samples_follow(tokens, p, "inverse cdf")


@pytest.mark.parametrize(("vocab", "num_samples"), [(8, N), (10, N), (36, 300_000), (64, N)])
def test_tv_check_has_power(vocab, num_samples):
    """Self-test of tests/stats.py: moving 2% of the mass is caught at the sizes these tests use."""
    p = random_probs(vocab, seed=10)
    biased = p.clone()
    biased[p.argmax()] -= 0.02
    biased[p.argmin()] += 0.02
    u = uniforms(seed_tensor(list(range(num_samples))), torch.tensor(0), Purpose.SAMPLE)
    floor = tv_noise_floor(vocab, num_samples)
    counts = torch.bincount(inverse_cdf(biased.expand(num_samples, -1), u), minlength=vocab)
    assert tv_distance(counts, p) > floor
    counts = torch.bincount(inverse_cdf(p.expand(num_samples, -1), u), minlength=vocab)
    assert tv_distance(counts, p) <= floor


# ---- draft proposals ------------------------------------------------------------------------


def draw(z: torch.Tensor, params: SamplingParams, n: int = N, **kw):
    """n proposals from the single logits row ``z``, seed i for row i."""
    st = SamplingTensors.from_params([params] * n)
    seeds, pos = seed_tensor(list(range(n))), torch.full((n,), 3)
    return propose(z.expand(n, -1).contiguous(), st, seeds, pos, **kw)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8),
        SamplingParams(temperature=1.2, top_k=5),
        SamplingParams(temperature=0.9, top_p=0.8),
    ],
)
def test_proposals_follow_the_q_they_report(params):
    """With M >= V, q is the processed distribution; with M < V, its top-M renormalised; the
    tokens follow the q that is shipped with them either way."""
    vocab = 20
    z = torch.randn(vocab, generator=torch.Generator().manual_seed(4)) * 2
    full = logits_to_probs(z[None], SamplingTensors.from_params([params]))[0].double()
    tokens, q = draw(z, params, top_m=64)
    torch.testing.assert_close(dense(q[:1], vocab)[0], full, rtol=1e-6, atol=1e-7)
    assert_samples_follow(tokens, full, f"{params} M>=V")
    tokens, q = draw(z, params, top_m=3)
    top = full.argsort(descending=True)[:3]
    truncated = torch.zeros_like(full)
    truncated[top] = full[top] / full[top].sum()
    torch.testing.assert_close(dense(q[:1], vocab)[0], truncated, rtol=1e-6, atol=1e-7)
    assert_samples_follow(tokens, truncated, f"{params} M=3")


def test_greedy_rows_are_point_masses_at_the_argmax():
    z = torch.tensor([[0.0, 2.0, 2.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    st = SamplingTensors.from_params([SamplingParams(temperature=0), SamplingParams()])
    tokens, q = propose(z, st, seed_tensor([1, 2]), torch.tensor([0, 0]), top_m=3)
    assert int(tokens[0]) == 1  # lowest index among tied maxima
    assert q.ids[0, 0] == 1 and q.probs[0].tolist() == [1, 0, 0]
    assert int(tokens[1]) in q.ids[1].tolist() and float(q.probs[1].sum()) == pytest.approx(1)


def test_proposals_depend_only_on_seed_and_position():
    z = torch.randn(6, 30, generator=torch.Generator().manual_seed(5))
    st = SamplingTensors.from_params([SamplingParams(temperature=1.5)] * 6)
    seeds, pos = seed_tensor([9, 9, 9, 4, 4, 1]), torch.tensor([3, 3, 4, 3, 3, 3])
    tokens, _ = propose(z, st, seeds, pos)
    order = torch.tensor([5, 2, 0, 4, 1, 3])
    shuffled, _ = propose(z[order], st.index(order), seeds[order], pos[order])
    assert torch.equal(shuffled, tokens[order])


def test_non_finite_draft_rows_still_give_a_valid_q():
    """A broken draft row (NaN, inf) must not poison verification: any q is exact, so it
    proposes from a flat q over its top-M and reports exactly that q."""
    z = torch.randn(3, 30, generator=torch.Generator().manual_seed(6))
    z[0, 4] = torch.nan
    z[1, 7] = torch.inf
    st = SamplingTensors.from_params([SamplingParams(temperature=0.9, top_p=0.9)] * 3)
    tokens, q = propose(z, st, seed_tensor([1, 2, 3]), torch.zeros(3, dtype=torch.long), 8)
    assert bool(q.probs.isfinite().all()) and torch.allclose(
        q.normalised().sum(-1), torch.ones(3, dtype=torch.float64)
    )
    assert all(int(t) in ids for t, ids in zip(tokens, q.ids.tolist(), strict=True))
