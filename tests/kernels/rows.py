"""The check every linear kernel's test makes: a row's result is the same bits whatever shares
its call (how many rows, which ones, in what order) and however many threads run it."""

from __future__ import annotations

import torch

from saguaro.kernels import ops
from saguaro.kernels.ops import PackedWeight


def assert_each_row_is_its_own(
    x: torch.Tensor, w: PackedWeight, row_counts: tuple[int, ...], threads: int
) -> torch.Tensor:
    """Every leading ``m`` rows of ``x`` (``m`` in ``row_counts``), as they are and reversed,
    get the bits the whole call gives them, and so does the whole call on ``threads`` threads;
    returns the whole call's result."""
    full = ops.linear(x, w)
    for m in row_counts:
        assert torch.equal(ops.linear(x[:m], w), full[:m]), m
        # a row's result does not depend on its neighbours' values or its place among them
        assert torch.equal(ops.linear(x[:m].flip(0), w), full[:m].flip(0)), m
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert torch.equal(ops.linear(x, w), full)
    finally:
        torch.set_num_threads(before)
    return full
