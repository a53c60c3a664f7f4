"""Load a Llama-3 / Qwen3 checkpoint from a local Hugging Face directory.

Reads single-file or sharded safetensors, fuses ``q/k/v_proj`` into ``qkv_proj`` and
``gate/up_proj`` into ``gate_up_proj``, and checks that every parameter was filled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from saguaro.errors import ModelLoadError
from saguaro.models.config import ModelConfig
from saguaro.models.llama import CausalLM

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

# HF name suffix -> (fused saguaro name, shard index)
_FUSED = {
    "self_attn.q_proj": ("self_attn.qkv_proj", 0),
    "self_attn.k_proj": ("self_attn.qkv_proj", 1),
    "self_attn.v_proj": ("self_attn.qkv_proj", 2),
    "mlp.gate_proj": ("mlp.gate_up_proj", 0),
    "mlp.up_proj": ("mlp.gate_up_proj", 1),
}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(self_attn\.[qkv]_proj|mlp\.(?:gate|up)_proj)\.")


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


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    yield name, st.get_tensor(name)
        except (SafetensorError, OSError, RuntimeError) as e:
            raise ModelLoadError(f"{f}: corrupt or truncated safetensors file ({e})") from e


def load_model(
    model_dir: str | Path, dtype: str | torch.dtype = "float32", device: str | torch.device = "cpu"
) -> CausalLM:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise ModelLoadError(f"model directory {str(model_dir)!r} does not exist")
    cfg = ModelConfig.from_dir(model_dir)
    files = safetensors_files(model_dir)
    torch_dtype = resolve_dtype(dtype)
    with torch.device("meta"):
        model = CausalLM(cfg)
    params = dict(model.named_parameters())
    filled: dict[str, torch.Tensor] = {}
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    shard_sizes = {
        "self_attn.qkv_proj": [q, kv, kv],
        "mlp.gate_up_proj": [cfg.intermediate_size] * 2,
    }
    pieces: dict[str, list[torch.Tensor | None]] = {}
    for hf_name, tensor in iter_tensors(files):
        name = hf_name.removeprefix("model.")
        m = _LAYER_RE.match(hf_name)
        if m:
            fused, shard = _FUSED[m.group(2)]
            leaf = hf_name.rsplit(".", 1)[1]
            key = f"layers.{m.group(1)}.{fused}.{leaf}"
            pieces.setdefault(key, [None] * len(shard_sizes[fused]))[shard] = tensor
            continue
        if name not in params:
            if "rotary_emb" in name:
                continue
            raise ModelLoadError(f"{model_dir}: unexpected tensor {hf_name!r} in checkpoint")
        filled[name] = tensor
    for key, parts in pieces.items():
        if any(p is None for p in parts):
            raise ModelLoadError(f"{model_dir}: incomplete fused weight {key!r}")
        filled[key] = torch.cat(parts, dim=0)  # type: ignore[arg-type]
    if cfg.tie_word_embeddings or "lm_head.weight" not in filled:
        filled.pop("lm_head.weight", None)
        if not cfg.tie_word_embeddings:
            raise ModelLoadError(f"{model_dir}: lm_head.weight missing and embeddings not tied")
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
    model.load_state_dict(
        {k: v.to(torch_dtype) for k, v in filled.items()}, strict=False, assign=True
    )
    if cfg.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary = model.rotary.__class__(
        cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta, cfg.rope_scaling
    )
    return model.to(device).eval()
