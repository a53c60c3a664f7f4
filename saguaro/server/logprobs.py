"""Log-probabilities in OpenAI's two shapes: a completion's parallel lists and a chat
message's per-token objects. A token is shown as the text it decodes to on its own, and in chat
also as its bytes (a byte-level token may hold part of a character)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from saguaro.sampling.logprobs import TokenLogprob


@dataclass(frozen=True)
class Tokens:
    """How to show a token: its text (ids, skip_special_tokens -> text) and its bytes."""

    decode: Callable[..., str]
    token_bytes: Callable[[int], bytes]


# JSON has no -inf: a token outside the processed distribution's support is reported at this.
MIN_LOGPROB = -9999.0


def _value(logprob: float) -> float:
    return max(logprob, MIN_LOGPROB)


def _text(tokenizer: Tokens, token: int) -> str:
    return tokenizer.decode([token], skip_special_tokens=False)


def completion_logprobs(
    tokenizer: Tokens, entries: list[tuple[int, TokenLogprob | None]], offset: int
) -> dict[str, Any]:
    """``{tokens, token_logprobs, top_logprobs, text_offset}`` of (token, its log-probability)
    pairs (None for an echoed prompt's first token); ``offset``: the characters of the choice's
    text before the first of these tokens."""
    tokens = [_text(tokenizer, token) for token, _ in entries]
    offsets = []
    for text in tokens:
        offsets.append(offset)
        offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [None if lp is None else _value(lp.logprob) for _, lp in entries],
        "top_logprobs": [
            None if lp is None else {_text(tokenizer, t): _value(v) for t, v in lp.top}
            for _, lp in entries
        ],
        "text_offset": offsets,
    }


def _entry(tokenizer: Tokens, token: int, logprob: float) -> dict[str, Any]:
    text = _text(tokenizer, token)
    return {"token": text, "logprob": _value(logprob), "bytes": list(tokenizer.token_bytes(token))}


def chat_logprobs(tokenizer: Tokens, logprobs: list[TokenLogprob]) -> dict[str, Any]:
    """``{content: [{token, logprob, bytes, top_logprobs}], refusal: None}``."""
    content = []
    for lp in logprobs:
        entry = _entry(tokenizer, lp.token, lp.logprob)
        entry["top_logprobs"] = [_entry(tokenizer, t, v) for t, v in lp.top]
        content.append(entry)
    return {"content": content, "refusal": None}
