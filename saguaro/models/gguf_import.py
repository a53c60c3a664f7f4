"""Import a Llama, Qwen2 or Qwen3 GGUF file as a Hugging Face directory saguaro loads unchanged.

saguaro loads a ``.gguf`` path directly (:func:`saguaro.models.loader.load_model`); an import
is for tools that want a directory. ``import_gguf(FILE, OUT_DIR)`` writes ``config.json`` and
``generation_config.json`` from the file's hyper-parameters, ``model.safetensors`` from its
tensors, and ``tokenizer.json`` / ``tokenizer_config.json`` (chat template included) from its
byte-level BPE vocabulary (:mod:`saguaro.models.gguf_meta`).

The file itself is kept as ``model.gguf``, whose Q4_0/Q4_1/Q8_0 blocks the loader runs without
dequantizing (:mod:`saguaro.models.gguf_weights`). The safetensors weights are dequantized to
``dtype`` (float32 by default). For each block type the value is
exactly what llama.cpp computes: Q8_0 is ``d * q`` (one float16 scale per 32 weights), Q4_0
``d * (q - 8)``, Q4_1 ``d * q + m`` (a float16 scale and minimum per 32); F16 and BF16 widen
exactly. The query/key rows go back to the checkpoint's rotate-half order
(:mod:`saguaro.models.gguf_names`). The command is :mod:`saguaro.models.gguf_cli`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from saguaro.errors import ModelLoadError
from saguaro.models.config import ModelConfig
from saguaro.models.gguf_meta import hf_config, hf_tokenizer
from saguaro.models.gguf_reader import GGUFFile
from saguaro.models.gguf_weights import GGUF_NAME, check_types, checkpoint_tensors
from saguaro.models.loader import resolve_dtype

# Tensor types imported (by GGML's name); others are refused by name rather than guessed at.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


def hf_tensors(g: GGUFFile, cfg: ModelConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor under the checkpoint's name, in ``dtype``, q/k rows in rotate-half order for
    Llama."""
    check_types(g, TENSOR_TYPES)
    return {name: w.to(dtype).contiguous() for name, w in checkpoint_tensors(g, cfg)}


@contextlib.contextmanager
def replace_dir(out: Path) -> Iterator[Path]:
    """A directory to write ``out`` into: ``out.partial``, renamed into place when the block
    ends without error, so an interrupted write never leaves a directory that looks complete.
    An existing ``out`` is replaced only when it is empty or a model directory (it has
    ``config.json``): anything else is refused before any work, so a mistyped path loses
    nothing."""
    if out.exists() and not (
        out.is_dir() and (not any(out.iterdir()) or (out / "config.json").is_file())
    ):
        raise ModelLoadError(f"{out}: exists and is not a model directory; not replacing it")
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def import_gguf(path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write the GGUF file ``path`` as a Hugging Face directory ``out_dir`` (weights in
    ``dtype``) and return it; ``out_dir`` is replaced as :func:`replace_dir` says."""
    torch_dtype = resolve_dtype(dtype)
    out = Path(out_dir)
    with replace_dir(out) as tmp:
        g = GGUFFile.read(path)
        config, generation = hf_config(g)
        config["torch_dtype"] = str(torch_dtype).removeprefix("torch.")
        tokenizer, tokenizer_config = hf_tokenizer(g)
        cfg = ModelConfig.from_dict(config, generation, source=str(g.path))
        tensors = hf_tensors(g, cfg, torch_dtype)
        for name, value in (
            ("config.json", config),
            ("generation_config.json", generation),
            ("tokenizer.json", tokenizer),
            ("tokenizer_config.json", tokenizer_config),
        ):
            (tmp / name).write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
        save_file(
            tensors,
            str(tmp / "model.safetensors"),
            metadata={"format": "pt", "source": g.path.name},
        )
        keep_file(g.path, tmp / GGUF_NAME)
    return out


def keep_file(source: Path, dest: Path) -> None:
    """The GGUF file itself, whose quantized blocks saguaro runs as they are
    (:mod:`saguaro.models.gguf_weights`): a hard link where the file system allows, else a copy."""
    try:
        dest.hardlink_to(source)
    except OSError:
        shutil.copyfile(source, dest)
