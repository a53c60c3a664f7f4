"""Q4_K rows interleaved four at a time: the layout ``quant_kernels.c`` multiplies fastest.

The kernel's four-row tile puts 8 codes of each of four weight rows in one register, so that one
``vpmaddubsw`` against 8 activation codes serves four rows. Read from the file's layout (a row's
blocks after one another) that takes a transpose of four rows' 64-bit words per pair of groups,
which costs more than multiplying once a verification's five positions share it. A weight
loaded to run on the kernels has its bytes permuted once instead, four rows a strip (the C
header spells out where each byte goes): nothing is added, dropped or rounded, so the products
are the same sums and the same bits, and :func:`deinterleave` gives the file's blocks back.

In 64-bit words (a Q4_K super-block is 18: the 16-byte header's 2, then 16 of codes, pairs of
groups i = 0..3 of 4 words c each), strip ``s`` and super-block ``b`` hold the four rows' header
words in row order, then word ``(i, c)`` of rows 0-3 for each (i, c) in order.
"""

from __future__ import annotations

import numpy as np
import torch

from saguaro.kernels.ops import PackedWeight

ROWS = 4  # weight rows a strip
WORD = 8  # bytes: the kernel's unit of a row's codes in a register
HEAD_WORDS, CODE_WORDS = 2, 16  # a Q4_K super-block: 16 bytes of header, 128 of codes
SUPER_WORDS = HEAD_WORDS + CODE_WORDS
INTERLEAVED = {"q4_k": "q4_k_x4"}  # the file's format -> its interleaved form
FILE_FORMAT = {v: k for k, v in INTERLEAVED.items()}


def interleaves(w: PackedWeight) -> bool:
    """Whether ``w`` has an interleaved form: Q4_K in whole strips of four rows."""
    return w.fmt in INTERLEAVED and w.n % ROWS == 0


def _words(codes: torch.Tensor, n: int) -> np.ndarray:
    """A Q4_K weight's bytes as 64-bit words [n / 4, 4 rows, blocks, 18] (a copy where the rows
    do not start on a word)."""
    a = codes.numpy()
    if a.ctypes.data % WORD:
        a = a.copy()
    return a.view(np.uint64).reshape(n // ROWS, ROWS, -1, SUPER_WORDS)


def interleave(w: PackedWeight) -> PackedWeight:
    """``w`` in its interleaved form where it has one (:func:`interleaves`), else ``w``."""
    if not interleaves(w):
        return w
    words = _words(w.codes.contiguous(), w.n)
    strips, _, blocks, _ = words.shape
    out = np.empty((strips, blocks, SUPER_WORDS * ROWS), np.uint64)
    heads = out[:, :, : HEAD_WORDS * ROWS].reshape(strips, blocks, ROWS, HEAD_WORDS)
    heads[...] = words[..., :HEAD_WORDS].transpose(0, 2, 1, 3)
    codes = out[:, :, HEAD_WORDS * ROWS :].reshape(strips, blocks, CODE_WORDS, ROWS)
    codes[...] = words[..., HEAD_WORDS:].transpose(0, 2, 3, 1)
    data = torch.from_numpy(out.view(np.uint8).reshape(strips, -1))
    return PackedWeight(INTERLEAVED[w.fmt], data, w.n, w.k, w.group)


def deinterleave(w: PackedWeight) -> PackedWeight:
    """The file's blocks of an interleaved weight (any other weight as it is)."""
    if w.fmt not in FILE_FORMAT:
        return w
    strips = w.n // ROWS
    words = w.codes.contiguous().numpy().view(np.uint64).reshape(strips, -1, SUPER_WORDS * ROWS)
    blocks = words.shape[1]
    out = np.empty((strips, ROWS, blocks, SUPER_WORDS), np.uint64)
    heads = words[..., : HEAD_WORDS * ROWS].reshape(strips, blocks, ROWS, HEAD_WORDS)
    out[..., :HEAD_WORDS] = heads.transpose(0, 2, 1, 3)
    codes = words[..., HEAD_WORDS * ROWS :].reshape(strips, blocks, CODE_WORDS, ROWS)
    out[..., HEAD_WORDS:] = codes.transpose(0, 3, 1, 2)
    data = torch.from_numpy(out.view(np.uint8).reshape(w.n, -1))
    return PackedWeight(FILE_FORMAT[w.fmt], data, w.n, w.k, w.group)
