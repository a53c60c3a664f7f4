"""Building blocks shared by the Llama-3 and Qwen3 families: RMSNorm, RoPE, paged attention, MLP.

Attention reads and writes a paged KV cache through :class:`AttentionMetadata`. The metadata is
built once per forward by the model runner and says, for a batch of sequences, where each new
token's K/V goes (``slot_mapping``), which cached slots each sequence may attend to
(``key_slots``) and through which boolean mask (``mask``). Causal prefill, single-token decode,
multi-position verification and branch decoding with an arbitrary mask are all the same call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from saguaro.kernels import ops
from saguaro.models.config import RopeScaling
from saguaro.models.parallel import SINGLE, TensorParallel


@dataclass
class AttentionMetadata:
    """Where queries come from and which cached keys they see, for one forward.

    T flat query tokens belong to b sequences; sequence i has q_i queries and L_i visible keys.
    Q = max q_i and L = max L_i are the padded sizes.
    """

    slot_mapping: torch.Tensor  # [T] int64: KV slot written by each query token
    key_slots: torch.Tensor  # [b, L] int64: slot of each visible key (padding points at slot 0)
    mask: torch.Tensor  # [b, 1, Q, L] bool: True = query may attend to key
    query_index: (
        torch.Tensor | None
    )  # [b, Q] int64 into the flat T tokens; None if q_i == Q for all
    out_index: torch.Tensor | None  # [T] int64 into the padded b*Q rows; None with query_index
    # [T] int64: each query token's row of the padded b*Q layout (out_index, or 0..T-1 when no
    # sequence is padded); the attention kernel's index, built once per forward
    rows: torch.Tensor | None = None

    def token_rows(self, t: int) -> torch.Tensor:
        """``rows``, or 0..T-1 where the runner left it unset (no sequence padded)."""
        return self.rows if self.rows is not None else torch.arange(t)


class RMSNorm(nn.Module):
    # On saguaro's kernels (saguaro.models.linear.use_kernels), this and the kernels flags below
    # route each layer to its batch-invariant kernel.
    kernels = False

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 and cast back before scaling, as the reference implementation does.
        dtype = x.dtype
        if self.kernels and x.device.type == "cpu":
            if dtype == self.weight.dtype == torch.float32:  # the scaling in the same call
                return ops.rms_norm(x, self.eps, self.weight)
            normed = ops.rms_norm(x, self.eps)
        else:
            normed = F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps)
        return self.weight * normed.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse frequencies ``theta^(-2i/d)``, with Llama-3 scaling if configured.

    Llama-3 scaling leaves high frequencies (wavelength < orig_ctx / high_freq_factor) alone,
    divides low frequencies (wavelength > orig_ctx / low_freq_factor) by ``factor``, and blends
    linearly in between, so long-context extension does not disturb local position information.
    """
    # On the CPU whatever device the model is built on: under the meta device, the first such
    # arithmetic imports torch's reference kernels (seconds, in every fresh process).
    steps = torch.arange(0, head_dim, 2, dtype=torch.float64, device="cpu")
    inv = 1.0 / (theta ** (steps / head_dim))
    if scaling is None:
        return inv.float()
    orig = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv
    low_wavelen = orig / scaling.low_freq_factor
    high_wavelen = orig / scaling.high_freq_factor
    smooth = (orig / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - smooth) * inv / scaling.factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / scaling.factor, blended)
    out = torch.where(wavelen < high_wavelen, inv, out)
    return out.float()


RopeAngles = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [T, 1, D] each


class Rotary(nn.Module):
    """Rotary position embedding (rotate-half convention), cos/sin cached per position, built on
    the CPU (moved with the model)."""

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling | None
    ) -> None:
        super().__init__()
        inv = rope_inv_freq(head_dim, theta, scaling)
        positions = torch.arange(max_positions, dtype=torch.float32, device="cpu")
        freqs = torch.outer(positions, inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeAngles:
        """The rotation of each query token, looked up once per forward for every layer."""
        cos = self.cos.index_select(0, positions).unsqueeze(1).to(dtype)
        sin = self.sin.index_select(0, positions).unsqueeze(1).to(dtype)
        return cos, sin


def apply_rope(
    angles: RopeAngles, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q ([T, H, D]) and k ([T, Hkv, D]) by their tokens' angles."""
    cos, sin = angles
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


class Attention(nn.Module):
    """Self-attention over this rank's heads (all of them with one rank): QKV column-parallel,
    the output projection row-parallel and summed over ranks (:mod:`saguaro.models.parallel`)."""

    kernels = False

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        bias: bool,
        qk_norm: bool,
        eps: float,
        tp: TensorParallel = SINGLE,
    ) -> None:
        super().__init__()
        self.tp = tp
        # KV heads split first: a rank's query heads must be the ones its KV heads serve (GQA).
        tp.split(kv_heads, "the number of KV heads")
        tp.split(heads, "the number of attention heads")
        heads, kv_heads = heads // tp.size, kv_heads // tp.size
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_size, self.kv_size = heads * head_dim, kv_heads * head_dim
        self.qkv_proj = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=bias)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, eps) if qk_norm else None
        self.scale = head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        angles: RopeAngles,
        meta: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        t = x.shape[0]
        k_cache, v_cache = kv_cache  # [num_slots, Hkv, D]
        on_kernels = self.kernels and x.device.type == "cpu"
        if on_kernels and self.q_norm is None and x.dtype == k_cache.dtype == torch.float32:
            # RoPE and the cache writes in one call: a decode step's layer is otherwise some
            # twenty operators of microseconds each on a few hundred floats.
            cos, sin = angles
            qkv = self.qkv_proj(x)
            q = ops.rope_cache(qkv, cos, sin, meta.slot_mapping, k_cache, v_cache, self.heads)
        else:
            q = self._rotate_and_cache(x, angles, meta, kv_cache)

        if on_kernels:
            out = ops.attention(
                q, k_cache, v_cache, meta.key_slots, meta.mask, meta.token_rows(t), self.scale
            ).to(x.dtype)
            return self.tp.all_reduce(self.o_proj(out.view(t, self.q_size)))
        return self._attend(q, meta, kv_cache)

    def _rotate_and_cache(
        self,
        x: torch.Tensor,
        angles: RopeAngles,
        meta: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        """The rotated queries [T, H, D]; the rotated keys and the values go to the cache."""
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.heads, self.head_dim)
        k = k.view(t, self.kv_heads, self.head_dim)
        v = v.view(t, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(angles, q, k)
        # index_copy_/index_select: the same scatter and gather as advanced indexing, which
        # costs several times more per call on CPU.
        kv_cache[0].index_copy_(0, meta.slot_mapping, k)
        kv_cache[1].index_copy_(0, meta.slot_mapping, v)
        return q

    def _attend(
        self, q: torch.Tensor, meta: AttentionMetadata, kv_cache: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """torch's attention of q [T, H, D] over the cache, through the output projection."""
        k_cache, v_cache = kv_cache
        b, n_keys = meta.key_slots.shape
        n_q = meta.mask.shape[2]
        if meta.query_index is None:
            qp = q.view(b, n_q, self.heads, self.head_dim)
        else:
            qp = q[meta.query_index]
        flat = meta.key_slots.view(-1)
        shape = (b, n_keys, self.kv_heads, self.head_dim)
        keys = k_cache.index_select(0, flat).view(shape).transpose(1, 2)  # [b, Hkv, L, D]
        values = v_cache.index_select(0, flat).view(shape).transpose(1, 2)
        out = F.scaled_dot_product_attention(
            qp.transpose(1, 2),
            keys,
            values,
            attn_mask=meta.mask,
            scale=self.scale,
            enable_gqa=self.kv_heads != self.heads,
        )  # [b, H, Q, D]
        out = out.transpose(1, 2).reshape(b * n_q, self.q_size)
        if meta.out_index is not None:
            out = out[meta.out_index]
        return self.tp.all_reduce(self.o_proj(out))


class MLP(nn.Module):
    """SwiGLU over this rank's intermediate columns; down's partial sums are summed over ranks."""

    kernels = False

    def __init__(self, hidden: int, intermediate: int, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        tp.split(intermediate, "intermediate_size")
        self.intermediate = intermediate // tp.size
        self.gate_up_proj = nn.Linear(hidden, 2 * self.intermediate, bias=False)
        self.down_proj = nn.Linear(self.intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.kernels and x.device.type == "cpu":
            hidden = ops.silu_mul(gate_up).to(x.dtype)
        else:
            gate, up = gate_up.split(self.intermediate, dim=-1)
            hidden = F.silu(gate) * up
        return self.tp.all_reduce(self.down_proj(hidden))


class VocabEmbedding(nn.Module):
    """Token embedding over this rank's vocabulary rows ``[start, start + Vp)``: ids outside
    them embed to zero here, and the sum over ranks leaves each token its one row."""

    def __init__(self, vocab_size: int, hidden: int, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.tp = tp
        self.start, end = tp.vocab_rows(vocab_size)
        self.weight = nn.Parameter(torch.empty(end - self.start, hidden))

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the hidden states it starts."""
        return self.weight.dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        x = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight)
        return self.tp.all_reduce(x * mine.unsqueeze(-1).to(x.dtype))
