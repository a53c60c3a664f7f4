import pytest
import torch

from saguaro.sampling import SamplingParams, SamplingTensors, logits_to_probs, saguaro_probs
from tests.sampling.test_verify import first_committed, probs_under
from tests.stats import assert_samples_follow


def batch(n: int = 4, vocab: int = 10, seed: int = 0, **params):
    z = torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed)) * 2
    return z, SamplingTensors.from_params([SamplingParams(**params)] * n)


def test_c_one_is_plain_probs():
    z, st = batch(top_k=6, top_p=0.9, temperature=0.8)
    assert torch.equal(saguaro_probs(z, st, 3, 1.0), logits_to_probs(z, st))


@pytest.mark.parametrize("fanout", [0, 2, torch.tensor([0, 1, 3, 9])])
def test_top_f_plus_1_mass_is_scaled_by_c(fanout):
    z, st = batch(temperature=1.3)
    c = 0.3
    q = logits_to_probs(z, st)
    sigma = saguaro_probs(z, st, fanout, c)
    f = torch.as_tensor(fanout).expand(4)
    for i in range(4):
        top = q[i].argsort(descending=True)[: int(f[i]) + 1]
        expected = q[i].clone()
        expected[top] *= c
        torch.testing.assert_close(sigma[i], expected / expected.sum())
    assert torch.allclose(sigma.sum(-1), torch.ones(4))


def test_ranking_uses_transformed_probs_and_keeps_truncation():
    z, st = batch(top_k=4)
    q = logits_to_probs(z, st)
    sigma = saguaro_probs(z, st, 1, 0.5)
    assert torch.equal(sigma > 0, q > 0)
    # Fanout covering the whole support scales everything: sigma == q.
    torch.testing.assert_close(saguaro_probs(z, st, 3, 0.5), q)


def test_greedy_rows_unchanged():
    z, _ = batch()
    st = SamplingTensors.from_params(
        [
            SamplingParams(temperature=0),
            SamplingParams(),
            SamplingParams(temperature=0),
            SamplingParams(),
        ]
    )
    sigma = saguaro_probs(z, st, torch.tensor([0, 1, 2, 3]), 0.2)
    q = logits_to_probs(z, st)
    assert torch.equal(sigma[[0, 2]], q[[0, 2]])
    assert not torch.equal(sigma[1], q[1])


@pytest.mark.parametrize("c", [0.0, -0.5, 1.5, float("nan")])
def test_invalid_c(c):
    z, st = batch()
    with pytest.raises(ValueError, match="c must be in"):
        saguaro_probs(z, st, 1, c)


def test_invalid_fanout():
    z, st = batch()
    with pytest.raises(ValueError, match="fanout"):
        saguaro_probs(z, st, -1, 0.5)


def test_more_rejections_land_on_the_drafts_top_tokens():
    """Sigma's purpose: P(reject, t in the draft's top F+1) = sum_top max(0, p - sigma) grows."""
    z, st = batch(n=1)
    p = logits_to_probs(z + torch.randn(z.shape, generator=torch.Generator().manual_seed(1)), st)
    top = logits_to_probs(z, st)[0].argsort(descending=True)[:3]

    def reject_into_top(c: float) -> float:
        return float((p - saguaro_probs(z, st, 2, c)).clamp(min=0)[0, top].sum())

    assert reject_into_top(0.3) > reject_into_top(1.0) + 0.05


def test_verification_with_saguaro_proposal_is_exact():
    zt = torch.randn(8, generator=torch.Generator().manual_seed(2)) * 1.5
    zd = zt + torch.randn(8, generator=torch.Generator().manual_seed(3))
    p = probs_under(zt, temperature=0.9, top_p=0.95)
    st = SamplingTensors.from_params([SamplingParams(temperature=1.1)])
    q = saguaro_probs(zd[None], st, 2, 0.3)[0]
    assert_samples_follow(first_committed(p, q, point_mass=False), p, "saguaro q, C=0.3")
