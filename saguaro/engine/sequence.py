"""Per-request state: tokens, KV bookkeeping, sampling seed, stop state and round records."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from saguaro.sampling import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class RoundRecord:
    """What one decoding round did for one sequence. Every strategy emits these; metrics, the
    fan-out estimator and the backup policy all read this one record type."""

    num_drafted: int  # proposals verified this round (0 for AR)
    num_accepted: int  # k
    token: int  # t: recovery or bonus token
    committed: int  # tokens appended (k + 1, fewer if a stop condition cut the round)
    step: int = 0  # engine step the round ran in (rounds of one batch share it)
    hit: bool | None = None  # SSD: outcome was prepared in the speculation cache
    backup: str | None = None  # SSD: backup used on a miss
    target_s: float = 0.0
    draft_s: float = 0.0
    wait_s: float = 0.0  # SSD: time the target waited for the draft
    verify_s: float = 0.0  # sampling and verification (this round's share of the batch's)
    step_s: float = 0.0  # the whole engine step, schedule to commit (this round's share)


@dataclass(eq=False)  # identity semantics: sequences are looked up in queues by identity
class Sequence:
    seq_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    seed: int  # keys every uniform the request draws (saguaro.sampling.noise)
    eos_token_ids: frozenset[int] = frozenset()
    status: Status = Status.WAITING
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens with valid KV in the target pool
    num_draft_computed: int = 0  # tokens with valid KV in an in-process draft pool
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at last admission
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # why the request failed (finish_reason "error")
    stop_reason: str | int | None = None
    text: str = ""
    records: list[RoundRecord] = field(default_factory=list)
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    @property
    def last_token(self) -> int:
        return self.token_ids[-1]
