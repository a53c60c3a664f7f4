"""The training corpus: the running interpreter's standard library, split by file."""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

EOT = "<|endoftext|>"
# Third-party code lives under the stdlib dir too; it is not part of the corpus.
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@dataclass(frozen=True)
class Split:
    train: list[Path]
    heldout: list[Path]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str, heldout_permille: int = 30) -> bool:
    """Deterministic by-file rule: the same relative path always lands in the same split."""
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") % 1000 < heldout_permille


def split_files(root: Path, heldout_permille: int = 30) -> Split:
    train: list[Path] = []
    heldout: list[Path] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _EXCLUDED_DIRS.intersection(rel.parts[:-1]) or not path.is_file():
            continue
        (heldout if is_heldout(rel.as_posix(), heldout_permille) else train).append(path)
    return Split(train, heldout)


def read_documents(paths: list[Path]) -> Iterator[str]:
    """Source texts; files that are not valid UTF-8 (a few deliberate test fixtures) are skipped."""
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip() and EOT not in text:
            yield text
