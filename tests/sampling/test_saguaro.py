"""Saguaro sampling on the draft's top-M support: what it scales, and that it stays exact."""

import pytest
import torch

from saguaro.sampling import SamplingParams, SamplingTensors, propose, saguaro_weights, seed_tensor
from tests.sampling.test_sampler import dense
from tests.sampling.test_verify import first_committed, probs_under
from tests.stats import assert_samples_follow

VOCAB = 10


def q_of(z: torch.Tensor, fanout, c: float, top_m: int = 64, **params) -> torch.Tensor:
    """[n, V] dense sigma for logits ``z`` [n, V]."""
    st = SamplingTensors.from_params([SamplingParams(**params)] * len(z))
    n = len(z)
    _, q = propose(z, st, seed_tensor(list(range(n))), torch.zeros(n), top_m, fanout, c)
    return dense(q, z.shape[1])


def batch(n: int = 4, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def test_c_one_is_plain_q():
    z = batch()
    params = dict(top_k=6, top_p=0.9, temperature=0.8)
    torch.testing.assert_close(q_of(z, 3, 1.0, **params), q_of(z, 0, 1.0, **params))


@pytest.mark.parametrize("fanout", [0, 2, torch.tensor([0, 1, 3, 9])])
def test_top_f_plus_1_mass_is_scaled_by_c(fanout):
    z, c = batch(), 0.3
    q = q_of(z, 0, 1.0, temperature=1.3)
    sigma = q_of(z, fanout, c, temperature=1.3)
    f = torch.as_tensor(fanout).expand(4)
    for i in range(4):
        top = q[i].argsort(descending=True)[: int(f[i]) + 1]
        expected = q[i].clone()
        expected[top] *= c
        torch.testing.assert_close(sigma[i], expected / expected.sum())


def test_fanout_covering_the_support_leaves_q_unchanged():
    z = batch()
    q = q_of(z, 0, 1.0, top_k=4)
    sigma = q_of(z, 1, 0.5, top_k=4)
    assert torch.equal(sigma > 0, q > 0) and not torch.allclose(sigma, q)
    torch.testing.assert_close(q_of(z, 3, 0.5, top_k=4), q)  # F+1 = 4 = the support
    torch.testing.assert_close(q_of(z, 5, 0.5, top_m=4), q_of(z, 0, 1.0, top_m=4))


def test_greedy_rows_unchanged():
    z = batch()
    st = SamplingTensors.from_params([SamplingParams(temperature=t) for t in (0, 1, 0, 1)])
    args = (z, st, seed_tensor([0, 1, 2, 3]), torch.zeros(4), 64)
    _, sigma = propose(*args, torch.tensor([0, 1, 2, 3]), 0.2)
    _, q = propose(*args, 0, 1.0)
    assert torch.equal(dense(sigma, VOCAB)[[0, 2]], dense(q, VOCAB)[[0, 2]])
    assert not torch.equal(dense(sigma, VOCAB)[1], dense(q, VOCAB)[1])


@pytest.mark.parametrize("c", [0.0, -0.5, 1.5, float("nan")])
def test_invalid_c(c):
    with pytest.raises(ValueError, match="c must be in"):
        saguaro_weights(torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool), 1, c)


def test_invalid_fanout():
    with pytest.raises(ValueError, match="fanout"):
        saguaro_weights(torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool), -1, 0.5)


def test_more_rejections_land_on_the_drafts_top_tokens():
    """Sigma's purpose: P(reject, t in the draft's top F+1) = sum_top max(0, p - sigma) grows."""
    z = batch(n=1)
    p = torch.softmax(z + torch.randn(z.shape, generator=torch.Generator().manual_seed(1)), -1)
    top = q_of(z, 0, 1.0)[0].argsort(descending=True)[:3]

    def reject_into_top(c: float) -> float:
        return float((p.double() - q_of(z, 2, c)).clamp(min=0)[0, top].sum())

    assert reject_into_top(0.3) > reject_into_top(1.0) + 0.05


def test_verification_with_saguaro_proposal_is_exact():
    zt = torch.randn(8, generator=torch.Generator().manual_seed(2)) * 1.5
    zd = zt + torch.randn(8, generator=torch.Generator().manual_seed(3))
    p = probs_under(zt, temperature=0.9, top_p=0.95)
    q = q_of(zd[None], 2, 0.3, temperature=1.1)[0].float()
    assert_samples_follow(first_committed(p, q, point_mass=False), p, "saguaro q, C=0.3")
