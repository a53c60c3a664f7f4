"""A tensor-parallel target, from rank 0: the engine's process, which starts ranks 1..N-1.

Rank 0 runs everything the engine does (scheduler, sampling, verification, the SSD channel) and
its own slice of the target. Before each forward it broadcasts the step's queries (block tables
included: where KV goes is rank 0's decision); every other rank (:mod:`saguaro.engine.rank`)
runs the same forward on its slice and its own heads' KV cache, meeting rank 0 in the model's
collectives (:mod:`saguaro.models.parallel`).

Failure of any rank ends the group: rank 0's next broadcast or collective fails (a dead peer
closes its sockets; a hung one runs out ``tensor_parallel_timeout_s``), rank 0 stops the other
ranks and raises :class:`~saguaro.errors.TensorParallelError` naming the rank and why (its own
report through the store, or how it exited); the engine steps no more.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import weakref
from pathlib import Path

import torch

from saguaro import placement
from saguaro.config import EngineConfig
from saguaro.distributed.processes import SHUTDOWN_GRACE_S, reap
from saguaro.distributed.rank_group import RankGroup
from saguaro.engine.model_runner import ModelRunner, StepInputs
from saguaro.engine.rank import (
    COMMAND,
    EXIT,
    FORWARD,
    RUNNER,
    STARTUP_TIMEOUT_S,
    RankSpec,
    rank_device,
)
from saguaro.errors import TensorParallelError
from saguaro.models.config import ModelConfig
from saguaro.models.llama import CausalLM
from saguaro.models.loader import load_model
from saguaro.models.parallel import TensorParallel

log = logging.getLogger("saguaro")

_POLL_S = 0.02  # how often rank 0 looks at its starting ranks
_FAILURE_REPORT_S = 1.0  # after a failed collective, how long to wait for the culprit's report


def rank_placements(cfg: EngineConfig) -> list[placement.Placement] | None:
    """On CPU, one core set per rank out of the target's cores (None on GPUs)."""
    if cfg.device != "cpu":
        return None
    cpus = cfg.target_cpus or placement.process_cpus()
    return [
        placement.on_cores(c, cfg.num_threads)
        for c in placement.split_cores(cpus, cfg.tensor_parallel_size)
    ]


class TensorParallelTarget:
    """Rank 0's handle on its ranks: starts them, loads its own slices, runs forwards with them
    and stops them."""

    def __init__(self, cfg: EngineConfig, model_dir: Path) -> None:
        self.cfg, self.model_dir = cfg, model_dir
        size = cfg.tensor_parallel_size
        # Refuse a size the model cannot split before starting anything.
        TensorParallel(0, size).check(ModelConfig.from_dir(model_dir))
        self.device = rank_device(cfg.device, 0)
        self.placements = rank_placements(cfg)
        self.failure: str | None = None
        self.group = RankGroup(0, size, 0, cfg.tensor_parallel_timeout_s, STARTUP_TIMEOUT_S)
        self.procs: list[subprocess.Popen] = []
        try:
            for r in range(1, size):
                spec = self._spec(r)
                env = {**os.environ, "OMP_NUM_THREADS": str(spec.threads or 1)}
                self.procs.append(subprocess.Popen([*COMMAND, spec.to_json()], env=env))
            # An engine never closed still stops its ranks, when collected or at exit.
            weakref.finalize(self, _reap_all, list(self.procs))
            self._wait_for("joining")
            self.group.join(self.device)
        except BaseException:
            self._stop(graceful=False)
            raise
        self.tp = TensorParallel(0, size, self.group.compute)

    def _spec(self, rank: int) -> RankSpec:
        cfg = self.cfg
        place = self.placements[rank] if self.placements else None
        return RankSpec(
            rank=rank,
            size=cfg.tensor_parallel_size,
            port=self.group.port,
            model_dir=str(self.model_dir),
            dtype=cfg.dtype,
            device=cfg.device,
            cpus=list(place.cpus) if place else None,
            threads=place.threads if place else None,
            timeout_s=cfg.tensor_parallel_timeout_s,
            parent_pid=os.getpid(),
        )

    def pids(self) -> list[int]:
        """Process ids of ranks 1..N-1."""
        return [p.pid for p in self.procs]

    def load(self) -> CausalLM:
        """Rank 0's slices; returns once every rank has loaded its own."""
        try:
            model = load_model(self.model_dir, self.cfg.dtype, self.device, self.tp)
            self._wait_for("ready")
        except BaseException:
            self._stop(graceful=False)
            raise
        return model

    def runner(self, model: CausalLM, num_blocks: int, block_size: int) -> ModelRunner:
        """Rank 0's runner; every rank allocates the same number of KV blocks for its heads."""
        sizes = {"num_blocks": num_blocks, "block_size": block_size, "compile": self.cfg.compile}
        self.command(RUNNER, sizes)
        return ParallelRunner(self, model, device=self.device, **sizes)

    def command(self, kind: int, args: object) -> None:
        """Broadcast a command to every rank (rank 0 then does its own part)."""
        if self.failure is not None:
            raise TensorParallelError(self.failure)
        try:
            self.group.broadcast(kind, args)
        except Exception as e:
            raise self.fail(e) from e
        except BaseException as e:  # interrupted mid-message: the ranks are out of step for good
            self.fail(e)
            raise

    def fail(self, cause: BaseException) -> TensorParallelError:
        """The group is broken: stop every rank, remember why and return the error to raise."""
        if self.failure is None:
            deadline = time.monotonic() + _FAILURE_REPORT_S
            while time.monotonic() < deadline and not self._reasons():
                time.sleep(_POLL_S)
            reasons = self._reasons() or [f"{type(cause).__name__}: {cause}"]
            self.failure = "tensor-parallel target failed: " + "; ".join(reasons)
            log.error("saguaro: %s", self.failure)
            self._stop(graceful=False)
        return TensorParallelError(self.failure)

    def _reasons(self) -> list[str]:
        out = []
        for r, p in enumerate(self.procs, start=1):
            said = self.group.reported("error", r) if self.group.store is not None else None
            if said is not None:
                out.append(f"rank {r} failed: {said}")
            elif p.poll() is not None:
                out.append(f"rank {r} exited ({_exit_reason(p.returncode)})")
        return out

    def _wait_for(self, state: str) -> None:
        """Wait until every rank says ``state``; raise at once if one fails or exits first."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        pending = set(range(1, len(self.procs) + 1))
        while pending:
            pending = {r for r in pending if self.group.reported(state, r) is None}
            reasons = self._reasons()
            if reasons:
                why = "; ".join(reasons)
                raise TensorParallelError(f"tensor-parallel target did not start: {why}")
            if pending and time.monotonic() > deadline:
                raise TensorParallelError(
                    f"tensor-parallel ranks {sorted(pending)} did not start within "
                    f"{STARTUP_TIMEOUT_S:.0f} s"
                )
            time.sleep(_POLL_S if pending else 0)

    def close(self) -> None:
        """Tell every rank to exit and wait for it (a rank that does not is killed)."""
        self._stop(graceful=self.failure is None)

    def _stop(self, graceful: bool) -> None:
        if graceful and self.group.control is not None:
            try:
                self.group.broadcast(EXIT, None)
            except Exception:
                graceful = False
        for p in self.procs:
            if graceful:
                try:
                    p.wait(SHUTDOWN_GRACE_S)
                except subprocess.TimeoutExpired:
                    pass
            reap(p)
        self.group.close()


def _reap_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        reap(p)


def _exit_reason(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


class ParallelRunner(ModelRunner):
    """Rank 0's runner: every forward is broadcast first, so every rank runs it too."""

    def __init__(self, target: TensorParallelTarget, model: CausalLM, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self.target = target

    def run(self, inputs: StepInputs) -> torch.Tensor:
        self.target.command(FORWARD, inputs)
        try:
            return super().run(inputs)
        except Exception as e:
            raise self.target.fail(e) from e
        except BaseException as e:  # interrupted mid-collective (Ctrl-C): out of step for good
            self.target.fail(e)
            raise
