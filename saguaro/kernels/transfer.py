"""Host tensors onto a GPU without making the host wait.

A copy from pageable host memory blocks the host until the GPU has run everything queued before
it: each one a synchronisation, several per step. Packed into one page-locked buffer, a step's
small index tensors go over as one copy queued on the stream, ahead of the kernels that read
them, and the host goes on preparing. PyTorch's page-locked allocator keeps the buffer from being
reused until the copy has run.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch


def reads_wait(device: torch.device) -> bool:
    """Whether reading a value on ``device`` makes the host wait for the work queued before it
    (a GPU). Where it does, code queues its work without reads and chooses by tensor operators;
    on the host a read is free, and choosing by it saves work."""
    return device.type != "cpu"


@contextmanager
def waits_recorded() -> Iterator[list[warnings.WarningMessage]]:
    """Every wait of the host for a GPU inside the block, recorded as the warnings of torch's
    synchronisation debug mode (each names the file and line that waited)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield caught
        finally:
            torch.cuda.set_sync_debug_mode(0)


def upload(tensors: Sequence[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """``tensors``, all of one dtype, on ``device`` with their shapes: on a GPU those on the
    host as one non-blocking copy of their concatenation (those there already as they are);
    elsewhere as ``.to(device)``."""
    if len({t.dtype for t in tensors}) > 1:  # checked everywhere, so CPU runs check GPU calls
        raise ValueError(f"upload packs tensors of one dtype, got {[t.dtype for t in tensors]}")
    device = torch.device(device)
    host = [t for t in tensors if t.device.type == "cpu"]
    if device.type != "cuda" or not host:
        return [t.to(device) for t in tensors]
    flat = torch.cat([t.reshape(-1) for t in host]).pin_memory()
    parts = iter(flat.to(device, non_blocking=True).split([t.numel() for t in host]))
    return [next(parts).view(t.shape) if t.device.type == "cpu" else t.to(device) for t in tensors]
