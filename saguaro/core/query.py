"""What one sequence asks of one forward pass, independent of which model runs it.

A :class:`Query` scores some tokens at given RoPE positions, writes their K/V into given slots,
attends to given cached slots through a mask, and asks logits for the last few. RoPE position and
KV slot are independent on purpose: SSD branch decoding puts many branches at the same positions
in different slots.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Query:
    token_ids: list[int]
    positions: torch.Tensor  # [q] int64
    slots: torch.Tensor  # [q] int64: where these tokens' K/V are written
    key_slots: torch.Tensor  # [L] int64: cached slots visible to these queries (incl. their own)
    num_logits: int  # logits wanted for the last num_logits queries
    mask: torch.Tensor | None = None  # [q, L] bool; None = causal (query j sees keys <= L-q+j)


def token_slots(block_table: list[int], start: int, end: int, block_size: int) -> torch.Tensor:
    """KV slots of token indices ``[start, end)`` of a sequence."""
    idx = np.arange(start, end, dtype=np.int64)  # NumPy: per step, a few small operations
    table = np.asarray(block_table, dtype=np.int64)
    return torch.from_numpy(table[idx // block_size] * block_size + idx % block_size)
