"""Llama-3 and Qwen3 decoder-only transformers over a paged KV cache.

The two families differ only in Qwen3's per-head RMSNorm on q and k (``config.qk_norm``), so one
class serves both. The model knows nothing about speculation: it scores whatever query tokens the
runner gives it, at the positions, KV slots and attention mask in :class:`AttentionMetadata`.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn

from saguaro.kernels import ops
from saguaro.models.config import ModelConfig
from saguaro.models.layers import (
    MLP,
    Attention,
    AttentionMetadata,
    RMSNorm,
    RopeAngles,
    Rotary,
    VocabEmbedding,
)
from saguaro.models.linear import KernelLinear, PartsLinear
from saguaro.models.parallel import SINGLE, TensorParallel

# A checkpoint's projection -> (the fused module holding it, its part): q, k and v are rows of
# ``qkv_proj``, gate and up rows of ``gate_up_proj``, in that order.
FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
FUSED_PARTS = Counter(fused for fused, _ in FUSED.values())  # fused module -> its parts


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TensorParallel) -> None:
        super().__init__()
        self.self_attn = Attention(
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
            cfg.attention_bias,
            cfg.qk_norm,
            cfg.rms_norm_eps,
            tp,
        )
        self.mlp = MLP(cfg.hidden_size, cfg.intermediate_size, tp)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        angles: RopeAngles,
        meta: AttentionMetadata,
        kv_cache: tuple[torch.Tensor, torch.Tensor],
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), angles, meta, kv_cache)
        return x + self.mlp(self.post_attention_layernorm(x))

    def kernel_weights(self) -> ops.DecoderWeights | None:
        """The layer as the layer kernel runs it, where every part of it runs on the kernels in
        float32 one rank (no bias but QKV's, no q/k norm); otherwise None."""
        attn, mlp = self.self_attn, self.mlp
        norms = (self.input_layernorm, self.post_attention_layernorm)
        qkv, rest = attn.qkv_proj, (attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        if isinstance(qkv, KernelLinear):
            parts = [qkv.weight]
        elif isinstance(qkv, PartsLinear):  # its parts have no bias of their own
            parts = [part.weight for part in qkv.parts]
        else:
            return None
        if not (
            attn.kernels
            and mlp.kernels
            and all(n.kernels and n.weight.dtype == torch.float32 for n in norms)
            and all(isinstance(p, KernelLinear) and p.bias is None for p in rest)
            and (qkv.bias is None or qkv.bias.dtype == torch.float32)
            and attn.q_norm is None
            and attn.tp.size == 1
        ):
            return None
        o, gate_up, down = (p.weight for p in rest)
        bias = None if qkv.bias is None else qkv.bias.data
        return ops.DecoderWeights(parts, o, gate_up, down, norms[0].weight, norms[1].weight, bias)


class CausalLM(nn.Module):
    """Decoder stack + LM head. Parameter names follow Hugging Face, except the fused
    ``qkv_proj`` and ``gate_up_proj`` (see :mod:`saguaro.models.loader`). With a tensor-parallel
    ``tp`` the model holds one rank's slices (:mod:`saguaro.models.parallel`) and every rank
    returns the full logits."""

    def __init__(self, cfg: ModelConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.config = cfg
        self.tp = tp
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(cfg, tp) for _ in range(cfg.num_hidden_layers))
        # The KV heads this rank caches: its own heads' keys and values only.
        self.num_kv_heads = cfg.num_key_value_heads // tp.size
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rotary = Rotary(
            cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling
        )
        if cfg.draft_vocab_size is None:
            self.head_token_ids: torch.Tensor | None = None
            self.lm_head = nn.Linear(cfg.hidden_size, self.embed_tokens.weight.shape[0], bias=False)
        else:
            if tp.size > 1:
                raise ValueError("a reduced output vocabulary (draft_vocab_size) is not split")
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
            self.register_buffer(
                "head_token_ids", torch.zeros(cfg.draft_vocab_size, dtype=torch.long)
            )
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._stack: ops.LayerStack | None | bool = False  # False: not looked at yet

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202 (nn.Module's signature)
        self._stack = False  # moved or cast weights: the stack's pointers are stale
        return super()._apply(fn, recurse)

    def layer_stack(self) -> ops.LayerStack | None:
        """The decoder layers as one kernel call, where every layer runs on the kernels
        (:meth:`DecoderLayer.kernel_weights`); looked at once, after the model is in place."""
        if self._stack is False:
            weights = [layer.kernel_weights() for layer in self.layers]
            cfg, attn = self.config, self.layers[0].self_attn
            self._stack = (
                ops.LayerStack(weights, attn.heads, attn.kv_heads, attn.head_dim, cfg.rms_norm_eps)
                if all(w is not None for w in weights) and weights
                else None
            )
        return self._stack

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Score ``input_ids`` ([T]) and return float32 logits at rows ``logits_index`` ([m, V]).
        Callers run it without autograd (the model runner does).

        With a reduced output vocabulary the head scores its ``head_token_ids`` only and every
        other token's logit is -inf: the draft's q is 0 there. Verification stays exact, since
        neither rule needs q > 0 where p > 0: rejection sampling accepts a proposal x with
        probability min(1, p(x)/q(x)) and draws a rejection's replacement from the residual
        max(p - q, 0), which carries p's whole mass outside the head's tokens; coupled sampling
        commits the target's own Gumbel-max whatever the draft proposed."""
        x = self.embed_tokens(input_ids)
        angles = self.rotary.cos_sin(positions, x.dtype)
        stack = self.layer_stack()
        if stack is not None and stack.fits(x, kv_caches):
            cos, sin = angles
            rows, scale = meta.token_rows(x.shape[0]), self.layers[0].self_attn.scale
            x = stack(
                x, cos, sin, meta.slot_mapping, kv_caches, meta.key_slots, meta.mask, rows, scale
            )
        else:
            for layer, kv in zip(self.layers, kv_caches, strict=True):
                x = layer(x, angles, meta, kv)
        if logits_index is not None:
            x = x[logits_index]
        logits = self.tp.all_gather_last(self.lm_head(self.norm(x)))
        if self.head_token_ids is not None:
            shape = (logits.shape[0], self.config.vocab_size)
            full = torch.full(shape, float("-inf"), dtype=torch.float32, device=logits.device)
            return full.index_copy_(1, self.head_token_ids, logits.float())
        return logits[:, : self.config.vocab_size].float()
