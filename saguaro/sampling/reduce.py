"""Row-wise argmax, max and top-k of logits, fast on the CPU.

Greedy decoding, greedy verification and every draft proposal reduce a ``[rows, vocab]`` block
to each row's largest value and the index of its first occurrence. PyTorch's CPU kernels for
``argmax`` and ``max(dim)`` walk the row without vectorising the index search, while its
``amax`` and NumPy's ``argmax`` use SIMD; at a 128k vocabulary the difference is a sizeable part
of a small model's forward (docs/bench/sampling). The results are the same by definition, not
by tolerance:

* the index is the first among tied maxima (both libraries document it);
* a NaN counts as the maximum, so a row holding one returns its first NaN and a NaN value
  (callers treat such a row as not finite either way);
* a row of ``-inf`` returns index 0.

Tensors on other devices, in 16-bit formats, or that need gradients take PyTorch's
own kernels.

:func:`topk_rows` finds a row's k largest values among a few of its blocks instead of the whole
row. Cut a row into blocks of ``TOPK_BLOCK`` tokens and let ``v`` be the row's k-th largest
value, and choose the k blocks with the largest maxima. The b blocks whose maximum exceeds ``v``
are all chosen (b < k: each holds its own value above ``v``, and fewer than k values exceed it),
with every value above ``v``, at least b of them. If k - b further blocks with maximum ``v`` are
chosen, each adds a copy of ``v``: at least k values at or above ``v`` in all. Otherwise every
block with maximum ``v`` or more is chosen, and with them every value at or above ``v``: at least
k by the definition of ``v``. ``topk`` over the chosen ``k * TOPK_BLOCK`` values therefore returns
the row's exact top-k values, in the same descending order. Among values tied at the k-th,
which index is returned is, as with ``torch.topk``, unspecified; every caller takes what it
returns as the row's support, on both sides of a verification.
"""

from __future__ import annotations

import numpy as np
import torch

TOPK_BLOCK = 128  # tokens per block of the block-max filter (real vocabularies are multiples)
# The filter pays only when the k candidate blocks are a small part of the row.
TOPK_MIN_BLOCKS_PER_K = 4
# The CPU formats NumPy reduces with SIMD (it has no bfloat16, and reduces float16 slowly).
_NUMPY_FLOATS = (torch.float32, torch.float64)


def _numpy_view(x: torch.Tensor) -> np.ndarray | None:
    if x.device.type != "cpu" or x.dtype not in _NUMPY_FLOATS or x.requires_grad:
        return None
    return x.numpy()


def _first_max_index(arr: np.ndarray) -> np.ndarray:
    return arr.argmax(axis=-1).astype(np.int64, copy=False)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """[R] int64: the index of each row's maximum of ``x`` [R, V], the first among ties."""
    arr = _numpy_view(x)
    return x.argmax(dim=-1) if arr is None else torch.from_numpy(_first_max_index(arr))


def max_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` of each row's maximum of ``x`` [R, V]: ``torch.max(x, dim=-1)``.

    On the CPU the value is read at the index (a NaN row's first NaN, an all ``-inf`` row's
    ``-inf``): one pass over the row instead of two."""
    arr = _numpy_view(x)
    if arr is None:
        values, indices = x.max(dim=-1)
        return values, indices
    idx = _first_max_index(arr)
    top = np.take_along_axis(arr, idx[..., None], axis=-1)[..., 0]
    return torch.from_numpy(top), torch.from_numpy(idx)


def top_probability_rows(x: torch.Tensor) -> list[float]:
    """The probability each row's softmax puts on its likeliest entry, for logits ``x`` [R, V]:
    softmax(x)_max = exp(max x - logsumexp x), without building the [R, V] softmax."""
    x = x.float()
    return (x.amax(dim=-1) - torch.logsumexp(x, dim=-1)).exp().tolist()


def topk_rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` [R, k] of each row's k largest values of ``x`` [R, V], descending:
    ``torch.topk(x, k, dim=-1, sorted=True)`` (see the module docstring for ties)."""
    rows, vocab = x.shape
    blocks = vocab // TOPK_BLOCK
    if (
        x.device.type != "cpu"
        or vocab % TOPK_BLOCK
        or blocks < TOPK_MIN_BLOCKS_PER_K * k
        or x.requires_grad
    ):
        values, indices = x.topk(k, dim=-1, sorted=True)
        return values, indices
    tiles = x.reshape(rows, blocks, TOPK_BLOCK)
    chosen = tiles.amax(dim=-1).topk(k, dim=-1, sorted=False).indices  # [R, k]
    candidates = tiles.gather(1, chosen[:, :, None].expand(rows, k, TOPK_BLOCK))
    values, col = candidates.view(rows, k * TOPK_BLOCK).topk(k, dim=-1, sorted=True)
    indices = chosen.gather(1, col // TOPK_BLOCK) * TOPK_BLOCK + col % TOPK_BLOCK
    return values, indices
