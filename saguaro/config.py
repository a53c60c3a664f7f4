"""Engine configuration: one validated dataclass, the single source of truth for every setting."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from saguaro.placement import process_cpus
from saguaro.sampling.params import SAMPLING_METHODS as REQUEST_SAMPLING_METHODS
from saguaro.sampling.sampler import DEFAULT_TOP_M

MODES = ("ar", "sd", "ssd")
SAMPLING_METHODS = ("auto", *REQUEST_SAMPLING_METHODS)
BACKUPS = ("auto", "neural", "fast")
FANOUT_MODES = ("auto", "geometric", "empirical")


def parse_fanout(spec: str, K: int) -> list[int] | str:
    """Parse a ``--fanout`` value: a mode name (``auto``, ``geometric``, ``empirical``), a
    comma-separated list of exactly K+1 non-negative integers F_0..F_K, or one non-negative integer
    used at every position (``0`` prepares nothing: every round misses)."""
    text = spec.strip().lower()
    if text in FANOUT_MODES:
        return text
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise ValueError(
            f"invalid fan-out {spec!r}: expected one of {', '.join(FANOUT_MODES)}, "
            f"an integer, or {K + 1} comma-separated integers F_0..F_{K}"
        ) from None
    if any(v < 0 for v in values):
        raise ValueError(f"invalid fan-out {spec!r}: values must be non-negative")
    if len(values) == 1:
        return values * (K + 1)
    if len(values) != K + 1:
        raise ValueError(
            f"invalid fan-out {spec!r}: got {len(values)} values, need K+1 = {K + 1} (F_0..F_{K})"
        )
    return values


@dataclass
class EngineConfig:
    model: str | None = None  # None: the bundled target
    draft: str | None = None  # None with mode sd/ssd: the bundled draft when model is bundled
    mode: str = "ar"
    num_speculative_tokens: int = 4  # K
    dtype: str = "float32"
    device: str = "auto"  # auto: cuda if available, else cpu
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    num_kv_blocks: int | None = None  # None: max_num_seqs full-length sequences, within kv_cache_gb
    kv_cache_gb: float = 4.0  # memory cap for the target KV pool when num_kv_blocks is unset
    enable_prefix_caching: bool = True
    seed: int = 0
    num_threads: int | None = None  # torch intra-op threads in this process (None: leave as is)
    draft_top_m: int = DEFAULT_TOP_M  # sd/ssd: the draft samples from its top-M tokens
    # How T > 0 is sampled exactly: rejection | coupled | auto (coupled for SSD, whose cache it
    # serves better; rejection for AR and SD, where it accepts more). docs/sampling.md.
    sampling: str = "auto"
    # --- SSD (mode="ssd") ---
    fanout: str | list[int] = "auto"  # auto | geometric | empirical | fixed F_0..F_K
    cache_budget: int | None = None  # branches per sequence; None: sized to fit a verification
    saguaro_c: float = 1.0  # Saguaro sampling constant C in (0, 1]; 1 = plain sampling
    backup: str = "auto"  # auto | neural | fast
    draft_worker: str = "spawn"  # spawn a local worker, or wait for an "external" one
    draft_addr: str = "127.0.0.1"  # rendezvous address (the target hosts it)
    draft_port: int = 0  # 0: a free port
    draft_timeout_s: float = 60.0  # a worker silent this long is given up on
    draft_restarts: int = 3  # a failed worker is restarted at most this many times
    draft_restart_backoff_s: float = 1.0  # wait before the first restart; doubles each time
    draft_device: str | None = None  # None: same as device
    pin_cpus: bool = True  # on CPU, pin target and worker to disjoint cores (ssd)
    target_cpus: list[int] | None = None  # default with pin_cpus: core 0
    draft_cpus: list[int] | None = None  # default with pin_cpus: core 1
    draft_threads: int | None = None  # default with pin_cpus: 1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError(
                f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}"
            )
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.backup not in BACKUPS:
            raise ValueError(f"backup must be one of {BACKUPS}, got {self.backup!r}")
        if not 0 < self.saguaro_c <= 1:
            raise ValueError(f"saguaro_c must be in (0, 1], got {self.saguaro_c}")
        if self.draft_worker not in ("spawn", "external"):
            raise ValueError(
                f"draft_worker must be 'spawn' or 'external', got {self.draft_worker!r}"
            )
        if self.sampling not in SAMPLING_METHODS:
            raise ValueError(f"sampling must be one of {SAMPLING_METHODS}, got {self.sampling!r}")
        if self.sampling == "auto":
            self.sampling = "coupled" if self.mode == "ssd" else "rejection"
        if self.draft_restarts < 0 or self.draft_restart_backoff_s < 0:
            raise ValueError("draft_restarts and draft_restart_backoff_s must be >= 0")
        if self.draft_top_m < 1:
            raise ValueError(f"draft_top_m must be >= 1, got {self.draft_top_m}")
        if self.cache_budget is not None and self.cache_budget < 0:
            raise ValueError(f"cache_budget must be >= 0, got {self.cache_budget}")
        if isinstance(self.fanout, str):
            self.fanout = parse_fanout(self.fanout, self.num_speculative_tokens)
        elif len(self.fanout) != self.num_speculative_tokens + 1 or min(self.fanout) < 0:
            raise ValueError(
                f"fanout must list K+1={self.num_speculative_tokens + 1} non-negative counts, "
                f"got {self.fanout}"
            )
        if self.mode == "ssd" and self.device == "cpu" and self.pin_cpus:
            cores = process_cpus()
            if len(cores) >= 2:
                self.target_cpus = self.target_cpus or cores[:1]
                self.draft_cpus = (
                    self.draft_cpus or [c for c in cores if c not in self.target_cpus][:1]
                )
                self.draft_threads = self.draft_threads or len(self.draft_cpus)

    @property
    def lookahead(self) -> int:
        """Token slots a sequence may write beyond its committed length in one round."""
        return 0 if self.mode == "ar" else self.num_speculative_tokens
