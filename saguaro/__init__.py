"""saguaro: exact speculative speculative decoding (SSD / Saguaro) for Llama-3 and Qwen3."""

from saguaro.api import LLM, RequestOutput
from saguaro.sampling import SamplingParams

__all__ = ["LLM", "RequestOutput", "SamplingParams"]
__version__ = "0.1.0"
