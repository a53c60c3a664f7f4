"""Per-request sampling parameters, validated once at construction."""

from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal

from saguaro.options import opt

RequestMethod = Literal["rejection", "coupled"]  # the exact methods a request can ask for
SAMPLING_METHODS: tuple[str, ...] = typing.get_args(RequestMethod)


def _is_int(value: object) -> bool:
    # bool is a subclass of int, but `top_k=True` is a bug, not a count.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """How one request turns the target's logits into tokens, and when it stops.

    The transforms (temperature, top-k, top-p) define the target distribution ``p`` that
    speculative decoding must reproduce exactly (docs/sampling.md). ``temperature == 0`` means
    greedy, and nothing else does: any positive temperature samples, however confident the row.
    """

    temperature: float = opt(1.0, "0: greedy; any T > 0 samples")
    top_k: int = opt(0, "keep the k most likely tokens (0 or -1: disabled)")
    top_p: float = opt(1.0, "keep the smallest set of mass >= p, in (0, 1] (1: disabled)")
    seed: int | None = opt(None, "keys every random draw of the request (default: the engine's)")
    max_tokens: int = opt(16, "tokens to generate at most")
    stop: list[str] | str | None = opt(None, "stop string (repeatable)", repeat=True)
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = opt(False, "keep generating past end-of-sequence tokens")
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

    def method(self, default: str) -> str:
        """This request's sampling method at T > 0: its own, else the engine's ``default``."""
        return self.sampling or default

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
