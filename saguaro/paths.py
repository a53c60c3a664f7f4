"""Where saguaro keeps what it derives once per machine (compiled kernels, tokenizers built from
GGUF vocabularies): ``$SAGUARO_CACHE``, default ``~/.cache/saguaro``. Everything there can be
deleted; it is rebuilt on the next use."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_ENV = "SAGUARO_CACHE"


def cache_dir(kind: str) -> Path:
    """The cache's subdirectory for one kind of derived file (not created here)."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "saguaro"
    return Path(root) / kind


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` through a temporary file and a rename, so a reader never sees half of it
    and concurrent writers of the same content never corrupt each other's file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
