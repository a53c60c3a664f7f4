"""A GGUF file's tensors under the checkpoint's names: dequantized to float32, or, for the linear
layers and the embedding, as saguaro's kernels run them without dequantizing.

Two loads read them. A ``.gguf`` path loads directly (:func:`saguaro.models.loader.load_model`):
its norms and biases as float tensors, every linear weight and the embedding as the file's
blocks, or everything dequantized where the model does not run on the kernels. A directory that
``saguaro import-gguf`` wrote keeps the file beside the dequantized checkpoint as
:data:`GGUF_NAME`, and with ``--quantization gguf`` its quantized linear weights come from the
file (:func:`gguf_linears`), the rest from the checkpoint.

Blocks map exactly: Q4_0/Q4_1 to int4 groups
(:func:`saguaro.models.quant.from_gguf_blocks`); Q4_K/Q5_K/Q6_K/Q5_0/Q5_1/Q8_0 stay as they are
(:func:`saguaro.models.quant.from_gguf_raw`, a view of the file's map). Llama's query and key rows
move back to the rotate-half order as whole rows (codes, scales and minima together), as the
dequantized ones do (:mod:`saguaro.models.gguf_names`).
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Iterator
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, quants

from saguaro.errors import ModelLoadError
from saguaro.kernels.ops import PackedWeight
from saguaro.models.config import ModelConfig
from saguaro.models.gguf_names import deinterleave_rope_rows, hf_tensor_name
from saguaro.models.gguf_reader import GGUFFile, GGUFTensor
from saguaro.models.llama import FUSED, FUSED_PARTS
from saguaro.models.quant import (
    GGUF_BLOCK_BYTES,
    RAW_FORMAT,
    concat_rows,
    from_gguf_blocks,
    from_gguf_raw,
    permute_rows,
)

GGUF_NAME = "model.gguf"  # the file ``saguaro import-gguf`` keeps in the directory it writes
FLOAT_TYPES = ("F32", "F16", "BF16")
# Block types kept as stored, views of the file's map; Q4_0/Q4_1 map exactly onto int4 groups
# instead, which the float kernels multiply by exactly the file's dequantized weights.
RAW_KINDS = tuple(kind for kind in RAW_FORMAT if kind not in GGUF_BLOCK_BYTES)
# Block types the kernels run without dequantizing.
PACKED_TYPES = (*GGUF_BLOCK_BYTES, *RAW_KINDS)
# Tensor types a .gguf loads from (by GGML's name); others are refused by name.
LOADABLE_TYPES = (*FLOAT_TYPES, *PACKED_TYPES)
# Packed weights of a model: module name -> its weight, or a fused module's parts in FUSED order
# where they differ in format.
Packed = dict[str, PackedWeight | list[PackedWeight]]


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


def check_types(g: GGUFFile, types: Collection[str]) -> None:
    """Refuse, naming it, the first tensor whose type is not in ``types``."""
    for t in g.tensors:
        if t.type_name not in types:
            raise ModelLoadError(
                f"{g.path}: tensor {t.name} has type {t.type_name}; saguaro reads "
                f"{', '.join(types)}"
            )


def _hf_name(t: GGUFTensor, path: Path) -> str | None:
    """The checkpoint's name of ``t``; None for llama.cpp's precomputed RoPE frequencies."""
    name = hf_tensor_name(t.name)
    if name is None and t.name != "rope_freqs.weight":
        raise ModelLoadError(f"{path}: unknown tensor {t.name}")
    return name


def _rope_heads(t: GGUFTensor, cfg: ModelConfig) -> int | None:
    """The heads whose rows move to the rotate-half order, for a Llama query or key tensor (in
    llama.cpp's ``llama`` they rotate adjacent pairs); None for every other tensor."""
    if cfg.family != "llama":
        return None
    kind = t.name.split(".")[-2]
    return {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}.get(kind)


def dequantized(t: GGUFTensor, cfg: ModelConfig) -> torch.Tensor:
    """One tensor as float32 in the checkpoint's row-major shape and row order."""
    values = quants.dequantize(t.data, GGMLQuantizationType(t.tensor_type))
    # a copy only where the values are the file's own (F32): the map is read-only
    w = torch.from_numpy(np.require(values, np.float32, ["C", "W"]).reshape(t.dims))
    heads = _rope_heads(t, cfg)
    return w if heads is None else deinterleave_rope_rows(w, heads)


def checkpoint_tensors(
    g: GGUFFile, cfg: ModelConfig, packed: Collection[str] = ()
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor under the checkpoint's name, dequantized to float32, except the weights of
    the modules in ``packed``: each of those is a meta tensor of its shape, a place the caller
    fills from the blocks (:func:`file_weights`)."""
    for t in g.tensors:
        name = _hf_name(t, g.path)
        if name is None:
            continue
        where = module_of(name)
        if where is not None and where[0] in packed:
            yield name, torch.empty(t.dims, device="meta")
        else:
            yield name, dequantized(t, cfg)


def _raw_view(rows: np.ndarray, kind: str, n: int, k: int) -> PackedWeight:
    """:func:`from_gguf_raw` of a view of the file's map: read-only, which torch warns of, but
    the kernels only read it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return from_gguf_raw(rows, kind, n, k)


def packed_weight(t: GGUFTensor, cfg: ModelConfig) -> PackedWeight:
    """A tensor of one of :data:`PACKED_TYPES` as the kernels run it, rows in the checkpoint's
    order."""
    n, k = t.dims
    if t.type_name in GGUF_BLOCK_BYTES:
        w = from_gguf_blocks(t.data, t.type_name, n, k)
    else:
        w = _raw_view(t.data, t.type_name, n, k)
    heads = _rope_heads(t, cfg)
    return w if heads is None else permute_rows(w, deinterleave_rope_rows(torch.arange(n), heads))


def fused_weight(
    g: GGUFFile, tensors: list[GGUFTensor], cfg: ModelConfig
) -> PackedWeight | list[PackedWeight]:
    """A fused layer's parts (in FUSED order) as one weight where they share a format, else as
    the list of their weights. Raw blocks that lie back to back in the file (a layer's gate and
    up often do) stay one view of it; others are copied together."""
    first = tensors[0]
    rows = g.joined_rows(tensors) if all(_rope_heads(t, cfg) is None for t in tensors) else None
    if rows is not None and first.type_name in RAW_KINDS:
        n = sum(t.dims[0] for t in tensors)
        return _raw_view(rows, first.type_name, n, first.dims[1])
    parts = [packed_weight(t, cfg) for t in tensors]
    return concat_rows(parts) if len({(p.fmt, p.group) for p in parts}) == 1 else parts


def file_weights(g: GGUFFile, cfg: ModelConfig) -> Packed:
    """Module name -> the file's blocks, for each linear layer whose weights are all of a type in
    :data:`PACKED_TYPES` (a fused layer: :func:`fused_weight`) and for ``embed_tokens``, whose
    blocks a tied head takes too."""
    whole: Packed = {}
    parts: dict[str, list[GGUFTensor | None]] = {}
    for t in g.tensors:
        hf = hf_tensor_name(t.name)
        where = module_of(hf) if hf is not None else None
        if where is None or t.type_name not in PACKED_TYPES:
            continue
        module, part = where
        if part < 0:
            whole[module] = packed_weight(t, cfg)
        else:
            fused = module.split(".", 2)[2]  # "layers.N." off
            parts.setdefault(module, [None] * FUSED_PARTS[fused])[part] = t
    for module, pieces in parts.items():
        if all(p is not None for p in pieces):
            whole[module] = fused_weight(g, pieces, cfg)  # type: ignore[arg-type]
    if cfg.tie_word_embeddings and "embed_tokens" in whole:
        whole["lm_head"] = whole["embed_tokens"]
    return whole


def gguf_linears(path: Path, cfg: ModelConfig) -> Packed:
    """:func:`file_weights` of the GGUF file kept in an imported directory."""
    whole = file_weights(GGUFFile.read(path), cfg)
    if not whole:
        raise ModelLoadError(f"{path}: no quantized linear weights to run as they are")
    return whole
