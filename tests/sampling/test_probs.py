import math

import pytest
import torch

from saguaro.sampling import SamplingParams, SamplingTensors, logits_to_probs


def st_of(**kwargs) -> SamplingTensors:
    return SamplingTensors.from_params([SamplingParams(**kwargs)])


def probs_of(probs: list[float], **kwargs) -> torch.Tensor:
    """Apply the transforms to logits whose softmax is ``probs`` (temperature 1 by default)."""
    return logits_to_probs(torch.tensor([probs]).log(), st_of(**kwargs))[0]


def test_sampling_tensors_from_params_and_repeat():
    st = SamplingTensors.from_params(
        [SamplingParams(temperature=0.5, top_k=-1, top_p=0.9), SamplingParams(temperature=0)]
    )
    assert st.temperature.dtype == torch.float32 and st.top_p.dtype == torch.float32
    assert st.top_k.dtype == torch.int64 and st.top_k.tolist() == [0, 0]
    assert st.greedy.tolist() == [False, True]
    rep = st.repeat_interleave(3)
    assert rep.temperature.tolist() == [0.5] * 3 + [0.0] * 3
    assert rep.greedy.tolist() == [False] * 3 + [True] * 3
    rep = st.repeat_interleave(torch.tensor([1, 2]))
    assert rep.top_p.tolist() == pytest.approx([0.9, 1.0, 1.0])


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_scales_logits(temperature):
    z = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    st = SamplingTensors.from_params([SamplingParams(temperature=temperature)] * 4)
    out = logits_to_probs(z, st)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.softmax(z / temperature, dim=-1))


def test_low_precision_logits_give_float32_probs():
    z = torch.randn(2, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    out = logits_to_probs(z, SamplingTensors.from_params([SamplingParams()] * 2))
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.softmax(z.float(), dim=-1))


def test_greedy_is_one_hot_at_argmax_lowest_index_on_ties():
    z = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 5.0, 5.0, 5.0]])
    out = logits_to_probs(z, SamplingTensors.from_params([SamplingParams(temperature=0)] * 2))
    assert out.tolist() == [[0, 1, 0, 0], [1, 0, 0, 0]]


def test_top_k_keeps_k_largest_renormalised():
    out = probs_of([0.1, 0.4, 0.2, 0.3], top_k=2)
    torch.testing.assert_close(out, torch.tensor([0, 4 / 7, 0, 3 / 7]))
    for k in (0, -1, 4, 100):  # disabled or no-op
        torch.testing.assert_close(
            probs_of([0.1, 0.4, 0.2, 0.3], top_k=k), torch.tensor([0.1, 0.4, 0.2, 0.3])
        )


def test_top_k_keeps_all_ties_at_the_cutoff():
    out = probs_of([0.1, 0.3, 0.3, 0.3], top_k=2)
    torch.testing.assert_close(out, torch.tensor([0, 1 / 3, 1 / 3, 1 / 3]))


@pytest.mark.parametrize(
    ("top_p", "kept"),
    [
        (0.45, [1]),  # the top token (0.5) alone reaches 0.45
        (0.6, [1, 3]),  # 0.5 + 0.25
        (0.8, [1, 3, 0, 4]),  # 0.75 + one 0.1 reaches 0.8; the other 0.1 ties and is kept too
        (0.9, [1, 3, 0, 4]),
        (0.97, [0, 1, 2, 3, 4]),
        (1.0, [0, 1, 2, 3, 4]),
    ],
)
def test_top_p_keeps_smallest_prefix_reaching_p(top_p, kept):
    probs = torch.tensor([0.1, 0.5, 0.05, 0.25, 0.1])
    expected = torch.zeros(5)
    expected[kept] = probs[kept] / probs[kept].sum()
    torch.testing.assert_close(probs_of(probs.tolist(), top_p=top_p), expected)


def test_tiny_top_p_keeps_only_the_argmax():
    out = probs_of([0.2, 0.3, 0.25, 0.25], top_p=1e-9)
    assert out.tolist() == [0, 1, 0, 0]


def test_top_p_applies_to_the_renormalised_top_k_distribution():
    # top-k=2 leaves [4/7, 3/7]; 4/7 >= 0.5 so top-p keeps one token (raw probs need two).
    out = probs_of([0.4, 0.3, 0.2, 0.1], top_k=2, top_p=0.5)
    assert out.tolist() == [1, 0, 0, 0]
    out = probs_of([0.4, 0.3, 0.2, 0.1], top_p=0.5)
    torch.testing.assert_close(out, torch.tensor([4 / 7, 3 / 7, 0, 0]))


def test_rows_with_different_settings_in_one_batch():
    params = [
        SamplingParams(),
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.7, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.6),
        SamplingParams(temperature=0.9, top_k=8, top_p=0.9),
        SamplingParams(top_k=-1, top_p=0.999),
    ]
    z = torch.randn(len(params), 40, generator=torch.Generator().manual_seed(2)) * 2
    batched = logits_to_probs(z, SamplingTensors.from_params(params))
    for i, p in enumerate(params):
        alone = logits_to_probs(z[i : i + 1], SamplingTensors.from_params([p]))[0]
        torch.testing.assert_close(batched[i], alone, rtol=0, atol=0)
        assert math.isclose(float(batched[i].sum()), 1.0, abs_tol=1e-5)
    assert (batched[2] > 0).sum() == 5
    assert (batched[4] > 0).sum() <= 8


def test_minus_inf_logits_stay_zero():
    z = torch.tensor([[0.0, -math.inf, 1.0, -math.inf]])
    for kwargs in (
        {},
        {"top_k": 3},
        {"top_p": 0.99},
        {"temperature": 0.5, "top_k": 3, "top_p": 0.9},
    ):
        out = logits_to_probs(z, st_of(**kwargs))[0]
        assert out[1] == 0 and out[3] == 0 and out[0] > 0 and out[2] > 0
