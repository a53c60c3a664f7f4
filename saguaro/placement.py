"""Where an engine runs on this machine: which cores the process may use and torch's threads."""

from __future__ import annotations

import os

import torch

# SSD on CPU pins the process (cores and torch threads) to its target's share. Engines may
# overlap (tests open two side by side) and close in any order, so pins are counted: every engine
# plans its placement from the cores the process had before the first pin, and those cores and
# threads come back when the last pinned engine closes.
_unpinned: tuple[list[int], int] | None = None
_pins = 0


def process_cpus() -> list[int]:
    """The cores available to this process, as they were before any engine pinned it."""
    return list(_unpinned[0]) if _pins and _unpinned else sorted(os.sched_getaffinity(0))


def pin_process(cpus: list[int], threads: int) -> None:
    """Pin this process to ``cpus`` with ``threads`` torch threads until :func:`unpin_process`."""
    global _unpinned, _pins
    if _pins == 0:
        _unpinned = (sorted(os.sched_getaffinity(0)), torch.get_num_threads())
    _pins += 1
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(threads)


def unpin_process() -> None:
    """Release one pin; the last one gives back the cores and threads the process had."""
    global _pins
    _pins -= 1
    if _pins == 0 and _unpinned is not None:
        os.sched_setaffinity(0, _unpinned[0])
        torch.set_num_threads(_unpinned[1])


def resolve_device(name: str) -> str:
    """``auto``: cuda where a GPU is present, else cpu; any other name is kept."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name
