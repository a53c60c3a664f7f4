"""Tokenizer from ``tokenizer.json`` + ``tokenizer_config.json`` (special tokens, chat template),
or from a GGUF file's vocabulary (:func:`saguaro.models.gguf_meta.hf_tokenizer`, cached under
``$SAGUARO_CACHE/tokenizers`` after the first read)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from saguaro.errors import ModelLoadError
from saguaro.models import gguf_meta
from saguaro.models.gguf_meta import hf_tokenizer
from saguaro.models.gguf_reader import GGUFFile, is_gguf
from saguaro.paths import cache_dir, write_atomically

# Used when a base model ships no chat template: plain role-tagged turns.
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def _token_str(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} form
        return value.get("content")
    return value


def has_tokenizer(model: Path) -> bool:
    """Whether ``model`` (a directory or a ``.gguf`` file) carries a tokenizer."""
    return is_gguf(model) or (model / "tokenizer.json").is_file()


def _read_dir(model_dir: Path) -> tuple[HFTokenizer, dict[str, Any]]:
    """The tokenizer of a Hugging Face directory and its ``tokenizer_config.json`` (empty where
    the directory has none)."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ModelLoadError(f"{model_dir}: tokenizer.json missing")
    try:
        tok = HFTokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a bare Exception
        raise ModelLoadError(f"{path}: cannot be parsed as a tokenizer ({e})") from e
    cfg_path = model_dir / "tokenizer_config.json"
    if not cfg_path.is_file():
        return tok, {}
    try:
        return tok, json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{cfg_path}: malformed JSON ({e})") from e


def _read_gguf(path: Path) -> tuple[HFTokenizer, dict[str, Any]]:
    """The tokenizer a GGUF file's vocabulary gives, and its config: from the cache when this
    file was read before, else built in memory (a Python walk over the whole vocabulary and its
    merges) and cached."""
    text_path, config_path = _cached_tokenizer(path)
    try:
        return _parse(text_path.read_text(), path), json.loads(config_path.read_text())
    except (OSError, ValueError, ModelLoadError):  # not cached yet, or a damaged entry
        pass
    tokenizer, config = hf_tokenizer(GGUFFile.read(path))
    text = json.dumps(tokenizer)
    built = _parse(text, path)
    try:  # config first: an entry counts once its tokenizer file is there
        write_atomically(config_path, json.dumps(config))
        write_atomically(text_path, text)
    except OSError:  # a read-only cache costs the next start its second, nothing more
        pass
    return built, config


def _cached_tokenizer(path: Path) -> tuple[Path, Path]:
    """Where the tokenizer built from ``path`` is cached: named by the file's identity (path,
    size, modification time) and by the code that builds it, so a changed file or a new
    saguaro never reads a stale entry."""
    stat = path.stat()
    key = hashlib.sha256(
        f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
        + Path(gguf_meta.__file__).read_bytes()
    ).hexdigest()[:16]
    root = cache_dir("tokenizers")
    return root / f"{key}.json", root / f"{key}.config.json"


def _parse(text: str, path: Path) -> HFTokenizer:
    try:
        return HFTokenizer.from_str(text)
    except Exception as e:  # the Rust side raises a bare Exception
        raise ModelLoadError(f"{path}: its vocabulary makes no tokenizer ({e})") from e


class Tokenizer:
    def __init__(self, model_dir: str | Path) -> None:
        """The tokenizer of a Hugging Face directory, or of a ``.gguf`` file."""
        model_dir = Path(model_dir)
        self._tok, cfg = _read_gguf(model_dir) if is_gguf(model_dir) else _read_dir(model_dir)
        self.config = cfg
        self.bos_token = _token_str(cfg.get("bos_token"))
        self.eos_token = _token_str(cfg.get("eos_token"))
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template: str = template or DEFAULT_CHAT_TEMPLATE
        self.has_chat_template = template is not None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def eos_token_id(self) -> int | None:
        return self.token_to_id(self.eos_token)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token)

    def special_token_ids(self) -> list[int]:
        """Ids of the added tokens marked special (ends of turn, roles, fill-in-the-middle)."""
        return sorted(i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)

    def fingerprint(self) -> str:
        """Digest of the token -> id mapping: equal digests mean interchangeable token ids."""
        vocab = sorted(self._tok.get_vocab(with_added_tokens=True).items())
        return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]

    def to_json(self) -> str:
        """The tokenizer.json this tokenizer was read from, as text."""
        return self._tok.to_str()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(msg: str) -> None:
            raise TemplateError(msg)

        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of ``messages`` followed by the assistant's turn (not yet length-checked)."""
        text = self.apply_chat_template(messages, add_generation_prompt=True)
        # A template that writes bos_token itself must not get a second one from the tokenizer;
        # one that doesn't (the default for base models) keeps the tokenizer's usual specials.
        return self.encode(text, add_special_tokens="bos_token" not in self.chat_template)
