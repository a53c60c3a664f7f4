"""Rows interleaved four at a time: the layout ``quant_kernels.c`` multiplies fastest.

The kernel's four-row tiles put 8 codes of each of four weight rows in one register, so that
one ``vpmaddubsw`` against 8 activation codes serves four rows. Read from the file's layout (a
row's blocks after one another) that takes a transpose of four rows' 64-bit words per pair of
groups, which costs more than multiplying once a verification's five positions share it. A
weight loaded to run on the kernels has its bytes permuted once instead, four rows a strip (the
C header spells out where each byte goes): nothing is added, dropped or rounded, so a row's
product is the same integer sums, and :func:`deinterleave` gives the file's blocks back.

A strip's super-block ``b`` is the four rows' super-block ``b``, regrouped by :func:`layout`
(for Q5_0 and Q8_0, its block of 32).
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch

from saguaro.kernels.ops import PackedWeight

ROWS = 4  # weight rows a strip
WORD = 8  # bytes: the kernel's unit of a row's codes in a register
# the file's format -> its interleaved form
INTERLEAVED = {"q4_k": "q4_k_x4", "q6_k": "q6_k_x4", "q5_0": "q5_0_x4", "q8_0": "q8_0_x4"}
FILE_FORMAT = {v: k for k, v in INTERLEAVED.items()}
SUPER_BYTES = {"q4_k": 144, "q6_k": 210, "q5_0": 22, "q8_0": 34}  # a row's (super-)block
# Where a block keeps its parts (GGUF's block_q4_K, block_q6_K and block_q5_0), in bytes.
Q4K_HEAD, Q4K_CODE_WORDS = 16, 16  # d, dmin and 12 bytes of scales; then 128 bytes of codes
Q6K_LOW_WORDS, Q6K_HIGH, Q6K_HIGH_WORDS = 16, 128, 8  # low nibbles, then the high bits
Q6K_SCALES, Q6K_D = 192, 208  # sixteen int8 scales, in two blocks of eight; float16 d
SCALE_BLOCK = 8
Q5_D, Q5_QH, Q5_CODE_WORDS = 2, 4, 2  # float16 d, the fifth bits; then 16 bytes of codes
Q8_CODE_WORDS = 4  # Q8_0: float16 d (as Q5_0's), then 32 bytes of codes


def _words(start: int, count: int) -> list[tuple[int, int]]:
    """(row, byte) of ``count`` 64-bit words from byte ``start`` of each row, word-major."""
    return [
        (r, start + WORD * w + i) for w in range(count) for r in range(ROWS) for i in range(WORD)
    ]


def _rows(start: int, size: int) -> list[tuple[int, int]]:
    """(row, byte) of bytes [start, start + size) of rows 0-3, row-major."""
    return [(r, start + i) for r in range(ROWS) for i in range(size)]


@cache
def layout(fmt: str) -> np.ndarray:
    """For each byte of a strip's super-block, the byte of the four rows' super-blocks (row r's
    byte i is r * size + i) it holds. Q4_K: the four headers (d, dmin, scales), then the codes
    word by word, each word of rows 0-3. Q6_K: the low nibbles' words and the high bits', each
    word of rows 0-3; scales 0-7 of rows 0-3, then 8-15 of rows 0-3; the four rows' d. Q5_0:
    the four d's, the four qh's, then the codes word by word, each word of rows 0-3. Q8_0: the
    four d's, then the codes word by word, each word of rows 0-3."""
    if fmt == "q4_k":
        order = _rows(0, Q4K_HEAD) + _words(Q4K_HEAD, Q4K_CODE_WORDS)
    elif fmt == "q5_0":
        order = _rows(0, Q5_D) + _rows(Q5_D, Q5_QH) + _words(Q5_D + Q5_QH, Q5_CODE_WORDS)
    elif fmt == "q8_0":
        order = _rows(0, Q5_D) + _words(Q5_D, Q8_CODE_WORDS)
    else:
        order = _words(0, Q6K_LOW_WORDS) + _words(Q6K_HIGH, Q6K_HIGH_WORDS)
        order += _rows(Q6K_SCALES, SCALE_BLOCK) + _rows(Q6K_SCALES + SCALE_BLOCK, SCALE_BLOCK)
        order += _rows(Q6K_D, SUPER_BYTES[fmt] - Q6K_D)
    size = SUPER_BYTES[fmt]
    return np.array([r * size + i for r, i in order], dtype=np.intp)


@cache
def inverse_layout(fmt: str) -> np.ndarray:
    """For each byte of four rows' super-blocks, the byte of the strip's that holds it."""
    return np.argsort(layout(fmt))


def interleaves(w: PackedWeight) -> bool:
    """Whether ``w`` has an interleaved form: Q4_K, Q6_K, Q5_0 or Q8_0 in whole strips of four
    rows."""
    return w.fmt in INTERLEAVED and w.n % ROWS == 0


def interleave(w: PackedWeight) -> PackedWeight:
    """``w`` in its interleaved form where it has one (:func:`interleaves`), else ``w``."""
    if not interleaves(w):
        return w
    size = SUPER_BYTES[w.fmt]
    rows = w.codes.contiguous().numpy().reshape(w.n // ROWS, ROWS, -1, size)
    strips = rows.transpose(0, 2, 1, 3).reshape(w.n // ROWS, -1, ROWS * size)
    out = np.take(strips, layout(w.fmt), axis=2)
    data = torch.from_numpy(out.reshape(w.n // ROWS, -1))
    return PackedWeight(INTERLEAVED[w.fmt], data, w.n, w.k, w.group)


def deinterleave(w: PackedWeight) -> PackedWeight:
    """The file's blocks of an interleaved weight (any other weight as it is)."""
    if w.fmt not in FILE_FORMAT:
        return w
    fmt = FILE_FORMAT[w.fmt]
    size = SUPER_BYTES[fmt]
    strips = w.codes.contiguous().numpy().reshape(w.n // ROWS, -1, ROWS * size)
    rows = np.take(strips, inverse_layout(fmt), axis=2)  # a gather: far faster than a scatter
    out = rows.reshape(w.n // ROWS, -1, ROWS, size).transpose(0, 2, 1, 3)
    return PackedWeight(fmt, torch.from_numpy(out.reshape(w.n, -1).copy()), w.n, w.k, w.group)
