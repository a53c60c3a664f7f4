"""Random GGML blocks of every type saguaro runs, for tests that write GGUF files.

``gguf.quants.quantize`` cannot make K-quant blocks (Q4_K, Q5_K, Q6_K), so every type is made
the same way: random bytes for the codes (and the K-quants' packed sub-block scales), then each
block's float16 scale ``d`` (and minimum where the type has one) overwritten with a small, sane
value, so that the weights the blocks stand for are about ``scale`` in size and about zero on
average. Layouts, per block (bytes):

- Q4_K (144): d f16, dmin f16, scales[12], qs[128]; w = d * sc * q - dmin * m (sc, m 6-bit)
- Q5_K (176): d f16, dmin f16, scales[12], qh[32], qs[128]; as Q4_K with 5-bit q
- Q6_K (210): ql[128], qh[64], scales int8[16], d f16 at 208; w = d * sc * (q - 32)
- Q5_0 (22): d f16, qh[4], qs[16]; w = d * (q - 16)
- Q5_1 (24): d f16, m f16, qh[4], qs[16]; w = d * q + m
- Q4_0 (18): d f16, qs[16]; w = d * (q - 8)
- Q4_1 (20): d f16, m f16, qs[16]; w = d * q + m
- Q8_0 (34): d f16, qs int8[32]; w = d * q
"""

from __future__ import annotations

import numpy as np

# kind -> (weights a block, bytes a block, byte offset of d, typical |code * sub-scale| (d's
# divisor), the minimum's offset or None, the minimum in units of d)
LAYOUTS: dict[str, tuple[int, int, int, float, int | None, float]] = {
    "Q4_K": (256, 144, 0, 31.5 * 7.5, 2, 7.5),
    "Q5_K": (256, 176, 0, 31.5 * 15.5, 2, 15.5),
    "Q6_K": (256, 210, 208, 64.0 * 16.0, None, 0.0),
    "Q5_0": (32, 22, 0, 16.0, None, 0.0),
    "Q5_1": (32, 24, 0, 16.0, 2, -15.5),
    "Q4_0": (32, 18, 0, 8.0, None, 0.0),
    "Q4_1": (32, 20, 0, 8.0, 2, -7.5),
    "Q8_0": (32, 34, 0, 64.0, None, 0.0),
}


def random_blocks(
    kind: str, n: int, k: int, rng: np.random.Generator, scale: float = 0.1
) -> np.ndarray:
    """uint8 ``[n, row bytes]``: ``n`` rows of ``k`` weights in GGML type ``kind`` (a name of
    :data:`LAYOUTS`), each block's scale ``d`` drawn about ``scale`` / its typical code size.
    For the K-quants the minimum (``dmin``, times sub-block minima of 0..63) is ``d`` times the
    mean code, so the weights centre near zero; for Q4_1/Q5_1 ``m`` centres the codes."""
    block, size, d_at, divisor, min_at, min_units = LAYOUTS[kind]
    if k % block:
        raise ValueError(f"{kind} rows hold whole blocks of {block} weights, not {k}")
    blocks = rng.integers(0, 256, size=(n, k // block, size), dtype=np.uint8)
    d = (scale / divisor * rng.uniform(0.5, 1.5, size=(n, k // block))).astype(np.float16)
    blocks[:, :, d_at : d_at + 2] = d.view(np.uint8).reshape(n, k // block, 2)
    if min_at is not None:
        m = (d.astype(np.float32) * min_units).astype(np.float16)
        blocks[:, :, min_at : min_at + 2] = m.view(np.uint8).reshape(n, k // block, 2)
    return blocks.reshape(n, k // block * size)
