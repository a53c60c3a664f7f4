"""What one sequence asks of one forward pass, independent of which model runs it.

A :class:`Query` scores some tokens at given RoPE positions, writes their K/V into given slots,
attends to given cached slots through a mask, and asks logits for the last few. RoPE position and
KV slot are independent on purpose: SSD branch decoding puts many branches at the same positions
in different slots.

Its index arrays are NumPy (int64; the mask bool): a step builds one query per sequence and
:meth:`~saguaro.engine.model_runner.ModelRunner.prepare` lays them out in NumPy, where an operation
on a few integers costs a fraction of a torch operator's dispatch (docs/design.md §10).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Query:
    token_ids: list[int]
    positions: np.ndarray  # [q] int64
    slots: np.ndarray  # [q] int64: where these tokens' K/V are written
    key_slots: np.ndarray  # [L] int64: cached slots visible to these queries (incl. their own)
    num_logits: int  # logits wanted for the last num_logits queries
    mask: np.ndarray | None = None  # [q, L] bool; None = causal (query j sees keys <= L-q+j)


def token_slots(block_table: list[int], start: int, end: int, block_size: int) -> np.ndarray:
    """KV slots (int64) of token indices ``[start, end)`` of a sequence."""
    idx = np.arange(start, end, dtype=np.int64)
    table = np.asarray(block_table, dtype=np.int64)
    return table[idx // block_size] * block_size + idx % block_size
