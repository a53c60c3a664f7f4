"""Where an engine runs on this machine: the cores its process uses and torch's thread count.

Every engine owns a :class:`Placement` and puts the process there before it computes
(:func:`place`), whatever the process did before: another engine, or a library that changed
torch's thread count or the process's cores. SSD on CPU keeps its target on its own cores (the
draft worker, another process, has the rest); AR and SD use every core the process had, one
torch thread each, so modes compared in one process compare on equal hardware. The cores the
process had before the first engine placed it come back when the engine holding them closes.

Affinity is set on every thread of the process, not only the caller: torch's worker threads
already exist, and a thread keeps the cores it was created with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

_TASKS = Path("/proc/self/task")


@dataclass(frozen=True)
class Placement:
    cpus: tuple[int, ...]
    threads: int  # torch intra-op threads


def on_cores(cpus: list[int] | tuple[int, ...], threads: int | None = None) -> Placement:
    """A placement on ``cpus`` with ``threads`` torch threads (default: one per core)."""
    return Placement(tuple(cpus), threads or len(cpus))


def split_cores(cpus: list[int] | tuple[int, ...], parts: int) -> list[list[int]]:
    """``cpus`` in ``parts`` contiguous sets, the first sets one core larger where they do not
    divide; with fewer cores than parts, sets share cores round-robin (one core each)."""
    cpus = list(cpus)
    if len(cpus) < parts:
        return [[cpus[i % len(cpus)]] for i in range(parts)]
    size, extra = divmod(len(cpus), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (i < extra)
        out.append(cpus[start:end])
        start = end
    return out


_original: Placement | None = None  # the process before the first engine placed it
_owner: object | None = None  # the engine whose placement is in force


def current() -> Placement:
    return Placement(tuple(sorted(os.sched_getaffinity(0))), torch.get_num_threads())


def process_cpus() -> list[int]:
    """The cores available to this process, as they were before any engine placed it."""
    return list(_original.cpus) if _original is not None else sorted(os.sched_getaffinity(0))


def _apply(p: Placement) -> None:
    tids = [int(t) for t in os.listdir(_TASKS)] if _TASKS.is_dir() else [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, p.cpus)
        except (ProcessLookupError, PermissionError):
            pass  # the thread has exited since it was listed
    torch.set_num_threads(p.threads)


def place(owner: object, p: Placement) -> None:
    """Put the process on ``p`` for ``owner`` (a no-op while ``owner``'s placement holds)."""
    global _original, _owner
    if _owner is owner:
        return
    if _original is None:
        _original = current()
    _apply(p)
    _owner = owner


def release(owner: object) -> None:
    """``owner`` is done: if its placement is in force, give the process its original one."""
    global _original, _owner
    if _owner is not owner or _original is None:
        return
    _apply(_original)
    _original = _owner = None


def resolve_device(name: str) -> str:
    """``auto``: cuda where a GPU is present, else cpu; any other name is kept."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name
