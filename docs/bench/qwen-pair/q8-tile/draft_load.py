"""The default draft's load as an SSD worker loads it (its GGUF file's blocks on saguaro's
kernels, the head cut to ``draft_head_tokens``): seconds, this process's peak RSS and its RSS
after.

    PYTHONPATH=. python docs/bench/qwen-pair/q8-tile/draft_load.py
"""

from __future__ import annotations

import resource
import time
from pathlib import Path

import torch

from saguaro.config import DRAFT_HEAD_TOKENS
from saguaro.models.catalog import DEFAULT_DRAFT, resolve_model
from saguaro.models.loader import load_model

KIB = 1024


def main() -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    load_model(
        resolve_model(DEFAULT_DRAFT),
        quantization="auto",
        kernels=True,
        draft=True,
        head_tokens=DRAFT_HEAD_TOKENS,
    )
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / KIB
    status = Path("/proc/self/status").read_text()
    now = int(status.split("VmRSS:")[1].split()[0]) / KIB
    print(f"load {seconds:.2f} s, peak RSS {peak:.0f} MB, RSS after {now:.0f} MB")


if __name__ == "__main__":
    main()
