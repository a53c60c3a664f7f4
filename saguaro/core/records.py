"""What one decoding round did for one sequence: the one record every strategy emits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RoundRecord:
    """What one decoding round did for one sequence. Every strategy emits these; metrics, the
    fan-out estimator and the backup policy all read this one record type."""

    num_drafted: int  # proposals verified this round (0 for AR)
    num_accepted: int  # k
    token: int  # t: recovery or bonus token
    committed: int  # tokens appended (k + 1, fewer if a stop condition cut the round)
    step: int = 0  # engine step the round ran in (rounds of one batch share it)
    mode: str = "ar"  # the strategy that proposed: ar (nothing), sd, ssd or lookup (copies)
    hit: bool | None = None  # SSD: outcome was prepared in the speculation cache
    backup: str | None = None  # SSD: backup used on a miss
    target_s: float = 0.0
    draft_s: float = 0.0
    wait_s: float = 0.0  # SSD: time the target waited for the draft
    verify_s: float = 0.0  # sampling and verification (this round's share of the batch's)
    step_s: float = 0.0  # the whole engine step, schedule to commit (this round's share)
