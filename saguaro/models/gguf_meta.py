"""What a GGUF file's fields say: the model's ``config.json`` and ``generation_config.json``
(:func:`hf_config`), and its byte-level BPE tokenizer as ``tokenizer.json`` and
``tokenizer_config.json`` (:func:`hf_tokenizer`, chat template included), as dictionaries. The
importer (:mod:`saguaro.models.gguf_import`) writes them out; loading a ``.gguf`` directly
(:class:`saguaro.models.config.ModelConfig`, :class:`saguaro.models.tokenizer.Tokenizer`) uses
them in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from saguaro.errors import ModelLoadError
from saguaro.models.gguf_reader import GGUFFile

# general.architecture -> (config.json architecture, model_type)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}
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
# tokenizer.ggml.pre -> the normalizer its tokenizer.json has (none where not listed)
NORMALIZERS: dict[str, dict[str, Any]] = {"qwen2": {"type": "NFC"}}
# GGUF token types (gguf.TokenType): control tokens are special, user-defined ones are added;
# a file without types has only normal tokens.
_NORMAL, _CONTROL, _USER_DEFINED = 1, 3, 4
# The context length of a file that does not give one.
_DEFAULT_CONTEXT_LENGTH = 2048


def architecture(g: GGUFFile) -> str:
    """The file's architecture, one saguaro reads (else a ModelLoadError naming it)."""
    arch = g.need("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(
            f"{g.path}: unsupported GGUF architecture {arch!r}; saguaro reads "
            f"{sorted(ARCHITECTURES)}"
        )
    return str(arch)


def hf_config(g: GGUFFile) -> tuple[dict[str, Any], dict[str, Any]]:
    """``config.json`` and ``generation_config.json`` for the file's hyper-parameters."""
    arch = architecture(g)
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
    architecture(g)  # a model saguaro cannot run is named as such, not by its vocabulary
    v = _read_vocab(g)
    added = _added_tokens(v)
    post = _bos_post_processor(v.tokens[v.bos_id], v.bos_id) if v.add_bos else None
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": NORMALIZERS.get(g.fields.get("tokenizer.ggml.pre", "default")),
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
