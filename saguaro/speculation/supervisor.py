"""Supervision of SSD's draft worker: a failed worker is closed and, after a backoff, restarted.

A worker that dies, errors or stops answering raises :class:`DraftWorkerError` from ``propose``.
The supervisor closes it and answers that round, and every round until a new worker is up, with
no proposals: those rounds are AR rounds, exact like any other (the target samples every token
it commits). Restarts come after ``backoff_s``, doubling with each, at most ``max_restarts``
times over the supervisor's life; then speculation stays off. A worker that exits between
rounds is found by :meth:`Supervised.maintain`, which its owner runs before every step.
Requests in flight carry on across a restart: the new worker is sent each sequence's tokens as
it first sees it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from saguaro.core.proposal import DraftHealth, Proposal, Proposer, TargetProbe
from saguaro.core.sequence import Sequence
from saguaro.errors import DraftWorkerError
from saguaro.speculation.planner import SSDEstimates
from saguaro.speculation.ssd import SSDProposer

log = logging.getLogger("saguaro")


class Supervised(Proposer):
    """A proposer started by ``start`` (which raises DraftWorkerError if it cannot start: the
    first start's failure is the caller's), kept running by restarting it after failures."""

    def __init__(
        self, start: Callable[[], SSDProposer], width: int, max_restarts: int, backoff_s: float
    ) -> None:
        self._start = start
        self.width = width  # K: the columns of an empty proposal
        self.max_restarts = max_restarts
        self.backoff_s = backoff_s
        self.worker: SSDProposer | None = start()
        self.restarts = 0
        self.failure: str | None = None
        self._restart_at: float | None = None  # when the next restart is due (monotonic)

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Proposal:
        self.maintain()
        if self.worker is not None:
            try:
                return self.worker.propose(seqs, ks)
            except DraftWorkerError as e:
                self._drop(e)
        return Proposal.none(len(seqs), self.width)

    def feed(self, seqs: list[Sequence]) -> tuple[list[int], list[int]] | None:
        """A step run without SSD: send the worker its tokens (protocol FEED) and return its
        shadow chains' counts settled since the last feed (None while it is down)."""
        self.maintain()
        if self.worker is not None:
            try:
                counts = self.worker.shadow_counts()
                self.worker.feed(seqs)
                return counts
            except DraftWorkerError as e:
                self._drop(e)
        return None

    def maintain(self) -> None:
        """Drop a worker whose process has exited, and restart one whose backoff has passed.
        SSD runs this before each round; auto before each step, whatever mode it runs, so a
        worker killed while auto ran AR or SD is back before SSD is next weighed."""
        code = self.worker.exit_code() if self.worker is not None else None
        if code is not None:
            self._drop(DraftWorkerError(f"draft worker exited with code {code}"))
        self._restart_if_due()

    def _drop(self, why: Exception) -> None:
        log.warning("saguaro: %s; continuing without speculation (AR)", why)
        assert self.worker is not None
        self.worker.close(failed=True)
        self.worker = None
        self.failure = str(why)
        self._schedule_restart()

    def _schedule_restart(self) -> None:
        if self.restarts >= self.max_restarts:
            self._restart_at = None
            log.warning("saguaro: speculation stays off (draft restarts: %d)", self.restarts)
            return
        delay = self.backoff_s * 2**self.restarts
        self._restart_at = time.monotonic() + delay
        log.warning("saguaro: restarting the draft worker in %.1f s", delay)

    def _restart_if_due(self) -> None:
        if self._restart_at is None or time.monotonic() < self._restart_at:
            return
        self._restart_at = None
        self.restarts += 1
        try:
            self.worker = self._start()
        except DraftWorkerError as e:
            log.warning("saguaro: the draft worker did not restart: %s", e)
            self.failure = str(e)
            self._schedule_restart()
            return
        self.failure = None
        log.warning("saguaro: draft worker restarted (%d so far)", self.restarts)

    def health(self) -> DraftHealth:
        if self.worker is not None:
            state = "running"
        else:
            state = "restarting" if self._restart_at is not None else "failed"
        return DraftHealth(state, self.restarts, self.failure)

    # ---- the rest goes to the worker while there is one ---------------------------------------

    def draft_ready(self, seq: Sequence) -> int | None:
        return self.worker.draft_ready(seq) if self.worker is not None else None

    def unsent(self, seq: Sequence) -> int:
        """Tokens of ``seq`` the worker has not been sent (all of them while it is down)."""
        return self.worker.unsent(seq) if self.worker is not None else len(seq)

    def observe(self, seqs: list[Sequence], target_s: float, positions: int) -> None:
        if self.worker is not None:
            self.worker.observe(seqs, target_s, positions)

    def preempted(self, seq: Sequence) -> None:
        if self.worker is not None:
            self.worker.preempted(seq)

    def release(self, seq: Sequence) -> None:
        if self.worker is not None:
            self.worker.release(seq)

    def pause(self) -> None:
        if self.worker is not None:
            self.worker.pause()

    def estimates(self, batch: int) -> SSDEstimates | None:
        """The worker's cost estimates (None while it is down)."""
        return self.worker.estimates(batch) if self.worker is not None else None

    def stats(self, batch: int) -> dict:
        return self.worker.stats(batch) if self.worker is not None else {}

    def calibrate(self, probe: TargetProbe) -> None:
        if self.worker is not None:
            self.worker.calibrate(probe)

    def close(self, failed: bool = False) -> None:
        self._restart_at = None
        if self.worker is not None:
            self.worker.close(failed)
            self.worker = None
