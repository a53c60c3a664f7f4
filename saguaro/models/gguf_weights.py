"""A GGUF file's quantized linear weights as saguaro's kernels run them, without dequantizing.

``saguaro import-gguf`` keeps the file beside the dequantized checkpoint as ``model.gguf``; with
``--quantization gguf`` (the default for such a directory) the loader takes every Q4_0, Q4_1
and Q8_0 linear weight from it (:func:`saguaro.models.quant.from_gguf_blocks`, an exact
mapping) and the rest (norms, the embedding table, any F32/F16 weight) from the checkpoint,
which holds those tensors' exact values. Query and key rows move back to the rotate-half order
as whole rows (codes, scales and minima together), as the importer moves the dequantized ones.
"""

from __future__ import annotations

from pathlib import Path

import torch

from saguaro.errors import ModelLoadError
from saguaro.kernels.ops import PackedWeight
from saguaro.models.config import ModelConfig
from saguaro.models.gguf_import import GGUFFile
from saguaro.models.gguf_names import deinterleave_rope_rows, hf_tensor_name
from saguaro.models.llama import FUSED, FUSED_PARTS
from saguaro.models.quant import GGUF_BLOCK_BYTES, concat_rows, from_gguf_blocks, permute_rows


def module_of(hf_name: str) -> tuple[str, int] | None:
    """saguaro's linear module for a checkpoint weight, and its part of a fused one (-1: whole)."""
    if not hf_name.endswith(".weight"):
        return None
    name = hf_name.removesuffix(".weight").removeprefix("model.")
    if name in ("lm_head", "embed_tokens"):
        return name, -1
    layer, _, proj = name.partition(".")
    if layer != "layers":
        return None
    index, _, proj = proj.partition(".")
    if proj in FUSED:
        fused, part = FUSED[proj]
        return f"layers.{index}.{fused}", part
    if proj in ("self_attn.o_proj", "mlp.down_proj"):
        return name, -1
    return None


def gguf_linears(path: Path, cfg: ModelConfig) -> dict[str, PackedWeight]:
    """Module name -> packed weight, for each linear layer whose GGUF weights are all in a block
    type the kernels read, and ``embed_tokens`` (the embedding's blocks, which the tied or
    absent LM head takes too)."""
    import gguf

    g = GGUFFile.read(path)
    heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}
    interleaved = cfg.family == "llama"
    whole: dict[str, PackedWeight] = {}
    parts: dict[str, list[PackedWeight | None]] = {}
    for t in g.tensors:
        kind = gguf.GGMLQuantizationType(t.tensor_type).name
        hf = hf_tensor_name(t.name)
        where = module_of(hf) if hf is not None else None
        if where is None or kind not in GGUF_BLOCK_BYTES:
            continue
        n, k = (int(x) for x in reversed(t.shape))
        w = from_gguf_blocks(t.data, kind, n, k)
        proj = hf.split(".")[-2]
        if interleaved and proj in heads:
            w = permute_rows(w, deinterleave_rope_rows(torch.arange(n), heads[proj]))
        module, part = where
        if part < 0:
            whole[module] = w
        else:
            fused = module.split(".", 2)[2]  # "layers.N." off
            parts.setdefault(module, [None] * FUSED_PARTS[fused])[part] = w
    for module, pieces in parts.items():
        if all(p is not None for p in pieces) and len({(p.fmt, p.group) for p in pieces}) == 1:
            whole[module] = concat_rows(pieces)  # type: ignore[arg-type]
    embed = whole.get("embed_tokens")  # the embedding's own rows, and the tied head's
    if "lm_head" not in whole and embed is not None:
        whole["lm_head"] = embed
    if not whole:
        raise ModelLoadError(f"{path}: no Q4_0, Q4_1 or Q8_0 linear weights to run as they are")
    return whole
