"""GGUF's block formats run as stored (``quant_kernels.c``): a product equals the activation
rounded to int8 row by row times the file's dequantized weights (``gguf.quants.dequantize``),
up to float32 rounding of a few operations per block; and a row's result is the same bits
whatever shares the call, however many threads run, in the AVX2 and the generic build."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saguaro.kernels import build, ops
from saguaro.kernels.interleave import (
    FILE_FORMAT,
    INTERLEAVED,
    ROWS,
    SUPER_BYTES,
    deinterleave,
    interleave,
    layout,
)
from saguaro.kernels.ops import PackedWeight
from saguaro.models.quant import RAW_TYPES, dequantize, from_gguf_raw, permute_rows
from tests.ggml_blocks import random_blocks
from tests.kernels.rows import assert_each_row_is_its_own

N = 37  # two column chunks of 16 and a tail of 5
N_STRIPS = 40  # an interleaved weight's rows: two column chunks of 16 and a tail of 8
FORMATS = [*RAW_TYPES, *FILE_FORMAT]  # the file's formats and the interleaved ones
ROW_COUNTS = (1, 2, 5, 8, 9, 17)  # every tile height of 8 rows, and tiles after the first
# A few float32 roundings per block against a float64 reference: relative to the largest output.
REL_TOLERANCE = 1e-5
INT8_LEVELS = 127
ODD_BLOCKS = 5
# A weight whose rows are whole tiles of 16 (amx_kernels.c) and calls of at least AMX_MIN_ROWS
# (16) rows: where the CPU has AMX, those take the tiles; the others, the paths above.
N_TILES = 48
K_TILES = 1024  # four super-blocks
TILE_ROW_COUNTS = (1, 5, 15, 16, 31, 40)  # below and at the threshold, a part tile after a whole


def weight(fmt: str, seed: int = 0, k: int | None = None) -> PackedWeight:
    """Random blocks of ``fmt`` (an interleaved format: the file's, interleaved)."""
    kind, block, _ = RAW_TYPES[FILE_FORMAT.get(fmt, fmt)]
    k = k or 2 * max(block, 256)  # two super-blocks, or sixteen small blocks
    n = N_STRIPS if fmt in FILE_FORMAT else N
    w = from_gguf_raw(random_blocks(kind, n, k, np.random.default_rng(seed)), kind, n, k)
    return interleave(w) if fmt in FILE_FORMAT else w


def block_of(fmt: str) -> int:
    return RAW_TYPES[FILE_FORMAT.get(fmt, fmt)][1]


def rounded(x: torch.Tensor, block: int) -> np.ndarray:
    """The activation as the kernel rounds it: per block e = max|x| / 127, p = rint(x 127 /
    max|x|), so x ~ e p (float64)."""
    xs = x.numpy().reshape(x.shape[0], -1, block)
    amax = np.abs(xs).max(axis=2, keepdims=True)
    inv = np.float32(INT8_LEVELS) / np.where(amax > 0, amax, np.inf).astype(np.float32)
    p = np.rint(xs * inv)
    e = (amax / np.float32(INT8_LEVELS)).astype(np.float32)
    return (p.astype(np.float64) * e).reshape(x.shape)


@pytest.mark.parametrize("fmt", FORMATS)
def test_product_is_the_rounded_activation_times_the_files_weights(fmt):
    w = weight(fmt)
    x = torch.randn(max(ROW_COUNTS), w.k, generator=torch.Generator().manual_seed(1))
    x[3] = 0  # a zero row: scale 0, codes 0
    got = ops.linear(x, w).numpy()
    want = rounded(x, block_of(fmt)) @ dequantize(w).numpy().astype(np.float64).T
    assert np.abs(got - want).max() <= REL_TOLERANCE * np.abs(want).max()
    assert not got[3].any()


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_rows_bits_do_not_depend_on_what_shares_its_call(fmt):
    w = weight(fmt, seed=2)
    x = torch.randn(max(ROW_COUNTS), w.k, generator=torch.Generator().manual_seed(3))
    assert_each_row_is_its_own(x, w, ROW_COUNTS, threads=2)


def test_the_avx2_build_computes_the_generic_codes_bits():
    """The generic C spells out the AVX2 code's lanes (docs in quant_kernels.c): both builds give
    every row the same bits in every format, so logits do not depend on the vector code (nor on
    VNNI, which this machine's own build takes where the CPU has it)."""
    builds = [build.build((*build.BASE_FLAGS, "-march=x86-64-v3")), build.library()]
    if "avx_vnni" in build.cpu()[1]:  # AVX-VNNI without AVX-512, as on a client CPU
        builds.append(build.build((*build.BASE_FLAGS, "-march=x86-64-v3", "-mavxvnni")))
    generic = build.build((*build.BASE_FLAGS, "-march=x86-64-v3", "-DSAGUARO_GENERIC"))
    # an odd count of small blocks: the tiles that fold two blocks a step end on one
    odd = [(fmt, ODD_BLOCKS * 32) for fmt in ("q5_0", "q5_0_x4", "q8_0", "q8_0_x4")]
    for fmt, k in [(fmt, None) for fmt in FORMATS] + odd:
        w = weight(fmt, seed=4, k=k)
        x = torch.randn(9, w.k, generator=torch.Generator().manual_seed(5))
        want = ops.linear(x, w, generic)
        for lib in builds:
            assert torch.equal(ops.linear(x, w, lib), want), (fmt, k)


@pytest.mark.parametrize("fmt", ["q4_k_x4", "q6_k_x4"])
def test_a_tile_calls_rows_get_the_generic_codes_bits(fmt):
    """Long calls (a prompt's prefill) run on AMX's tiles where the CPU has them: the same
    integers, folded in the same order, so each row gets the generic C's bits, and the same
    bits as in a short call that runs on the vector paths."""
    kind = RAW_TYPES[FILE_FORMAT[fmt]][0]
    blocks = random_blocks(kind, N_TILES, K_TILES, np.random.default_rng(10))
    raw = from_gguf_raw(blocks, kind, N_TILES, K_TILES)
    w = interleave(raw)
    x = torch.randn(max(TILE_ROW_COUNTS), w.k, generator=torch.Generator().manual_seed(11))
    x[2] = 0
    generic = build.build((*build.BASE_FLAGS, "-march=x86-64-v3", "-DSAGUARO_GENERIC"))
    full = assert_each_row_is_its_own(x, w, TILE_ROW_COUNTS, threads=2)
    assert torch.equal(full, ops.linear(x, w, generic))
    assert not full[2].any()


def test_rows_that_are_not_whole_blocks_are_refused():
    w = weight("q4_k")
    with pytest.raises(ValueError, match="input width"):
        ops.linear(torch.randn(1, w.k - 32), w)
    with pytest.raises(ValueError, match="whole blocks"):
        from_gguf_raw(np.zeros((1, 144), np.uint8), "Q4_K", 1, 288)


@pytest.mark.parametrize("fmt", list(FILE_FORMAT))
def test_an_interleaved_weight_is_the_files_bytes_and_gives_its_rows_bits(fmt):
    """Interleaving permutes bytes (deinterleaving gives the file's blocks back), so every row's
    product is the same bits as from the file's layout, in both builds, at every tile height;
    a weight whose rows are not whole strips of four stays as the file has it."""
    raw = deinterleave(weight(fmt, seed=6))
    x4 = interleave(raw)
    assert (raw.fmt, x4.fmt) == (FILE_FORMAT[fmt], fmt)
    assert torch.equal(deinterleave(x4).codes, raw.codes)
    assert torch.equal(dequantize(x4), dequantize(raw))
    generic = build.build((*build.BASE_FLAGS, "-march=x86-64-v3", "-DSAGUARO_GENERIC"))
    x = torch.randn(max(ROW_COUNTS), raw.k, generator=torch.Generator().manual_seed(7))
    for m in ROW_COUNTS:
        want = ops.linear(x[:m], raw, generic)
        assert torch.equal(ops.linear(x[:m], x4), want), m
        assert torch.equal(ops.linear(x[:m], x4, generic), want), m
    assert interleave(weight(FILE_FORMAT[fmt])).fmt == FILE_FORMAT[fmt]  # 37 rows


@pytest.mark.parametrize("fmt", list(FILE_FORMAT))
def test_rows_of_an_interleaved_weight_move_as_the_files_do(fmt):
    """Reordering rows (a draft's cut head) reads an interleaved weight as the file's blocks."""
    x4 = weight(fmt, seed=8)
    index = torch.randperm(x4.n, generator=torch.Generator().manual_seed(9))[: x4.n // 2]
    moved = permute_rows(x4, index)
    assert (moved.fmt, moved.n) == (FILE_FORMAT[fmt], len(index))
    assert torch.equal(moved.codes, deinterleave(x4).codes[index])


@pytest.mark.parametrize("fmt", list(INTERLEAVED))
def test_a_layout_moves_every_byte_once(fmt):
    """Each format's layout is a permutation of a strip's bytes: nothing added or dropped."""
    index = layout(fmt)
    assert sorted(index.tolist()) == list(range(ROWS * SUPER_BYTES[fmt]))
