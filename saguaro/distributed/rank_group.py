"""The processes of one tensor-parallel target: a rendezvous store and two process groups.

Rank 0 hosts the store (listening on loopback only, a free port) and starts ranks 1..N-1. Every
rank joins two groups of its own (not torch's global default group, so engines can come and go
in one process):

- **control** (gloo, CPU): rank 0 broadcasts each step's command in :mod:`channel`'s wire format.
  A rank waiting for its next command may wait as long as the engine idles, so this group's
  timeout is :data:`IDLE_TIMEOUT`; a dead rank 0 closes the sockets, which ends the wait at once.
- **compute** (gloo on CPU, NCCL on GPUs): the model's all-reduces and all-gathers, with the
  engine's ``tensor_parallel_timeout_s``, so a rank that hangs mid-forward is an error, not a hang.

Ranks also report through the store: ``ready/<r>`` once their model is loaded, ``error/<r>`` with
the reason when they fail, so rank 0 can wait for a slow load without a collective (and its
timeout) and can say why a rank is gone.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from saguaro.distributed.channel import FIRST, open_store, pack, rest_buffer, unpack

# A rank between commands waits as long as the engine is idle; ten years is "forever" that still
# fits gloo's millisecond timeouts.
IDLE_TIMEOUT = timedelta(days=3650)
# Commands rank 0 broadcasts.
FORWARD, EXIT = 1, 2
_PREFIX = "saguaro/tp/"


class RankGroup:
    """One rank's view of the group. Rank 0 constructs it first (it owns the store)."""

    def __init__(
        self,
        rank: int,
        size: int,
        port: int,
        timeout_s: float,
        startup_timeout_s: float,
        addr: str = "127.0.0.1",
    ) -> None:
        self.rank, self.size, self.addr = rank, size, addr
        self.timeout = timedelta(seconds=timeout_s)
        self.store = open_store(addr, port, size, rank == 0, timedelta(seconds=startup_timeout_s))
        self.port = self.store.port
        self.control: dist.ProcessGroupGloo | None = None
        self.compute: dist.ProcessGroup | None = None

    def join(self, device: torch.device) -> None:
        """Build both groups; returns once every rank has joined (ranks must have announced
        themselves with :meth:`announce`, which rank 0 waits for without blocking)."""
        self.control = dist.ProcessGroupGloo(
            dist.PrefixStore(_PREFIX + "control", self.store), self.rank, self.size, IDLE_TIMEOUT
        )
        compute_store = dist.PrefixStore(_PREFIX + "compute", self.store)
        if device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self.timeout
            self.compute = dist.ProcessGroupNCCL(compute_store, self.rank, self.size, options)
        else:
            self.compute = dist.ProcessGroupGloo(compute_store, self.rank, self.size, self.timeout)

    # ---- what ranks report through the store ------------------------------------------------

    def announce(self, state: str, text: str = "") -> None:
        """Say ``state`` ("joining", "ready" or "error") for this rank."""
        self.store.set(f"{_PREFIX}{state}/{self.rank}", text)

    def reported(self, state: str, rank: int) -> str | None:
        """What ``rank`` said with ``state``, or None if it has not said it."""
        key = f"{_PREFIX}{state}/{rank}"
        try:
            return self.store.get(key).decode() if self.store.check([key]) else None
        except (RuntimeError, dist.DistStoreError):
            return None

    # ---- commands ------------------------------------------------------------------------

    def broadcast(self, kind: int = 0, obj: Any = None) -> tuple[int, Any]:
        """Rank 0 sends ``(kind, obj)`` to every rank; the others receive and return it."""
        if self.rank == 0:
            first, rest, _ = pack(kind, obj)
            self.control.broadcast(first, 0).wait(self.timeout)
            if rest is not None:
                self.control.broadcast(rest, 0).wait(self.timeout)
            return kind, obj
        first = torch.empty(FIRST, dtype=torch.uint8)
        self.control.broadcast(first, 0).wait(IDLE_TIMEOUT)
        rest = rest_buffer(first)
        if rest is not None:
            self.control.broadcast(rest, 0).wait(self.timeout)
        kind, obj, _ = unpack(first, rest)
        return kind, obj

    def close(self) -> None:
        self.control = self.compute = None
        self.store = None
