"""Ranks 1..N-1 of a tensor-parallel target: a command loop that executes forwards.

Rank 0 (:mod:`saguaro.engine.tensor_parallel`) starts each rank as a fresh interpreter running
:func:`main` (:data:`COMMAND`), so the user's main module is never re-imported.
A rank loads its own slices of the checkpoint, announces itself ready, and then does what rank 0
broadcasts: ``RUNNER`` (allocate the KV pool for its heads), ``FORWARD`` (run the step on its
slice, meeting the other ranks in the model's collectives; its logits are discarded) and
``EXIT``. Rank 0 sends each forward's inputs already flattened
(:class:`~saguaro.engine.model_runner.StepInputs`), so a rank repeats none of the preparation.
On any error a rank reports the reason through the store and exits, which breaks the group's
sockets, so rank 0 sees the failure at its next collective.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass

import torch

from saguaro import placement
from saguaro.distributed.processes import exit_now
from saguaro.distributed.rank_group import RankGroup
from saguaro.engine.model_runner import ModelRunner
from saguaro.models.loader import load_model
from saguaro.models.parallel import TensorParallel

# Commands rank 0 broadcasts.
RUNNER, FORWARD, EXIT = 1, 2, 3
# Starting a rank imports torch and loads its slices of the checkpoint: generous, and rank 0
# waits for it without a collective, so a rank that dies while starting is seen at once.
STARTUP_TIMEOUT_S = 600.0
_PARENT_POLL_S = 1.0  # how often a rank checks that rank 0 is still its parent


def rank_device(device: str, rank: int) -> torch.device:
    """Rank r's device: the CPU, or the r-th GPU after the one ``device`` names."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.device("cuda", (dev.index or 0) + rank)
    return dev


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs to start (its command line, as JSON)."""

    rank: int
    size: int
    port: int
    model_dir: str
    dtype: str
    device: str
    cpus: list[int] | None  # None: leave the process's cores as they are (GPUs)
    threads: int | None
    timeout_s: float
    parent_pid: int

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RankSpec:
        return cls(**json.loads(text))


def _exit_with_parent(parent_pid: int) -> None:
    """A rank whose rank 0 is gone has no one to serve (a SIGKILLed rank 0 cannot stop it)."""
    while True:
        time.sleep(_PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(1)


def rank_main(spec: RankSpec) -> None:
    """Load this rank's slices, then execute rank 0's commands until ``EXIT``."""
    # Ctrl-C reaches the whole process group; rank 0 decides when its ranks stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with_parent, args=(spec.parent_pid,), daemon=True).start()
    if spec.cpus is not None:
        placement.place(rank_main, placement.on_cores(spec.cpus, spec.threads))
    device = rank_device(spec.device, spec.rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    group = RankGroup(spec.rank, spec.size, spec.port, spec.timeout_s, STARTUP_TIMEOUT_S)
    try:
        group.announce("joining")
        group.join(device)
        tp = TensorParallel(spec.rank, spec.size, group.compute)
        model = load_model(spec.model_dir, spec.dtype, device, tp)
        group.announce("ready")
        runner: ModelRunner | None = None
        while True:
            kind, args = group.broadcast()
            if kind == EXIT:
                return
            if kind == RUNNER:
                runner = ModelRunner(model, device=device, **args)
            elif kind == FORWARD:
                runner.run(args)
    except BaseException as e:
        with contextlib.suppress(Exception):  # the store may be gone with rank 0
            group.announce("error", f"{type(e).__name__}: {e}")
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def main() -> None:
    rank_main(RankSpec.from_json(sys.argv[1]))
    exit_now(0)


# The rank's command line before its spec; ``-c``, not ``-m``: the package imports this module
# already, and running an imported module as __main__ would load it twice.
COMMAND = [sys.executable, "-c", "from saguaro.engine.rank import main; main()"]
