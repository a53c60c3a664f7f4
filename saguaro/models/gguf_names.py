"""The correspondence between a Hugging Face Llama/Qwen3 checkpoint and a GGUF file: tensor names
and the query/key row order, shared by the importer (:mod:`saguaro.models.gguf_import`) and the
bench's exporter (:mod:`saguaro.bench.gguf_export`).

llama.cpp's ``llama`` architecture rotates adjacent pairs (2i, 2i+1) of each query/key head,
whereas the checkpoint's attention rotates the pair (i, i + d/2) ("rotate half"), so the rows of
``q_proj`` and ``k_proj`` are reordered per head in one direction on export and in the other on
import; both orders give the same attention scores. ``qwen3`` in llama.cpp rotates halves itself.
"""

from __future__ import annotations

import torch

# checkpoint name (per layer, after "model.layers.N.") -> llama.cpp name (after "blk.N.")
LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.bias": "attn_output.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
GLOBAL_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_PREFIX = "model.layers."


def interleave_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows (dim 0) of a query/key projection, head by head, from the rotate-half
    layout to the adjacent-pairs layout: within each head of d rows, row j < d/2 moves to 2j and
    row d/2 + j to 2j + 1. Works for weights [n_heads*d, in] and biases [n_heads*d]."""
    rows = w.shape[0]
    if rows % n_heads or (rows // n_heads) % 2:
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of even size")
    half = rows // n_heads // 2
    rest = w.shape[1:]
    # [heads, 2 (which half), half, ...] -> [heads, half, 2, ...]: pair j = (first[j], second[j])
    return w.reshape(n_heads, 2, half, *rest).transpose(1, 2).reshape(rows, *rest).contiguous()


def gguf_tensor_name(hf_name: str) -> str | None:
    """llama.cpp's name for a checkpoint tensor; None for tensors llama.cpp does not use
    (e.g. the rotary inverse frequencies some checkpoints store)."""
    if hf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[hf_name]
    if hf_name.startswith(LAYER_PREFIX):
        layer, _, rest = hf_name[len(LAYER_PREFIX) :].partition(".")
        if rest in LAYER_TENSORS:
            return f"blk.{int(layer)}.{LAYER_TENSORS[rest]}"
    return None


def deinterleave_rope_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of :func:`interleave_rope_rows`: within each head of d rows, row 2j moves to j
    and row 2j + 1 to d/2 + j."""
    rows = w.shape[0]
    if rows % n_heads or (rows // n_heads) % 2:
        raise ValueError(f"{rows} rows do not split into {n_heads} heads of even size")
    half = rows // n_heads // 2
    rest = w.shape[1:]
    return w.reshape(n_heads, half, 2, *rest).transpose(1, 2).reshape(rows, *rest).contiguous()


def hf_tensor_name(gguf_name: str) -> str | None:
    """The checkpoint's name for a llama.cpp tensor; None for names it has no counterpart of."""
    for hf, gg in GLOBAL_TENSORS.items():
        if gg == gguf_name:
            return hf
    if gguf_name.startswith("blk."):
        layer, _, rest = gguf_name[len("blk.") :].partition(".")
        for hf, gg in LAYER_TENSORS.items():
            if gg == rest and layer.isdigit():
                return f"{LAYER_PREFIX}{int(layer)}.{hf}"
    return None
