"""saguaro: exact speculative speculative decoding (SSD / Saguaro) for Llama-3, Qwen2 and Qwen3.

``LLM``, ``RequestOutput`` and ``SamplingParams`` are loaded on first use: they bring PyTorch,
whose import ``import saguaro`` alone, or a command that never builds a model, does not pay.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from saguaro.api import LLM, RequestOutput
    from saguaro.sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"

_HOMES = {
    "LLM": "saguaro.api",
    "RequestOutput": "saguaro.api",
    "SamplingParams": "saguaro.sampling",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'saguaro' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
