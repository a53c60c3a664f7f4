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
PASS_HEADS = 4  # query heads of a key-value group the attention kernel scores at once
FORMATS = {"f32": 0, "bf16": 1, "q8": 2, "q4": 3}
# GGUF's blocks kept whole (saguaro.models.quant.RAW_TYPES), run by quant_kernels.c; the _x4
# formats: rows in strips of four (saguaro.kernels.interleave)
RAW_FORMATS = {"q4_k": 4, "q5_k": 5, "q6_k": 6, "q5_0": 7, "q5_1": 8, "q8_0": 9}
RAW_FORMATS |= {"q4_k_x4": 10, "q6_k_x4": 11, "q5_0_x4": 12, "q8_0_x4": 13}
FORMATS |= RAW_FORMATS


@dataclass
class PackedWeight:
    """A [n, k] weight as the linear kernel reads it.

    ``fmt`` "f32" / "bf16": ``codes`` is the dense weight itself. "q8": ``codes`` int8 [n, k];
    "q4": ``codes`` uint8 [n, k / 2], byte j of each 16-byte block holding codes j (low nibble)
    and j + 16 (high nibble) of its 32 weights. For both, weight = scale * code + min with one
    scale and min per ``group`` weights of a row ([n, k / group] each, float16 values held as
    float32). q8 is symmetric: its mins are all zero and the kernel does not read them.
    :data:`RAW_FORMATS`: ``codes`` uint8 [n, row bytes], each row GGUF's blocks of ``group``
    weights as the file stores them (scales inside); ``scales`` and ``mins`` None."""

    fmt: str
    codes: torch.Tensor
    n: int
    k: int
    group: int = 0
    scales: torch.Tensor | None = None
    mins: torch.Tensor | None = None

    def check(self) -> None:
        """Refuse what the kernel would misread (once, where a weight enters a model)."""
        self.check_scales()
        if self.fmt == "q8" and self.mins is not None and bool(self.mins.any()):
            raise ValueError("a q8 weight is symmetric: its mins must be zero")

    def check_scales(self) -> None:
        """Refuse scales and mins in another dtype than the float32 the kernel reads (as a cast
        module's would be); cheap enough for every call."""
        floats = () if self.raw or not self.quantized else (self.scales, self.mins)
        if any(t.dtype != torch.float32 for t in floats):
            raise ValueError(
                "a quantized weight's scales and mins are held as float32, not "
                f"{self.scales.dtype} and {self.mins.dtype}"
            )

    @property
    def quantized(self) -> bool:
        return self.fmt in ("q8", "q4") or self.raw

    @property
    def raw(self) -> bool:
        """Whether ``codes`` are GGUF blocks as stored (:data:`RAW_FORMATS`)."""
        return self.fmt in RAW_FORMATS

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


class _Linear(ctypes.Structure):
    """A weight as saguaro_linear takes it (the C side's LinearArg)."""

    _fields_ = [(f, ctypes.c_void_p) for f in ("codes", "scales", "mins")]
    _fields_ += [(f, ctypes.c_int64) for f in ("n", "k", "group", "fmt")]


def _linear_arg(w: PackedWeight) -> _Linear:
    def ptr(x: torch.Tensor | None) -> int | None:
        return x.data_ptr() if x is not None else None

    group = w.group or w.k
    w.check_scales()  # a module cast by .to(dtype) after it was checked, say
    return _Linear(w.codes.data_ptr(), ptr(w.scales), ptr(w.mins), w.n, w.k, group, FORMATS[w.fmt])


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
    if w.raw:
        return _quant_linear(x, w, out, lib or library())
    a = _linear_arg(w)
    (lib or library()).saguaro_linear(
        x.data_ptr(), m, a.k, a.codes, a.scales, a.mins, a.n, a.group, a.fmt, out.data_ptr(),
        _threads(),
    )  # fmt: skip
    return out


def _quant_linear(x: torch.Tensor, w: PackedWeight, out: torch.Tensor, lib: ctypes.CDLL):
    """GGUF's blocks as stored, against ``x`` rounded to int8 row by row (``quant_kernels.c``)."""
    if not w.codes.is_contiguous() or w.codes.dtype != torch.uint8:
        raise ValueError("a raw GGUF weight's codes are one contiguous uint8 tensor")
    failed = lib.saguaro_quant_linear(
        x.data_ptr(), x.shape[0], w.k, w.codes.data_ptr(), w.n, FORMATS[w.fmt], out.data_ptr(),
        _threads(),
    )  # fmt: skip
    if failed:
        raise MemoryError("linear kernel: no memory for the rounded activation")
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
    scratch = torch.empty(threads, PASS_HEADS, max(keys, 1), dtype=torch.float32)
    mask_bytes = mask.contiguous().view(torch.uint8)
    library().saguaro_attention(
        q.data_ptr(), t, heads, d, k_cache.data_ptr(), v_cache.data_ptr(),
        int(k_cache.dtype == torch.bfloat16), k_cache.shape[1], key_slots.contiguous().data_ptr(),
        keys, mask_bytes.data_ptr(), q_pad, rows.contiguous().data_ptr(), scale, out.data_ptr(),
        scratch.data_ptr(), threads,
    )  # fmt: skip
    return out


def hash_words(
    seeds: torch.Tensor, positions: torch.Tensor, purpose: int, columns: torch.Tensor | None
) -> torch.Tensor:
    """The int64 words of :func:`saguaro.sampling.noise.hash_words` (the same bits), for
    int64 tensors of one shape."""
    parts = [t.contiguous() for t in (seeds, positions, columns) if t is not None]
    if any(t.dtype != torch.int64 or t.shape != seeds.shape for t in parts):
        raise ValueError("hash kernel: int64 seeds, positions and columns of one shape")
    out = torch.empty(seeds.shape, dtype=torch.int64)
    ptrs = [t.data_ptr() for t in parts] + [None] * (3 - len(parts))
    library().saguaro_hash_words(*ptrs, out.numel(), purpose, out.data_ptr())
    return out


def gumbel_argmax(
    z: torch.Tensor, thr: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor, purpose: int
) -> torch.Tensor:
    """[R] int64: per row of the scaled logits z [R, V] (float32), the first ``v`` with
    ``z_v >= thr`` maximising ``z_v + g_v``, ``g_v = -log(-log u(seed, position, purpose, v))``
    the Gumbel noise of :mod:`saguaro.sampling.noise` for the row's int64 seed and position."""
    shape = (z.shape[0],)
    if (
        z.dtype != torch.float32
        or z.dim() != 2
        or any(t.shape != shape for t in (thr, seeds, positions))
    ):
        raise ValueError(f"gumbel kernel: z {tuple(z.shape)} {z.dtype}, thr {tuple(thr.shape)}")
    z = z.contiguous()
    rows, vocab = z.shape
    thr = _f32(thr)
    seeds, positions = (t.to(torch.int64).contiguous() for t in (seeds, positions))
    out = torch.empty(rows, dtype=torch.int64)
    library().saguaro_gumbel_argmax(
        z.data_ptr(), rows, vocab, thr.data_ptr(), seeds.data_ptr(), positions.data_ptr(),
        purpose, out.data_ptr(), _threads(),
    )  # fmt: skip
    return out


def sample_rows(
    z: torch.Tensor, thr: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of the scaled logits z [R, V] (float32, at most 0): the inverse-CDF draw by the
    float64 uniform ``u`` from the weights ``exp(z_v)`` where ``z_v >= thr`` (0 elsewhere), and
    the row's total weight ([R] int64, [R] float64)."""
    shape = (z.shape[0],)
    if z.dtype != torch.float32 or z.dim() != 2 or thr.shape != shape or u.shape != shape:
        raise ValueError(f"sampling kernel: z {tuple(z.shape)} {z.dtype}, u {tuple(u.shape)}")
    z = z.contiguous()
    rows, vocab = z.shape
    thr, u = _f32(thr), u.to(torch.float64).contiguous()
    out = torch.empty(rows, dtype=torch.int64)
    mass = torch.empty(rows, dtype=torch.float64)
    library().saguaro_sample_rows(
        z.data_ptr(), rows, vocab, thr.data_ptr(), u.data_ptr(), out.data_ptr(), mass.data_ptr(),
        _threads(),
    )  # fmt: skip
    return out, mass


MAX_QKV_PARTS = 3  # q, k and v in formats of their own (the C side's MAX_QKV_PARTS)


class _Layer(ctypes.Structure):
    _fields_ = [("qkv", _Linear * MAX_QKV_PARTS), ("qkv_parts", ctypes.c_int64)]
    _fields_ += [("qkv_bias", ctypes.c_void_p)]
    _fields_ += [(f, _Linear) for f in ("o", "gate_up", "down")]
    _fields_ += [(f, ctypes.c_void_p) for f in ("input_norm", "post_norm", "k_cache", "v_cache")]


class _Step(ctypes.Structure):
    _fields_ = [
        (f, ctypes.c_int64)
        for f in ("t", "hidden", "heads", "kv_heads", "head_dim", "inter", "num_slots", "keys")
        + ("q_pad", "threads")
    ]
    _fields_ += [("eps", ctypes.c_float), ("scale", ctypes.c_float)]
    _fields_ += [(f, ctypes.c_void_p) for f in ("cos", "sin", "slots", "key_slots", "rows", "mask")]


@dataclass
class DecoderWeights:
    """One Llama or Qwen2 decoder layer on the kernels: its products (QKV fused, or its parts in
    q, k, v order where their formats differ; gate and up fused), the QKV bias (Qwen2's; None
    for Llama) and its two RMSNorms' float32 weights."""

    qkv: list[PackedWeight]
    o: PackedWeight
    gate_up: PackedWeight
    down: PackedWeight
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv_bias: torch.Tensor | None = None


class LayerStack:
    """A model's decoder layers run by one kernel call per forward (``saguaro_layers``): the same
    kernels in the same order as the layers' modules call them one by one, so the same bits,
    without some forty Python-level calls per layer. Holds the weights it points at."""

    def __init__(
        self, layers: list[DecoderWeights], heads: int, kv_heads: int, head_dim: int, eps: float
    ) -> None:
        self.layers = layers
        self.heads, self.kv_heads, self.head_dim, self.eps = heads, kv_heads, head_dim, eps
        self.hidden, self.inter = layers[0].o.n, layers[0].down.k
        self._args: ctypes.Array | None = None
        self._caches: tuple[int, ...] = ()

    def _layer_args(self, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> ctypes.Array:
        """The layers' descriptors, rebuilt only when the caches move."""
        key = tuple(c.data_ptr() for kv in kv_caches for c in kv)
        if self._args is None or key != self._caches:
            args = (_Layer * len(self.layers))()
            for a, w, (k, v) in zip(args, self.layers, kv_caches, strict=True):
                for i, part in enumerate(w.qkv):
                    a.qkv[i] = _linear_arg(part)
                a.qkv_parts = len(w.qkv)
                a.qkv_bias = None if w.qkv_bias is None else w.qkv_bias.data_ptr()
                a.o = _linear_arg(w.o)
                a.gate_up, a.down = _linear_arg(w.gate_up), _linear_arg(w.down)
                a.input_norm, a.post_norm = w.input_norm.data_ptr(), w.post_norm.data_ptr()
                a.k_cache, a.v_cache = k.data_ptr(), v.data_ptr()
            self._args, self._caches = args, key
        return self._args

    def fits(self, x: torch.Tensor, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
        k = kv_caches[0][0]
        return x.device.type == "cpu" and x.dtype == k.dtype == torch.float32 and k.is_contiguous()

    def __call__(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        key_slots: torch.Tensor,
        mask: torch.Tensor,
        rows: torch.Tensor,
        scale: float,
    ) -> torch.Tensor:
        """The hidden states x [T, hidden] after every layer, each token's key and value written to
        slot ``slots[t]`` of every layer's caches; the rest as :func:`rope_cache` and
        :func:`attention` take it."""
        t = x.shape[0]
        out = x.contiguous().clone()
        _, _, q_pad, keys = mask.shape
        cos, sin = cos.contiguous(), sin.contiguous()
        slots, key_slots, rows = slots.contiguous(), key_slots.contiguous(), rows.contiguous()
        mask_bytes = mask.contiguous().view(torch.uint8)
        step = _Step(
            t, self.hidden, self.heads, self.kv_heads, self.head_dim, self.inter,
            kv_caches[0][0].shape[0], keys, q_pad, _threads(), self.eps, scale,
            cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), key_slots.data_ptr(),
            rows.data_ptr(), mask_bytes.data_ptr(),
        )  # fmt: skip
        args = self._layer_args(kv_caches)
        bad = library().saguaro_layers(args, len(self.layers), ctypes.byref(step), out.data_ptr())
        if bad == -1:
            raise ValueError(f"layer kernel: a slot outside the caches' {step.num_slots}")
        if bad:
            raise MemoryError("layer kernel: no memory for its scratch buffers")
        return out
