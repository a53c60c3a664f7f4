"""Row-wise argmax / max: the same values and indices as PyTorch's own kernels, on every row a
logits block can hold (ties, NaN, infinities, all -inf), at tiny and 150k vocabularies."""

import pytest
import torch

from saguaro.sampling.reduce import argmax_rows, max_rows

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
