"""Engine configuration: one validated dataclass, the single source of truth for every setting."""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODES = ("ar", "sd", "ssd")


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
    num_kv_blocks: int | None = None  # None: enough for max_num_seqs full-length sequences
    enable_prefix_caching: bool = True
    seed: int = 0
    num_threads: int | None = None  # torch intra-op threads in this process (None: leave as is)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.num_speculative_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {self.num_speculative_tokens}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {self.num_kv_blocks}")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def lookahead(self) -> int:
        """Token slots a sequence may write beyond its committed length in one round."""
        return 0 if self.mode == "ar" else self.num_speculative_tokens
