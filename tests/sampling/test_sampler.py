import pytest
import torch

from saguaro.sampling import sample
from saguaro.sampling.sampler import draw_uniforms, inverse_cdf
from tests.stats import assert_samples_follow, tv_distance, tv_noise_floor

N = 200_000  # draws for vectorised distribution checks


def random_probs(vocab: int, seed: int, zeros: tuple[int, ...] = ()) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(vocab, generator=g) * 1.5, dim=-1)
    p[list(zeros)] = 0
    return p / p.sum()


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_inverse_cdf_edges_skip_zero_mass_tokens():
    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]] * 3)
    u = torch.tensor([0.0, 0.3, 1 - 2**-24])
    assert inverse_cdf(probs, u).tolist() == [1, 3, 3]


def test_distribution_matches_probs_vectorised():
    p = random_probs(10, seed=0)
    assert_samples_follow(sample(p.expand(N, -1), seeded(1)), p, "single generator")


def test_distribution_matches_probs_per_row_generators():
    n = 20_000  # the per-row path loops in Python; the noise floor widens accordingly
    p = random_probs(10, seed=2)
    gens = [seeded(1000 + i) for i in range(n)]
    assert_samples_follow(sample(p.expand(n, -1), gens), p, "per-row generators")


def test_never_returns_zero_probability_tokens():
    p = random_probs(12, seed=3, zeros=(0, 4, 5, 11))
    p[7] = 1e-30  # tiny but positive: may appear, must not be skipped as "zero" either
    p /= p.sum()
    tokens = sample(p.expand(N, -1), seeded(4))
    assert bool((p[tokens] > 0).all())
    tokens = sample(p.expand(500, -1), [seeded(i) for i in range(500)])
    assert bool((p[tokens] > 0).all())


def test_seeded_row_is_independent_of_batch():
    target = random_probs(10, seed=5)
    alone_gen = seeded(1234)
    alone = [int(sample(target[None], [alone_gen])[0]) for _ in range(200)]

    batch = torch.stack(
        [
            random_probs(10, seed=6),
            torch.nn.functional.one_hot(torch.tensor(3), 10).float(),  # greedy row
            target,
            random_probs(10, seed=7),
            target,
        ]
    )
    gens = [seeded(1), seeded(2), seeded(1234), None, seeded(99)]
    greedy_state = gens[1].get_state()
    rows = torch.stack([sample(batch, gens) for _ in range(200)])
    assert rows[:, 2].tolist() == alone
    assert rows[:, 4].tolist() != alone  # same probs, other seed
    assert rows[:, 1].tolist() == [3] * 200
    assert torch.equal(gens[1].get_state(), greedy_state)  # one-hot rows draw nothing


def test_one_draw_per_non_greedy_row():
    g, ref = seeded(8), seeded(8)
    sample(random_probs(6, seed=9)[None], [g])
    torch.rand(1, generator=ref)
    assert torch.equal(g.get_state(), ref.get_state())


def test_draw_uniforms_per_row_counts_and_validation():
    u = draw_uniforms([seeded(0), None, seeded(0)], [3, 0, 1], 4, torch.device("cpu"))
    assert u[1].tolist() == [0, 0, 0, 0]
    assert u[0, 0] == u[2, 0] and u[0, 3] == 0 and u[2, 1:].tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="generators"):
        draw_uniforms([seeded(0)], [1, 1], 1, torch.device("cpu"))


@pytest.mark.parametrize(("vocab", "num_samples"), [(8, N), (10, N), (36, 300_000), (8, 100_000)])
def test_tv_check_has_power(vocab, num_samples):
    """Self-test of tests/stats.py: moving 2% of the mass is caught at the sizes these tests use."""
    p = random_probs(vocab, seed=10)
    biased = p.clone()
    biased[p.argmax()] -= 0.02
    biased[p.argmin()] += 0.02
    counts = torch.bincount(sample(biased.expand(num_samples, -1), seeded(11)), minlength=vocab)
    floor = tv_noise_floor(vocab, num_samples)
    assert tv_distance(counts, p) > floor
    counts = torch.bincount(sample(p.expand(num_samples, -1), seeded(11)), minlength=vocab)
    assert tv_distance(counts, p) <= floor
