"""Model configuration parsed from a Hugging Face ``config.json``, or from a GGUF file's fields
(:func:`saguaro.models.gguf_meta.hf_config` writes them as one)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saguaro.errors import ModelLoadError
from saguaro.models.gguf_meta import hf_config
from saguaro.models.gguf_reader import GGUFFile, is_gguf

# config.json `architectures` entry -> family handled by saguaro.models.llama
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
# Families whose q/k/v projections always have biases (Qwen2's config has no attention_bias).
QKV_BIAS_FAMILIES = ("qwen2",)
# Hugging Face's LlamaConfig defaults, for configs that leave these fields out.
DEFAULT_RMS_NORM_EPS = 1e-6
DEFAULT_ROPE_THETA = 10000.0
DEFAULT_MAX_POSITION_EMBEDDINGS = 2048


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency-dependent RoPE scaling (``rope_type == "llama3"``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False
    qk_norm: bool = False
    rope_scaling: RopeScaling | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None
    # A draft's reduced output vocabulary: its LM head scores only these many token ids (listed
    # by the checkpoint's ``lm_head.token_ids``); None: the whole vocabulary.
    draft_vocab_size: int | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        """The config of a Hugging Face directory, or of a ``.gguf`` file."""
        if is_gguf(model_dir):
            return cls.from_gguf(GGUFFile.read(model_dir))
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ModelLoadError(
                f"{model_dir}: no config.json (not a Hugging Face model directory)"
            )
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{path}: malformed JSON ({e})") from e
        gen_path = Path(model_dir) / "generation_config.json"
        gen: dict[str, Any] = {}
        if gen_path.is_file():
            try:
                gen = json.loads(gen_path.read_text())
            except json.JSONDecodeError as e:
                raise ModelLoadError(f"{gen_path}: malformed JSON ({e})") from e
        return cls.from_dict(raw, gen, source=str(path))

    @classmethod
    def from_gguf(cls, g: GGUFFile) -> ModelConfig:
        """The config a GGUF file's fields give."""
        raw, gen = hf_config(g)
        return cls.from_dict(raw, gen, source=str(g.path))

    @classmethod
    def from_dict(
        cls, raw: dict[str, Any], gen: dict[str, Any] | None = None, source: str = "config"
    ) -> ModelConfig:
        """The config of ``raw`` (a ``config.json``) and ``gen`` (its
        ``generation_config.json``, whose token ids win); ModelLoadError naming ``source`` for
        an architecture or a field saguaro cannot serve."""
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{source}: expected a JSON object")
        gen = gen or {}
        arch = _architecture(raw, source)
        family = SUPPORTED_ARCHITECTURES[arch]
        hidden = int(_need(raw, "hidden_size", source))
        heads = int(_need(raw, "num_attention_heads", source))
        head_dim = raw.get("head_dim") or hidden // heads
        if raw.get("use_sliding_window"):
            raise ModelLoadError(f"{source}: sliding-window attention is not supported")
        head = _draft_vocab_size(raw, source)
        return cls(
            architecture=arch,
            family=family,
            vocab_size=int(_need(raw, "vocab_size", source)),
            hidden_size=hidden,
            intermediate_size=int(_need(raw, "intermediate_size", source)),
            num_hidden_layers=int(_need(raw, "num_hidden_layers", source)),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(raw.get("rms_norm_eps", DEFAULT_RMS_NORM_EPS)),
            rope_theta=float(_rope_param(raw, "rope_theta", DEFAULT_ROPE_THETA)),
            max_position_embeddings=int(
                raw.get("max_position_embeddings", DEFAULT_MAX_POSITION_EMBEDDINGS)
            ),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=family in QKV_BIAS_FAMILIES or bool(raw.get("attention_bias", False)),
            qk_norm=family == "qwen3",
            rope_scaling=_parse_rope_scaling(raw, source),
            bos_token_id=gen.get("bos_token_id", raw.get("bos_token_id")),
            eos_token_ids=_eos_ids(raw, gen),
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            draft_vocab_size=head,
            raw=raw,
        )


def _need(raw: dict[str, Any], key: str, source: str) -> Any:
    """``raw[key]``; ModelLoadError where the config lacks it."""
    if key not in raw:
        raise ModelLoadError(f"{source}: missing required field {key!r}")
    return raw[key]


def _architecture(raw: dict[str, Any], source: str) -> str:
    """The first of the config's ``architectures`` that saguaro serves."""
    archs = raw.get("architectures") or []
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(
            f"{source}: unsupported architecture {archs or raw.get('model_type')!r}; "
            f"saguaro supports {sorted(SUPPORTED_ARCHITECTURES)}"
        )
    return arch


def _eos_ids(raw: dict[str, Any], gen: dict[str, Any]) -> tuple[int, ...]:
    """The ids that end a sequence: the generation config's, else the config's (one id or a
    list of them)."""
    eos = gen.get("eos_token_id", raw.get("eos_token_id"))
    return tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))


def _draft_vocab_size(raw: dict[str, Any], source: str) -> int | None:
    """A draft's reduced LM head: 1 to ``vocab_size`` rows, untied (a tied head is the whole
    embedding); None where the config names none."""
    head = raw.get("draft_vocab_size")
    tied = bool(raw.get("tie_word_embeddings", False))
    if head is not None and (
        int(head) < 1 or int(head) > int(_need(raw, "vocab_size", source)) or tied
    ):
        raise ModelLoadError(
            f"{source}: draft_vocab_size {head} needs an untied LM head of 1 to vocab_size rows"
        )
    return None if head is None else int(head)


def _rope_param(raw: dict[str, Any], key: str, default: Any) -> Any:
    """Newer transformers nest rope settings under ``rope_parameters``."""
    if key in raw:
        return raw[key]
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and key in params:
        return params[key]
    return default


def _parse_rope_scaling(raw: dict[str, Any], source: str) -> RopeScaling | None:
    rs = raw.get("rope_scaling") or raw.get("rope_parameters")
    if not isinstance(rs, dict):
        return None
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ModelLoadError(
            f"{source}: unsupported rope_scaling type {kind!r} (supported: llama3)"
        )
    try:
        return RopeScaling(
            factor=float(rs["factor"]),
            low_freq_factor=float(rs["low_freq_factor"]),
            high_freq_factor=float(rs["high_freq_factor"]),
            original_max_position_embeddings=int(rs["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ModelLoadError(f"{source}: rope_scaling of type llama3 lacks {e}") from e
