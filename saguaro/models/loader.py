"""Load a Llama-3 / Qwen2 / Qwen3 checkpoint from a local Hugging Face directory or a GGUF file.

Reads single-file or sharded safetensors, or a ``.gguf`` file's tensors, fuses ``q/k/v_proj``
into ``qkv_proj`` and ``gate/up_proj`` into ``gate_up_proj``, and checks that every parameter was
filled. A tensor-parallel rank reads only its own slice of each split safetensors weight (slices
are read from the memory-mapped file), so no rank ever holds the whole model.

A ``.gguf`` file on saguaro's CPU kernels is never dequantized: the model is built on the meta
device, its float tensors (norms, biases) are filled, and every linear layer and the embedding
run the file's blocks, most of them views of its memory map (:mod:`saguaro.models.gguf_weights`).
Elsewhere (``--kernels torch``, another device, tensor parallelism) it loads dequantized, as
dense weights.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

from saguaro.errors import ModelLoadError
from saguaro.models.config import ModelConfig
from saguaro.models.gguf_reader import GGUFFile, is_gguf
from saguaro.models.gguf_weights import (
    GGUF_NAME,
    LOADABLE_TYPES,
    Packed,
    check_types,
    checkpoint_tensors,
    file_weights,
    gguf_linears,
)
from saguaro.models.head import cut_draft_head, cut_packed_head
from saguaro.models.linear import use_kernels
from saguaro.models.llama import FUSED, FUSED_PARTS, CausalLM
from saguaro.models.parallel import SINGLE, TensorParallel

log = logging.getLogger("saguaro")

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

# A draft only proposes, so its precision moves speed and acceptance, never the output. Per-channel
# int8 reads a quarter of float32's bytes and keeps the shipped draft's acceptance; int4's groups
# cost some of it (docs/bench/kernels, "The draft in int8 by default").
DRAFT_AUTO_SCHEME = "int8"

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(self_attn\.[qkv]_proj|mlp\.(?:gate|up)_proj)\.")


def model_exists(path: Path) -> bool:
    """Whether ``path`` is a model: a directory, or a ``.gguf`` file that exists."""
    return path.is_dir() or (is_gguf(path) and path.is_file())


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)}") from None


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelLoadError(f"{index}: malformed shard index ({e})") from e
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelLoadError(f"{model_dir}: shards listed in the index are missing: {missing}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    raise ModelLoadError(f"{model_dir}: no model.safetensors or model.safetensors.index.json")


# A slice of one tensor: (dimension, start, end). ``end`` may pass the tensor's size: the rows
# past it read as zeros (the padded vocabulary of the last rank).
Slice = tuple[int, int, int]


def iter_tensors(
    files: list[Path], pick: Callable[[str], Slice | None] | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in ``files``; where ``pick(name)`` names a slice, only that slice is read."""
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    spec = pick(name) if pick is not None else None
                    if spec is None:
                        yield name, st.get_tensor(name)
                    else:
                        handle = st.get_slice(name)
                        yield name, take_slice(handle, handle.get_shape(), spec)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ModelLoadError(f"{f}: corrupt or truncated safetensors file ({e})") from e


def sliced(
    tensors: Iterable[tuple[str, torch.Tensor]], pick: Callable[[str], Slice | None] | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """``tensors``, each cut to the slice ``pick`` names for it (where it names one)."""
    for name, tensor in tensors:
        spec = pick(name) if pick is not None else None
        yield name, tensor if spec is None else take_slice(tensor, tensor.shape, spec)


def take_slice(source: Any, shape: Sequence[int], spec: Slice) -> torch.Tensor:
    """The slice ``spec`` of ``source`` (a tensor, or a safetensors slice handle) of ``shape``,
    padded with zeros past its end."""
    dim, start, end = spec
    size = shape[dim]
    index = (slice(None),) * dim + (slice(start, min(end, size)),)
    part = source[index]
    if end > size:
        pad = list(part.shape)
        pad[dim] = end - max(start, size)
        part = torch.cat([part, part.new_zeros(pad)], dim=dim)
    return part


def rank_slices(cfg: ModelConfig, tp: TensorParallel) -> Callable[[str], Slice | None]:
    """Which slice of a Hugging Face tensor rank ``tp.rank`` holds (None: all of it), following
    :mod:`saguaro.models.parallel`: q/k/v by heads and gate/up by columns (rows of the weight),
    o/down by their input columns, embedding and LM head by vocabulary rows."""
    d = cfg.head_dim
    heads = tp.split(cfg.num_attention_heads, "the number of attention heads")
    kv_heads = tp.split(cfg.num_key_value_heads, "the number of KV heads")
    inter = tp.split(cfg.intermediate_size, "intermediate_size")
    q_rows, kv_rows = (heads[0] * d, heads[1] * d), (kv_heads[0] * d, kv_heads[1] * d)
    by_suffix: dict[str, Slice] = {
        "self_attn.q_proj": (0, *q_rows),
        "self_attn.k_proj": (0, *kv_rows),
        "self_attn.v_proj": (0, *kv_rows),
        "self_attn.o_proj": (1, *q_rows),
        "mlp.gate_proj": (0, *inter),
        "mlp.up_proj": (0, *inter),
        "mlp.down_proj": (1, *inter),
        "embed_tokens": (0, *tp.vocab_rows(cfg.vocab_size)),
        "lm_head": (0, *tp.vocab_rows(cfg.vocab_size)),
    }

    def pick(name: str) -> Slice | None:
        module, _, leaf = name.rpartition(".")
        for suffix, spec in by_suffix.items():
            if module.endswith(suffix):
                # A bias has one dimension: a row-parallel layer's bias is not split.
                return spec if leaf == "weight" or spec[0] == 0 else None
        return None

    return pick


def checked_head_ids(ids: torch.Tensor, vocab_size: int, model_dir: Path) -> torch.Tensor:
    """A reduced head's token ids: distinct integers in [0, vocab_size)."""
    if ids.dtype.is_floating_point or ids.dim() != 1:
        raise ModelLoadError(f"{model_dir}: lm_head.token_ids must be a 1-D integer tensor")
    ids = ids.long()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ModelLoadError(f"{model_dir}: lm_head.token_ids outside [0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise ModelLoadError(f"{model_dir}: lm_head.token_ids repeats a token")
    return ids


def resolve_quantization(
    model_dir: Path,
    quantization: str,
    kernels: bool,
    tp: TensorParallel = SINGLE,
    draft: bool = False,
) -> str:
    """``auto``: the GGUF file's own blocks where the model is a ``.gguf`` file or a directory
    holding one (``model.gguf``, which ``saguaro import-gguf`` writes beside the dequantized
    weights) and the model runs on saguaro's kernels in one rank; otherwise, for a ``draft``,
    :data:`DRAFT_AUTO_SCHEME` on those kernels, and the dense weights (``none``) for a target.
    A ``.gguf`` file's weights are quantized already: a scheme that would quantize them again
    is refused."""
    blocks = is_gguf(model_dir) or (model_dir / GGUF_NAME).is_file()
    if quantization == "auto":
        if not kernels or tp.size > 1:
            return "none"
        if blocks:
            return "gguf"
        return DRAFT_AUTO_SCHEME if draft else "none"
    if quantization != "none" and tp.size > 1:
        raise ModelLoadError(
            f"quantized weights ({quantization}) are not split over tensor-parallel ranks; use "
            "--quantization none with --tensor-parallel-size > 1"
        )
    if quantization == "gguf" and not blocks:
        raise ModelLoadError(
            f"{model_dir}: --quantization gguf needs {GGUF_NAME} in the model directory "
            "(saguaro import-gguf writes it)"
        )
    if is_gguf(model_dir) and quantization not in ("gguf", "none"):
        raise ModelLoadError(
            f"{model_dir}: a GGUF file's weights are quantized already, not again as "
            f"{quantization}; use --quantization auto, gguf (its blocks) or none (dequantized)"
        )
    return quantization


def load_model(
    model_dir: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    tp: TensorParallel = SINGLE,
    quantization: str = "none",
    kernels: bool = False,
    draft: bool = False,
    head_tokens: int | None = None,
) -> CausalLM:
    """The model in ``model_dir`` (a directory or a ``.gguf`` file), or rank ``tp.rank``'s
    slices of it. With ``kernels`` it runs on saguaro's batch-invariant kernels
    (:mod:`saguaro.models.linear`), its linear weights as ``quantization`` says: ``none``
    (dense, in ``dtype``), ``gguf`` (the GGUF file's blocks), one of
    :data:`saguaro.models.quant.SCHEMES` (quantized now), or ``auto``
    (:func:`resolve_quantization`, which a ``draft`` resolves on its own terms). A draft's head
    keeps ``head_tokens`` rows where that is given (:mod:`saguaro.models.head`)."""
    path = Path(model_dir)
    on_cpu = torch.device(device).type == "cpu"
    kernels = kernels and on_cpu  # the kernels are CPU code
    scheme = resolve_quantization(path, quantization, kernels, tp, draft)
    weights: Packed | None = None
    if scheme == "gguf" and is_gguf(path):
        if not on_cpu:
            raise ModelLoadError(
                f"{path}: a GGUF file's blocks run on the CPU; on {device} use --quantization "
                "none (its weights dequantized)"
            )
        model, weights = load_blocks(path, dtype)
    else:
        model = load_dense(path, dtype, tp)
        if scheme == "gguf":
            weights = gguf_linears(path / GGUF_NAME, model.config)
    if weights is not None:
        cut_packed_head(model, weights, path, head_tokens)
    if kernels or scheme != "none":
        _use_kernels(model, "none" if scheme == "gguf" else scheme, weights, kernels, path)
    if weights is not None:  # the blocks the kernels copied need not stay resident as well
        GGUFFile.read(path if is_gguf(path) else path / GGUF_NAME).release_pages()
    _check_loaded(model, path)
    cut_draft_head(model, path, head_tokens)
    return model.to(device).eval()


def _use_kernels(
    model: CausalLM, scheme: str, weights: Packed | None, everywhere: bool, path: Path
) -> None:
    """Put ``model`` on saguaro's kernels (:func:`use_kernels`), warning where some of its
    modules stay on torch's operators."""
    on_torch = use_kernels(model, scheme, weights, everywhere=everywhere)
    if on_torch:
        log.warning(
            "saguaro: %s: %d modules (e.g. %s) have shapes saguaro's kernels do not take and "
            "run on torch's operators: this model's logits are not batch-invariant",
            path,
            len(on_torch),
            on_torch[0],
        )


def _check_loaded(model: CausalLM, path: Path) -> None:
    """Refuse a model with a tensor still on the meta device (a place nothing filled)."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise ModelLoadError(f"{path}: {name} was not loaded")


def _named_params(model: CausalLM, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The tensors the checkpoint fills, by name: the parameters, and a reduced head's token
    ids (a buffer, read as one)."""
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    if cfg.draft_vocab_size is not None:
        params["lm_head.token_ids"] = model.head_token_ids
    return params


def _fused(
    pieces: dict[str, list[torch.Tensor | None]], model_dir: Path
) -> dict[str, torch.Tensor]:
    """Each fused weight, its parts (in ``FUSED`` order) concatenated along the rows."""
    fused: dict[str, torch.Tensor] = {}
    for key, parts in pieces.items():
        if any(p is None for p in parts):
            raise ModelLoadError(f"{model_dir}: incomplete fused weight {key!r}")
        fused[key] = _cat_rows(parts)  # type: ignore[arg-type]
    return fused


def _cat_rows(parts: list[torch.Tensor]) -> torch.Tensor:
    """``parts`` concatenated along the rows; meta parts (places for a GGUF file's blocks) make
    a meta tensor without ``torch.cat``, whose meta kernel imports torch._dynamo (seconds)."""
    if parts[0].is_meta:
        rows = sum(p.shape[0] for p in parts)
        return torch.empty(rows, *parts[0].shape[1:], dtype=parts[0].dtype, device="meta")
    return torch.cat(parts, dim=0)


def _read_checkpoint(
    tensors: Iterable[tuple[str, torch.Tensor]],
    params: dict[str, torch.Tensor],
    model_dir: Path,
) -> dict[str, torch.Tensor]:
    """Every tensor of ``tensors`` (checkpoint name, value) under the model's name, q/k/v and
    gate/up fused; a tensor the model has no place for is refused, except rotary tables (the
    model computes its own)."""
    filled: dict[str, torch.Tensor] = {}
    pieces: dict[str, list[torch.Tensor | None]] = {}
    for hf_name, tensor in tensors:
        name = hf_name.removeprefix("model.")
        m = _LAYER_RE.match(hf_name)
        if m:
            fused, shard = FUSED[m.group(2)]
            leaf = hf_name.rsplit(".", 1)[1]
            key = f"layers.{m.group(1)}.{fused}.{leaf}"
            pieces.setdefault(key, [None] * FUSED_PARTS[fused])[shard] = tensor
            continue
        if name not in params:
            if "rotary_emb" in name:
                continue
            raise ModelLoadError(f"{model_dir}: unexpected tensor {hf_name!r} in checkpoint")
        filled[name] = tensor
    filled.update(_fused(pieces, model_dir))
    return filled


def _drop_tied_head(filled: dict[str, torch.Tensor], cfg: ModelConfig, model_dir: Path) -> None:
    """Remove ``lm_head.weight`` from ``filled`` where the head is the embedding (tied); an
    untied head must be in the checkpoint."""
    if cfg.tie_word_embeddings:
        filled.pop("lm_head.weight", None)
    elif "lm_head.weight" not in filled:
        raise ModelLoadError(f"{model_dir}: lm_head.weight missing and embeddings not tied")


def _check_filled(
    filled: dict[str, torch.Tensor], params: dict[str, torch.Tensor], model_dir: Path
) -> None:
    """Raise unless ``filled`` holds every tensor of ``params``, each in its shape."""
    missing = sorted(set(params) - set(filled))
    if missing:
        raise ModelLoadError(
            f"{model_dir}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}"
        )
    for name, tensor in filled.items():
        if tuple(tensor.shape) != tuple(params[name].shape):
            raise ModelLoadError(
                f"{model_dir}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"config implies {tuple(params[name].shape)}"
            )


def _assign(
    model: CausalLM,
    filled: dict[str, torch.Tensor],
    dtype: torch.dtype,
    cfg: ModelConfig,
    model_dir: Path,
) -> None:
    """Put the checked tensors of ``filled`` in ``model`` (the parameters in ``dtype``) and tie
    its head to the embedding where the config says so."""
    head_ids = filled.pop("lm_head.token_ids", None)
    model.load_state_dict({k: v.to(dtype) for k, v in filled.items()}, strict=False, assign=True)
    if head_ids is not None:
        model.head_token_ids = checked_head_ids(head_ids, cfg.vocab_size, model_dir)
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight


def load_dense(
    model_dir: str | Path, dtype: str | torch.dtype, tp: TensorParallel = SINGLE
) -> CausalLM:
    """The checkpoint's weights (a ``.gguf`` file's dequantized) in ``dtype`` on the CPU (rank
    ``tp.rank``'s slices)."""
    path = Path(model_dir)
    torch_dtype = resolve_dtype(dtype)
    g = _read_gguf(path) if is_gguf(path) else None
    cfg = ModelConfig.from_gguf(g) if g is not None else _dir_config(path)
    tp.check(cfg)
    pick = rank_slices(cfg, tp) if tp.size > 1 else None
    if g is None:
        tensors = iter_tensors(safetensors_files(path), pick)
    else:
        tensors = sliced(((n, t.to(torch_dtype)) for n, t in checkpoint_tensors(g, cfg)), pick)
    return _build(cfg, tp, tensors, torch_dtype, path)


def _dir_config(model_dir: Path) -> ModelConfig:
    """The config of a model directory, which must exist."""
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory {str(model_dir)!r} does not exist")
    return ModelConfig.from_dir(model_dir)


def load_blocks(path: Path, dtype: str | torch.dtype) -> tuple[CausalLM, Packed]:
    """A ``.gguf`` file's model with its float tensors (norms, biases, any float weight) in
    ``dtype`` and the blocks of its linear layers and embedding, which :func:`use_kernels` puts
    in place; until then their weights are meta tensors (nothing is dequantized)."""
    g = _read_gguf(path)
    cfg = ModelConfig.from_gguf(g)
    weights = file_weights(g, cfg)
    model = _build(cfg, SINGLE, checkpoint_tensors(g, cfg, weights), resolve_dtype(dtype), path)
    return model, weights


def _read_gguf(path: Path) -> GGUFFile:
    """A ``.gguf`` file whose every tensor is of a type the loader reads."""
    g = GGUFFile.read(path)
    check_types(g, LOADABLE_TYPES)
    return g


def _build(
    cfg: ModelConfig,
    tp: TensorParallel,
    tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype,
    model_dir: Path,
) -> CausalLM:
    """The model of ``cfg`` (rank ``tp.rank``'s slices) holding ``tensors``, checked to fill
    every parameter, in ``dtype``."""
    with torch.device("meta"):
        model = CausalLM(cfg, tp)
    params = _named_params(model, cfg)
    filled = _read_checkpoint(tensors, params, model_dir)
    _drop_tied_head(filled, cfg, model_dir)
    _check_filled(filled, params, model_dir)
    _assign(model, filled, dtype, cfg, model_dir)
    return model
