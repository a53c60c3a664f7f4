"""Weight-only quantization: the formats of :class:`saguaro.kernels.ops.PackedWeight`, made from
a dense weight at load time or mapped exactly from a GGUF file's blocks.

- **int4**, groupwise asymmetric (groups of 32, 64 or 128): a group's scale is
  d = (max - min) / 15 and its minimum m = min, both rounded to float16, and a weight's code is
  q = clamp(round((w - m) / d), 0, 15), so w ~ d q + m.
- **int8**, per output channel, symmetric: d = max |w| / 127 (float16), q = round(w / d), m = 0.
- **GGUF blocks** of 32 weights, as they are: Q4_1 (a float16 d and m, 16 bytes of codes) maps to
  int4 with its own d and m; Q4_0 (d, codes meaning q - 8) to int4 with m = -8 d, exact in
  float16. The codes keep the file's byte layout. :func:`dequantize` then gives exactly GGUF's
  dequantized weights (d q is exact in float32, so d q + m rounds once either way).
- **GGUF blocks kept whole** (:data:`RAW_TYPES`: Q4_K, Q5_K, Q6_K, Q5_0, Q5_1, Q8_0): ``codes``
  are a row's blocks byte for byte ([n, k / block * bytes]); no scales or minima outside them. The
  kernel multiplies them with integer dot products against the activation quantized row by row
  (``quant_kernels.c``); :func:`dequantize` gives ``gguf.quants.dequantize``'s weights.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from saguaro.kernels.interleave import deinterleave
from saguaro.kernels.ops import BLOCK, PackedWeight

INT4_LEVELS, INT8_LEVELS = 15, 127
# quantization option -> (bits, group; 0 = one group per row)
SCHEMES = {"int4": (4, 32), "int4-g64": (4, 64), "int4-g128": (4, 128), "int8": (8, 0)}
# GGUF block type -> bytes per 32-weight block
GGUF_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}
# GGUF block types kept as raw blocks: format name -> (GGML type, weights a block, bytes a block)
RAW_TYPES = {
    "q4_k": ("Q4_K", 256, 144),
    "q5_k": ("Q5_K", 256, 176),
    "q6_k": ("Q6_K", 256, 210),
    "q5_0": ("Q5_0", 32, 22),
    "q5_1": ("Q5_1", 32, 24),
    "q8_0": ("Q8_0", 32, 34),
}
RAW_FORMAT = {ggml: fmt for fmt, (ggml, _, _) in RAW_TYPES.items()}  # GGML type -> format
EXACT_Q8_ROWS = 4096  # rows exact_q8 quantizes and checks at a time


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [n, k] in 0..15 -> [n, k / 2], byte j of each 32-block = q_j | q_{j+16} << 4."""
    n, k = codes.shape
    blocks = codes.reshape(n, k // BLOCK, 2, BLOCK // 2)
    return (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    n, half = packed.shape
    blocks = packed.reshape(n, half * 2 // BLOCK, 1, BLOCK // 2)
    return torch.cat([blocks & 15, blocks >> 4], dim=2).reshape(n, half * 2)


def codes_of(w: PackedWeight) -> torch.Tensor:
    """The codes as float32 [n, k]."""
    codes = unpack_nibbles(w.codes) if w.fmt == "q4" else w.codes
    return codes.to(torch.float32)


def dequantize(w: PackedWeight) -> torch.Tensor:
    """The float32 [n, k] weight ``w`` stands for (the float kernels multiply by these exactly;
    the raw-block formats' integer kernel by these with its activation rounded to int8)."""
    w = deinterleave(w)
    if w.fmt in RAW_TYPES:
        kind = GGMLQuantizationType[RAW_TYPES[w.fmt][0]]
        values = quants.dequantize(w.codes.numpy(), kind)
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).view(w.n, w.k)
    if not w.quantized:
        return w.codes.to(torch.float32)
    d = w.scales.to(torch.float32).repeat_interleave(w.group, dim=1)
    m = w.mins.to(torch.float32).repeat_interleave(w.group, dim=1)
    return codes_of(w) * d + m


def check_shape(k: int, group: int) -> None:
    if k % BLOCK or (group and k % group):
        raise ValueError(
            f"a quantized weight's input size ({k}) must be a multiple of {BLOCK} and of its "
            f"group size ({group})"
        )


def half(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to float16 and held as float32 (exactly): the kernel broadcasts a block's
    scale and minimum straight from memory, with no conversion in its loop."""
    return x.to(torch.float16).to(torch.float32).contiguous()


def quantize(w: torch.Tensor, scheme: str) -> PackedWeight:
    """``w`` [n, k] in one of :data:`SCHEMES`."""
    return quantize_groups(w, *SCHEMES[scheme])


def exact_q8(w: torch.Tensor) -> PackedWeight | None:
    """``w`` [n, k] as int8 groups of 32 with float16 scales (GGUF's Q8_0) where that holds it
    exactly, else None. A table dequantized from Q8_0 is held exactly: each group's largest
    |w| is d * 127, so d = max |w| / 127 and every code w / d come back as they were."""
    if w.dtype != torch.float32 or w.shape[1] % BLOCK:
        return None
    parts = []
    for rows in w.split(EXACT_Q8_ROWS):  # a table that is not fails on its first rows
        q = quantize_groups(rows, 8, BLOCK)
        if not torch.equal(dequantize(q), rows):
            return None
        parts.append(q)
    return concat_rows(parts)


def quantize_groups(w: torch.Tensor, bits: int, group: int) -> PackedWeight:
    """``w`` [n, k] in int4 or int8 codes (``bits``), one scale (and minimum) per ``group``
    weights of a row (0: one per row)."""
    n, k = w.shape
    check_shape(k, group)
    group = group or k
    g = w.detach().to(torch.float32).reshape(n, k // group, group)
    if bits == 4:
        lo, hi = g.amin(dim=2), g.amax(dim=2)
        d, m = half((hi - lo) / INT4_LEVELS), half(lo)
        step = torch.where(d == 0, 1.0, d).unsqueeze(2)
        q = ((g - m.unsqueeze(2)) / step).round().clamp(0, INT4_LEVELS)
        codes = pack_nibbles(q.reshape(n, k).to(torch.uint8))
        return PackedWeight("q4", codes.contiguous(), n, k, group, d, m)
    d = half(g.abs().amax(dim=2) / INT8_LEVELS)
    step = torch.where(d == 0, 1.0, d).unsqueeze(2)
    q = (g / step).round().clamp(-INT8_LEVELS, INT8_LEVELS).reshape(n, k).to(torch.int8)
    return PackedWeight("q8", q.contiguous(), n, k, group, d, torch.zeros_like(d))


def from_gguf_blocks(data: np.ndarray, kind: str, n: int, k: int) -> PackedWeight:
    """A GGUF tensor's raw blocks (``kind`` Q4_0 or Q4_1; ``n`` rows of ``k`` weights) as
    a :class:`PackedWeight` that dequantizes to exactly the file's weights."""
    size = GGUF_BLOCK_BYTES[kind]
    raw = np.array(data, dtype=np.uint8, copy=True)  # the reader maps the file read-only
    blocks = torch.from_numpy(raw.reshape(n, k // BLOCK, size))
    d = half(blocks[:, :, :2].contiguous().view(torch.float16).reshape(n, k // BLOCK))
    if kind == "Q4_1":
        m = half(blocks[:, :, 2:4].contiguous().view(torch.float16).reshape(n, k // BLOCK))
        codes = blocks[:, :, 4:]
    else:  # Q4_0: code q means q - 8, i.e. minimum -8 d (exact in float16 unless it overflows)
        m = half(d * -8)
        if not torch.isfinite(m).all():
            raise ValueError("a Q4_0 scale too large for float16 once multiplied by 8")
        codes = blocks[:, :, 2:]
    return PackedWeight("q4", codes.reshape(n, k // 2).contiguous(), n, k, BLOCK, d, m)


def from_gguf_raw(data: np.ndarray, kind: str, n: int, k: int) -> PackedWeight:
    """A GGUF tensor's blocks (``kind`` one of :data:`RAW_FORMAT`'s types; ``n`` rows of ``k``)
    kept as they are. ``data`` may be a read-only map of the file: it is not copied, and the
    kernels only read it."""
    fmt = RAW_FORMAT[kind]
    _, block, size = RAW_TYPES[fmt]
    if k % block:
        raise ValueError(f"a {kind} row of {k} weights is not whole blocks of {block}")
    raw = np.asarray(data, dtype=np.uint8).reshape(n, k // block * size)
    return PackedWeight(fmt, torch.from_numpy(raw), n, k, block)


def concat_rows(parts: list[PackedWeight]) -> PackedWeight:
    """Row-wise concatenation (fused QKV and gate/up) of weights in one format and group."""
    parts = [deinterleave(p) for p in parts]
    first = parts[0]
    if any((p.fmt, p.k, p.group) != (first.fmt, first.k, first.group) for p in parts):
        raise ValueError("fused weights in different formats")

    def cat(ts: list[torch.Tensor | None]) -> torch.Tensor | None:
        return None if ts[0] is None else torch.cat(ts, dim=0).contiguous()

    return PackedWeight(
        first.fmt, cat([p.codes for p in parts]), sum(p.n for p in parts), first.k, first.group,
        cat([p.scales for p in parts]), cat([p.mins for p in parts]),
    )  # fmt: skip


def permute_rows(w: PackedWeight, index: torch.Tensor) -> PackedWeight:
    """The rows ``index`` of ``w``, in that order, as a weight of that many rows (whole rows:
    codes, scales and mins move together)."""
    w = deinterleave(w)

    def take(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, index).contiguous()

    n = len(index)
    return PackedWeight(w.fmt, take(w.codes), n, w.k, w.group, take(w.scales), take(w.mins))
