"""Per-request state: tokens, target KV bookkeeping, sampling seed, stop state and round records.

A proposer keeps its own draft state keyed by ``seq_id``; nothing here belongs to a strategy."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from saguaro.core.records import RoundRecord
from saguaro.sampling import SamplingParams
from saguaro.sampling.logprobs import TokenLogprob
from saguaro.sampling.processors import Processors


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


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
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at last admission
    # leading hashed blocks known to hold the in-process draft's KV too (at admission: the
    # cached ones that do, where a draft that has not seen the sequence yet may start)
    draft_blocks: int = 0
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None  # why the request failed (finish_reason "error")
    stop_reason: str | int | None = None
    text: str = ""
    records: list[RoundRecord] = field(default_factory=list)
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    finish_time: float | None = None
    num_preemptions: int = 0
    processors: Processors | None = None  # what the request's history does to its logits
    logprobs: list[TokenLogprob] | None = None  # per output token, if the request asks
    # per prompt token (the first has none: nothing precedes it), if the request asks
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @property
    def scores_prompt(self) -> bool:
        """Its prompt's positions still need logits rows (for their log-probabilities)."""
        lps = self.prompt_logprobs
        return lps is not None and len(lps) > 1 and lps[-1] is None

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
