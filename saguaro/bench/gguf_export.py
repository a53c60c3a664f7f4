"""Write a saguaro-loadable Hugging Face directory (Llama or Qwen3) as one GGUF file, so that
llama.cpp can run the same weights as a bench peer.

The file holds the architecture's hyper-parameters, the byte-level BPE tokenizer of
``tokenizer.json`` (tokens, token types, merges, BOS/EOS) and every tensor under llama.cpp's name.
Two conventions differ from the Hugging Face checkpoint:

* the rows of ``q_proj`` and ``k_proj`` are reordered per head for llama.cpp's ``llama``
  rotary layout (:mod:`saguaro.models.gguf_names`);
* GGUF lists a tensor's dimensions innermost first; a row-major ``[out, in]`` matrix is stored as
  is and its GGUF shape reads ``[in, out]``.

Uses the ``gguf`` package (a core dependency).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from saguaro.models.config import ModelConfig
from saguaro.models.gguf_names import gguf_tensor_name, interleave_rope_rows
from saguaro.models.loader import iter_tensors, safetensors_files

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType, GGUFWriter

# File types written: matrices in the named type (vectors such as norms always f32), by
# (GGML tensor type, general.file_type) names in the gguf package.
DTYPES = {
    "f32": ("F32", "ALL_F32"),
    "f16": ("F16", "MOSTLY_F16"),
    "bf16": ("BF16", "MOSTLY_BF16"),
    "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
    "q4_0": ("Q4_0", "MOSTLY_Q4_0"),
    "q4_1": ("Q4_1", "MOSTLY_Q4_1"),
}
# llama.cpp's name for the regex pre-tokenizer of GPT-2 style byte-level BPE, which splits text
# as the Hugging Face ByteLevel pre-tokenizer with use_regex does.
PRE_TOKENIZER = "gpt-2"
# llama.cpp requires at least one merge, and GGUF cannot store an empty list: a vocabulary without
# merges (bytes only) gets this one, which never applies (BPE works on single characters of
# byte-level text, and this pair's halves are longer).
NO_MERGE = "<|saguaro_no_merge|> <|saguaro_no_merge|>"
# Name of the filler tokens added when config.json's vocabulary is larger than the tokenizer's.
PAD_TOKEN = "<|saguaro_pad_{}|>"


# Increased when a change makes earlier exports wrong: cached files carry it in their names.
# 2: a reduced output vocabulary is written as a full head.
EXPORT_VERSION = 2
# A reduced output vocabulary's tensors, written as a full head (converted_tensors).
REDUCED_HEAD = ("lm_head.weight", "lm_head.token_ids")


def _check_supported(cfg: ModelConfig) -> None:
    if cfg.rope_scaling is not None:
        raise ValueError(
            f"{cfg.architecture} with {cfg.rope_scaling} RoPE scaling: not written as GGUF "
            "(only unscaled RoPE is supported)"
        )


def converted_tensors(model_dir: Path, cfg: ModelConfig) -> Iterator[tuple[str, torch.Tensor]]:
    """(llama.cpp name, float32 tensor) for every tensor the GGUF file holds, q/k rows reordered
    for the ``llama`` architecture; the output matrix is left out when tied to the embedding.

    llama.cpp holds no reduced output vocabulary (a draft's ``draft_vocab_size`` rows and their
    ``lm_head.token_ids``): such a head is written with every token's row, its own rows at their
    tokens' ids and zeros elsewhere. A token outside the head then scores 0 instead of saguaro's
    ``-inf``, so llama.cpp's greedy draft proposes what saguaro's does wherever the head's best
    logit is positive; the proposals are verified either way."""
    interleave = cfg.family == "llama"
    heads = {"attn_q": cfg.num_attention_heads, "attn_k": cfg.num_key_value_heads}
    reduced: dict[str, torch.Tensor] = {}
    for hf_name, tensor in iter_tensors(safetensors_files(model_dir)):
        if cfg.draft_vocab_size is not None and hf_name in REDUCED_HEAD:
            reduced[hf_name] = tensor
            continue
        name = gguf_tensor_name(hf_name)
        if name is None or (name == "output.weight" and cfg.tie_word_embeddings):
            continue
        t = tensor.to(torch.float32)
        kind = name.split(".")[-2]
        if interleave and kind in heads:
            t = interleave_rope_rows(t, heads[kind])
        yield name, t
    if reduced:
        rows, ids = reduced["lm_head.weight"], reduced["lm_head.token_ids"]
        full = torch.zeros(cfg.vocab_size, rows.shape[1], dtype=torch.float32)
        yield "output.weight", full.index_copy_(0, ids.long(), rows.to(torch.float32))


def _tokenizer_fields(model_dir: Path, vocab_size: int) -> dict[str, Any]:
    """Tokens in id order, their types, merges and the BOS/EOS/add-BOS settings of a byte-level
    BPE ``tokenizer.json``."""
    from gguf import TokenType

    raw = json.loads((model_dir / "tokenizer.json").read_text())
    model = raw["model"]
    if model.get("type") != "BPE":
        raise ValueError(f"{model_dir}: tokenizer model {model.get('type')!r} is not BPE")
    by_id: dict[int, str] = {i: t for t, i in model["vocab"].items()}
    special: set[int] = set()
    for added in raw.get("added_tokens", []):
        by_id[added["id"]] = added["content"]
        if added.get("special"):
            special.add(added["id"])
    size = max(vocab_size, max(by_id) + 1)
    tokens, types = [], []
    for i in range(size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(TokenType.CONTROL if i in special else TokenType.NORMAL)
        else:
            tokens.append(PAD_TOKEN.format(i))
            types.append(TokenType.UNUSED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    # BOS is added where the post-processor puts a special token before the text.
    post = raw.get("post_processor") or {}
    single = post.get("single", []) if post.get("type") == "TemplateProcessing" else []
    add_bos = bool(single) and "SpecialToken" in single[0]
    cfg_path = model_dir / "tokenizer_config.json"
    tcfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
    ids = {t: i for i, t in by_id.items()}

    def token_id(entry: Any) -> int | None:
        text = entry.get("content") if isinstance(entry, dict) else entry
        return ids.get(text) if text else None

    return {
        "tokens": tokens,
        "types": types,
        "merges": merges,
        "bos": token_id(tcfg.get("bos_token")),
        "eos": token_id(tcfg.get("eos_token")),
        "add_bos": add_bos,
    }


def _arch_name(cfg: ModelConfig) -> str:
    """llama.cpp's architecture name for the model's family."""
    import gguf

    return gguf.MODEL_ARCH_NAMES[
        gguf.MODEL_ARCH.QWEN3 if cfg.family == "qwen3" else gguf.MODEL_ARCH.LLAMA
    ]


def _add_hyperparameters(w: GGUFWriter, cfg: ModelConfig) -> None:
    """Add the architecture's hyper-parameters to ``w``."""
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)


def _add_tokenizer(w: GGUFWriter, tok: dict[str, Any], cfg: ModelConfig) -> None:
    """Add the byte-level BPE tokenizer ``tok`` (:func:`_tokenizer_fields`) to ``w``; the EOS
    token is ``config.json``'s first where it names one, else the tokenizer's."""
    w.add_tokenizer_model("gpt2")  # llama.cpp's name for byte-level BPE
    w.add_tokenizer_pre(PRE_TOKENIZER)
    w.add_token_list(tok["tokens"])
    w.add_token_types(tok["types"])
    w.add_token_merges(tok["merges"] or [NO_MERGE])
    if tok["bos"] is not None:
        w.add_bos_token_id(tok["bos"])
    eos = cfg.eos_token_ids[0] if cfg.eos_token_ids else tok["eos"]
    if eos is not None:
        w.add_eos_token_id(eos)
    w.add_add_bos_token(tok["add_bos"])
    w.add_add_eos_token(False)


def _add_tensor(w: GGUFWriter, name: str, array: np.ndarray, qtype: GGMLQuantizationType) -> None:
    """Add ``array`` to ``w`` as ``qtype``; a vector is always written as float32."""
    import gguf.quants

    if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:
        w.add_tensor(name, array)
    elif qtype == gguf.GGMLQuantizationType.F16:
        w.add_tensor(name, array.astype(np.float16))
    else:  # bytes of blocks along the rows, as llama.cpp stores them
        w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)


def _write_and_close(w: GGUFWriter) -> None:
    """Write the header, fields and tensors added to ``w`` to its file, then close it."""
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
    finally:
        w.close()


def export_gguf(model_dir: str | Path, out_path: str | Path, dtype: str = "f32") -> Path:
    """Write ``model_dir`` as the GGUF file ``out_path`` (matrices in ``dtype``, one of
    :data:`DTYPES`; vectors such as norms always f32) and return its path. The file is written
    next to its final name and renamed into place, so a half-written file never has the final
    name."""
    import gguf

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
    model_dir, out_path = Path(model_dir), Path(out_path)
    cfg = ModelConfig.from_dir(model_dir)
    _check_supported(cfg)
    tok = _tokenizer_fields(model_dir, cfg.vocab_size)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".part")
    w = gguf.GGUFWriter(tmp, _arch_name(cfg))
    w.add_name(model_dir.name)
    _add_hyperparameters(w, cfg)
    w.add_vocab_size(len(tok["tokens"]))
    tensor_kind, file_kind = DTYPES[dtype]
    qtype = gguf.GGMLQuantizationType[tensor_kind]
    w.add_file_type(gguf.LlamaFileType[file_kind])
    _add_tokenizer(w, tok, cfg)
    for name, t in converted_tensors(model_dir, cfg):
        _add_tensor(w, name, t.numpy(), qtype)
    _write_and_close(w)
    tmp.replace(out_path)
    return out_path


def main(argv: list[str] | None = None) -> int:
    """``python -m saguaro.bench.gguf_export MODEL_DIR OUT.gguf [--dtype f16]``."""
    p = argparse.ArgumentParser(description="Write a Hugging Face model directory as GGUF.")
    p.add_argument("model_dir")
    p.add_argument("out")
    p.add_argument("--dtype", choices=DTYPES, default="f32")
    a = p.parse_args(argv)
    print(export_gguf(a.model_dir, a.out, a.dtype))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
