"""What processes exist, from /proc (tests check that nothing is left behind)."""

from __future__ import annotations

import contextlib
import os


def children(pid: int) -> list[int]:
    """Child processes of ``pid``, whichever of its threads started them."""
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError), open(f"/proc/{pid}/task/{task}/children") as f:
            out += [int(p) for p in f.read().split()]
    return out


def running(pid: int) -> bool:
    """``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
