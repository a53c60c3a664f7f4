"""Compile ``cpu_kernels.c``, ``quant_kernels.c`` and ``amx_kernels.c`` once per machine and load
them with ctypes.

The library is built with the system C compiler into ``$SAGUARO_CACHE/kernels`` (default
``~/.cache/saguaro/kernels``), named by the hash of the sources and flags, so a changed source
builds anew and concurrent builds never overwrite each other's file (each writes a temporary
file and renames it). It links the OpenMP runtime by its soname, which resolves to the one
PyTorch has already loaded, so the two share one thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from saguaro.errors import ModelLoadError
from saguaro.paths import cache_dir

if TYPE_CHECKING:
    import torch

SOURCES = [
    Path(__file__).with_name(name) for name in ("cpu_kernels.c", "quant_kernels.c", "amx_kernels.c")
]
HEADERS = [Path(__file__).with_name("quant_kernels.h")]
# x86-64-v3 (AVX2, FMA, F16C) is what the kernels need; v4 adds AVX-512 where the CPU has it.
# Either way the lane-wise vector code computes the same bits (see the source's header).
BASE_FLAGS = ["-O3", "-fPIC", "-shared", "-fopenmp", "-ffp-contract=fast", "-mfma", "-mf16c"]
C_INT64, C_PTR, C_INT, C_FLOAT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES = {
    "saguaro_linear": [C_PTR, C_INT64, C_INT64, C_PTR, C_PTR, C_PTR, C_INT64, C_INT64, C_INT]
    + [C_PTR, C_INT],
    "saguaro_rms_norm": [C_PTR, C_INT64, C_INT64, C_FLOAT, C_PTR, C_PTR],
    "saguaro_silu_mul": [C_PTR, C_INT64, C_INT64, C_PTR],
    "saguaro_rope_cache": [C_PTR, C_INT64, C_INT64, C_INT64, C_INT64, C_PTR, C_PTR, C_PTR]
    + [C_INT64, C_PTR, C_PTR, C_PTR],
    "saguaro_attention": [C_PTR, C_INT64, C_INT64, C_INT64, C_PTR, C_PTR, C_INT, C_INT64]
    + [C_PTR, C_INT64, C_PTR, C_INT64, C_PTR, C_FLOAT, C_PTR, C_PTR, C_INT],
    "saguaro_layers": [C_PTR, C_INT64, C_PTR, C_PTR],
    "saguaro_gumbel_argmax": [C_PTR, C_INT64, C_INT64, C_PTR, C_PTR, C_PTR, C_INT64, C_PTR]
    + [C_INT],
    "saguaro_hash_words": [C_PTR, C_PTR, C_PTR, C_INT64, C_INT64, C_PTR],
    "saguaro_sample_rows": [C_PTR, C_INT64, C_INT64, C_PTR, C_PTR, C_PTR, C_PTR, C_INT],
    "saguaro_quant_linear": [C_PTR, C_INT64, C_INT64, C_PTR, C_INT64, C_INT, C_PTR, C_INT],
}

# the others return nothing
RESTYPES = {"saguaro_rope_cache": C_INT, "saguaro_layers": C_INT, "saguaro_quant_linear": C_INT}


# How far ahead (bytes) the four-row tiles ask for the weights they will read: the distance
# measured fastest on each vendor's machine at hand (docs/bench/qwen-pair/README.md, "VNNI"):
# 2 KB on a Xeon, where 4 KB made a one-position forward 20% slower; 4 KB on an AMD EPYC.
PREFETCH_BYTES = {"GenuineIntel": 2048}
DEFAULT_PREFETCH_BYTES = 4096


@cache
def cpu() -> tuple[str, frozenset[str]]:
    """The CPU's vendor and feature flags, as /proc/cpuinfo names them (empty where unread)."""
    try:
        words = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return "", frozenset()
    vendor = words[words.index("vendor_id") + 2] if "vendor_id" in words else ""
    return vendor, frozenset(words)


def march() -> list[str]:
    """x86-64-v4 where the CPU reports AVX-512 (F, BW, DQ, VL), else x86-64-v3; plus VNNI's
    integer dot products (AVX-512's or AVX-VNNI) where it has them, and AMX's int8 tiles."""
    flags = cpu()[1]
    v4 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags
    arch = ["-march=x86-64-v4" if v4 else "-march=x86-64-v3"]
    if v4 and "avx512_vnni" in flags:
        amx = ["-mamx-tile", "-mamx-int8"] if {"amx_tile", "amx_int8"} <= flags else []
        return [*arch, "-mavx512vnni", *amx]
    return [*arch, "-mavxvnni"] if "avx_vnni" in flags else arch


def prefetch() -> list[str]:
    """The tiles' prefetch distance for this CPU's vendor, as a define."""
    return [f"-DPREFETCH_BYTES={PREFETCH_BYTES.get(cpu()[0], DEFAULT_PREFETCH_BYTES)}"]


def compile_library(out: Path, flags: list[str]) -> None:
    compiler = shutil.which(os.environ.get("CC") or "gcc") or shutil.which("cc")
    if compiler is None:
        raise ModelLoadError("saguaro's CPU kernels need a C compiler (gcc); none was found")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so")
    os.close(fd)
    cmd = [compiler, *flags, "-o", tmp, *map(str, SOURCES), "-lm"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        Path(tmp).unlink(missing_ok=True)
        raise ModelLoadError(
            f"building saguaro's CPU kernels failed: {' '.join(cmd)}\n{done.stderr}"
        )
    os.replace(tmp, out)


def default_flags() -> list[str]:
    return [*BASE_FLAGS, *march(), *prefetch()]


@cache
def build(flags: tuple[str, ...]) -> ctypes.CDLL:
    """The kernels compiled with ``flags`` (built on first use; tests build the AVX2 and the
    generic linear paths side by side this way)."""
    import torch  # noqa: F401  (loads the OpenMP runtime the library shares)

    sources = b"".join(source.read_bytes() for source in SOURCES + HEADERS)
    digest = hashlib.sha256(sources + " ".join(flags).encode()).hexdigest()[:16]
    path = cache_dir("kernels") / f"cpu_kernels-{digest}.so"
    if not path.is_file():
        compile_library(path, list(flags))
    lib = ctypes.CDLL(str(path))
    for name, args in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, RESTYPES.get(name)
    return lib


@cache
def library() -> ctypes.CDLL:
    """The compiled kernels for this CPU."""
    return build(tuple(default_flags()))


@cache
def build_error() -> str | None:
    """Why the kernels cannot be had here (no C compiler, a failed build, a library the loader
    refuses), or None where they can (built now, or already cached)."""
    try:
        library()
    except (ModelLoadError, OSError) as e:
        return str(e).splitlines()[0]
    return None


def available() -> bool:
    """Whether the kernels can be had here; callers that have a torch path of their own take it
    otherwise."""
    return build_error() is None


def serves(*tensors: torch.Tensor) -> bool:
    """Whether the kernels can take these tensors: all on the CPU, and the library at hand."""
    return all(t.device.type == "cpu" for t in tensors) and available()


def main() -> int:
    """Build the kernels now (``python -m saguaro.kernels``, which scripts/install.sh runs), so
    that no command's first run pays for the build. A machine without a C compiler is told so
    and still installs: the engine then runs on torch's operators."""
    start = time.perf_counter()
    error = build_error()
    if error is not None:
        print(
            f"saguaro: the CPU kernels cannot be built here ({error}); saguaro will run on "
            "torch's operators instead (slower)"
        )
        return 0
    print(f"saguaro: CPU kernels ready ({time.perf_counter() - start:.0f} s)")
    return 0
