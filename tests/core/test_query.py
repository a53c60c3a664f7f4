"""KV slots of a sequence's token indices through its block table."""

from __future__ import annotations

import numpy as np
import pytest

from saguaro.core.query import token_slots


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_token_slots_follow_the_block_table_across_block_boundaries(block_size):
    table = [7, 2, 9, 0, 5]
    for start, end in [(0, 1), (0, 3 * block_size + 1), (block_size - 1, 2 * block_size + 2)]:
        got = token_slots(table, start, end, block_size)
        want = [table[i // block_size] * block_size + i % block_size for i in range(start, end)]
        assert got.dtype == np.int64 and got.tolist() == want


def test_token_slots_of_an_empty_range_and_beyond_the_table():
    assert token_slots([3], 2, 2, 4).shape == (0,)
    assert token_slots([], 0, 0, 4).dtype == np.int64
    with pytest.raises(IndexError):
        token_slots([3], 0, 5, 4)  # index 4 needs a second block
