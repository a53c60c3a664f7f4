"""The code corpus: the running interpreter's standard library, split by file into a training part
and a held-out part. Training reads the first, the bench's ``heldout`` prompts the second; both
import it from here, so neither imports the other for it."""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

EOT = "<|endoftext|>"
# Third-party code lives under the stdlib dir too; it is not part of the corpus.
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}
# Files per thousand that go to the held-out split (3%).
HELDOUT_PERMILLE = 30
PERMILLE = 1000
# Bytes of a path's SHA-256 read as the integer the split rule takes modulo PERMILLE.
_HASH_BYTES = 4


@dataclass(frozen=True)
class Split:
    train: list[Path]
    heldout: list[Path]


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relpath: str, heldout_permille: int = HELDOUT_PERMILLE) -> bool:
    """Deterministic by-file rule: the same relative path always lands in the same split
    (held out when int(sha256(path)[:4]) mod 1000 < heldout_permille)."""
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:_HASH_BYTES], "big") % PERMILLE < heldout_permille


def split_files(root: Path, heldout_permille: int = HELDOUT_PERMILLE) -> Split:
    train: list[Path] = []
    heldout: list[Path] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _EXCLUDED_DIRS.intersection(rel.parts[:-1]) or not path.is_file():
            continue
        (heldout if is_heldout(rel.as_posix(), heldout_permille) else train).append(path)
    return Split(train, heldout)


def read_documents(paths: list[Path]) -> Iterator[str]:
    """Source texts; files that are not valid UTF-8 (a few deliberate test fixtures) are skipped,
    and so are blank files and files that contain the end-of-text marker ``EOT``."""
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip() and EOT not in text:
            yield text
