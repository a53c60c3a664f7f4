"""Per-request sampling parameters, validated once at construction."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Any, Literal

from saguaro.options import opt

RequestMethod = Literal["rejection", "coupled"]  # the exact methods a request can ask for
SAMPLING_METHODS: tuple[str, ...] = typing.get_args(RequestMethod)
# Which distribution a token's reported log-probabilities are of (docs/sampling.md).
LogprobsMode = Literal["raw", "processed"]
MAX_LOGPROBS = 20  # alternatives reported per token at most (OpenAI's top_logprobs bound)
MAX_SAMPLES = 128  # n: samples of one prompt at most
PENALTY_BOUND = 2.0  # presence and frequency penalties lie in [-2, 2], as OpenAI's
LOGIT_BIAS_BOUND = 100.0  # a logit bias lies in [-100, 100], as OpenAI's


StructuredKind = Literal["json", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the generated text (:mod:`saguaro.sampling.structured`).

    ``spec`` by ``kind``: json, a JSON schema (a dict or its text); json_object, None (any
    object); regex, a pattern; choice, the strings allowed; grammar, a Lark grammar."""

    kind: StructuredKind
    spec: Any = None

    def __post_init__(self) -> None:
        kind, spec = self.kind, self.spec
        if kind not in typing.get_args(StructuredKind):
            raise ValueError(
                f"structured output kind must be one of "
                f"{typing.get_args(StructuredKind)}, got {kind!r}"
            )
        ok = {
            "json": isinstance(spec, (dict, str)),
            "json_object": spec is None,
            "regex": isinstance(spec, str) and bool(spec),
            "choice": isinstance(spec, list)
            and bool(spec)
            and all(isinstance(c, str) and c for c in spec),
            "grammar": isinstance(spec, str) and bool(spec),
        }[kind]
        if not ok:
            raise ValueError(f"structured output {kind}: invalid spec {spec!r}")


def _is_int(value: object) -> bool:
    # bool is a subclass of int, but `top_k=True` is a bug, not a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_range(name: str, value: object, low: float, high: float) -> None:
    if not _is_number(value) or not low <= value <= high:  # also rejects NaN
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")


@dataclass
class SamplingParams:
    """How one request turns the target's logits into tokens, and when it stops.

    The logits processors (logit bias, bad words, min_tokens, repetition, frequency and presence
    penalties: :mod:`saguaro.sampling.processors`) and the transforms (temperature, min-p, top-k,
    top-p: :mod:`saguaro.sampling.probs`) define the target distribution ``p`` that speculative
    decoding must reproduce exactly (docs/sampling.md). ``temperature == 0`` means greedy, and
    nothing else does: any positive temperature samples, however confident the row.

    ``temperature`` defaults to 1.0, as vLLM's SamplingParams and OpenAI's API do (the HTTP
    server's requests too); ``saguaro generate`` and ``saguaro chat`` default to 0, greedy
    (``saguaro.launch.CLI_SAMPLING_DEFAULTS``), and say so in their help.
    """

    temperature: float = opt(
        1.0,
        "0: greedy; any T > 0 samples (generate and chat default to greedy; the Python API and "
        "the HTTP server to 1.0, as vLLM and OpenAI)",
        metavar="T",
    )
    top_k: int = opt(0, "keep the k most likely tokens (0 or -1: disabled)", metavar="K")
    top_p: float = opt(
        1.0, "keep the smallest set of mass >= p, in (0, 1] (1: disabled)", metavar="P"
    )
    min_p: float = opt(
        0.0, "keep tokens of probability >= min_p x the top one's (0: disabled)", advanced=True
    )
    presence_penalty: float = opt(
        0.0, "subtract it from every generated token's logit, [-2, 2]", advanced=True
    )
    frequency_penalty: float = opt(
        0.0, "subtract it x each token's generated count, [-2, 2]", advanced=True
    )
    repetition_penalty: float = opt(
        1.0,
        "divide positive / multiply negative logits of prompt and generated tokens (1: off)",
        advanced=True,
    )
    # token id -> added to its logit, in [-100, 100]
    logit_bias: dict[int, float] | None = None
    min_tokens: int = opt(0, "no end-of-sequence or stop before this many tokens", advanced=True)
    bad_words: list[str] | None = opt(
        None, "a word never generated (repeatable)", repeat=True, advanced=True
    )
    n: int = opt(1, "samples of each prompt (they share its KV blocks)", advanced=True)
    logprobs: int | None = opt(
        None,
        f"report each token's log-probability and this many alternatives (0..{MAX_LOGPROBS})",
        advanced=True,
    )
    logprobs_mode: LogprobsMode = opt(
        "raw", "raw: the model's softmax; processed: p's", advanced=True
    )
    prompt_logprobs: int | None = opt(
        None,
        f"report each prompt token's log-probability and its top alternatives (0..{MAX_LOGPROBS})",
        advanced=True,
    )
    structured: StructuredOutput | None = None  # a grammar the text must follow
    seed: int | None = opt(None, "keys every random draw of the request (default: the engine's)")
    max_tokens: int = opt(16, "tokens to generate at most", metavar="N")
    stop: list[str] | str | None = opt(
        None, "stop string (repeatable)", repeat=True, metavar="TEXT"
    )
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = opt(False, "keep generating past end-of-sequence tokens", advanced=True)
    # This request's method at T > 0; None: the engine's (docs/sampling.md)
    sampling: RequestMethod | None = None

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not 0.0 < self.top_p <= 1.0:  # also rejects NaN
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= -1 (0 or -1 disable it), got {self.top_k!r}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.seed is not None and (
            not _is_int(self.seed) or not -(2**63) <= self.seed < 2**64
        ):  # any 64-bit word, signed or not: the noise reads its low 64 bits
            raise ValueError(f"seed must be an int in [-2**63, 2**64) or None, got {self.seed!r}")

        if self.sampling not in (None, *SAMPLING_METHODS):
            raise ValueError(
                f"sampling must be one of {SAMPLING_METHODS} or None, got {self.sampling!r}"
            )
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        for s in stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty str, got {s!r}")
        self.stop = stop

        ids = list(self.stop_token_ids or [])
        for i in ids:
            if not _is_int(i) or i < 0:
                raise ValueError(f"stop_token_ids must be ints >= 0, got {i!r}")
        self.stop_token_ids = ids
        self._check_processors()
        self._check_outputs()

    def _check_processors(self) -> None:
        _check_range("min_p", self.min_p, 0.0, 1.0)
        _check_range("presence_penalty", self.presence_penalty, -PENALTY_BOUND, PENALTY_BOUND)
        _check_range("frequency_penalty", self.frequency_penalty, -PENALTY_BOUND, PENALTY_BOUND)
        r = self.repetition_penalty
        if not _is_number(r) or not math.isfinite(r) or r <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0, got {r!r}")
        bias = dict(self.logit_bias or {})
        for token, value in bias.items():
            if not _is_int(token) or token < 0:
                raise ValueError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            _check_range(f"logit_bias[{token}]", value, -LOGIT_BIAS_BOUND, LOGIT_BIAS_BOUND)
        self.logit_bias = bias
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], "
                f"got {self.min_tokens!r}"
            )
        words = list(self.bad_words or [])
        for w in words:
            if not isinstance(w, str) or not w.strip():
                raise ValueError(f"bad_words must be non-blank str, got {w!r}")
        self.bad_words = words
        if self.structured is not None:
            if not isinstance(self.structured, StructuredOutput):
                raise ValueError(f"structured must be a StructuredOutput, got {self.structured!r}")
            if self.ignore_eos:  # the grammar ends the text with its end-of-sequence token
                raise ValueError("ignore_eos cannot be combined with structured output")

    def _check_outputs(self) -> None:
        if not _is_int(self.n) or not 1 <= self.n <= MAX_SAMPLES:
            raise ValueError(f"n must be an int in [1, {MAX_SAMPLES}], got {self.n!r}")
        for name in ("logprobs", "prompt_logprobs"):
            lp = getattr(self, name)
            if lp is not None and (not _is_int(lp) or not 0 <= lp <= MAX_LOGPROBS):
                raise ValueError(
                    f"{name} must be None or an int in [0, {MAX_LOGPROBS}], got {lp!r}"
                )
        if self.logprobs_mode not in typing.get_args(LogprobsMode):
            raise ValueError(
                f"logprobs_mode must be one of {typing.get_args(LogprobsMode)}, "
                f"got {self.logprobs_mode!r}"
            )

    @property
    def has_processors(self) -> bool:
        """Whether any logits processor acts (each one's neutral value leaves the logits be)."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1
            or self.logit_bias
            or self.min_tokens
            or self.bad_words
            or self.structured
        )

    def method(self, default: str) -> str:
        """This request's sampling method at T > 0: its own, else the engine's ``default``."""
        return self.sampling or default

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
