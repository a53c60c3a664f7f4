"""Row-wise argmax / max / top-k: the same values (and argmax indices) as PyTorch's own kernels,
on every row a logits block can hold (ties, NaN, infinities, all -inf), at tiny and 150k
vocabularies."""

from unittest import mock

import pytest
import torch

from saguaro.sampling.reduce import (
    TOPK_BLOCK,
    TOPK_MIN_BLOCKS_PER_K,
    argmax_rows,
    max_rows,
    top_probability_rows,
    topk_rows,
)

INF, NAN = float("inf"), float("nan")


def edge_rows() -> torch.Tensor:
    return torch.tensor(
        [
            [1.0, 3.0, 3.0, 2.0, 3.0],  # tied maxima: the first
            [-INF, -INF, -INF, -INF, -INF],  # nothing finite: index 0
            [1.0, NAN, 7.0, NAN, 2.0],  # NaN is the max: the first NaN
            [INF, 0.0, INF, -INF, 1.0],  # tied +inf
            [-INF, -2.0, -INF, -1.0, -1.0],
            [0.0, -0.0, 0.0, -0.0, 0.0],  # signed zeros compare equal
        ]
    )


def random_rows(rows: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g)
    # plant ties at the maximum and -inf holes, as top-k masking leaves them
    x[:, vocab // 3] = x[:, vocab // 2] = x.amax(dim=-1) + 1.0
    x[:, :: max(2, vocab // 50)] = -INF
    return x


def assert_like_torch(x: torch.Tensor) -> None:
    values, indices = max_rows(x)
    ref_values, ref_indices = x.max(dim=-1)
    assert torch.equal(indices, ref_indices)
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    assert torch.allclose(values, ref_values, equal_nan=True, rtol=0, atol=0)
    assert indices.dtype == torch.int64 and values.dtype == x.dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_edge_rows_match_torch(dtype):
    assert_like_torch(edge_rows().to(dtype))


@pytest.mark.parametrize("rows,vocab", [(1, 2), (3, 257), (5, 32_000), (2, 151_936)])
def test_random_rows_match_torch(rows, vocab):
    assert_like_torch(random_rows(rows, vocab, seed=vocab))


def test_non_contiguous_and_empty_blocks():
    x = random_rows(6, 1000, seed=1)
    assert_like_torch(x[::2, 10:])  # strided rows, offset columns
    assert_like_torch(x.t().contiguous().t())  # column-major storage
    empty = torch.zeros(0, 7)
    assert max_rows(empty)[1].shape == (0,) and argmax_rows(empty).shape == (0,)


def test_tensors_that_need_gradients_take_torch_kernels():
    x = random_rows(2, 50, seed=2).clamp(min=-100).requires_grad_()
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))
    assert torch.equal(max_rows(x)[1], x.max(dim=-1).indices)


def assert_topk_like_torch(x: torch.Tensor, k: int) -> None:
    values, indices = topk_rows(x, k)
    ref = x.topk(k, dim=-1, sorted=True).values
    assert torch.allclose(values, ref, equal_nan=True, rtol=0, atol=0)  # same values, same order
    assert indices.dtype == torch.int64 and indices.shape == (x.shape[0], k)
    assert bool(((indices >= 0) & (indices < x.shape[1])).all())
    assert torch.allclose(x.gather(1, indices), values, equal_nan=True, rtol=0, atol=0)
    for row in indices:  # k distinct tokens
        assert len(set(row.tolist())) == k


def test_topk_block_filter_is_taken_at_real_vocabularies():
    vocab, k = 128_256, 64
    assert vocab % TOPK_BLOCK == 0 and vocab // TOPK_BLOCK >= TOPK_MIN_BLOCKS_PER_K * k
    x = random_rows(3, vocab, seed=3)
    searched = []
    original = torch.Tensor.topk

    def spy(self, *args, **kwargs):
        searched.append(self.shape[-1])
        return original(self, *args, **kwargs)

    with mock.patch.object(torch.Tensor, "topk", spy):
        values, _ = topk_rows(x, k)
    # the block maxima and the k candidate blocks are searched, never the whole row
    assert searched == [vocab // TOPK_BLOCK, k * TOPK_BLOCK]
    assert torch.equal(values, x.topk(k, dim=-1).values)


@pytest.mark.parametrize("vocab", [128_256, 151_936])
@pytest.mark.parametrize("k", [1, 64, 65])
def test_topk_random_rows_match_torch(vocab, k):
    assert_topk_like_torch(random_rows(4, vocab, seed=k), k)


def test_topk_ties_spread_over_blocks():
    vocab, k = 128 * 600, 64
    x = torch.full((4, vocab), -5.0)
    # row 0: k - 2 large values in one block, the k-th value tied in many other blocks
    x[0, :62] = torch.arange(62.0) + 10
    x[0, 128::256] = 3.0
    # row 1: every block's maximum tied, the top-k made only of ties
    x[1, ::128] = 1.0
    # row 2: top-k masked to -inf except a few values; row 3: NaN and +inf among the values
    x[2] = -INF
    x[2, [5, 70_000, 76_799]] = torch.tensor([1.0, 2.0, 0.5])
    x[3, [0, 300, 60_000]] = torch.tensor([NAN, INF, NAN])
    assert_topk_like_torch(x, k)
    top = topk_rows(x, k)[1]
    assert set(top[0, :62].tolist()) == set(range(62))
    assert top[2, :3].tolist() == [70_000, 5, 76_799]


@pytest.mark.parametrize("vocab", [8_192, 32_000, 128_001, 2])
def test_topk_small_or_unaligned_vocabularies_take_torch(vocab):
    x = random_rows(2, vocab, seed=vocab)
    k = min(64, vocab)
    values, indices = topk_rows(x, k)
    ref_values, ref_indices = x.topk(k, dim=-1, sorted=True)
    assert torch.equal(values, ref_values) and torch.equal(indices, ref_indices)


def test_top_probability_rows_is_the_softmax_maximum():
    x = torch.randn(6, 300) * 4
    x[2, 100:] = float("-inf")  # a reduced head: no mass outside it
    want = torch.softmax(x, dim=-1).amax(dim=-1)
    assert torch.allclose(torch.tensor(top_probability_rows(x)), want, rtol=1e-5, atol=0)
