"""The kernels of ``cpu_kernels.c`` on torch tensors (CPU, float32 activations).

Each function takes and returns contiguous CPU tensors; inputs in another float dtype are widened
to float32 first (exactly, for bfloat16 and float16) and the caller rounds the float32 result
to its own dtype. The formats of :class:`PackedWeight` are the kernel's (see its header)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from saguaro.kernels.build import library

BLOCK = 32  # weights per kernel block: K and every group size are multiples of it
LANES = 16  # floats per vector: RMSNorm's width and the head dimension are multiples of it
MAX_HEAD_DIM = 256
FORMATS = {"f32": 0, "bf16": 1, "q8": 2, "q4": 3}


@dataclass
class PackedWeight:
    """A [n, k] weight as the linear kernel reads it.

    ``fmt`` "f32" / "bf16": ``codes`` is the dense weight itself. "q8": ``codes`` int8 [n, k];
    "q4": ``codes`` uint8 [n, k / 2], byte j of each 16-byte block holding codes j (low nibble)
    and j + 16 (high nibble) of its 32 weights. For both, weight = scale * code + min with one
    float16 scale and min per ``group`` weights of a row ([n, k / group] each)."""

    fmt: str
    codes: torch.Tensor
    n: int
    k: int
    group: int = 0
    scales: torch.Tensor | None = None
    mins: torch.Tensor | None = None

    @property
    def quantized(self) -> bool:
        return self.fmt in ("q8", "q4")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights it stands for (a quantized weight's are float32)."""
        return torch.float32 if self.quantized else self.codes.dtype


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).contiguous()


def _threads() -> int:
    return torch.get_num_threads()


def fits_linear(k: int) -> bool:
    return k % BLOCK == 0


def fits_rows(k: int) -> bool:
    """Whether rows of ``k`` floats suit the norm kernel (and heads of ``k`` the attention's)."""
    return k % LANES == 0 and 0 < k


def fits_head(d: int) -> bool:
    return fits_rows(d) and d <= MAX_HEAD_DIM


def linear(x: torch.Tensor, w: PackedWeight, lib: ctypes.CDLL | None = None) -> torch.Tensor:
    """``x [m, k] @ W^T`` in float32 ([m, n]); ``lib``: a build of the kernels other than this
    CPU's (tests)."""
    if x.shape[-1] != w.k or not fits_linear(w.k):
        raise ValueError(f"linear kernel: input width {x.shape[-1]}, weight [{w.n}, {w.k}]")
    x = _f32(x)
    m = x.shape[0]
    out = torch.empty(m, w.n, dtype=torch.float32)
    if m == 0:
        return out
    scales = w.scales.data_ptr() if w.scales is not None else None
    mins = w.mins.data_ptr() if w.mins is not None else None
    (lib or library()).saguaro_linear(
        x.data_ptr(), m, w.k, w.codes.data_ptr(), scales, mins, w.n, w.group or w.k,
        FORMATS[w.fmt], out.data_ptr(), _threads(),
    )  # fmt: skip
    return out


def rms_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps)`` per row of x [..., k], in float32; then times a float32
    ``weight`` [k] where given (rounded after each, as the two done apart)."""
    if not fits_rows(x.shape[-1]):
        raise ValueError(f"norm kernel: rows of {x.shape[-1]} (a multiple of {LANES} needed)")
    flat = _f32(x.reshape(-1, x.shape[-1]))
    out = torch.empty_like(flat)
    if weight is not None and (weight.dtype != torch.float32 or weight.shape != x.shape[-1:]):
        raise ValueError(f"norm kernel: a float32 weight of {x.shape[-1]} floats needed")
    w = weight.contiguous().data_ptr() if weight is not None else None
    library().saguaro_rms_norm(
        flat.data_ptr(), flat.shape[0], flat.shape[1], eps, w, out.data_ptr()
    )
    return out.view(x.shape)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for gate_up [m, 2i] = [gate | up], in float32 ([m, i])."""
    gate_up = _f32(gate_up)
    m, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(m, inter, dtype=torch.float32)
    library().saguaro_silu_mul(gate_up.data_ptr(), m, inter, out.data_ptr())
    return out


def rope_cache(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
) -> torch.Tensor:
    """One layer's step from its QKV product ``qkv`` [T, (H + 2 Hkv) D] to attention: rotate
    queries and keys by ``cos``, ``sin`` [T, D] (rotate-half RoPE), write the keys and values
    into slots ``slots`` [T] of the caches [slots, Hkv, D], and return the rotated queries
    [T, H, D]. All float32 and contiguous; a token's results depend on that token alone."""
    num_slots, kv_heads, d = k_cache.shape
    t = qkv.shape[0]
    tensors = (qkv, cos, sin, k_cache, v_cache)
    if (
        any(x.dtype != torch.float32 or not x.is_contiguous() for x in tensors)
        or slots.dtype != torch.int64
        or qkv.shape[1] != (heads + 2 * kv_heads) * d
        or cos.numel() != t * d
        or sin.numel() != t * d
        or d % 2
    ):
        raise ValueError(f"rope kernel: qkv {tuple(qkv.shape)}, cache {tuple(k_cache.shape)}")
    out = torch.empty(t, heads, d, dtype=torch.float32)
    bad = library().saguaro_rope_cache(
        qkv.data_ptr(), t, heads, kv_heads, d, cos.data_ptr(), sin.data_ptr(),
        slots.contiguous().data_ptr(), num_slots, k_cache.data_ptr(), v_cache.data_ptr(),
        out.data_ptr(),
    )  # fmt: skip
    if bad:
        raise ValueError(f"rope kernel: a slot outside the caches' {num_slots}")
    return out


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key_slots: torch.Tensor,
    mask: torch.Tensor,
    rows: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Softmax attention of q [T, H, D] over the paged caches [slots, Hkv, D] (float32 or
    bfloat16): token t is row ``rows[t]`` of the padded [b, Q] query layout and sees key j of
    sequence b at slot ``key_slots[b, j]`` where ``mask[b, 0, row % Q, j]``. Returns [T, H, D]
    float32."""
    if k_cache.dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(
            f"the attention kernel reads float32 or bfloat16 caches, not {k_cache.dtype}"
        )
    q = _f32(q)
    t, heads, d = q.shape
    if not fits_head(d) or k_cache.shape[-1] != d or heads % k_cache.shape[1]:
        raise ValueError(f"attention kernel: q {tuple(q.shape)}, cache {tuple(k_cache.shape)}")
    b, _, q_pad, keys = mask.shape
    out = torch.empty_like(q)
    threads = _threads()
    scratch = torch.empty(threads, max(keys, 1), dtype=torch.float32)
    mask_bytes = mask.contiguous().view(torch.uint8)
    library().saguaro_attention(
        q.data_ptr(), t, heads, d, k_cache.data_ptr(), v_cache.data_ptr(),
        int(k_cache.dtype == torch.bfloat16), k_cache.shape[1], key_slots.contiguous().data_ptr(),
        keys, mask_bytes.data_ptr(), q_pad, rows.contiguous().data_ptr(), scale, out.data_ptr(),
        scratch.data_ptr(), threads,
    )  # fmt: skip
    return out
