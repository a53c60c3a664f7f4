import math

import pytest
import torch

from saguaro.sampling import SamplingParams, SamplingTensors, logits_to_probs, process


def st_of(**kwargs) -> SamplingTensors:
    return SamplingTensors.from_params([SamplingParams(**kwargs)])


def probs_of(probs: list[float], **kwargs) -> torch.Tensor:
    """Apply the transforms to logits whose softmax is ``probs`` (temperature 1 by default)."""
    return logits_to_probs(torch.tensor([probs]).log(), st_of(**kwargs))[0]


def test_sampling_tensors_from_params_and_repeat():
    st = SamplingTensors.from_params(
        [SamplingParams(temperature=0.5, top_k=-1, top_p=0.9), SamplingParams(temperature=0)]
    )
    assert st.temperature.dtype == torch.float32 and st.top_p.dtype == torch.float64
    assert st.top_k.dtype == torch.int64 and st.top_k.tolist() == [0, 0]
    assert st.greedy.tolist() == [False, True]
    assert not st.all_greedy() and st.index(torch.tensor([1])).all_greedy()
    assert st_of(temperature=1e-30).greedy.tolist() == [False]  # tiny, still sampled
    assert not st_of(temperature=1e-30).all_greedy()
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
        {"min_p": 0.05},
    ):
        out = logits_to_probs(z, st_of(**kwargs))[0]
        assert out[1] == 0 and out[3] == 0 and out[0] > 0 and out[2] > 0


def reference_kept(
    z: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float = 0.0
) -> torch.Tensor:
    """The kept set by the definition (module docstring of saguaro.sampling.probs), with a full
    sort and float64 sums: the reference the partial search must reproduce exactly."""
    x = (z.double() - z.double().max()) / temperature
    vals = x.sort(descending=True).values
    thr = vals[top_k - 1] if 0 < top_k < len(x) else -math.inf
    if min_p > 0:  # min-p, then top-k of what is left: the larger of the two cut-offs
        thr = max(thr, float(torch.tensor(math.log(min_p), dtype=torch.float32)))
    r = torch.where(vals >= thr, vals, -math.inf)
    r = (r - torch.logsumexp(r, 0)).exp()
    before = torch.cat([torch.zeros(1, dtype=torch.float64), r.cumsum(0)[:-1]])
    keep = max(1, int((before < top_p).sum()))
    return x >= max(thr, float(vals[keep - 1]))


def nasty_rows(vocab: int, n: int, seed: int) -> torch.Tensor:
    """Random rows with ties, -inf entries, peaked rows (tiny nuclei) and flat ones."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, vocab, generator=g) * torch.rand(n, 1, generator=g) * 8
    z[::3] = z[::3].round()  # many ties
    z[1::5, : vocab // 4] = -math.inf
    z[2::7, 7] += 40  # one dominant token
    return z


@pytest.mark.parametrize("vocab", [50, 3000])
def test_partial_search_equals_full_sort_and_definition(vocab):
    """min-p / top-k / top-p through the leading candidates give the same kept set as a full
    sort of every row (candidates = V), and as the float64 definition."""
    z = nasty_rows(vocab, 60, seed=vocab)
    g = torch.Generator().manual_seed(1)
    for trial in range(6):
        params = [
            SamplingParams(
                temperature=float(torch.rand(1, generator=g)) * 1.5 + 0.1,
                top_k=int(torch.randint(0, 80, (1,), generator=g)),
                top_p=float(torch.rand(1, generator=g)) ** 0.3,
                min_p=float(torch.rand(1, generator=g)) ** 3 * (trial % 2),
            )
            for _ in range(len(z))
        ]
        st = SamplingTensors.from_params(params)
        partial = process(z, st)
        full = process(z, st, candidates=vocab)
        assert torch.equal(partial.thr, full.thr)
        kept = partial.z >= partial.thr[:, None]
        for i, p in enumerate(params):
            ref = reference_kept(z[i], p.temperature, p.top_k, p.top_p, p.min_p)
            assert torch.equal(kept[i], ref), (i, p)


def test_no_row_is_ever_fully_sorted(monkeypatch):
    """Small nuclei close inside the candidates, wide ones sort one bucket of values."""
    z = torch.randn(8, 1000, generator=torch.Generator().manual_seed(2)) * 6
    sorted_rows = []
    original = torch.Tensor.sort

    def counting_sort(self, *args, **kwargs):
        sorted_rows.append(len(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "sort", counting_sort)
    process(z, SamplingTensors.from_params([SamplingParams(top_p=0.5)] * 8))
    assert sorted_rows == []
    process(z, SamplingTensors.from_params([SamplingParams(temperature=50.0, top_p=0.99)] * 8))
    assert sorted_rows == []


def test_extreme_values_are_handled_as_their_limits():
    z = torch.tensor([[0.5, 3.0, 1.0, 3.0, -2.0]])
    # a vanishing temperature: uniform over the tied maxima, finite everywhere
    out = logits_to_probs(z, st_of(temperature=1e-38))[0]
    assert out.tolist() == [0, 0.5, 0, 0.5, 0]
    out = logits_to_probs(z, st_of(temperature=5e-324))[0]  # below float32's range
    assert out.tolist() == [0, 0.5, 0, 0.5, 0]
    # a top_p that rounds to 0 in float32 still keeps the top value (and its tie)
    assert logits_to_probs(z, st_of(top_p=1e-50))[0].tolist() == [0, 0.5, 0, 0.5, 0]
    # a top_k beyond int64 is "off"
    torch.testing.assert_close(logits_to_probs(z, st_of(top_k=2**70))[0], torch.softmax(z, -1)[0])


def test_wide_nuclei_at_150k_match_the_full_sort():
    """Flat rows of a 151,936-token vocabulary (random-weight logits: nuclei of most of the
    vocabulary) cut where a full sort cuts."""
    z = torch.randn(6, 151_936, generator=torch.Generator().manual_seed(3)) * 0.5
    z[3, ::2] = z[3, ::2].round(decimals=1)  # ties across the crossing
    params = [SamplingParams(top_p=p) for p in (0.95, 0.5, 0.999, 0.9, 0.3, 0.99)]
    params[4] = SamplingParams(top_p=0.3, top_k=100_000)
    st = SamplingTensors.from_params(params)
    assert torch.equal(process(z, st).thr, process(z, st, candidates=151_936).thr)


def test_flat_rows_routed_straight_to_buckets_match_the_full_sort():
    """Rows whose 64 largest values cannot hold top_p skip the partial top-k entirely."""
    z = torch.randn(5, 20_000, generator=torch.Generator().manual_seed(4)) * 0.3
    st = SamplingTensors.from_params([SamplingParams(top_p=p) for p in (0.5, 0.9, 0.95, 0.99, 0.7)])
    assert torch.equal(process(z, st).thr, process(z, st, candidates=20_000).thr)
