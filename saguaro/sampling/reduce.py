"""Row-wise argmax and max of logits, vectorised on the CPU.

Greedy decoding, greedy verification and every draft proposal reduce a ``[rows, vocab]`` block
to each row's largest value and the index of its first occurrence. PyTorch's CPU kernels for
``argmax`` and ``max(dim)`` walk the row without vectorising the index search, while its
``amax`` and NumPy's ``argmax`` use SIMD; at a 128k vocabulary the difference is a sizeable part
of a small model's forward (docs/bench-sampling). The results are the same by definition, not
by tolerance:

* the index is the first among tied maxima (both libraries document it);
* a NaN counts as the maximum, so a row holding one returns its first NaN and a NaN value
  (callers treat such a row as not finite either way);
* a row of ``-inf`` returns index 0.

Tensors on other devices, in 16-bit formats, or that need gradients take PyTorch's
own kernels.
"""

from __future__ import annotations

import numpy as np
import torch

# The CPU formats NumPy reduces with SIMD (it has no bfloat16, and reduces float16 slowly).
_NUMPY_FLOATS = (torch.float32, torch.float64)


def _numpy_view(x: torch.Tensor) -> np.ndarray | None:
    if x.device.type != "cpu" or x.dtype not in _NUMPY_FLOATS or x.requires_grad:
        return None
    return x.numpy()


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """[R] int64: the index of each row's maximum of ``x`` [R, V], the first among ties."""
    arr = _numpy_view(x)
    if arr is None:
        return x.argmax(dim=-1)
    return torch.from_numpy(arr.argmax(axis=-1).astype(np.int64, copy=False))


def max_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)`` of each row's maximum of ``x`` [R, V]: ``torch.max(x, dim=-1)``."""
    if _numpy_view(x) is None:
        values, indices = x.max(dim=-1)
        return values, indices
    return x.amax(dim=-1), argmax_rows(x)
